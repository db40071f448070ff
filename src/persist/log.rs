//! The framing of log and snapshot files, and reading them back.
//!
//! A file is an 8-byte magic (`TTLWLOG1` or `TTLWSNP1`: kind and format version) followed by
//! frames. A frame is `[len: u32 LE][crc: u32 LE][version: u8][record]`: `len` counts the
//! version byte and the record, `crc` is CRC-32 (IEEE) of the same bytes. The version byte lets
//! a later release read records of an earlier one.
//!
//! Reading tells two failures apart, as etcd's WAL and Redis's `aof-load-truncated` do. At the
//! first frame that cannot be read (cut short, wrong length, checksum or record):
//! - if no valid frame follows it, it is a **torn tail**: a crash in the middle of an append
//!   (the frame cut short, or garbage or zeros where a filesystem extended the file before the
//!   data landed). Everything before it is good; recovery keeps that and says what it dropped.
//! - if a valid frame follows it, it is **corruption**: not something a crash leaves. The
//!   reader refuses, naming the file and the offset, and the operator decides (`README`: cut the
//!   file at that offset to keep what precedes it).
//!
//! A frame is at most [`MAX_FRAME_LEN`] bytes, so the frame after a damaged one starts within
//! that distance: the search for it is bounded.
//!
//! The framing is not tied to [`Record`]: [`frame_with`] and [`scan_frames`] carry any payload
//! under a [`Format`] (magic, largest frame), which the cluster's Raft log uses for its entries
//! (`cluster::log_store`).

use std::path::{Path, PathBuf};

use super::record::Record;

/// Bytes before the first frame: the file's kind and format version.
pub const MAGIC_LEN: usize = 8;
/// The magic of a log segment.
pub const LOG_MAGIC: &[u8; MAGIC_LEN] = b"TTLWLOG1";
/// The magic of a snapshot.
pub const SNAPSHOT_MAGIC: &[u8; MAGIC_LEN] = b"TTLWSNP1";
/// The record format version this release writes (and the only one it reads so far).
pub const RECORD_VERSION: u8 = 1;
/// Frame header: length and checksum.
const HEADER_LEN: usize = 8;
/// Largest frame accepted: the largest record (a 256-byte key, a 128-byte service, 4 KiB of
/// metadata, a few numbers) is far below it, so a larger length is corruption, not a record.
pub const MAX_FRAME_LEN: usize = 64 * 1024;

/// Appends one framed record to `out`.
pub fn frame(record: &Record, out: &mut Vec<u8>) {
    frame_with(out, |out| record.encode(out));
}

/// Appends one frame whose payload `encode` writes (after the version byte) to `out`. Other
/// files in this framing (the cluster's Raft log, `cluster::log_store`) carry payloads of their
/// own; the caller keeps them under its own size limit (a payload must stay below 4 GiB).
pub fn frame_with(out: &mut Vec<u8>, encode: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    frame_unsealed_with(out, encode);
    seal_frame(&mut out[start..]);
}

/// Appends one framed record to `out` without its checksum (zero): it is not a frame to write
/// until [`seal_frames`] has filled it in. For the journal, whose appenders hold a shard's
/// lock: its flusher thread seals what it takes, just before it writes, so a mass expiry's
/// checksums (one per record, ~10 % of its sweep with persistence on) are not computed under
/// the lock.
pub fn frame_unsealed(record: &Record, out: &mut Vec<u8>) {
    frame_unsealed_with(out, |out| record.encode(out));
}

fn frame_unsealed_with(out: &mut Vec<u8>, encode: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER_LEN]);
    out.push(RECORD_VERSION);
    encode(out);
    let len = out.len() - start - HEADER_LEN;
    let len = u32::try_from(len).expect("a frame's payload is kept far below 4 GiB");
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// Fills in the checksum of every frame in `frames`, which holds whole frames only (framed by
/// [`frame_unsealed`] or already sealed: sealing again changes nothing).
pub fn seal_frames(frames: &mut [u8]) {
    let mut offset = 0;
    while offset < frames.len() {
        offset += seal_frame(&mut frames[offset..]);
    }
}

/// Fills in the checksum of the frame at the start of `bytes`; returns the frame's length.
fn seal_frame(bytes: &mut [u8]) -> usize {
    let len = u32::from_le_bytes(bytes[0..4].try_into().expect("a whole frame header")) as usize;
    let crc = crc32fast::hash(&bytes[HEADER_LEN..HEADER_LEN + len]);
    bytes[4..8].copy_from_slice(&crc.to_le_bytes());
    HEADER_LEN + len
}

