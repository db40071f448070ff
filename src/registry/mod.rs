//! The registry: every key, its metadata and its deadline, behind one door.
//!
//! This is the only code that touches the timing wheel and the deadline heap, and the only
//! place keys are created, renewed, expired or deleted. Everything else (the HTTP API, the
//! ticker, persistence (`durable.rs`), later replication) goes through [`Registry`]'s methods, each of which
//! takes the current time as an argument instead of reading a clock, so tests drive time.
//!
//! Layout: the store is the shards. A key's hash (computed once per operation) picks its
//! [`Shard`]; each shard holds its keys' entries (each key stored once, inline in its entry, in
//! a slot table), a hash table from key to slot, the wheel and the heap, all behind one
//! `parking_lot::Mutex` (a std-style mutex, not a tokio one: nothing awaits while it is held,
//! and critical sections are a few hundred nanoseconds). A renewal therefore takes one
//! uncontended lock and does O(1) work: one probe, one entry write, at most one bucket push.
//! The sweeper walks the shards one bounded chunk at a time ([`Registry::sweep`]), so a mass
//! expiry never holds a lock for long.
//!
//! Files: this one is the door (`Registry`: hashing a key to its shard, locking it, calling
//! it); `ops` the operation types; `shard` one shard's structures and semantics; `table` the
//! shard's key table; `slots` the slot table entries live in; `sweep` expiring what is due;
//! `listing` the ordered index and the expired log; `services` service-name interning.
//!
//! Semantics are Redis 7's EXPIRE / PEXPIREAT / TTL / PERSIST / DEL, with one addition: a key
//! whose deadline has passed is expired on the spot by whichever operation touches it first
//! (exactly one `expired` event either way).

mod durable;
mod entry_key;
mod expired;
pub mod guard;
mod holding;
mod listing;
mod ops;
mod replicated;
mod services;
mod shard;
mod slots;
mod sweep;
mod table;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use foldhash::fast::RandomState;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

pub use expired::ExpiredRecord;
pub use guard::{GuardConfig, GuardError};
pub use holding::GuardStatus;
pub use listing::ListFilter;
pub use ops::{
    ExpireAt, ExpireCondition, ExpireOutcome, ExpiredView, Heartbeat, HeartbeatOutcome, KeyCounts,
    KeyState, KeyView, RegistryError, ServiceCounts, ServicesOverview,
};
pub use replicated::{generation_of, Logged};
pub use services::{ServiceId, MAX_SERVICES};
pub use shard::CheckpointItem;
pub use sweep::{SweepReport, SWEEP_CHUNK};

use crate::clock::{Clock, Now};
use crate::events::{EventBus, EventReceiver};
use crate::expiry::TimerKind;
use crate::persist::journal::Journal;
use crate::types::{InvalidInput, Key, ServiceName, MAX_TTL_MS};
use guard::Guard;
use services::ServiceTable;
use shard::{EntryView, Shard};
use sweep::SweepState;
use table::KeyHash;

/// Tunables of the registry.
#[derive(Clone, Debug)]
pub struct RegistryConfig {
    /// Longest TTL the wheel holds, in seconds; longer ones go to the heap.
    pub max_ttl_s: u32,
    /// Number of shards (rounded up to a power of two).
    pub shards: usize,
    /// Keep the ordered index that `list` pages through. Only the bare-engine benchmarks turn
    /// it off.
    pub listing: bool,
    /// How long expired keys stay listable.
    pub expired_retention_ms: u64,
    /// How many expired keys stay listable at most (spread evenly over the shards).
    pub expired_max: usize,
    /// Stale wheel elements a shard may hold per key, plus `stale_slack`, before renewals
    /// remove old elements eagerly (see `shard::Shard::unschedule`). A client renewing every
    /// TTL/3 leaves about two per key (each lives until its old deadline); each costs 4 bytes.
    /// Tests set both to 0 to exercise the eager path.
    pub stale_per_key: usize,
    pub stale_slack: usize,
    /// The mass-expiry guard (`--expiry-guard*`).
    pub guard: GuardConfig,
    /// The most keys indexed at once (`--max-keys`): a creation past it is refused.
    pub max_keys: u64,
    /// A cluster member's registry: keys change only by committed log entries (the state
    /// machine's `restore`). Requests may renew a key in memory, nothing else: a change that
    /// needs a record answers [`RegistryError::NeedsLog`], and no key is expired on access.
    pub replicated: bool,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        Self {
            max_ttl_s: 3600,
            shards: (cores * 8).clamp(8, 256),
            listing: true,
            expired_retention_ms: 3_600_000,
            expired_max: 100_000,
            stale_per_key: 4,
            stale_slack: 4096,
            guard: GuardConfig::default(),
            max_keys: 50_000_000,
            replicated: false,
        }
    }
}

