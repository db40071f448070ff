//! Absolute deadlines (`PUT /v1/keys/{key}/ttl` with `at_ms`, Redis's PEXPIREAT) against the
//! wall clock: a key lives until the wall clock reaches its instant (never early), and a TTL read
//! at any moment is at most the instant minus the wall clock's whole milliseconds then (issue 27:
//! right after `at = now + 20 s` it once answered 20,001).
//!
//! Deterministically first, with a pinned wall clock 0.6 ms past a whole millisecond; then with
//! the real clock against a real server. There the client reads its wall clock right *before*
//! each request: the server reads its clock later, when less is left, so `at - before` bounds
//! any correct answer (a reading after the answer would be a tighter bound than the server can
//! meet, failing a correct server by the request's latency). The case is caught as it
//! happened: `at = before + 20 s` answered with 20,001. "Gone" is judged the other way: the
//! wall clock read after a 404 must have reached the instant.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::{Method, StatusCode};
use serde_json::json;
use tokio::time::Instant;
use ttlwheel::clock::{rfc3339, Clock};
use ttlwheel::registry::{
    ExpireAt, ExpireOutcome, GuardConfig, Heartbeat, KeyState, Registry, RegistryConfig,
};
use ttlwheel::types::Ttl;

use crate::server::TestServer;
use crate::{key_of, UNIX_AT_EPOCH};

const NS_PER_MS: i128 = 1_000_000;

/// The registry alone, on instants the test gives: the anchor is 0.6 ms past a whole millisecond,
/// the key's instant is asked for 1.3 ms after the epoch, and the key is read and swept every
/// 100 µs for 10 ms from then, and for 30 ms around its instant.
#[test]
fn with_a_fractional_anchor_an_absolute_key_lives_until_its_instant_and_its_ttl_never_overshoots() {
    let epoch = Instant::now();
    let anchor_ns = i128::from(UNIX_AT_EPOCH) * NS_PER_MS + 600_000;
    let registry = Registry::with_clock(
        RegistryConfig {
            guard: GuardConfig::off(),
            ..RegistryConfig::default()
        },
        Clock::with_unix_ns_at_epoch(epoch, anchor_ns),
    );
    let wall_ns = |since_epoch_ns: u64| anchor_ns + i128::from(since_epoch_ns);
    let key = key_of("absolute");
    let set_ns = 1_300_000;
    registry
        .heartbeat(
            Heartbeat {
                key: key.clone(),
                ttl: Ttl::from_millis(60_000).unwrap(),
                service: None,
                meta: None,
            },
            epoch,
        )
        .unwrap();
    // The client's "now + 20 s": its wall clock's whole milliseconds then, plus 20,000.
    let at_ms = (wall_ns(set_ns) / NS_PER_MS) as i64 + 20_000;
    let set_at = epoch + Duration::from_nanos(set_ns);
    let outcome = registry
        .expire(&key, ExpireAt::AtUnixMs(at_ms), None, set_at)
        .unwrap();
    let ExpireOutcome::Applied { ttl_ms } = outcome else {
        panic!("{outcome:?}");
    };
    // The wall clock reads 1.9 ms past the whole millisecond `at_ms` was computed from: 19,999.1
    // ms are left, answered as 19,999 (the whole milliseconds left, never the 20,001 of before).
    assert_eq!(ttl_ms, 19_999);
    let view = registry.get(&key, set_at).unwrap();
    assert_eq!(view.expires_at_ms, Some(at_ms as u64), "shown as asked");
    // When the wall clock reaches the instant, in ns after the epoch.
    let instant_ns = (i128::from(at_ms) * NS_PER_MS - anchor_ns) as u64;
    let (mut alive_until, mut gone_from) = (None, None);
    let early = (0..100u64).map(|step| set_ns + step * 100_000);
    let around = (0..300u64).map(|step| instant_ns - 15_000_000 + step * 100_000);
    for since_epoch_ns in early.chain(around) {
        let now = epoch + Duration::from_nanos(since_epoch_ns);
        while registry.sweep(now, 1_000).more {}
        let wall_ms = (wall_ns(since_epoch_ns) / NS_PER_MS) as i64;
        match registry.state(&key, now) {
            KeyState::ExpiresIn(left_ms) => {
                assert!(
                    left_ms as i64 <= at_ms - wall_ms,
                    "{left_ms} ms left at {since_epoch_ns} ns, the wall clock at {wall_ms}"
                );
                let view = registry.get(&key, now).unwrap();
                assert!(view.expires_in_ms.unwrap() as i64 <= at_ms - wall_ms);
                assert_eq!(gone_from, None, "alive again");
                alive_until = Some(since_epoch_ns);
            }
            KeyState::Missing => {
                assert!(
                    wall_ns(since_epoch_ns) >= i128::from(at_ms) * NS_PER_MS,
                    "gone early: at {since_epoch_ns} ns"
                );
                gone_from.get_or_insert(since_epoch_ns);
            }
            KeyState::Persistent => panic!("the TTL was lost"),
        }
    }
    // Alive up to the instant (the last read before it said so), and gone within the millisecond
    // after (the registry counts whole milliseconds).
    assert!(
        alive_until.unwrap() >= instant_ns - 100_000,
        "{alive_until:?}"
    );
    let gone_from = gone_from.unwrap();
    assert!(
        (instant_ns..instant_ns + 1_000_000).contains(&gone_from),
        "gone from {gone_from} ns, the instant at {instant_ns} ns"
    );
}

