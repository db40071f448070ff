//! When the stream's feed wakes its readers: at once while events are sparse, at most once per
//! [`WAKE_INTERVAL`] while they keep coming. Pure: given times, never reads a clock.
//!
//! Why both: every wake-up costs each connected client a task poll and a write. Waking a
//! thousand clients per event is what made them cost 1 ms per heartbeat under load, so a busy
//! feed coalesces; but a fixed 10 ms coalescing also delays every event of a quiet feed by up to
//! 10 ms (issue 27: delivery p99 16.7 ms at 300 creations/s), for no saving: at a few events
//! per interval, one wake-up per event is about what coalescing costs anyway.
//!
//! The rule, in appends (one append is whatever the feed drained from the bus in one go, so a
//! mass expiry's thousand events are one append):
//! - quiet: each append wakes at once; more than [`BUSY_APPENDS`] of them within one
//!   interval (a window starting at the first append after the previous window) turns it busy;
//! - busy: readers are woken [`WAKE_INTERVAL`] after the previous wake-up; a wake-up that
//!   announces at most [`QUIET_APPENDS`] appends (fewer than ~300 a second) turns it quiet, as
//!   does an append that comes a whole interval after the last wake-up.
//!
//! So a quiet feed wakes readers at most `BUSY_APPENDS` times per window (600 a second), and a
//! busy one once per interval; the first event after a quiet spell is never delayed.
//!
//! How many appends make a feed busy depends on how many clients each wake-up reaches
//! ([`WakePacer::set_clients`]): a wake-up costs each client a write, so what is sparse for ten
//! clients is not for a thousand. A quiet feed may cost at most [`WRITE_BUDGET`] client writes
//! per interval: with 1,000 clients it turns busy from the third append within an interval
//! (more than 200 a second), and quiet again when an interval gathers one. Measured at 300
//! events a second to 1,000 reading clients (BENCHMARKS.md, seventeenth session): one wake-up
//! per event took 3.7-4.0 us of server CPU per event per stream, one per interval 2.4-2.7 us,
//! and the delivery p99 fell (21.5 against 25.2 ms, medians) while the p50 rose by 2.5 ms; at
//! 100 a second each event still wakes them at once.

use std::time::Duration;

use tokio::time::Instant;

/// Readers are woken at most this often while events keep coming.
pub const WAKE_INTERVAL: Duration = Duration::from_millis(10);

/// More appends than this within one [`WAKE_INTERVAL`] turn the feed busy: 600 a second, twice
/// the 300 creations/s at which issue 27 measures delivery, which stays quiet.
pub const BUSY_APPENDS: u32 = 6;

/// A busy interval that gathered at most this many appends turns the feed quiet.
pub const QUIET_APPENDS: u32 = 3;

/// The client writes per [`WAKE_INTERVAL`] a quiet feed may cause (each wake-up writes to each
/// client): 200,000 a second. Up to 333 clients it allows [`BUSY_APPENDS`] appends per interval.
pub const WRITE_BUDGET: usize = 2000;

/// How many appends within one interval a quiet feed takes before it turns busy, and how few
/// appends a busy interval must gather to turn it quiet, for wake-ups that reach `clients`
/// clients: [`BUSY_APPENDS`] and [`QUIET_APPENDS`] as long as [`WRITE_BUDGET`] allows, fewer
/// for more clients (at least one append at once, always).
pub fn appends_for(clients: usize) -> (u32, u32) {
    let within_budget = WRITE_BUDGET / clients.max(1);
    let busy = u32::try_from(within_budget)
        .unwrap_or(u32::MAX)
        .clamp(1, BUSY_APPENDS);
    (busy, busy * QUIET_APPENDS / BUSY_APPENDS)
}

/// See the module documentation.
#[derive(Debug)]
pub struct WakePacer {
    /// Whether appends are coalesced.
    busy: bool,
    /// When readers were last woken (`None` before the first time).
    last_wake: Option<Instant>,
    /// Quiet: when the current window began; appends within `WAKE_INTERVAL` of it are counted.
    window_start: Instant,
    /// Quiet: appends in the current window. Busy: appends since the last wake-up.
    appends: u32,
    /// More appends than this in a window turn it busy ([`appends_for`] the clients).
    busy_appends: u32,
    /// A busy interval with at most this many appends turns it quiet.
    quiet_appends: u32,
}