/// Everything one shard operation needs besides the shard.
struct Ctx<'a> {
    config: &'a RegistryConfig,
    clock: &'a Clock,
    services: &'a ServiceTable,
    events: &'a EventBus,
    /// Where durable changes are logged; `None` in memory-only mode and during recovery.
    journal: Option<&'a Journal>,
    /// The mass-expiry guard is engaged: due keys are held, not expired.
    holding: bool,
    /// Keys indexed in every shard, against `config.max_keys`.
    keys: &'a AtomicU64,
    /// The registry's key hasher (a shard hashes a key again only to take it out of its table).
    hasher: &'a RandomState,
}

impl Ctx<'_> {
    /// The hash of a key's bytes (an entry's key: `KeyHash::of_bytes`).
    fn hash_bytes(&self, key: &[u8]) -> KeyHash {
        KeyHash::of_bytes(self.hasher, key)
    }

    /// Whether changes that must be logged are refused now (the log cannot be written).
    fn refuses_durable_writes(&self) -> bool {
        self.journal.is_some_and(Journal::is_failing)
    }

    /// Takes room for one more key, unless the registry holds `max_keys` already.
    fn reserve_key(&self) -> Result<(), RegistryError> {
        let max = self.config.max_keys;
        self.keys
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map(drop)
            .map_err(|_| RegistryError::TooManyKeys { max })
    }

    /// Takes room for a key that must be indexed whatever the limit (recovery).
    fn count_key(&self) {
        self.keys.fetch_add(1, Ordering::AcqRel);
    }

    /// `n` keys left the index.
    fn free_keys(&self, n: usize) {
        if n > 0 {
            self.keys.fetch_sub(n as u64, Ordering::AcqRel);
        }
    }
}

/// A shard on its own cache lines, so that two cores locking neighbouring shards do not
/// contend on one line.
#[repr(align(128))]
struct PaddedShard(Mutex<Shard>);

/// The registry. See the module documentation.
pub struct Registry {
    config: RegistryConfig,
    clock: Clock,
    /// Hashes keys: the bits that pick a key's shard and the tag its shard's table probes with
    /// (see `table`).
    hasher: RandomState,
    shards: Box<[PaddedShard]>,
    services: ServiceTable,
    events: EventBus,
    /// Only the ticker sweeps; the mutex makes a second sweeper wait rather than corrupt state.
    sweep_state: Mutex<SweepState>,
    /// The last tick whose buckets were fully processed in every shard.
    swept_through: AtomicU32,
    /// Where durable changes are logged, once attached (after recovery); never in memory-only
    /// mode.
    journal: OnceLock<Arc<Journal>>,
    /// The heap deadline (epoch ms) the ticker sleeps until; an earlier one wakes it.
    heap_wakeup_ms: AtomicU64,
    wakeup: Notify,
    /// The mass-expiry guard's state machine; the sweeper and the operator's calls drive it.
    guard: Mutex<Guard>,
    /// `guard.holding()`, readable without its lock on every operation.
    holding: AtomicBool,
    /// Keys indexed, in every shard (for `--max-keys`; `len` counts under the locks).
    keys: AtomicU64,
}

impl Registry {
    /// A registry whose time starts at `epoch`.
    pub fn new(config: RegistryConfig, epoch: Instant) -> Self {
        Self::with_clock(config, Clock::new(epoch))
    }

