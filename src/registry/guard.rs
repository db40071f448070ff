//! The mass-expiry guard: when a large share of the fleet is about to expire at once, the
//! likeliest cause is on our side (a partition around the registry, a broken load balancer), not
//! a mass death; so due keys are *held* (not expired, no events) until heartbeats come back, an
//! operator releases them, or a maximum hold runs out.
//!
//! A pure state machine on registry time (no clock, no keys): the sweeper tells it how many keys
//! are due before it expires any (`consider`), how many it expired (`expired`), and lets time
//! pass (`tick`); the registry holds and releases the keys it is told to.
//!
//! Phases: `Armed` -> `Engaged` (the threshold tripped, or an operator) -> `Releasing` (the
//! maximum hold ran out, or an operator) -> `Armed` once nothing is held. An engagement by the
//! threshold whose held keys were all renewed (the partition healed) ends at once with nothing
//! to release, at the earliest one window after it began.
//!
//! Two paces of release: the maximum hold running out releases at a bounded rate (receivers are
//! not flooded by what may still be a partition); an operator's release lets every held key go
//! at once (the operator decided they are dead), and hurries a bounded release under way. "At
//! once" bounds the pace, not the work per lock: the registry still releases in chunks.
//!
//! It cannot get stuck (Eureka's self-preservation can: its baseline drifts as renewals stop):
//! - the baseline (alive keys) is frozen when the guard trips, and nothing is recomputed from it;
//! - an engagement ends at `since + max_hold` whatever happens, and cannot be extended (an
//!   operator's engage while engaged changes nothing, and is refused while releasing);
//! - releasing ends when the held keys are gone, at a rate that empties the hold within
//!   `release_over` (or at once, by an operator), and does not re-trip meanwhile.
//!
//! So a key is held at most `max_hold`, and expired at most `max_hold + release_over` (plus a
//! tick) after its deadline.
//!
//! The threshold: more than `threshold` of the keys alive at the start of a `window`, and at
//! least `min_keys`, expiring within the window, counting the keys due in the tick about to be
//! swept: `expired in the window + due now`, against `alive + expired in the window`.

use std::collections::VecDeque;

use serde::Serialize;

/// Held keys released per second at least: a small hold is released at once, not one a second.
pub const MIN_RELEASE_PER_S: u64 = 100;

/// Tunables (`--expiry-guard*`).
#[derive(Clone, Debug, PartialEq)]
pub struct GuardConfig {
    /// Whether the threshold can trip the guard (an operator can engage it either way).
    pub enabled: bool,
    /// The share of alive keys (0-1) whose expiry within a window trips the guard.
    pub threshold: f64,
    /// Fewer expiries than this never trip it (a small fleet losing a few keys is not a partition).
    pub min_keys: u64,
    pub window_ms: u64,
    /// The longest an engagement lasts.
    pub max_hold_ms: u64,
    /// The held keys are released over this long.
    pub release_over_ms: u64,
}

impl GuardConfig {
    /// A guard the threshold never trips (tests of the bare expiry mechanics, benchmarks).
    pub fn off() -> Self {
        Self {
            enabled: false,
            ..Self::default()
        }
    }
}

impl Default for GuardConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            threshold: 0.3,
            min_keys: 100,
            window_ms: 10_000,
            max_hold_ms: 120_000,
            release_over_ms: 10_000,
        }
    }
}

/// Who engaged the guard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EngagedBy {
    Threshold,
    Operator,
}

/// What ended an engagement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReleasedBy {
    /// The maximum hold ran out.
    MaxHold,
    Operator,
    /// Every held key was renewed.
    Healed,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Phase {
    Armed,
    Engaged {
        by: EngagedBy,
        since_ms: u64,
        /// Alive keys when it engaged (frozen).
        baseline: u64,
        /// Keys expired in the window plus due, when it tripped (0 for an operator).
        expiring: u64,
    },
    Releasing {
        by: ReleasedBy,
        since_ms: u64,
        /// Held keys released per second; `None`: every one at once (an operator's release).
        per_s: Option<u64>,
        released: u64,
    },
}

/// A change of phase, for the log, the metrics and the `guard.*` events.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Transition {
    Engaged {
        by: EngagedBy,
        baseline: u64,
        expiring: u64,
    },
    Released {
        by: ReleasedBy,
        held: u64,
    },
}

/// Why an operator's request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GuardError {
    #[error(
        "the guard is releasing held keys; it can be engaged again once they are released \
         (a key is never held longer than the maximum hold)"
    )]
    Releasing,
}

