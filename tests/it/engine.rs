//! Edge cases of the expiry engine, table-driven where the cases share a shape.

use ttlwheel::events::EventKind;
use ttlwheel::expiry::TimerKind;
use ttlwheel::registry::{
    ExpireAt, ExpireCondition, ExpireOutcome, GuardConfig, Heartbeat, KeyState, ListFilter,
    RegistryConfig,
};
use ttlwheel::types::{ServiceName, Ttl};

use crate::{key_of, Harness, UNIX_AT_EPOCH};

/// A harness of one shard (a new key reuses a freed slot, and a sweep step's share of the keys
/// is the shard's), without the mass-expiry guard.
fn one_shard(max_ttl_s: u32) -> Harness {
    Harness::with_config(RegistryConfig {
        max_ttl_s,
        shards: 1,
        guard: GuardConfig::off(),
        ..RegistryConfig::default()
    })
}

/// Advances 1 ms at a time, the sweeper running each time, to the millisecond before
/// `until_ms`, checking that no event comes meanwhile (`what` names the keys waited for).
fn step_quietly_until(harness: &mut Harness, until_ms: u64, what: &str) {
    while harness.now_ms + 1 < until_ms {
        harness.advance(1);
        assert!(
            harness.drain().is_empty(),
            "{what}: an event at {} ms, before {until_ms}",
            harness.now_ms
        );
    }
}

/// One key, one heartbeat at `start_ms` with `ttl_ms`; then the sweeper runs every millisecond.
/// Checks the timer chosen and the exact millisecond the expiry event is published.
fn check_expiry_time(
    max_ttl_s: u32,
    start_ms: u64,
    ttl_ms: u64,
    timer: TimerKind,
    expires_at_ms: u64,
) {
    let mut harness = Harness::new(max_ttl_s);
    harness.stall(start_ms);
    harness.sweep();
    assert_eq!(
        harness.heartbeat("k", ttl_ms).timer,
        timer,
        "ttl {ttl_ms} ms"
    );
    step_quietly_until(&mut harness, expires_at_ms, &format!("ttl {ttl_ms}"));
    harness.advance(1);
    let events = harness.drain();
    assert_eq!(
        events.len(),
        1,
        "ttl {ttl_ms}: one event at {expires_at_ms} ms"
    );
    assert_eq!(events[0].kind, EventKind::Expired);
    assert_eq!(
        events[0].deadline_ms,
        Some(UNIX_AT_EPOCH + start_ms + ttl_ms)
    );
    assert_eq!(events[0].occurred_at_ms, UNIX_AT_EPOCH + expires_at_ms);
}

#[test]
fn keys_expire_never_early_and_within_the_millisecond() {
    // (max_ttl_s, heartbeat at, ttl, timer, expiry published at)
    let cases = [
        (10, 0, 1_000, TimerKind::Wheel, 1_000), // TTL 1 s from tick 0: bucket 1, on time
        (10, 250, 1_000, TimerKind::Wheel, 1_250), // mid-second: its last second, to the ms
        (10, 0, 10_000, TimerKind::Wheel, 10_000), // max_ttl from a tick boundary
        (10, 999, 10_000, TimerKind::Wheel, 10_999), // max_ttl from mid-second: the last bucket
        (10, 1, 2_000, TimerKind::Wheel, 2_001), // the first millisecond of a second
        (10, 0, 11_000, TimerKind::Heap, 11_000), // max_ttl + 1 goes to the heap
        (10, 3, 1, TimerKind::Heap, 4),          // the shortest TTL
        (10, 10, 1_500, TimerKind::Heap, 1_510), // not whole seconds: exact on the heap
        (1, 0, 1_000, TimerKind::Wheel, 1_000),  // smallest wheel (3 buckets)
    ];
    for (max_ttl_s, start_ms, ttl_ms, timer, expires_at_ms) in cases {
        check_expiry_time(max_ttl_s, start_ms, ttl_ms, timer, expires_at_ms);
    }
}

