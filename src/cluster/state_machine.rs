//! The Raft state machine: committed entries applied to the registry, through its one door.
//!
//! A `Writes` command's records go through `Registry::apply_logged`, recovery's path plus the
//! entry's generation and the events: every member applies the leader's records as a restarted
//! node applies its own log (idempotent whole-key records; a relative TTL counts from the
//! apply), and publishes `registered` / `deleted` from them. `Expiries` expire the keys that
//! still have the generation the leader saw (`expired` events); `Checkpoint`s set the
//! deadlines of every member but the leader that took them. A blank entry is the promotion
//! point of its term's leader (`LeaseSignals::blank_applied`); membership entries are kept as
//! the applied membership. Events come from committed entries only.
//!
//! Not durable on its own: the state is the registry in memory plus the newest snapshot in
//! its directory. At start the snapshot is loaded and its last log id reported as applied;
//! openraft then re-applies the committed entries after it (the log store keeps `committed`).
//! Installing a snapshot replaces the whole registry (`Registry::clear`, then the snapshot's
//! records), after the file has been read through once and found whole, so a damaged
//! snapshot changes nothing.
//!
//! Events carry their log id (`n << 16 | i`), which webhooks use as their `webhook-id`.
//! `Webhooks` entries are the leader's delivery reports: every other member's notifier drops
//! what they name (`notify::replicated`); the leader that wrote them skips them, but for the
//! dead letters they file: every member files those, numbered `n << 16 | i` alike. A snapshot
//! holds the notifier's held events and dead letters after the keys, and loading one replaces
//! them. Events of entries re-applied after a restart are published again (at least once,
//! same ids). SSE ids are the same places (`stream::log_ids`); loading a snapshot tells the
//! stream where its events are whole from (`LeaseSignals::snapshot_loaded`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, ErrorSubject, ErrorVerb};
use tokio::time::Instant;

use super::signals::LeaseSignals;
use super::snapshot::{self, SnapshotBuilder};
use super::types::{
    Applied, Command, Entry, LogId, Snapshot, SnapshotFile, SnapshotMeta, StorageError,
    StoredMembership, TypeConfig,
};
use super::{io_error, storage_error, sync_dir, StoreError};
use crate::notify::replicated::Replication;
use crate::registry::Registry;

/// What a state machine applies entries to.
pub struct MachineParts {
    /// The one door every change goes through.
    pub registry: Arc<Registry>,
    /// Shared with the lease task: blank entries applied, the term this member leads.
    pub signals: Arc<LeaseSignals>,
    /// The webhook outboxes' share of the cluster: reports applied, snapshots' records.
    pub webhooks: Arc<Replication>,
}

/// See the module documentation.
pub struct StateMachine {
    /// The one door every change goes through.
    registry: Arc<Registry>,
    /// Webhook reports applied, the notifier's records in snapshots.
    webhooks: Arc<Replication>,
    /// Where snapshots (and snapshots being received) live.
    dir: PathBuf,
    /// The last entry applied (or covered by the installed snapshot).
    last_applied: Option<LogId>,
    /// The membership of the last membership entry applied.
    membership: StoredMembership,
    /// Shared with the lease task: blank entries applied, the term this member leads.
    signals: Arc<LeaseSignals>,
}

impl StateMachine {
    /// A state machine over `registry` (empty: this fills it) with its snapshots in `dir`
    /// (created if needed): the newest snapshot there is loaded into the registry. Leftover
    /// `.tmp` files (a snapshot half written or received before a crash) are deleted.
    pub fn open(dir: &Path, parts: MachineParts) -> Result<Self, StoreError> {
        let MachineParts {
            registry,
            signals,
            webhooks,
        } = parts;
        std::fs::create_dir_all(dir).map_err(io_error(dir))?;
        for entry in std::fs::read_dir(dir).map_err(io_error(dir))? {
            let path = entry.map_err(io_error(dir))?.path();
            if path.extension().is_some_and(|extension| extension == "tmp") {
                std::fs::remove_file(&path).map_err(io_error(&path))?;
            }
        }
        let mut machine = Self {
            registry,
            webhooks,
            dir: dir.to_owned(),
            last_applied: None,
            membership: StoredMembership::default(),
            signals,
        };
        if let Some((_, file)) = snapshot::newest(dir)? {
            let meta = load(&machine.registry, &machine.webhooks, &file.path)?;
            machine
                .signals
                .snapshot_loaded(meta.last_log_id.map(|id| id.index));
            if let Some(last) = meta.last_log_id {
                machine.signals.term_applied(last.leader_id.term);
            }
            machine.last_applied = meta.last_log_id;
            machine.membership = meta.last_membership;
        }
        Ok(machine)
    }

