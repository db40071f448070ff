//! The Raft log on disk: openraft's `RaftLogStorage` over segment files in `persist::log`'s
//! framing (length, CRC-32, version byte; torn tail versus corruption).
//!
//! **What it reuses of `persist`, and what it does not.** The design (docs/cluster-design.md,
//! section 4) puts the Raft log on the journal itself. This first version is a segment format
//! of its own, reusing the framing and its reader (`persist::log::{frame_with, scan_frames,
//! read_frame}`) but not `persist::journal::Journal`, because the journal does not fit Raft's
//! log as it is: it frames only `Record`s, numbers them itself (LSNs) where Raft dictates the
//! index, has no way to cut back a suffix it has written (a follower's conflicting entries,
//! [`RaftLogStorage::truncate`]), and keeps unwritten records in a buffer nobody can read (an
//! appended entry must be readable at once). Teaching it all four would have changed the
//! single-node path; the group commit the journal gives is kept here by the same shape: one
//! flusher thread that syncs what every append since its last sync wrote.
//!
//! Layout of the directory (`<data-dir>/raft/` in cluster mode):
//! - `log-<first index>.ttlw`: segments, magic `TTLWRLG1` (never mistaken for a single-node
//!   `TTLWLOG1` segment), one frame per entry: `[term u64][leader node u64][index u64][tag u8]`
//!   then the payload (nothing for a blank entry, the [`Command`] encoding, or the membership
//!   as JSON). A segment holds entries from the index in its name on, in order; a new one starts
//!   past [`SEGMENT_BYTES`].
//! - `vote`, `purged`: JSON, written whole (tmp, sync, rename, directory sync) before the call
//!   that changes them returns.
//! - `committed`: JSON, written whole but not synced: a stale or missing value only makes a
//!   restarted node re-apply less before a leader tells it more (openraft's "optionally
//!   persisted committed"), and an unreadable one is read as nothing, with a warning. openraft
//!   reports a new committed id for every entry, on every member; the file is written by the
//!   flusher at most every [`COMMITTED_SAVE_EVERY`] (and at shutdown), never from openraft's
//!   task. Measured at one creation per request: a file created and renamed per entry (ext4
//!   starts writing a file renamed over another at once) held up openraft's core and cost a
//!   follower's main runtime ~0.16 ms per entry (0.42 ms then, 0.26 ms now); p50 1.80 ms then,
//!   1.29 ms now. The flusher writes a committed id only after syncing every append sent
//!   before it, so the file never names an entry the log could lose in a crash.
//!
//! Invariants: indexed entries are consecutive, from `purged + 1` (or the first entry when
//! nothing was purged) to the last; entries at or below `purged` may still sit in a segment
//! (one that straddles it), are never read and are skipped by recovery; every indexed entry is
//! written to its segment file (in the page cache at least) before `append` returns, and is
//! reported durable (the `LogFlushed` callback) only after a sync that covers it.
//!
//! Appends write to the file from openraft's task (a `write` into the page cache; the sync, which
//! is what takes time, is the flusher's). Reads go to the file at the offsets of an in-memory
//! index (about 40 bytes per entry): there is no decoded tail cache yet (design section 4); the
//! page cache serves recent entries.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::File;
use std::ops::{Bound, RangeBounds};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{CommittedLeaderId, EntryPayload, ErrorSubject, ErrorVerb, RaftLogReader};
use parking_lot::Mutex;

use super::network::{entries_that_fit, MAX_APPEND_BYTES};
use super::types::{Command, Entry, LogId, StorageError, TypeConfig, Vote};
use super::{io_error, numbered_files, read_json, storage_error, sync_dir, write_json, StoreError};
use crate::persist::log::{self, Format, FrameAt, Tail, MAGIC_LEN};

/// The magic of a Raft log segment.
pub const RAFT_LOG_MAGIC: &[u8; MAGIC_LEN] = b"TTLWRLG1";
/// Largest frame of one entry. A command is capped at 4,096 records by its proposer (design
/// section 3) and a record at ~4.6 KiB (a 256-byte key, a 128-byte service, 4 KiB of metadata),
/// so ~19 MiB; a longer length is damage.
pub const MAX_ENTRY_FRAME_LEN: usize = 32 << 20;
/// A segment grows to about this size before the next one starts: purging deletes whole
/// segments, so this is the granularity at which disk space comes back.
pub const SEGMENT_BYTES: u64 = 64 << 20;

const FORMAT: Format<'static> = Format {
    magic: RAFT_LOG_MAGIC,
    kind: "Raft log segment",
    max_frame_len: MAX_ENTRY_FRAME_LEN,
};

/// How often, at most, the committed id is written to its file (see the module documentation):
/// a restart re-applies at most this much less of the log before a leader tells it more.
pub const COMMITTED_SAVE_EVERY: Duration = Duration::from_millis(100);