#[test]
fn a_key_is_gone_for_reads_at_exactly_its_deadline_even_before_the_sweep() {
    let mut harness = Harness::new(10);
    harness.stall(100);
    harness.heartbeat("k", 2_000);
    harness.stall(1_999);
    assert!(harness.alive("k"));
    assert_eq!(
        harness.registry.state(&key_of("k"), harness.now()),
        KeyState::ExpiresIn(1)
    );
    harness.stall(1); // 2100 ms: due; the sweeper would only reach it at 3000
    assert!(!harness.alive("k"));
    let events = harness.drain();
    assert_eq!(events.len(), 1);
    assert_eq!(
        (events[0].kind, events[0].lateness_ms),
        (EventKind::Expired, 0)
    );
    harness.advance(2_000);
    assert!(
        harness.drain().is_empty(),
        "the sweeper finds nothing more to expire"
    );
}

#[test]
fn renewing_into_the_same_bucket_keeps_the_exact_deadline() {
    let mut harness = Harness::new(10);
    harness.stall(200);
    harness.heartbeat("k", 2_000); // deadline 2200, bucket of tick 3
    harness.stall(300);
    assert!(!harness.heartbeat("k", 2_000).created); // deadline 2500, same bucket
    harness.advance(1_700); // 2200: the first deadline has passed, the renewed one has not
    assert!(harness.alive("k"));
    assert_eq!(
        harness.registry.state(&key_of("k"), harness.now()),
        KeyState::ExpiresIn(300)
    );
    harness.advance(800); // 3000: tick 3 swept
    assert_eq!(harness.drained_keys(EventKind::Expired), ["k"]);
}

/// A batch is applied at the instant it arrived, so a renewal can reach the registry after a
/// newer heartbeat of the same key: it must not move the deadline back. A TTL change still
/// sets the deadline from its own instant.
#[test]
fn an_older_renewal_applied_after_a_newer_one_keeps_the_later_deadline() {
    let mut harness = Harness::new(10);
    harness.stall(1_000);
    let older = harness.now();
    harness.stall(400);
    harness.heartbeat("k", 3_000); // at 1400: deadline 4400
    let late = Heartbeat {
        key: key_of("k"),
        ttl: Ttl::from_millis(3_000).unwrap(),
        service: None,
        meta: None,
    };
    let outcome = harness.registry.heartbeat(late.clone(), older).unwrap();
    assert!(!outcome.created);
    harness.advance(3_000 - 1); // 4399: the older renewal's 4000 has passed
    assert_eq!(
        harness.registry.state(&key_of("k"), harness.now()),
        KeyState::ExpiresIn(1)
    );
    // The same older instant with another TTL is a change, applied as sent: 1000 + 5000.
    let changed = Heartbeat {
        ttl: Ttl::from_millis(5_000).unwrap(),
        ..late
    };
    harness.registry.heartbeat(changed, older).unwrap();
    assert_eq!(
        harness.registry.state(&key_of("k"), harness.now()),
        KeyState::ExpiresIn(6_000 - 4_399)
    );
    harness.advance(6_000 - 4_399);
    assert_eq!(harness.drained_keys(EventKind::Expired), ["k"]);
}

/// Found by the load tool's storm: a mass renewal leaves many stale wheel elements, the mass
/// expiry that follows frees their slots, and the shard switches to removing elements eagerly.
/// An eager removal can then move a stale element of a freed slot; that must not panic, and
/// every key must still expire exactly once, on time.
#[test]
fn an_eager_removal_that_moves_a_stale_element_of_a_freed_slot_loses_nothing() {
    let mut harness = Harness::with_config(ttlwheel::registry::RegistryConfig {
        max_ttl_s: 60,
        shards: 1,
        stale_per_key: 0,
        stale_slack: 1, // the first stale element is kept, every later removal is eager
        guard: ttlwheel::registry::GuardConfig::off(),
        ..ttlwheel::registry::RegistryConfig::default()
    });
    harness.heartbeat("a", 10_000); // bucket of 10 s: [a]
    harness.heartbeat("b", 10_000); // [a, b]
    harness.heartbeat("b", 20_000); // b's element in the 10 s bucket is now stale
    assert!(harness
        .registry
        .delete(&key_of("b"), harness.now())
        .unwrap()); // b's slot is freed
                    // Renewing a removes its element at once, and the stale element of b moves into its place.
    harness.heartbeat("a", 20_000);
    harness.heartbeat("c", 10_000); // may reuse b's slot
    harness.advance(10_000);
    assert_eq!(harness.drained_keys(EventKind::Expired), ["c"]);
    assert!(harness.alive("a"));
    harness.advance(10_000);
    assert_eq!(harness.drained_keys(EventKind::Expired), ["a"]);
    harness.advance(60_000);
    assert!(harness.drain().is_empty());
}

