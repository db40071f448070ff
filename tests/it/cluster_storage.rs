//! openraft's storage suite (`openraft::testing::Suite`) against the cluster's log store and
//! state machine, on disk: each of its cases gets stores over a fresh temp directory, removed
//! when the case ends. The suite writes only blank and membership entries; `Command` entries,
//! torn tails, restarts and snapshot contents are the unit tests' (`src/cluster/`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::testing::{StoreBuilder, Suite};
use openraft::{AnyError, StorageIOError};
use tokio::time::Instant;
use ttlwheel::cluster::log_store::LogStore;
use ttlwheel::cluster::signals::LeaseSignals;
use ttlwheel::cluster::state_machine::{MachineParts, StateMachine};
use ttlwheel::cluster::types::{StorageError, TypeConfig};
use ttlwheel::registry::{Registry, RegistryConfig};

/// A directory for one case of the suite, removed when the suite drops its guard.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Builds a log store and a state machine (over an empty registry) in a fresh directory.
struct DiskStores;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for DiskStores {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError> {
        static CASES: AtomicU64 = AtomicU64::new(0);
        let case = CASES.fetch_add(1, Ordering::Relaxed);
        let dir = TempDir(
            std::env::temp_dir().join(format!("ttlwheel-raft-suite-{}-{case}", std::process::id())),
        );
        let _ = std::fs::remove_dir_all(&dir.0);
        let failed = |error: &ttlwheel::cluster::StoreError| -> StorageError {
            StorageIOError::write(AnyError::new(error)).into()
        };
        let log = LogStore::open(&dir.0.join("log")).map_err(|error| failed(&error))?;
        let registry = Arc::new(Registry::new(RegistryConfig::default(), Instant::now()));
        let signals = Arc::new(LeaseSignals::new(Instant::now()));
        let parts = MachineParts {
            registry,
            signals,
            webhooks: Arc::default(),
        };
        let machine =
            StateMachine::open(&dir.0.join("sm"), parts).map_err(|error| failed(&error))?;
        Ok((dir, log, machine))
    }
}

#[test]
fn openraft_storage_suite_passes_on_the_disk_stores() {
    Suite::test_all(DiskStores).expect("every case of the storage suite passes");
}
