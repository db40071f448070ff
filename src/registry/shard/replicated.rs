//! A shard's side of cluster mode (`RegistryConfig::replicated`): keys change only when a
//! committed log entry is applied, on every member alike, and the leader's own bookkeeping for
//! the entries it proposes.
//!
//! - **Generations**: each key carries the low 32 bits of the log index of the entry that last
//!   wrote it (`generations`, by slot). An expiry or checkpoint item names the generation the
//!   leader saw; applied to a key written since (renewed through the log, deleted, created
//!   again), it changes nothing. 32 bits are enough: two writes of one key would have to be
//!   4 billion entries apart while the expiry decided between them is still uncommitted.
//! - **Expiring**: on the leader, a due key is not removed but put on the `expiring` list
//!   (`Timer::Expiring`) until the leader's expiry entry for it is applied. A heartbeat for
//!   it needs the log (`Shard::heartbeat`), which orders it against the expiry.
//! - **Renewed**: a renewal on the leader marks the key (`RENEWED`) and lists its slot once; a
//!   checkpoint takes the list, so it carries each renewed key once.
//!
//! Invariants (checked by `Shard::check_invariants`): a key is `Expiring` exactly when its
//! slot is at its position in `expiring`; a slot with `RENEWED` set is in `renewed`.

use super::{Keyed, Shard, Timer, TimerRef, NO_DEADLINE, RENEWED, RESTORED};
use crate::clock::Now;
use crate::events::EventKind;
use crate::expiry::wheel::SlotId;
use crate::expiry::TimerKind;
use crate::persist::record::{Expiry, KeyState as DurableKey, Record};
use crate::registry::services::ServiceId;
use crate::registry::table::KeyHash;
use crate::registry::{Ctx, ExpireCondition, ExpireOutcome};
use crate::types::Key;

/// One key of a checkpoint: its generation and the time it has left on the leader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointItem {
    pub key: Key,
    pub generation: u32,
    pub remaining_ms: u64,
}

impl Shard {
    /// Runs `op` (one record's apply) with its events numbered `stamp` (`Event::log_id`).
    pub(in crate::registry) fn stamped<T>(
        &mut self,
        stamp: u64,
        op: impl FnOnce(&mut Self) -> T,
    ) -> T {
        self.log_stamp = Some(stamp);
        let result = op(self);
        self.log_stamp = None;
        result
    }

    /// A due key the sweeper reached: expired here on a single node; on a cluster member,
    /// listed for the leader's next expiry entry.
    pub(in crate::registry) fn expire_due(&mut self, slot: SlotId, ctx: &Ctx<'_>, now_ms: u64) {
        if ctx.config.replicated {
            self.mark_expiring(slot);
        } else {
            self.remove(slot, EventKind::Expired, ctx, now_ms);
        }
    }

    /// Takes a due key out of its timer and lists it for an expiry entry.
    fn mark_expiring(&mut self, slot: SlotId) {
        self.unschedule(slot);
        let pos = self.expiring.len() as u32;
        self.expiring.push(slot);
        self.slots.entry_mut(slot).timer = TimerRef::expiring(pos);
    }

    /// A renewal on the leader: the key goes into the next checkpoint.
    pub(in crate::registry) fn mark_renewed(&mut self, slot: SlotId) {
        let entry = self.slots.entry_mut(slot);
        if entry.flags & RENEWED == 0 {
            entry.flags |= RENEWED;
            self.renewed.push(slot);
        }
    }

    /// The generation of the key in `slot`.
    /// The generation of `key`, if it is here.
    pub(in crate::registry) fn key_generation(&self, key: Keyed<'_>) -> Option<u32> {
        self.find(key).map(|slot| self.generation(slot))
    }

    pub(super) fn generation(&self, slot: SlotId) -> u32 {
        self.generations.get(slot as usize).copied().unwrap_or(0)
    }

    fn set_generation(&mut self, slot: SlotId, generation: u32) {
        let index = slot as usize;
        if self.generations.len() <= index {
            self.generations.resize(index + 1, 0);
        }
        self.generations[index] = generation;
    }