#[test]
fn renewals_across_the_wrap_around_never_expire_and_a_stopped_key_expires_once() {
    let mut harness = Harness::new(3); // 5 buckets: the wheel wraps every 5 s
    for _ in 0..40 {
        harness.heartbeat("k", 3_000);
        harness.advance(700);
        assert!(
            harness.drain().is_empty(),
            "false expiry at {} ms",
            harness.now_ms
        );
    }
    harness.advance(3_000);
    assert_eq!(harness.drained_keys(EventKind::Expired), ["k"]);
    harness.advance(10_000);
    assert!(harness.drain().is_empty());
}

#[test]
fn a_ticker_late_by_more_than_the_horizon_catches_up_without_skipping_or_expiring_early() {
    let max_ttl_s = 10;
    let mut harness = Harness::new(max_ttl_s);
    for ttl_s in 1..=max_ttl_s as u64 {
        harness.heartbeat(&format!("before-{ttl_s:02}"), ttl_s * 1000);
    }
    harness.stall(500);
    harness.sweep();
    harness.stall((u64::from(max_ttl_s) + 5) * 1000); // 15.5 s without a sweep
                                                      // Heartbeats while the ticker is stalled: keys whose tick lies past the wheel's horizon.
    for ttl_s in 1..=max_ttl_s as u64 {
        harness.heartbeat(&format!("during-{ttl_s:02}"), ttl_s * 1000);
    }
    harness.sweep();
    let expected: Vec<String> = (1..=max_ttl_s)
        .map(|ttl_s| format!("before-{ttl_s:02}"))
        .collect();
    assert_eq!(
        harness.drained_keys(EventKind::Expired),
        expected,
        "catch-up expires every missed key once"
    );
    let resumed_ms = harness.now_ms;
    for ttl_s in 1..=max_ttl_s as u64 {
        let key = format!("during-{ttl_s:02}");
        let deadline_ms = resumed_ms + ttl_s * 1000;
        while harness.now_ms + 1 < deadline_ms {
            harness.advance(1);
            assert!(
                harness.alive(&key),
                "{key} expired early at {} ms",
                harness.now_ms
            );
        }
        harness.advance(1000);
        assert!(
            harness.drained_keys(EventKind::Expired).contains(&key),
            "{key} expired within one tick"
        );
    }
}

#[test]
fn expire_moves_a_key_between_wheel_and_heap_without_losing_or_copying_it() {
    let mut harness = Harness::new(10);
    let key = key_of("k");
    let expire = |harness: &Harness, ms: i64| {
        harness
            .registry
            .expire(&key, ExpireAt::In(ms), None, harness.now())
            .unwrap()
    };
    harness.heartbeat("k", 5_000);
    assert_eq!(
        harness.registry.get(&key, harness.now()).unwrap().timer,
        Some(TimerKind::Wheel)
    );
    assert_eq!(
        expire(&harness, 1_500),
        ExpireOutcome::Applied { ttl_ms: 1_500 }
    );
    assert_eq!(
        harness.registry.get(&key, harness.now()).unwrap().timer,
        Some(TimerKind::Heap)
    );
    assert_eq!(
        expire(&harness, 3_000),
        ExpireOutcome::Applied { ttl_ms: 3_000 }
    );
    assert_eq!(
        harness.registry.get(&key, harness.now()).unwrap().timer,
        Some(TimerKind::Wheel)
    );
    harness.advance(2_000); // the heap deadline (1500) and the first wheel one (5000) must not fire
    assert!(harness.drain().is_empty());
    harness.advance(1_000);
    assert_eq!(harness.drained_keys(EventKind::Expired), ["k"]);
    harness.advance(10_000);
    assert!(
        harness.drain().is_empty(),
        "no copy left behind in either timer"
    );
}

