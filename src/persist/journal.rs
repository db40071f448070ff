//! The journal: appending records to the current log segment, with group commit.
//!
//! Callers append under their own lock (a shard's), so one key's records reach the log in the
//! order its operations happened; an append only frames the records into a shared buffer and
//! returns the log sequence number ([`Lsn`]) of the last one. A single flusher thread (file I/O
//! blocks, so it is a thread, not a task) takes everything buffered at once, fills in its
//! frames' checksums (not computed under the appenders' locks), writes it with one `write`, and
//! syncs it to disk as the [`FsyncMode`] says:
//! - `Always`: after every write, before anything written is reported durable. Requests that
//!   must be on disk before they are answered wait for [`Journal::durable`] to reach their LSN;
//!   all the requests buffered while one sync runs share the next one (group commit).
//! - `Interval(d)`: at most every `d`; a crash loses at most that window, a clean stop nothing.
//! - `Never`: the operating system decides.
//!
//! A write that fails (a full disk) is undone (the segment is cut back to its last whole frame,
//! so no half frame is ever followed by good ones) and retried with a growing pause; the buffer
//! keeps everything meanwhile, and [`Journal::is_failing`] tells the API to refuse writes that
//! need durability until a write succeeds again.
//!
//! Invariants: LSNs are consecutive from the journal's start; `durable <= appended`; the file
//! holds whole, sealed frames only, in LSN order; the buffer holds whole frames only.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tokio::sync::watch;

use super::log::{frame_unsealed, seal_frames, LOG_MAGIC};
use super::record::Record;

/// A log sequence number: records are numbered from 1 in the order they were appended; 0 is
/// "nothing".
pub type Lsn = u64;

/// When the journal syncs what it wrote to disk (Redis's `appendfsync`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsyncMode {
    Always,
    Interval(Duration),
    Never,
}

/// The longest pause between retries of a failing write.
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(1);
/// Without `--fsync always`, how long the flusher lets records gather before a write: one
/// write and one wake-up per this period instead of one per append (measured, 1M creations
/// through the batch route: 2.5 s with a wake-up per append, 1.4-1.8 s without, memory-only
/// 1.3-1.8 s). A kill -9 can lose at most this much of what was acknowledged, well within the
/// interval the mode allows.
const GATHER: Duration = Duration::from_millis(5);
/// Without `--fsync always`, a buffer this large is written without waiting for `GATHER`.
const GATHER_BYTES: usize = 1 << 20;
/// The flusher hands its written buffer back for the next appends when it is at most this
/// large, so appends fill a buffer that has room instead of growing a new one by doubling
/// (each time a copy of what is there, and fresh pages): the growth was ~7 % of a mass
/// expiry's sweep with persistence on (`perf`). A larger one (a burst) goes back to the
/// allocator.
const SPARE_BYTES: usize = 2 * GATHER_BYTES;

/// What the callers and the flusher share.
struct Shared {
    /// Framed records not yet written, and the LSN of the last one appended.
    pending: Mutex<Pending>,
    /// Wakes the flusher when records arrive or the journal closes.
    arrived: Condvar,
    /// The highest LSN written and synced as the mode requires.
    durable: watch::Sender<Lsn>,
    failing: AtomicBool,
    /// `--fsync always`: every append wakes the flusher (a request waits for the sync).
    eager: bool,
    /// Records written and syncs made (for the group-commit size).
    n_written: AtomicU64,
    n_syncs: AtomicU64,
}

struct Pending {
    bytes: Vec<u8>,
    appended: Lsn,
    closing: bool,
    /// A request to start a new segment after the first `split` bytes of `bytes`.
    rotation: Option<Rotation>,
}

/// A new segment to start (for a snapshot): everything appended before the request goes to
/// the old segment, everything after to the new one.
struct Rotation {
    split: usize,
    /// The LSN of the last record that goes to the old segment.
    last_old: Lsn,
    path: PathBuf,
    done: std::sync::mpsc::SyncSender<std::io::Result<()>>,
}

/// The current segment, as the flusher holds it.
struct Segment {
    file: File,
    path: PathBuf,
    /// Bytes of whole frames in the file: where the next write goes, and where a failed one is
    /// cut back to.
    len: u64,
}

/// See the module documentation.
pub struct Journal {
    shared: Arc<Shared>,
    flusher: Mutex<Option<std::thread::JoinHandle<std::io::Result<()>>>>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("durable", &*self.shared.durable.borrow())
            .field("failing", &self.is_failing())
            .finish_non_exhaustive()
    }
}