impl WakePacer {
    pub fn new(now: Instant) -> Self {
        Self {
            busy: false,
            last_wake: None,
            window_start: now,
            appends: 0,
            busy_appends: BUSY_APPENDS,
            quiet_appends: QUIET_APPENDS,
        }
    }

    /// Wake-ups from now on reach `clients` clients (see [`appends_for`]).
    pub fn set_clients(&mut self, clients: usize) {
        (self.busy_appends, self.quiet_appends) = appends_for(clients);
    }

    /// Events were appended at `now`: when the readers must be woken (`now` or earlier: at
    /// once).
    pub fn appended(&mut self, now: Instant) -> Instant {
        if self.busy {
            let due = self.last_wake.map_or(now, |last| last + WAKE_INTERVAL);
            if now < due || self.appends > 0 {
                // Within the interval, or past it with appends gathered (the wake-up is due;
                // it decides whether the feed stays busy).
                self.appends += 1;
                return due;
            }
            // A whole interval went by without an append: nothing is coming.
            self.quiet(now);
        }
        if now >= self.window_start + WAKE_INTERVAL {
            self.window_start = now;
            self.appends = 0;
        }
        self.appends += 1;
        match self.last_wake {
            Some(last) if self.appends > self.busy_appends => {
                self.busy = true;
                self.appends = 1;
                (last + WAKE_INTERVAL).max(now)
            }
            _ => now,
        }
    }

    /// `events` events were appended at `now` in one go, after they gathered on the bus while
    /// a busy feed rested (`stream::feed`): they count as that many appends, as each would have
    /// been one had the feed taken them as they came, so resting does not make a busy feed
    /// look quiet.
    pub fn appended_gathered(&mut self, now: Instant, events: usize) -> Instant {
        let due = self.appended(now);
        if self.busy {
            let more = u32::try_from(events.saturating_sub(1)).unwrap_or(u32::MAX);
            self.appends = self.appends.saturating_add(more);
        }
        due
    }

    /// The readers were woken at `now`.
    pub fn woke(&mut self, now: Instant) {
        self.last_wake = Some(now);
        if self.busy {
            if self.appends <= self.quiet_appends {
                self.quiet(now);
            } else {
                self.appends = 0;
            }
        }
    }

    /// Whether appends are being coalesced (tests, and what a reader may want to know).
    pub fn is_busy(&self) -> bool {
        self.busy
    }