#[test]
fn persist_removes_the_ttl_and_the_key_then_never_expires() {
    let mut harness = Harness::new(10);
    let key = key_of("k");
    harness.heartbeat("k", 1_000);
    assert_eq!(
        harness.registry.persist(&key, harness.now()).unwrap(),
        Some(true)
    );
    assert_eq!(
        harness.registry.persist(&key, harness.now()).unwrap(),
        Some(false)
    );
    assert_eq!(
        harness.registry.state(&key, harness.now()),
        KeyState::Persistent
    );
    harness.advance(20_000);
    assert!(harness.alive("k"));
    assert!(harness.drain().is_empty());
    assert_eq!(
        harness
            .registry
            .persist(&key_of("missing"), harness.now())
            .unwrap(),
        None
    );
}

#[test]
fn delete_and_non_positive_expire_are_deletions_not_expiries() {
    let mut harness = Harness::new(10);
    let now = harness.now();
    for key in ["a", "b", "c", "d"] {
        harness.heartbeat(key, 1_000);
    }
    assert!(harness.registry.delete(&key_of("a"), now).unwrap());
    assert!(!harness.registry.delete(&key_of("a"), now).unwrap());
    assert_eq!(
        harness
            .registry
            .expire(&key_of("b"), ExpireAt::In(0), None, now),
        Ok(ExpireOutcome::Deleted)
    );
    assert_eq!(
        harness
            .registry
            .expire(&key_of("c"), ExpireAt::In(-5), None, now),
        Ok(ExpireOutcome::Deleted)
    );
    let past = ExpireAt::AtUnixMs(UNIX_AT_EPOCH as i64 - 1);
    assert_eq!(
        harness.registry.expire(&key_of("d"), past, None, now),
        Ok(ExpireOutcome::Deleted)
    );
    assert_eq!(
        harness.drained_keys(EventKind::Deleted),
        ["a", "b", "c", "d"]
    );
    harness.advance(5_000);
    assert!(
        harness.drain().is_empty(),
        "deleted keys do not expire later"
    );
}

#[test]
fn expire_conditions_follow_redis_7() {
    // (key has a TTL of 10 s?, condition, new TTL ms, applied?)
    let cases = [
        (false, ExpireCondition::Nx, 5_000, true),
        (true, ExpireCondition::Nx, 5_000, false),
        (false, ExpireCondition::Xx, 5_000, false),
        (true, ExpireCondition::Xx, 5_000, true),
        (false, ExpireCondition::Gt, 5_000, false), // no TTL counts as infinite
        (true, ExpireCondition::Gt, 20_000, true),
        (true, ExpireCondition::Gt, 10_000, false), // strictly greater
        (false, ExpireCondition::Lt, 5_000, true),
        (true, ExpireCondition::Lt, 5_000, true),
        (true, ExpireCondition::Lt, 10_000, false), // strictly less
        (true, ExpireCondition::Gt, -1, false),     // the condition is checked before deletion
    ];
    for (has_ttl, condition, ttl_ms, applied) in cases {
        let harness = Harness::new(3600);
        let key = key_of("k");
        harness.heartbeat("k", 10_000);
        if !has_ttl {
            harness.registry.persist(&key, harness.now()).unwrap();
        }
        let outcome = harness
            .registry
            .expire(&key, ExpireAt::In(ttl_ms), Some(condition), harness.now())
            .unwrap();
        let was_applied = !matches!(outcome, ExpireOutcome::NotApplied { .. });
        assert_eq!(
            was_applied, applied,
            "has_ttl {has_ttl}, {condition:?} {ttl_ms}: {outcome:?}"
        );
    }
}

#[test]
fn expire_on_a_missing_key_applies_nothing_and_too_long_a_ttl_is_refused() {
    let harness = Harness::new(10);
    let now = harness.now();
    assert_eq!(
        harness
            .registry
            .expire(&key_of("nope"), ExpireAt::In(1_000), None, now),
        Ok(ExpireOutcome::NotFound)
    );
    assert_eq!(
        harness.registry.state(&key_of("nope"), now),
        KeyState::Missing
    );
    harness.heartbeat("k", 1_000);
    let too_long = ExpireAt::In(366 * 24 * 3600 * 1000);
    assert!(harness
        .registry
        .expire(&key_of("k"), too_long, None, now)
        .is_err());
}