/// Bytes of an entry's frame payload before its tag: term, leader node, index.
const LOG_ID_LEN: usize = 24;
const BLANK: u8 = 0;
const NORMAL: u8 = 1;
const MEMBERSHIP: u8 = 2;

/// See the module documentation. Clones share the same log (the reader openraft asks for is
/// one).
#[derive(Clone)]
pub struct LogStore {
    shared: Arc<Shared>,
}

struct Shared {
    dir: PathBuf,
    /// Never held across an `.await` (nothing here awaits).
    state: Mutex<State>,
    /// Syncs and committed ids for the flusher thread; it stops when the last clone of the
    /// store is dropped.
    flushes: mpsc::Sender<ToFlusher>,
}

struct State {
    vote: Option<Vote>,
    committed: Option<LogId>,
    purged: Option<LogId>,
    /// Oldest first; the last is the one appended to.
    segments: Vec<Segment>,
    /// Every entry above `purged`, by index.
    index: BTreeMap<u64, Location>,
    /// Where a new segment starts.
    segment_bytes: u64,
}

/// One segment file.
struct Segment {
    /// The index of its first entry (its name).
    first: u64,
    path: PathBuf,
    /// Shared with the flusher, which syncs it.
    file: Arc<File>,
    /// Bytes of whole frames: where the next one goes.
    len: u64,
}

/// Where an entry's frame is.
#[derive(Clone, Copy, Debug)]
struct Location {
    /// The `first` of its segment.
    segment: u64,
    at: FrameAt,
    log_id: LogId,
}

/// What the flusher is asked to do.
enum ToFlusher {
    /// Sync an append's writes, then tell openraft.
    Sync(FlushJob),
    /// Write this committed id to its file, after the syncs of every append sent before it.
    Committed(Option<LogId>),
    /// Write the newest committed id now, then answer (shutdown).
    SaveNow(mpsc::SyncSender<()>),
}

/// A sync the flusher owes an append.
struct FlushJob {
    /// The segment written to (none: the append had no entries).
    file: Option<Arc<File>>,
    callback: LogFlushed<TypeConfig>,
}

