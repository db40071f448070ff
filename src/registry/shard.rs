//! One shard of the registry: a share of the keys with their entries, the table that finds
//! them, the wheel and the heap, all behind the one lock the caller holds. The caller hashes a
//! key once (`table::KeyHash`): the hash picked this shard and probes its table.
//!
//! Keeping a key's entry and its timer under the same lock is what makes a renewal one short
//! critical section on this shard, and what lets the sweeper trust the entries: an element it
//! takes from a detached bucket is expired only if that slot's entry still says it is scheduled
//! at that tick and position. The sweeper hands a detached bucket's elements over to the last
//! second by the deadline each carries, without reading the entries; a key keeps its timer
//! (tick, position) until its element comes due or goes stale.
//!
//! Invariants, all checked by [`Shard::check_invariants`] (the model and concurrency tests run
//! it after every step, through `Registry::check_invariants`):
//! - the key table holds exactly one element per entry, and finds each entry's key at the
//!   entry's slot (`table::KeyTable::check_invariants`);
//! - an entry's [`TimerRef`] says where its deadline lives: a wheel tick and its position in that
//!   bucket (once the bucket is detached: in its unprocessed part, or handed over to the last
//!   second with that position), the heap, or nowhere (persistent); a slot is current in at
//!   most one wheel bucket and at most once in the heap; a current wheel element carries its
//!   key's deadline (see `expiry::wheel::Element`);
//! - a bucket's element whose entry is gone, or is scheduled at another tick or position, is
//!   stale and skipped by the sweeper; `n_stale` counts them (see `Shard::unschedule`); an
//!   element the wheel has marked stale is one;
//! - `ordered` holds exactly the alive keys (unless listing is off, or deferred during a
//!   recovery), and the ids of `unlisted_later`, which `slots` holds unused until the listing
//!   lets go of them; `alive_by_service[s]` counts the alive keys per service;
//! - `n_wheel` counts the entries on the wheel, `heap` holds exactly the heap entries at their
//!   deadlines, and persistent entries have no deadline;
//! - no alive key is in the expired log; no event is pending outside an operation.

use std::collections::HashMap;

use super::entry_key::EntryKey;
use super::expired::{ExpiredLog, ExpiredRecord};
use super::listing::{ListFilter, OrderedIndex, SlotSet};
use super::services::ServiceId;
use super::slots::Slots;
use super::table::{KeyHash, KeyTable};
use super::{Ctx, ExpireCondition, ExpireOutcome, KeyState, RegistryError};
use crate::clock::Now;
use crate::events::{Event, EventKind};
use crate::expiry::heap::DeadlineHeap;
use crate::expiry::last_second::{HandedOver, LastSecond};
use crate::expiry::wheel::{Element, SlotId, Tick, TimingWheel};
use crate::expiry::TimerKind;
use crate::persist::journal::Lsn;
use crate::persist::record::{ExpiredState, Expiry, KeyState as DurableKey, Record};
use crate::types::{Key, Meta};
use foldhash::fast::RandomState;

mod replicated;
mod times;

use times::Times;

pub use replicated::CheckpointItem;

/// A key and its hash, as the registry computed them once for the operation.
pub(super) type Keyed<'a> = (&'a Key, KeyHash);

/// `deadline_ms` of a key without a TTL.
pub(super) const NO_DEADLINE: u64 = u64::MAX;

/// Where a key's deadline lives, packed in 8 bytes: a wheel tick and the key's position in that
/// tick's bucket, or a sentinel tick for "heap" or "none".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TimerRef {
    tick: Tick,
    pos: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timer {
    Persistent,
    Heap,
    Wheel {
        tick: Tick,
        pos: u32,
    },
    /// Due, and held by the mass-expiry guard at `pos` of the shard's held list.
    Held {
        pos: u32,
    },
    /// Cluster mode: due on the leader, at `pos` of the shard's expiring list, its expiry to be
    /// proposed (or in flight); it leaves only when the expiry entry is applied (`replicated`).
    Expiring {
        pos: u32,
    },
}

impl TimerRef {
    const PERSISTENT: Self = Self {
        tick: Tick::MAX,
        pos: 0,
    };
    const HEAP: Self = Self {
        tick: Tick::MAX - 1,
        pos: 0,
    };
    /// The tick of a held key (its `pos` is its place in the held list).
    const HELD_TICK: Tick = Tick::MAX - 2;
    /// The tick of a key whose expiry is to be proposed (its `pos` is its place in the
    /// expiring list).
    const EXPIRING_TICK: Tick = Tick::MAX - 3;

    fn held(pos: u32) -> Self {
        Self {
            tick: Self::HELD_TICK,
            pos,
        }
    }

    fn expiring(pos: u32) -> Self {
        Self {
            tick: Self::EXPIRING_TICK,
            pos,
        }
    }

    fn wheel(tick: Tick, pos: u32) -> Self {
        debug_assert!(
            tick < Self::EXPIRING_TICK,
            "tick {tick} collides with a sentinel"
        );
        Self { tick, pos }
    }

    fn get(self) -> Timer {
        match self {
            Self::PERSISTENT => Timer::Persistent,
            Self::HEAP => Timer::Heap,
            Self {
                tick: Self::HELD_TICK,
                pos,
            } => Timer::Held { pos },
            Self {
                tick: Self::EXPIRING_TICK,
                pos,
            } => Timer::Expiring { pos },
            Self { tick, pos } => Timer::Wheel { tick, pos },
        }
    }
}

/// One registered key. 64 bytes and aligned to 64, so one cache line, of which the key and
/// its metadata take 32, a key of up to 30 bytes inline (checked by tests; see `entry_key`
/// and `times`).
#[derive(Debug)]
#[repr(align(64))]
struct Entry {
    /// The key, and its metadata if it has any.
    key: EntryKey,
    /// - the deadline: epoch ms, `NO_DEADLINE` when persistent. The exact deadline: TTL
    ///   answers use it, never the bucket;
    /// - the TTL last given (by a heartbeat or an EXPIRE); meaningless when persistent;
    /// - the last heartbeat: Unix ms (display only; Unix rather than epoch time because a key
    ///   restored from the persistence log may predate this process).
    times: Times,
    /// Registration time, Unix seconds (good until 2106), and in [`Entry::flags`] the
    /// milliseconds past them: split so that, with the 2-byte service id, they fill 8 bytes (a
    /// `u64` of ms would make the entry 80 bytes). Kept to the millisecond so that
    /// `registered_at` is never before the request that created it.
    registered_unix_s: u32,
    /// Low 10 bits: the registration's milliseconds; [`ABSOLUTE`] and [`RESTORED`] above.
    flags: u16,
    service: ServiceId,
    timer: TimerRef,
}

/// `Entry::flags`: the deadline is an instant a client gave (PEXPIREAT), kept across a restart
/// as it is; without it the deadline is relative (restart + TTL after a restart).
const ABSOLUTE: u16 = 1 << 15;
/// `Entry::flags`: restored from the persistence log at start-up and not renewed since; its
/// expiry event says so.
const RESTORED: u16 = 1 << 14;
/// `Entry::flags`, cluster mode: renewed since the leader's last checkpoint (the slot is in
/// the shard's `renewed` list).
const RENEWED: u16 = 1 << 13;
/// `Entry::flags`: the registration's milliseconds.
const SUBSEC_MS: u16 = (1 << 10) - 1;

impl Entry {
    /// Epoch ms, or `NO_DEADLINE`.
    fn deadline_ms(&self) -> u64 {
        self.times.deadline_ms()
    }

    fn set_deadline_ms(&mut self, deadline_ms: u64) {
        self.times.set_deadline_ms(deadline_ms);
    }

    fn ttl_ms(&self) -> u64 {
        self.times.ttl_ms()
    }

    fn set_ttl_ms(&mut self, ttl_ms: u64) {
        self.times.set_ttl_ms(ttl_ms);
    }

    fn last_heartbeat_unix_ms(&self) -> u64 {
        self.times.last_heartbeat_unix_ms()
    }

    fn set_last_heartbeat_unix_ms(&mut self, unix_ms: u64) {
        self.times.set_last_heartbeat_unix_ms(unix_ms);
    }

    /// Registration time in Unix ms.
    fn registered_unix_ms(&self) -> u64 {
        u64::from(self.registered_unix_s) * 1000 + u64::from(self.flags & SUBSEC_MS)
    }

    /// `flags` for a registration at `unix_ms`, with no flag set.
    fn registered_at(unix_ms: u64) -> (u32, u16) {
        ((unix_ms / 1000) as u32, (unix_ms % 1000) as u16)
    }

    /// How the deadline survives a restart (see `persist::record::Expiry`).
    fn expiry(&self, ctx: &Ctx<'_>) -> Expiry {
        match self.deadline() {
            None => Expiry::Never,
            Some(deadline_ms) if self.flags & ABSOLUTE != 0 => Expiry::Absolute {
                at_unix_ms: ctx.clock.unix_ms(deadline_ms),
            },
            Some(_) => Expiry::Relative {
                ttl_ms: self.ttl_ms(),
            },
        }
    }

    fn ttl(&self) -> Option<u64> {
        (self.deadline_ms() != NO_DEADLINE).then_some(self.ttl_ms())
    }

    fn deadline(&self) -> Option<u64> {
        (self.deadline_ms() != NO_DEADLINE).then_some(self.deadline_ms())
    }

    /// Whole milliseconds left at `now`, rounded down (`Now::ms_left`): never more than what
    /// really is left, so never more than the TTL, nor than an absolute deadline's instant
    /// minus the wall clock.
    fn remaining(&self, now: Now) -> Option<u64> {
        self.deadline()
            .map(|deadline_ms| now.ms_left(deadline_ms).min(self.ttl_ms()))
    }
}