#[test]
fn a_heartbeat_after_expiry_registers_again() {
    let mut harness = Harness::new(10);
    assert!(harness.heartbeat("k", 1_000).created);
    assert!(!harness.heartbeat("k", 1_000).created);
    harness.advance(1_000);
    assert_eq!(harness.drained_keys(EventKind::Expired), ["k"]);
    assert!(harness.heartbeat("k", 1_000).created);
}

#[test]
fn a_subscriber_that_does_not_read_never_stalls_heartbeats_and_loses_no_event() {
    let mut harness = Harness::new(10);
    let mut slow = harness.registry.subscribe(); // never read until the end
    let n = 50_000;
    for i in 0..n {
        harness.heartbeat(&format!("k{i}"), 1_000);
    }
    harness.advance(1_000); // all expire while `slow` reads nothing
    assert_eq!(
        slow.backlog(),
        2 * n,
        "every registration and expiry is queued, none dropped"
    );
    // Heartbeats still go through at once with the backlog in place.
    for i in 0..n {
        assert!(harness.heartbeat(&format!("k{i}"), 1_000).created);
    }
    let mut seen = std::collections::HashSet::new();
    let mut registrations = 0;
    while let Some(event) = slow.try_recv() {
        if event.kind == EventKind::Registered {
            registrations += 1;
            continue;
        }
        assert_eq!(event.kind, EventKind::Expired);
        assert!(seen.insert(event.key.to_string()), "one event per expiry");
    }
    assert_eq!(seen.len(), n);
    assert_eq!(registrations, 2 * n, "each key registered twice");
}

#[test]
fn events_carry_service_metadata_times_and_lateness() {
    let mut harness = Harness::new(10);
    let heartbeat = ttlwheel::registry::Heartbeat {
        key: key_of("svc/1"),
        ttl: ttlwheel::types::Ttl::from_millis(1_500).unwrap(),
        service: Some(ttlwheel::types::ServiceName::new("api").unwrap()),
        meta: Some(ttlwheel::types::Meta::from_value(&serde_json::json!({"zone": "a"})).unwrap()),
    };
    harness.stall(2_000);
    harness
        .registry
        .heartbeat(heartbeat, harness.now())
        .unwrap();
    harness.stall(1_700); // 200 ms past the deadline when the sweeper runs
    harness.sweep();
    let events = harness.drain();
    assert_eq!(events.len(), 1);
    let event = &events[0];
    assert_eq!(event.service.as_ref().map(|s| s.as_str()), Some("api"));
    assert_eq!(
        format!("{:?}", event.meta.as_ref().unwrap()),
        r#"{"zone":"a"}"#
    );
    assert_eq!(event.ttl_ms, Some(1_500));
    assert_eq!(event.last_heartbeat_at_ms, UNIX_AT_EPOCH + 2_000);
    assert_eq!(event.registered_at_ms, UNIX_AT_EPOCH + 2_000);
    assert_eq!(event.deadline_ms, Some(UNIX_AT_EPOCH + 3_500));
    assert_eq!(event.occurred_at_ms, UNIX_AT_EPOCH + 3_700);
    assert_eq!(event.lateness_ms, 200);
}

#[test]
fn registered_at_is_the_millisecond_of_the_creating_heartbeat() {
    let mut harness = Harness::new(60);
    for start_ms in [1, 999, 1_001, 1_999, 61_500] {
        harness.stall(start_ms);
        let key = format!("k{start_ms}");
        harness.heartbeat(&key, 5_000);
        let view = harness
            .registry
            .get(&key_of(&key), harness.now())
            .expect("alive");
        let request_ms = UNIX_AT_EPOCH + harness.now_ms;
        assert_eq!(view.registered_at_ms, request_ms, "{key}");
        assert_eq!(view.last_heartbeat_at_ms, request_ms, "{key}");
        let registered = harness.drain_all().pop().expect("a registered event");
        assert_eq!(registered.registered_at_ms, request_ms, "{key}");
        // A renewal later does not move it.
        harness.stall(700);
        harness.heartbeat(&key, 5_000);
        let renewed = harness.registry.get(&key_of(&key), harness.now()).unwrap();
        assert_eq!(renewed.registered_at_ms, request_ms, "{key}");
    }
}

