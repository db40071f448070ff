//! ttlwheel's Raft types: the type configuration openraft is instantiated with, what a log
//! entry carries ([`Command`]), what applying one answers ([`Applied`]), a member's addresses
//! ([`Member`]) and a snapshot on disk ([`SnapshotFile`]).
//!
//! A [`Command`] is made of the same durable records the single-node journal writes
//! (`persist::record::Record`), in their binary codec, so a follower applies them as recovery
//! does. Its serde form (openraft's RPC bodies, later) is that binary encoding as one base64
//! string, so the records' decoder, which goes through the API's constructors, is the only way
//! in. `Expiries` and `Checkpoint` carry keys with their generations (`registry`'s cluster
//! mode), in a small binary form of their own.

use std::path::PathBuf;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::notify::replicated::{Settled, Settlement};
use crate::persist::record::{DecodeError, Record};
use crate::registry::CheckpointItem;
use crate::types::Key;

openraft::declare_raft_types!(
    /// ttlwheel's Raft types: entries carry [`Command`]s, nodes their two addresses.
    pub TypeConfig:
        D = Command,
        R = Applied,
        NodeId = u64,
        Node = Member,
        SnapshotData = SnapshotFile,
);

/// A node's id in the cluster (`--node-id`).
pub type NodeId = u64;
/// A Raft log entry.
pub type Entry = openraft::Entry<TypeConfig>;
/// A log entry's id: the leader (term, node) that proposed it and its index.
pub type LogId = openraft::LogId<NodeId>;
/// A vote (term, node, committed).
pub type Vote = openraft::Vote<NodeId>;
/// What storage reports to openraft.
pub type StorageError = openraft::StorageError<NodeId>;
/// A membership config and the id of the entry that carried it.
pub type StoredMembership = openraft::StoredMembership<NodeId, Member>;
/// What a snapshot covers.
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, Member>;
/// A snapshot: its meta and its file.
pub type Snapshot = openraft::Snapshot<TypeConfig>;

/// One member of the cluster, as the membership config stores it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The address peers dial (`--cluster-listen`, as advertised).
    pub peer_addr: String,
    /// The API's address, which `X-Ttlwheel-Leader` and `GET /v1/cluster` show.
    pub api_addr: String,
}

/// What one Raft entry asks the state machine to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Records of one request or one batch of requests, in order, applied through the
    /// registry's door as recovery applies them (`Registry::restore`).
    Writes(Vec<Record>),
    /// Keys the leader found due, each with the generation it saw: applied, each key that
    /// still has that generation expires (docs/cluster-design.md section 3).
    Expiries(Vec<(Key, u32)>),
    /// The keys the leader renewed since its last checkpoint, with the time each had left:
    /// the other members' deadlines, should one of them lead next.
    Checkpoint(Vec<CheckpointItem>),
    /// Keys a single node's data directory held, brought into the cluster by its founding
    /// member (the upgrade path, `cluster::upgrade`): applied as recovery applies them
    /// (`Registry::restore`), with no events, as a restart publishes none.
    Import(Vec<Record>),
    /// Webhook events the leader settled (delivered, dead-lettered, re-sent from the dead
    /// letters) since its last report: the other members drop them from their outboxes, so a
    /// new leader sends only what was not settled (`notify::replicated`).
    Webhooks(Vec<Settled>),
    /// One record that applies only if its key still has `generation`, the one the leader
    /// decided on (`Registry::apply_logged_if`): an EXPIRE or PERSIST decided while the key's
    /// own expiry was in flight, which must not bring the key back if that expiry is
    /// committed first. Members from before this command cannot read it: upgrade followers
    /// before the leader.
    WriteIf {
        generation: u32,
        record: Box<Record>,
    },
}

/// A command that cannot be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    #[error("the command ends early")]
    Truncated,
    #[error("unknown command tag {0}")]
    UnknownTag(u8),
    #[error("record {index} of the command: {source}")]
    Record { index: usize, source: DecodeError },
    #[error("{0} bytes left over after the command")]
    TrailingBytes(usize),
    #[error("key {index} of the command is not a valid key")]
    Key { index: usize },
    #[error("a text of the command is not UTF-8")]
    NotUtf8,
}

/// The tag of [`Command::Writes`].
const WRITES: u8 = 1;
/// The tag of [`Command::Expiries`].
const EXPIRIES: u8 = 2;
/// The tag of [`Command::Checkpoint`].
const CHECKPOINT: u8 = 3;
/// The tag of [`Command::Import`].
const IMPORT: u8 = 4;
/// The tag of [`Command::Webhooks`].
const WEBHOOKS: u8 = 5;
/// The tag of [`Command::WriteIf`].
const WRITE_IF: u8 = 6;

