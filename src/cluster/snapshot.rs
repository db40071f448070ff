//! Raft snapshots of the registry: the file, building one, reading one back.
//!
//! A snapshot file is the single-node snapshot (`persist::store`: magic `TTLWSNP1`, frames in
//! `persist::log`'s framing; every listed expired key as an `ExpiredEntry`, then every alive
//! key whole as an `Upsert`, from `Registry::state_records`) with one frame before the
//! records: the header, tag `0xF0` (no record has it) then openraft's `SnapshotMeta` as JSON
//! (the last log id and membership it covers, its id). A single-node recovery handed this file
//! refuses it (corruption at its first frame), never misreads it.
//!
//! Files are named `snapshot-<n>.ttlw` with `n` the number of log entries it covers
//! (`last_log_id.index + 1`), written as `.tmp`, synced, renamed and the directory synced, so
//! a snapshot file either is whole or does not exist. Only the newest is kept.
//!
//! Each alive key's `Upsert` is followed by a generation frame, tag `0xF1` then the key's
//! generation (u32 LE): a member that installs the snapshot must match the generations later
//! expiry entries name.
//!
//! Deliberately not yet (design section 5): per-key remaining times (keys come back with
//! `Expiry::Relative`, so an installing follower gives each its whole TTL from the install, as
//! a restart does: a dead key may live up to a TTL longer if that member is promoted).
//!
//! After the keys come the notifier's held events and dead letters (`WebhookQueued`,
//! `DeadLetter` records, their URLs named by place: `#0`, `#1`...), read once every event of
//! the entries applied so far has reached the outboxes (`Replication::caught_up`).

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::{ErrorSubject, ErrorVerb, RaftSnapshotBuilder};

use super::types::{
    LogId, Snapshot, SnapshotFile, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};
use super::{io_error, numbered_files, storage_error, sync_dir, StoreError};
use crate::notify::replicated::Replication;
use crate::persist::log::{self, Format, Tail, MAGIC_LEN, MAX_FRAME_LEN, SNAPSHOT_MAGIC};
use crate::persist::record::Record;
use crate::registry::Registry;

/// The tag of the header frame (record tags are below 32).
const HEADER: u8 = 0xF0;
/// The tag of a generation frame: the generation of the key of the `Upsert` just before it.
const GENERATION: u8 = 0xF1;
/// The header frame's largest size: a membership of many members is still far below it.
const MAX_HEADER_LEN: usize = MAX_FRAME_LEN;

const FORMAT: Format<'static> = Format {
    magic: SNAPSHOT_MAGIC,
    kind: "cluster snapshot",
    max_frame_len: MAX_FRAME_LEN,
};

/// One frame of a snapshot file.
enum Frame {
    Header(SnapshotMeta),
    Record(Record),
    Generation(u32),
}

fn decode_frame(payload: &[u8]) -> Result<Frame, String> {
    match payload.split_first() {
        Some((&HEADER, json)) => serde_json::from_slice(json)
            .map(Frame::Header)
            .map_err(|error| format!("snapshot header: {error}")),
        Some((&GENERATION, bytes)) => <[u8; 4]>::try_from(bytes)
            .map(|bytes| Frame::Generation(u32::from_le_bytes(bytes)))
            .map_err(|_| format!("a generation frame of {} bytes", bytes.len())),
        _ => Record::decode(payload)
            .map(Frame::Record)
            .map_err(|error| error.to_string()),
    }
}

/// The path of the snapshot that covers `last_log_id`.
pub fn path_for(dir: &Path, last_log_id: Option<LogId>) -> PathBuf {
    let n = last_log_id.map_or(0, |id| id.index + 1);
    dir.join(format!("snapshot-{n:020}.ttlw"))
}