    /// Applies a committed key state (a creation or a change): as recovery applies it, with
    /// the entry's `generation`, and a `registered` event when it creates the key. The deadline
    /// counts the TTL from `now`, the apply. Returns whether it created the key, and its
    /// deadline if the heap holds it (the sweeper may have to wake earlier for it).
    pub(in crate::registry) fn apply_upsert(
        &mut self,
        mut state: DurableKey,
        hash: KeyHash,
        service: ServiceId,
        generation: u32,
        ctx: &Ctx<'_>,
        now: Now,
    ) -> (bool, Option<u64>) {
        let created = self.find((&state.key, hash)).is_none();
        // The record was decided against the key as the leader saw it; if an expiry committed
        // meanwhile took it, this write registers it anew, at the write's heartbeat.
        if created {
            state.registered_unix_ms = (state.registered_unix_ms).max(state.last_heartbeat_unix_ms);
        }
        let key = state.key.clone();
        self.restore_state(state, hash, service, ctx, now);
        let slot = self.find((&key, hash)).expect("just stored");
        // Applied from the log, not restored at a restart: its expiry is a live one.
        let entry = self.slots.entry_mut(slot);
        entry.flags &= !RESTORED;
        let heap_deadline = (entry.timer.get() == Timer::Heap).then_some(entry.deadline_ms());
        self.set_generation(slot, generation);
        if created {
            self.registered(slot, ctx, now.ms);
        }
        (created, heap_deadline)
    }

    /// A cluster member's EXPIRE, decided on the leader against the key as it is here, and
    /// changing nothing: the answer, and the record to propose before giving it (`None`:
    /// nothing changes). A deadline not in the future is a delete; any other is logged as the
    /// key's whole state with a relative TTL, the time left from `now` to `target_ms`, which
    /// every member counts from its own apply.
    ///
    /// Why relative, also for an absolute deadline (PEXPIREAT): members' wall clocks differ,
    /// and an entry must mean the same on each of them; an instant would be re-read against
    /// each member's clock (and after a restart or a snapshot install, again). The leader's
    /// clock decides once, here, what is left; the cost is that the key falls due later than
    /// the instant by the commit's latency, never earlier, and across a failover it is kept as
    /// any TTL is (`promote_slots`).
    pub(in crate::registry) fn expire_record(
        &mut self,
        key: Keyed<'_>,
        target_ms: i64,
        condition: Option<ExpireCondition>,
        ctx: &Ctx<'_>,
        now: Now,
    ) -> (ExpireOutcome, Option<Record>) {
        let slot = match self.expire_allowed(key, target_ms, condition, ctx, now) {
            Ok(slot) => slot,
            Err(answer) => return (answer, None),
        };
        if target_ms <= now.ms as i64 {
            let deleted = Record::Deleted {
                key: key.0.clone(),
                at_unix_ms: ctx.clock.unix_ms(now.ms),
            };
            return (ExpireOutcome::Deleted, Some(deleted));
        }
        // What is left, rounded down (as a single node answers it); at least 1 ms, since the
        // deadline is in the future. Applied as `ceil(apply) + ttl_ms`: never before the target.
        let ttl_ms = now.ms_left(target_ms as u64).max(1);
        let mut state = self.durable_state(self.slots.entry(slot), ctx);
        state.expiry = Expiry::Relative { ttl_ms };
        (
            ExpireOutcome::Applied { ttl_ms },
            Some(Record::Upsert(state)),
        )
    }

    /// A cluster member's PERSIST, decided on the leader and changing nothing: the answer
    /// (`None`: missing; else whether a TTL is removed) and the record to propose first (the
    /// key's whole state without a deadline), if any.
    pub(in crate::registry) fn persist_record(
        &mut self,
        key: Keyed<'_>,
        ctx: &Ctx<'_>,
        now: Now,
    ) -> (Option<bool>, Option<Record>) {
        let Some(slot) = self.find_alive(key, ctx, now.ms) else {
            return (None, None);
        };
        let entry = self.slots.entry(slot);
        if entry.deadline().is_none() {
            return (Some(false), None);
        }
        let mut state = self.durable_state(entry, ctx);
        state.expiry = Expiry::Never;
        (Some(true), Some(Record::Upsert(state)))
    }

    /// Applies a committed delete: the key leaves with a `deleted` event. Returns whether it
    /// was there.
    pub(in crate::registry) fn apply_delete(
        &mut self,
        key: (&Key, KeyHash),
        ctx: &Ctx<'_>,
        now_ms: u64,
    ) -> bool {
        let Some(slot) = self.find(key) else {
            return false;
        };
        self.remove(slot, EventKind::Deleted, ctx, now_ms);
        true
    }

    /// Applies a committed expiry decided for `generation`: the key leaves, with its `expired`
    /// event and onto the expired list, if it still has that generation. Returns whether it
    /// expired.
    pub(in crate::registry) fn apply_expiry(
        &mut self,
        key: (&Key, KeyHash),
        generation: u32,
        ctx: &Ctx<'_>,
        now_ms: u64,
    ) -> bool {
        let Some(slot) = self.find(key) else {
            return false;
        };
        if self.generation(slot) != generation {
            return false;
        }
        self.remove(slot, EventKind::Expired, ctx, now_ms);
        true
    }