impl Journal {
    /// Appends to the segment at `path` (created with its magic if it does not exist; an
    /// existing one must end with a whole frame at `valid_len`, as recovery found it). Records
    /// get LSNs from `next_lsn` on.
    pub fn open(
        path: &Path,
        valid_len: Option<u64>,
        next_lsn: Lsn,
        mode: FsyncMode,
    ) -> std::io::Result<Self> {
        let segment = Segment::open(path, valid_len)?;
        let last = next_lsn.saturating_sub(1);
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending {
                bytes: Vec::new(),
                appended: last,
                closing: false,
                rotation: None,
            }),
            arrived: Condvar::new(),
            durable: watch::Sender::new(last),
            failing: AtomicBool::new(false),
            eager: mode == FsyncMode::Always,
            n_written: AtomicU64::new(0),
            n_syncs: AtomicU64::new(0),
        });
        let flusher = std::thread::Builder::new()
            .name("ttlwheel-journal".into())
            .spawn({
                let shared = Arc::clone(&shared);
                move || flush_loop(&shared, segment, mode)
            })?;
        Ok(Self {
            shared,
            flusher: Mutex::new(Some(flusher)),
        })
    }

    /// Frames `records` into the buffer; returns the LSN of the last one (the current last LSN
    /// when `records` is empty). Never blocks on I/O. The frames' checksums are left to the
    /// flusher (see `log::frame_unsealed`).
    pub fn append(&self, records: &[Record]) -> Lsn {
        let mut pending = self.shared.pending.lock();
        // Framing under the lock costs about what copying a pre-framed buffer would, without
        // the allocation.
        let before = pending.bytes.len();
        for record in records {
            frame_unsealed(record, &mut pending.bytes);
        }
        pending.appended += records.len() as Lsn;
        let lsn = pending.appended;
        let after = pending.bytes.len();
        drop(pending);
        // Only an append into an empty buffer wakes the flusher (it takes everything buffered
        // when it runs), or one that makes the buffer large; never one per record.
        if after > before && (before == 0 || (before < GATHER_BYTES && after >= GATHER_BYTES)) {
            self.shared.arrived.notify_one();
        }
        lsn
    }

    /// The LSN of the last record appended.
    pub fn appended(&self) -> Lsn {
        self.shared.pending.lock().appended
    }

    /// Resolves once every record up to `lsn` is durable (as the mode defines it).
    pub async fn durable(&self, lsn: Lsn) {
        let mut durable = self.shared.durable.subscribe();
        // An error means the flusher is gone (the journal closed); nothing more will come.
        let _ = durable.wait_for(|&done| done >= lsn).await;
    }

    /// The highest durable LSN.
    pub fn durable_lsn(&self) -> Lsn {
        *self.shared.durable.borrow()
    }

    /// True while writes fail (a full disk): writes that need durability should be refused.
    pub fn is_failing(&self) -> bool {
        self.shared.failing.load(Ordering::Relaxed)
    }

    /// Records written and syncs made so far: their ratio is the group-commit size.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.shared.n_written.load(Ordering::Relaxed),
            self.shared.n_syncs.load(Ordering::Relaxed),
        )
    }

    /// Starts a new segment, named by `path_of` from the LSN of its first record: everything
    /// appended before this call is written and synced to the current segment first. Returns
    /// that first LSN; a snapshot taken after it, replayed with the segments from it on, gives
    /// the state.
    pub fn rotate(&self, path_of: impl FnOnce(Lsn) -> PathBuf) -> std::io::Result<Lsn> {
        let (done, finished) = std::sync::mpsc::sync_channel(1);
        let first = {
            let mut pending = self.shared.pending.lock();
            if pending.rotation.is_some() {
                return Err(std::io::Error::other(
                    "a segment rotation is already under way",
                ));
            }
            let first = pending.appended + 1;
            pending.rotation = Some(Rotation {
                split: pending.bytes.len(),
                last_old: pending.appended,
                path: path_of(first),
                done,
            });
            first
        };
        self.shared.arrived.notify_one();
        finished
            .recv()
            .map_err(|_| std::io::Error::other("the journal stopped during a rotation"))??;
        Ok(first)
    }

    /// Writes and syncs everything appended, then stops the flusher. Returns the write error
    /// if what was appended could not all be written.
    pub fn close(&self) -> std::io::Result<()> {
        self.shared.pending.lock().closing = true;
        self.shared.arrived.notify_one();
        match self.flusher.lock().take() {
            Some(flusher) => flusher
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("the journal's flusher panicked"))),
            None => Ok(()),
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