    /// A registry on a given clock (tests pin the wall clock this way).
    pub fn with_clock(mut config: RegistryConfig, clock: Clock) -> Self {
        config.shards = config.shards.max(1).next_power_of_two();
        let hasher = RandomState::default();
        let services = ServiceTable::default();
        let events = EventBus::default();
        let expired_per_shard = config.expired_max.div_ceil(config.shards);
        let guard = Mutex::new(Guard::new(config.guard.clone()));
        let keys = AtomicU64::new(0);
        let ctx = Ctx {
            config: &config,
            clock: &clock,
            services: &services,
            events: &events,
            journal: None,
            holding: false,
            keys: &keys,
            hasher: &hasher,
        };
        let shards = (0..config.shards)
            .map(|_| PaddedShard(Mutex::new(Shard::new(&ctx, expired_per_shard))))
            .collect();
        Self {
            config,
            clock,
            hasher,
            shards,
            services,
            events,
            sweep_state: Mutex::new(SweepState::default()),
            journal: OnceLock::new(),
            swept_through: AtomicU32::new(0),
            heap_wakeup_ms: AtomicU64::new(u64::MAX),
            wakeup: Notify::new(),
            guard,
            holding: AtomicBool::new(false),
            keys,
        }
    }

    pub fn config(&self) -> &RegistryConfig {
        &self.config
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// A new subscriber to every event.
    pub fn subscribe(&self) -> EventReceiver {
        self.events.subscribe()
    }

    /// A new subscriber to the events of `kinds` only.
    pub fn subscribe_to(&self, kinds: crate::events::Kinds) -> EventReceiver {
        self.events.subscribe_to(kinds)
    }

    /// Keys currently indexed (alive, or due and not yet swept).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.0.lock().len()).sum()
    }

    /// Keys gone that the listing still names, waiting for its next pass (a mass expiry's:
    /// see `shard::UNLIST_BATCH`). For tests.
    pub fn keys_leaving_listing(&self) -> usize {
        (self.shards.iter())
            .map(|shard| shard.0.lock().keys_leaving_listing())
            .sum()
    }

    /// Alive keys by timer: `(wheel, heap)`; the others have no TTL.
    pub fn timer_counts(&self) -> (usize, usize) {
        self.shards.iter().fold((0, 0), |(wheel, heap), shard| {
            let (shard_wheel, shard_heap) = shard.0.lock().timer_counts();
            (wheel + shard_wheel, heap + shard_heap)
        })
    }