    /// Applies one checkpointed deadline on a member that did not take the checkpoint: the
    /// key, if it still has the generation and a TTL, is due `remaining_ms` from `now`.
    pub(in crate::registry) fn apply_checkpoint(
        &mut self,
        item: &CheckpointItem,
        hash: KeyHash,
        ctx: &Ctx<'_>,
        now: Now,
    ) {
        let Some(slot) = self.find((&item.key, hash)) else {
            return;
        };
        if self.generation(slot) != item.generation {
            return;
        }
        let entry = self.slots.entry(slot);
        if entry.deadline_ms() == NO_DEADLINE || matches!(entry.timer.get(), Timer::Expiring { .. })
        {
            return;
        }
        let timer = TimerKind::for_ttl(entry.ttl_ms(), ctx.config.max_ttl_s);
        let deadline_ms = now.deadline_ms(item.remaining_ms);
        self.schedule(slot, Some(timer), deadline_ms);
        self.slots.entry_mut(slot).set_deadline_ms(deadline_ms);
    }

    /// Moves the keys renewed since the last checkpoint into `out`, with their time left.
    pub(in crate::registry) fn take_renewed(&mut self, now: Now, out: &mut Vec<CheckpointItem>) {
        for slot in std::mem::take(&mut self.renewed) {
            let Some(entry) = self.slots.get_mut(slot) else {
                continue; // freed since
            };
            if entry.flags & RENEWED == 0 {
                continue; // listed twice (freed and reused, then renewed)
            }
            entry.flags &= !RENEWED;
            let Some(remaining_ms) = self.slots.entry(slot).remaining(now) else {
                continue;
            };
            out.push(CheckpointItem {
                key: self.slots.entry(slot).key.to_key(),
                generation: self.generation(slot),
                remaining_ms,
            });
        }
    }

    /// Forgets the renewals not yet checkpointed (leadership lost).
    pub(in crate::registry) fn forget_renewed(&mut self) {
        for slot in std::mem::take(&mut self.renewed) {
            if let Some(entry) = self.slots.get_mut(slot) {
                entry.flags &= !RENEWED;
            }
        }
    }

    /// Up to `max` keys whose expiry is to be proposed, with their generations, into `out`.
    pub(in crate::registry) fn expiring_keys(&self, max: usize, out: &mut Vec<(Key, u32)>) {
        for &slot in self.expiring.iter().take(max) {
            out.push((self.slots.entry(slot).key.to_key(), self.generation(slot)));
        }
    }

    /// Keys listed for an expiry entry.
    pub(in crate::registry) fn expiring_count(&self) -> usize {
        self.expiring.len()
    }

    /// A promotion's pass over slots `from..from + count`: every key with a TTL gets the
    /// deadline `deadline_for(remaining_ms, ttl_ms)` (remaining as of the last contact with
    /// the old leader, `contact_ms`); keys listed as expiring go back on their timers with it.
    /// Held keys stay held. Returns the slot to go on from (`None` at the end).
    pub(in crate::registry) fn promote_slots(
        &mut self,
        from: SlotId,
        count: u32,
        contact_ms: u64,
        deadline_for: &dyn Fn(u64, u64) -> u64,
        ctx: &Ctx<'_>,
    ) -> Option<SlotId> {
        let end = from.saturating_add(count).min(self.slots.len_with_free());
        for slot in from..end {
            let Some(entry) = self.slots.get(slot) else {
                continue;
            };
            if entry.deadline_ms() == NO_DEADLINE || matches!(entry.timer.get(), Timer::Held { .. })
            {
                continue;
            }
            let remaining_ms = entry.deadline_ms().saturating_sub(contact_ms);
            let deadline_ms = deadline_for(remaining_ms, entry.ttl_ms());
            let timer = TimerKind::for_ttl(entry.ttl_ms(), ctx.config.max_ttl_s);
            self.schedule(slot, Some(timer), deadline_ms);
            self.slots.entry_mut(slot).set_deadline_ms(deadline_ms);
        }
        (end < self.slots.len_with_free()).then_some(end)
    }

    /// Sets the generation of a key just restored from a snapshot.
    pub(in crate::registry) fn restore_generation(
        &mut self,
        key: (&Key, KeyHash),
        generation: u32,
    ) {
        if let Some(slot) = self.find(key) {
            self.set_generation(slot, generation);
        }
    }
}
