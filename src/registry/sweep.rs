//! The sweep: expiring what is due, wheel ticks first (strictly in order, none ever skipped,
//! however late the ticker runs), then due heap keys, in bounded chunks of work so that no
//! shard lock is held for long; and telling the ticker when to run next.
//!
//! A wheel tick is swept in three phases. When the second its deadlines fall in begins, its
//! bucket is detached from every shard in O(1) (under the sweep lock, so the shards advance in
//! lockstep); the detached elements are then handed over to each shard's last-second groups
//! (one per millisecond, `expiry::last_second`) chunk by chunk, one shard lock per chunk; and each
//! millisecond's keys expire when it comes due. A call that runs out of budget leaves the rest
//! in [`SweepState`] for the next call; heartbeats go on in between.

use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::Registry;
use crate::clock::Now;
use crate::expiry::wheel::{Element, Tick};

/// Slots a sweep handles per lock acquisition. Measured (`benches/expiry.rs`, evict/1M): about
/// 0.5 ms per chunk with the listing structures, so a heartbeat to the same shard waits at most
/// about that long behind a mass expiry.
pub const SWEEP_CHUNK: usize = 1024;

/// How far a call to [`Registry::sweep`] got.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    pub n_expired: usize,
    /// Held keys the guard released (expired) in this call; not in `n_expired`.
    pub n_released: usize,
    /// True when the budget ran out with due keys left: call again (after yielding).
    pub more: bool,
}

/// The sweeper's progress through the tick in its last second.
#[derive(Debug, Default)]
pub(super) struct SweepState {
    /// The detached buckets not yet fully handed over: `(shard index, elements, next offset)`.
    pending: Vec<(usize, Vec<Element>, usize)>,
    /// The tick whose buckets are detached and whose keys are not all handled yet.
    in_flight: Option<Tick>,
}

impl Registry {
    /// Expires what is due at `now`: every wheel tick up to `now` in order (none is ever skipped,
    /// however late the call), then due heap keys. Handles at most `budget` slots; when
    /// [`SweepReport::more`] is set, call again.
    pub fn sweep(&self, now: Instant, budget: usize) -> SweepReport {
        let now = self.clock.at(now);
        let mut report = SweepReport {
            n_released: self.guard_step(now, budget),
            ..SweepReport::default()
        };
        let mut spent = report.n_released;
        if spent >= budget {
            report.more = true;
            return report;
        }
        spent += self.sweep_wheel(now, budget - spent, &mut report);
        if !report.more {
            spent += self.sweep_heap(now, budget - spent, &mut report);
        }
        // A member's sweep only marks keys expiring; each is counted when its expiry entry is
        // applied (`apply_expiries`), on every member alike, and only if it did expire (a key
        // renewed meanwhile is not). Counting here too counted the leader's twice.
        if !self.config.replicated {
            self.guard_saw_expiries(now, report.n_expired);
        }
        debug_assert!(
            spent <= budget + SWEEP_CHUNK,
            "a sweep call stays near its budget"
        );
        report
    }

    /// Processes wheel ticks in order: when the second a tick's deadlines fall in begins,
    /// detaches its bucket in every shard and hands the slots over to the shards' last-second
    /// groups, chunk by chunk; then expires each millisecond's keys as it comes due. A tick is
    /// done, and the next one may be detached, once every shard has handled all its keys.
    /// Returns the slots handled; sets `report.more` when the budget ran out first.
    fn sweep_wheel(&self, now: Now, budget: usize, report: &mut SweepReport) -> usize {
        let mut state = self.sweep_state.lock();
        let mut spent = 0;
        loop {
            match state.in_flight {
                Some(tick) if !state.pending.is_empty() => {
                    spent += self.hand_over_chunk(&mut state, tick, now, budget - spent, report);
                }
                Some(tick) => {
                    let (handled, done) = self.expire_last_seconds(now, budget - spent, report);
                    spent += handled;
                    if !done {
                        return spent;
                    }
                    state.in_flight = None;
                    self.swept_through.store(tick, Ordering::Release);
                }
                None => {
                    let next_tick = self.swept_through.load(Ordering::Acquire) + 1;
                    if Self::last_second_begins_ms(next_tick) > now.ms {
                        return spent;
                    }
                    self.detach_tick(&mut state, next_tick, now);
                }
            }
            if spent >= budget {
                report.more = true;
                return spent;
            }
        }
    }