/// How a [`Settled`] report was settled, as encoded.
const DELIVERED: u8 = 1;
const DEAD_LETTERED: u8 = 2;
const REQUEUED: u8 = 3;

impl Command {
    /// About how many bytes the command's encoding takes, without encoding it (the network
    /// sizes payloads with it): each record by [`Record::approx_len`] plus its 4-byte length,
    /// an expiry or checkpoint item by its key. (It counted 128 bytes a record: a creation
    /// with a 27-byte key takes ~36, so a new member catching up was sent one entry of 1,000
    /// creations per request where ~5 fit; measured in BENCHMARKS.md, "The cluster beside
    /// etcd, and 1M keys".)
    pub fn approx_len(&self) -> usize {
        match self {
            Self::Writes(records) | Self::Import(records) => records.iter().map(record_len).sum(),
            Self::Expiries(keys) => keys.iter().map(expiry_len).sum(),
            Self::Checkpoint(items) => items.iter().map(checkpoint_item_len).sum(),
            Self::Webhooks(reports) => reports.iter().map(report_len).sum(),
            Self::WriteIf { record, .. } => 4 + record_len(record),
        }
    }

    /// Appends the command's encoding to `out`: a tag and the number of items (u32 LE), then
    /// for `Writes` each record as its length (u32 LE) and its `Record::encode` bytes; for
    /// `Expiries` each generation (u32 LE) and key; for `Checkpoint` each generation, time
    /// left (u64 LE) and key. A key is its length (u16 LE) and its bytes.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Self::Writes(records) => put_records(out, WRITES, records),
            Self::Import(records) => put_records(out, IMPORT, records),
            Self::Expiries(keys) => {
                put_header(out, EXPIRIES, keys.len());
                for (key, generation) in keys {
                    out.extend_from_slice(&generation.to_le_bytes());
                    put_key(out, key);
                }
            }
            Self::Checkpoint(items) => {
                put_header(out, CHECKPOINT, items.len());
                for item in items {
                    out.extend_from_slice(&item.generation.to_le_bytes());
                    out.extend_from_slice(&item.remaining_ms.to_le_bytes());
                    put_key(out, &item.key);
                }
            }
            Self::Webhooks(reports) => {
                put_header(out, WEBHOOKS, reports.len());
                for report in reports {
                    put_report(out, report);
                }
            }
            Self::WriteIf { generation, record } => {
                // The generation, then the record as a `Writes` of one.
                out.push(WRITE_IF);
                out.extend_from_slice(&generation.to_le_bytes());
                put_records(out, WRITES, std::slice::from_ref(record));
            }
        }
    }

    /// Reads one command that fills `bytes` exactly.
    pub fn decode(bytes: &[u8]) -> Result<Self, CommandError> {
        let (&tag, mut rest) = bytes.split_first().ok_or(CommandError::Truncated)?;
        let command = match tag {
            WRITES => Self::Writes(decode_records(&mut rest)?),
            IMPORT => Self::Import(decode_records(&mut rest)?),
            EXPIRIES => Self::Expiries(decode_items(&mut rest, 4 + 2, |rest, index| {
                let generation = take_u32(rest)?;
                Ok((take_key(rest, index)?, generation))
            })?),
            CHECKPOINT => Self::Checkpoint(decode_items(&mut rest, 4 + 8 + 2, |rest, index| {
                let generation = take_u32(rest)?;
                let remaining_ms = take_u64(rest)?;
                let key = take_key(rest, index)?;
                Ok(CheckpointItem {
                    key,
                    generation,
                    remaining_ms,
                })
            })?),
            WEBHOOKS => Self::Webhooks(decode_items(&mut rest, 1 + 2 + 2 + 2, take_report)?),
            WRITE_IF => {
                let generation = take_u32(&mut rest)?;
                let inner = rest.split_first().filter(|(&tag, _)| tag == WRITES);
                let (_, after) = inner.ok_or(CommandError::Truncated)?;
                rest = after;
                match <[Record; 1]>::try_from(decode_records(&mut rest)?) {
                    Ok([record]) => Self::WriteIf {
                        generation,
                        record: Box::new(record),
                    },
                    Err(_) => return Err(CommandError::Truncated),
                }
            }
            other => return Err(CommandError::UnknownTag(other)),
        };
        match rest.len() {
            0 => Ok(command),
            left => Err(CommandError::TrailingBytes(left)),
        }
    }
}

