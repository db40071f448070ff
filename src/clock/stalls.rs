//! Own-stall detection and compensation: the registry's clock stands still while the process
//! itself could not run.
//!
//! A watchdog (`ticker::watch_for_stalls`) turns every [`WATCH_PERIOD_MS`] and each turn
//! promises the next one within the period plus [`STALL_SLACK_MS`]. Whoever reads the clock
//! first past that promise (the watchdog itself, the ticker, or a heartbeat that was queued in a
//! socket while the process was stopped) declares a stall: the time from when the watchdog
//! should have turned to now. The stall's length is added to an offset that registry time
//! subtracts, so every deadline moves later by exactly that length, in O(1), with no walk over
//! the keys; and since the first reader after the stall accounts it before it converts its own
//! instant, a queued heartbeat never sees a deadline that passed only because we were stopped.
//!
//! Registry time (ms) is a piecewise-linear function of real monotonic time (ms since the
//! epoch): slope 1 outside stalls, flat across the last stall (`frozen_from..resumed_at`),
//! continuous, never decreasing. A stall is never overestimated: it counts from the promised
//! turn, not from the last turn, so it can be shorter than the real pause by up to one period,
//! never longer; a deadline moves by at most the pause.
//!
//! Readers take no lock: the mapping's three numbers are read under a sequence counter (a
//! seqlock: the writer makes it odd while it writes, and a reader retries if it changed), so a
//! heartbeat pays two extra loads of a line that changes only at a stall. Accounting is rare
//! and takes a mutex.
//!
//! Until a watchdog arms it, nothing is ever declared a stall: registry tests that jump the
//! clock between calls (a stalled *ticker*, not a stalled process) see plain time.

use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicU64, Ordering};

use parking_lot::Mutex;

/// How often the watchdog turns.
pub const WATCH_PERIOD_MS: u64 = 100;

/// How late past its period the watchdog may turn before the lateness counts as a stall: below
/// it is scheduling jitter, shown only as expiry lateness.
pub const STALL_SLACK_MS: u64 = 250;

/// How many recent stalls are kept for lateness accounting and `/healthz`.
const RECENT_STALLS: usize = 64;

/// `watch_deadline_ms` while no watchdog runs.
const DISARMED: u64 = u64::MAX;

/// One stall of the process, in real (monotonic) ms since the epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stall {
    /// When the watchdog should have turned, plus the slack (registry time stood still from here).
    pub began_ms: u64,
    pub length_ms: u64,
}

/// What has been accounted so far (for metrics and health).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StallTotals {
    pub count: u64,
    pub total_ms: u64,
    pub last: Option<Stall>,
}

/// See the module documentation.
#[derive(Debug)]
pub struct Stalls {
    /// Odd while a stall is being written.
    seq: AtomicU64,
    /// All stall time accounted: after the last stall, registry time = real - offset.
    offset_ms: AtomicU64,
    /// The last stall: registry time stood still from real `frozen_from_ms` to `resumed_at_ms`.
    frozen_from_ms: AtomicU64,
    resumed_at_ms: AtomicU64,
    /// Real ms past which a reading declares a stall; [`DISARMED`] while no watchdog runs.
    watch_deadline_ms: AtomicU64,
    log: Mutex<StallLog>,
}

#[derive(Debug, Default)]
struct StallLog {
    totals: StallTotals,
    recent: VecDeque<Stall>,
}

/// Registry time of a real instant, and whether it fell inside the last stall (then it is the
/// instant registry time stood still at, exactly).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapped {
    pub ms: u64,
    pub frozen: bool,
}

/// The mapping's parameters, read together.
#[derive(Clone, Copy, Debug)]
struct Mapping {
    offset_ms: u64,
    frozen_from_ms: u64,
    resumed_at_ms: u64,
}

impl Mapping {
    /// The offset before the last stall.
    fn before_ms(self) -> u64 {
        self.offset_ms - (self.resumed_at_ms - self.frozen_from_ms)
    }

    fn map(self, real_ms: u64) -> Mapped {
        if real_ms >= self.resumed_at_ms {
            return Mapped {
                ms: real_ms - self.offset_ms,
                frozen: false,
            };
        }
        let before = self.before_ms();
        if real_ms > self.frozen_from_ms {
            Mapped {
                ms: self.frozen_from_ms - before,
                frozen: true,
            }
        } else {
            Mapped {
                ms: real_ms.saturating_sub(before),
                frozen: false,
            }
        }
    }