/// This process's wall clock, in whole Unix milliseconds (as a client computes `at_ms`).
fn unix_now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as i64
}

/// TTL reads that exceeded the instant asked for minus the wall clock read before the request.
/// A stall of the server extends every deadline, absolute ones too, by design, so the reads are
/// judged at the end against the stall time the server accounted meanwhile (`/healthz`; 0 on a
/// machine that did not stall it).
struct Overshoots {
    stalled_before_ms: i64,
    /// What was read, and by how much it exceeded the bound.
    found: Vec<(String, i64)>,
}

impl Overshoots {
    async fn start(server: &TestServer) -> Self {
        Self {
            stalled_before_ms: stalled_ms(server).await,
            found: Vec::new(),
        }
    }

    /// A TTL of `ttl_ms` read for instant `at_ms`, the wall clock at `before_ms` just before
    /// the request (0 is the least an alive key can answer).
    fn check(&mut self, what: String, ttl_ms: i64, at_ms: i64, before_ms: i64) {
        let bound = (at_ms - before_ms).max(0);
        if ttl_ms > bound {
            self.found.push((what, ttl_ms - bound));
        }
    }

    async fn assert_none_past_the_stalls(self, server: &TestServer) {
        let stalled = stalled_ms(server).await - self.stalled_before_ms;
        assert!(
            self.found.iter().all(|(_, by)| *by <= stalled),
            "overshoots (read, ms) with {stalled} ms of stalls: {:?}",
            self.found
        );
    }
}