/// A snapshot of an alive key: the deadline in epoch ms, which `registry` turns into display
/// times, the rest in Unix ms.
#[derive(Clone, Debug)]
pub(super) struct EntryView {
    pub key: Key,
    pub service: ServiceId,
    pub meta: Option<Meta>,
    pub ttl_ms: Option<u64>,
    pub deadline_ms: Option<u64>,
    pub registered_unix_ms: u64,
    pub last_heartbeat_unix_ms: u64,
    pub timer: Option<TimerKind>,
    /// Due, and held by the mass-expiry guard.
    pub held: bool,
}

/// What a heartbeat did, in epoch ms.
#[derive(Clone, Copy, Debug)]
pub(super) struct Renewal {
    pub created: bool,
    pub service: ServiceId,
    pub deadline_ms: u64,
    pub timer: TimerKind,
}

/// A share of the registry's keys. See the module documentation for its invariants.
#[derive(Debug)]
pub(super) struct Shard {
    /// The entries of this shard's keys, each key stored once, inline in its entry.
    slots: Slots<Entry>,
    /// Every key of `slots`, to its slot (see `table`).
    table: KeyTable,
    wheel: TimingWheel,
    heap: DeadlineHeap,
    /// Wheel elements that are no longer their slot's current one: left behind by a renewal,
    /// removal or move, and dropped by the sweeper when their bucket comes due. Bounded by
    /// `stale_per_key` per key plus `stale_slack` (see `unschedule`).
    n_stale: usize,
    /// Keys whose timer is the wheel (for metrics; the heap knows its own size).
    n_wheel: usize,
    /// Heartbeats applied, counted here under the lock already held: a shared atomic would
    /// bounce its cache line between cores on every heartbeat.
    heartbeats: u64,
    /// Stale elements allowed per key before renewals remove old elements eagerly.
    stale_per_key: usize,
    /// Stale elements this shard may hold regardless of its size.
    stale_slack: usize,
    /// Alive keys per service id (index 0: keys without a service).
    alive_by_service: Vec<u32>,
    /// Events of the operation in progress, published as one batch by [`Shard::flush_events`]
    /// before the shard's lock is released.
    pending_events: Vec<Event>,
    /// Log records of the operation in progress, appended by [`Shard::flush_events`] (only
    /// built when a journal is attached).
    pending_records: Vec<Record>,
    /// Keys that are due and held by the mass-expiry guard (`Timer::Held` records the place).
    held: Vec<SlotId>,
    /// Cluster mode: keys due on the leader whose expiry is to be proposed
    /// (`Timer::Expiring` records the place).
    expiring: Vec<SlotId>,
    /// Cluster mode: slots renewed since the last checkpoint (flag `RENEWED`; a slot freed or
    /// reused since is skipped by its flag).
    renewed: Vec<SlotId>,
    /// Cluster mode: each slot's generation, the low 32 bits of the log index of the entry
    /// that last wrote the key (empty on a single node).
    generations: Vec<u32>,
    /// Cluster mode: the log number the events of the record being applied get
    /// (`Event::log_id`); `None` outside an apply.
    log_stamp: Option<u64>,
    /// The detached tick's keys in their last second, by millisecond.
    last: LastSecond<HandedOver>,
    /// Reused buffer for the due elements of the last second.
    scratch: Vec<HandedOver>,
    /// Alive keys in order; `None` when listing is disabled (benchmarks of the bare engine)
    /// or deferred.
    ordered: Option<OrderedIndex>,
    /// Listing is on but not kept until [`Shard::rebuild_listing`] (recovery).
    listing_deferred: bool,
    /// Between [`Shard::begin_mass_removal`] and its end, when the step takes out a good part
    /// of the keys: the keys removed join `unlisted_later`.
    unlisting_in_bulk: bool,
    /// Keys gone from every structure but `ordered` (a mass expiry's), which
    /// [`Shard::flush_unlisting`] takes out of it in one pass, with their services; their ids
    /// are held in `slots` until then. See [`UNLIST_IN_ONE_PASS`].
    unlisted_later: SlotSet,
    unlisted_services: Vec<ServiceId>,
    /// The tick in whose last second a search of the listing (a registration, a page, a change
    /// of service) found keys waiting to leave it, and so paid a pass for them: for the rest of
    /// that second, a step no longer leaves its keys to a pass for being part of a mass expiry
    /// (see [`UNLIST_MASS_EXPIRY`]).
    searched_in_second: Option<Tick>,
    /// The detached tick's keys still to leave its second: its bucket's current elements when
    /// it was detached (the wheel counts them), less those expired or filed again since. The
    /// listing's per-second rule reads it: the bucket also holds the stale elements renewals
    /// left, which the hand-over passes on unread, and a renewing fleet's stale elements are
    /// not a mass expiry. An upper bound (a key renewed in its last second is still counted).
    due_in_second: usize,
    /// Between [`Shard::begin_mass_removal`] and its end: the key table's removals wait in
    /// `table_removals`.
    removing_in_bulk: bool,
    /// Between [`Shard::begin_mass_removal`] and its end: later steps will remove more of the
    /// same expiry, so the listing's pass waits for them.
    expiry_continues: bool,
    table_removals: Vec<(KeyHash, SlotId)>,
    expired: ExpiredLog,
}

/// A sweep step that removes at least 1/`UNLIST_IN_ONE_PASS` of a shard's keys takes them out
/// of the listing in one pass over it (~1 ns an id listed, sequential) instead of a search for
/// each (~10 keys read at random, ~1 us): the pass costs less from about 1/1000 on, so at
/// 1/512 it is the cheaper by half or more.
///
/// The pass waits until the keys waiting for it are 1/[`UNLIST_BATCH`] of those alive, and
/// the expiry they are part of has had its last step in the shard (or something must search
/// the listing: a registration, a page): a mass expiry's keys fall due over a second or more,
/// a sweep step takes ~1 % of them, and a pass per step read the whole listing ~100 times (16 %
/// of the running service's sweep time, measured). A pass at each eighth still read it ~8 times
/// over as the keys alive dwindled (14 % of the service's sweep, `perf`); the last step's pass
/// reads it once.
const UNLIST_IN_ONE_PASS: usize = 512;

/// See [`UNLIST_IN_ONE_PASS`].
const UNLIST_BATCH: usize = 8;

/// A step of an expiry that removes at least 1/`UNLIST_MASS_EXPIRY` of a shard's keys in all
/// (the keys of the second being expired, of which a ticker on time takes a millisecond's
/// share per step) leaves the listing to the pass too, however few the step takes itself:
/// searching for each key was a third of a 1M-key expiry spread over its second
/// (`evict/1M/one-tick/spread-on-time`, BENCHMARKS.md). Not at 1/`UNLIST_IN_ONE_PASS`: a
/// fleet whose keys expire and register steadily would then defer every expiry, and each
/// registration (which must search the listing) would pay a pass for the few keys waiting.
/// For the same reason a second in which a search paid a pass goes back to the steps' own
/// sizes for the rest of it: passes forced by searches cost at most one per shard and second
/// more than searching for each key.
const UNLIST_MASS_EXPIRY: usize = 64;

