//! The registry's side of cluster mode (`RegistryConfig::replicated`): what a change that must
//! go through the Raft log is proposed as (a heartbeat's `upsert_for`, a delete's
//! `deletion_for`, a TTL change's `expire_for` / `persist_for`: always a key's whole state or
//! its end, a TTL always relative), what a request is answered once its entry has been
//! applied, and applying committed entries: writes, expiries and checkpoints, each with its
//! events, on every member alike (`cluster::state_machine` calls these in log order).
//!
//! The leader's side: the sweeper lists due keys instead of expiring them
//! ([`Registry::expiring_batch`] is what the next expiry entry names), renewals are collected
//! for the next checkpoint ([`Registry::take_checkpoint`]), and a promotion gives every key its
//! failover deadline ([`Registry::promote`]). See `shard::replicated` for the per-key rules.

use tokio::time::Instant;

use super::shard::CheckpointItem;
use super::{
    ExpireAt, ExpireCondition, ExpireOutcome, Heartbeat, HeartbeatOutcome, Registry, RegistryError,
};
use crate::expiry::TimerKind;
use crate::persist::record::{Expiry, KeyState, Record};
use crate::types::Key;

/// A change a cluster member's leader decided and has not made: the answer to give, and the
/// record to propose and see applied before giving it (`None`: nothing changes; answer at
/// once).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logged<T> {
    pub answer: T,
    pub record: Option<Record>,
    /// The generation of the key the change was decided on, when the record must apply only
    /// to that key (`Command::WriteIf`): a TTL change decided while the key's expiry was in
    /// flight must not bring it back if the expiry is committed first.
    pub guard: Option<u32>,
}

/// Slots a promotion pass handles per shard lock: about as long a hold as a sweep chunk.
const PROMOTE_CHUNK: u32 = 4096;

/// The generation a key written by the entry at `index` gets (module doc of `shard::replicated`).
pub fn generation_of(index: u64) -> u32 {
    index as u32 // the low 32 bits, on purpose
}

/// The most items one entry numbers events for: positions take 16 bits of an event's log id.
pub const MAX_ENTRY_ITEMS: usize = 1 << 16;

/// The log id of the event of item `position` of the entry at `index` (`Event::log_id`).
pub fn event_log_id(index: u64, position: usize) -> u64 {
    debug_assert!(
        position < MAX_ENTRY_ITEMS,
        "an entry holds at most 65,536 items"
    );
    index << 16 | (position as u64 & 0xffff)
}

impl Registry {
    /// Applies one record of the committed entry at log index `index`, with its event: a
    /// creation publishes `registered`, a delete `deleted`; other records are applied as
    /// recovery applies them. Returns whether a key was created.
    pub fn apply_logged(&self, record: Record, index: u64, position: usize, at: Instant) -> bool {
        let now = self.clock.at(at);
        let generation = generation_of(index);
        let stamp = event_log_id(index, position);
        match record {
            Record::Upsert(state) => {
                let (service, _pin) = self.service_id_for(state.service.as_ref());
                let key = state.key.clone();
                let (created, heap_deadline) = self.with_shard(&key, |shard, hash, ctx| {
                    shard.stamped(stamp, |shard| {
                        shard.apply_upsert(state, hash, service, generation, ctx, now)
                    })
                });
                // The leader's sweeper may sleep past a heap deadline this brought forward.
                if let Some(deadline_ms) = heap_deadline {
                    self.wake_for_heap_deadline(deadline_ms);
                }
                created
            }
            Record::Deleted { key, .. } => {
                self.with_shard(&key, |shard, hash, ctx| {
                    shard.stamped(stamp, |shard| shard.apply_delete((&key, hash), ctx, now.ms))
                });
                false
            }
            // Not proposed by members today; applied as recovery applies them, silently.
            other => {
                self.restore(other, at);
                false
            }
        }
    }