/// A tag, the number of records (u32 LE), then each record as its length (u32 LE) and its
/// `Record::encode` bytes.
fn put_records(out: &mut Vec<u8>, tag: u8, records: &[Record]) {
    put_header(out, tag, records.len());
    for record in records {
        let start = out.len();
        out.extend_from_slice(&[0; 4]);
        record.encode(out);
        let len = u32::try_from(out.len() - start - 4).expect("a record is far smaller than 4 GiB");
        out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    }
}

/// A record's share of a `Writes` or `Import` encoding: its length and its bytes.
pub fn record_len(record: &Record) -> usize {
    4 + record.approx_len()
}

/// An expiry item's encoded length: generation, key length, key.
pub fn expiry_len((key, _): &(Key, u32)) -> usize {
    6 + key.as_str().len()
}

/// A checkpoint item's encoded length: generation, time left, key length, key.
pub fn checkpoint_item_len(item: &CheckpointItem) -> usize {
    14 + item.key.as_str().len()
}

/// About a report's encoded length.
pub fn report_len(report: &Settled) -> usize {
    let dead = match &report.how {
        Settlement::DeadLettered { last_error, .. } => 4 + 8 + 2 + last_error.len(),
        _ => 0,
    };
    1 + 2 + 2 + report.id.len() + 2 + report.key.as_str().len() + dead
}

/// A webhook report: how it was settled (a byte), the URL's place (u16 LE), the id (a u16 LE
/// length and bytes), the key; a dead letter then has its attempts (u32 LE), when it failed (u64 LE) and
/// its last error (a u16 LE length and bytes).
fn put_report(out: &mut Vec<u8>, report: &Settled) {
    let tag = match report.how {
        Settlement::Delivered => DELIVERED,
        Settlement::DeadLettered { .. } => DEAD_LETTERED,
        Settlement::Requeued => REQUEUED,
    };
    out.push(tag);
    out.extend_from_slice(&report.endpoint.to_le_bytes());
    put_text(out, &report.id);
    put_key(out, &report.key);
    if let Settlement::DeadLettered {
        attempts,
        last_error,
        failed_at_unix_ms,
    } = &report.how
    {
        out.extend_from_slice(&attempts.to_le_bytes());
        out.extend_from_slice(&failed_at_unix_ms.to_le_bytes());
        put_text(out, last_error);
    }
}

fn take_report(rest: &mut &[u8], index: usize) -> Result<Settled, CommandError> {
    let (&tag, after) = rest.split_first().ok_or(CommandError::Truncated)?;
    *rest = after;
    let Some((endpoint, after)) = rest.split_first_chunk::<2>() else {
        return Err(CommandError::Truncated);
    };
    let endpoint = u16::from_le_bytes(*endpoint);
    *rest = after;
    let id = take_text(rest)?;
    let key = take_key(rest, index)?;
    let how = match tag {
        DELIVERED => Settlement::Delivered,
        REQUEUED => Settlement::Requeued,
        DEAD_LETTERED => Settlement::DeadLettered {
            attempts: take_u32(rest)?,
            failed_at_unix_ms: take_u64(rest)?,
            last_error: take_text(rest)?,
        },
        other => return Err(CommandError::UnknownTag(other)),
    };
    Ok(Settled {
        endpoint,
        id,
        key,
        how,
    })
}

/// A text of at most 65,535 bytes (longer is cut at a character boundary: URLs, ids and
/// error messages are far shorter) as its length (u16 LE) and bytes.
fn put_text(out: &mut Vec<u8>, text: &str) {
    let mut end = text.len().min(usize::from(u16::MAX));
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&(end as u16).to_le_bytes());
    out.extend_from_slice(&text.as_bytes()[..end]);
}

fn take_text(bytes: &mut &[u8]) -> Result<String, CommandError> {
    let raw = take_prefixed(bytes)?;
    String::from_utf8(raw.to_vec()).map_err(|_| CommandError::NotUtf8)
}

/// Bytes behind a u16 LE length (a key's, a text's).
fn take_prefixed<'a>(bytes: &mut &'a [u8]) -> Result<&'a [u8], CommandError> {
    let Some((head, rest)) = bytes.split_first_chunk::<2>() else {
        return Err(CommandError::Truncated);
    };
    let len = usize::from(u16::from_le_bytes(*head));
    if len > rest.len() {
        return Err(CommandError::Truncated);
    }
    let (raw, rest) = rest.split_at(len);
    *bytes = rest;
    Ok(raw)
}

/// A tag and an item count.
fn put_header(out: &mut Vec<u8>, tag: u8, n: usize) {
    out.push(tag);
    let n = u32::try_from(n).expect("a command holds far fewer items");
    out.extend_from_slice(&n.to_le_bytes());
}