    /// The registry entries are applied to.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Applies one entry; what the proposer is answered.
    fn apply_entry(&mut self, entry: Entry, now: Instant) -> Applied {
        let log_index = entry.log_id.index;
        self.last_applied = Some(entry.log_id);
        let term = entry.log_id.leader_id.term;
        self.signals.term_applied(term);
        let mut applied = Applied {
            log_index,
            ..Applied::default()
        };
        applied.n_records = match entry.payload {
            EntryPayload::Blank => {
                self.signals.blank_applied(term);
                0
            }
            EntryPayload::Normal(Command::Writes(records)) => {
                let n_records = records.len();
                for (position, record) in records.into_iter().enumerate() {
                    if (self.registry).apply_logged(record, log_index, position, now) {
                        applied.mark_created(position);
                    }
                }
                n_records
            }
            EntryPayload::Normal(Command::WriteIf { generation, record }) => {
                match (self.registry).apply_logged_if(*record, generation, log_index, now) {
                    Some(created) => {
                        if created {
                            applied.mark_created(0);
                        }
                        1
                    }
                    None => 0,
                }
            }
            EntryPayload::Normal(Command::Import(records)) => {
                let n_records = records.len();
                // The generation, as for a write: the entry's index.
                let generation = crate::registry::generation_of(log_index);
                for record in records {
                    self.registry
                        .restore_with_generation(record, generation, now);
                }
                n_records
            }
            EntryPayload::Normal(Command::Expiries(keys)) => {
                self.registry.apply_expiries(&keys, log_index, now);
                keys.len()
            }
            EntryPayload::Normal(Command::Webhooks(reports)) => {
                // The leader that sent them has settled them already, but for its dead letters.
                let by_this_member = self.signals.leading_term() == term;
                (self.webhooks).apply(&reports, log_index, by_this_member, now);
                reports.len()
            }
            EntryPayload::Normal(Command::Checkpoint(items)) => {
                // The leader that took it keeps its own deadlines, which are exact.
                if self.signals.leading_term() != term {
                    self.registry.apply_checkpoint(&items, now);
                }
                items.len()
            }
            EntryPayload::Membership(membership) => {
                self.membership = StoredMembership::new(Some(entry.log_id), membership);
                0
            }
        };
        applied
    }
}

/// Reads the snapshot at `path` into `registry` (empty) and the notifier's held events and
/// dead letters (replaced); its meta. Blocking.
fn load(
    registry: &Registry,
    webhooks: &Replication,
    path: &Path,
) -> Result<SnapshotMeta, StoreError> {
    let now = Instant::now();
    let mut webhook_records = Vec::new();
    let meta = snapshot::read(path, |record, generation| {
        if record.is_webhook() {
            webhook_records.push(record);
        } else {
            registry.restore_with_generation(record, generation, now);
        }
    })?;
    webhooks.replace(webhook_records, now);
    Ok(meta)
}