impl LogStore {
    /// Opens (creating it if needed) the log in `dir` and recovers it: the vote, the purged
    /// and committed ids, and every entry's location; a torn tail at the end of the last
    /// segment is cut off.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        Self::open_with(dir, SEGMENT_BYTES)
    }

    /// [`LogStore::open`] with segments of about `segment_bytes` (tests use small ones).
    pub fn open_with(dir: &Path, segment_bytes: u64) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir).map_err(io_error(dir))?;
        let vote = read_json(&dir.join("vote"))?;
        let purged: Option<LogId> = read_json(&dir.join("purged"))?.flatten();
        let committed = read_json::<Option<LogId>>(&dir.join("committed"))
            .unwrap_or_else(|error| {
                tracing::warn!(%error, "the committed log id cannot be read; starting without it");
                None
            })
            .flatten();
        let mut state = State {
            vote,
            committed,
            purged,
            segments: Vec::new(),
            index: BTreeMap::new(),
            segment_bytes,
        };
        state.recover_segments(dir)?;
        let (sender, jobs) = mpsc::channel();
        let flusher_dir = dir.to_owned();
        std::thread::Builder::new()
            .name("ttlwheel-raft-log".into())
            .spawn(move || flush_loop(&flusher_dir, &jobs))
            .map_err(io_error(dir))?;
        Ok(Self {
            shared: Arc::new(Shared {
                dir: dir.to_owned(),
                state: Mutex::new(state),
                flushes: sender,
            }),
        })
    }

    /// The bytes the log's segments hold on disk.
    pub fn bytes(&self) -> u64 {
        let state = self.shared.state.lock();
        state.segments.iter().map(|segment| segment.len).sum()
    }

    /// The bytes of the entries after `index` (those a snapshot at `index` does not cover).
    pub fn bytes_after(&self, index: Option<u64>) -> u64 {
        let state = self.shared.state.lock();
        let from = index.map_or(0, |index| index + 1);
        (state.index.range(from..))
            .map(|(_, location)| location.at.len)
            .sum()
    }

    /// The last log id known to be committed (what `GET /v1/cluster` shows as
    /// `committed_index`).
    pub fn committed(&self) -> Option<LogId> {
        self.shared.state.lock().committed
    }

    /// Writes the newest committed id to its file now (the flusher otherwise writes it at most
    /// every [`COMMITTED_SAVE_EVERY`]): at shutdown, so a restart re-applies all of it.
    /// Blocks until it is written (or the flusher is gone).
    pub fn save_committed_now(&self) {
        let (done, written) = mpsc::sync_channel(1);
        if self.shared.flushes.send(ToFlusher::SaveNow(done)).is_ok() {
            let _ = written.recv();
        }
    }

    /// The index of the last entry in `start..end` such that the frames from `start` through
    /// it take at most `budget` bytes (at least the first: `None` only when there is none).
    fn last_within(&self, start: u64, end: u64, budget: u64) -> Option<u64> {
        let state = self.shared.state.lock();
        let mut spent = 0;
        let mut last = None;
        for (&index, location) in state.index.range(start..end) {
            spent += location.at.len;
            if spent > budget && last.is_some() {
                break;
            }
            last = Some(index);
        }
        last
    }

    /// The entries in `range` still in the log, read back from their segments.
    fn entries(&self, range: impl RangeBounds<u64>) -> Result<Vec<Entry>, StoreError> {
        let state = self.shared.state.lock();
        let mut entries = Vec::new();
        let mut locations = state.index.range(range).map(|(_, at)| *at).peekable();
        // Consecutive frames of one segment are read with one positional read.
        while let Some(first) = locations.next() {
            let mut run = vec![first];
            while let Some(next) = locations.next_if(|next| {
                let last = run.last().expect("a run is never empty");
                next.segment == last.segment && next.at.offset == last.at.offset + last.at.len
            }) {
                run.push(next);
            }
            let segment = state.segment(first.segment);
            let start = first.at.offset;
            let end = run
                .last()
                .map_or(start, |last| last.at.offset + last.at.len);
            let mut bytes = vec![0; (end - start) as usize];
            segment
                .file
                .read_exact_at(&mut bytes, start)
                .map_err(io_error(&segment.path))?;
            for location in run {
                let from = (location.at.offset - start) as usize;
                let frame = &bytes[from..from + location.at.len as usize];
                let (entry, _) = log::read_frame(frame, MAX_ENTRY_FRAME_LEN, &decode_entry)
                    .map_err(|reason| StoreError::Corrupt {
                        path: segment.path.clone(),
                        reason: format!("at byte offset {}: {reason}", location.at.offset),
                    })?;
                entries.push(entry);
            }
        }
        Ok(entries)
    }

    /// Writes `entries` to the segments (rotating past the segment size) and indexes them.
    /// Returns the segment the last ones went to, which the flusher must sync.
    fn write(&self, entries: impl Iterator<Item = Entry>) -> Result<Option<Arc<File>>, StoreError> {
        let mut state = self.shared.state.lock();
        let mut batch = Batch::default();
        for entry in entries {
            let index = entry.log_id.index;
            if state.purged.is_some_and(|purged| index <= purged.index) {
                // Already covered by what was purged (the state machine holds it); never read
                // again. openraft's storage suite appends such entries after its start-up
                // purged the log up to a state machine ahead of it.
                continue;
            }
            let last = batch
                .locations
                .last()
                .map(|location| location.log_id.index)
                .or_else(|| state.last_index());
            if let Some(last) = last {
                if index != last + 1 {
                    return Err(StoreError::Hole { last, found: index });
                }
            }
            let start = batch.bytes.len();
            log::frame_with(&mut batch.bytes, |out| encode_entry(&entry, out));
            let len = batch.bytes.len() - start;
            if len > MAX_ENTRY_FRAME_LEN {
                return Err(StoreError::TooLarge { len });
            }
            // A segment that holds a frame takes no frame that would carry it past the size.
            let size_before = state
                .segments
                .last()
                .map(|segment| segment.len + start as u64);
            let full = size_before.is_none_or(|size| {
                size > MAGIC_LEN as u64 && size + len as u64 > state.segment_bytes
            });
            if full {
                // The frame just made starts the next segment: write what precedes it first.
                let frame = batch.bytes.split_off(start);
                state.write_batch(std::mem::take(&mut batch))?;
                state.start_segment(&self.shared.dir, index)?;
                batch.bytes = frame;
            }
            let segment = state.segments.last().expect("a segment was just ensured");
            batch.locations.push(Location {
                segment: segment.first,
                at: FrameAt {
                    offset: segment.len + (batch.bytes.len() - len) as u64,
                    len: len as u64,
                },
                log_id: entry.log_id,
            });
        }
        state.write_batch(batch)?;
        Ok(state
            .segments
            .last()
            .map(|segment| Arc::clone(&segment.file)))
    }

    /// Deletes entries from `index` on: later segments go, the one holding `index` is cut.
    fn truncate_from(&self, index: u64) -> Result<(), StoreError> {
        let mut state = self.shared.state.lock();
        let Some(cut) = state.index.get(&index).copied() else {
            return Ok(());
        };
        state.index.split_off(&index);
        while state
            .segments
            .last()
            .is_some_and(|segment| segment.first > cut.segment)
        {
            let segment = state.segments.pop().expect("checked");
            std::fs::remove_file(&segment.path).map_err(io_error(&segment.path))?;
        }
        let segment = state
            .segments
            .last_mut()
            .expect("the segment holding the cut entry stays");
        segment
            .file
            .set_len(cut.at.offset)
            .and_then(|()| segment.file.sync_data())
            .map_err(io_error(&segment.path))?;
        segment.len = cut.at.offset;
        sync_dir(&self.shared.dir)
    }

    /// Records `log_id` as purged, then forgets the entries up to it and deletes the segments
    /// that hold nothing else.
    fn purge_upto(&self, log_id: LogId) -> Result<(), StoreError> {
        let mut state = self.shared.state.lock();
        if state
            .purged
            .is_some_and(|purged| purged.index >= log_id.index)
        {
            return Ok(());
        }
        write_json(&self.shared.dir, "purged", &Some(log_id), true)?;
        state.purged = Some(log_id);
        state.index = state.index.split_off(&(log_id.index + 1));
        // A segment ends where the next begins; the last one is kept to append to.
        let n_gone = state
            .segments
            .windows(2)
            .take_while(|pair| pair[1].first <= log_id.index + 1)
            .count();
        for segment in state.segments.drain(..n_gone) {
            std::fs::remove_file(&segment.path).map_err(io_error(&segment.path))?;
        }
        if n_gone > 0 {
            sync_dir(&self.shared.dir)?;
        }
        Ok(())
    }

    /// Segment files in the directory, for tests.
    #[cfg(test)]
    fn segment_paths(&self) -> Vec<PathBuf> {
        let state = self.shared.state.lock();
        state
            .segments
            .iter()
            .map(|segment| segment.path.clone())
            .collect()
    }
}