/// Each wheel expiry consumes its key's element; before the invariant check existed, the
/// removal also counted that element as stale, so `n_stale` grew by one per expiry and, past
/// its bound, switched every renewal of the shard to the slower eager removal for good.
#[test]
fn wheel_expiries_leave_no_stale_elements_counted() {
    let mut harness = Harness::new(60);
    for n in 0..100 {
        harness.heartbeat(&format!("k{n}"), 2_000);
    }
    harness.advance(1_000);
    harness.registry.check_invariants();
    harness.advance(1_500);
    assert_eq!(harness.drained_keys(EventKind::Expired).len(), 100);
    harness.registry.check_invariants();
}

/// A key renewed while its bucket is in its last second (handed over to the millisecond
/// groups) leaves its element there, stale: it must not expire at the old deadline, and it
/// expires exactly at the new one.
#[test]
fn a_key_renewed_in_its_last_second_expires_at_its_new_deadline_only() {
    let mut harness = Harness::new(10);
    harness.stall(400);
    harness.heartbeat("k", 2_000); // deadline 2400: tick 3, whose last second begins at 2000
    harness.heartbeat("other", 2_000); // the same millisecond, not renewed
    harness.advance(1_700); // 2100: tick 3 detached and handed over
    harness.registry.check_invariants();
    assert!(!harness.heartbeat("k", 2_000).created); // deadline 4100; its 2400 element is stale
    harness.registry.check_invariants();
    harness.advance(299);
    assert!(harness.drain().is_empty(), "nothing is due before 2400");
    harness.advance(1); // 2400
    assert_eq!(harness.drained_keys(EventKind::Expired), ["other"]);
    harness.registry.check_invariants();
    step_quietly_until(&mut harness, 4_100, "k, renewed");
    harness.advance(1); // 4100
    let events = harness.drain();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].key.as_str(), "k");
    assert_eq!(events[0].occurred_at_ms, UNIX_AT_EPOCH + 4_100);
    assert_eq!(events[0].lateness_ms, 0);
    harness.registry.check_invariants();
}

/// A key deleted in its last second leaves a stale element whose slot a new key reuses; that
/// element must not expire the new key, which expires at its own deadline. A key moved to the
/// heap by EXPIRE in its last second expires at the heap deadline, once.
#[test]
fn a_stale_last_second_element_of_a_reused_slot_or_a_moved_key_expires_nothing() {
    let mut harness = one_shard(10); // the new key reuses the deleted key's slot
    harness.heartbeat("gone", 1_000); // deadline 1000: tick 1, handed over at once
    harness.heartbeat("moved", 1_000);
    harness.advance(500);
    harness.registry.check_invariants();
    assert!(harness
        .registry
        .delete(&key_of("gone"), harness.now())
        .unwrap());
    harness.heartbeat("reuser", 1_000); // deadline 1500, reusing gone's slot
    let outcome = harness
        .registry
        .expire(&key_of("moved"), ExpireAt::In(700), None, harness.now())
        .unwrap(); // deadline 1200, on the heap now
    assert_eq!(outcome, ExpireOutcome::Applied { ttl_ms: 700 });
    harness.registry.check_invariants();
    assert_eq!(harness.drained_keys(EventKind::Deleted), ["gone"]);
    harness.advance(500); // 1000: the stale elements of gone and moved come due
    assert!(harness.drain().is_empty(), "a stale element expired a key");
    harness.registry.check_invariants();
    harness.advance(200); // 1200
    assert_eq!(harness.drained_keys(EventKind::Expired), ["moved"]);
    harness.advance(299);
    assert!(harness.drain().is_empty());
    harness.advance(1); // 1500
    assert_eq!(harness.drained_keys(EventKind::Expired), ["reuser"]);
    harness.registry.check_invariants();
}