    /// Applies `record` (the whole entry at `index`, `Command::WriteIf`) only if its key still
    /// has `generation`: `Some(whether it created the key)`, or `None` when the key is gone or
    /// another (expired, deleted, created again since the leader decided).
    pub fn apply_logged_if(
        &self,
        record: Record,
        generation: u32,
        index: u64,
        at: Instant,
    ) -> Option<bool> {
        let key = match &record {
            Record::Upsert(state) => state.key.clone(),
            Record::Deleted { key, .. } => key.clone(),
            // Only a key's state or its deletion is ever proposed with a guard; any other
            // record names no key to check, and applies as `apply_logged` would.
            _ => return Some(self.apply_logged(record, index, 0, at)),
        };
        // Keys change only by applied entries, and entries are applied one at a time: the
        // generation read here is the one the record meets.
        let current = self.with_shard(&key, |shard, hash, _| shard.key_generation((&key, hash)));
        (current == Some(generation)).then(|| self.apply_logged(record, index, 0, at))
    }

    /// Applies the committed expiry entry at `index`: each key that still has the generation
    /// the leader saw expires, with its event. Returns how many expired.
    pub fn apply_expiries(&self, keys: &[(Key, u32)], index: u64, now: Instant) -> usize {
        let now = self.clock.at(now);
        let expired = keys
            .iter()
            .enumerate()
            .filter(|(position, (key, generation))| {
                let stamp = event_log_id(index, *position);
                self.with_shard(key, |shard, hash, ctx| {
                    shard.stamped(stamp, |shard| {
                        shard.apply_expiry((key, hash), *generation, ctx, now.ms)
                    })
                })
            })
            .count();
        self.guard_saw_expiries(now, expired);
        expired
    }

    /// Applies a committed checkpoint on a member that did not take it: each key still of
    /// the generation is due its remaining time from `now`.
    pub fn apply_checkpoint(&self, items: &[CheckpointItem], now: Instant) {
        let now = self.clock.at(now);
        for item in items {
            self.with_shard(&item.key, |shard, hash, ctx| {
                shard.apply_checkpoint(item, hash, ctx, now)
            });
        }
    }

    /// The leader's checkpoint: every key renewed since the last one, with its time left.
    pub fn take_checkpoint(&self, now: Instant) -> Vec<CheckpointItem> {
        let now = self.clock.at(now);
        let mut items = Vec::new();
        for shard in self.shards.iter() {
            shard.0.lock().take_renewed(now, &mut items);
        }
        items
    }

    /// Leadership lost: the renewals not yet checkpointed are forgotten (the next leader
    /// counts from its own promotion).
    pub fn forget_renewals(&self) {
        for shard in self.shards.iter() {
            shard.0.lock().forget_renewed();
        }
    }

    /// Up to `max` keys (spread over the shards) whose expiry the leader is to propose, each
    /// with its generation. Keys stay listed until the entry is applied.
    pub fn expiring_batch(&self, max: usize) -> Vec<(Key, u32)> {
        let per_shard = max.div_ceil(self.shards.len()).max(1);
        let mut keys = Vec::new();
        for shard in self.shards.iter() {
            if keys.len() >= max {
                break;
            }
            shard.0.lock().expiring_keys(per_shard, &mut keys);
        }
        keys.truncate(max);
        keys
    }