    /// Heartbeats applied since start (a batch counts each item).
    pub fn heartbeats_total(&self) -> u64 {
        self.shards
            .iter()
            .map(|shard| shard.0.lock().heartbeats())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Registers or renews a key.
    pub fn heartbeat(
        &self,
        heartbeat: Heartbeat,
        now: Instant,
    ) -> Result<HeartbeatOutcome, RegistryError> {
        // The pin keeps the service's id valid until the key that takes it is stored.
        let (service, _pin) = match &heartbeat.service {
            Some(name) => {
                let (id, pin) = self.pin_service(name)?;
                (Some(id), Some(pin))
            }
            None => (None, None),
        };
        let ttl_ms = heartbeat.ttl.as_millis();
        let now = self.clock.at(now);
        let (shard, hash) = self.shard_of(&heartbeat.key);
        let (renewal, lsn) = {
            let mut shard = shard.lock();
            // The context (the guard's holding flag) is read under the shard's lock: see
            // `with_shard`.
            let ctx = self.ctx();
            let key = (&heartbeat.key, hash);
            let renewal = shard.heartbeat(key, ttl_ms, service, heartbeat.meta, &ctx, now);
            // A heartbeat on a due key expires it first: publish that event.
            let lsn = shard.flush_events(&ctx);
            (renewal?, lsn)
        };
        if renewal.timer == TimerKind::Heap {
            self.wake_for_heap_deadline(renewal.deadline_ms);
        }
        Ok(HeartbeatOutcome {
            key: heartbeat.key,
            created: renewal.created,
            service: match heartbeat.service {
                Some(name) => Some(name),
                None => self.services.name(renewal.service),
            },
            ttl_ms,
            expires_in_ms: (renewal.deadline_ms - now.ms).min(ttl_ms),
            expires_at_ms: self.clock.unix_ms(renewal.deadline_ms),
            timer: renewal.timer,
            lsn,
        })
    }

    /// Warms the cache for heartbeats on `keys` that are about to be applied one by one (a
    /// batch's next items), and changes nothing.
    ///
    /// Why: applying a batch of renewals over a registry larger than the cache spends most of
    /// its time waiting for memory, the table's group, its element and the entry, three loads
    /// that each wait for the one before. One heartbeat at a time, under its own shard lock
    /// (a locked instruction that the processor does not run later loads ahead of), those
    /// waits add up one after the other. Here the keys are grouped by shard and read under one
    /// lock per shard, so the processor overlaps the loads of different keys; the heartbeats
    /// that follow, each still applied on its own and in the batch's order, find their memory
    /// in the cache. A shard that another thread holds is skipped, not waited for: this is
    /// only a hint.
    pub fn warm<'a>(&self, keys: impl Iterator<Item = &'a str>) {
        let shard_mask = self.shards.len() - 1;
        let mut hashes: Vec<(usize, KeyHash)> = keys
            .map(|key| KeyHash::of_str(&self.hasher, key))
            .map(|hash| (hash.shard_bits() & shard_mask, hash))
            .collect();
        hashes.sort_unstable_by_key(|&(shard, _)| shard);
        let (mut read, mut found) = (0u64, Vec::with_capacity(hashes.len()));
        for group in hashes.chunk_by(|a, b| a.0 == b.0) {
            let Some(shard) = self.shards[group[0].0].0.try_lock() else {
                continue;
            };
            read ^= shard.warm(group.iter().map(|&(_, hash)| hash), &mut found);
        }
        std::hint::black_box(read);
    }

    /// In a cluster member, every change but a renewal is a log entry.
    fn refuse_if_replicated(&self) -> Result<(), RegistryError> {
        if self.config.replicated {
            return Err(RegistryError::NeedsLog);
        }
        Ok(())
    }

    /// The alive key, if any.
    pub fn get(&self, key: &Key, now: Instant) -> Option<KeyView> {
        let now = self.clock.at(now);
        let view = self.with_shard(key, |shard, hash, ctx| shard.view((key, hash), ctx, now))?;
        Some(self.display(view, now))
    }

    /// TTL / PTTL.
    pub fn state(&self, key: &Key, now: Instant) -> KeyState {
        let now = self.clock.at(now);
        self.with_shard(key, |shard, hash, ctx| shard.state((key, hash), ctx, now))
    }

    /// PERSIST: `None` when the key is missing, else whether a TTL was removed.
    pub fn persist(&self, key: &Key, now: Instant) -> Result<Option<bool>, RegistryError> {
        self.refuse_if_replicated()?;
        let now = self.clock.at(now);
        self.with_shard(key, |shard, hash, ctx| shard.persist((key, hash), ctx, now))
    }

    /// DEL: whether the key existed. Publishes a `deleted` event.
    pub fn delete(&self, key: &Key, now: Instant) -> Result<bool, RegistryError> {
        self.refuse_if_replicated()?;
        let now = self.clock.at(now);
        self.with_shard(key, |shard, hash, ctx| shard.delete((key, hash), ctx, now))
    }

    /// EXPIRE / PEXPIRE / PEXPIREAT with an optional condition.
    pub fn expire(
        &self,
        key: &Key,
        at: ExpireAt,
        condition: Option<ExpireCondition>,
        now: Instant,
    ) -> Result<ExpireOutcome, RegistryError> {
        self.refuse_if_replicated()?;
        let now = self.clock.at(now);
        let (target_ms, ttl_ms) = self.expire_target(at, now)?;
        let absolute = matches!(at, ExpireAt::AtUnixMs(_));
        let outcome = self.with_shard(key, |shard, hash, ctx| {
            shard.expire(
                (key, hash),
                target_ms,
                ttl_ms,
                absolute,
                condition,
                ctx,
                now,
            )
        })?;
        if let ExpireOutcome::Applied { .. } = outcome {
            self.wake_for_heap_deadline(target_ms as u64);
            if absolute {
                // What is left, rounded down (`ttl_ms`, from `now` rounded down, picks the
                // timer): never more than the instant asked for minus the wall clock.
                return Ok(ExpireOutcome::Applied {
                    ttl_ms: now.ms_left(target_ms as u64),
                });
            }
        }
        Ok(outcome)
    }