impl Segment {
    fn open(path: &Path, valid_len: Option<u64>) -> std::io::Result<Self> {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)?;
        let len = match valid_len {
            Some(len) if len >= LOG_MAGIC.len() as u64 => len,
            _ => {
                file.set_len(0)?;
                file.write_all(LOG_MAGIC)?;
                file.sync_data()?;
                LOG_MAGIC.len() as u64
            }
        };
        // Drop a torn tail recovery found, so appends follow the last whole frame.
        file.set_len(len)?;
        let mut segment = Self {
            file,
            path: path.to_owned(),
            len,
        };
        segment.seek_to_end()?;
        Ok(segment)
    }

    fn seek_to_end(&mut self) -> std::io::Result<()> {
        use std::io::Seek;
        self.file.seek(std::io::SeekFrom::Start(self.len))?;
        Ok(())
    }

    /// Writes `bytes` whole, or cuts the file back to where it was and returns the error.
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self.file.write_all(bytes) {
            Ok(()) => {
                self.len += bytes.len() as u64;
                Ok(())
            }
            Err(error) => {
                // Whatever part landed is cut off; if even that fails, the next write's cut
                // will try again (the frames after would otherwise follow half a frame).
                let _ = self.file.set_len(self.len);
                let _ = self.seek_to_end();
                Err(error)
            }
        }
    }
}

/// Carries out `rotation` with `bytes` (everything taken from the buffer): the part appended
/// before the request is written and synced to the old segment, then the new segment starts.
/// Rotations are rare (one per snapshot), so this stays apart from the write path. Returns the
/// bytes still to write: the part appended after the request, or everything if the old part
/// could not be written (then the rotation failed, and the journal stays on the old segment).
fn rotate(shared: &Shared, segment: &mut Segment, rotation: Rotation, bytes: Vec<u8>) -> Vec<u8> {
    let (old, new) = bytes.split_at(rotation.split);
    if let Err(error) = segment.write(old) {
        let _ = rotation.done.send(Err(error));
        return bytes;
    }
    let result = segment
        .file
        .sync_data()
        .and_then(|()| Segment::open(&rotation.path, None));
    let result = result.map(|next| {
        *segment = next;
        shared.n_syncs.fetch_add(1, Ordering::Relaxed);
        // Everything before the new segment's first record is written and synced.
        shared.durable.send_if_modified(|durable| {
            std::mem::replace(durable, (*durable).max(rotation.last_old)) < rotation.last_old
        });
    });
    let _ = rotation.done.send(result);
    new.to_vec()
}