/// Frames of one append not yet written, and where they will be.
#[derive(Default)]
struct Batch {
    bytes: Vec<u8>,
    locations: Vec<Location>,
}

impl State {
    fn last_index(&self) -> Option<u64> {
        self.index
            .last_key_value()
            .map(|(index, _)| *index)
            .or(self.purged.map(|purged| purged.index))
    }

    fn segment(&self, first: u64) -> &Segment {
        let at = self
            .segments
            .binary_search_by_key(&first, |segment| segment.first)
            .expect("an indexed entry's segment exists");
        &self.segments[at]
    }

    /// Writes `batch` at the end of the last segment and indexes its entries; on failure the
    /// segment is cut back so no half frame stays (as the journal does).
    fn write_batch(&mut self, batch: Batch) -> Result<(), StoreError> {
        if batch.bytes.is_empty() {
            return Ok(());
        }
        let segment = self.segments.last_mut().expect("entries go to a segment");
        if let Err(error) = segment.file.write_all_at(&batch.bytes, segment.len) {
            let _ = segment.file.set_len(segment.len);
            return Err(io_error(&segment.path)(error));
        }
        segment.len += batch.bytes.len() as u64;
        for location in batch.locations {
            self.index.insert(location.log_id.index, location);
        }
        Ok(())
    }

