//! The upgrade path (issue 28, section 1): a single node's data directory becomes a cluster's
//! first member. Start the single node's command again with the cluster flags (`--node-id`,
//! `--cluster-listen`, `--initial-cluster`, the same `--data-dir`); the founding member (the
//! smallest id) finds the single node's snapshot and log beside where the Raft log will live,
//! reads its keys as a restart would, and, once it leads, writes them into the Raft log as
//! `Command::Import` entries (applied on every member as recovery applies records: the keys
//! with their TTLs counted from the apply, no events). Then it moves the single node's files
//! into `single-node-imported/`, so a restart does not import them again.
//!
//! Invariants:
//! - **All or again**: an `IMPORTING` marker in the Raft directory is written before the
//!   cluster is founded and removed only after every key is committed and the files are moved;
//!   a member that stops in between imports again when it next leads (each record is a key's
//!   whole state, so importing twice gives the same keys).
//! - **Only the founder imports**: another member started on a single node's directory refuses
//!   to start (its keys would be a second, diverging copy); so does a member whose directory
//!   holds both a cluster without a pending import and a single node's files.
//! - Webhook outbox records of the single node are not imported (its undelivered events are
//!   dropped, and said so in the log).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::leadership::MAX_ITEMS;
use super::node::Cluster;
use super::types::{entry_sized, record_len, Command};
use crate::persist::record::Record;
use crate::persist::store::DataDir;
use crate::registry::{Registry, RegistryConfig};

/// The marker of an import not yet finished, in the Raft directory.
const MARKER: &str = "IMPORTING";
/// Where the single node's files go once imported, in the data directory.
const IMPORTED: &str = "single-node-imported";
/// How often the import looks whether this member leads yet.
const WAIT_TO_LEAD: Duration = Duration::from_millis(100);

/// A single node's keys, read and waiting to be written into the log.
pub struct Import {
    data_dir: PathBuf,
    raft_dir: PathBuf,
    records: Vec<Record>,
}

impl std::fmt::Debug for Import {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Import")
            .field("data_dir", &self.data_dir)
            .field("keys", &self.records.len())
            .finish_non_exhaustive()
    }
}

/// Whether `dir` holds a single node's state: a snapshot or a log segment of its own.
fn holds_single_node(dir: &Path) -> std::io::Result<bool> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(false);
    };
    for entry in entries {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if (name.starts_with("snapshot-") || name.starts_with("log-")) && name.ends_with(".ttlw") {
            return Ok(true);
        }
    }
    Ok(false)
}

/// What a member started on `data_dir` (whose lock it holds) must import, if anything:
/// `Ok(None)` when the directory holds no single node's state (or only one already imported);
/// an error when this member may not import it (`founder` false, or a cluster is already
/// there without a pending import).
pub fn prepare(
    data_dir: &DataDir,
    raft_dir: &Path,
    founder: bool,
    config: RegistryConfig,
) -> Result<Option<Import>, String> {
    let lock = data_dir;
    let data_dir = data_dir.path();
    let single = holds_single_node(data_dir).map_err(|error| error.to_string())?;
    if !single {
        return Ok(None);
    }
    let pending = raft_dir.join(MARKER).exists();
    let cluster_exists = raft_dir.exists() && !pending;
    if cluster_exists {
        return Err(format!(
            "{} holds a single node's keys beside a cluster's log ({}): move one of them away",
            data_dir.display(),
            raft_dir.display()
        ));
    }
    if !founder {
        return Err(format!(
            "{} holds a single node's keys: only the founding member (the smallest id of \
             --initial-cluster) imports them; start this member with an empty --data-dir",
            data_dir.display()
        ));
    }
    let registry = Registry::new(
        RegistryConfig {
            replicated: false,
            ..config
        },
        Instant::now(),
    );
    let now = Instant::now();
    let mut webhook_records = 0_u64;
    let recovery = lock
        .recover(|record| {
            if record.is_webhook() {
                webhook_records += 1;
            } else {
                registry.restore(record, now);
            }
        })
        .map_err(|error| error.to_string())?;
    let records: Vec<Record> = registry.state_records().collect();
    tracing::warn!(
        keys = records.len(),
        records_read = recovery.n_records,
        webhook_records_dropped = webhook_records,
        data_dir = %data_dir.display(),
        "this data directory holds a single node's keys: founding a cluster with them"
    );
    std::fs::create_dir_all(raft_dir).map_err(|error| error.to_string())?;
    std::fs::write(raft_dir.join(MARKER), b"")
        .and_then(|()| std::fs::File::open(raft_dir).and_then(|dir| dir.sync_all()))
        .map_err(|error| error.to_string())?;
    Ok(Some(Import {
        data_dir: data_dir.to_owned(),
        raft_dir: raft_dir.to_owned(),
        records,
    }))
}

/// Writes the keys into the log once this member leads and may serve, then moves the single
/// node's files aside and removes the marker. Retries a chunk that did not commit.
pub async fn run(import: Import, cluster: Arc<Cluster>) {
    let started = std::time::Instant::now();
    let mut done = 0;
    while done < import.records.len() {
        if !(cluster.is_leader() && cluster.may_serve()) {
            tokio::time::sleep(WAIT_TO_LEAD).await;
            continue;
        }
        let fit = entry_sized(&import.records[done..], MAX_ITEMS, record_len).next();
        let end = done + fit.map_or(0, <[_]>::len);
        let chunk = import.records[done..end].to_vec();
        match cluster.propose(Command::Import(chunk)).await {
            Ok(_) => done = end,
            Err(error) => {
                tracing::warn!(%error, done, "an import entry was not committed; retrying");
                tokio::time::sleep(WAIT_TO_LEAD).await;
            }
        }
    }
    match tokio::task::spawn_blocking(move || finish(&import)).await {
        Ok(Ok(keys)) => tracing::info!(
            keys,
            took_ms = started.elapsed().as_millis() as u64,
            "the single node's keys are in the cluster's log; its files moved to {IMPORTED}/"
        ),
        Ok(Err(error)) => {
            tracing::error!(%error, "the import committed, but its files could not be moved aside; it will run again at the next start")
        }
        Err(error) => tracing::error!(%error, "the import's last step failed"),
    }
}

/// Moves the single node's snapshots and segments into `single-node-imported/`, then removes
/// the marker: in that order, so a crash between leaves the import to run again.
fn finish(import: &Import) -> std::io::Result<usize> {
    let imported = import.data_dir.join(IMPORTED);
    std::fs::create_dir_all(&imported)?;
    for entry in std::fs::read_dir(&import.data_dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let text = name.to_string_lossy();
        if (text.starts_with("snapshot-") || text.starts_with("log-")) && text.ends_with(".ttlw") {
            std::fs::rename(entry.path(), imported.join(&name))?;
        }
    }
    std::fs::File::open(&import.data_dir)?.sync_all()?;
    std::fs::remove_file(import.raft_dir.join(MARKER))?;
    std::fs::File::open(&import.raft_dir)?.sync_all()?;
    Ok(import.records.len())
}
