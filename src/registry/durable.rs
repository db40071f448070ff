//! The registry's side of persistence: applying records read back from the data directory
//! (recovery), attaching the journal that logs changes from then on, and snapshots.
//!
//! Recovery applies records in log order with no event and no record of its own; the ticker
//! starts only after it, so a key that a later record re-registers is never expired by the
//! way. Snapshots read the shards in chunks of slots, one lock at a time, after rotating the
//! journal: every change after the rotation is in the new segment, and each record is a key's
//! whole state (or its end), so replaying that segment over the snapshot gives the state
//! whatever moment each key was read at. Expired lists are read before the alive keys; a key
//! both listed and alive in a snapshot is settled by its later records.

use std::sync::Arc;

use tokio::time::Instant;

use super::Registry;
use crate::persist::journal::{Journal, Lsn};
use crate::persist::record::{ExpiredState, Record};
use crate::persist::store::{DataDir, StoreError};
use crate::registry::expired::ExpiredRecord;
use crate::registry::services::{Pin, ServiceId};
use crate::types::ServiceName;

/// Slots a snapshot reads per shard lock. Reading a slot into a record costs ~100-200 ns, so a
/// heartbeat waits at most about half a millisecond behind a snapshot (a whole shard of 62k
/// keys, as at 1M keys, held the lock ~10 ms and showed as a heartbeat p99 of 4 ms).
const SNAPSHOT_CHUNK: u32 = 4096;

impl Registry {
    /// Applies one key record read back from the log at start-up (webhook records are the
    /// notifier's and are ignored here); `restart` is the instant the
    /// restart rule counts from. A service name the table cannot take (over the limit) leaves
    /// the key without one, with a warning.
    pub fn restore(&self, record: Record, restart: Instant) {
        let now = self.clock.at(restart);
        let ctx = self.ctx();
        match record {
            Record::Upsert(state) => {
                let (service, _pin) = self.service_id_for(state.service.as_ref());
                let (shard, hash) = self.shard_of(&state.key);
                shard.lock().restore_state(state, hash, service, &ctx, now);
            }
            Record::Deleted { key, .. } => {
                let (shard, hash) = self.shard_of(&key);
                shard.lock().restore_removal((&key, hash), None, &ctx);
            }
            Record::Expired {
                key,
                at_unix_ms,
                last_heartbeat_unix_ms,
            } => {
                let (shard, hash) = self.shard_of(&key);
                let expired = Some((at_unix_ms, last_heartbeat_unix_ms));
                shard.lock().restore_removal((&key, hash), expired, &ctx);
            }
            Record::ExpiredEntry(ExpiredState {
                key,
                service,
                meta,
                last_heartbeat_unix_ms,
                expired_unix_ms,
            }) => {
                let (service, _pin) = self.service_id_for(service.as_ref());
                let record = ExpiredRecord {
                    service,
                    meta,
                    last_heartbeat_unix_ms,
                    expired_unix_ms,
                };
                let (shard, hash) = self.shard_of(&key);
                shard.lock().restore_expired(key, hash, record);
            }
            // The notifier's records; the caller hands them to it (`persist::webhooks`).
            Record::WebhookQueued(_)
            | Record::WebhookDone { .. }
            | Record::DeadLetter { .. }
            | Record::DeadLetterTaken { .. } => {}
        }
    }

    /// Logs every durable change from now on to `journal` (once, after recovery).
    pub fn attach_journal(&self, journal: Arc<Journal>) {
        if self.journal.set(journal).is_err() {
            tracing::error!("a journal was already attached; the second is ignored");
        }
    }

    /// The attached journal, if any.
    pub fn journal(&self) -> Option<&Arc<Journal>> {
        self.journal.get()
    }

    /// Writes a snapshot into `dir` and drops the log segments it replaces; returns the LSN it
    /// was taken at and its size in bytes. Shards are read one at a time; `more` (the
    /// notifier's records) is called after the log is rotated, like them.
    pub fn snapshot(
        &self,
        dir: &DataDir,
        more: impl FnOnce() -> Vec<Record>,
    ) -> Result<(Lsn, u64), StoreError> {
        let journal = self.journal.get().ok_or_else(|| StoreError::Io {
            path: dir.path().to_owned(),
            source: std::io::Error::other("no journal is attached"),
        })?;
        let lsn = journal
            .rotate(|first| dir.segment_path(first))
            .map_err(|source| StoreError::Io {
                path: dir.path().to_owned(),
                source,
            })?;
        let records = self.state_records().chain(more());
        let size = dir.write_snapshot(lsn, records)?;
        Ok((lsn, size))
    }