    /// An EXPIRE's new deadline in epoch ms (negative: before the epoch; at or before `now`:
    /// the key is deleted) and the TTL it amounts to (0 when not in the future), which picks
    /// the timer; refused past the longest TTL.
    fn expire_target(&self, at: ExpireAt, now: Now) -> Result<(i64, u64), RegistryError> {
        let now_ms = now.ms as i64;
        let (target_ms, ttl_ms) = match at {
            ExpireAt::In(ms) if ms > 0 => (now.deadline_ms(ms as u64) as i64, ms),
            ExpireAt::In(ms) => (now_ms.saturating_add(ms), ms),
            ExpireAt::AtUnixMs(unix_ms) => {
                let target_ms = self.clock.ms_from_unix(unix_ms);
                (target_ms, target_ms.saturating_sub(now_ms))
            }
        };
        if ttl_ms > MAX_TTL_MS as i64 {
            return Err(InvalidInput::Ttl.into());
        }
        Ok((target_ms, ttl_ms.max(0) as u64))
    }

    /// One page of alive keys matching `filter`, in key order, and whether more follow.
    pub fn list_alive(
        &self,
        filter: &ListFilter,
        limit: usize,
        now: Instant,
    ) -> (Vec<KeyView>, bool) {
        let now = self.clock.at(now);
        let views = self.merge_pages(
            limit,
            |shard| shard.list_alive(filter, limit + 1, now, self.config.replicated),
            |view| &view.key,
        );
        let more = views.len() > limit;
        let page = views
            .into_iter()
            .take(limit)
            .map(|view| self.display(view, now))
            .collect();
        (page, more)
    }

    /// One page of recently expired keys matching `filter`, in key order, and whether more follow.
    pub fn list_expired(&self, filter: &ListFilter, limit: usize) -> (Vec<ExpiredView>, bool) {
        let records = self.merge_pages(
            limit,
            |shard| shard.list_expired(filter, limit + 1),
            |(key, _)| key,
        );
        let more = records.len() > limit;
        let page = records
            .into_iter()
            .take(limit)
            .map(|(key, record)| ExpiredView {
                key,
                service: self.services.name(record.service),
                meta: record.meta,
                last_heartbeat_at_ms: record.last_heartbeat_unix_ms,
                expired_at_ms: record.expired_unix_ms,
            })
            .collect();
        (page, more)
    }

    /// Service names interned now (at most `MAX_SERVICES` in use; unused ones are freed when
    /// room is needed).
    pub fn service_names(&self) -> usize {
        self.services.len()
    }

    /// The id of a service name, if it was ever used (a list filter on an unknown service is
    /// simply empty).
    pub fn service_id(&self, name: &ServiceName) -> Option<ServiceId> {
        self.services.lookup(name)
    }

    /// Alive and recently expired counts for every service that has either, and for the keys
    /// without a service.
    pub fn service_counts(&self) -> ServicesOverview {
        // One pass over the shards (one lock each), whatever the number of services.
        let (mut alive, mut expired) = (Vec::new(), Vec::new());
        for shard in self.shards.iter() {
            shard.0.lock().add_counts(&mut alive, &mut expired);
        }
        let count = |counts: &[u64], id: ServiceId| counts.get(id.index()).copied().unwrap_or(0);
        let mut counts: Vec<ServiceCounts> = self
            .services
            .all()
            .into_iter()
            .map(|(id, service)| ServiceCounts {
                service,
                alive: count(&alive, id),
                expired: count(&expired, id),
            })
            .filter(|counts| counts.alive + counts.expired > 0)
            .collect();
        counts.sort_by(|a, b| a.service.cmp(&b.service));
        ServicesOverview {
            services: counts,
            without_service: KeyCounts {
                alive: count(&alive, ServiceId::NONE),
                expired: count(&expired, ServiceId::NONE),
            },
        }
    }