/// See the module documentation.
#[derive(Debug)]
pub struct Guard {
    config: GuardConfig,
    phase: Phase,
    /// Keys the sweeper expired, by registry second, over the last window.
    window: VecDeque<(u64, u64)>,
    engagements: u64,
    releases: u64,
}

impl Guard {
    pub fn new(config: GuardConfig) -> Self {
        Self {
            config,
            phase: Phase::Armed,
            window: VecDeque::new(),
            engagements: 0,
            releases: 0,
        }
    }

    pub fn config(&self) -> &GuardConfig {
        &self.config
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Due keys are held rather than expired.
    pub fn holding(&self) -> bool {
        matches!(self.phase, Phase::Engaged { .. })
    }

    /// `(engagements, releases)` since start.
    pub fn counts(&self) -> (u64, u64) {
        (self.engagements, self.releases)
    }

    /// When the current engagement ends by itself (registry ms).
    pub fn hold_ends_at(&self) -> Option<u64> {
        match self.phase {
            Phase::Engaged { since_ms, .. } => Some(since_ms + self.config.max_hold_ms),
            _ => None,
        }
    }

    /// `n_due` keys are due at `now_ms` with `alive` keys indexed (the due ones included):
    /// trips the guard if, with the expiries of the window, they cross the threshold.
    pub fn consider(&mut self, now_ms: u64, n_due: u64, alive: u64) -> Option<Transition> {
        if !self.config.enabled || self.phase != Phase::Armed || n_due == 0 {
            return None;
        }
        self.forget_before(now_ms);
        let recent: u64 = self.window.iter().map(|&(_, n)| n).sum();
        let expiring = recent + n_due;
        let baseline = alive + recent;
        let crosses = expiring as f64 > self.config.threshold * baseline as f64;
        if expiring < self.config.min_keys || !crosses {
            return None;
        }
        Some(self.engage_at(now_ms, EngagedBy::Threshold, alive, expiring))
    }

    /// Whether `n_due` more expiries could trip it now: armed, enabled, and with the window's
    /// expiries at least `min_keys` (a cheap test before the alive keys are counted).
    pub fn could_trip_with(&self, n_due: u64) -> bool {
        let recent: u64 = self.window.iter().map(|&(_, n)| n).sum();
        self.config.enabled
            && self.phase == Phase::Armed
            && n_due > 0
            && recent + n_due >= self.config.min_keys
    }

    /// The sweeper expired `n` keys at `now_ms` (not counting released ones).
    pub fn expired(&mut self, now_ms: u64, n: u64) {
        if n == 0 || !matches!(self.phase, Phase::Armed) {
            return;
        }
        let second = now_ms / 1000;
        match self.window.back_mut() {
            Some((last, count)) if *last == second => *count += n,
            _ => self.window.push_back((second, n)),
        }
        self.forget_before(now_ms);
    }

    /// Lets time pass with `held` keys held: ends an engagement whose maximum hold ran out (or
    /// that healed), ends releasing once nothing is held. Returns the transition, if any, and
    /// how many held keys may be released now (all of them when releasing at once).
    pub fn tick(&mut self, now_ms: u64, held: u64) -> (Option<Transition>, u64) {
        let transition = match self.phase {
            Phase::Engaged { by, since_ms, .. } => {
                if now_ms >= since_ms + self.config.max_hold_ms {
                    Some(self.release_at(now_ms, ReleasedBy::MaxHold, held))
                } else if by == EngagedBy::Threshold
                    && held == 0
                    && now_ms >= since_ms + self.config.window_ms
                {
                    Some(self.release_at(now_ms, ReleasedBy::Healed, held))
                } else {
                    None
                }
            }
            _ => None,
        };
        let quota = match &mut self.phase {
            Phase::Releasing {
                since_ms,
                per_s,
                released,
                ..
            } => {
                if held == 0 {
                    self.phase = Phase::Armed;
                    self.window.clear();
                    0
                } else if let Some(per_s) = per_s {
                    // One second's share at once, then at the rate.
                    let elapsed_ms = now_ms.saturating_sub(*since_ms);
                    let allowed = per_s.saturating_mul(elapsed_ms + 1000) / 1000;
                    allowed.saturating_sub(*released)
                } else {
                    held
                }
            }
            _ => 0,
        };
        (transition, quota)
    }

    /// `n` held keys were released (expired).
    pub fn released(&mut self, n: u64) {
        if let Phase::Releasing { released, .. } = &mut self.phase {
            *released += n;
        }
    }

    /// An operator engages the guard (`POST /v1/guard/engage`). Engaging an engaged guard
    /// changes nothing (its end is not moved).
    pub fn engage(&mut self, now_ms: u64, alive: u64) -> Result<Option<Transition>, GuardError> {
        match self.phase {
            Phase::Armed => Ok(Some(self.engage_at(now_ms, EngagedBy::Operator, alive, 0))),
            Phase::Engaged { .. } => Ok(None),
            Phase::Releasing { .. } => Err(GuardError::Releasing),
        }
    }

    /// An operator ends the engagement (`POST /v1/guard/release`): every held key may be
    /// released at once (`tick`'s quota is all of them). A release at the bounded rate under way
    /// is hurried the same way (no new transition: its release was announced). Nothing happens
    /// when the guard is armed.
    pub fn release(&mut self, now_ms: u64, held: u64) -> Option<Transition> {
        match &mut self.phase {
            Phase::Engaged { .. } => Some(self.release_at(now_ms, ReleasedBy::Operator, held)),
            Phase::Releasing { per_s, .. } => {
                *per_s = None;
                None
            }
            Phase::Armed => None,
        }
    }

    /// Whether the held keys may all be released now (an operator's release is under way).
    pub fn releasing_at_once(&self) -> bool {
        matches!(self.phase, Phase::Releasing { per_s: None, .. })
    }

    fn engage_at(&mut self, now_ms: u64, by: EngagedBy, alive: u64, expiring: u64) -> Transition {
        self.engagements += 1;
        self.phase = Phase::Engaged {
            by,
            since_ms: now_ms,
            baseline: alive,
            expiring,
        };
        Transition::Engaged {
            by,
            baseline: alive,
            expiring,
        }
    }

    /// Ends the engagement: at the bounded rate when the maximum hold ran out (a healed one has
    /// nothing to release), at once when an operator says so.
    fn release_at(&mut self, now_ms: u64, by: ReleasedBy, held: u64) -> Transition {
        self.releases += 1;
        let over_s = self.config.release_over_ms.div_ceil(1000).max(1);
        let per_s =
            (by != ReleasedBy::Operator).then(|| held.div_ceil(over_s).max(MIN_RELEASE_PER_S));
        self.phase = Phase::Releasing {
            by,
            since_ms: now_ms,
            per_s,
            released: 0,
        };
        Transition::Released { by, held }
    }

    fn forget_before(&mut self, now_ms: u64) {
        let first = now_ms.saturating_sub(self.config.window_ms) / 1000;
        while self
            .window
            .front()
            .is_some_and(|&(second, _)| second < first)
        {
            self.window.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard() -> Guard {
        Guard::new(GuardConfig::default())
    }

    #[test]
    fn a_small_share_or_a_small_fleet_never_trips_it() {
        let mut guard = guard();
        assert_eq!(guard.consider(1_000, 29, 100), None, "29% of 100");
        assert_eq!(guard.consider(1_000, 99, 99), None, "under 100 keys");
        assert_eq!(guard.consider(1_000, 2_999, 10_000), None, "just under 30%");
        assert!(!guard.holding());
    }

    #[test]
    fn expiries_in_the_window_add_up_until_the_threshold_trips() {
        let mut guard = guard();
        for second in 0..3 {
            let now = second * 1000;
            assert_eq!(guard.consider(now, 1_000, 10_000 - second * 1000), None);
            guard.expired(now, 1_000);
        }
        // 3,000 expired of the 10,000 alive at the start, and 1 more due: over 30%.
        let tripped = guard.consider(3_000, 1, 7_000);
        assert_eq!(
            tripped,
            Some(Transition::Engaged {
                by: EngagedBy::Threshold,
                baseline: 7_000,
                expiring: 3_001
            })
        );
        assert!(guard.holding());
        // Expiries older than the window are forgotten.
        let mut later = Guard::new(GuardConfig::default());
        for second in 0..3 {
            later.expired(second * 1000, 1_000);
        }
        assert_eq!(later.consider(14_000, 1, 7_000), None);
    }

    #[test]
    fn the_hold_ends_by_itself_and_releases_at_a_bounded_rate() {
        let mut guard = guard();
        guard.consider(0, 5_000, 10_000).expect("trips");
        assert_eq!(guard.tick(119_999, 5_000), (None, 0));
        let (transition, quota) = guard.tick(120_000, 5_000);
        assert_eq!(
            transition,
            Some(Transition::Released {
                by: ReleasedBy::MaxHold,
                held: 5_000
            })
        );
        // 5,000 over 10 s: 500 per second.
        assert_eq!(quota, 500);
        guard.released(500);
        assert_eq!(guard.tick(120_500, 4_500), (None, 250));
        guard.released(250);
        assert_eq!(guard.tick(129_000, 4_250), (None, 4_250));
        guard.released(4_250);
        assert_eq!(guard.tick(129_000, 0), (None, 0));
        assert_eq!(guard.phase(), Phase::Armed);
        assert_eq!(guard.counts(), (1, 1));
    }

    #[test]
    fn a_healed_partition_ends_the_hold_with_nothing_to_release() {
        let mut guard = guard();
        guard.consider(0, 5_000, 10_000).expect("trips");
        assert_eq!(guard.tick(5_000, 0), (None, 0), "not before a window");
        let (transition, _) = guard.tick(10_000, 0);
        assert_eq!(
            transition,
            Some(Transition::Released {
                by: ReleasedBy::Healed,
                held: 0
            })
        );
        assert_eq!(guard.tick(10_000, 0), (None, 0));
        assert_eq!(guard.phase(), Phase::Armed);
    }

    #[test]
    fn an_operator_engages_and_releases_but_cannot_extend_a_hold() {
        let mut guard = guard();
        assert!(matches!(
            guard.engage(1_000, 50),
            Ok(Some(Transition::Engaged {
                by: EngagedBy::Operator,
                ..
            }))
        ));
        assert_eq!(guard.engage(60_000, 50), Ok(None));
        assert_eq!(guard.hold_ends_at(), Some(121_000));
        // An operator's engagement does not heal by itself.
        assert_eq!(guard.tick(60_000, 0), (None, 0));
        assert!(guard.release(61_000, 10).is_some());
        assert_eq!(guard.engage(61_500, 50), Err(GuardError::Releasing));
        assert_eq!(guard.release(61_500, 10), None);
        // Released at once: the whole hold is the first quota, then it is armed again.
        assert_eq!(guard.tick(61_500, 10), (None, 10));
        guard.released(10);
        assert_eq!(guard.tick(61_500, 0), (None, 0));
        assert_eq!(guard.phase(), Phase::Armed);
        assert!(guard.engage(62_000, 50).is_ok());
    }

    #[test]
    fn an_operators_release_lets_every_held_key_go_at_once() {
        let mut guard = guard();
        guard.consider(0, 5_000, 10_000).expect("trips");
        assert_eq!(
            guard.release(1_000, 5_000),
            Some(Transition::Released {
                by: ReleasedBy::Operator,
                held: 5_000
            })
        );
        assert!(guard.releasing_at_once());
        // Not 500 a second as after the maximum hold: all 5,000 now, without time passing.
        assert_eq!(guard.tick(1_000, 5_000), (None, 5_000));
        guard.released(2_000);
        assert_eq!(guard.tick(1_000, 3_000), (None, 3_000));
        guard.released(3_000);
        assert_eq!(guard.tick(1_000, 0), (None, 0));
        assert_eq!(guard.phase(), Phase::Armed);
        assert_eq!(guard.counts(), (1, 1));
    }

    #[test]
    fn an_operators_release_hurries_a_release_at_the_bounded_rate() {
        let mut guard = guard();
        guard.consider(0, 5_000, 10_000).expect("trips");
        let (transition, quota) = guard.tick(120_000, 5_000);
        assert!(matches!(
            transition,
            Some(Transition::Released {
                by: ReleasedBy::MaxHold,
                ..
            })
        ));
        assert_eq!(quota, 500);
        assert!(!guard.releasing_at_once());
        guard.released(500);
        // No second announcement: the release was announced when the hold ran out.
        assert_eq!(guard.release(120_100, 4_500), None);
        assert_eq!(guard.tick(120_100, 4_500), (None, 4_500));
        assert!(matches!(
            guard.phase(),
            Phase::Releasing {
                by: ReleasedBy::MaxHold,
                per_s: None,
                ..
            }
        ));
        assert_eq!(guard.counts(), (1, 1));
    }

    #[test]
    fn a_disabled_guard_never_trips() {
        let mut guard = Guard::new(GuardConfig {
            enabled: false,
            ..GuardConfig::default()
        });
        assert_eq!(guard.consider(0, 1_000_000, 1_000_000), None);
    }

    proptest::proptest! {
        /// Whatever happens, the guard never stays engaged past its maximum hold, and releasing
        /// ends within the release window once ticks keep coming.
        #[test]
        fn it_never_gets_stuck(
            steps in proptest::collection::vec((0u64..5_000, 0u64..3_000, 0u8..6), 1..200)
        ) {
            let mut guard = guard();
            let mut now = 0;
            let mut held: u64 = 0;
            for (gap, n, action) in steps {
                now += gap;
                let (_, quota) = guard.tick(now, held);
                if let Phase::Engaged { since_ms, .. } = guard.phase() {
                    proptest::prop_assert!(now < since_ms + guard.config().max_hold_ms);
                }
                let release = quota.min(held);
                held -= release;
                guard.released(release);
                match action {
                    0 => { let _ = guard.engage(now, 1_000); }
                    1 => { guard.release(now, held); }
                    2 => { guard.expired(now, n); }
                    _ => {
                        guard.consider(now, n, 10_000);
                        if guard.holding() { held += n; } else { guard.expired(now, n); }
                    }
                }
            }
            // Then time alone: the hold ends and everything is released within the bounds.
            let mut waited = 0;
            while guard.phase() != Phase::Armed {
                now += 1_000;
                waited += 1_000;
                let (_, quota) = guard.tick(now, held);
                let release = quota.min(held);
                held -= release;
                guard.released(release);
                proptest::prop_assert!(
                    waited <= guard.config().max_hold_ms + guard.config().release_over_ms + 2_000,
                    "stuck in {:?}", guard.phase()
                );
            }
        }

        /// Against a model of the two paces: once an operator released (while engaged or
        /// releasing), every held key may go at the next tick, however little time passed; a
        /// release by the maximum hold never lets more go than its rate allows (`held` at the
        /// release spread over `release_over`, at least `MIN_RELEASE_PER_S`, one second's share
        /// at once).
        #[test]
        fn an_operators_release_is_at_once_and_the_automatic_one_stays_bounded(
            steps in proptest::collection::vec((0u64..3_000, 0u64..3_000, 0u8..6), 1..200)
        ) {
            /// What the model expects of the release under way.
            #[derive(Clone, Copy, Debug)]
            enum Pace {
                None,
                AtOnce,
                Bounded { since_ms: u64, per_s: u64, released: u64 },
            }
            let mut guard = guard();
            let config = guard.config().clone();
            let over_s = config.release_over_ms.div_ceil(1000).max(1);
            let mut pace = Pace::None;
            let mut now = 0;
            let mut held: u64 = 0;
            for (gap, n, action) in steps {
                now += gap;
                let was_engaged = guard.holding();
                let (transition, quota) = guard.tick(now, held);
                if let Some(Transition::Released { by: ReleasedBy::MaxHold, held: at_release }) =
                    transition
                {
                    proptest::prop_assert!(was_engaged);
                    let per_s = at_release.div_ceil(over_s).max(MIN_RELEASE_PER_S);
                    pace = Pace::Bounded { since_ms: now, per_s, released: 0 };
                }
                if guard.phase() == Phase::Armed {
                    pace = Pace::None;
                }
                match &mut pace {
                    Pace::None => proptest::prop_assert_eq!(quota, 0),
                    Pace::AtOnce => proptest::prop_assert_eq!(quota, held),
                    Pace::Bounded { since_ms, per_s, released } => {
                        let allowed = *per_s * (now - *since_ms + 1000) / 1000;
                        proptest::prop_assert!(
                            *released + quota <= allowed,
                            "{} + {quota} released, {allowed} allowed", *released
                        );
                        *released += quota.min(held);
                    }
                }
                let release = quota.min(held);
                held -= release;
                guard.released(release);
                match action {
                    0 => { let _ = guard.engage(now, 1_000); }
                    1 => {
                        let engaged = guard.holding();
                        let releasing = matches!(guard.phase(), Phase::Releasing { .. });
                        let transition = guard.release(now, held);
                        proptest::prop_assert_eq!(transition.is_some(), engaged);
                        if engaged || releasing {
                            // The registry lets them all go within the call.
                            pace = Pace::AtOnce;
                            let (_, quota) = guard.tick(now, held);
                            proptest::prop_assert_eq!(quota, held);
                            guard.released(held);
                            held = 0;
                        }
                    }
                    2 => { guard.expired(now, n); }
                    _ => {
                        guard.consider(now, n, 10_000);
                        if guard.holding() { held += n; } else { guard.expired(now, n); }
                    }
                }
            }
        }
    }
}