/// The stall time the server accounted so far, in ms.
async fn stalled_ms(server: &TestServer) -> i64 {
    let (_, health) = server.get("/healthz").await;
    (health["stalls"]["total_s"].as_f64().unwrap_or(0.0) * 1000.0).ceil() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_the_real_clock_a_ttl_after_an_absolute_expiry_never_exceeds_the_instant_minus_now()
{
    let server = TestServer::start().await;
    let mut overshoots = Overshoots::start(&server).await;
    for i in 0..300 {
        let key = format!("at-{}", i % 10);
        let (status, _) = server
            .post("/v1/heartbeats", json!({"key": key, "ttl_s": 60}))
            .await;
        assert_eq!(status, StatusCode::OK);
        // "now + 20 s", as a client computes it, just before it sends it.
        let before_ms = unix_now_ms();
        let at_ms = before_ms + 20_000 + i % 7;
        let path = format!("/v1/keys/{key}/ttl");
        let (status, answer) = server
            .call(Method::PUT, &path, Some(json!({ "at_ms": at_ms })))
            .await;
        assert_eq!((status, &answer["applied"]), (StatusCode::OK, &json!(true)));
        let reads = [
            ("PUT", answer["ttl_ms"].as_i64(), before_ms),
            {
                let before_ms = unix_now_ms();
                let (_, answer) = server.get(&path).await;
                ("GET ttl", answer["ttl_ms"].as_i64(), before_ms)
            },
            {
                let before_ms = unix_now_ms();
                let (_, view) = server.get(&format!("/v1/keys/{key}")).await;
                assert_eq!(
                    view["expires_at"].as_str(),
                    Some(rfc3339(at_ms as u64).as_str()),
                    "a deadline shows as the instant asked for"
                );
                ("GET key", view["expires_in_ms"].as_i64(), before_ms)
            },
        ];
        for (what, ttl_ms, before_ms) in reads {
            let ttl_ms = ttl_ms.unwrap_or_else(|| panic!("{i}: {what} gave no TTL"));
            // Not vacuous: about 20 s are left.
            assert!(ttl_ms > 19_000, "{i}: {what}: {ttl_ms}");
            overshoots.check(format!("{i}: {what}"), ttl_ms, at_ms, before_ms);
        }
    }
    overshoots.assert_none_past_the_stalls(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_the_real_clock_an_absolute_key_is_never_gone_before_its_instant() {
    let server = TestServer::start().await;
    let mut overshoots = Overshoots::start(&server).await;
    let mut instants: BTreeMap<String, i64> = BTreeMap::new();
    for j in 0..20 {
        let key = format!("soon-{j}");
        server
            .post("/v1/heartbeats", json!({"key": key, "ttl_s": 60}))
            .await;
        let at_ms = unix_now_ms() + 30 + 5 * j;
        let (status, answer) = server
            .call(
                Method::PUT,
                &format!("/v1/keys/{key}/ttl"),
                Some(json!({ "at_ms": at_ms })),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        if answer["deleted"] == true {
            // The machine was slow enough for the instant to pass before the call.
            assert!(unix_now_ms() >= at_ms, "{key} deleted before {at_ms}");
            continue;
        }
        instants.insert(key, at_ms);
    }
    let mut pending = instants.clone();
    let give_up = Instant::now() + Duration::from_secs(20);
    while !pending.is_empty() && Instant::now() < give_up {
        for (key, at_ms) in pending.clone() {
            let before_ms = unix_now_ms();
            let (status, answer) = server.get(&format!("/v1/keys/{key}/ttl")).await;
            // Read after the answer: the server decided no later than this.
            let after_ms = unix_now_ms();
            match status {
                StatusCode::NOT_FOUND => {
                    assert!(
                        after_ms >= at_ms,
                        "{key} gone at {after_ms}, before {at_ms}"
                    );
                    pending.remove(&key);
                }
                StatusCode::OK => {
                    let ttl_ms = answer["ttl_ms"].as_i64().unwrap();
                    overshoots.check(format!("{key} at {before_ms}"), ttl_ms, at_ms, before_ms);
                }
                other => panic!("{key}: {other} {answer}"),
            }
        }
    }
    assert!(pending.is_empty(), "never expired: {pending:?}");
    overshoots.assert_none_past_the_stalls(&server).await;
    // The server's own record of each expiry is at or after the instant too.
    let (_, expired) = server.get("/v1/keys?state=expired&prefix=soon-").await;
    let records = expired["keys"].as_array().unwrap();
    assert_eq!(records.len(), instants.len(), "{expired}");
    for record in records {
        let at_ms = instants[record["key"].as_str().unwrap()];
        let expired_at = record["expired_at"].as_str().unwrap();
        assert!(
            expired_at >= rfc3339(at_ms as u64).as_str(),
            "{record} before {at_ms}"
        );
    }
}
