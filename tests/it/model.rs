//! Model-based test: random operations applied to the registry and to a trivial reference model
//! (a map of deadlines, scanned in full), compared after every step.
//!
//! The model decides which keys are alive and what each answer is. Expiry events are matched
//! against the model's due keys: each due key must produce exactly one `expired` event, never
//! before its deadline, and no later than the first sweep after its deadline (wheel and heap
//! alike: a wheel key's last second is ordered to the millisecond). Deletions must produce `deleted` events exactly when the model deletes.
//! After every step the registry's full invariant check runs (`Registry::check_invariants`).

use std::collections::BTreeMap;

use proptest::prelude::*;
use ttlwheel::events::EventKind;
use ttlwheel::expiry::TimerKind;
use ttlwheel::registry::{ExpireAt, ExpireCondition, ExpireOutcome, KeyState};

use crate::{key_of, Harness, UNIX_AT_EPOCH};

const MAX_TTL_S: u32 = 3;
/// One key of each length an entry keeps in its own way (`registry::entry_key`): inline in the key
/// (up to 24 bytes), inline in the entry (25 to 30), allocated (longer).
const KEYS: [&str; 5] = [
    "a",
    "b",
    "svc-042/instance-0000000042",
    "d",
    "svc-042/instance-0000000042/long",
];
/// Wheel TTLs (whole seconds up to 3 s) and heap TTLs (everything else).
const TTLS_MS: [u64; 7] = [1_000, 2_000, 3_000, 4_000, 1, 250, 1_500];

#[derive(Clone, Debug)]
enum Op {
    /// Key, TTL, and a service (`None`: keep the stored one).
    Heartbeat(usize, u64, Option<&'static str>),
    Expire(usize, i64, Option<ExpireCondition>),
    ExpireAt(usize, i64),
    Persist(usize),
    Delete(usize),
    Ttl(usize),
    /// Time passes and the ticker sweeps.
    Advance(u64),
    /// Time passes and the ticker does not run.
    Stall(u64),
    /// Time passes and the ticker makes one call with a small budget, which may leave a
    /// detached bucket half processed until the next sweep.
    SweepStep(u64, usize),
    /// A batch's next keys read into the cache before they are applied (`Registry::warm`):
    /// it must change nothing the model or the invariant check can see, whatever state the
    /// keys are in (absent, due, held in a detached bucket, with stale wheel elements).
    Warm(Vec<usize>),
}

fn condition() -> impl Strategy<Value = Option<ExpireCondition>> {
    prop_oneof![
        Just(None),
        Just(Some(ExpireCondition::Nx)),
        Just(Some(ExpireCondition::Xx)),
        Just(Some(ExpireCondition::Gt)),
        Just(Some(ExpireCondition::Lt)),
    ]
}

/// Services move keys between the per-service counts and listings the invariant check covers.
fn service() -> impl Strategy<Value = Option<&'static str>> {
    prop_oneof![Just(None), Just(Some("api")), Just(Some("db"))]
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS.len();
    let expire_ttl = prop::sample::select(vec![-5i64, 0, 1, 500, 1_000, 2_000, 3_000, 5_000]);
    prop_oneof![
        6 => (key.clone(), prop::sample::select(TTLS_MS.to_vec()), service()).prop_map(|(k, ttl, s)| Op::Heartbeat(k, ttl, s)),
        2 => (key.clone(), expire_ttl, condition()).prop_map(|(k, ttl, c)| Op::Expire(k, ttl, c)),
        1 => (key.clone(), -1_000i64..4_000).prop_map(|(k, delta)| Op::ExpireAt(k, delta)),
        1 => key.clone().prop_map(Op::Persist),
        1 => key.clone().prop_map(Op::Delete),
        2 => key.prop_map(Op::Ttl),
        4 => prop_oneof![0u64..1_200, Just(1_000u64)].prop_map(Op::Advance),
        1 => (0u64..6_000).prop_map(Op::Stall),
        2 => (0u64..1_500, 1usize..4).prop_map(|(ms, budget)| Op::SweepStep(ms, budget)),
        1 => prop::collection::vec(0..KEYS.len(), 1..8).prop_map(Op::Warm),
    ]
}