    /// When the last second of `tick` begins (its deadlines fall in the second after), in
    /// epoch ms: its bucket is detached then.
    fn last_second_begins_ms(tick: Tick) -> u64 {
        u64::from(tick.saturating_sub(1)) * 1000
    }

    /// Detaches the bucket of `tick` in every shard (O(1) each, in lockstep) and, before any of
    /// its keys expires, asks the guard whether this is a mass expiry to hold.
    fn detach_tick(&self, state: &mut SweepState, tick: Tick, now: Now) {
        state.in_flight = Some(tick);
        let (mut n_due, mut alive) = (0, 0);
        for (shard_idx, shard) in self.shards.iter().enumerate() {
            let mut shard = shard.0.lock();
            n_due += u64::from(shard.wheel_live(tick));
            alive += shard.len() as u64;
            let (detached, slots) = shard.detach_next_bucket();
            debug_assert_eq!(detached, tick, "shards advance in lockstep");
            state.pending.push((shard_idx, slots, 0));
        }
        if self.guard_may_trip() {
            n_due += self.heap_due(now, alive);
            self.guard_consider(now, n_due, alive);
        }
    }

    /// Hands one chunk of a detached bucket over to its shard's last second. Returns the slots
    /// handled.
    fn hand_over_chunk(
        &self,
        state: &mut SweepState,
        tick: Tick,
        now: Now,
        budget: usize,
        report: &mut SweepReport,
    ) -> usize {
        let Some((shard_idx, slots, offset)) = state.pending.last_mut() else {
            return 0;
        };
        let chunk_end = (*offset + SWEEP_CHUNK.min(budget)).min(slots.len());
        let chunk = &slots[*offset..chunk_end];
        // Per chunk: the guard may have engaged since the last one.
        let ctx = self.ctx();
        let mut shard = self.shards[*shard_idx].0.lock();
        report.n_expired += shard.hand_over(tick, chunk, *offset, &ctx, now);
        shard.flush_events(&ctx);
        drop(shard);
        let handled = chunk.len();
        *offset = chunk_end;
        if *offset == slots.len() {
            state.pending.pop();
        }
        handled
    }

    /// Expires the last-second keys that are due, one chunk per shard lock. Returns the slots
    /// handled and whether every shard has handled all the keys of the tick.
    fn expire_last_seconds(
        &self,
        now: Now,
        budget: usize,
        report: &mut SweepReport,
    ) -> (usize, bool) {
        let ctx = self.ctx();
        let mut spent = 0;
        let mut done = true;
        for shard in self.shards.iter() {
            loop {
                let max = (budget - spent).min(SWEEP_CHUNK);
                let mut shard = shard.0.lock();
                let (handled, n_expired, more) = shard.expire_last_second(max, &ctx, now);
                shard.flush_events(&ctx);
                let left = shard.last_second_len();
                drop(shard);
                report.n_expired += n_expired;
                spent += handled;
                if more && spent >= budget {
                    report.more = true;
                    return (spent, false);
                }
                if !more {
                    done &= left == 0;
                    break;
                }
            }
        }
        (spent, done)
    }

    /// Expires due heap keys, at most `budget` of them, one chunk per shard lock. Returns how
    /// many; sets `report.more` when due keys remain.
    fn sweep_heap(&self, now: Now, budget: usize, report: &mut SweepReport) -> usize {
        if self.guard_may_trip() {
            let n_due = self.heap_due(now, u64::MAX);
            if self.guard_could_trip_with(n_due) {
                let alive = self.len() as u64;
                self.guard_consider(now, n_due, alive);
            }
        }
        let ctx = self.ctx();
        let mut spent = 0;
        for shard in self.shards.iter() {
            let max = (budget - spent).min(SWEEP_CHUNK);
            let mut shard = shard.0.lock();
            let (handled, n_expired, more) = shard.expire_due_heap(max, &ctx, now);
            shard.flush_events(&ctx);
            drop(shard);
            report.n_expired += n_expired;
            spent += handled;
            if more || spent >= budget {
                report.more = true;
                break;
            }
        }
        spent
    }