    /// Keys listed for an expiry entry, in every shard.
    pub fn expiring_count(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.0.lock().expiring_count())
            .sum()
    }

    /// A new leader's promotion: every key with a TTL gets `deadline_for(remaining, ttl)`
    /// (both in ms; the result an instant), `remaining` counted as of `last_contact`, the
    /// last instant the old leader was known to count. [`PROMOTE_CHUNK`] slots per lock.
    pub fn promote(&self, last_contact: Instant, deadline_for: &dyn Fn(u64, u64) -> Instant) {
        let contact_ms = self.clock.at(last_contact).ms;
        let ctx_clock = &self.clock;
        let to_ms = |remaining_ms: u64, ttl_ms: u64| {
            ctx_clock
                .at(deadline_for(remaining_ms, ttl_ms))
                .deadline_ms(0)
        };
        for shard in self.shards.iter() {
            let mut next = Some(0);
            while let Some(from) = next {
                let ctx = self.ctx();
                next = shard
                    .0
                    .lock()
                    .promote_slots(from, PROMOTE_CHUNK, contact_ms, &to_ms, &ctx);
            }
        }
        self.forget_renewals();
        self.wakeup.notify_one();
    }

    /// Applies a key record read from a Raft snapshot, with the generation it was saved with.
    pub fn restore_with_generation(&self, record: Record, generation: u32, now: Instant) {
        let key = match &record {
            Record::Upsert(state) => Some(state.key.clone()),
            _ => None,
        };
        self.restore(record, now);
        if let Some(key) = key {
            let (shard, hash) = self.shard_of(&key);
            shard.lock().restore_generation((&key, hash), generation);
        }
    }

    /// The record a heartbeat that changes more than the deadline proposes: the key's whole
    /// state as it will be (the stored service, metadata and registration time where the
    /// heartbeat names none). Whether it creates the key only its apply tells
    /// (`apply_logged`): an expiry in flight may be committed before it.
    pub fn upsert_for(&self, heartbeat: &Heartbeat, now: Instant) -> Record {
        let existing = self.get(&heartbeat.key, now);
        let now_unix_ms = self.clock.unix_ms(self.clock.at(now).ms);
        let (service, meta, registered_unix_ms) = match existing {
            Some(view) => (
                heartbeat.service.clone().or(view.service),
                heartbeat.meta.clone().or(view.meta),
                view.registered_at_ms,
            ),
            None => (
                heartbeat.service.clone(),
                heartbeat.meta.clone(),
                now_unix_ms,
            ),
        };
        let state = KeyState {
            key: heartbeat.key.clone(),
            service,
            meta,
            expiry: Expiry::Relative {
                ttl_ms: heartbeat.ttl.as_millis(),
            },
            registered_unix_ms,
            last_heartbeat_unix_ms: now_unix_ms,
        };
        Record::Upsert(state)
    }

    /// The record a delete proposes, if the key is there to delete.
    pub fn deletion_for(&self, key: &Key, now: Instant) -> Option<Record> {
        self.get(key, now)?;
        let at_unix_ms = self.clock.unix_ms(self.clock.at(now).ms);
        Some(Record::Deleted {
            key: key.clone(),
            at_unix_ms,
        })
    }

    /// EXPIRE / PEXPIRE / PEXPIREAT on a cluster member (the leader): decided against the key
    /// as it is here, with a single node's semantics (404 for a missing key, the condition,
    /// a deadline not in the future deletes), and changing nothing; the record to propose is
    /// the key's whole new state with the time left as a relative TTL (see
    /// `Shard::expire_record` for why never an instant), or its deletion.
    pub fn expire_for(
        &self,
        key: &Key,
        at: ExpireAt,
        condition: Option<ExpireCondition>,
        now: Instant,
    ) -> Result<Logged<ExpireOutcome>, RegistryError> {
        let now = self.clock.at(now);
        let (target_ms, _) = self.expire_target(at, now)?;
        let logged = self.with_shard(key, |shard, hash, ctx| {
            let (answer, record) = shard.expire_record((key, hash), target_ms, condition, ctx, now);
            let guard = record.as_ref().and_then(|record| match record {
                Record::Upsert(_) => shard.key_generation((key, hash)),
                _ => None,
            });
            Logged {
                answer,
                record,
                guard,
            }
        });
        Ok(logged)
    }

    /// PERSIST on a cluster member (the leader), changing nothing: the answer (`None`:
    /// missing; else whether a TTL is removed) and the record to propose, the key's whole
    /// state without a deadline.
    pub fn persist_for(&self, key: &Key, now: Instant) -> Logged<Option<bool>> {
        let now = self.clock.at(now);
        self.with_shard(key, |shard, hash, ctx| {
            let (answer, record) = shard.persist_record((key, hash), ctx, now);
            let guard = record.as_ref().and(shard.key_generation((key, hash)));
            Logged {
                answer,
                record,
                guard,
            }
        })
    }

    /// What a heartbeat whose record was applied is answered: the key as it is now (or, if a
    /// later change removed it meanwhile, as the heartbeat left it).
    pub fn outcome_after_log(
        &self,
        heartbeat: Heartbeat,
        created: bool,
        now: Instant,
    ) -> HeartbeatOutcome {
        let ttl_ms = heartbeat.ttl.as_millis();
        let timer = TimerKind::for_ttl(ttl_ms, self.config.max_ttl_s);
        match self.get(&heartbeat.key, now) {
            Some(view) => HeartbeatOutcome {
                key: heartbeat.key,
                created,
                service: view.service,
                ttl_ms: view.ttl_ms.unwrap_or(ttl_ms),
                expires_in_ms: view.expires_in_ms.unwrap_or(ttl_ms),
                expires_at_ms: view.expires_at_ms.unwrap_or(0),
                timer: view.timer.unwrap_or(timer),
                lsn: 0,
            },
            None => {
                let now_unix_ms = self.clock.unix_ms(self.clock.at(now).ms);
                HeartbeatOutcome {
                    key: heartbeat.key,
                    created,
                    service: heartbeat.service,
                    ttl_ms,
                    expires_in_ms: ttl_ms,
                    expires_at_ms: now_unix_ms + ttl_ms,
                    timer,
                    lsn: 0,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::events::EventKind;
    use crate::registry::{KeyState as State, RegistryConfig, RegistryError};
    use crate::types::Ttl;

    fn member(epoch: Instant) -> Registry {
        let config = RegistryConfig {
            replicated: true,
            shards: 4,
            ..RegistryConfig::default()
        };
        Registry::new(config, epoch)
    }

    fn key(name: &str) -> Key {
        Key::new(name).unwrap()
    }

    fn heartbeat(name: &str, ttl_s: u64) -> Heartbeat {
        Heartbeat {
            key: key(name),
            ttl: Ttl::from_secs(ttl_s).unwrap(),
            service: None,
            meta: None,
        }
    }

    /// Creates `name` as the entry at `index` would.
    fn create(registry: &Registry, name: &str, ttl_s: u64, index: u64, now: Instant) {
        let record = registry.upsert_for(&heartbeat(name, ttl_s), now);
        assert!(registry.apply_logged(record, index, 0, now), "created");
        registry.check_invariants();
    }

    fn events(receiver: &mut crate::events::EventReceiver) -> Vec<(EventKind, String)> {
        std::iter::from_fn(|| receiver.try_recv())
            .map(|event| (event.kind, event.key.as_str().to_owned()))
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_due_key_is_listed_for_the_log_and_leaves_only_when_its_expiry_is_applied() {
        let epoch = Instant::now();
        let registry = member(epoch);
        let mut receiver = registry.subscribe();
        create(&registry, "a", 1, 7, epoch);
        assert_eq!(events(&mut receiver), [(EventKind::Registered, "a".into())]);
        let later = epoch + Duration::from_millis(1_500);
        registry.sweep(later, 1 << 20);
        registry.check_invariants();
        assert_eq!(registry.expiring_batch(10), [(key("a"), 7)]);
        assert!(
            events(&mut receiver).is_empty(),
            "no event before the commit"
        );
        assert_ne!(registry.state(&key("a"), later), State::Missing);
        // A renewal now must be ordered against the expiry by the log.
        assert!(matches!(
            registry.heartbeat(heartbeat("a", 1), later),
            Err(RegistryError::NeedsLog)
        ));
        assert_eq!(
            registry.apply_expiries(&[(key("b"), 1), (key("a"), 7)], 12, later),
            1
        );
        registry.check_invariants();
        let expired = receiver.try_recv().expect("the expiry's event");
        assert_eq!(
            (expired.kind, expired.key.as_str()),
            (EventKind::Expired, "a")
        );
        assert_eq!(
            expired.log_id,
            Some(12 << 16 | 1),
            "numbered by its entry and its place in it, as on every member"
        );
        assert_eq!(registry.state(&key("a"), later), State::Missing);
        assert!(registry.expiring_batch(10).is_empty());
    }

    /// A heartbeat decided while the key's expiry is in flight is proposed as a renewal of
    /// the key the leader sees; if the expiry is committed first, applying the heartbeat
    /// creates the key again, and says so (the answer's `created`), with its registration
    /// time the heartbeat's, not the expired key's.
    #[tokio::test(start_paused = true)]
    async fn a_heartbeat_committed_after_the_keys_expiry_creates_it_again_and_says_so() {
        let epoch = Instant::now();
        let registry = member(epoch);
        create(&registry, "a", 1, 7, epoch);
        let later = epoch + Duration::from_millis(1_500);
        registry.sweep(later, 1 << 20);
        assert_eq!(registry.expiring_batch(10), [(key("a"), 7)]);
        let record = registry.upsert_for(&heartbeat("a", 5), later);
        let mut receiver = registry.subscribe();
        assert_eq!(registry.apply_expiries(&[(key("a"), 7)], 8, later), 1);
        assert!(registry.apply_logged(record, 9, 0, later), "created again");
        registry.check_invariants();
        assert_eq!(
            events(&mut receiver),
            [
                (EventKind::Expired, "a".into()),
                (EventKind::Registered, "a".into())
            ]
        );
        let view = registry.get(&key("a"), later).expect("alive");
        let unix_later = registry.clock.unix_ms(registry.clock.at(later).ms);
        assert_eq!(view.registered_at_ms, unix_later);
        assert_eq!(registry.state(&key("a"), later), State::ExpiresIn(5_000));
    }

    /// Must not happen: a TTL change brings back a key that expired. The leader decides an
    /// EXPIRE (or PERSIST) on a key whose own expiry is in flight; if the expiry is committed
    /// first, the change applies as nothing (the API answers 404, as for a missing key), with
    /// no `registered` event; if the change is committed first, it applies and the expiry,
    /// for the older generation, does nothing.
    #[tokio::test(start_paused = true)]
    async fn a_ttl_change_committed_after_the_keys_expiry_does_not_bring_it_back() {
        let epoch = Instant::now();
        let later = epoch + Duration::from_millis(1_500);
        for expiry_first in [true, false] {
            let registry = member(epoch);
            create(&registry, "a", 1, 7, epoch);
            registry.sweep(later, 1 << 20);
            assert_eq!(registry.expiring_batch(10), [(key("a"), 7)]);
            let logged = registry
                .expire_for(&key("a"), ExpireAt::In(60_000), None, later)
                .unwrap();
            assert_eq!(logged.guard, Some(7));
            let persisted = registry.persist_for(&key("a"), later);
            assert_eq!(persisted.guard, Some(7));
            let record = logged.record.expect("a change to log");
            let mut receiver = registry.subscribe();
            if expiry_first {
                assert_eq!(registry.apply_expiries(&[(key("a"), 7)], 8, later), 1);
                assert_eq!(registry.apply_logged_if(record, 7, 9, later), None);
                assert_eq!(registry.state(&key("a"), later), State::Missing);
                assert_eq!(events(&mut receiver), [(EventKind::Expired, "a".into())]);
            } else {
                assert_eq!(registry.apply_logged_if(record, 7, 8, later), Some(false));
                assert_eq!(registry.apply_expiries(&[(key("a"), 7)], 9, later), 0);
                assert_eq!(registry.state(&key("a"), later), State::ExpiresIn(60_000));
                assert!(events(&mut receiver).is_empty());
            }
            registry.check_invariants();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_expiry_for_an_older_generation_applies_as_nothing() {
        let epoch = Instant::now();
        let registry = member(epoch);
        create(&registry, "a", 1, 7, epoch);
        let later = epoch + Duration::from_millis(1_500);
        registry.sweep(later, 1 << 20);
        // A heartbeat through the log (entry 9) lands before the expiry decided at 7.
        let record = registry.upsert_for(&heartbeat("a", 1), later);
        assert!(
            !registry.apply_logged(record, 9, 0, later),
            "renewed, not created"
        );
        registry.check_invariants();
        assert!(
            registry.expiring_batch(10).is_empty(),
            "the write took it off the list"
        );
        let mut receiver = registry.subscribe();
        assert_eq!(registry.apply_expiries(&[(key("a"), 7)], 12, later), 0);
        assert!(events(&mut receiver).is_empty());
        assert_eq!(registry.state(&key("a"), later), State::ExpiresIn(1_000));
        // Deleted and created again: the old generation's expiry does nothing either.
        let deletion = registry.deletion_for(&key("a"), later).unwrap();
        registry.apply_logged(deletion, 10, 0, later);
        create(&registry, "a", 5, 11, later);
        assert_eq!(registry.apply_expiries(&[(key("a"), 9)], 12, later), 0);
        assert_eq!(registry.apply_expiries(&[(key("a"), 11)], 12, later), 1);
        registry.check_invariants();
    }

    #[tokio::test(start_paused = true)]
    async fn a_checkpoint_carries_each_renewed_key_once_and_sets_other_members_deadlines() {
        let epoch = Instant::now();
        let (leader, follower) = (member(epoch), member(epoch));
        for registry in [&leader, &follower] {
            create(registry, "a", 10, 3, epoch);
            create(registry, "b", 10, 4, epoch);
        }
        let renewed_at = epoch + Duration::from_secs(4);
        for _ in 0..3 {
            leader.heartbeat(heartbeat("a", 10), renewed_at).unwrap();
        }
        let taken_at = renewed_at + Duration::from_secs(1);
        let items = leader.take_checkpoint(taken_at);
        assert_eq!(
            items,
            [CheckpointItem {
                key: key("a"),
                generation: 3,
                remaining_ms: 9_000
            }]
        );
        assert!(leader.take_checkpoint(taken_at).is_empty(), "taken once");
        follower.apply_checkpoint(&items, taken_at);
        follower.check_invariants();
        assert_eq!(follower.state(&key("a"), taken_at), State::ExpiresIn(9_000));
        assert_eq!(follower.state(&key("b"), taken_at), State::ExpiresIn(5_000));
        // An item of another generation is skipped.
        let stale = [CheckpointItem {
            generation: 2,
            ..items[0].clone()
        }];
        follower.apply_checkpoint(&stale, taken_at + Duration::from_secs(3));
        assert_eq!(follower.state(&key("a"), taken_at), State::ExpiresIn(9_000));
    }

    #[tokio::test(start_paused = true)]
    async fn a_promotion_keeps_the_old_leaders_promise_and_gives_overdue_keys_the_grace() {
        let epoch = Instant::now();
        let registry = member(epoch);
        create(&registry, "long", 30, 3, epoch); // due at 30 s
        create(&registry, "short", 2, 4, epoch); // due at 2 s: overdue at the promotion
        let contact = epoch + Duration::from_secs(10);
        let promoted = contact + Duration::from_secs(3);
        registry.sweep(promoted, 1 << 20);
        let grace = Duration::from_secs(5);
        // The cluster's rule (`cluster::lease::failover_deadline`), written out here: the
        // registry must not import the cluster that wraps it.
        registry.promote(contact, &|remaining_ms, ttl_ms| {
            let ttl_or_grace = Duration::from_millis(ttl_ms).min(grace);
            promoted + Duration::from_millis(remaining_ms).max(ttl_or_grace)
        });
        registry.check_invariants();
        // 20 s were left at the last contact: kept whole from the promotion.
        assert_eq!(
            registry.state(&key("long"), promoted),
            State::ExpiresIn(20_000)
        );
        // Overdue: min(TTL, grace) from the promotion.
        assert_eq!(
            registry.state(&key("short"), promoted),
            State::ExpiresIn(2_000)
        );
        assert!(registry.expiring_batch(10).is_empty());
    }
    /// A member whose wall clock reads `unix_ms` at `epoch` (members' clocks differ).
    fn member_with_clock(epoch: Instant, unix_ms: u64) -> Registry {
        let config = RegistryConfig {
            replicated: true,
            shards: 4,
            ..RegistryConfig::default()
        };
        Registry::with_clock(
            config,
            crate::clock::Clock::with_unix_ms_at_epoch(epoch, unix_ms),
        )
    }

    fn relative_ttl(record: &Record) -> Option<u64> {
        match record {
            Record::Upsert(state) => match state.expiry {
                Expiry::Relative { ttl_ms } => Some(ttl_ms),
                _ => None,
            },
            _ => None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_expire_is_decided_on_the_leader_changes_nothing_there_and_applies_alike_everywhere()
    {
        let epoch = Instant::now();
        let (leader, follower) = (member(epoch), member(epoch));
        for registry in [&leader, &follower] {
            create(registry, "a", 60, 3, epoch);
        }
        let asked = epoch + Duration::from_secs(10);
        assert!(matches!(
            leader.expire(&key("a"), ExpireAt::In(1_500), None, asked),
            Err(RegistryError::NeedsLog)
        ));
        let logged = leader
            .expire_for(&key("a"), ExpireAt::In(1_500), None, asked)
            .unwrap();
        assert_eq!(logged.answer, ExpireOutcome::Applied { ttl_ms: 1_500 });
        let record = logged.record.expect("a change to log");
        assert_eq!(relative_ttl(&record), Some(1_500));
        assert_eq!(
            leader.state(&key("a"), asked),
            State::ExpiresIn(50_000),
            "nothing changes before the entry is applied"
        );
        // Each member applies the entry when it gets it, and counts the TTL from then.
        let applied_here = asked + Duration::from_millis(3);
        let applied_there = asked + Duration::from_millis(40);
        assert!(!leader.apply_logged(record.clone(), 9, 0, applied_here));
        assert!(!follower.apply_logged(record, 9, 0, applied_there));
        for (registry, applied) in [(&leader, applied_here), (&follower, applied_there)] {
            registry.check_invariants();
            assert_eq!(registry.state(&key("a"), applied), State::ExpiresIn(1_500));
            let view = registry.get(&key("a"), applied).unwrap();
            assert_eq!(view.ttl_ms, Some(1_500));
        }
        // It expires through the log: the leader lists it with the EXPIRE's generation.
        let mut events_there = follower.subscribe();
        let due = applied_here + Duration::from_millis(1_500);
        leader.sweep(due, 1 << 20);
        leader.check_invariants();
        let expiring = leader.expiring_batch(10);
        assert_eq!(expiring, [(key("a"), generation_of(9))]);
        assert_eq!(follower.apply_expiries(&expiring, 12, due), 1);
        assert_eq!(leader.apply_expiries(&expiring, 12, due), 1);
        assert_eq!(
            events(&mut events_there),
            [(EventKind::Expired, "a".into())]
        );
        for registry in [&leader, &follower] {
            assert_eq!(registry.state(&key("a"), due), State::Missing);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_absolute_deadline_is_logged_as_the_time_left_on_the_leaders_clock() {
        let epoch = Instant::now();
        let leader = member_with_clock(epoch, 1_700_000_000_000);
        // Five seconds ahead of the leader: an instant in the log would mean 5 s less here.
        let follower = member_with_clock(epoch, 1_700_000_005_000);
        for registry in [&leader, &follower] {
            create(registry, "a", 60, 3, epoch);
        }
        let asked = epoch + Duration::from_secs(1);
        let at = ExpireAt::AtUnixMs(1_700_000_000_000 + 1_000 + 3_000);
        let logged = leader.expire_for(&key("a"), at, None, asked).unwrap();
        assert_eq!(logged.answer, ExpireOutcome::Applied { ttl_ms: 3_000 });
        let record = logged.record.expect("a change to log");
        assert_eq!(relative_ttl(&record), Some(3_000), "no instant: {record:?}");
        let applied = asked + Duration::from_millis(20);
        for registry in [&leader, &follower] {
            registry.apply_logged(record.clone(), 9, 0, applied);
            registry.check_invariants();
            assert_eq!(registry.state(&key("a"), applied), State::ExpiresIn(3_000));
        }
        // Never before the instant asked for, on the leader's clock.
        let deadline = leader
            .get(&key("a"), applied)
            .unwrap()
            .expires_at_ms
            .unwrap();
        assert!(deadline >= 1_700_000_004_000, "{deadline}");
        // An instant already past on the leader's clock deletes the key, through the log.
        let past = ExpireAt::AtUnixMs(1_700_000_000_500);
        let logged = leader.expire_for(&key("a"), past, None, applied).unwrap();
        assert_eq!(logged.answer, ExpireOutcome::Deleted);
        assert!(matches!(logged.record, Some(Record::Deleted { .. })));
        assert_ne!(leader.state(&key("a"), applied), State::Missing);
    }

    #[tokio::test(start_paused = true)]
    async fn an_expire_answers_a_missing_key_a_failed_condition_and_a_past_deadline_as_a_single_node(
    ) {
        let epoch = Instant::now();
        let registry = member(epoch);
        create(&registry, "a", 60, 3, epoch);
        let now = epoch + Duration::from_secs(10);
        let missing = registry
            .expire_for(&key("nobody"), ExpireAt::In(1_000), None, now)
            .unwrap();
        assert_eq!(
            (missing.answer, missing.record),
            (ExpireOutcome::NotFound, None)
        );
        let nx = registry
            .expire_for(
                &key("a"),
                ExpireAt::In(1_000),
                Some(ExpireCondition::Nx),
                now,
            )
            .unwrap();
        assert_eq!(
            (nx.answer, nx.record),
            (
                ExpireOutcome::NotApplied {
                    ttl_ms: Some(50_000)
                },
                None
            )
        );
        let gt = registry
            .expire_for(
                &key("a"),
                ExpireAt::In(90_000),
                Some(ExpireCondition::Gt),
                now,
            )
            .unwrap();
        assert_eq!(gt.answer, ExpireOutcome::Applied { ttl_ms: 90_000 });
        assert!(matches!(
            registry.expire_for(&key("a"), ExpireAt::In(i64::MAX), None, now),
            Err(RegistryError::Invalid(_))
        ));
        let mut receiver = registry.subscribe();
        let zero = registry
            .expire_for(&key("a"), ExpireAt::In(0), None, now)
            .unwrap();
        assert_eq!(zero.answer, ExpireOutcome::Deleted);
        registry.apply_logged(zero.record.unwrap(), 10, 0, now);
        registry.check_invariants();
        assert_eq!(events(&mut receiver), [(EventKind::Deleted, "a".into())]);
        assert_eq!(registry.state(&key("a"), now), State::Missing);
    }

    #[tokio::test(start_paused = true)]
    async fn a_persisted_key_never_expires_nor_gets_a_deadline_at_a_promotion() {
        let epoch = Instant::now();
        let (leader, follower) = (member(epoch), member(epoch));
        for registry in [&leader, &follower] {
            create(registry, "a", 2, 3, epoch);
        }
        assert!(matches!(
            leader.persist(&key("a"), epoch),
            Err(RegistryError::NeedsLog)
        ));
        assert_eq!(
            leader.persist_for(&key("nobody"), epoch),
            Logged {
                answer: None,
                record: None,
                guard: None
            }
        );
        let logged = leader.persist_for(&key("a"), epoch);
        assert_eq!(logged.answer, Some(true));
        assert_eq!(logged.guard, Some(3), "decided on the key entry 3 wrote");
        let record = logged.record.expect("a change to log");
        assert!(
            matches!(&record, Record::Upsert(state) if state.expiry == Expiry::Never),
            "{record:?}"
        );
        for registry in [&leader, &follower] {
            registry.apply_logged(record.clone(), 5, 0, epoch);
            registry.check_invariants();
        }
        assert_eq!(
            leader.persist_for(&key("a"), epoch),
            Logged {
                answer: Some(false),
                record: None,
                guard: None
            },
            "nothing left to remove"
        );
        // Far past its old TTL, swept, checkpointed and promoted: still without a deadline.
        let later = epoch + Duration::from_secs(30);
        for registry in [&leader, &follower] {
            registry.sweep(later, 1 << 20);
            assert!(registry.expiring_batch(10).is_empty());
            registry.promote(later, &|_, _| later + Duration::from_secs(1));
            registry.check_invariants();
            assert!(registry.take_checkpoint(later).is_empty());
            assert_eq!(registry.state(&key("a"), later), State::Persistent);
            let view = registry.get(&key("a"), later).unwrap();
            assert_eq!((view.ttl_ms, view.expires_at_ms), (None, None));
        }
        // A snapshot keeps it without one.
        let records: Vec<_> = follower.state_records().collect();
        assert!(
            matches!(&records[..], [Record::Upsert(state)] if state.expiry == Expiry::Never),
            "{records:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_applied_heap_deadline_wakes_the_sweeper() {
        let epoch = Instant::now();
        let registry = member(epoch);
        create(&registry, "a", 60, 3, epoch);
        let now = epoch + Duration::from_millis(10);
        registry.sweep(now, 1 << 20);
        // The sweeper goes to sleep until the next second's last second begins.
        let wake_at = registry.next_sweep_at();
        assert_eq!(wake_at, epoch + Duration::from_secs(1));
        let logged = registry
            .expire_for(&key("a"), ExpireAt::In(50), None, now)
            .unwrap();
        registry.apply_logged(logged.record.unwrap(), 4, 0, now);
        tokio::time::timeout(Duration::ZERO, registry.earlier_deadline())
            .await
            .expect("woken for the 50 ms deadline");
    }
}
