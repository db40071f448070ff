//! Cluster mode (issue 28, docs/cluster-design.md): ttlwheel replicated with openraft.
//!
//! **In progress**: the storage openraft runs on, the lease rules and their glue, the network,
//! the peer listener and the member itself; expiry, TTL changes and event numbering through
//! the log; membership changes; the upgrade from a single node. On only with `--node-id`
//! (`Service::start_member`); a single node never touches it. Webhooks are sent by the leader
//! only, its reports through the log (`notify::replicated`); SSE ids are places in the log
//! (`stream::log_ids`), so a stream resumes on any member.
//!
//! - [`node`]: a running member ([`node::Cluster`]): storage, openraft, bootstrap, proposals,
//!   forwarding, the status `GET /v1/cluster` shows.
//! - [`network`], [`peer_server`], [`auth`], [`forward`]: peer traffic over HTTP on
//!   `--cluster-listen`, signed with `--cluster-secret`; API requests carried to the leader.
//! - [`types`]: the Raft type configuration, [`types::Command`] (the records one entry
//!   carries), [`types::Member`], [`types::SnapshotFile`].
//! - [`log_store`]: the Raft log on disk (segments in `persist::log`'s framing, vote,
//!   committed and purged ids), openraft's `RaftLogStorage`.
//! - [`state_machine`]: applies committed entries through the registry's one door
//!   (`Registry::apply_logged`, `apply_expiries`, `apply_checkpoint`), openraft's
//!   `RaftStateMachine`.
//! - [`lease`]: the lease rules (checkpoints, promotion, fencing, demotion), pure: given times
//!   and what Raft reports, it says what to do.
//! - [`leadership`]: the lease task that feeds [`lease`] and carries out its actions, and the
//!   leader's sweeper that proposes expiries; [`signals`]: what they share with the API.
//! - [`campaign`]: the campaign gate, openraft 0.9 having no pre-vote: elections only while
//!   enough voters answer that they would vote, so a cut-off member never raises its term.
//! - [`membership`]: adding a learner, promoting it once caught up, removing a member, and
//!   `--join`.
//! - [`metrics`]: the member's Prometheus metrics (Raft's state read at each scrape, and
//!   [`metrics::ClusterStats`], what the tasks count).
//! - [`upgrade`]: a single node's data directory made a cluster's first member (its keys
//!   imported through the log by the founder).
//! - [`snapshot`]: the snapshot file (the single-node snapshot's frames behind a header that
//!   says which log id and membership it covers), its builder, reading it back.
//!
//! One error type, [`StoreError`], for the storage boundary; openraft gets it as its
//! `StorageError` (the operation and subject it failed on, and this error's message).

pub mod auth;
pub mod campaign;
pub mod forward;
pub mod group_commit;
pub mod identity;
pub mod leadership;
pub mod lease;
pub mod log_store;
pub mod membership;
pub mod metrics;
pub mod network;
pub mod node;
pub mod peer_server;
pub mod signals;
pub mod snapshot;
pub mod state_machine;
pub mod types;
pub mod upgrade;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use openraft::{AnyError, ErrorSubject, ErrorVerb, StorageIOError};
use serde::{de::DeserializeOwned, Serialize};

use crate::persist::log::{ReadError, MAX_FRAME_LEN};
use types::StorageError;

/// The cluster's storage (log, snapshots) could not be opened, read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot use {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("{path} is corrupted: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error(
        "{path} ends in a torn entry at byte offset {offset}, but it is not the last segment: \
         entries are missing after it"
    )]
    TornInside { path: PathBuf, offset: u64 },
    #[error("entry {found} follows entry {last}: the log's indexes must be consecutive")]
    Hole { last: u64, found: u64 },
    #[error(
        "an entry of {len} bytes exceeds the largest log frame ({})",
        log_store::MAX_ENTRY_FRAME_LEN
    )]
    TooLarge { len: usize },
    #[error(
        "a snapshot record of {len} bytes exceeds the largest snapshot frame ({MAX_FRAME_LEN})"
    )]
    RecordTooLarge { len: usize },
    #[error("{path} is the snapshot {found}, not {expected}")]
    WrongSnapshot {
        path: PathBuf,
        expected: String,
        found: String,
    },
    #[error("a blocking storage task failed: {0}")]
    Task(String),
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_owned(),
        source,
    }
}

/// `error` as openraft's storage error: what failed (`subject`) doing what (`verb`).
fn storage_error(subject: ErrorSubject<u64>, verb: ErrorVerb, error: &StoreError) -> StorageError {
    StorageIOError::new(subject, verb, AnyError::new(error)).into()
}

/// Files named `<prefix><number>.ttlw` in `dir`, by number.
fn numbered_files(dir: &Path, prefix: &str) -> Result<Vec<(u64, PathBuf)>, StoreError> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_error(dir))? {
        let entry = entry.map_err(io_error(dir))?;
        let name = entry.file_name();
        let Some(number) = name
            .to_str()
            .and_then(|name| name.strip_prefix(prefix))
            .and_then(|rest| rest.strip_suffix(".ttlw"))
            .and_then(|number| number.parse::<u64>().ok())
        else {
            continue;
        };
        found.push((number, entry.path()));
    }
    found.sort();
    Ok(found)
}

/// Makes renames and deletions in `dir` durable.
fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(io_error(dir))
}

/// Writes `value` as JSON to `dir/name` whole: a tmp file renamed over it; with `durable`,
/// synced before and after the rename (as `persist::store` writes snapshots).
fn write_json(
    dir: &Path,
    name: &str,
    value: &impl Serialize,
    durable: bool,
) -> Result<(), StoreError> {
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    let bytes = serde_json::to_vec(value).expect("log ids and votes serialize to JSON");
    let file = File::create(&tmp).map_err(io_error(&tmp))?;
    file.write_all_at(&bytes, 0).map_err(io_error(&tmp))?;
    if durable {
        file.sync_all().map_err(io_error(&tmp))?;
    }
    std::fs::rename(&tmp, &path).map_err(io_error(&path))?;
    if durable {
        sync_dir(dir)?;
    }
    Ok(())
}

/// The JSON in `path`, or `None` if there is no such file.
fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, StoreError> {
    match std::fs::read(path) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|error| StoreError::Corrupt {
                    path: path.to_owned(),
                    reason: error.to_string(),
                })
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(io_error(path)(error)),
    }
}

/// What the cluster's storage tests share.
#[cfg(test)]
pub(crate) mod testing {
    use std::path::{Path, PathBuf};

    /// A fresh directory under the temp dir, unique to this process and `name`, removed when
    /// dropped.
    pub struct TempDir(PathBuf);

    impl TempDir {
        pub fn new(name: &str) -> Self {
            let path = std::env::temp_dir()
                .join(format!("ttlwheel-cluster-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(&path).unwrap();
            Self(path)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