/// How a file ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tail {
    /// At a frame boundary.
    Clean,
    /// A torn last frame at `offset`; `dropped` bytes from there to the end were not read.
    Torn { offset: u64, dropped: u64 },
}

/// A file that cannot be read back.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a ttlwheel {kind} (its first bytes are not {magic:?})")]
    NotOurs {
        path: PathBuf,
        kind: &'static str,
        magic: String,
    },
    #[error("{path} is corrupted at byte offset {offset}: {reason}")]
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
}

/// The records of a file, in order, and how it ended.
#[derive(Debug)]
pub struct Contents {
    pub records: Vec<Record>,
    pub tail: Tail,
    /// Bytes up to the end of the last whole frame (where appending may go on).
    pub valid_len: u64,
}

/// Reads a whole log segment or snapshot (`magic` says which).
pub fn read_file(path: &Path, magic: &[u8; MAGIC_LEN]) -> Result<Contents, ReadError> {
    let bytes = std::fs::read(path).map_err(|source| ReadError::Io {
        path: path.to_owned(),
        source,
    })?;
    read_bytes(&bytes, magic).map_err(|problem| problem.at(path))
}

/// What went wrong where, before the file's path is known.
#[derive(Debug)]
pub enum Problem {
    NotOurs(&'static str, String),
    Corrupt(u64, String),
}

impl Problem {
    /// The error naming the file it happened in.
    pub fn at(self, path: &Path) -> ReadError {
        match self {
            Self::NotOurs(kind, magic) => ReadError::NotOurs {
                path: path.to_owned(),
                kind,
                magic,
            },
            Self::Corrupt(offset, reason) => ReadError::Corrupt {
                path: path.to_owned(),
                offset,
                reason,
            },
        }
    }
}

/// [`read_file`] on bytes already read.
pub fn read_bytes(bytes: &[u8], magic: &[u8; MAGIC_LEN]) -> Result<Contents, Problem> {
    let mut records = Vec::new();
    let (tail, valid_len) = scan(bytes, magic, |record| records.push(record))?;
    Ok(Contents {
        records,
        tail,
        valid_len,
    })
}

/// How a file ended and the length of its whole frames, when its records went elsewhere.
#[derive(Debug)]
pub struct Scanned {
    pub tail: Tail,
    pub valid_len: u64,
    pub n_records: u64,
}

/// Reads a file like [`read_file`], handing its records to `sink` in batches of `batch` while
/// a second thread decodes the next ones (recovery decodes and applies on two cores at once,
/// and never holds a whole file's records in memory).
pub fn read_file_in_batches(
    path: &Path,
    magic: &[u8; MAGIC_LEN],
    batch: usize,
    mut sink: impl FnMut(Vec<Record>),
) -> Result<Scanned, ReadError> {
    let bytes = std::fs::read(path).map_err(|source| ReadError::Io {
        path: path.to_owned(),
        source,
    })?;
    let (sender, batches) = std::sync::mpsc::sync_channel::<Vec<Record>>(4);
    let scanned = std::thread::scope(|scope| {
        let decoder = scope.spawn(|| {
            let mut n_records = 0;
            let mut pending = Vec::with_capacity(batch);
            let scanned = scan(&bytes, magic, |record| {
                n_records += 1;
                pending.push(record);
                if pending.len() == batch {
                    let full = std::mem::replace(&mut pending, Vec::with_capacity(batch));
                    // The receiver only stops early if the applying side panicked.
                    let _ = sender.send(full);
                }
            });
            if !pending.is_empty() {
                let _ = sender.send(pending);
            }
            drop(sender);
            scanned.map(|(tail, valid_len)| Scanned {
                tail,
                valid_len,
                n_records,
            })
        });
        for records in batches {
            sink(records);
        }
        decoder.join().expect("the decoder does not panic")
    });
    scanned.map_err(|problem| problem.at(path))
}

/// Reads the frames of `bytes` (a whole file), handing each record to `on_record`; returns how
/// the file ended and the length of its whole frames.
fn scan(
    bytes: &[u8],
    magic: &[u8; MAGIC_LEN],
    mut on_record: impl FnMut(Record),
) -> Result<(Tail, u64), Problem> {
    let kind = if magic == LOG_MAGIC {
        "log segment"
    } else {
        "snapshot"
    };
    let format = Format {
        magic,
        kind,
        max_frame_len: MAX_FRAME_LEN,
    };
    let decode = |payload: &[u8]| Record::decode(payload).map_err(|error| error.to_string());
    scan_frames(bytes, &format, &decode, |record, _| on_record(record))
}

/// A kind of file in this framing: what [`scan_frames`] needs besides the payload decoder.
#[derive(Clone, Copy, Debug)]
pub struct Format<'a> {
    /// The file's first bytes.
    pub magic: &'a [u8; MAGIC_LEN],
    /// What errors call the file ("log segment").
    pub kind: &'static str,
    /// A longer frame is damage, not a payload; also bounds the search for a valid frame after
    /// a damaged one.
    pub max_frame_len: usize,
}