    /// Heap keys due at `now`, in every shard, counting at most `cap` (one lock at a time).
    fn heap_due(&self, now: Now, cap: u64) -> u64 {
        let mut due = 0;
        for shard in self.shards.iter() {
            let left = cap.saturating_sub(due) as usize;
            due += shard.0.lock().heap_due(now.ms, left) as u64;
        }
        due
    }

    /// When the ticker should next sweep: the next millisecond with due keys in a last second,
    /// the start of the next tick's last second, or the earliest heap deadline. Also re-arms the
    /// early wake-up for heap deadlines earlier than that.
    pub fn next_sweep_at(&self) -> Instant {
        // While we look, any heap insert wakes the ticker (a stored `Notify` permit), so one
        // that lands in a shard we already looked at is not slept through.
        self.heap_wakeup_ms.store(u64::MAX, Ordering::SeqCst);
        let next_tick = match self.sweep_state.lock().in_flight {
            Some(tick) => tick + 1,
            None => self.swept_through.load(Ordering::Acquire) + 1,
        };
        let next_detach_ms = Self::last_second_begins_ms(next_tick);
        let earliest_key_ms = self
            .shards
            .iter()
            .filter_map(|shard| {
                let shard = shard.0.lock();
                let heap = shard.next_heap_deadline();
                let last_second = shard.next_last_second_deadline();
                heap.into_iter().chain(last_second).min()
            })
            .min()
            .unwrap_or(u64::MAX);
        let wake_ms = next_detach_ms.min(earliest_key_ms);
        // `fetch_min`, not `store`: keep an earlier deadline inserted while we looked.
        self.heap_wakeup_ms.fetch_min(wake_ms, Ordering::SeqCst);
        self.clock.instant_at(wake_ms)
    }

    /// Resolves when a deadline earlier than the one the ticker sleeps until arrives (only heap
    /// keys can have one).
    pub async fn earlier_deadline(&self) {
        self.wakeup.notified().await
    }

    /// Checks the invariants of every shard (see `shard`) and of the sweep in progress; panics
    /// naming the first one broken. It holds the sweep lock, so the sweeper waits, and each
    /// shard's lock in turn. O(keys + wheel elements): tests call it after every step (the
    /// model tests, and a checker thread in the concurrency test); the service never does.
    pub fn check_invariants(&self) {
        let state = self.sweep_state.lock();
        let swept_through = self.swept_through.load(Ordering::Acquire);
        // Between ticks every shard has detached through `swept_through`; while one is in its
        // last second, through that tick, which is the next.
        let detached_through = match state.in_flight {
            None => swept_through,
            Some(tick) => {
                assert_eq!(tick, swept_through + 1, "a sweep skipped a tick");
                tick
            }
        };
        for (shard_idx, shard) in self.shards.iter().enumerate() {
            let shard = shard.0.lock();
            assert_eq!(
                shard.wheel_swept_through(),
                detached_through,
                "shard {shard_idx} is not in lockstep"
            );
            assert!(
                state.in_flight.is_some() || shard.last_second_len() == 0,
                "shard {shard_idx} has last-second keys of a tick that is done"
            );
            let detached = state
                .pending
                .iter()
                .find(|(pending_idx, _, _)| *pending_idx == shard_idx)
                .map(|(_, slots, offset)| (detached_through, slots.as_slice(), *offset));
            shard.check_invariants(detached, &self.hasher);
        }
    }

    /// The last tick fully swept, in seconds since the epoch (for lag and health).
    pub fn swept_through(&self) -> Tick {
        self.swept_through.load(Ordering::Acquire)
    }

    pub(super) fn wake_for_heap_deadline(&self, deadline_ms: u64) {
        if deadline_ms < self.heap_wakeup_ms.fetch_min(deadline_ms, Ordering::SeqCst) {
            self.wakeup.notify_one();
        }
    }
}