/// A key: its length (u16 LE; keys are at most 256 bytes) and its bytes.
fn put_key(out: &mut Vec<u8>, key: &Key) {
    let bytes = key.as_str().as_bytes();
    let len = u16::try_from(bytes.len()).expect("a key is at most 256 bytes");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
}

fn take_key(bytes: &mut &[u8], index: usize) -> Result<Key, CommandError> {
    let raw = take_prefixed(bytes)?;
    std::str::from_utf8(raw)
        .ok()
        .and_then(|raw| Key::new(raw).ok())
        .ok_or(CommandError::Key { index })
}

/// A count, then that many items of at least `min_item_len` bytes each.
fn decode_items<T>(
    rest: &mut &[u8],
    min_item_len: usize,
    mut item: impl FnMut(&mut &[u8], usize) -> Result<T, CommandError>,
) -> Result<Vec<T>, CommandError> {
    let n = take_u32(rest)? as usize;
    // A count larger than the bytes allow is damage, and must not size an allocation.
    if n > rest.len() / min_item_len {
        return Err(CommandError::Truncated);
    }
    (0..n).map(|index| item(rest, index)).collect()
}

/// The records of a `Writes` command.
fn decode_records(rest: &mut &[u8]) -> Result<Vec<Record>, CommandError> {
    let n = take_u32(rest)? as usize;
    // Each record takes at least its 4-byte length: a count larger than that allows is damage,
    // and must not size an allocation.
    if n > rest.len() / 4 {
        return Err(CommandError::Truncated);
    }
    let mut records = Vec::with_capacity(n);
    for index in 0..n {
        let len = take_u32(rest)? as usize;
        if len > rest.len() {
            return Err(CommandError::Truncated);
        }
        let (record, after) = rest.split_at(len);
        *rest = after;
        let record =
            Record::decode(record).map_err(|source| CommandError::Record { index, source })?;
        records.push(record);
    }
    Ok(records)
}

fn take_u64(bytes: &mut &[u8]) -> Result<u64, CommandError> {
    let Some((head, rest)) = bytes.split_first_chunk::<8>() else {
        return Err(CommandError::Truncated);
    };
    *bytes = rest;
    Ok(u64::from_le_bytes(*head))
}

fn take_u32(bytes: &mut &[u8]) -> Result<u32, CommandError> {
    let Some((head, rest)) = bytes.split_first_chunk::<4>() else {
        return Err(CommandError::Truncated);
    };
    *bytes = rest;
    Ok(u32::from_le_bytes(*head))
}

impl Serialize for Command {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut bytes = Vec::new();
        self.encode(&mut bytes);
        serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }
}

impl<'de> Deserialize<'de> for Command {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map_err(serde::de::Error::custom)?;
        Self::decode(&bytes).map_err(serde::de::Error::custom)
    }
}

/// The most bytes of records (`Command::approx_len`, the binary encoding) one entry is given
/// by its proposer: as base64 in JSON it takes 4/3 of that, and it must fit in one
/// AppendEntries payload (`network::MAX_APPEND_BYTES`, 128 KiB) with room to spare. openraft
/// 0.9 sends an entry whole, and a payload the link cannot carry within the heartbeat
/// interval is sent again, forever: entries are kept small enough for that never to happen
/// on a link that carries a few MB/s.
/// 64 KiB, not 160: 160 KiB entries (~220 KB of JSON) stalled the slow-link test under the
/// fresh-clone CI's load. A batch of 1,000 heartbeats without metadata (~40 KB) is still one
/// entry; only batches with metadata are split.
pub const MAX_ENTRY_BYTES: usize = 64 * 1024;

/// Splits `items` into runs of at most `max_items` items and [`MAX_ENTRY_BYTES`] bytes by
/// `len` (each run at least one item): the items of one entry each.
pub fn entry_sized<T>(
    items: &[T],
    max_items: usize,
    len: impl Fn(&T) -> usize,
) -> impl Iterator<Item = &[T]> {
    let mut rest = items;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut bytes = 0;
        let mut n = 0;
        while n < rest.len().min(max_items.max(1)) {
            bytes += len(&rest[n]);
            if n > 0 && bytes > MAX_ENTRY_BYTES {
                break;
            }
            n += 1;
        }
        let (run, after) = rest.split_at(n);
        rest = after;
        Some(run)
    })
}