/// The flusher: waits for records, writes them, syncs as `mode` says, publishes durability.
fn flush_loop(shared: &Shared, mut segment: Segment, mode: FsyncMode) -> std::io::Result<()> {
    let mut written_upto = *shared.durable.borrow();
    let mut last_sync = Instant::now();
    let mut unsynced = false;
    let mut retry_pause = Duration::from_millis(10);
    let mut spare = Vec::new();
    loop {
        let (mut bytes, upto, closing, rotation) = {
            let mut pending = shared.pending.lock();
            while pending.bytes.is_empty() && !pending.closing && pending.rotation.is_none() {
                let wait = match mode {
                    FsyncMode::Interval(interval) if unsynced => {
                        interval.saturating_sub(last_sync.elapsed())
                    }
                    _ => Duration::from_secs(3600),
                };
                if shared.arrived.wait_for(&mut pending, wait).timed_out() {
                    break;
                }
            }
            // Unless a request waits for the sync, let more records gather before writing.
            if !shared.eager
                && !pending.bytes.is_empty()
                && pending.bytes.len() < GATHER_BYTES
                && !pending.closing
                && pending.rotation.is_none()
            {
                let _ = shared.arrived.wait_for(&mut pending, GATHER);
            }
            (
                std::mem::replace(&mut pending.bytes, std::mem::take(&mut spare)),
                pending.appended,
                pending.closing,
                pending.rotation.take(),
            )
        };
        // Before anything is written: bytes put back after a failed write are sealed again
        // with the newer ones, which changes nothing in them.
        seal_frames(&mut bytes);
        if let Some(rotation) = rotation {
            let unwritten = rotate(shared, &mut segment, rotation, bytes);
            let mut pending = shared.pending.lock();
            let newer = std::mem::replace(&mut pending.bytes, unwritten);
            pending.bytes.extend_from_slice(&newer);
            continue;
        }
        if !bytes.is_empty() {
            if let Err(error) = segment.write(&bytes) {
                if !shared.failing.swap(true, Ordering::Relaxed) {
                    tracing::error!(path = %segment.path.display(), %error,
                        "cannot write the persistence log: writes that need durability are refused until it can");
                }
                // Put the bytes back in front of anything appended since, and retry later.
                let mut pending = shared.pending.lock();
                let newer = std::mem::replace(&mut pending.bytes, bytes);
                pending.bytes.extend_from_slice(&newer);
                if pending.closing {
                    return Err(error);
                }
                drop(pending);
                std::thread::sleep(retry_pause);
                retry_pause = (retry_pause * 2).min(MAX_RETRY_PAUSE);
                continue;
            }
            retry_pause = Duration::from_millis(10);
            if shared.failing.swap(false, Ordering::Relaxed) {
                tracing::warn!(path = %segment.path.display(), "the persistence log is writable again");
            }
            shared
                .n_written
                .fetch_add(upto - written_upto, Ordering::Relaxed);
            written_upto = upto;
            unsynced = true;
        }
        if bytes.capacity() <= SPARE_BYTES {
            bytes.clear();
            spare = bytes;
        }
        let sync_now = match mode {
            FsyncMode::Always => unsynced,
            FsyncMode::Interval(interval) => {
                unsynced && (closing || last_sync.elapsed() >= interval)
            }
            FsyncMode::Never => unsynced && closing,
        };
        if sync_now {
            if let Err(error) = segment.file.sync_data() {
                // The data may not be on disk: say so, and keep retrying like a failed write.
                shared.failing.store(true, Ordering::Relaxed);
                tracing::error!(path = %segment.path.display(), %error, "cannot sync the persistence log");
                if closing {
                    return Err(error);
                }
                std::thread::sleep(retry_pause);
                retry_pause = (retry_pause * 2).min(MAX_RETRY_PAUSE);
                continue;
            }
            shared.n_syncs.fetch_add(1, Ordering::Relaxed);
            last_sync = Instant::now();
            unsynced = false;
        }
        // `Always` reports only what is synced; the other modes what is written (their
        // acknowledgements never wait for the disk).
        if mode != FsyncMode::Always || !unsynced {
            shared.durable.send_if_modified(|durable| {
                let advanced = upto > *durable;
                *durable = (*durable).max(upto);
                advanced
            });
        }
        if closing && shared.pending.lock().bytes.is_empty() {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persist::log::{read_file, Tail};
    use crate::persist::testing::{record, temp_path};

    fn temp_dir(name: &str) -> PathBuf {
        let dir = temp_path(&format!("journal-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[tokio::test]
    async fn appended_records_are_written_in_order_and_reported_durable() {
        for mode in [
            FsyncMode::Always,
            FsyncMode::Interval(Duration::from_millis(20)),
            FsyncMode::Never,
        ] {
            let dir = temp_dir("order");
            let path = dir.join("log");
            let journal = Journal::open(&path, None, 1, mode).unwrap();
            let mut last = 0;
            for n in 0..100 {
                last = journal.append(&[record(n)]);
                assert_eq!(last, n + 1);
            }
            journal.durable(last).await;
            assert!(journal.durable_lsn() >= last);
            journal.close().unwrap();
            let contents = read_file(&path, LOG_MAGIC).unwrap();
            assert_eq!(
                contents.records,
                (0..100).map(record).collect::<Vec<_>>(),
                "{mode:?}"
            );
            assert_eq!(contents.tail, Tail::Clean);
        }
    }

    #[tokio::test]
    async fn concurrent_appends_share_syncs_in_always_mode() {
        let dir = temp_dir("group");
        let journal =
            Arc::new(Journal::open(&dir.join("log"), None, 1, FsyncMode::Always).unwrap());
        let tasks: Vec<_> = (0..8)
            .map(|task| {
                let journal = Arc::clone(&journal);
                tokio::spawn(async move {
                    for n in 0..50 {
                        let lsn = journal.append(&[record(task * 1000 + n)]);
                        journal.durable(lsn).await;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let (written, syncs) = journal.counts();
        assert_eq!(written, 400);
        assert!(
            syncs >= 1 && syncs <= written,
            "{syncs} syncs for {written} records"
        );
        journal.close().unwrap();
    }

    #[tokio::test]
    async fn reopening_continues_after_the_last_whole_frame() {
        let dir = temp_dir("reopen");
        let path = dir.join("log");
        let journal = Journal::open(&path, None, 1, FsyncMode::Always).unwrap();
        journal.append(&[record(1), record(2)]);
        journal.close().unwrap();
        // A crash left half a frame behind.
        let mut bytes = std::fs::read(&path).unwrap();
        let whole = bytes.len() as u64;
        bytes.extend_from_slice(&[9, 0, 0, 0, 1]);
        std::fs::write(&path, &bytes).unwrap();
        let found = read_file(&path, LOG_MAGIC).unwrap();
        assert_eq!(found.valid_len, whole);
        let journal = Journal::open(&path, Some(found.valid_len), 3, FsyncMode::Always).unwrap();
        assert_eq!(journal.append(&[record(3)]), 3);
        journal.close().unwrap();
        let contents = read_file(&path, LOG_MAGIC).unwrap();
        assert_eq!(contents.records, vec![record(1), record(2), record(3)]);
        assert_eq!(contents.tail, Tail::Clean);
    }
}