/// Whether a sweep step leaves the listing to one pass looks at the whole second being expired,
/// not at the step: a ticker on time takes a millisecond's keys per step, one each here, and
/// a second holding a mass expiry's share of the shard (1/64 or more) still leaves the listing
/// to the pass, where a second of ordinary churn has its keys searched for and taken out at
/// once. A registration in the second pays a pass for the keys waiting, and the rest of that
/// second's keys are taken out at once. Either way each page lists exactly the alive keys.
#[test]
fn a_mass_expiry_spread_over_its_second_leaves_the_listing_to_one_pass() {
    // (keys due in the second, keys renewed out of it, a registration at that ms, whether keys
    // wait before it, after). A renewed key leaves its element in the second's bucket, stale:
    // 400 of them beside 100 keys due are not a mass expiry.
    for (short_keys, renewed_keys, registers_at, waits_before, waits_after) in [
        (400, 0, None, true, true),
        (100, 0, None, false, false),
        (400, 0, Some(1_200), true, false),
        (100, 400, None, false, false),
    ] {
        let mut harness = one_shard(60);
        let mut alive: Vec<String> = (0..10_000).map(|n| format!("long{n:05}")).collect();
        for key in &alive {
            harness.heartbeat(key, 60_000);
        }
        // Deadlines 1100 + n ms: all in the second that begins at 1000.
        harness.advance(100);
        for n in 0..short_keys {
            harness.heartbeat(&format!("short{n:03}"), 1_000);
            harness.advance(1);
        }
        let renewed: Vec<String> = (0..renewed_keys)
            .map(|n| format!("renewed{n:03}"))
            .collect();
        for key in &renewed {
            harness.heartbeat(key, 1_000);
        }
        for key in &renewed {
            harness.heartbeat(key, 60_000);
        }
        alive.extend(renewed);
        harness.advance(1_000 - harness.now_ms);
        let mut expired = 0;
        let (mut waited_before, mut waited_after) = (false, false);
        while harness.now_ms < 1_100 + short_keys {
            harness.advance(1);
            if registers_at == Some(harness.now_ms) {
                harness.heartbeat("new", 60_000);
                alive.push("new".to_owned());
                assert_eq!(harness.registry.keys_leaving_listing(), 0);
            }
            let step = harness.drained_keys(EventKind::Expired).len();
            assert!(step <= 1, "a step expires one millisecond's key");
            expired += step;
            let waiting = harness.registry.keys_leaving_listing() > 0;
            if registers_at.is_some_and(|at| harness.now_ms >= at) {
                waited_after |= waiting;
            } else {
                waited_before |= waiting;
            }
            harness.registry.check_invariants();
        }
        assert_eq!(expired, short_keys as usize);
        let case = format!(
            "{short_keys} keys due in the second, {renewed_keys} renewed out of it, \
             a registration at {registers_at:?}"
        );
        assert_eq!(waited_before, waits_before, "{case}");
        if registers_at.is_some() {
            assert_eq!(waited_after, waits_after, "{case}");
        }
        let (views, more) =
            harness
                .registry
                .list_alive(&ListFilter::default(), 20_000, harness.now());
        assert!(!more);
        let listed: Vec<String> = views.into_iter().map(|view| view.key.to_string()).collect();
        alive.sort();
        assert_eq!(listed, alive, "{case}");
        assert_eq!(harness.registry.keys_leaving_listing(), 0);
        harness.registry.check_invariants();
    }
}

/// A mass expiry spread over its second takes its keys out of the listing in one pass, after
/// its last step in the shard, not a pass at each eighth of the keys alive as they dwindle.
#[test]
fn a_mass_expiry_spread_over_its_second_reads_the_listing_once() {
    let mut harness = one_shard(60);
    for n in 0..100 {
        harness.heartbeat(&format!("long{n:03}"), 60_000);
    }
    // Deadlines 1100 + n ms: all in the second that begins at 1000.
    harness.advance(100);
    for n in 0..900 {
        harness.heartbeat(&format!("short{n:03}"), 1_000);
        harness.advance(1);
    }
    harness.advance(1_000 - harness.now_ms);
    let mut waiting = Vec::new();
    while harness.now_ms < 2_000 {
        harness.advance(1);
        waiting.push(harness.registry.keys_leaving_listing());
        harness.registry.check_invariants();
    }
    assert_eq!(harness.drained_keys(EventKind::Expired).len(), 900);
    // Each step's key joined the wait, up to the last step's, which took them all out.
    let (last, before) = waiting.split_last().unwrap();
    assert_eq!(*last, 0);
    assert_eq!(before.iter().max(), Some(&899));
    let (views, _) = harness
        .registry
        .list_alive(&ListFilter::default(), 2_000, harness.now());
    assert_eq!(views.len(), 100);
}

