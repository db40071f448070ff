//! The registry's side of the mass-expiry guard (`guard`): counting what is about to expire
//! before the sweeper expires any of it, holding and releasing keys, the operator's calls, and
//! announcing every transition (a log line, and a `guard.engaged` / `guard.released` event on
//! the bus, so the live stream, the metrics and, if asked, webhooks see it).
//!
//! Held keys stay in their shard (`Timer::Held`): listed with `held: true`, renewed by a
//! heartbeat as usual (no event: they never expired), expired by a release: the sweeper's, at
//! the guard's bounded rate after the maximum hold, or the operator's, every one within the
//! call. Either way at most `SWEEP_CHUNK` keys per shard lock, so no heartbeat waits long.

use std::sync::atomic::Ordering;

use serde::Serialize;
use serde_json::json;
use tokio::time::Instant;

use super::guard::{EngagedBy, GuardError, Phase, ReleasedBy, Transition};
use super::{Registry, SWEEP_CHUNK};
use crate::clock::{rfc3339, Now, Rfc3339};
use crate::events::{Event, EventKind};
use crate::types::{Key, Meta};

/// `GET /v1/guard`.
#[derive(Clone, Debug, Serialize)]
pub struct GuardStatus {
    /// `armed`, `engaged` or `releasing` (`off` when the threshold cannot trip it and it is not
    /// engaged).
    pub state: &'static str,
    pub enabled: bool,
    /// Keys held now.
    pub held: u64,
    pub engaged_by: Option<EngagedBy>,
    pub released_by: Option<ReleasedBy>,
    /// When the current engagement or release began.
    pub since: Option<Rfc3339>,
    /// When an engagement ends by itself, and the seconds left.
    pub hold_ends_at: Option<Rfc3339>,
    pub time_left_s: Option<f64>,
    /// Alive keys when it engaged (frozen for the engagement).
    pub baseline: Option<u64>,
    /// Keys expired in the window plus due when it tripped.
    pub expiring: Option<u64>,
    /// Held keys released per second while releasing at the bounded rate (absent while an
    /// operator's release lets them all go at once).
    pub release_per_s: Option<u64>,
    pub engagements: u64,
    pub releases: u64,
    pub threshold: f64,
    pub min_keys: u64,
    pub window_s: f64,
    pub max_hold_s: f64,
    pub release_over_s: f64,
}

impl Registry {
    /// The guard's state now.
    pub fn guard_status(&self, now: Instant) -> GuardStatus {
        let now = self.clock.at(now);
        let held = self.held_count();
        let guard = self.guard.lock();
        let config = guard.config().clone();
        let (engagements, releases) = guard.counts();
        let mut status = GuardStatus {
            state: "armed",
            enabled: config.enabled,
            held,
            engaged_by: None,
            released_by: None,
            since: None,
            hold_ends_at: None,
            time_left_s: None,
            baseline: None,
            expiring: None,
            release_per_s: None,
            engagements,
            releases,
            threshold: config.threshold,
            min_keys: config.min_keys,
            window_s: config.window_ms as f64 / 1000.0,
            max_hold_s: config.max_hold_ms as f64 / 1000.0,
            release_over_s: config.release_over_ms as f64 / 1000.0,
        };
        match guard.phase() {
            Phase::Armed if !config.enabled => status.state = "off",
            Phase::Armed => {}
            Phase::Engaged {
                by,
                since_ms,
                baseline,
                expiring,
            } => {
                let ends_ms = guard.hold_ends_at().expect("engaged");
                status.state = "engaged";
                status.engaged_by = Some(by);
                status.since = Some(rfc3339(self.clock.unix_ms(since_ms)));
                status.hold_ends_at = Some(rfc3339(self.clock.unix_ms(ends_ms)));
                status.time_left_s = Some(ends_ms.saturating_sub(now.ms) as f64 / 1000.0);
                status.baseline = Some(baseline);
                status.expiring = Some(expiring);
            }
            Phase::Releasing {
                by,
                since_ms,
                per_s,
                ..
            } => {
                status.state = "releasing";
                status.released_by = Some(by);
                status.since = Some(rfc3339(self.clock.unix_ms(since_ms)));
                status.release_per_s = per_s;
            }
        }
        status
    }

    /// An operator engages the guard: due keys are held from now, for at most the maximum
    /// hold. Engaging an engaged guard changes nothing.
    pub fn guard_engage(&self, now: Instant) -> Result<GuardStatus, GuardError> {
        let at = self.clock.at(now);
        let alive = self.len() as u64;
        let transition = self.guard.lock().engage(at.ms, alive)?;
        self.after_transition(transition, at);
        Ok(self.guard_status(now))
    }

    /// An operator ends the engagement (or hurries a release at the bounded rate): every held
    /// key is released (expired) before this returns, `SWEEP_CHUNK` per shard lock but with no
    /// rate limit; the held count it answers is 0. The guard is armed again by the sweeper's
    /// next step, which the call wakes, not here: a sweep chunk running beside this call may
    /// have read the holding flag before the release and hold a key after the drain; the
    /// sweeper's next step releases it (at once too) before it arms the guard.
    /// Nothing happens when the guard is armed. O(held keys): call it off the async workers.
    pub fn guard_release(&self, now: Instant) -> GuardStatus {
        let at = self.clock.at(now);
        let held = self.held_count();
        let mut guard = self.guard.lock();
        let transition = guard.release(at.ms, held);
        let at_once = guard.releasing_at_once();
        drop(guard);
        self.after_transition(transition, at);
        if at_once {
            let released = self.release_held(at, usize::MAX);
            self.guard.lock().released(released as u64);
        }
        // The answer is the state this call left (releasing, by the operator, nothing held),
        // read before the sweeper is woken to arm the guard: woken first, it could arm it
        // before the answer is read, and the answer would no longer say who released.
        let status = self.guard_status(now);
        if at_once {
            self.wakeup.notify_one();
        }
        status
    }

