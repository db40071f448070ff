//! The data directory: who owns it, which files hold what, recovery, and snapshots.
//!
//! Layout (`--data-dir`):
//! - `LOCK`: held (an advisory `flock`) by the one process that owns the directory, which also
//!   writes its pid there for the message a second process prints.
//! - `log-<first LSN>.ttlw`: log segments, each the records from its first LSN on, in order.
//! - `snapshot-<LSN>.ttlw`: the whole state, taken after the log was rotated at `LSN`: replaying
//!   it, then every segment from `LSN` on, gives the state. Written as `.tmp`, synced, renamed
//!   and the directory synced, so a snapshot file either is whole or does not exist.
//!
//! Recovery reads the newest snapshot and the segments from its LSN on. A torn tail is allowed
//! (and cut off) only at the end of the last segment, where a crash can leave one; anywhere else
//! it is corruption, and so is a gap in the LSNs.
//!
//! Backup: copy the newest `snapshot-*.ttlw` (a whole file, never written in place), and the
//! segments after it for what came since.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::journal::{FsyncMode, Journal, Lsn};
use super::log::{frame, read_file_in_batches, ReadError, Tail, LOG_MAGIC, SNAPSHOT_MAGIC};

/// Records decoded per batch while the previous batch is applied.
const BATCH: usize = 4096;
use super::record::Record;

/// The directory could not be opened or recovered.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot use the data directory {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the data directory {path} is in use by another ttlwheel process{owner}; stop it, or \
         give this one another --data-dir"
    )]
    Locked { path: PathBuf, owner: String },
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(
        "{path} starts at record {found} but the records before end at {expected}: records are \
         missing"
    )]
    Gap {
        path: PathBuf,
        expected: Lsn,
        found: Lsn,
    },
    #[error(
        "{path} ends in a torn record at byte offset {offset}, but it is not the last segment: \
         cut it there only if you accept losing what follows"
    )]
    TornInside { path: PathBuf, offset: u64 },
}

/// What recovery found.
#[derive(Debug, Default)]
pub struct Recovery {
    /// The LSN of the snapshot recovery started from, if any.
    pub snapshot: Option<Lsn>,
    /// Records applied: the snapshot's and the segments'.
    pub n_records: u64,
    /// The LSN the next record gets.
    pub next_lsn: Lsn,
    /// The torn tail cut off the last segment: `(path, offset, bytes dropped)`.
    pub torn: Option<(PathBuf, u64, u64)>,
    /// The last segment and its length up to the last whole frame, to append to.
    last_segment: Option<(PathBuf, u64)>,
}

/// An open, locked data directory.
#[derive(Debug)]
pub struct DataDir {
    path: PathBuf,
    /// Held for as long as the process uses the directory.
    _lock: File,
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_owned(),
        source,
    }
}