    /// The registry's state as the records a snapshot holds: every listed expired key
    /// (`ExpiredEntry`), then every alive key whole (`Upsert`). Read lazily, shard by shard and
    /// [`SNAPSHOT_CHUNK`] slots per lock, so writes go on meanwhile; each record is a key's
    /// whole state, so replaying the changes made during the read over them gives the state
    /// (see the module documentation). Used by [`Registry::snapshot`] and by the cluster's Raft
    /// snapshots (`cluster::snapshot`), which have no journal.
    pub fn state_records(&self) -> impl Iterator<Item = Record> + '_ {
        self.state_records_with_generations()
            .map(|(record, _)| record)
    }

    /// [`Registry::state_records`], each with its key's generation (cluster mode; 0 for
    /// expired-list records and on a single node).
    pub fn state_records_with_generations(&self) -> impl Iterator<Item = (Record, u32)> + '_ {
        let expired = self.shards.iter().flat_map(move |shard| {
            let records = shard.0.lock().expired_records(&self.ctx());
            records.into_iter().map(|record| (record, 0))
        });
        let alive = self.shards.iter().flat_map(move |shard| {
            let mut next = Some(0);
            std::iter::from_fn(move || {
                let (records, after) =
                    shard
                        .0
                        .lock()
                        .alive_records(next?, SNAPSHOT_CHUNK, &self.ctx());
                next = after;
                Some(records)
            })
            .flatten()
        });
        expired.chain(alive)
    }

    /// Stops keeping the liveness listing while every key arrives at once (recovery: a
    /// snapshot read, a log replayed); [`Registry::rebuild_listing`] then builds it with one
    /// sort per shard. Inserting each key into the sorted listing was half of a 1M-key
    /// snapshot's load (`perf`: `Shard::insert`, reading ~10-20 keys at random per insertion).
    /// Nothing may list in between: the routes refuse requests until recovery has finished
    /// (`recovering`), and a cluster member rebuilds before it serves.
    pub fn defer_listing(&self) {
        for shard in self.shards.iter() {
            shard.0.lock().defer_listing();
        }
    }

    /// Builds the listing [`Registry::defer_listing`] stopped keeping, shard by shard.
    pub fn rebuild_listing(&self) {
        for shard in self.shards.iter() {
            shard.0.lock().rebuild_listing();
        }
    }

    /// Empties the registry: every key and the expired list, with no event and no record.
    /// Cluster mode only: a follower installing a Raft snapshot replaces its whole state with
    /// the snapshot's records (`cluster::state_machine`), applied after this with
    /// [`Registry::restore`]. Shards are emptied one lock at a time: callers make sure nothing
    /// else writes meanwhile (openraft applies and installs on one task).
    pub fn clear(&self) {
        for shard in self.shards.iter() {
            shard.0.lock().clear(&self.ctx());
        }
    }

    /// The id of a restored key's service, pinned until the key is stored (`NONE`, with a
    /// warning, if the table is full of names in use).
    pub(super) fn service_id_for(
        &self,
        name: Option<&ServiceName>,
    ) -> (ServiceId, Option<Pin<'_>>) {
        let Some(name) = name else {
            return (ServiceId::NONE, None);
        };
        match self.pin_service(name) {
            Ok((id, pin)) => (id, Some(pin)),
            Err(error) => {
                tracing::warn!(service = %name.as_str(), "{error}");
                (ServiceId::NONE, None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::registry::{Heartbeat, ListFilter, RegistryConfig};
    use crate::types::{Key, ServiceName, Ttl};

    fn keys_listed(registry: &Registry, filter: &ListFilter, now: Instant) -> Vec<String> {
        let (page, more) = registry.list_alive(filter, 10_000, now);
        assert!(!more, "one page holds them all");
        page.into_iter().map(|view| view.key.to_string()).collect()
    }

    /// A recovery with the listing deferred and then built at once lists what the original
    /// registry lists, overall and per service, with every invariant holding; and the rebuilt
    /// listing takes new keys and removals as before.
    #[test]
    fn a_recovery_that_builds_the_listing_at_once_lists_what_was_there() {
        let epoch = Instant::now();
        let config = || RegistryConfig {
            shards: 4,
            ..RegistryConfig::default()
        };
        let original = Registry::new(config(), epoch);
        for n in 0..3000u32 {
            // A quarter each in web, db and cache; a quarter without a service.
            let service = ["web", "db", "cache"][(n % 4) as usize % 3];
            original
                .heartbeat(
                    Heartbeat {
                        key: Key::new(&format!(
                            "svc-{:02}/instance-{:010}",
                            n % 13,
                            n * 7919 % 3000
                        ))
                        .unwrap(),
                        ttl: Ttl::from_secs(60 + u64::from(n % 5)).unwrap(),
                        service: (n % 4 != 3).then(|| ServiceName::new(service).unwrap()),
                        meta: None,
                    },
                    epoch,
                )
                .unwrap();
        }
        let restart = epoch + Duration::from_secs(1);
        let restored = Registry::new(config(), restart);
        restored.defer_listing();
        for record in original.state_records() {
            restored.restore(record, restart);
        }
        restored.rebuild_listing();
        restored.check_invariants();
        let web = restored.services.lookup(&ServiceName::new("web").unwrap());
        assert!(web.is_some(), "the services came back");
        for service in [None, web] {
            let filter = ListFilter {
                service,
                ..ListFilter::default()
            };
            let original_filter = ListFilter {
                service: service.and(original.services.lookup(&ServiceName::new("web").unwrap())),
                ..ListFilter::default()
            };
            let listed = keys_listed(&restored, &filter, restart);
            assert_eq!(listed, keys_listed(&original, &original_filter, restart));
            let expected = if service.is_none() { 3000 } else { 750 };
            assert_eq!(listed.len(), expected, "keys listed with {service:?}");
        }
        restored
            .heartbeat(
                Heartbeat {
                    key: Key::new("svc-00/instance-after").unwrap(),
                    ttl: Ttl::from_secs(60).unwrap(),
                    service: None,
                    meta: None,
                },
                restart,
            )
            .unwrap();
        restored.check_invariants();
    }
}