/// What applying one entry answers the proposer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// The entry's log index.
    pub log_index: u64,
    /// Records the entry carried and the state machine applied (0 for blank and membership
    /// entries, and for a `WriteIf` whose key is no longer the one it was decided on).
    pub n_records: usize,
    /// Of a `Writes` entry: which records created their key when applied, one bit per
    /// position. Only the apply can tell: a heartbeat decided against a key whose expiry was
    /// in flight creates it again if the expiry was committed first, and renews it otherwise.
    pub created: Vec<u64>,
}

impl Applied {
    /// Whether the record at `position` of the entry created its key.
    pub fn created_at(&self, position: usize) -> bool {
        (self.created.get(position / 64)).is_some_and(|word| word & (1 << (position % 64)) != 0)
    }

    /// Notes that the record at `position` created its key.
    pub fn mark_created(&mut self, position: usize) {
        if self.created.len() <= position / 64 {
            self.created.resize(position / 64 + 1, 0);
        }
        self.created[position / 64] |= 1 << (position % 64);
    }
}

/// A snapshot on disk, never in memory: openraft hands this handle around, and the network
/// (a later step) streams the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotFile {
    /// Where the file is.
    pub path: PathBuf,
    /// Its size in bytes (0 for a file still to be received).
    pub len: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persist::testing::record;

    #[test]
    fn a_command_reads_back_as_written_through_its_binary_and_serde_forms() {
        for n in [0, 1, 7] {
            let command = Command::Writes((0..n).map(record).collect());
            let mut bytes = Vec::new();
            command.encode(&mut bytes);
            assert_eq!(Command::decode(&bytes), Ok(command.clone()));
            let json = serde_json::to_string(&command).unwrap();
            assert_eq!(serde_json::from_str::<Command>(&json).unwrap(), command);
        }
    }

    #[test]
    fn expiries_and_checkpoints_read_back_and_a_bad_key_or_cut_is_refused() {
        let key = |name: &str| Key::new(name).unwrap();
        let commands = [
            Command::Expiries(vec![(key("a"), 7), (key(&"k".repeat(256)), u32::MAX)]),
            Command::Checkpoint(vec![CheckpointItem {
                key: key("svc-1/instance-0000000001"),
                generation: 3,
                remaining_ms: 29_750,
            }]),
            Command::Expiries(Vec::new()),
            Command::Import((0..3).map(record).collect()),
            Command::WriteIf {
                generation: 7,
                record: Box::new(record(4)),
            },
            Command::Webhooks(vec![
                Settled {
                    endpoint: 0,
                    id: "msg_log_0000000000070002".into(),
                    key: key("svc-1/instance-0000000001"),
                    how: Settlement::Delivered,
                },
                Settled {
                    endpoint: 3,
                    id: "msg_log_0000000000080000".into(),
                    key: key("b"),
                    how: Settlement::DeadLettered {
                        attempts: 12,
                        last_error: "HTTP 500 Internal Server Error: é".into(),
                        failed_at_unix_ms: 1_700_000_000_123,
                    },
                },
                Settled {
                    endpoint: 0,
                    id: "msg_log_0000000000080000".into(),
                    key: key("b"),
                    how: Settlement::Requeued,
                },
            ]),
        ];
        for command in commands {
            let mut bytes = Vec::new();
            command.encode(&mut bytes);
            assert_eq!(Command::decode(&bytes), Ok(command.clone()));
            let json = serde_json::to_string(&command).unwrap();
            assert_eq!(serde_json::from_str::<Command>(&json).unwrap(), command);
            for cut in 0..bytes.len() {
                assert!(Command::decode(&bytes[..cut]).is_err(), "cut at {cut}");
            }
        }
        // An empty key is not a key.
        let mut bytes = Vec::new();
        Command::Expiries(vec![(key("a"), 1)]).encode(&mut bytes);
        let at = bytes.len() - 3; // the key's length
        bytes[at..at + 2].copy_from_slice(&0u16.to_le_bytes());
        bytes.pop();
        assert_eq!(Command::decode(&bytes), Err(CommandError::Key { index: 0 }));
    }

    #[test]
    fn a_cut_padded_or_inflated_command_is_refused() {
        let command = Command::Writes((0..3).map(record).collect());
        let mut bytes = Vec::new();
        command.encode(&mut bytes);
        for cut in 0..bytes.len() {
            assert!(Command::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut padded = bytes.clone();
        padded.push(0);
        assert_eq!(
            Command::decode(&padded),
            Err(CommandError::TrailingBytes(1))
        );
        let mut inflated = bytes.clone();
        inflated[1..5].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Command::decode(&inflated), Err(CommandError::Truncated));
        assert!(serde_json::from_str::<Command>("\"not base64!\"").is_err());
    }
}