    /// The real instant of registry time `ms` (the end of the stall for the instant registry
    /// time stood still at; earlier stalls than the last are folded into the offset before it).
    fn unmap(self, ms: i64) -> i64 {
        let before = self.before_ms();
        let frozen_at = (self.frozen_from_ms - before) as i64;
        if ms >= frozen_at {
            ms.saturating_add(self.offset_ms as i64)
        } else {
            ms.saturating_add(before as i64)
        }
    }
}

impl Default for Stalls {
    fn default() -> Self {
        Self {
            seq: AtomicU64::new(0),
            offset_ms: AtomicU64::new(0),
            frozen_from_ms: AtomicU64::new(0),
            resumed_at_ms: AtomicU64::new(0),
            watch_deadline_ms: AtomicU64::new(DISARMED),
            log: Mutex::default(),
        }
    }
}

impl Stalls {
    /// Registry time of `real_ms`, declaring a stall first if the watchdog is overdue.
    pub fn map(&self, real_ms: u64) -> Mapped {
        if real_ms > self.watch_deadline_ms.load(Ordering::Acquire) {
            self.account(real_ms);
        }
        self.mapping().map(real_ms)
    }

    /// Registry time of `real_ms` without declaring anything: for instants that are not
    /// readings of the clock (a client's future deadline).
    pub fn map_quietly(&self, real_ms: u64) -> u64 {
        self.mapping().map(real_ms).ms
    }

    /// The real instant of registry time `ms`.
    pub fn unmap(&self, ms: i64) -> i64 {
        self.mapping().unmap(ms)
    }