impl DataDir {
    /// Creates `path` if needed and takes its lock; a second process gets
    /// [`StoreError::Locked`].
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(path).map_err(io_error(path))?;
        let lock_path = path.join("LOCK");
        let mut lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&lock_path)
            .map_err(io_error(&lock_path))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let owner = std::fs::read_to_string(&lock_path)
                    .ok()
                    .map(|pid| pid.trim().to_owned())
                    .filter(|pid| !pid.is_empty())
                    .map_or_else(String::new, |pid| format!(" (pid {pid})"));
                return Err(StoreError::Locked {
                    path: path.to_owned(),
                    owner,
                });
            }
            Err(std::fs::TryLockError::Error(source)) => {
                return Err(StoreError::Io {
                    path: lock_path,
                    source,
                })
            }
        }
        lock.set_len(0).map_err(io_error(&lock_path))?;
        writeln!(lock, "{}", std::process::id()).map_err(io_error(&lock_path))?;
        Ok(Self {
            path: path.to_owned(),
            _lock: lock,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the newest snapshot and the segments after it, handing every record to `apply` in
    /// order.
    pub fn recover(&self, mut apply: impl FnMut(Record)) -> Result<Recovery, StoreError> {
        let snapshots = self.numbered("snapshot-")?;
        let segments = self.numbered("log-")?;
        let mut recovery = Recovery::default();
        let mut next_lsn: Lsn = 1;
        let mut apply_all = |records: Vec<Record>| records.into_iter().for_each(&mut apply);
        if let Some(&(snapshot_lsn, ref path)) = snapshots.last() {
            let scanned = read_file_in_batches(path, SNAPSHOT_MAGIC, BATCH, &mut apply_all)?;
            if scanned.tail != Tail::Clean {
                // Snapshots are renamed into place only once whole and synced.
                return Err(StoreError::TornInside {
                    path: path.clone(),
                    offset: scanned.valid_len,
                });
            }
            recovery.n_records += scanned.n_records;
            recovery.snapshot = Some(snapshot_lsn);
            next_lsn = snapshot_lsn;
        }
        let replayed: Vec<&(Lsn, PathBuf)> = segments
            .iter()
            .filter(|(first, _)| recovery.snapshot.is_none_or(|snapshot| *first >= snapshot))
            .collect();
        for (index, &&(first, ref path)) in replayed.iter().enumerate() {
            if first != next_lsn {
                return Err(StoreError::Gap {
                    path: path.clone(),
                    expected: next_lsn,
                    found: first,
                });
            }
            let contents = read_file_in_batches(path, LOG_MAGIC, BATCH, &mut apply_all)?;
            let last = index + 1 == replayed.len();
            if let Tail::Torn { offset, dropped } = contents.tail {
                if !last {
                    return Err(StoreError::TornInside {
                        path: path.clone(),
                        offset,
                    });
                }
                recovery.torn = Some((path.clone(), offset, dropped));
            }
            next_lsn += contents.n_records;
            recovery.n_records += contents.n_records;
            if last {
                recovery.last_segment = Some((path.clone(), contents.valid_len));
            }
        }
        recovery.next_lsn = next_lsn;
        Ok(recovery)
    }

    /// Opens the journal where recovery left off: appending to the last segment (its torn
    /// tail cut off), or starting the first.
    pub fn open_journal(
        &self,
        recovery: &Recovery,
        mode: FsyncMode,
    ) -> Result<Journal, StoreError> {
        let (path, valid_len) = match &recovery.last_segment {
            Some((path, valid_len)) => (path.clone(), Some(*valid_len)),
            None => (self.segment_path(recovery.next_lsn), None),
        };
        Journal::open(&path, valid_len, recovery.next_lsn, mode).map_err(io_error(&path))
    }

    /// The path of the segment whose first record is `first`.
    pub fn segment_path(&self, first: Lsn) -> PathBuf {
        self.path.join(format!("log-{first:020}.ttlw"))
    }

    /// Writes a snapshot of the state at `lsn` (the first LSN of the segment the journal was
    /// just rotated to) from `records`, then deletes the segments and snapshots it replaces.
    /// Returns the snapshot's size in bytes.
    pub fn write_snapshot(
        &self,
        lsn: Lsn,
        records: impl Iterator<Item = Record>,
    ) -> Result<u64, StoreError> {
        let final_path = self.path.join(format!("snapshot-{lsn:020}.ttlw"));
        let tmp_path = final_path.with_extension("tmp");
        let mut file = std::io::BufWriter::with_capacity(
            1 << 20,
            File::create(&tmp_path).map_err(io_error(&tmp_path))?,
        );
        file.write_all(SNAPSHOT_MAGIC)
            .map_err(io_error(&tmp_path))?;
        let mut buffer = Vec::new();
        let mut size = SNAPSHOT_MAGIC.len() as u64;
        for record in records {
            buffer.clear();
            frame(&record, &mut buffer);
            size += buffer.len() as u64;
            file.write_all(&buffer).map_err(io_error(&tmp_path))?;
        }
        let file = file
            .into_inner()
            .map_err(|error| io_error(&tmp_path)(error.into_error()))?;
        file.sync_all().map_err(io_error(&tmp_path))?;
        std::fs::rename(&tmp_path, &final_path).map_err(io_error(&final_path))?;
        File::open(&self.path)
            .and_then(|dir| dir.sync_all())
            .map_err(io_error(&self.path))?;
        // The snapshot is in place: what it replaces can go.
        for (first, path) in self.numbered("log-")? {
            if first < lsn {
                std::fs::remove_file(&path).map_err(io_error(&path))?;
            }
        }
        for (taken, path) in self.numbered("snapshot-")? {
            if taken < lsn {
                std::fs::remove_file(&path).map_err(io_error(&path))?;
            }
        }
        Ok(size)
    }

    /// Files named `<prefix><number>.ttlw`, by number.
    fn numbered(&self, prefix: &str) -> Result<Vec<(Lsn, PathBuf)>, StoreError> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&self.path).map_err(io_error(&self.path))? {
            let entry = entry.map_err(io_error(&self.path))?;
            let name = entry.file_name();
            let Some(number) = name
                .to_str()
                .and_then(|name| name.strip_prefix(prefix))
                .and_then(|rest| rest.strip_suffix(".ttlw"))
                .and_then(|number| number.parse::<Lsn>().ok())
            else {
                continue;
            };
            found.push((number, entry.path()));
        }
        found.sort();
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persist::testing::{record, temp_path};

    fn temp_dir(name: &str) -> PathBuf {
        temp_path(&format!("store-{name}"))
    }

    /// A fresh data directory at `name` whose first segment holds `records`, and that segment.
    fn written(name: &str, records: &[Record]) -> (DataDir, PathBuf) {
        let dir = DataDir::open(&temp_dir(name)).unwrap();
        let recovery = dir.recover(|_| {}).unwrap();
        let journal = dir.open_journal(&recovery, FsyncMode::Always).unwrap();
        journal.append(records);
        journal.close().unwrap();
        let segment = dir.segment_path(1);
        (dir, segment)
    }

    fn recovered(dir: &DataDir) -> (Vec<Record>, Recovery) {
        let mut records = Vec::new();
        let recovery = dir.recover(|record| records.push(record)).unwrap();
        (records, recovery)
    }

    #[test]
    fn a_second_process_cannot_open_a_directory_in_use() {
        let path = temp_dir("lock");
        let first = DataDir::open(&path).unwrap();
        // A second open file description conflicts with the first's flock, as another process's
        // would.
        let second = DataDir::open(&path).unwrap_err();
        assert!(matches!(second, StoreError::Locked { .. }), "{second}");
        assert!(second
            .to_string()
            .contains(&format!("pid {}", std::process::id())));
        drop(first);
        DataDir::open(&path).expect("free again once the owner is gone");
    }

    #[tokio::test]
    async fn records_survive_a_reopen_and_a_snapshot_replaces_the_segments_before_it() {
        let path = temp_dir("snapshot");
        let dir = DataDir::open(&path).unwrap();
        let (records, recovery) = recovered(&dir);
        assert!(records.is_empty());
        let journal = dir.open_journal(&recovery, FsyncMode::Always).unwrap();
        journal.append(&[record(1), record(2)]);
        let lsn = journal.rotate(|first| dir.segment_path(first)).unwrap();
        assert_eq!(lsn, 3);
        journal.append(&[record(3)]);
        journal.close().unwrap();
        drop(journal);
        // The state at the rotation (records 1 and 2) as a snapshot of one record each.
        dir.write_snapshot(lsn, [record(1), record(2)].into_iter())
            .unwrap();
        assert!(
            !dir.segment_path(1).exists(),
            "the segment before the snapshot is gone"
        );
        drop(dir);

        let dir = DataDir::open(&path).unwrap();
        let (records, recovery) = recovered(&dir);
        assert_eq!(records, vec![record(1), record(2), record(3)]);
        assert_eq!(recovery.snapshot, Some(3));
        assert_eq!(recovery.next_lsn, 4);
        let journal = dir.open_journal(&recovery, FsyncMode::Always).unwrap();
        assert_eq!(journal.append(&[record(4)]), 4);
        journal.close().unwrap();
        drop(journal);
        let (records, _) = recovered(&dir);
        assert_eq!(records.len(), 4);
    }

    #[test]
    fn a_torn_tail_is_cut_off_the_last_segment_only() {
        let (dir, segment) = written("torn", &[record(1), record(2)]);
        let mut bytes = std::fs::read(&segment).unwrap();
        let whole = bytes.len();
        bytes.truncate(whole - 3);
        std::fs::write(&segment, &bytes).unwrap();
        let (records, recovery) = recovered(&dir);
        assert_eq!(records, vec![record(1)]);
        let (torn_path, _, dropped) = recovery.torn.clone().expect("the torn tail is reported");
        assert_eq!(torn_path, segment);
        assert!(dropped > 0);
        // A later segment after a torn one means the torn one is not the end: refused.
        std::fs::write(dir.segment_path(2), LOG_MAGIC).unwrap();
        assert!(matches!(
            dir.recover(|_| {}),
            Err(StoreError::TornInside { .. })
        ));
    }

    #[test]
    fn corruption_in_the_middle_is_refused_with_the_file_and_offset() {
        let (dir, segment) = written("corrupt", &[record(1), record(2), record(3)]);
        let mut bytes = std::fs::read(&segment).unwrap();
        bytes[LOG_MAGIC.len() + 10] ^= 0xff; // inside the first frame
        std::fs::write(&segment, &bytes).unwrap();
        let error = dir.recover(|_| {}).unwrap_err().to_string();
        assert!(error.contains(&segment.display().to_string()), "{error}");
        assert!(error.contains("byte offset 8"), "{error}");
    }
}