/// A bucket's element carries its key's deadline, and the sweeper files it under that
/// millisecond without reading the key. So: a stale element of a deleted key whose slot a new
/// key reuses in the same tick must not expire the new key at the old deadline; a key whose
/// deadline moves within its tick (a new TTL shortening it, a renewal lengthening it) expires
/// at the deadline it has now, not the one its element was first filed with.
#[test]
fn elements_of_one_tick_expire_their_keys_at_the_deadline_the_key_has_now() {
    let mut harness = one_shard(10); // the new key reuses the deleted key's slot
    harness.heartbeat("shortened", 3_000); // deadline 3000: tick 3
    harness.stall(300);
    harness.heartbeat("gone", 2_000); // deadline 2300: tick 3
    harness.heartbeat("lengthened", 2_000); // deadline 2300: tick 3
    assert!(!harness.heartbeat("shortened", 2_000).created); // a new TTL: deadline 2300
    harness.stall(500);
    assert!(harness
        .registry
        .delete(&key_of("gone"), harness.now())
        .unwrap());
    harness.heartbeat("reuser", 2_000); // deadline 2800: tick 3, reusing gone's slot
    assert!(!harness.heartbeat("lengthened", 2_000).created); // deadline 2800
    harness.registry.check_invariants();
    assert_eq!(harness.drained_keys(EventKind::Deleted), ["gone"]);
    harness.advance(1_499); // 2299: tick 3 handed over (its last second began at 2000)
    harness.registry.check_invariants();
    assert!(harness.drain().is_empty(), "nothing is due before 2300");
    harness.advance(1); // 2300
    assert_eq!(harness.drained_keys(EventKind::Expired), ["shortened"]);
    harness.registry.check_invariants();
    step_quietly_until(&mut harness, 2_800, "reuser and lengthened");
    harness.advance(1); // 2800
    assert_eq!(
        harness.drained_keys(EventKind::Expired),
        ["lengthened", "reuser"]
    );
    assert_eq!(harness.registry.len(), 0);
    harness.registry.check_invariants();
}

/// A mass expiry's keys leave the listing in one pass once enough of them wait for it
/// (`Shard::flush_unlisting`). Meanwhile the invariants hold, and whatever comes first (a
/// page, or a registration of one of those keys) finds the listing without them: a page lists
/// exactly the alive keys, by key and by service, and a key registered again is listed once.
#[test]
fn keys_waiting_to_leave_the_listing_are_never_listed() {
    for registers_first in [false, true] {
        let mut harness = one_shard(60);
        for n in 0..1000 {
            let service = if n % 2 == 0 { "a" } else { "b" };
            harness.heartbeat_in(&format!("long{n:04}"), 60_000, Some(service));
        }
        for n in 0..100 {
            harness.heartbeat_in(&format!("short{n:03}"), 1_000, Some("a"));
        }
        harness.advance(1_000);
        assert_eq!(harness.drained_keys(EventKind::Expired).len(), 100);
        // 100 of 1,100 keys left in one step: they wait (fewer than an eighth of those alive).
        assert_eq!(harness.registry.keys_leaving_listing(), 100);
        harness.registry.check_invariants();
        let mut expected: Vec<String> = (0..1000).map(|n| format!("long{n:04}")).collect();
        if registers_first {
            harness.heartbeat_in("short007", 1_000, Some("a"));
            assert_eq!(harness.registry.keys_leaving_listing(), 0);
            harness.registry.check_invariants();
            expected.push("short007".to_owned());
        }
        let page = |filter: &ListFilter| -> Vec<String> {
            let (views, more) = harness.registry.list_alive(filter, 2_000, harness.now());
            assert!(!more);
            views.into_iter().map(|view| view.key.to_string()).collect()
        };
        assert_eq!(page(&ListFilter::default()), expected);
        assert_eq!(harness.registry.keys_leaving_listing(), 0);
        harness.registry.check_invariants();
        let service_a = harness
            .registry
            .service_id(&ServiceName::new("a").expect("valid"))
            .expect("known service");
        let in_a = ListFilter {
            service: Some(service_a),
            ..ListFilter::default()
        };
        let expected_a: Vec<String> = (expected.iter())
            .filter(|key| key.starts_with("short") || key[4..].parse::<u32>().unwrap() % 2 == 0)
            .cloned()
            .collect();
        assert_eq!(page(&in_a), expected_a);
    }
}