/// What the model knows of a key.
#[derive(Clone, Copy, Debug)]
struct ModelKey {
    /// Epoch ms; `None` when persistent.
    deadline_ms: Option<u64>,
    timer: Option<TimerKind>,
}

/// A key whose deadline passed and whose expiry event has not been seen yet.
#[derive(Clone, Copy, Debug)]
struct Due {
    deadline_ms: u64,
    /// Due keys stay in their timer until expired.
    timer: TimerKind,
    /// The sweep at or after this time must have expired it.
    swept_by_ms: u64,
}

#[derive(Default)]
struct Model {
    alive: BTreeMap<&'static str, ModelKey>,
    due: BTreeMap<&'static str, Due>,
    now_ms: u64,
    last_sweep_ms: u64,
}

impl Model {
    /// Moves keys whose deadline passed from `alive` to `due`.
    fn settle(&mut self) {
        let now_ms = self.now_ms;
        let newly_due: Vec<_> = self
            .alive
            .iter()
            .filter(|(_, entry)| entry.deadline_ms.is_some_and(|deadline| deadline <= now_ms))
            .map(|(&key, &entry)| (key, entry))
            .collect();
        for (key, entry) in newly_due {
            self.alive.remove(key);
            let deadline_ms = entry.deadline_ms.expect("due keys have deadlines");
            // Wheel keys too: their last second is ordered to the millisecond.
            let swept_by_ms = deadline_ms;
            let previous = self.due.insert(
                key,
                Due {
                    deadline_ms,
                    timer: entry.timer.expect("due keys have timers"),
                    swept_by_ms,
                },
            );
            assert!(previous.is_none(), "{key}: two incarnations due at once");
        }
    }

    fn set_deadline(&mut self, key: &'static str, ttl_ms: u64) {
        let timer = TimerKind::for_ttl(ttl_ms, MAX_TTL_S);
        let deadline_ms = Some(self.now_ms + ttl_ms);
        self.alive.insert(
            key,
            ModelKey {
                deadline_ms,
                timer: Some(timer),
            },
        );
    }

    /// Redis 7's EXPIRE on the model; returns (outcome, whether a `deleted` event follows).
    fn expire(
        &mut self,
        key: &'static str,
        target_ms: i64,
        condition: Option<ExpireCondition>,
    ) -> ExpireOutcome {
        let Some(entry) = self.alive.get(key).copied() else {
            return ExpireOutcome::NotFound;
        };
        let current = entry.deadline_ms.map(|deadline| deadline as i64);
        let allowed = match condition {
            None => true,
            Some(ExpireCondition::Nx) => current.is_none(),
            Some(ExpireCondition::Xx) => current.is_some(),
            Some(ExpireCondition::Gt) => current.is_some_and(|current| target_ms > current),
            Some(ExpireCondition::Lt) => current.is_none_or(|current| target_ms < current),
        };
        let now_ms = self.now_ms as i64;
        if !allowed {
            return ExpireOutcome::NotApplied {
                ttl_ms: current.map(|d| (d - now_ms) as u64),
            };
        }
        if target_ms <= now_ms {
            self.alive.remove(key);
            return ExpireOutcome::Deleted;
        }
        let ttl_ms = (target_ms - now_ms) as u64;
        self.set_deadline(key, ttl_ms);
        ExpireOutcome::Applied { ttl_ms }
    }
}