/// Writes the snapshot `meta` with `records` (each with its key's generation) into `dir`,
/// whole, and deletes the older ones.
pub fn write(
    dir: &Path,
    meta: &SnapshotMeta,
    records: impl Iterator<Item = (Record, u32)>,
) -> Result<SnapshotFile, StoreError> {
    let path = path_for(dir, meta.last_log_id);
    let tmp = path.with_extension("tmp");
    let mut file =
        std::io::BufWriter::with_capacity(1 << 20, File::create(&tmp).map_err(io_error(&tmp))?);
    let mut buffer = SNAPSHOT_MAGIC.to_vec();
    log::frame_with(&mut buffer, |out| {
        out.push(HEADER);
        serde_json::to_writer(out, meta).expect("a snapshot meta serializes to JSON");
    });
    let mut len = 0;
    let mut put = |buffer: &[u8]| {
        len += buffer.len() as u64;
        file.write_all(buffer).map_err(io_error(&tmp))
    };
    put(&buffer)?;
    for (record, generation) in records {
        buffer.clear();
        log::frame(&record, &mut buffer);
        if buffer.len() > MAX_FRAME_LEN {
            return Err(StoreError::RecordTooLarge { len: buffer.len() });
        }
        if matches!(record, Record::Upsert(_)) {
            log::frame_with(&mut buffer, |out| {
                out.push(GENERATION);
                out.extend_from_slice(&generation.to_le_bytes());
            });
        }
        put(&buffer)?;
    }
    let file = file
        .into_inner()
        .map_err(|error| io_error(&tmp)(error.into_error()))?;
    file.sync_all().map_err(io_error(&tmp))?;
    std::fs::rename(&tmp, &path).map_err(io_error(&path))?;
    sync_dir(dir)?;
    remove_older(dir, &path)?;
    Ok(SnapshotFile { path, len })
}

/// Reads the snapshot at `path` whole, handing its records to `on_record` in order, each with
/// its key's generation (0 for records without one), and returns its meta. A snapshot is
/// renamed into place only when whole: any damage, torn tail included, is refused.
pub fn read(
    path: &Path,
    mut on_record: impl FnMut(Record, u32),
) -> Result<SnapshotMeta, StoreError> {
    let bytes = std::fs::read(path).map_err(io_error(path))?;
    let mut meta = None;
    let mut misplaced = None;
    // An `Upsert` waits for the generation frame that follows it.
    let mut upsert = None;
    let (tail, valid_len) = log::scan_frames(&bytes, &FORMAT, &decode_frame, |frame, at| {
        match (frame, meta.is_some()) {
            (Frame::Header(header), false) if at.offset == MAGIC_LEN as u64 => meta = Some(header),
            (Frame::Generation(generation), true) if upsert.is_some() => {
                on_record(upsert.take().expect("checked"), generation);
            }
            (Frame::Record(record), true) => {
                if let Some(pending) = upsert.take() {
                    on_record(pending, 0);
                }
                match record {
                    Record::Upsert(_) => upsert = Some(record),
                    record => on_record(record, 0),
                }
            }
            (_, _) => {
                misplaced.get_or_insert(at.offset);
            }
        }
    })
    .map_err(|problem| problem.at(path))?;
    let corrupt = |reason: String| StoreError::Corrupt {
        path: path.to_owned(),
        reason,
    };
    if tail != Tail::Clean {
        return Err(corrupt(format!(
            "it ends in a torn frame at byte offset {valid_len}"
        )));
    }
    if let Some(offset) = misplaced {
        return Err(corrupt(format!(
            "a misplaced frame at byte offset {offset}"
        )));
    }
    if let Some(pending) = upsert {
        on_record(pending, 0);
    }
    meta.ok_or_else(|| corrupt("no header".into()))
}