    /// A watchdog turn at `real_ms`: accounts a stall if it is overdue, and promises the next
    /// turn within a period plus the slack. The first turn arms stall detection.
    pub fn watch(&self, real_ms: u64) {
        self.map(real_ms);
        let next = real_ms + WATCH_PERIOD_MS + STALL_SLACK_MS;
        let _ =
            self.watch_deadline_ms
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |deadline| {
                    (deadline == DISARMED || next > deadline).then_some(next)
                });
    }

    /// Stops detection (the watchdog is stopping: its silence from now on is no stall).
    pub fn disarm(&self) {
        self.watch_deadline_ms.store(DISARMED, Ordering::Release);
    }

    /// Stall time that began after real instant `real_ms` (among the recent stalls kept).
    pub fn stalled_since(&self, real_ms: u64) -> u64 {
        // Fast path, no lock: nothing began after `real_ms`.
        if self.frozen_from_ms.load(Ordering::Acquire) <= real_ms {
            return 0;
        }
        let log = self.log.lock();
        log.recent
            .iter()
            .filter(|stall| stall.began_ms > real_ms)
            .map(|stall| stall.length_ms)
            .sum()
    }

    pub fn totals(&self) -> StallTotals {
        self.log.lock().totals
    }

    fn mapping(&self) -> Mapping {
        loop {
            let seq = self.seq.load(Ordering::Acquire);
            if seq & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let mapping = Mapping {
                offset_ms: self.offset_ms.load(Ordering::Relaxed),
                frozen_from_ms: self.frozen_from_ms.load(Ordering::Relaxed),
                resumed_at_ms: self.resumed_at_ms.load(Ordering::Relaxed),
            };
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == seq {
                return mapping;
            }
        }
    }

    /// Declares the stall that ends at `real_ms`, unless another reader already did.
    #[cold]
    fn account(&self, real_ms: u64) {
        let mut log = self.log.lock();
        let deadline = self.watch_deadline_ms.load(Ordering::Acquire);
        if real_ms <= deadline {
            return;
        }
        // The watchdog promised to turn by `deadline - slack`; lateness past the slack is the
        // stall. Counting from the deadline, not from the promise, keeps registry time from
        // ever running backwards: readings up to the deadline saw plain time.
        let began_ms = deadline;
        let length_ms = real_ms - began_ms;
        let offset_ms = self.offset_ms.load(Ordering::Relaxed) + length_ms;
        self.seq.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::Release);
        self.offset_ms.store(offset_ms, Ordering::Relaxed);
        self.frozen_from_ms.store(began_ms, Ordering::Relaxed);
        self.resumed_at_ms.store(real_ms, Ordering::Relaxed);
        self.seq.fetch_add(1, Ordering::Release);
        // Until the watchdog turns again, it has a fresh period from now.
        self.watch_deadline_ms.store(
            real_ms + WATCH_PERIOD_MS + STALL_SLACK_MS,
            Ordering::Release,
        );
        let stall = Stall {
            began_ms,
            length_ms,
        };
        log.totals.count += 1;
        log.totals.total_ms += length_ms;
        log.totals.last = Some(stall);
        if log.recent.len() == RECENT_STALLS {
            log.recent.pop_front();
        }
        log.recent.push_back(stall);
        tracing::warn!(
            stall_ms = length_ms,
            total_stalls = log.totals.count,
            "the process stalled (it could not run: a VM pause, SIGSTOP, swapping or a stuck host); \
             every deadline was extended by the stall, so no key expires on its account"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_a_stall_until_a_watchdog_arms_detection() {
        let stalls = Stalls::default();
        assert_eq!(stalls.map(0).ms, 0);
        assert_eq!(stalls.map(1_000_000).ms, 1_000_000);
        assert_eq!(stalls.totals().count, 0);
    }

    #[test]
    fn a_late_reading_stands_registry_time_still_from_the_end_of_the_slack() {
        let stalls = Stalls::default();
        stalls.watch(1_000);
        // On time (within period + slack): plain time.
        assert_eq!(stalls.map(1_300).ms, 1_300);
        // The watchdog promised a turn by 1_100, 1_350 with the slack; a reading at 9_350 finds
        // an 8 s stall.
        let mapped = stalls.map(9_350);
        assert_eq!(
            mapped,
            Mapped {
                ms: 1_350,
                frozen: false
            }
        );
        assert_eq!(
            stalls.totals().last,
            Some(Stall {
                began_ms: 1_350,
                length_ms: 8_000
            })
        );
        // Continuous and never decreasing across the stall.
        assert_eq!(stalls.map(1_350).ms, 1_350);
        assert_eq!(
            stalls.map(5_000),
            Mapped {
                ms: 1_350,
                frozen: true
            }
        );
        assert_eq!(stalls.map(9_450).ms, 1_450);
        // Back: a deadline in registry time lands a stall later in real time.
        assert_eq!(stalls.unmap(1_450), 9_450);
        assert_eq!(stalls.unmap(1_000), 1_000);
        assert_eq!(stalls.stalled_since(1_000), 8_000);
        assert_eq!(stalls.stalled_since(1_350), 0);
    }

    #[test]
    fn stalls_add_up_and_a_disarmed_clock_counts_none() {
        let stalls = Stalls::default();
        stalls.watch(0);
        stalls.map(2_350); // 2 s past 350
        stalls.watch(2_350);
        stalls.map(5_700); // 3 s past 2_700
        assert_eq!(stalls.totals().count, 2);
        assert_eq!(stalls.totals().total_ms, 5_000);
        assert_eq!(stalls.map(5_700).ms, 700);
        assert_eq!(stalls.stalled_since(0), 5_000);
        stalls.disarm();
        assert_eq!(stalls.map(60_000).ms, 55_000);
        assert_eq!(stalls.totals().count, 2);
    }

    proptest::proptest! {
        /// Whatever the readings and stalls, registry time never runs backwards, never runs
        /// faster than real time, and a stall never counts for more than the time that passed.
        #[test]
        fn registry_time_is_monotone_and_never_gains_on_real_time(
            steps in proptest::collection::vec((0u64..3_000, proptest::bool::ANY), 1..60)
        ) {
            let stalls = Stalls::default();
            stalls.watch(0);
            let (mut real, mut last) = (0u64, 0u64);
            for (gap, watch) in steps {
                real += gap;
                let mapped = stalls.map(real).ms;
                proptest::prop_assert!(mapped >= last);
                proptest::prop_assert!(mapped - last <= gap);
                proptest::prop_assert!(mapped <= real);
                proptest::prop_assert_eq!(real - mapped, stalls.totals().total_ms);
                if watch {
                    stalls.watch(real);
                }
                last = mapped;
            }
        }
    }
}