fn run(ops: &[Op], mut harness: Harness) {
    let mut model = Model::default();
    for op in ops {
        let now = harness.now();
        let mut expect_deleted: Option<&'static str> = None;
        let mut expect_registered: Option<&'static str> = None;
        match *op {
            Op::Heartbeat(k, ttl_ms, service) => {
                let key = KEYS[k];
                let created = !model.alive.contains_key(key);
                model.set_deadline(key, ttl_ms);
                let outcome = harness.heartbeat_in(key, ttl_ms, service);
                assert_eq!(outcome.created, created, "{op:?}");
                if created {
                    expect_registered = Some(key);
                }
                assert_eq!(outcome.timer, TimerKind::for_ttl(ttl_ms, MAX_TTL_S));
            }
            Op::Expire(k, ttl_ms, condition) => {
                let key = KEYS[k];
                let target_ms = model.now_ms as i64 + ttl_ms;
                let expected = model.expire(key, target_ms, condition);
                let actual = harness
                    .registry
                    .expire(&key_of(key), ExpireAt::In(ttl_ms), condition, now)
                    .unwrap();
                assert_eq!(actual, expected, "{op:?}");
                if expected == ExpireOutcome::Deleted {
                    expect_deleted = Some(key);
                }
            }
            Op::ExpireAt(k, delta_ms) => {
                let key = KEYS[k];
                let target_ms = model.now_ms as i64 + delta_ms;
                let expected = model.expire(key, target_ms, None);
                let at = ExpireAt::AtUnixMs(UNIX_AT_EPOCH as i64 + target_ms);
                let actual = harness
                    .registry
                    .expire(&key_of(key), at, None, now)
                    .unwrap();
                assert_eq!(actual, expected, "{op:?}");
                if expected == ExpireOutcome::Deleted {
                    expect_deleted = Some(key);
                }
            }
            Op::Persist(k) => {
                let key = KEYS[k];
                let expected = model.alive.get_mut(key).map(|entry| {
                    let had_ttl = entry.deadline_ms.is_some();
                    *entry = ModelKey {
                        deadline_ms: None,
                        timer: None,
                    };
                    had_ttl
                });
                assert_eq!(
                    harness.registry.persist(&key_of(key), now).unwrap(),
                    expected,
                    "{op:?}"
                );
            }
            Op::Delete(k) => {
                let key = KEYS[k];
                let existed = model.alive.remove(key).is_some();
                assert_eq!(
                    harness.registry.delete(&key_of(key), now).unwrap(),
                    existed,
                    "{op:?}"
                );
                if existed {
                    expect_deleted = Some(key);
                }
            }
            Op::Ttl(k) => {
                let key = KEYS[k];
                let expected = match model.alive.get(key) {
                    None => KeyState::Missing,
                    Some(ModelKey {
                        deadline_ms: None, ..
                    }) => KeyState::Persistent,
                    Some(ModelKey {
                        deadline_ms: Some(deadline),
                        ..
                    }) => KeyState::ExpiresIn(deadline - model.now_ms),
                };
                assert_eq!(
                    harness.registry.state(&key_of(key), now),
                    expected,
                    "{op:?}"
                );
            }
            Op::Advance(ms) => {
                model.now_ms += ms;
                model.last_sweep_ms = model.now_ms;
                harness.advance(ms);
            }
            Op::Stall(ms) => {
                model.now_ms += ms;
                harness.stall(ms);
            }
            Op::SweepStep(ms, budget) => {
                model.now_ms += ms;
                harness.stall(ms);
                harness.registry.sweep(harness.now(), budget);
            }
            Op::Warm(ref ks) => harness.registry.warm(ks.iter().map(|&k| KEYS[k])),
        }
        // Every structure of every shard, and the sweep in progress, after every step.
        harness.registry.check_invariants();
        model.settle();
        check_events(
            &mut harness,
            &mut model,
            expect_deleted,
            expect_registered,
            op,
        );
        check_live_set(&harness, &model);
    }
}