    /// The id of a service name, interned if new, pinned until the pin is dropped. When the
    /// table is full, names no key uses any more are freed first.
    fn pin_service(
        &self,
        name: &ServiceName,
    ) -> Result<(ServiceId, services::Pin<'_>), RegistryError> {
        self.services
            .pin(name, || self.services_in_use())
            .map_err(|_| RegistryError::TooManyServices)
    }

    /// `in_use[id]`: whether any alive, held or listed-expired key has service `id`.
    fn services_in_use(&self) -> Vec<bool> {
        let (mut alive, mut expired) = (Vec::new(), Vec::new());
        for shard in self.shards.iter() {
            shard.0.lock().add_counts(&mut alive, &mut expired);
        }
        let len = alive.len().max(expired.len());
        (0..len)
            .map(|id| {
                alive.get(id).copied().unwrap_or(0) + expired.get(id).copied().unwrap_or(0) > 0
            })
            .collect()
    }

    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            config: &self.config,
            clock: &self.clock,
            services: &self.services,
            events: &self.events,
            journal: self.journal.get().map(|journal| &**journal),
            holding: self.holding.load(Ordering::Relaxed),
            keys: &self.keys,
            hasher: &self.hasher,
        }
    }

    /// The shard of `key`, and the key's hash (its table probes with it).
    fn shard_of(&self, key: &Key) -> (&Mutex<Shard>, KeyHash) {
        let hash = KeyHash::of(&self.hasher, key);
        let shard_idx = hash.shard_bits() & (self.shards.len() - 1);
        (&self.shards[shard_idx].0, hash)
    }

    fn with_shard<T>(&self, key: &Key, op: impl FnOnce(&mut Shard, KeyHash, &Ctx<'_>) -> T) -> T {
        let (shard, hash) = self.shard_of(key);
        let mut shard = shard.lock();
        // The context is read under the shard's lock. An operator's release clears the holding
        // flag before it drains the shards, one lock at a time: read before the lock, the flag
        // could still say "hold" after this shard was drained, and the key held then would stay
        // held in an armed guard until the next engagement. Read under it, either this shard is
        // not drained yet (the drain releases what this holds) or the flag is already clear.
        let ctx = self.ctx();
        let result = op(&mut shard, hash, &ctx);
        shard.flush_events(&ctx);
        result
    }

    /// Collects up to `limit + 1` items per shard (locking one shard at a time) and merges them
    /// in key order.
    fn merge_pages<T>(
        &self,
        limit: usize,
        page_of: impl Fn(&mut Shard) -> Vec<T>,
        key_of: impl Fn(&T) -> &Key,
    ) -> Vec<T> {
        let mut items: Vec<T> = self
            .shards
            .iter()
            .flat_map(|shard| page_of(&mut shard.0.lock()))
            .collect();
        items.sort_unstable_by(|a, b| key_of(a).cmp(key_of(b)));
        items.truncate(limit + 1);
        items
    }

    fn display(&self, view: EntryView, now: Now) -> KeyView {
        KeyView {
            key: view.key,
            service: self.services.name(view.service),
            meta: view.meta,
            ttl_ms: view.ttl_ms,
            expires_in_ms: view
                .deadline_ms
                .zip(view.ttl_ms)
                .map(|(deadline_ms, ttl_ms)| now.ms_left(deadline_ms).min(ttl_ms)),
            expires_at_ms: view
                .deadline_ms
                .map(|deadline_ms| self.clock.unix_ms(deadline_ms)),
            registered_at_ms: view.registered_unix_ms,
            last_heartbeat_at_ms: view.last_heartbeat_unix_ms,
            timer: view.timer,
            held: view.held,
        }
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("config", &self.config)
            .field("swept_through", &self.swept_through)
            .finish_non_exhaustive()
    }
}