impl Shard {
    pub fn new(ctx: &Ctx<'_>, expired_max: usize) -> Self {
        Self {
            slots: Slots::default(),
            table: KeyTable::default(),
            wheel: TimingWheel::new(ctx.config.max_ttl_s, 0),
            heap: DeadlineHeap::new(),
            n_stale: 0,
            n_wheel: 0,
            heartbeats: 0,
            stale_per_key: ctx.config.stale_per_key,
            stale_slack: ctx.config.stale_slack,
            alive_by_service: Vec::new(),
            pending_events: Vec::new(),
            pending_records: Vec::new(),
            held: Vec::new(),
            expiring: Vec::new(),
            renewed: Vec::new(),
            generations: Vec::new(),
            log_stamp: None,
            last: LastSecond::default(),
            scratch: Vec::new(),
            ordered: ctx.config.listing.then(OrderedIndex::default),
            listing_deferred: false,
            unlisting_in_bulk: false,
            expiry_continues: false,
            searched_in_second: None,
            due_in_second: 0,
            unlisted_later: SlotSet::default(),
            unlisted_services: Vec::new(),
            removing_in_bulk: false,
            table_removals: Vec::new(),
            expired: ExpiredLog::new(ctx.config.expired_retention_ms, expired_max),
        }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// See `Registry::keys_leaving_listing`.
    pub fn keys_leaving_listing(&self) -> usize {
        self.unlisted_later.len()
    }

    /// Keys on the wheel and on the heap (the rest have no TTL).
    pub fn timer_counts(&self) -> (usize, usize) {
        (self.n_wheel, self.heap.len())
    }

    /// Heartbeats applied so far.
    pub fn heartbeats(&self) -> u64 {
        self.heartbeats
    }

    /// Registers or renews `key` for `ttl_ms`. `service`: `None` keeps the stored one. A renewal
    /// that changes nothing but the deadline writes no log record; anything else writes the
    /// key's whole state, and is refused, changing nothing, while the log cannot be written.
    pub fn heartbeat(
        &mut self,
        key: Keyed<'_>,
        ttl_ms: u64,
        service: Option<ServiceId>,
        meta: Option<Meta>,
        ctx: &Ctx<'_>,
        now: Now,
    ) -> Result<Renewal, RegistryError> {
        let now_ms = now.ms;
        let found = self.find_alive(key, ctx, now_ms);
        let durable_change = found.is_none_or(|slot| {
            let entry = self.slots.entry(slot);
            // An expiry in flight: only the log orders a renewal against it.
            matches!(entry.timer.get(), Timer::Expiring { .. })
                || entry.ttl() != Some(ttl_ms)
                || entry.flags & ABSOLUTE != 0
                || service.is_some_and(|service| service != entry.service)
                || meta
                    .as_ref()
                    .is_some_and(|meta| entry.key.meta() != Some(meta))
        });
        if durable_change && ctx.config.replicated {
            return Err(RegistryError::NeedsLog);
        }
        if durable_change && ctx.refuses_durable_writes() {
            return Err(RegistryError::StorageUnavailable);
        }
        if found.is_none() {
            ctx.reserve_key()?;
        }
        self.heartbeats += 1;
        let mut now_unix_ms = ctx.clock.unix_ms(now_ms);
        let mut deadline_ms = now.deadline_ms(ttl_ms);
        let timer = TimerKind::for_ttl(ttl_ms, ctx.config.max_ttl_s);
        let (slot, created) = match found {
            Some(slot) => {
                if let Some(service) = service {
                    self.change_service(slot, service);
                }
                let entry = self.slots.entry_mut(slot);
                if !durable_change {
                    // A renewal never moves the deadline back: one applied after a newer
                    // heartbeat of the key (a batch applied at the instant it arrived, after a
                    // single sent later) is older news. With the TTL unchanged, the deadline
                    // there was set by a heartbeat's `now + ttl` (or the restart's).
                    deadline_ms = deadline_ms.max(entry.deadline_ms());
                    now_unix_ms = now_unix_ms.max(entry.last_heartbeat_unix_ms());
                }
                entry.set_deadline_ms(deadline_ms);
                entry.set_ttl_ms(ttl_ms);
                entry.set_last_heartbeat_unix_ms(now_unix_ms);
                entry.flags &= !(ABSOLUTE | RESTORED);
                if meta.is_some() {
                    entry.key.set_meta(meta);
                }
                (slot, false)
            }
            None => {
                let (registered_unix_s, flags) = Entry::registered_at(now_unix_ms);
                let entry = Entry {
                    key: EntryKey::new(key.0, meta),
                    times: Times::new(deadline_ms, ttl_ms, now_unix_ms),
                    registered_unix_s,
                    flags,
                    service: service.unwrap_or(ServiceId::NONE),
                    timer: TimerRef::PERSISTENT,
                };
                (self.insert(key.1, entry), true)
            }
        };
        self.schedule(slot, Some(timer), deadline_ms);
        if created {
            self.registered(slot, ctx, now_ms);
        }
        if durable_change {
            self.record_state(slot, ctx);
        }
        if ctx.config.replicated {
            self.mark_renewed(slot);
        }
        Ok(Renewal {
            created,
            service: self.slots.entry(slot).service,
            deadline_ms,
            timer,
        })
    }

    pub fn view(&mut self, key: Keyed<'_>, ctx: &Ctx<'_>, now: Now) -> Option<EntryView> {
        let slot = self.find_alive(key, ctx, now.ms)?;
        Some(self.view_of(slot))
    }

    pub fn state(&mut self, key: Keyed<'_>, ctx: &Ctx<'_>, now: Now) -> KeyState {
        let now_ms = now.ms;
        match self.find_alive(key, ctx, now_ms) {
            None => KeyState::Missing,
            Some(slot) => match self.slots.entry(slot).remaining(now) {
                None => KeyState::Persistent,
                Some(remaining_ms) => KeyState::ExpiresIn(remaining_ms),
            },
        }
    }

    /// PERSIST: `None` when missing, else whether a TTL was removed.
    pub fn persist(
        &mut self,
        key: Keyed<'_>,
        ctx: &Ctx<'_>,
        now: Now,
    ) -> Result<Option<bool>, RegistryError> {
        let Some(slot) = self.find_alive(key, ctx, now.ms) else {
            return Ok(None);
        };
        if self.slots.entry(slot).deadline().is_none() {
            return Ok(Some(false));
        }
        if ctx.refuses_durable_writes() {
            return Err(RegistryError::StorageUnavailable);
        }
        self.schedule(slot, None, NO_DEADLINE);
        let entry = self.slots.entry_mut(slot);
        entry.set_deadline_ms(NO_DEADLINE);
        entry.flags &= !ABSOLUTE;
        self.record_state(slot, ctx);
        Ok(Some(true))
    }

    pub fn delete(
        &mut self,
        key: Keyed<'_>,
        ctx: &Ctx<'_>,
        now: Now,
    ) -> Result<bool, RegistryError> {
        let now_ms = now.ms;
        let Some(slot) = self.find_alive(key, ctx, now_ms) else {
            return Ok(false);
        };
        if ctx.refuses_durable_writes() {
            return Err(RegistryError::StorageUnavailable);
        }
        self.remove(slot, EventKind::Deleted, ctx, now_ms);
        Ok(true)
    }

    /// EXPIRE / PEXPIREAT with Redis 7 semantics; `target_ms` is the new deadline in epoch ms
    /// (negative: before the epoch), `ttl_ms` the TTL it amounts to (it picks the timer), and
    /// `absolute` says the client gave an instant (kept as it is across a restart).
    #[allow(clippy::too_many_arguments)] // one call site; a struct would only rename them
    pub fn expire(
        &mut self,
        key: Keyed<'_>,
        target_ms: i64,
        ttl_ms: u64,
        absolute: bool,
        condition: Option<ExpireCondition>,
        ctx: &Ctx<'_>,
        now: Now,
    ) -> Result<ExpireOutcome, RegistryError> {
        let now_ms = now.ms;
        let slot = match self.expire_allowed(key, target_ms, condition, ctx, now) {
            Ok(slot) => slot,
            Err(answer) => return Ok(answer),
        };
        if ctx.refuses_durable_writes() {
            return Err(RegistryError::StorageUnavailable);
        }
        if target_ms <= now_ms as i64 {
            self.remove(slot, EventKind::Deleted, ctx, now_ms);
            return Ok(ExpireOutcome::Deleted);
        }
        let deadline_ms = target_ms as u64;
        self.schedule(
            slot,
            Some(TimerKind::for_ttl(ttl_ms, ctx.config.max_ttl_s)),
            deadline_ms,
        );
        let entry = self.slots.entry_mut(slot);
        entry.set_deadline_ms(deadline_ms);
        entry.set_ttl_ms(ttl_ms);
        entry.flags = (entry.flags & !(ABSOLUTE | RESTORED)) | if absolute { ABSOLUTE } else { 0 };
        self.record_state(slot, ctx);
        Ok(ExpireOutcome::Applied { ttl_ms })
    }

    /// EXPIRE's lookup and condition, which change nothing (but expire a due key on a single
    /// node, as any access does): the key's slot when the change goes ahead, else the answer
    /// (missing, or the condition failed, with the TTL left unchanged).
    fn expire_allowed(
        &mut self,
        key: Keyed<'_>,
        target_ms: i64,
        condition: Option<ExpireCondition>,
        ctx: &Ctx<'_>,
        now: Now,
    ) -> Result<SlotId, ExpireOutcome> {
        let Some(slot) = self.find_alive(key, ctx, now.ms) else {
            return Err(ExpireOutcome::NotFound);
        };
        let current = self.slots.entry(slot).deadline();
        if !condition.is_none_or(|condition| condition.allows(current, target_ms)) {
            return Err(ExpireOutcome::NotApplied {
                ttl_ms: self.slots.entry(slot).remaining(now),
            });
        }
        Ok(slot)
    }

    /// The last tick whose wheel bucket was detached.
    pub fn wheel_swept_through(&self) -> Tick {
        self.wheel.swept_through()
    }

    /// Detaches the wheel's next bucket in O(1), when the second its deadlines fall in begins;
    /// the sweeper then hands its elements over with [`Self::hand_over`].
    pub fn detach_next_bucket(&mut self) -> (Tick, Vec<Element>) {
        debug_assert!(self.last.is_empty(), "the previous tick is not done");
        self.due_in_second = self.wheel.live_count(self.wheel.swept_through() + 1) as usize;
        let (tick, elements) = self.wheel.detach_next();
        self.last.begin(tick);
        (tick, elements)
    }

    /// Hands the elements of the detached bucket of `tick` (found at positions `first_pos..`
    /// of it) to the last second's millisecond groups, by the deadline each carries, without
    /// reading the keys: a stale element (of a key renewed, moved to the heap, persisted or
    /// removed since, or of a reused slot) is dropped when its millisecond comes. An element
    /// whose deadline is past the tick (filed at the horizon while the sweeper was behind) or
    /// already due (the sweeper is late) is settled now, by its key: filed again where it
    /// belongs, or expired. Returns how many keys expired.
    pub fn hand_over(
        &mut self,
        tick: Tick,
        elements: &[Element],
        first_pos: usize,
        ctx: &Ctx<'_>,
        now: Now,
    ) -> usize {
        let now_ms = now.ms;
        let tick_end_ms = u64::from(tick) * 1000;
        let mut n_expired = 0;
        // A sweeper that reaches the tick after its second expires each key it hands over.
        let late = tick_end_ms <= now_ms;
        // Not the elements marked stale: a renewing fleet's bucket is mostly those, and taken
        // for removals they could make a late tick's few expiries pass for a mass expiry (a
        // pass over the listing, room for events never sent). Unmarked stale ones still count.
        let removals = if late {
            let marked = self
                .wheel
                .count_marked_stale(tick, first_pos, elements.len());
            elements.len() - marked
        } else {
            0
        };
        self.begin_mass_removal(removals, removals, ctx);
        for (pos, &element) in (first_pos..).zip(elements) {
            let (slot, pos) = (element.slot(), pos as u32);
            if self.wheel.is_marked_stale(tick, pos) {
                self.drop_stale();
                continue;
            }
            match element.deadline_ms(tick) {
                Some(deadline_ms) if deadline_ms > now_ms => {
                    self.last.push(deadline_ms, HandedOver { slot, pos });
                }
                _ => n_expired += self.hand_over_by_key(tick, slot, pos, ctx, now_ms),
            }
        }
        self.finish_mass_removal(ctx);
        n_expired
    }

    /// [`Self::hand_over`] of an element that needs its key: past the tick or already due.
    /// Returns 1 if the key expired.
    fn hand_over_by_key(
        &mut self,
        tick: Tick,
        slot: SlotId,
        pos: u32,
        ctx: &Ctx<'_>,
        now_ms: u64,
    ) -> usize {
        let current = self
            .slots
            .get(slot)
            .filter(|entry| entry.timer == TimerRef::wheel(tick, pos));
        let Some(entry) = current else {
            self.drop_stale();
            return 0;
        };
        let deadline_ms = entry.deadline_ms();
        if deadline_ms > u64::from(tick) * 1000 {
            // Filed at the horizon because the sweeper was behind (see `TimingWheel::clamp`):
            // not due in this second, so file it again where it belongs.
            self.due_in_second = self.due_in_second.saturating_sub(1);
            self.consume_wheel_element(slot);
            self.schedule(slot, Some(TimerKind::Wheel), deadline_ms);
            0
        } else if deadline_ms <= now_ms {
            self.due_in_second = self.due_in_second.saturating_sub(1);
            self.expire_wheel_key(slot, ctx, now_ms)
        } else {
            self.last.push(deadline_ms, HandedOver { slot, pos });
            0
        }
    }

    /// Expires (or, while the guard holds, holds) up to `max` keys of the last second whose
    /// millisecond has come. Returns how many elements it handled, how many keys expired, and
    /// whether more are due.
    pub fn expire_last_second(
        &mut self,
        max: usize,
        ctx: &Ctx<'_>,
        now: Now,
    ) -> (usize, usize, bool) {
        let now_ms = now.ms;
        let tick = self.last.tick();
        let mut due = std::mem::take(&mut self.scratch);
        let handled = self.last.take_due(now_ms, max, &mut due);
        // The listing's choice looks at the whole second's keys, not this step's: a mass
        // expiry's keys fall due over the second, and a ticker on time takes a millisecond's
        // share each step, too few each for a pass but not in all. Its keys, not its elements:
        // those of renewed keys are stale.
        let coming = if self.searched_in_second == Some(tick) {
            due.len()
        } else {
            self.due_in_second.min(due.len() + self.last.len())
        };
        self.begin_mass_removal(due.len(), coming, ctx);
        let mut n_expired = 0;
        for &HandedOver { slot, pos } in &due {
            // Marked: left stale in its last second, after the hand-over.
            let current = !self.wheel.is_marked_stale(tick, pos)
                && (self.slots.get(slot))
                    .is_some_and(|entry| entry.timer == TimerRef::wheel(tick, pos));
            if current {
                self.due_in_second = self.due_in_second.saturating_sub(1);
                n_expired += self.expire_wheel_key(slot, ctx, now_ms);
            } else {
                self.drop_stale();
            }
        }
        self.finish_mass_removal(ctx);
        due.clear();
        self.scratch = due;
        self.expired.prune(ctx.clock.unix_ms(now_ms));
        let more = self.last.next_due_ms().is_some_and(|at| at <= now_ms);
        (handled, n_expired, more)
    }

    /// Before a sweep step (of the wheel's last second, of a late tick, of the heap, or of a
    /// guard's release) lets up to `removals` keys leave at once (until
    /// [`Shard::finish_mass_removal`], in the same lock hold), of `coming` that this step and
    /// the next ones of the same expiry will remove (the last second's keys not yet due count):
    /// - when they are a good part of the listing (or `coming` is a mass expiry's), they are
    ///   taken out of it in one pass later (see `listing::SortedSlots::remove_all`), not one
    ///   search each;
    /// - their key table elements are removed together at the end, in one loop: each removal
    ///   waits on a cache miss (the line its probe starts in), and a loop that does only that
    ///   lets the processor overlap the misses of the next ones, where the whole expiry of a
    ///   key between two removals kept them apart (the removal was ~30 % of a mass expiry's
    ///   profile);
    /// - the events vector is sized for them at once, not doubled ten times (each time a copy
    ///   and, for a fresh allocation, page faults);
    /// - the registry's key count goes down once for all of them at the end: a locked
    ///   decrement per key waits for every store before it (the event just written) to
    ///   drain, and was ~10 % of a mass expiry's profile. Until the end the count is high by
    ///   the keys removed so far, so a creation elsewhere may be refused at `max_keys` for
    ///   the length of one step (at most [`SWEEP_CHUNK`](super::sweep::SWEEP_CHUNK) keys):
    ///   it errs on the side of the limit.
    ///
    /// Nothing may find a key or list in between: the slots freed meanwhile are still in the
    /// table and the listing. A sweep step only removes.
    fn begin_mass_removal(&mut self, removals: usize, coming: usize, ctx: &Ctx<'_>) {
        if removals == 0 || !Self::removes_in_bulk(ctx) {
            return;
        }
        self.removing_in_bulk = true;
        self.expiry_continues = coming > removals;
        let alive = self.slots.len();
        self.unlisting_in_bulk = self.ordered.is_some()
            && (removals * UNLIST_IN_ONE_PASS >= alive || coming * UNLIST_MASS_EXPIRY >= alive);
        let spare = self.pending_events.capacity() - self.pending_events.len();
        if spare < removals {
            self.pending_events.reserve_exact(removals);
        }
    }

    /// Whether a sweep step removes the keys it handles (held keys and a cluster member's
    /// expiring keys stay in the table), so [`Shard::begin_mass_removal`] applies.
    fn removes_in_bulk(ctx: &Ctx<'_>) -> bool {
        !ctx.holding && !ctx.config.replicated
    }

    /// Ends [`Shard::begin_mass_removal`]: the table lets go of the keys removed, and the
    /// listing too once enough wait for it (see [`UNLIST_BATCH`]).
    fn finish_mass_removal(&mut self, ctx: &Ctx<'_>) {
        if !std::mem::take(&mut self.removing_in_bulk) {
            return;
        }
        // Each key removed in bulk left one table removal behind (see `detach`).
        ctx.free_keys(self.table_removals.len());
        self.table.remove_all(&self.table_removals);
        self.table_removals.clear();
        self.unlisting_in_bulk = false;
        let continues = std::mem::take(&mut self.expiry_continues);
        if !continues && self.unlisted_later.len() * UNLIST_BATCH >= self.slots.len() {
            self.flush_unlisting();
        }
    }

    /// Takes the keys of `unlisted_later` out of the listing in one pass (see
    /// `listing::SortedSlots::remove_all`), and lets their ids be reused. Called before
    /// anything searches the listing: a search reads the keys of the ids it passes, and these
    /// keys are gone.
    fn flush_unlisting(&mut self) {
        if self.unlisted_later.len() == 0 {
            return;
        }
        if let Some(ordered) = &mut self.ordered {
            let slots = &self.slots;
            let (gone, services) = (&self.unlisted_later, &self.unlisted_services);
            ordered.remove_all(gone, services, |slot| slots.entry(slot).key.as_bytes());
        }
        self.slots.release_held_ids();
        self.unlisted_later.clear();
        self.unlisted_services.clear();
    }

    /// [`Shard::flush_unlisting`] before a search of the listing; see `searched_in_second`.
    fn flush_unlisting_to_search(&mut self) {
        if self.unlisted_later.len() > 0 {
            self.searched_in_second = Some(self.last.tick());
            self.flush_unlisting();
        }
    }

    /// Keys of the last second not yet handled (0: the detached tick is done in this shard).
    pub fn last_second_len(&self) -> usize {
        self.last.len()
    }

    /// When the earliest key of the last second is due, in epoch ms.
    pub fn next_last_second_deadline(&self) -> Option<u64> {
        self.last.next_due_ms()
    }

    /// A stale wheel element was dropped by the sweeper.
    fn drop_stale(&mut self) {
        debug_assert!(self.n_stale > 0, "a stale element that was not counted");
        self.n_stale = self.n_stale.saturating_sub(1);
    }

    /// The sweeper consumes the key's current wheel element, so its timer no longer points
    /// anywhere: cleared before anything unschedules the key, or `unschedule` would count the
    /// consumed element as stale and `n_stale` would grow by one per expiry, for good.
    fn consume_wheel_element(&mut self, slot: SlotId) {
        self.slots.entry_mut(slot).timer = TimerRef::PERSISTENT;
        self.n_wheel -= 1;
    }

    /// Expires (or, while the guard holds, holds) a due wheel key whose element the sweeper
    /// holds. Returns 1 if it expired.
    fn expire_wheel_key(&mut self, slot: SlotId, ctx: &Ctx<'_>, now_ms: u64) -> usize {
        debug_assert!(
            self.slots.entry(slot).deadline_ms() <= now_ms,
            "expired early"
        );
        self.consume_wheel_element(slot);
        if ctx.holding {
            self.hold(slot);
            0
        } else {
            self.expire_due(slot, ctx, now_ms);
            1
        }
    }

    /// Expires (or, while the guard holds, holds) up to `max` heap keys that are due. Returns
    /// how many it handled, how many of them expired, and whether more are due.
    pub fn expire_due_heap(&mut self, max: usize, ctx: &Ctx<'_>, now: Now) -> (usize, usize, bool) {
        let now_ms = now.ms;
        let any_due = self.heap.peek().is_some_and(|(at, _)| at <= now_ms);
        if any_due && Self::removes_in_bulk(ctx) {
            let due = self.heap.count_due(now_ms, max);
            self.begin_mass_removal(due, due, ctx);
        }
        let (mut handled, mut n_expired, mut more) = (0, 0, false);
        while let Some((deadline_ms, slot)) = self.heap.peek() {
            if deadline_ms > now_ms {
                break;
            }
            if handled == max {
                more = true;
                break;
            }
            if ctx.holding {
                self.hold(slot);
            } else {
                self.expire_due(slot, ctx, now_ms);
                n_expired += 1;
            }
            handled += 1;
        }
        self.finish_mass_removal(ctx);
        (handled, n_expired, more)
    }

    /// Live keys filed at `tick` (known before it is swept: for the guard).
    pub fn wheel_live(&self, tick: Tick) -> u32 {
        self.wheel.live_count(tick)
    }

    /// Heap keys due at `now_ms`, counting at most `cap`.
    pub fn heap_due(&self, now_ms: u64, cap: usize) -> usize {
        self.heap.count_due(now_ms, cap)
    }

    /// Keys held by the guard.
    pub fn held_count(&self) -> usize {
        self.held.len()
    }

    /// Expires up to `max` held keys (the guard is releasing them). Returns how many.
    pub fn release_held(&mut self, max: usize, ctx: &Ctx<'_>, now: Now) -> usize {
        let n = max.min(self.held.len());
        self.begin_mass_removal(n, n, ctx);
        for _ in 0..n {
            let slot = *self.held.last().expect("n <= held");
            self.expire_due(slot, ctx, now.ms);
        }
        self.finish_mass_removal(ctx);
        n
    }

    /// Takes a due key out of its timer and holds it (the guard is engaged): no event, no record;
    /// a heartbeat renews it as usual, a release expires it.
    fn hold(&mut self, slot: SlotId) {
        self.unschedule(slot);
        let pos = self.held.len() as u32;
        self.held.push(slot);
        self.slots.entry_mut(slot).timer = TimerRef::held(pos);
    }

    /// Appends the log records of the operations since the last flush to the journal, and
    /// publishes their events as one batch. Callers flush before releasing the shard's lock, so
    /// one key's records and events keep their order. Returns the LSN of the last record
    /// appended (0 when none was).
    pub fn flush_events(&mut self, ctx: &Ctx<'_>) -> Lsn {
        let mut lsn = 0;
        if !self.pending_records.is_empty() {
            if let Some(journal) = ctx.journal {
                lsn = journal.append(&self.pending_records);
            }
            self.pending_records.clear();
        }
        if !self.pending_events.is_empty() {
            ctx.events.publish(std::mem::take(&mut self.pending_events));
        }
        lsn
    }

    /// The earliest heap deadline, in epoch ms.
    pub fn next_heap_deadline(&self) -> Option<u64> {
        self.heap.peek().map(|(deadline_ms, _)| deadline_ms)
    }

    /// Up to `limit` alive keys matching `filter`, in key order.
    /// `replicated`: a cluster member lists every key it holds (a key leaves only when its
    /// expiry entry is applied), due or not.
    pub fn list_alive(
        &mut self,
        filter: &ListFilter,
        limit: usize,
        now: Now,
        replicated: bool,
    ) -> Vec<EntryView> {
        self.flush_unlisting_to_search();
        let Some(ordered) = &self.ordered else {
            return Vec::new();
        };
        // A member lists its keys as if none were due.
        let now_ms = if replicated { 0 } else { now.ms };
        let slots = &self.slots;
        ordered
            .scan(filter, |slot| slots.entry(slot).key.as_bytes())
            .filter(|&slot| {
                let entry = self.slots.entry(slot);
                let held = matches!(entry.timer.get(), Timer::Held { .. });
                // Held keys always; others only while not due, and not when only held ones are wanted.
                held || (entry.deadline_ms() > now_ms && !filter.held_only)
            })
            .take(limit)
            .map(|slot| self.view_of(slot))
            .collect()
    }

    /// Up to `limit` recently expired keys matching `filter`, in key order.
    pub fn list_expired(&mut self, filter: &ListFilter, limit: usize) -> Vec<(Key, ExpiredRecord)> {
        let page = self.expired.page(filter, limit);
        page.into_iter()
            .map(|(key, record)| (key.to_key(), record.clone()))
            .collect()
    }

    /// Adds this shard's alive and listed-expired counts, by service index, to `alive` and
    /// `expired` (grown as needed).
    pub fn add_counts(&mut self, alive: &mut Vec<u64>, expired: &mut Vec<u64>) {
        if alive.len() < self.alive_by_service.len() {
            alive.resize(self.alive_by_service.len(), 0);
        }
        for (total, &count) in alive.iter_mut().zip(&self.alive_by_service) {
            *total += u64::from(count);
        }
        for (service, count) in self.expired.counts() {
            if expired.len() <= service.index() {
                expired.resize(service.index() + 1, 0);
            }
            expired[service.index()] += u64::from(count);
        }
    }

    /// Applies a key's durable state read back from the persistence log (recovery): the key is
    /// created or replaced, silently (no event, no record), with its deadline set by the
    /// restart rule: `now + TTL` for a relative one, the same instant for an absolute one (due
    /// at once if it passed), none for a persistent key. It is marked restored until renewed.
    pub fn restore_state(
        &mut self,
        state: DurableKey,
        hash: KeyHash,
        service: ServiceId,
        ctx: &Ctx<'_>,
        now: Now,
    ) {
        let (deadline_ms, ttl_ms, timer, absolute) = match state.expiry {
            Expiry::Never => (NO_DEADLINE, 0, None, false),
            Expiry::Relative { ttl_ms } => (
                now.deadline_ms(ttl_ms),
                ttl_ms,
                Some(TimerKind::for_ttl(ttl_ms, ctx.config.max_ttl_s)),
                false,
            ),
            Expiry::Absolute { at_unix_ms } => {
                let at = i64::try_from(at_unix_ms).unwrap_or(i64::MAX);
                let deadline_ms = ctx.clock.ms_from_unix(at).max(0) as u64;
                // What is left (at least 1 ms) picks the timer, as an EXPIRE would.
                let ttl_ms = deadline_ms.saturating_sub(now.ms).max(1);
                let timer = TimerKind::for_ttl(ttl_ms, ctx.config.max_ttl_s);
                (deadline_ms, ttl_ms, Some(timer), true)
            }
        };
        let (registered_unix_s, subsec) = Entry::registered_at(state.registered_unix_ms);
        let flags = subsec | RESTORED | if absolute { ABSOLUTE } else { 0 };
        let slot = match self.find((&state.key, hash)) {
            Some(slot) => {
                self.change_service(slot, service);
                let entry = self.slots.entry_mut(slot);
                entry.key.set_meta(state.meta);
                entry.registered_unix_s = registered_unix_s;
                entry.flags = flags;
                entry.set_last_heartbeat_unix_ms(state.last_heartbeat_unix_ms);
                slot
            }
            None => {
                ctx.count_key();
                self.insert(
                    hash,
                    Entry {
                        key: EntryKey::from_owned(state.key, state.meta),
                        times: Times::new(deadline_ms, ttl_ms, state.last_heartbeat_unix_ms),
                        registered_unix_s,
                        flags,
                        service,
                        timer: TimerRef::PERSISTENT,
                    },
                )
            }
        };
        self.schedule(slot, timer, deadline_ms);
        let entry = self.slots.entry_mut(slot);
        entry.set_deadline_ms(deadline_ms);
        entry.set_ttl_ms(ttl_ms);
    }

    /// Applies a deletion or an expiry read back from the log: the key leaves the alive keys
    /// silently; an expiry (`expired`: when, and the last heartbeat) puts it on the expired
    /// list with the service and metadata it had.
    pub fn restore_removal(&mut self, key: Keyed<'_>, expired: Option<(u64, u64)>, ctx: &Ctx<'_>) {
        let entry = self.find(key).map(|slot| self.detach(slot, ctx).0);
        let (key, hash) = key;
        let Some((expired_unix_ms, last_heartbeat_unix_ms)) = expired else {
            return;
        };
        let record_of = |service, meta| ExpiredRecord {
            service,
            meta,
            last_heartbeat_unix_ms,
            expired_unix_ms,
        };
        match entry {
            // The entry's key moves into the log, as a live expiry's does: no `Key` is made of
            // it to be dropped, and the record's key is not cloned (for a name of 25-30 bytes,
            // each was an allocation).
            Some(entry) => {
                let (entry_key, meta) = entry.key.without_meta();
                let record = record_of(entry.service, meta);
                self.expired.record_expiry(entry_key, hash, record);
            }
            // Already expired in the snapshot this replay started from: keep what it listed.
            None => {
                let (service, meta) = match self.expired.get(key, hash) {
                    Some(record) => (record.service, record.meta.clone()),
                    None => (ServiceId::NONE, None),
                };
                self.expired
                    .record(key.clone(), hash, record_of(service, meta));
            }
        }
    }

    /// Removes every key and the whole expired list, with no event and no record (the state a
    /// Raft snapshot then replaces, `Registry::clear`). O(slots).
    pub fn clear(&mut self, ctx: &Ctx<'_>) {
        for slot in 0..self.slots.len_with_free() {
            if self.slots.get(slot).is_some() {
                self.detach(slot, ctx);
            }
        }
        self.expired.clear();
    }

    /// Stops keeping the listing until [`Shard::rebuild_listing`] (see
    /// `Registry::defer_listing`); nothing may list meanwhile.
    pub fn defer_listing(&mut self) {
        self.flush_unlisting();
        if self.ordered.take().is_some() {
            self.listing_deferred = true;
        }
    }

    /// Builds the listing of every alive key at once, if it was deferred.
    pub fn rebuild_listing(&mut self) {
        if !std::mem::take(&mut self.listing_deferred) {
            return;
        }
        let slots = &self.slots;
        let alive = slots.iter().map(|(slot, entry)| (slot, entry.service));
        self.ordered = Some(OrderedIndex::build(alive, |slot| {
            slots.entry(slot).key.as_bytes()
        }));
    }

    /// Puts a key read back from a snapshot's expired list on the expired list, unless it is
    /// alive.
    pub fn restore_expired(&mut self, key: Key, hash: KeyHash, record: ExpiredRecord) {
        if self.find((&key, hash)).is_none() {
            self.expired.record(key, hash, record);
        }
    }

    /// The records of this shard's expired list (bounded by `--expired-max`, so one call).
    pub fn expired_records(&mut self, ctx: &Ctx<'_>) -> Vec<Record> {
        self.expired
            .records()
            .map(|(key, record)| {
                Record::ExpiredEntry(ExpiredState {
                    key: key.to_key(),
                    service: ctx.services.name(record.service),
                    meta: record.meta.clone(),
                    last_heartbeat_unix_ms: record.last_heartbeat_unix_ms,
                    expired_unix_ms: record.expired_unix_ms,
                })
            })
            .collect()
    }

    /// The records of the alive keys in slots `from..from + count` with their generations
    /// (cluster mode; 0 on a single node), and the slot to go on from
    /// (`None` at the end): a snapshot reads a shard in such chunks, so no heartbeat waits
    /// behind a whole shard.
    pub fn alive_records(
        &self,
        from: SlotId,
        count: u32,
        ctx: &Ctx<'_>,
    ) -> (Vec<(Record, u32)>, Option<SlotId>) {
        let end = from.saturating_add(count);
        let records = (from..end)
            .filter_map(|slot| Some((slot, self.slots.get(slot)?)))
            .map(|(slot, entry)| {
                let record = Record::Upsert(self.durable_state(entry, ctx));
                (record, self.generation(slot))
            })
            .collect();
        let next = (end < self.slots.len_with_free()).then_some(end);
        (records, next)
    }

    /// Checks every invariant of the module documentation; panics naming the first one broken.
    /// `detached` is the part of this shard's bucket of `tick` that the sweeper has detached
    /// and not yet processed (`(tick, bucket, next offset)`), if a sweep is under way.
    /// O(keys + wheel elements): for tests, which call it after every step.
    pub fn check_invariants(
        &self,
        detached: Option<(Tick, &[Element], usize)>,
        hasher: &RandomState,
    ) {
        self.slots.check_invariants();
        let hash_of = |key: &EntryKey| KeyHash::of_bytes(hasher, key.as_bytes());
        self.table.check_invariants(self.slots.len(), |slot| {
            self.slots.get(slot).map(|entry| hash_of(&entry.key))
        });
        assert!(self.pending_events.is_empty(), "events left unpublished");
        assert!(
            self.pending_records.is_empty(),
            "log records left unwritten"
        );
        let mut n_live = 0;
        let (mut n_wheel, mut n_heap) = (0, 0);
        let mut by_service: Vec<u32> = Vec::new();
        let mut last_second: HashMap<(SlotId, u32), usize> = HashMap::new();
        for HandedOver { slot, pos } in self.last.unprocessed() {
            *last_second.entry((slot, pos)).or_default() += 1;
        }
        for (slot, entry) in self.slots.iter() {
            n_live += 1;
            entry.key.check_form();
            assert_eq!(
                self.find((&entry.key.to_key(), hash_of(&entry.key))),
                Some(slot),
                "{} is not found at its slot",
                entry.key
            );
            let service = entry.service.index();
            if by_service.len() <= service {
                by_service.resize(service + 1, 0);
            }
            by_service[service] += 1;
            match entry.timer.get() {
                Timer::Wheel { tick, pos } => {
                    n_wheel += 1;
                    self.check_wheel_entry(slot, entry, tick, pos, detached, &last_second);
                }
                Timer::Heap => {
                    n_heap += 1;
                    self.check_timer_kind(entry, TimerKind::Heap);
                    assert_eq!(
                        self.heap.deadline_of(slot),
                        Some(entry.deadline_ms()),
                        "{}'s heap deadline",
                        entry.key
                    );
                }
                Timer::Held { pos } => {
                    assert_eq!(
                        self.held.get(pos as usize),
                        Some(&slot),
                        "{}'s place in the held list",
                        entry.key
                    );
                    assert_ne!(
                        entry.deadline_ms(),
                        NO_DEADLINE,
                        "{} is held without a deadline",
                        entry.key
                    );
                    assert_eq!(
                        self.heap.deadline_of(slot),
                        None,
                        "{} is held but in the heap",
                        entry.key
                    );
                }
                Timer::Expiring { pos } => {
                    assert_eq!(
                        self.expiring.get(pos as usize),
                        Some(&slot),
                        "{}'s place in the expiring list",
                        entry.key
                    );
                    assert_eq!(
                        self.heap.deadline_of(slot),
                        None,
                        "{} is expiring but in the heap",
                        entry.key
                    );
                }
                Timer::Persistent => {
                    assert_eq!(
                        entry.deadline_ms(),
                        NO_DEADLINE,
                        "{} has a deadline but no timer",
                        entry.key
                    );
                    assert_eq!(
                        self.heap.deadline_of(slot),
                        None,
                        "{} is persistent but in the heap",
                        entry.key
                    );
                }
            }
        }
        assert_eq!(self.slots.len(), n_live, "live slots counted");
        assert_eq!(self.n_wheel, n_wheel, "n_wheel");
        assert!(
            self.held.iter().all(|&slot| self
                .slots
                .get(slot)
                .is_some_and(|entry| matches!(entry.timer.get(), Timer::Held { .. }))),
            "a held-list element whose key is not held"
        );
        assert!(
            self.expiring.iter().all(|&slot| self
                .slots
                .get(slot)
                .is_some_and(|entry| matches!(entry.timer.get(), Timer::Expiring { .. }))),
            "an expiring-list element whose key is not expiring"
        );
        for tick in self.wheel.held_ticks() {
            let live = self
                .wheel
                .bucket(tick)
                .iter()
                .enumerate()
                .filter(|&(pos, element)| {
                    self.slots.get(element.slot()).is_some_and(|entry| {
                        entry.timer.get()
                            == (Timer::Wheel {
                                tick,
                                pos: pos as u32,
                            })
                    })
                })
                .count();
            assert_eq!(
                self.wheel.live_count(tick) as usize,
                live,
                "live elements of tick {tick}"
            );
        }
        assert_eq!(self.heap.len(), n_heap, "heap entries without a heap timer");
        self.heap.check_invariants();
        self.last.check_invariants();
        self.check_stale_count(detached);
        let stored = self.alive_by_service.iter().copied();
        let counted = by_service.iter().copied().chain(std::iter::repeat(0));
        for (service, (stored, counted)) in stored.zip(counted).enumerate() {
            assert_eq!(stored, counted, "alive keys of service {service}");
        }
        assert!(
            by_service.len() <= self.alive_by_service.len().max(1),
            "an uncounted service"
        );
        if let Some(ordered) = &self.ordered {
            let slots = &self.slots;
            ordered.check_invariants(
                slots.iter().map(|(slot, entry)| (slot, entry.service)),
                &self.unlisted_later,
                |slot| slots.entry(slot).key.as_bytes(),
            );
        }
        assert_eq!(
            self.slots.held_ids().len(),
            self.unlisted_later.len(),
            "held ids against keys waiting to leave the listing"
        );
        assert!(
            (self.slots.held_ids().iter()).all(|&slot| self.unlisted_later.contains(slot)),
            "a held id whose key does not wait to leave the listing"
        );
        self.expired.check_invariants(
            |key| self.find((key, KeyHash::of(hasher, key))).is_some(),
            |key| KeyHash::of(hasher, key),
        );
    }

    /// A wheel entry's element is where its timer says: in a bucket the wheel holds, in the
    /// part of the bucket the sweeper detached that it has not handed over yet, or once in the
    /// last second's unprocessed groups; a bucket's element carries the key's deadline; and its
    /// tick fits its deadline.
    fn check_wheel_entry(
        &self,
        slot: SlotId,
        entry: &Entry,
        tick: Tick,
        pos: u32,
        detached: Option<(Tick, &[Element], usize)>,
        last_second: &HashMap<(SlotId, u32), usize>,
    ) {
        self.check_timer_kind(entry, TimerKind::Wheel);
        let key = &entry.key;
        let in_bucket = if self.wheel.holds(tick) {
            Some(self.wheel.bucket(tick))
        } else {
            detached
                .filter(|&(swept, _, offset)| swept == tick && pos as usize >= offset)
                .map(|(_, bucket, _)| bucket)
        };
        if let Some(bucket) = in_bucket {
            let element = bucket.get(pos as usize).copied();
            assert_eq!(
                element.map(Element::slot),
                Some(slot),
                "{key}'s wheel position ({tick}, {pos})"
            );
            assert_eq!(
                element,
                Some(Element::new(tick, slot, entry.deadline_ms())),
                "{key}'s element carries its deadline"
            );
        } else {
            assert_eq!(
                tick,
                self.last.tick(),
                "{key} is filed at tick {tick}, already swept, not in its last second"
            );
            assert_eq!(
                last_second.get(&(slot, pos)),
                Some(&1),
                "{key}'s element in the last second"
            );
            assert!(
                entry.deadline_ms() <= u64::from(tick) * 1000,
                "{key} is in the last second of {tick}, past its deadline's"
            );
        }
        // Filed in its deadline's tick; earlier only at the horizon (re-filed when that comes
        // due); later only when that tick was already swept (then in the next one to sweep).
        let deadline_tick = TimingWheel::tick_of(entry.deadline_ms());
        assert!(
            tick <= deadline_tick || tick <= self.wheel.swept_through() + 1,
            "{key} is filed at tick {tick}, after its deadline's tick {deadline_tick}"
        );
    }

    fn check_timer_kind(&self, entry: &Entry, kind: TimerKind) {
        assert_ne!(
            entry.deadline_ms(),
            NO_DEADLINE,
            "{} is timed without a deadline",
            entry.key
        );
        let max_ttl_s = (self.wheel.n_buckets() - 2) as u32;
        assert_eq!(
            TimerKind::for_ttl(entry.ttl_ms(), max_ttl_s),
            kind,
            "{}'s timer for its TTL",
            entry.key
        );
    }

    /// `n_stale` counts exactly the wheel elements (held, detached and not yet handed over, or
    /// in the last second and not yet processed) that are not their slot's current element,
    /// and no current element is marked stale.
    fn check_stale_count(&self, detached: Option<(Tick, &[Element], usize)>) {
        let is_current = |tick: Tick, pos: usize, slot: SlotId| {
            self.slots.get(slot).is_some_and(|entry| {
                entry.timer.get()
                    == (Timer::Wheel {
                        tick,
                        pos: pos as u32,
                    })
            })
        };
        let held = self.wheel.held_ticks().flat_map(|tick| {
            let bucket = self.wheel.bucket(tick);
            bucket
                .iter()
                .enumerate()
                .map(move |(pos, element)| (tick, pos, element.slot()))
        });
        let unprocessed = detached.into_iter().flat_map(|(tick, bucket, offset)| {
            bucket
                .iter()
                .enumerate()
                .skip(offset)
                .map(move |(pos, element)| (tick, pos, element.slot()))
        });
        let last_tick = self.last.tick();
        let last_second = (self.last.unprocessed())
            .map(|HandedOver { slot, pos }| (last_tick, pos as usize, slot));
        let mut n_stale = 0;
        for (tick, pos, slot) in held.chain(unprocessed).chain(last_second) {
            let current = is_current(tick, pos, slot);
            assert!(
                !(current && self.wheel.is_marked_stale(tick, pos as u32)),
                "slot {slot}'s current element at {tick}/{pos} is marked stale"
            );
            n_stale += usize::from(!current);
        }
        assert_eq!(self.n_stale, n_stale, "n_stale");
        self.wheel.check_invariants();
    }

    /// The slot of `key` if it is alive at `now_ms`, or held. A key whose deadline has passed is
    /// expired here and then, so that no read ever sees it, even before the sweeper reaches it;
    /// held instead while the guard holds.
    fn find_alive(&mut self, key: Keyed<'_>, ctx: &Ctx<'_>, now_ms: u64) -> Option<SlotId> {
        // A doubling in progress finishes even if the keys only renew from now on.
        self.table.move_step();
        let slot = self.find(key)?;
        let entry = self.slots.entry(slot);
        // A cluster member's keys leave only by committed entries: a due key is still there.
        if entry.deadline_ms() > now_ms
            || matches!(entry.timer.get(), Timer::Held { .. })
            || ctx.config.replicated
        {
            return Some(slot);
        }
        if ctx.holding {
            self.hold(slot);
            return Some(slot);
        }
        self.remove(slot, EventKind::Expired, ctx, now_ms);
        None
    }

    /// Reads what heartbeats on the keys with `hashes` will read, so that it is in the cache
    /// when they come (see `Registry::warm` for why), and changes nothing: the table's elements,
    /// then the entries the elements point to. One loop per kind of read, so that
    /// the reads within a loop do not wait for each other. Returns a value read, for the caller
    /// to keep the loads from being optimized away.
    pub fn warm(&self, hashes: impl Iterator<Item = KeyHash>, found: &mut Vec<SlotId>) -> u64 {
        found.clear();
        found.extend(hashes.filter_map(|hash| self.table.first_with_tag(hash)));
        let mut read = 0u64;
        for &slot in found.iter() {
            let entry = self.slots.entry(slot);
            let timer = entry.timer;
            read ^= entry.deadline_ms() ^ u64::from(timer.tick) ^ entry.key.as_bytes().len() as u64;
        }
        read
    }

    /// The slot of `key`, if it is in this shard.
    fn find(&self, (key, hash): Keyed<'_>) -> Option<SlotId> {
        self.table
            .find(hash, |slot| self.slots.entry(slot).key.is(key))
    }

    /// Stores a new key's entry (its key has `hash`) and adds it to the table.
    fn insert(&mut self, hash: KeyHash, entry: Entry) -> SlotId {
        let service = entry.service;
        self.expired.forget(entry.key.as_bytes(), hash);
        self.flush_unlisting_to_search();
        let slot = self.slots.insert(entry);
        self.table.insert(hash, slot);
        if let Some(ordered) = &mut self.ordered {
            let slots = &self.slots;
            ordered.insert(slot, service, |slot| slots.entry(slot).key.as_bytes());
        }
        self.count_service(service, 1);
        slot
    }

    /// Queues the `registered` event of the key just created in `slot`.
    fn registered(&mut self, slot: SlotId, ctx: &Ctx<'_>, now_ms: u64) {
        let event = event_of(EventKind::Registered, self.slots.entry(slot), ctx, now_ms);
        self.pend(event);
    }

    /// Queues an event for [`Shard::flush_events`]. Most operations publish one event, and the
    /// vector goes to the bus whole and waits there until the stream and the webhooks have
    /// taken it: its first allocation is exact (one event, not `Vec`'s minimum of four), so a
    /// burst of registrations in flight holds a quarter of the bytes.
    fn pend(&mut self, event: Event) {
        if self.pending_events.capacity() == 0 {
            self.pending_events.reserve_exact(1);
        }
        self.pending_events.push(event);
        // Stamped in place: stamping `event` before the push copied it once more, and that
        // copy was ~8 % of a mass expiry (BENCHMARKS.md, ninth session).
        if let Some(pending) = self.pending_events.last_mut() {
            pending.log_id = pending.log_id.or(self.log_stamp);
        }
    }

    /// Removes the key in `slot` from every structure, and queues its event and log record.
    fn remove(&mut self, slot: SlotId, kind: EventKind, ctx: &Ctx<'_>, now_ms: u64) {
        let (entry, hash) = self.detach(slot, ctx);
        let event = event_of(kind, &entry, ctx, now_ms);
        let at_unix_ms = ctx.clock.unix_ms(now_ms);
        if ctx.journal.is_some() {
            self.pending_records.push(match kind {
                EventKind::Expired => Record::Expired {
                    key: entry.key.to_key(),
                    at_unix_ms,
                    last_heartbeat_unix_ms: entry.last_heartbeat_unix_ms(),
                },
                EventKind::Deleted
                | EventKind::Registered
                | EventKind::GuardEngaged
                | EventKind::GuardReleased => Record::Deleted {
                    key: entry.key.to_key(),
                    at_unix_ms,
                },
            });
        }
        if kind == EventKind::Expired {
            self.add_to_expired_list(entry, hash, at_unix_ms);
        }
        self.pend(event);
    }

    /// Takes the key in `slot` out of every structure, silently, and returns its entry and its
    /// key's hash.
    fn detach(&mut self, slot: SlotId, ctx: &Ctx<'_>) -> (Entry, KeyHash) {
        self.unschedule(slot);
        // Once keys wait for the listing's pass, every removal waits: a search could pass them.
        let unlist_later =
            self.ordered.is_some() && (self.unlisting_in_bulk || self.unlisted_later.len() > 0);
        if let Some(ordered) = &mut self.ordered {
            let slots = &self.slots;
            let service = slots.entry(slot).service;
            if unlist_later {
                self.unlisted_later.insert(slot);
                if !self.unlisted_services.contains(&service) {
                    self.unlisted_services.push(service);
                }
            } else {
                ordered.remove(slot, service, |slot| slots.entry(slot).key.as_bytes());
            }
        }
        let entry = if unlist_later {
            self.slots.remove_holding_id(slot)
        } else {
            self.slots.remove(slot)
        };
        let hash = ctx.hash_bytes(entry.key.as_bytes());
        if self.removing_in_bulk {
            // Freed in `finish_mass_removal`, with the table element.
            self.table_removals.push((hash, slot));
        } else {
            self.table.remove(hash, slot);
            ctx.free_keys(1);
        }
        self.count_service(entry.service, -1);
        (entry, hash)
    }

    /// Puts an expired key on the expired list.
    fn add_to_expired_list(&mut self, entry: Entry, hash: KeyHash, expired_unix_ms: u64) {
        let last_heartbeat_unix_ms = entry.last_heartbeat_unix_ms();
        let (key, meta) = entry.key.without_meta();
        let record = ExpiredRecord {
            service: entry.service,
            last_heartbeat_unix_ms,
            meta,
            expired_unix_ms,
        };
        // The key was alive: its registration took any earlier record off.
        self.expired.record_expiry(key, hash, record);
    }

    /// Queues the log record of the key in `slot`'s whole state (when a journal is attached).
    fn record_state(&mut self, slot: SlotId, ctx: &Ctx<'_>) {
        if ctx.journal.is_some() {
            let record = Record::Upsert(self.durable_state(self.slots.entry(slot), ctx));
            self.pending_records.push(record);
        }
    }

    /// Everything durable about `entry` (see `persist::record::KeyState`).
    fn durable_state(&self, entry: &Entry, ctx: &Ctx<'_>) -> DurableKey {
        DurableKey {
            key: entry.key.to_key(),
            service: ctx.services.name(entry.service),
            meta: entry.key.meta().cloned(),
            expiry: entry.expiry(ctx),
            registered_unix_ms: entry.registered_unix_ms(),
            last_heartbeat_unix_ms: entry.last_heartbeat_unix_ms(),
        }
    }

    /// Moves `slot`'s deadline to the structure `timer` names (`None`: no TTL). A wheel key
    /// renewed into the bucket it already occupies moves nothing.
    fn schedule(&mut self, slot: SlotId, timer: Option<TimerKind>, deadline_ms: u64) {
        let current = self.slots.entry(slot).timer.get();
        let next = match timer {
            Some(TimerKind::Wheel) => {
                let tick = self.wheel.clamp(TimingWheel::tick_of(deadline_ms));
                if let Timer::Wheel { tick: at, pos } = current {
                    if at == tick {
                        self.wheel.refile(tick, pos, deadline_ms);
                        return;
                    }
                }
                self.unschedule(slot);
                TimerRef::wheel(tick, self.wheel.insert(tick, slot, deadline_ms))
            }
            Some(TimerKind::Heap) => {
                if current != Timer::Heap {
                    self.unschedule(slot);
                }
                self.heap.upsert(slot, deadline_ms);
                TimerRef::HEAP
            }
            None => {
                self.unschedule(slot);
                TimerRef::PERSISTENT
            }
        };
        if matches!(next.get(), Timer::Wheel { .. }) {
            self.n_wheel += 1;
        }
        self.slots.entry_mut(slot).timer = next;
    }

    /// Takes `slot` out of whatever timer holds it.
    ///
    /// A wheel element is normally left in its bucket as a stale element (counted in
    /// `n_stale`): removing it costs two random memory accesses (the hole in the bucket and the
    /// back-reference of the element moved into it), which is most of a renewal's cost once the
    /// keys no longer fit in cache. The wheel marks the position left, and the sweeper drops
    /// marked elements unread when their bucket comes due.
    /// A client that renews far more often than its TTL would pile up stale elements, so past
    /// `stale_per_key` per key the shard removes elements eagerly until the sweeper has caught up.
    fn unschedule(&mut self, slot: SlotId) {
        let timer = self.slots.entry(slot).timer.get();
        if matches!(timer, Timer::Wheel { .. }) {
            self.n_wheel -= 1;
        }
        if let Timer::Wheel { tick, .. } = timer {
            self.wheel.forget(tick);
        }
        match timer {
            Timer::Wheel { tick, pos } if self.wheel.holds(tick) && self.too_many_stale() => {
                if let Some((moved, from)) = self.wheel.remove(tick, pos) {
                    // Only the moved slot's current element records its position. The element
                    // that moved may be stale: left by a renewal of a key that is live, or of
                    // a key since deleted or expired, whose slot is now free (or reused).
                    if let Some(moved_entry) = self.slots.get_mut(moved) {
                        if moved_entry.timer.get() == (Timer::Wheel { tick, pos: from }) {
                            moved_entry.timer.pos = pos;
                        }
                    }
                }
            }
            Timer::Wheel { tick, pos } => {
                self.wheel.mark_stale(tick, pos);
                self.n_stale += 1;
            }
            Timer::Heap => {
                self.heap.remove(slot);
            }
            Timer::Held { pos } => {
                self.held.swap_remove(pos as usize);
                if let Some(&moved) = self.held.get(pos as usize) {
                    self.slots.entry_mut(moved).timer = TimerRef::held(pos);
                }
            }
            Timer::Expiring { pos } => {
                self.expiring.swap_remove(pos as usize);
                if let Some(&moved) = self.expiring.get(pos as usize) {
                    self.slots.entry_mut(moved).timer = TimerRef::expiring(pos);
                }
            }
            Timer::Persistent => {}
        }
        self.slots.entry_mut(slot).timer = TimerRef::PERSISTENT;
    }

    fn too_many_stale(&self) -> bool {
        self.n_stale >= self.stale_per_key * self.slots.len() + self.stale_slack
    }

    fn change_service(&mut self, slot: SlotId, service: ServiceId) {
        let entry = self.slots.entry_mut(slot);
        let old = std::mem::replace(&mut entry.service, service);
        if old == service {
            return;
        }
        self.flush_unlisting_to_search();
        if let Some(ordered) = &mut self.ordered {
            let slots = &self.slots;
            let key_of = |slot| slots.entry(slot).key.as_bytes();
            ordered.remove(slot, old, key_of);
            ordered.insert(slot, service, key_of);
        }
        self.count_service(old, -1);
        self.count_service(service, 1);
    }

    fn count_service(&mut self, service: ServiceId, delta: i32) {
        let index = service.index();
        if self.alive_by_service.len() <= index {
            self.alive_by_service.resize(index + 1, 0);
        }
        let count = &mut self.alive_by_service[index];
        *count = count
            .checked_add_signed(delta)
            .expect("service counts stay non-negative");
    }

    fn view_of(&self, slot: SlotId) -> EntryView {
        let entry = self.slots.entry(slot);
        EntryView {
            key: entry.key.to_key(),
            service: entry.service,
            meta: entry.key.meta().cloned(),
            ttl_ms: entry.ttl(),
            deadline_ms: entry.deadline(),
            registered_unix_ms: entry.registered_unix_ms(),
            last_heartbeat_unix_ms: entry.last_heartbeat_unix_ms(),
            timer: match entry.timer.get() {
                Timer::Persistent => None,
                Timer::Heap => Some(TimerKind::Heap),
                Timer::Wheel { .. } => Some(TimerKind::Wheel),
                Timer::Held { .. } | Timer::Expiring { .. } => Some(TimerKind::for_ttl(
                    entry.ttl_ms(),
                    (self.wheel.n_buckets() - 2) as u32,
                )),
            },
            held: matches!(entry.timer.get(), Timer::Held { .. }),
        }
    }
}

/// The event of `kind` for `entry`, times in Unix ms.
///
/// An expiry's lateness is real time: it adds the stalls of the process since the key's last
/// heartbeat (which extended its deadline, or held up its expiry), and its `deadline` is the
/// one the key had before they did, so `occurred_at - deadline = lateness` still holds.
fn event_of(kind: EventKind, entry: &Entry, ctx: &Ctx<'_>, now_ms: u64) -> Event {
    let occurred_at_ms = ctx.clock.unix_ms(now_ms);
    let (deadline_ms, lateness_ms) = match (kind, entry.deadline()) {
        (EventKind::Expired, Some(deadline_ms)) => {
            let stalled_ms = ctx.clock.stalled_since_unix(entry.last_heartbeat_unix_ms());
            let lateness_ms = now_ms.saturating_sub(deadline_ms) + stalled_ms;
            (
                Some(occurred_at_ms.saturating_sub(lateness_ms)),
                lateness_ms,
            )
        }
        (_, deadline_ms) => (deadline_ms.map(|ms| ctx.clock.unix_ms(ms)), 0),
    };
    Event {
        kind,
        key: entry.key.to_key(),
        service: ctx.services.name(entry.service),
        meta: entry.key.meta().cloned(),
        ttl_ms: entry.ttl(),
        registered_at_ms: entry.registered_unix_ms(),
        last_heartbeat_at_ms: entry.last_heartbeat_unix_ms(),
        deadline_ms,
        occurred_at_ms,
        lateness_ms,
        restored: kind == EventKind::Expired && entry.flags & RESTORED != 0,
        log_id: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fleet that registered and then only renews still finishes its key table's doubling
    /// (or every lookup of a key not yet moved would probe two arrays for good).
    #[test]
    fn renewals_alone_finish_a_key_table_doubling() {
        use crate::registry::{Heartbeat, Registry, RegistryConfig};
        use crate::types::{Key, Ttl};
        let registry = Registry::new(
            RegistryConfig {
                shards: 1,
                ..RegistryConfig::default()
            },
            tokio::time::Instant::now(),
        );
        let beat = |i: usize| {
            let heartbeat = Heartbeat {
                key: Key::new(&format!("key-{i}")).unwrap(),
                ttl: Ttl::from_secs(60).unwrap(),
                service: None,
                meta: None,
            };
            registry
                .heartbeat(heartbeat, tokio::time::Instant::now())
                .unwrap();
        };
        let is_growing = || registry.shards[0].0.lock().table.is_growing();
        let mut n = 0;
        while !is_growing() {
            beat(n);
            n += 1;
        }
        for _ in 0..64 {
            beat(0);
        }
        assert!(!is_growing(), "the doubling begun at key {n} is done");
        registry.check_invariants();
    }

    #[test]
    fn an_entry_is_one_cache_line_including_the_inline_key() {
        assert_eq!(std::mem::size_of::<Option<Entry>>(), 64);
        assert_eq!(std::mem::align_of::<Option<Entry>>(), 64);
    }
}