    /// Starts the segment whose first entry is `first`, after syncing the current one (the
    /// flusher only syncs the last segment).
    fn start_segment(&mut self, dir: &Path, first: u64) -> Result<(), StoreError> {
        if let Some(current) = self.segments.last() {
            current.file.sync_data().map_err(io_error(&current.path))?;
        }
        let path = dir.join(format!("log-{first:020}.ttlw"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_error(&path))?;
        file.write_all_at(RAFT_LOG_MAGIC, 0)
            .and_then(|()| file.sync_data())
            .map_err(io_error(&path))?;
        sync_dir(dir)?;
        self.segments.push(Segment {
            first,
            path,
            file: Arc::new(file),
            len: MAGIC_LEN as u64,
        });
        Ok(())
    }

    /// Reads every segment in `dir` in order, indexing the entries above `purged`.
    fn recover_segments(&mut self, dir: &Path) -> Result<(), StoreError> {
        let paths = numbered_files(dir, "log-")?;
        let n_paths = paths.len();
        for (position, (first, path)) in paths.into_iter().enumerate() {
            let bytes = std::fs::read(&path).map_err(io_error(&path))?;
            let mut found = Vec::new();
            let (tail, valid_len) =
                log::scan_frames(&bytes, &FORMAT, &decode_log_id, |log_id, at| {
                    found.push((log_id, at));
                })
                .map_err(|problem| problem.at(&path))?;
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(io_error(&path))?;
            if let Tail::Torn { offset, dropped } = tail {
                if position + 1 != n_paths {
                    return Err(StoreError::TornInside { path, offset });
                }
                tracing::warn!(path = %path.display(), offset, dropped,
                    "the Raft log ends in a torn entry (a crash during an append): cut off");
                file.set_len(valid_len)
                    .and_then(|()| file.sync_data())
                    .map_err(io_error(&path))?;
            }
            if valid_len < MAGIC_LEN as u64 {
                // Created and not yet written whole: give it its magic again.
                file.write_all_at(RAFT_LOG_MAGIC, 0)
                    .and_then(|()| file.sync_data())
                    .map_err(io_error(&path))?;
            }
            for (log_id, at) in found {
                if self
                    .purged
                    .is_some_and(|purged| log_id.index <= purged.index)
                {
                    continue;
                }
                if let Some((&last, _)) = self.index.last_key_value() {
                    if log_id.index != last + 1 {
                        return Err(StoreError::Hole {
                            last,
                            found: log_id.index,
                        });
                    }
                }
                self.index.insert(
                    log_id.index,
                    Location {
                        segment: first,
                        at,
                        log_id,
                    },
                );
            }
            self.segments.push(Segment {
                first,
                path,
                file: Arc::new(file),
                len: valid_len.max(MAGIC_LEN as u64),
            });
        }
        if let (Some(purged), Some((&first, _))) = (self.purged, self.index.first_key_value()) {
            if first != purged.index + 1 {
                return Err(StoreError::Hole {
                    last: purged.index,
                    found: first,
                });
            }
        }
        Ok(())
    }
}

/// How one sync ended, in a form each of the appends it covers can be given a copy of
/// (`std::io::Error` is not `Clone`).
type SyncResult = Result<(), (std::io::ErrorKind, String)>;

/// The flusher: syncs what appends wrote, then tells openraft. Every append queued while a
/// sync runs shares the next one (group commit). Writes the newest committed id it was given
/// once every sync before it is done, at most every [`COMMITTED_SAVE_EVERY`], and when it
/// stops. Stops when every sender is gone.
fn flush_loop(dir: &Path, jobs: &mpsc::Receiver<ToFlusher>) {
    let mut committed = CommittedFile::default();
    loop {
        let first = match committed.due_in() {
            None => jobs.recv().map_err(|_| ()),
            Some(wait) => match jobs.recv_timeout(wait) {
                Ok(first) => Ok(first),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    committed.save(dir);
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => Err(()),
            },
        };
        let Ok(first) = first else { break };
        let (mut syncs, mut waiting) = (Vec::new(), Vec::new());
        for job in std::iter::once(first).chain(jobs.try_iter()) {
            match job {
                ToFlusher::Sync(job) => syncs.push(job),
                ToFlusher::Committed(id) => committed.unsaved = Some(id),
                ToFlusher::SaveNow(done) => waiting.push(done),
            }
        }
        if !sync_all(syncs) {
            // What the id names may not be on disk: the file keeps the older one (openraft
            // stops on a failed sync in any case).
            committed.unsaved = None;
        }
        if !waiting.is_empty() || committed.due_in() == Some(Duration::ZERO) {
            committed.save(dir);
        }
        for done in waiting {
            let _ = done.send(());
        }
    }
    committed.save(dir);
}

/// Syncs each file `batch` wrote to once, then gives each append its sync's outcome; whether
/// every sync succeeded.
fn sync_all(batch: Vec<FlushJob>) -> bool {
    let mut synced: Vec<(Arc<File>, SyncResult)> = Vec::new();
    for job in &batch {
        let Some(file) = &job.file else { continue };
        if !synced.iter().any(|(done, _)| Arc::ptr_eq(done, file)) {
            let result = file
                .sync_data()
                .map_err(|error| (error.kind(), error.to_string()));
            synced.push((Arc::clone(file), result));
        }
    }
    for job in batch {
        let result = match &job.file {
            None => Ok(()),
            Some(file) => synced
                .iter()
                .find(|(done, _)| Arc::ptr_eq(done, file))
                .map_or(Ok(()), |(_, result)| result.clone())
                .map_err(|(kind, message)| std::io::Error::new(kind, message)),
        };
        job.callback.log_io_completed(result);
    }
    synced.iter().all(|(_, result)| result.is_ok())
}

/// The flusher's view of the `committed` file: the newest id not yet written, and when the
/// file was last written.
#[derive(Default)]
struct CommittedFile {
    unsaved: Option<Option<LogId>>,
    saved_at: Option<std::time::Instant>,
}

impl CommittedFile {
    /// `None` with nothing to write; else how long until it may be written.
    fn due_in(&self) -> Option<Duration> {
        self.unsaved?;
        let since = self
            .saved_at
            .map_or(COMMITTED_SAVE_EVERY, |at| at.elapsed());
        Some(COMMITTED_SAVE_EVERY.saturating_sub(since))
    }

