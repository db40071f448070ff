//! Persistence: the registry's durable changes as an append-only log of records, and snapshots
//! that let the log be truncated (the Redis AOF + RDB model; the records are shaped to become
//! replicated log entries).
//!
//! - [`record`]: what is written, and its binary encoding.
//! - [`log`]: the framing (length, checksum, format version) and reading files back, telling
//!   a torn tail (a crash mid-append) from corruption.
//! - [`journal`]: appending records with group commit and the `--fsync` modes, surviving a
//!   full disk.
//! - [`store`]: the data directory (lock, file layout), recovery, and snapshots.
//! - [`webhooks`]: replaying the webhook records into the events still held and the dead
//!   letters.

pub mod journal;
pub mod log;
pub mod record;
pub mod store;
pub mod webhooks;

/// What the persistence tests share: a record to write and a fresh directory.
#[cfg(test)]
pub(crate) mod testing {
    use std::path::PathBuf;

    use super::record::{Expiry, KeyState, Record};
    use crate::types::Key;

    /// An `Upsert` of key `k{n}`, distinct for each `n`.
    pub fn record(n: u64) -> Record {
        Record::Upsert(KeyState {
            key: Key::new(&format!("k{n}")).unwrap(),
            service: None,
            meta: None,
            expiry: Expiry::Relative { ttl_ms: 1_000 + n },
            registered_unix_ms: n,
            last_heartbeat_unix_ms: n,
        })
    }

    /// A path under the temp dir, unique to this process and `name`, empty and not created.
    pub fn temp_path(name: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!("ttlwheel-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        path
    }
}