    /// Keys held now, in every shard.
    pub fn held_count(&self) -> u64 {
        self.shards
            .iter()
            .map(|shard| shard.0.lock().held_count() as u64)
            .sum()
    }

    /// `(engagements, releases, held)` for the metrics, and whether it is engaged.
    pub fn guard_counts(&self) -> (u64, u64, u64, bool) {
        let held = self.held_count();
        let guard = self.guard.lock();
        let (engagements, releases) = guard.counts();
        (engagements, releases, held, guard.holding())
    }

    /// The sweeper's first step: lets time pass for the guard (a hold that ran out or healed
    /// ends) and releases what it may now, at most `budget` keys. Returns the keys released.
    pub(super) fn guard_step(&self, now: Now, budget: usize) -> usize {
        // Armed (nearly always): nothing can end, nothing is held; spare counting the shards.
        if self.guard.lock().phase() == Phase::Armed {
            return 0;
        }
        let held = self.held_count();
        let (transition, quota) = self.guard.lock().tick(now.ms, held);
        self.after_transition(transition, now);
        let quota = quota.min(budget as u64) as usize;
        if quota == 0 {
            return 0;
        }
        let released = self.release_held(now, quota);
        let mut guard = self.guard.lock();
        guard.released(released as u64);
        if released as u64 == held {
            // Nothing is left: armed again now, not at the next tick.
            guard.tick(now.ms, 0);
        }
        released
    }

    /// Releases (expires) up to `quota` held keys, shard by shard, at most `SWEEP_CHUNK` per
    /// lock. Returns how many; the caller tells the guard.
    fn release_held(&self, now: Now, quota: usize) -> usize {
        let ctx = self.ctx();
        let mut released = 0;
        for shard in self.shards.iter() {
            while released < quota {
                let mut shard = shard.0.lock();
                let n = shard.release_held((quota - released).min(SWEEP_CHUNK), &ctx, now);
                shard.flush_events(&ctx);
                drop(shard);
                released += n;
                if n == 0 {
                    break;
                }
            }
        }
        released
    }

    /// `n_due` keys are about to be expired, with `alive` keys indexed: the guard may trip.
    /// Returns whether due keys are to be held.
    pub(super) fn guard_consider(&self, now: Now, n_due: u64, alive: u64) -> bool {
        let transition = self.guard.lock().consider(now.ms, n_due, alive);
        self.after_transition(transition, now);
        self.holding.load(Ordering::Acquire)
    }

    /// The sweeper expired `n` keys (releases not counted).
    pub(super) fn guard_saw_expiries(&self, now: Now, n: usize) {
        if n > 0 {
            self.guard.lock().expired(now.ms, n as u64);
        }
    }

    /// Whether the threshold can trip the guard now (else counting what is due is wasted).
    pub(super) fn guard_may_trip(&self) -> bool {
        let guard = self.guard.lock();
        guard.config().enabled && guard.phase() == Phase::Armed
    }

    /// Whether `n_due` keys due now could trip it (else counting the alive keys is wasted).
    pub(super) fn guard_could_trip_with(&self, n_due: u64) -> bool {
        self.guard.lock().could_trip_with(n_due)
    }

    /// Publishes the holding flag, logs and announces a transition.
    fn after_transition(&self, transition: Option<Transition>, now: Now) {
        let holding = self.guard.lock().holding();
        self.holding.store(holding, Ordering::Release);
        let Some(transition) = transition else {
            return;
        };
        let (kind, details) = match transition {
            Transition::Engaged {
                by,
                baseline,
                expiring,
            } => {
                tracing::warn!(
                    engaged_by = ?by,
                    baseline,
                    expiring,
                    "the expiry guard engaged: due keys are held, not expired (a mass expiry is more \
                     likely a partition around ttlwheel than a mass death); it releases them by \
                     itself after the maximum hold, or POST /v1/guard/release"
                );
                let details = json!({
                    "state": "engaged",
                    "engaged_by": by,
                    "baseline": baseline,
                    "expiring": expiring,
                });
                (EventKind::GuardEngaged, details)
            }
            Transition::Released { by, held } => {
                let pace = if by == ReleasedBy::Operator {
                    "held keys expire at once"
                } else {
                    "held keys now expire at a bounded rate"
                };
                tracing::warn!(
                    released_by = ?by,
                    held,
                    "the expiry guard released its hold: {pace}"
                );
                let details = json!({ "state": "released", "released_by": by, "held": held });
                (EventKind::GuardReleased, details)
            }
        };
        let at_unix_ms = self.clock.unix_ms(now.ms);
        let mut details = details;
        details["at"] = json!(rfc3339(at_unix_ms));
        self.events
            .publish(vec![guard_event(kind, &details, at_unix_ms)]);
    }
}

/// A `guard.*` event: its details travel as `meta` (they are its `data`).
fn guard_event(kind: EventKind, details: &serde_json::Value, at_unix_ms: u64) -> Event {
    Event {
        kind,
        key: Key::new("guard").expect("a valid key"),
        service: None,
        meta: Meta::from_value(details).ok(),
        ttl_ms: None,
        registered_at_ms: at_unix_ms,
        last_heartbeat_at_ms: at_unix_ms,
        deadline_ms: None,
        occurred_at_ms: at_unix_ms,
        lateness_ms: 0,
        restored: false,
        log_id: None,
    }
}