    /// Writes the newest id, if there is one (a failure is logged: the file is an optimization).
    fn save(&mut self, dir: &Path) {
        let Some(id) = self.unsaved.take() else {
            return;
        };
        if let Err(error) = write_json(dir, "committed", &id, false) {
            tracing::warn!(%error, "cannot write the committed log id");
        }
        self.saved_at = Some(std::time::Instant::now());
    }
}

/// An entry's frame payload: see the module documentation.
fn encode_entry(entry: &Entry, out: &mut Vec<u8>) {
    let log_id = &entry.log_id;
    out.extend_from_slice(&log_id.leader_id.term.to_le_bytes());
    out.extend_from_slice(&log_id.leader_id.node_id.to_le_bytes());
    out.extend_from_slice(&log_id.index.to_le_bytes());
    match &entry.payload {
        EntryPayload::Blank => out.push(BLANK),
        EntryPayload::Normal(command) => {
            out.push(NORMAL);
            command.encode(out);
        }
        EntryPayload::Membership(membership) => {
            out.push(MEMBERSHIP);
            serde_json::to_writer(out, membership).expect("a membership serializes to JSON");
        }
    }
}

/// The log id at the start of an entry's payload (recovery reads only that).
fn decode_log_id(payload: &[u8]) -> Result<LogId, String> {
    let Some(head) = payload.get(..LOG_ID_LEN + 1) else {
        return Err("the entry ends inside its log id".into());
    };
    let word = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().expect("8 bytes"));
    if !matches!(head[LOG_ID_LEN], BLANK | NORMAL | MEMBERSHIP) {
        return Err(format!("unknown entry tag {}", head[LOG_ID_LEN]));
    }
    Ok(LogId::new(
        CommittedLeaderId::new(word(0), word(8)),
        word(16),
    ))
}

/// A whole entry from its frame payload.
fn decode_entry(payload: &[u8]) -> Result<Entry, String> {
    let log_id = decode_log_id(payload)?;
    let body = &payload[LOG_ID_LEN + 1..];
    let payload = match payload[LOG_ID_LEN] {
        BLANK if body.is_empty() => EntryPayload::Blank,
        BLANK => return Err("a blank entry with a payload".into()),
        NORMAL => EntryPayload::Normal(Command::decode(body).map_err(|error| error.to_string())?),
        _ => EntryPayload::Membership(
            serde_json::from_slice(body).map_err(|error| format!("membership: {error}"))?,
        ),
    };
    Ok(Entry { log_id, payload })
}