    fn quiet(&mut self, now: Instant) {
        self.busy = false;
        self.window_start = now;
        self.appends = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs appends at the given offsets (µs) as the feed does: readers are woken when the
    /// earliest pending due time comes, or at once. Returns each append's delay to its wake-up
    /// (µs), and the number of wake-ups.
    fn check(offsets_us: &[u64]) -> (Vec<u64>, usize) {
        check_with_clients(offsets_us, 1)
    }

    /// [`check`] with wake-ups that reach `clients` clients.
    fn check_with_clients(offsets_us: &[u64], clients: usize) -> (Vec<u64>, usize) {
        let start = Instant::now();
        let at = |us: u64| start + Duration::from_micros(us);
        let mut pacer = WakePacer::new(start);
        pacer.set_clients(clients);
        let mut pending: Vec<u64> = Vec::new();
        let mut due: Option<Instant> = None;
        let mut delays = Vec::new();
        let mut wakes = 0;
        let mut wake = |pacer: &mut WakePacer, now: Instant, pending: &mut Vec<u64>| {
            pacer.woke(now);
            wakes += 1;
            delays.extend(
                pending
                    .drain(..)
                    .map(|us| (now - at(us)).as_micros() as u64),
            );
        };
        for &us in offsets_us {
            if let Some(when) = due.filter(|when| *when <= at(us)) {
                wake(&mut pacer, when, &mut pending);
                due = None;
            }
            pending.push(us);
            let when = pacer.appended(at(us));
            if when <= at(us) {
                wake(&mut pacer, at(us), &mut pending);
                due = None;
            } else {
                due = Some(due.map_or(when, |due| due.min(when)));
            }
        }
        if let Some(when) = due {
            wake(&mut pacer, when, &mut pending);
        }
        (delays, wakes)
    }

    const INTERVAL_US: u64 = WAKE_INTERVAL.as_micros() as u64;

    #[test]
    fn sparse_events_each_wake_at_once() {
        // 300 a second, evenly spaced (the rate issue 27 measures), then a lone event later.
        let offsets: Vec<u64> = (0..300)
            .map(|i| i * 10_000 / 3)
            .chain([5_000_000])
            .collect();
        let (delays, wakes) = check(&offsets);
        assert!(delays.iter().all(|&delay| delay == 0), "{delays:?}");
        assert_eq!(wakes, 301);
    }

    #[test]
    fn a_burst_is_coalesced_then_the_first_event_after_it_wakes_at_once() {
        // 1,000 appends a second for a second, then one event 100 ms after the last.
        let offsets: Vec<u64> = (0..1000).map(|i| i * 1000).chain([1_099_000]).collect();
        let (delays, wakes) = check(&offsets);
        assert!(delays[..BUSY_APPENDS as usize]
            .iter()
            .all(|&delay| delay == 0));
        let coalesced = delays.iter().filter(|&&delay| delay > 0).count();
        assert!(coalesced > 850, "{coalesced} of 1000 coalesced");
        assert!(
            delays.iter().all(|&delay| delay <= INTERVAL_US),
            "{delays:?}"
        );
        assert_eq!(delays.last(), Some(&0), "the first event after the burst");
        assert!(wakes < 120, "{wakes} wake-ups");
    }

    #[test]
    fn a_busy_feed_wakes_once_per_interval_and_a_slower_one_turns_quiet() {
        // An append every 100 µs for 1 s: the first BUSY_APPENDS + 1 wake at once (the last of
        // them turns it busy), then one wake-up per 10 ms.
        let busy: Vec<u64> = (0..10_000).map(|i| i * 100).collect();
        let (_, wakes) = check(&busy);
        assert!(
            (100..=100 + BUSY_APPENDS as usize).contains(&wakes),
            "{wakes}"
        );
        // Then 200 a second: the first coalesced interval gathers 2 appends, so quiet again.
        let slower: Vec<u64> = busy
            .iter()
            .copied()
            .chain((1..=200).map(|i| 1_000_000 + i * 5_000))
            .collect();
        let (delays, _) = check(&slower);
        assert!(delays[delays.len() - 190..].iter().all(|&delay| delay == 0));
    }

    #[test]
    fn more_clients_turn_the_feed_busy_at_fewer_appends() {
        assert_eq!(appends_for(0), (BUSY_APPENDS, QUIET_APPENDS));
        assert_eq!(appends_for(333), (BUSY_APPENDS, QUIET_APPENDS));
        assert_eq!(appends_for(500), (4, 2));
        assert_eq!(appends_for(1000), (2, 1));
        assert_eq!(appends_for(5000), (1, 0));
        assert_eq!(appends_for(usize::MAX), (1, 0));
    }

    /// Evenly spaced appends, `per_second` of them for a second, then a lone one 4 s later.
    fn evenly(per_second: u64) -> Vec<u64> {
        (0..per_second)
            .map(|i| i * 1_000_000 / per_second)
            .chain([5_000_000])
            .collect()
    }

    #[test]
    fn a_thousand_clients_are_woken_once_per_interval_at_300_events_a_second() {
        let (delays, wakes) = check_with_clients(&evenly(300), 1000);
        assert_eq!(delays[..2], [0, 0], "the first two at once");
        assert!(
            delays.iter().all(|&delay| delay <= INTERVAL_US),
            "{delays:?}"
        );
        assert!((100..=103).contains(&wakes), "{wakes} wake-ups");
        assert_eq!(
            delays.last(),
            Some(&0),
            "the first event after a quiet spell"
        );
        // The same appends to ten clients: each at once, as before.
        let (delays, wakes) = check_with_clients(&evenly(300), 10);
        assert!(delays.iter().all(|&delay| delay == 0), "{delays:?}");
        assert_eq!(wakes, 301);
    }

    #[test]
    fn a_thousand_clients_are_woken_at_once_at_100_events_a_second() {
        let (delays, wakes) = check_with_clients(&evenly(100), 1000);
        assert!(delays.iter().all(|&delay| delay == 0), "{delays:?}");
        assert_eq!(wakes, 101);
    }
}