/// Matches the events published during the step against the model.
fn check_events(
    harness: &mut Harness,
    model: &mut Model,
    expect_deleted: Option<&'static str>,
    expect_registered: Option<&'static str>,
    op: &Op,
) {
    let mut deleted = Vec::new();
    let mut registered = Vec::new();
    for event in harness.drain_all() {
        let key = KEYS
            .iter()
            .copied()
            .find(|&k| k == event.key.as_str())
            .expect("known key");
        match event.kind {
            EventKind::Deleted => deleted.push(key),
            EventKind::Registered => registered.push(key),
            EventKind::GuardEngaged | EventKind::GuardReleased => {
                panic!("{op:?}: the guard is off in the model")
            }
            EventKind::Expired => {
                let due = model
                    .due
                    .remove(key)
                    .unwrap_or_else(|| panic!("{op:?}: {key} expired but is not due"));
                assert_eq!(
                    event.deadline_ms,
                    Some(UNIX_AT_EPOCH + due.deadline_ms),
                    "{key}"
                );
                assert!(
                    event.occurred_at_ms >= UNIX_AT_EPOCH + due.deadline_ms,
                    "{key} expired early"
                );
                assert!(event.occurred_at_ms <= UNIX_AT_EPOCH + model.now_ms);
            }
        }
    }
    assert_eq!(
        registered,
        expect_registered.into_iter().collect::<Vec<_>>(),
        "{op:?}: registered events"
    );
    assert_eq!(
        deleted,
        expect_deleted.into_iter().collect::<Vec<_>>(),
        "{op:?}: deleted events"
    );
    for (key, due) in &model.due {
        assert!(
            model.last_sweep_ms < due.swept_by_ms,
            "{op:?}: {key} (deadline {}) not expired by the sweep at {}",
            due.deadline_ms,
            model.last_sweep_ms
        );
    }
}

/// Every key the model holds alive is alive in the registry with the same TTL, and no other is.
/// Reading does not change the model: a due key is expired by the read, which `check_events`
/// of the next step then sees.
fn check_live_set(harness: &Harness, model: &Model) {
    let listed: Vec<String> = harness
        .registry
        .list_alive(&Default::default(), 100, harness.now())
        .0
        .into_iter()
        .map(|view| view.key.to_string())
        .collect();
    let expected: Vec<&str> = model.alive.keys().copied().collect();
    assert_eq!(listed, expected, "alive set at {} ms", model.now_ms);
    for (key, entry) in &model.alive {
        let view = harness
            .registry
            .get(&key_of(key), harness.now())
            .expect("alive");
        assert_eq!(
            view.expires_at_ms,
            entry.deadline_ms.map(|d| UNIX_AT_EPOCH + d),
            "{key}"
        );
        assert_eq!(view.timer, entry.timer, "{key}");
    }
    // Due keys not yet expired still sit in their timer.
    let on = |kind| {
        let alive = model
            .alive
            .values()
            .filter(|entry| entry.timer == Some(kind));
        let due = model.due.values().filter(|due| due.timer == kind);
        alive.count() + due.count()
    };
    assert_eq!(
        harness.registry.timer_counts(),
        (on(TimerKind::Wheel), on(TimerKind::Heap)),
        "keys per timer at {} ms",
        model.now_ms
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn the_registry_behaves_like_a_map_of_deadlines(ops in prop::collection::vec(op(), 1..120)) {
        run(&ops, Harness::new(MAX_TTL_S));
    }

    /// The same with every stale wheel element removed at once (the path a shard takes when
    /// clients renew far more often than their TTL).
    #[test]
    fn the_registry_behaves_like_a_map_of_deadlines_with_eager_removal(ops in prop::collection::vec(op(), 1..120)) {
        run(&ops, Harness::eager(MAX_TTL_S));
    }

    /// The same switching between the two: a few stale elements are kept, then removals turn
    /// eager, so eager removals meet stale elements of keys renewed, deleted or expired before
    /// (the case a mass expiry after a mass renewal produced under load).
    #[test]
    fn the_registry_behaves_like_a_map_of_deadlines_switching_to_eager_removal(
        ops in prop::collection::vec(op(), 1..120),
        stale_slack in 1usize..6,
    ) {
        run(&ops, Harness::with_config(ttlwheel::registry::RegistryConfig {
            max_ttl_s: MAX_TTL_S,
            shards: 1,
            stale_per_key: 0,
            stale_slack,
            guard: ttlwheel::registry::GuardConfig::off(),
            ..ttlwheel::registry::RegistryConfig::default()
        }));
    }
}