/// A range's bounds, owned (openraft's ranges are generic and only `Clone`); `None` for a range
/// that holds no index (`BTreeMap::range` panics on a start past the end).
fn owned_bounds(range: &impl RangeBounds<u64>) -> Option<(Bound<u64>, Bound<u64>)> {
    let start = match range.start_bound() {
        Bound::Included(&start) => start,
        Bound::Excluded(&start) => start.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&end) => end,
        Bound::Excluded(&end) => end.checked_sub(1)?,
        Bound::Unbounded => u64::MAX,
    };
    (start <= end).then_some((Bound::Included(start), Bound::Included(end)))
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let Some(bounds) = owned_bounds(&range) else {
            return Ok(Vec::new());
        };
        self.entries(bounds)
            .map_err(|error| storage_error(ErrorSubject::Logs, ErrorVerb::Read, &error))
    }

    /// The entries from `start` that one AppendEntries carries (at least one): openraft asks
    /// for up to `max_payload_entries` (300) at a time, and reading them all only for the
    /// network to refuse the payload (`network::entries_that_fit`) cost a catching-up member
    /// a read of up to ~15 MB and a round of refusal per request. Measured: a restarted member
    /// holding 1M keys in its log waited ~0.5 s for a new leader's probes through it.
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, StorageError> {
        let last = self.last_within(start, end, MAX_APPEND_BYTES as u64);
        let Some(last) = last else {
            return Ok(Vec::new());
        };
        let mut entries = self
            .entries(start..=last)
            .map_err(|error| storage_error(ErrorSubject::Logs, ErrorVerb::Read, &error))?;
        entries.truncate(entries_that_fit(&entries));
        Ok(entries)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let state = self.shared.state.lock();
        let last = state.index.last_key_value().map(|(_, at)| at.log_id);
        Ok(LogState {
            last_purged_log_id: state.purged,
            last_log_id: last.or(state.purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let mut state = self.shared.state.lock();
        write_json(&self.shared.dir, "vote", vote, true)
            .map_err(|error| storage_error(ErrorSubject::Vote, ErrorVerb::Write, &error))?;
        state.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.shared.state.lock().vote)
    }

    /// Kept in memory at once; written to the file by the flusher (module documentation).
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.shared.state.lock().committed = committed;
        // A flusher that stopped only means the file keeps an older id.
        let _ = self.shared.flushes.send(ToFlusher::Committed(committed));
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.shared.state.lock().committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let file = self
            .write(entries.into_iter())
            .map_err(|error| storage_error(ErrorSubject::Logs, ErrorVerb::Write, &error))?;
        let job = ToFlusher::Sync(FlushJob { file, callback });
        if let Err(mpsc::SendError(ToFlusher::Sync(job))) = self.shared.flushes.send(job) {
            job.callback
                .log_io_completed(Err(std::io::Error::other("the Raft log's flusher stopped")));
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.truncate_from(log_id.index)
            .map_err(|error| storage_error(ErrorSubject::Logs, ErrorVerb::Delete, &error))
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.purge_upto(log_id)
            .map_err(|error| storage_error(ErrorSubject::Logs, ErrorVerb::Delete, &error))
    }
}

#[cfg(test)]
mod tests {
    use openraft::storage::RaftLogStorageExt;

    use super::*;
    use crate::cluster::testing::TempDir;
    use crate::persist::testing::record;

    /// Entry `index` of `term`, carrying two records.
    fn entry(term: u64, index: u64) -> Entry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Normal(Command::Writes(vec![record(index), record(index + 1)])),
        }
    }

    fn entries(term: u64, indexes: std::ops::Range<u64>) -> Vec<Entry> {
        indexes.map(|index| entry(term, index)).collect()
    }

    async fn state(store: &mut LogStore) -> (Option<u64>, Option<u64>) {
        let state = store.get_log_state().await.unwrap();
        (
            state.last_purged_log_id.map(|id| id.index),
            state.last_log_id.map(|id| id.index),
        )
    }

    #[tokio::test]
    async fn command_entries_read_back_across_segments_and_a_reopen() {
        let dir = TempDir::new("log-reopen");
        let mut store = LogStore::open_with(dir.path(), 512).unwrap();
        for batch in [0..1, 1..15, 15..40] {
            store.blocking_append(entries(1, batch)).await.unwrap();
        }
        let vote = Vote::new(3, 2);
        store.save_vote(&vote).await.unwrap();
        store
            .save_committed(Some(entry(1, 30).log_id))
            .await
            .unwrap();
        store.save_committed_now();
        assert!(store.segment_paths().len() > 3, "small segments rotate");
        assert_eq!(
            store.try_get_log_entries(..).await.unwrap(),
            entries(1, 0..40)
        );
        drop(store);

        let mut store = LogStore::open_with(dir.path(), 512).unwrap();
        assert_eq!(
            store.try_get_log_entries(..).await.unwrap(),
            entries(1, 0..40)
        );
        assert_eq!(
            store.try_get_log_entries(7..=9).await.unwrap(),
            entries(1, 7..10)
        );
        assert_eq!(store.read_vote().await.unwrap(), Some(vote));
        assert_eq!(
            store.read_committed().await.unwrap(),
            Some(entry(1, 30).log_id)
        );
        assert_eq!(state(&mut store).await, (None, Some(39)));
    }

    /// The committed id reaches its file without a shutdown: the flusher writes it once
    /// [`COMMITTED_SAVE_EVERY`] has passed, even when no append follows.
    #[tokio::test]
    async fn the_committed_id_is_written_by_the_flusher_when_it_goes_idle() {
        let dir = TempDir::new("log-committed");
        let mut store = LogStore::open(dir.path()).unwrap();
        store.blocking_append(entries(1, 0..5)).await.unwrap();
        for index in 0..5 {
            let id = Some(entry(1, index).log_id);
            store.save_committed(id).await.unwrap();
            assert_eq!(
                store.read_committed().await.unwrap(),
                id,
                "kept in memory at once"
            );
        }
        let newest = Some(entry(1, 4).log_id);
        let path = dir.path().join("committed");
        let mut on_disk = None;
        for _ in 0..100 {
            on_disk = read_json::<Option<LogId>>(&path).unwrap().flatten();
            if on_disk == newest {
                break;
            }
            std::thread::sleep(COMMITTED_SAVE_EVERY / 4);
        }
        assert_eq!(on_disk, newest, "the file holds the newest committed id");
        drop(store);
        let mut store = LogStore::open(dir.path()).unwrap();
        assert_eq!(store.read_committed().await.unwrap(), newest);
    }

    /// A replication read stops where the network would cut the payload: never empty, never
    /// more than one AppendEntries carries, whatever range openraft asks for.
    #[tokio::test]
    async fn a_replication_read_returns_what_one_append_request_carries() {
        let dir = TempDir::new("log-limited");
        let mut store = LogStore::open(dir.path()).unwrap();
        // Entries of 400 records each (~20 KB): a few fit in one request, not 300.
        let big = |index: u64| Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Command::Writes(
                (0..400).map(|n| record(index * 1000 + n)).collect(),
            )),
        };
        store
            .blocking_append((0..60).map(big).collect::<Vec<_>>())
            .await
            .unwrap();
        let read = store.limited_get_log_entries(5, 60).await.unwrap();
        assert!(
            !read.is_empty() && read.len() < 55,
            "{} entries",
            read.len()
        );
        assert_eq!(read[0].log_id.index, 5);
        assert_eq!(
            entries_that_fit(&read),
            read.len(),
            "the network takes them all"
        );
        let one_more = store
            .try_get_log_entries(5..6 + read.len() as u64)
            .await
            .unwrap();
        assert!(
            entries_that_fit(&one_more) < one_more.len(),
            "one entry more would not fit"
        );
        // Small entries: the whole range, as asked.
        let small = store.limited_get_log_entries(59, 60).await.unwrap();
        assert_eq!(small.len(), 1);
    }

    /// The sizes the snapshot trigger reads: every segment's bytes on disk, down again once a
    /// purge drops whole segments; the entries' after an index.
    #[tokio::test]
    async fn the_logs_bytes_are_its_segments_and_fall_with_a_purge() {
        let dir = TempDir::new("log-bytes");
        let mut store = LogStore::open_with(dir.path(), 512).unwrap();
        store.blocking_append(entries(1, 0..40)).await.unwrap();
        let on_disk = |store: &LogStore| -> u64 {
            (store.segment_paths().iter())
                .map(|path| std::fs::metadata(path).unwrap().len())
                .sum()
        };
        let full = store.bytes();
        assert_eq!(full, on_disk(&store));
        let (all, past_9) = (store.bytes_after(None), store.bytes_after(Some(9)));
        assert!(
            all > past_9 && past_9 > store.bytes_after(Some(38)),
            "{all} {past_9}"
        );
        assert_eq!(store.bytes_after(Some(39)), 0);
        store.purge(entry(1, 30).log_id).await.unwrap();
        assert!(store.bytes() < full, "{} of {full}", store.bytes());
        assert_eq!(store.bytes(), on_disk(&store));
    }

    #[tokio::test]
    async fn a_torn_tail_of_the_log_is_cut_on_reopen() {
        let dir = TempDir::new("log-torn");
        let mut store = LogStore::open(dir.path()).unwrap();
        store.blocking_append(entries(1, 0..5)).await.unwrap();
        let segment = store.segment_paths().pop().unwrap();
        drop(store);
        // A crash in the middle of writing entry 4.
        let whole = std::fs::metadata(&segment).unwrap().len();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&segment)
            .unwrap();
        file.set_len(whole - 3).unwrap();
        drop(file);

        let mut store = LogStore::open(dir.path()).unwrap();
        assert_eq!(state(&mut store).await, (None, Some(3)));
        assert_eq!(
            store.try_get_log_entries(..).await.unwrap(),
            entries(1, 0..4)
        );
        let four = store.shared.state.lock().index[&3];
        assert_eq!(
            std::fs::metadata(&segment).unwrap().len(),
            four.at.offset + four.at.len,
            "the torn frame is cut off the file"
        );
        // Appending goes on after the last whole entry, and reads back clean after a reopen.
        store.blocking_append(entries(2, 4..6)).await.unwrap();
        drop(store);
        let mut store = LogStore::open(dir.path()).unwrap();
        let mut expected = entries(1, 0..4);
        expected.extend(entries(2, 4..6));
        assert_eq!(store.try_get_log_entries(..).await.unwrap(), expected);
    }

    #[tokio::test]
    async fn truncate_and_purge_survive_a_reopen_and_free_whole_segments() {
        let dir = TempDir::new("log-cut");
        let mut store = LogStore::open_with(dir.path(), 512).unwrap();
        store.blocking_append(entries(1, 0..30)).await.unwrap();
        let n_segments = store.segment_paths().len();
        store.truncate(entry(1, 20).log_id).await.unwrap();
        store.purge(entry(1, 10).log_id).await.unwrap();
        assert!(store.segment_paths().len() < n_segments);
        // A new leader's entries replace the truncated ones.
        store.blocking_append(entries(2, 20..22)).await.unwrap();
        drop(store);

        let mut store = LogStore::open_with(dir.path(), 512).unwrap();
        assert_eq!(state(&mut store).await, (Some(10), Some(21)));
        let mut expected = entries(1, 11..20);
        expected.extend(entries(2, 20..22));
        assert_eq!(store.try_get_log_entries(..).await.unwrap(), expected);
        assert_eq!(store.try_get_log_entries(0..=10).await.unwrap(), vec![]);
        // An entry that would leave a hole is refused.
        assert!(store.blocking_append(entries(2, 25..26)).await.is_err());
    }

    #[tokio::test]
    async fn damage_before_the_last_frame_is_refused_with_the_file() {
        let dir = TempDir::new("log-corrupt");
        let mut store = LogStore::open(dir.path()).unwrap();
        store.blocking_append(entries(1, 0..5)).await.unwrap();
        let segment = store.segment_paths().pop().unwrap();
        drop(store);
        let mut bytes = std::fs::read(&segment).unwrap();
        bytes[MAGIC_LEN + 12] ^= 0xff; // inside the first frame
        std::fs::write(&segment, &bytes).unwrap();
        let error = LogStore::open(dir.path()).err().expect("refused");
        assert!(
            error.to_string().contains(&segment.display().to_string()),
            "{error}"
        );
    }
}