/// Where a frame sits in its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameAt {
    /// Byte offset of the frame's header.
    pub offset: u64,
    /// The whole frame's length, header included.
    pub len: u64,
}

/// [`scan`] for any payload: reads the frames of `bytes` (a whole file of `format`), decoding
/// each payload with `decode` and handing it to `on_frame` with where it sits; a torn tail or
/// corruption is told apart as the module documentation says.
pub fn scan_frames<T>(
    bytes: &[u8],
    format: &Format<'_>,
    decode: &impl Fn(&[u8]) -> Result<T, String>,
    mut on_frame: impl FnMut(T, FrameAt),
) -> Result<(Tail, u64), Problem> {
    let (magic, kind) = (format.magic, format.kind);
    if bytes.len() < MAGIC_LEN {
        // A file created and not yet written whole: nothing in it was acknowledged.
        if magic.starts_with(bytes) {
            return Ok((torn(bytes, 0), 0));
        }
        return Err(Problem::NotOurs(
            kind,
            String::from_utf8_lossy(magic).into(),
        ));
    }
    if &bytes[..MAGIC_LEN] != magic {
        return Err(Problem::NotOurs(
            kind,
            String::from_utf8_lossy(magic).into(),
        ));
    }
    let mut offset = MAGIC_LEN;
    while offset < bytes.len() {
        match read_frame(&bytes[offset..], format.max_frame_len, decode) {
            Ok((payload, used)) => {
                let at = FrameAt {
                    offset: offset as u64,
                    len: used as u64,
                };
                on_frame(payload, at);
                offset += used;
            }
            Err(reason) if valid_frame_after(bytes, offset, format.max_frame_len, decode) => {
                return Err(Problem::Corrupt(offset as u64, reason));
            }
            Err(_) => return Ok((torn(bytes, offset), offset as u64)),
        }
    }
    Ok((Tail::Clean, offset as u64))
}

/// Whether a valid frame starts anywhere after `offset`, within the longest distance the next
/// frame could be (the damaged frame at `offset` was at most `max_frame_len` long).
fn valid_frame_after<T>(
    bytes: &[u8],
    offset: usize,
    max_frame_len: usize,
    decode: &impl Fn(&[u8]) -> Result<T, String>,
) -> bool {
    let last = bytes.len().min(offset + HEADER_LEN + max_frame_len);
    (offset + 1..last).any(|start| read_frame(&bytes[start..], max_frame_len, decode).is_ok())
}

fn torn(bytes: &[u8], offset: usize) -> Tail {
    Tail::Torn {
        offset: offset as u64,
        dropped: (bytes.len() - offset) as u64,
    }
}

