//! Whether one webhook URL's receiver, as a whole, is failing: the pause/probe state machine.
//!
//! States, from the counts it keeps:
//! - *healthy*: fewer than [`PAUSE_AFTER`] receiver-wide failures in a row; attempts go out at
//!   full concurrency;
//! - *paused*: at least [`PAUSE_AFTER`] in a row; until `paused_until` nothing starts, then one
//!   attempt at a time (a probe); each failed probe pauses again for the next step of the retry
//!   schedule, never longer than [`MAX_PAUSE`];
//! - a `Retry-After` from the receiver pauses the URL for that long in either state.
//!
//! Invariants (checked by the model test below after every step):
//! - [`Health::allowance`] is 0 while a pause runs, 1 when paused with no pause running, and
//!   unlimited when healthy with no pause running;
//! - a pause started by failures is never longer than [`MAX_PAUSE`]; a later pause never
//!   shortens an earlier one;
//! - one success makes the URL healthy at once, whatever came before.
//!
//! Pure: time and the jitter come in as arguments; the delivery task (`endpoint`) owns the
//! clock and the network.

use std::time::Duration;

use tokio::time::Instant;

use super::backoff;

/// Receiver-wide failures in a row that pause a URL.
pub const PAUSE_AFTER: u32 = 3;
/// Longest pause between probes of a failing URL, whatever the retry schedule says: a receiver
/// that comes back is noticed within this long.
pub const MAX_PAUSE: Duration = Duration::from_secs(30);

/// See the module documentation.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Health {
    /// Receiver-wide failures since the last success.
    consecutive_failures: u32,
    /// Pauses in a row, to step through the schedule.
    pauses: u32,
    /// No attempt starts before this instant.
    paused_until: Option<Instant>,
}

impl Health {
    /// At most this many attempts may be in flight at `now` (`usize::MAX`: no limit of its own).
    pub fn allowance(&self, now: Instant) -> usize {
        match self.paused_until {
            Some(until) if until > now => 0,
            _ if self.is_paused() => 1,
            _ => usize::MAX,
        }
    }

    /// Whether the receiver counts as failing (attempts go out one at a time).
    pub fn is_paused(&self) -> bool {
        self.consecutive_failures >= PAUSE_AFTER
    }

    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// The end of the pause running at `now`, if one is.
    pub fn paused_until(&self, now: Instant) -> Option<Instant> {
        self.paused_until.filter(|until| *until > now)
    }

    /// An attempt succeeded: healthy again. Returns whether the URL had been paused.
    pub fn succeeded(&mut self) -> bool {
        let was_paused = self.is_paused();
        *self = Self::default();
        was_paused
    }

    /// Counts a receiver-wide failure at `now`; returns the pause it starts, if any. `jitter`
    /// in `[0, 1)` spreads the pause as the retry schedule does (see [`backoff::delay`]).
    pub fn failed(&mut self, schedule: &[Duration], now: Instant, jitter: f64) -> Option<Duration> {
        self.consecutive_failures += 1;
        if !self.is_paused() {
            return None;
        }
        self.pauses += 1;
        let pause = backoff::delay(schedule, self.pauses, jitter).min(MAX_PAUSE);
        self.pause_until(now + pause);
        Some(pause)
    }

    /// Starts no attempt before `until` (a `Retry-After`); an earlier end never shortens a
    /// pause already running.
    pub fn pause_until(&mut self, until: Instant) {
        self.paused_until = Some(
            self.paused_until
                .map_or(until, |earlier| earlier.max(until)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SCHEDULE: [Duration; 3] = [
        Duration::from_secs(1),
        Duration::from_secs(5),
        Duration::from_secs(60),
    ];

    #[test]
    fn a_url_pauses_after_three_failures_in_a_row_and_probes_one_at_a_time() {
        let start = Instant::now();
        let mut health = Health::default();
        assert_eq!(health.failed(&SCHEDULE, start, 0.5), None);
        assert_eq!(health.failed(&SCHEDULE, start, 0.5), None);
        assert_eq!(health.allowance(start), usize::MAX);
        let pause = health
            .failed(&SCHEDULE, start, 0.5)
            .expect("the third pauses");
        assert_eq!(pause, Duration::from_secs(1)); // the first step, jitter 0.5 = none
        assert_eq!(health.allowance(start), 0);
        assert_eq!(health.paused_until(start), Some(start + pause));
        assert_eq!(health.allowance(start + pause), 1, "then one probe");
        assert!(health.succeeded(), "it was paused");
        assert_eq!(health.allowance(start + pause), usize::MAX);
        assert!(!health.succeeded());
    }

    #[test]
    fn pauses_step_through_the_schedule_but_never_past_the_cap() {
        let start = Instant::now();
        let mut health = Health::default();
        let pauses: Vec<Option<Duration>> = (0..6)
            .map(|_| health.failed(&SCHEDULE, start, 0.5))
            .collect();
        let secs = |s| Some(Duration::from_secs(s));
        assert_eq!(pauses, [None, None, secs(1), secs(5), secs(30), secs(30)]);
    }

    #[test]
    fn retry_after_pauses_a_healthy_url_and_never_shortens_a_pause() {
        let start = Instant::now();
        let mut health = Health::default();
        health.pause_until(start + Duration::from_secs(10));
        assert_eq!(health.allowance(start), 0);
        health.pause_until(start + Duration::from_secs(2));
        assert_eq!(
            health.paused_until(start),
            Some(start + Duration::from_secs(10))
        );
        assert_eq!(
            health.allowance(start + Duration::from_secs(10)),
            usize::MAX
        );
    }

    #[derive(Clone, Debug)]
    enum Step {
        Succeed,
        Fail(f64),
        RetryAfter(u64),
        Wait(u64),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            1 => Just(Step::Succeed),
            3 => (0.0..1.0f64).prop_map(Step::Fail),
            1 => (0u64..120_000).prop_map(Step::RetryAfter),
            2 => (0u64..40_000).prop_map(Step::Wait),
        ]
    }

    proptest! {
        /// The invariants of the module documentation, against a reference model of the
        /// counts, after every step.
        #[test]
        fn health_follows_its_invariants(steps in proptest::collection::vec(step(), 1..100)) {
            let start = Instant::now();
            let mut now = start;
            let mut health = Health::default();
            let mut failures = 0u32;
            let mut pause_end: Option<Instant> = None;
            for step in steps {
                match step {
                    Step::Succeed => {
                        health.succeeded();
                        failures = 0;
                        pause_end = None;
                    }
                    Step::Fail(jitter) => {
                        let pause = health.failed(&SCHEDULE, now, jitter);
                        failures += 1;
                        prop_assert_eq!(pause.is_some(), failures >= PAUSE_AFTER);
                        if let Some(pause) = pause {
                            prop_assert!(pause <= MAX_PAUSE);
                            pause_end = Some(pause_end.map_or(now + pause, |end| end.max(now + pause)));
                        }
                    }
                    Step::RetryAfter(ms) => {
                        let until = now + Duration::from_millis(ms);
                        health.pause_until(until);
                        pause_end = Some(pause_end.map_or(until, |end| end.max(until)));
                    }
                    Step::Wait(ms) => now += Duration::from_millis(ms),
                }
                let running = pause_end.filter(|end| *end > now);
                prop_assert_eq!(health.paused_until(now), running);
                let expected = match (running, failures >= PAUSE_AFTER) {
                    (Some(_), _) => 0,
                    (None, true) => 1,
                    (None, false) => usize::MAX,
                };
                prop_assert_eq!(health.allowance(now), expected);
                prop_assert_eq!(health.consecutive_failures(), failures);
            }
        }
    }
}