/// Replaces the registry's state with the snapshot `meta` in `incoming`, and keeps the file
/// as `dir`'s current snapshot. Blocking.
fn install(
    registry: &Registry,
    webhooks: &Replication,
    dir: &Path,
    meta: &SnapshotMeta,
    incoming: &SnapshotFile,
) -> Result<(), StoreError> {
    // Read it through once: a damaged or mismatched snapshot must change nothing.
    let found = snapshot::read(&incoming.path, |_, _| {})?;
    if found != *meta {
        return Err(StoreError::WrongSnapshot {
            path: incoming.path.clone(),
            expected: meta.snapshot_id.clone(),
            found: found.snapshot_id,
        });
    }
    let ours = snapshot::path_for(dir, meta.last_log_id);
    if incoming.path != ours {
        if incoming.path.parent() == Some(dir) {
            // Received into this directory: it becomes the snapshot by a rename.
            std::fs::rename(&incoming.path, &ours).map_err(io_error(&ours))?;
        } else {
            let tmp = ours.with_extension("tmp");
            std::fs::copy(&incoming.path, &tmp).map_err(io_error(&tmp))?;
            std::fs::File::open(&tmp)
                .and_then(|file| file.sync_all())
                .map_err(io_error(&tmp))?;
            std::fs::rename(&tmp, &ours).map_err(io_error(&ours))?;
        }
        sync_dir(dir)?;
    }
    registry.clear();
    load(registry, webhooks, &ours)?;
    snapshot::remove_older(dir, &ours)
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let now = Instant::now();
        Ok(entries
            .into_iter()
            .map(|entry| self.apply_entry(entry, now))
            .collect())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            registry: Arc::clone(&self.registry),
            webhooks: Arc::clone(&self.webhooks),
            dir: self.dir.clone(),
            last_applied: self.last_applied,
            membership: self.membership.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotFile>, StorageError> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_nanos());
        Ok(Box::new(SnapshotFile {
            path: self.dir.join(format!("incoming-{nanos}.tmp")),
            len: 0,
        }))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<SnapshotFile>,
    ) -> Result<(), StorageError> {
        let (registry, dir, header) = (Arc::clone(&self.registry), self.dir.clone(), meta.clone());
        let webhooks = Arc::clone(&self.webhooks);
        let installed = tokio::task::spawn_blocking(move || {
            install(&registry, &webhooks, &dir, &header, &snapshot)
        })
        .await
        .map_err(|error| StoreError::Task(error.to_string()))
        .and_then(|installed| installed);
        installed.map_err(|error| {
            let signature = Some(meta.signature());
            storage_error(ErrorSubject::Snapshot(signature), ErrorVerb::Write, &error)
        })?;
        self.signals
            .snapshot_loaded(meta.last_log_id.map(|id| id.index));
        if let Some(last) = meta.last_log_id {
            self.signals.term_applied(last.leader_id.term);
        }
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let newest = snapshot::newest(&self.dir).map_err(|error| {
            storage_error(ErrorSubject::Snapshot(None), ErrorVerb::Read, &error)
        })?;
        Ok(newest.map(|(meta, file)| Snapshot {
            meta,
            snapshot: Box::new(file),
        }))
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, Membership, RaftSnapshotBuilder};

    use super::*;
    use crate::clock::Clock;
    use crate::cluster::testing::TempDir;
    use crate::persist::record::{Expiry, KeyState as DurableKey, Record};
    use crate::registry::{KeyState, RegistryConfig};
    use crate::types::{Key, Meta, ServiceName};

    const UNIX_AT_EPOCH: u64 = 1_700_000_000_000;

    fn open(dir: &Path, registry: Arc<Registry>) -> Result<StateMachine, StoreError> {
        let parts = MachineParts {
            registry,
            signals: Arc::new(LeaseSignals::new(Instant::now())),
            webhooks: Arc::default(),
        };
        StateMachine::open(dir, parts)
    }

    fn registry(epoch: Instant) -> Arc<Registry> {
        let clock = Clock::with_unix_ms_at_epoch(epoch, UNIX_AT_EPOCH);
        Arc::new(Registry::with_clock(RegistryConfig::default(), clock))
    }

    fn upsert(key: &str, expiry: Expiry, service: Option<&str>) -> Record {
        Record::Upsert(DurableKey {
            key: Key::new(key).unwrap(),
            service: service.map(|name| ServiceName::new(name).unwrap()),
            meta: Some(Meta::from_value(&serde_json::json!({ "zone": key })).unwrap()),
            expiry,
            registered_unix_ms: UNIX_AT_EPOCH,
            last_heartbeat_unix_ms: UNIX_AT_EPOCH,
        })
    }

    fn entry(index: u64, payload: EntryPayload<TypeConfig>) -> Entry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload,
        }
    }

    /// The registry's state as sorted records (what a snapshot holds), and each key's TTL.
    fn contents(registry: &Registry, keys: &[&str], now: Instant) -> (Vec<String>, Vec<KeyState>) {
        let mut records: Vec<String> = registry
            .state_records()
            .map(|record| format!("{record:?}"))
            .collect();
        records.sort();
        let ttls = keys
            .iter()
            .map(|key| registry.state(&Key::new(key).unwrap(), now))
            .collect();
        (records, ttls)
    }

    #[tokio::test(start_paused = true)]
    async fn a_snapshot_round_trip_restores_the_same_keys_and_ttls_through_the_registry() {
        let epoch = Instant::now();
        let (leader_dir, follower_dir) = (TempDir::new("sm-leader"), TempDir::new("sm-follower"));
        let mut leader = open(leader_dir.path(), registry(epoch)).unwrap();
        let members = Membership::new(vec![[1, 2, 3].into()], None);
        let writes = vec![
            upsert("wheel", Expiry::Relative { ttl_ms: 30_000 }, Some("api")),
            upsert("heap", Expiry::Relative { ttl_ms: 1_234 }, None),
            upsert("forever", Expiry::Never, Some("db")),
            upsert(
                "at",
                Expiry::Absolute {
                    at_unix_ms: UNIX_AT_EPOCH + 90_000,
                },
                None,
            ),
            upsert("gone", Expiry::Relative { ttl_ms: 5_000 }, None),
            upsert("dead", Expiry::Relative { ttl_ms: 5_000 }, Some("api")),
            Record::Deleted {
                key: Key::new("gone").unwrap(),
                at_unix_ms: UNIX_AT_EPOCH,
            },
            Record::Expired {
                key: Key::new("dead").unwrap(),
                at_unix_ms: UNIX_AT_EPOCH + 1,
                last_heartbeat_unix_ms: UNIX_AT_EPOCH,
            },
        ];
        let applied = leader
            .apply([
                entry(1, EntryPayload::Membership(members.clone())),
                entry(2, EntryPayload::Normal(Command::Writes(writes))),
            ])
            .await
            .unwrap();
        assert_eq!(
            applied[1],
            Applied {
                log_index: 2,
                n_records: 8,
                // The six upserts created their keys; the delete and the expiry did not.
                created: vec![0b11_1111],
            }
        );
        let keys = ["wheel", "heap", "forever", "at", "gone", "dead"];
        let expected = contents(leader.registry(), &keys, epoch);
        assert_eq!(
            expected.1,
            [
                KeyState::ExpiresIn(30_000),
                KeyState::ExpiresIn(1_234),
                KeyState::Persistent,
                KeyState::ExpiresIn(90_000),
                KeyState::Missing,
                KeyState::Missing,
            ]
        );
        assert!(expected
            .0
            .iter()
            .any(|record| record.contains("ExpiredEntry")));

        let built = leader
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        assert_eq!(
            built.meta.last_log_id,
            Some(entry(2, EntryPayload::Blank).log_id)
        );

        // A follower with a key of its own: the snapshot replaces its whole state.
        let mut follower = open(follower_dir.path(), registry(epoch)).unwrap();
        let stale = vec![upsert("stale", Expiry::Never, None)];
        follower
            .apply([entry(1, EntryPayload::Normal(Command::Writes(stale)))])
            .await
            .unwrap();
        let mut incoming = follower.begin_receiving_snapshot().await.unwrap();
        std::fs::copy(&built.snapshot.path, &incoming.path).unwrap();
        incoming.len = built.snapshot.len;
        follower
            .install_snapshot(&built.meta, incoming)
            .await
            .unwrap();
        assert_eq!(contents(follower.registry(), &keys, epoch), expected);
        assert_eq!(
            follower
                .registry()
                .state(&Key::new("stale").unwrap(), epoch),
            KeyState::Missing
        );
        let (applied, membership) = follower.applied_state().await.unwrap();
        assert_eq!(applied, built.meta.last_log_id);
        assert_eq!(membership.membership(), &members);
        follower.registry().check_invariants();

        // A restart loads the installed snapshot into a fresh registry.
        drop(follower);
        let mut restarted = open(follower_dir.path(), registry(epoch)).unwrap();
        assert_eq!(contents(restarted.registry(), &keys, epoch), expected);
        assert_eq!(
            restarted.applied_state().await.unwrap().0,
            built.meta.last_log_id
        );
        let current = restarted.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta, built.meta);
    }

    /// A member's notifier that never sends (it does not lead), holding `deleted` events for
    /// `url`, fed by `registry`'s bus.
    fn holding_notifier(
        registry: &Registry,
        url: &str,
        webhooks: &Arc<Replication>,
    ) -> Arc<crate::notify::Notifier> {
        let settings = crate::notify::Settings {
            urls: vec![url.parse().unwrap()],
            secret: None,
            events: vec![crate::events::EventKind::Deleted],
            timeout: std::time::Duration::from_secs(1),
            concurrency: 1,
            batch_max: 1,
            max_attempts: 3,
            retry_schedule: vec![std::time::Duration::from_secs(1)],
            queue_max: 100,
            dead_letters_max: 100,
            drain_timeout: std::time::Duration::ZERO,
        };
        let notifier = crate::notify::Notifier::start(
            settings,
            registry.subscribe(),
            Some(Arc::clone(webhooks)),
        )
        .unwrap();
        assert!(!webhooks.is_delivering());
        notifier
    }

    /// Must not be lost: a webhook event no member has delivered, across a snapshot installed
    /// on another member (whose URL is named differently but is the same place in its list)
    /// and a restart. Must not be kept: an event the leader reported delivered.
    #[tokio::test]
    async fn held_webhook_events_travel_in_snapshots_and_leave_with_the_leaders_report() {
        let epoch = Instant::now();
        let (leader_dir, follower_dir) = (TempDir::new("sm-hooks-l"), TempDir::new("sm-hooks-f"));
        let leader_hooks = Arc::new(Replication::default());
        let leader_registry = registry(epoch);
        let leader_notifier =
            holding_notifier(&leader_registry, "http://127.0.0.1:9/a", &leader_hooks);
        let mut leader = StateMachine::open(
            leader_dir.path(),
            MachineParts {
                registry: leader_registry,
                signals: Arc::new(LeaseSignals::new(epoch)),
                webhooks: Arc::clone(&leader_hooks),
            },
        )
        .unwrap();
        let deleted = |key: &str| Record::Deleted {
            key: Key::new(key).unwrap(),
            at_unix_ms: UNIX_AT_EPOCH,
        };
        let writes = vec![
            upsert("kept", Expiry::Never, None),
            upsert("settled", Expiry::Never, None),
            deleted("kept"),
            deleted("settled"),
        ];
        leader
            .apply([entry(5, EntryPayload::Normal(Command::Writes(writes)))])
            .await
            .unwrap();
        let built = leader
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        assert_eq!(leader_notifier.status(epoch)[0].pending, 2);

        let follower_hooks = Arc::new(Replication::default());
        let follower_registry = registry(epoch);
        let follower_notifier =
            holding_notifier(&follower_registry, "http://127.0.0.1:9/b", &follower_hooks);
        let parts = MachineParts {
            registry: follower_registry,
            signals: Arc::new(LeaseSignals::new(epoch)),
            webhooks: Arc::clone(&follower_hooks),
        };
        let mut follower = StateMachine::open(follower_dir.path(), parts).unwrap();
        let mut incoming = follower.begin_receiving_snapshot().await.unwrap();
        std::fs::copy(&built.snapshot.path, &incoming.path).unwrap();
        incoming.len = built.snapshot.len;
        follower
            .install_snapshot(&built.meta, incoming)
            .await
            .unwrap();
        let held = |notifier: &crate::notify::Notifier| -> Vec<(String, String)> {
            let records = notifier.durable_records();
            (records.into_iter())
                .filter_map(|record| match record {
                    Record::WebhookQueued(message) => {
                        Some((message.event.key.to_string(), message.id))
                    }
                    _ => None,
                })
                .collect()
        };
        let ids = held(&follower_notifier);
        assert_eq!(ids, held(&leader_notifier), "the same events, the same ids");
        assert_eq!(ids.len(), 2);

        // The leader (of term 1, which this member does not lead) reports one delivered.
        let settled_id = ids
            .iter()
            .find(|(key, _)| key == "settled")
            .unwrap()
            .1
            .clone();
        let report = crate::notify::replicated::Settled {
            endpoint: 0,
            id: settled_id,
            key: Key::new("settled").unwrap(),
            how: crate::notify::replicated::Settlement::Delivered,
        };
        follower
            .apply([entry(
                6,
                EntryPayload::Normal(Command::Webhooks(vec![report])),
            )])
            .await
            .unwrap();
        assert_eq!(
            held(&follower_notifier),
            ids.iter()
                .filter(|(key, _)| key == "kept")
                .cloned()
                .collect::<Vec<_>>()
        );
    }

    /// Must hold: a member whose term's blank entry is behind a snapshot it loaded (a leader
    /// restarted in its own term: openraft writes no new blank entry) still knows the term's
    /// blank entry was applied, or it would never serve. Any entry of a term counts too.
    #[tokio::test]
    async fn an_entry_or_a_snapshot_of_a_term_counts_as_its_blank_entry_applied() {
        let epoch = Instant::now();
        let dir = TempDir::new("sm-blank");
        let parts = |signals: &Arc<LeaseSignals>| MachineParts {
            registry: registry(epoch),
            signals: Arc::clone(signals),
            webhooks: Arc::default(),
        };
        let signals = Arc::new(LeaseSignals::new(epoch));
        let mut machine = StateMachine::open(dir.path(), parts(&signals)).unwrap();
        assert_eq!(signals.blank_term(), 0);
        let writes = vec![upsert("k", Expiry::Never, None)];
        machine
            .apply([entry(3, EntryPayload::Normal(Command::Writes(writes)))])
            .await
            .unwrap();
        assert_eq!(signals.blank_term(), 1, "an entry of term 1 was applied");
        machine
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        drop(machine);
        let restarted = Arc::new(LeaseSignals::new(epoch));
        let _machine = StateMachine::open(dir.path(), parts(&restarted)).unwrap();
        assert_eq!(restarted.blank_term(), 1, "the snapshot ends in term 1");
    }

    #[tokio::test]
    async fn a_damaged_snapshot_is_refused_and_changes_nothing() {
        let epoch = Instant::now();
        let (leader_dir, follower_dir) = (
            TempDir::new("sm-bad-leader"),
            TempDir::new("sm-bad-follower"),
        );
        let mut leader = open(leader_dir.path(), registry(epoch)).unwrap();
        let writes = (0..20)
            .map(|n| upsert(&format!("k{n}"), Expiry::Never, None))
            .collect();
        leader
            .apply([entry(1, EntryPayload::Normal(Command::Writes(writes)))])
            .await
            .unwrap();
        let built = leader
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        let mut follower = open(follower_dir.path(), registry(epoch)).unwrap();
        let own = vec![upsert("own", Expiry::Never, None)];
        follower
            .apply([entry(1, EntryPayload::Normal(Command::Writes(own)))])
            .await
            .unwrap();
        let incoming = follower.begin_receiving_snapshot().await.unwrap();
        let mut bytes = std::fs::read(&built.snapshot.path).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xff;
        std::fs::write(&incoming.path, &bytes).unwrap();
        assert!(follower
            .install_snapshot(&built.meta, incoming)
            .await
            .is_err());
        assert_eq!(
            follower.registry().len(),
            1,
            "the follower's state is untouched"
        );
        assert_eq!(
            follower.applied_state().await.unwrap().0.map(|id| id.index),
            Some(1)
        );
    }
}