/// The meta of the snapshot at `path`, from its header alone.
pub fn read_meta(path: &Path) -> Result<SnapshotMeta, StoreError> {
    let mut file = File::open(path).map_err(io_error(path))?;
    let mut head = vec![0; MAGIC_LEN + 4];
    file.read_exact(&mut head).map_err(io_error(path))?;
    let corrupt = |reason: String| StoreError::Corrupt {
        path: path.to_owned(),
        reason,
    };
    if &head[..MAGIC_LEN] != SNAPSHOT_MAGIC {
        return Err(corrupt("not a ttlwheel snapshot".into()));
    }
    let len = u32::from_le_bytes(head[MAGIC_LEN..].try_into().expect("4 bytes")) as usize;
    if len > MAX_HEADER_LEN {
        return Err(corrupt(format!("a header of {len} bytes")));
    }
    // The rest of the frame: the checksum and the body.
    let mut frame = head[MAGIC_LEN..].to_vec();
    frame.resize(4 + 4 + len, 0);
    file.read_exact(&mut frame[4..]).map_err(io_error(path))?;
    match log::read_frame(&frame, MAX_HEADER_LEN, &decode_frame) {
        Ok((Frame::Header(meta), _)) => Ok(meta),
        Ok((Frame::Record(_) | Frame::Generation(_), _)) => Err(corrupt("no header".into())),
        Err(reason) => Err(corrupt(format!("its header: {reason}"))),
    }
}

/// The newest snapshot in `dir`, if any.
pub fn newest(dir: &Path) -> Result<Option<(SnapshotMeta, SnapshotFile)>, StoreError> {
    let Some((_, path)) = numbered_files(dir, "snapshot-")?.pop() else {
        return Ok(None);
    };
    let meta = read_meta(&path)?;
    let len = std::fs::metadata(&path).map_err(io_error(&path))?.len();
    Ok(Some((meta, SnapshotFile { path, len })))
}

/// Deletes every snapshot in `dir` but `keep`.
pub fn remove_older(dir: &Path, keep: &Path) -> Result<(), StoreError> {
    let mut removed = false;
    for (_, path) in numbered_files(dir, "snapshot-")? {
        if path != keep {
            std::fs::remove_file(&path).map_err(io_error(&path))?;
            removed = true;
        }
    }
    if removed {
        sync_dir(dir)?;
    }
    Ok(())
}

/// Builds a snapshot of the registry as of the state machine's last applied entry, on a
/// blocking thread (writing a million keys takes about a second).
///
/// Consistency: openraft may apply more entries while the builder reads the shards, so a key
/// may be read in a state after `last_applied`. Every record is a key's whole state or its
/// end, so replaying the entries after `last_applied` over the snapshot (what a follower that
/// installs it does) gives the same state either way, as for single-node snapshots taken while
/// writes go on.
pub struct SnapshotBuilder {
    /// Read shard by shard.
    pub(super) registry: Arc<Registry>,
    /// The notifier's held events and dead letters, written after the keys.
    pub(super) webhooks: Arc<Replication>,
    /// Where snapshots are written.
    pub(super) dir: PathBuf,
    /// What the snapshot covers: the state machine's at the builder's creation.
    pub(super) last_applied: Option<LogId>,
    pub(super) membership: StoredMembership,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_millis());
        let snapshot_id = match self.last_applied {
            Some(id) => format!("{}-{}-{unix_ms}", id.leader_id.term, id.index),
            None => format!("none-{unix_ms}"),
        };
        let meta = SnapshotMeta {
            last_log_id: self.last_applied,
            last_membership: self.membership.clone(),
            snapshot_id,
        };
        let (registry, dir, header) = (Arc::clone(&self.registry), self.dir.clone(), meta.clone());
        // Every event of the entries applied so far is in the outboxes before they are read.
        self.webhooks.caught_up().await;
        let webhook_records = self.webhooks.durable_records();
        let written = tokio::task::spawn_blocking(move || {
            let webhooks = webhook_records.into_iter().map(|record| (record, 0));
            write(
                &dir,
                &header,
                registry.state_records_with_generations().chain(webhooks),
            )
        })
        .await
        .map_err(|error| StoreError::Task(error.to_string()))
        .and_then(|written| written);
        let file = written.map_err(|error| {
            storage_error(ErrorSubject::Snapshot(None), ErrorVerb::Write, &error)
        })?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(file),
        })
    }
}