/// Reads the frame at the start of `bytes`: the decoded payload and the bytes the frame took,
/// or why not. A frame longer than `max_frame_len` is refused unread.
pub fn read_frame<T>(
    bytes: &[u8],
    max_frame_len: usize,
    decode: &impl Fn(&[u8]) -> Result<T, String>,
) -> Result<(T, usize), String> {
    if bytes.len() < HEADER_LEN {
        return Err("the file ends inside a frame header".into());
    }
    let len = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
    if len == 0 || len > max_frame_len {
        return Err(format!("a frame length of {len} bytes"));
    }
    let Some(body) = bytes.get(HEADER_LEN..HEADER_LEN + len) else {
        return Err(format!("the file ends inside a frame of {len} bytes"));
    };
    // The version byte first: a cheap test that rejects most garbage before the checksum.
    if body[0] != RECORD_VERSION {
        return Err(format!(
            "record format version {} (this release reads {RECORD_VERSION})",
            body[0]
        ));
    }
    if crc32fast::hash(body) != crc {
        return Err("checksum mismatch".into());
    }
    let payload = decode(&body[1..])?;
    Ok((payload, HEADER_LEN + len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persist::testing::record as upsert;
    use proptest::prelude::*;

    /// A log file of `n` records, and the offset where each frame starts.
    fn file_of(n: u64) -> (Vec<u8>, Vec<usize>) {
        let mut bytes = LOG_MAGIC.to_vec();
        let mut starts = Vec::new();
        for i in 0..n {
            starts.push(bytes.len());
            frame(&upsert(i), &mut bytes);
        }
        (bytes, starts)
    }

    #[test]
    fn a_whole_file_reads_back_clean() {
        let (bytes, _) = file_of(5);
        let contents = read_bytes(&bytes, LOG_MAGIC).unwrap();
        assert_eq!(contents.records, (0..5).map(upsert).collect::<Vec<_>>());
        assert_eq!(contents.tail, Tail::Clean);
        assert_eq!(contents.valid_len, bytes.len() as u64);
    }

    #[test]
    fn sealed_frames_are_the_frames_written_whole() {
        let (mut whole, mut unsealed) = (Vec::new(), Vec::new());
        for i in 0..5 {
            frame(&upsert(i), &mut whole);
            frame_unsealed(&upsert(i), &mut unsealed);
        }
        assert_ne!(unsealed, whole, "an unsealed frame has no checksum");
        seal_frames(&mut unsealed);
        assert_eq!(unsealed, whole);
        seal_frames(&mut unsealed);
        assert_eq!(unsealed, whole, "sealing again changes nothing");
    }

    #[test]
    fn a_snapshot_is_not_read_as_a_log_nor_the_other_way() {
        let (bytes, _) = file_of(1);
        assert!(matches!(
            read_bytes(&bytes, SNAPSHOT_MAGIC),
            Err(Problem::NotOurs(..))
        ));
    }

    proptest! {
        /// A log cut at any byte (a crash during an append) reads back every whole frame
        /// before the cut, and reports the rest as a torn tail.
        #[test]
        fn a_log_cut_at_any_byte_keeps_every_whole_frame(cut in any::<prop::sample::Index>()) {
            let (bytes, starts) = file_of(6);
            let cut = cut.index(bytes.len() + 1);
            let contents = read_bytes(&bytes[..cut], LOG_MAGIC).unwrap();
            let whole = starts.iter().skip(1).chain([&bytes.len()]).filter(|&&end| end <= cut).count();
            prop_assert_eq!(contents.records.len(), whole);
            let boundary = cut == bytes.len() || starts.contains(&cut);
            prop_assert_eq!(contents.tail == Tail::Clean, boundary && cut >= MAGIC_LEN);
        }

        /// Zero bytes after the last frame (a filesystem that extended the file before the
        /// data landed) are a torn tail, not corruption.
        #[test]
        fn zeros_after_the_last_frame_are_a_torn_tail(zeros in 1usize..200) {
            let (mut bytes, _) = file_of(3);
            let end = bytes.len();
            bytes.extend(std::iter::repeat_n(0, zeros));
            let contents = read_bytes(&bytes, LOG_MAGIC).unwrap();
            prop_assert_eq!(contents.records.len(), 3);
            prop_assert_eq!(contents.tail, Tail::Torn { offset: end as u64, dropped: zeros as u64 });
        }

        /// A byte flipped in any frame but the last is corruption at that frame's offset (even
        /// in its length field); in the last frame it reads as a torn tail (a crash can leave
        /// exactly that).
        #[test]
        fn a_flipped_byte_is_corruption_at_its_frame_unless_in_the_last(at in any::<prop::sample::Index>(), flip in 1u8..=255) {
            let (mut bytes, starts) = file_of(4);
            let at = MAGIC_LEN + at.index(bytes.len() - MAGIC_LEN);
            bytes[at] ^= flip;
            let frame_start = *starts.iter().rev().find(|&&start| start <= at).unwrap();
            let last = frame_start == *starts.last().unwrap();
            match read_bytes(&bytes, LOG_MAGIC) {
                Ok(contents) => {
                    prop_assert!(last, "a flip at {} in a middle frame was not noticed", at);
                    prop_assert_eq!(contents.records.len(), 3);
                }
                Err(Problem::Corrupt(offset, _)) => {
                    prop_assert!(!last);
                    prop_assert_eq!(offset, frame_start as u64);
                }
                Err(other) => prop_assert!(false, "{:?}", other),
            }
        }
    }
}
