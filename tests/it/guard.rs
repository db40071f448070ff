//! The mass-expiry guard: a partition that heals within the hold ends with 0 false expirations;
//! a real mass death still ends in expiry, late by at most the maximum hold plus the release
//! window; the hold never outlives its bound; an operator engages and releases it, and an
//! operator's release expires every held key at once, not at the bounded rate.
//!
//! What must not be lost: the liveness of keys whose heartbeats come back within the hold; the
//! expiry (exactly one event each) of keys whose clients are gone for good.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::time::Instant;
use ttlwheel::events::{EventKind, EventReceiver};
use ttlwheel::registry::guard::ReleasedBy;
use ttlwheel::registry::{GuardConfig, Heartbeat, ListFilter, Registry, RegistryConfig};
use ttlwheel::ticker;
use ttlwheel::types::Ttl;

use crate::key_of;
use crate::process::{temp_data_dir, Server};
use crate::receiver::{always, Receiver};

const TTL_MS: u64 = 3_000;
const MAX_HOLD_MS: u64 = 60_000;
const RELEASE_OVER_MS: u64 = 10_000;

/// A registry with its ticker, on paused time.
struct Running {
    registry: Arc<Registry>,
    events: EventReceiver,
    stop: watch::Sender<bool>,
    ticker: tokio::task::JoinHandle<()>,
}

impl Running {
    fn start() -> Self {
        let config = RegistryConfig {
            guard: GuardConfig {
                max_hold_ms: MAX_HOLD_MS,
                release_over_ms: RELEASE_OVER_MS,
                ..GuardConfig::default()
            },
            ..RegistryConfig::default()
        };
        let registry = Arc::new(Registry::new(config, Instant::now()));
        let events = registry.subscribe();
        let (stop, mut stopped) = watch::channel(false);
        let ticker = tokio::spawn(ticker::run(Arc::clone(&registry), async move {
            let _ = stopped.wait_for(|&stop| stop).await;
        }));
        Self {
            registry,
            events,
            stop,
            ticker,
        }
    }

    fn beat(&self, keys: &[String]) {
        for key in keys {
            let heartbeat = Heartbeat {
                key: key_of(key),
                ttl: Ttl::from_millis(TTL_MS).unwrap(),
                service: None,
                meta: None,
            };
            self.registry.heartbeat(heartbeat, Instant::now()).unwrap();
        }
    }

    /// Every event since the last call, by kind: key events by key, guard events counted.
    fn drain(&mut self) -> (BTreeMap<String, Vec<EventKind>>, Vec<EventKind>) {
        let (mut by_key, mut guard) = (BTreeMap::<String, Vec<EventKind>>::new(), Vec::new());
        while let Some(event) = self.events.try_recv() {
            if event.kind.is_guard() {
                guard.push(event.kind);
            } else if event.kind != EventKind::Registered {
                by_key
                    .entry(event.key.to_string())
                    .or_default()
                    .push(event.kind);
            }
        }
        (by_key, guard)
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        self.ticker.await.unwrap();
        self.registry.check_invariants();
    }
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// Heartbeats `keys` every second for `seconds`.
async fn heartbeat_for(running: &Running, keys: &[String], seconds: u64) {
    for _ in 0..seconds {
        running.beat(keys);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_partition_that_heals_within_the_hold_expires_nothing() {
    let mut running = Running::start();
    let fleet = names("fleet", 1_000);
    heartbeat_for(&running, &fleet, 3).await;
    // The partition: no heartbeat reaches the registry for 20 s (TTL 3 s).
    tokio::time::sleep(Duration::from_secs(20)).await;
    let status = running.registry.guard_status(Instant::now());
    assert_eq!(status.state, "engaged", "{status:?}");
    assert_eq!(status.held, 1_000);
    assert_eq!(
        status.baseline,
        Some(1_000),
        "the baseline is frozen at the trip"
    );
    let listed = running.registry.list_alive(
        &ListFilter {
            held_only: true,
            ..ListFilter::default()
        },
        1_000,
        Instant::now(),
    );
    assert_eq!(listed.0.len(), 1_000);
    assert!(listed.0.iter().all(|view| view.held));
    // It heals: heartbeats renew the held keys as usual.
    heartbeat_for(&running, &fleet, 15).await;
    let (expired, guard) = running.drain();
    assert_eq!(expired, BTreeMap::new(), "0 false expirations");
    assert_eq!(guard, [EventKind::GuardEngaged, EventKind::GuardReleased]);
    let status = running.registry.guard_status(Instant::now());
    assert_eq!(status.state, "armed", "{status:?}");
    assert_eq!(status.released_by, None);
    assert_eq!(running.registry.held_count(), 0);
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_real_mass_death_expires_late_by_at_most_the_hold_and_the_release() {
    let mut running = Running::start();
    let dead = names("dead", 1_000);
    let alive = names("alive", 500);
    heartbeat_for(&running, &[dead.clone(), alive.clone()].concat(), 3).await;
    let death = Instant::now();
    let mut released_at = None;
    let mut expired_at: BTreeMap<String, Instant> = BTreeMap::new();
    // The survivors keep heartbeating; watch the hold end by itself.
    for _ in 0..(MAX_HOLD_MS + RELEASE_OVER_MS) / 1000 + 10 {
        running.beat(&alive);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let status = running.registry.guard_status(Instant::now());
        if status.state == "engaged" {
            assert!(
                Instant::now() - death <= Duration::from_millis(MAX_HOLD_MS + TTL_MS + 1_000),
                "held past its bound: {status:?}"
            );
        }
        let (expired, guard) = running.drain();
        if guard.contains(&EventKind::GuardReleased) {
            released_at = Some(Instant::now());
        }
        for key in expired.keys() {
            expired_at.insert(key.clone(), Instant::now());
        }
    }
    assert!(released_at.is_some(), "the hold ended by itself");
    assert_eq!(expired_at.keys().cloned().collect::<Vec<_>>(), {
        let mut dead = dead.clone();
        dead.sort();
        dead
    });
    let latest = expired_at.values().max().unwrap();
    let deadline = death + Duration::from_millis(TTL_MS);
    assert!(
        *latest - deadline <= Duration::from_millis(MAX_HOLD_MS + RELEASE_OVER_MS + 1_000),
        "the last expiry came {:?} after the deadline",
        *latest - deadline
    );
    // The release was spread, not one flood: it took more than one second.
    let first = expired_at.values().min().unwrap();
    assert!(*latest - *first >= Duration::from_secs(5));
    assert_eq!(running.registry.guard_status(Instant::now()).state, "armed");
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_small_share_expires_as_usual_and_an_operator_engages_and_releases() {
    let mut running = Running::start();
    let fleet = names("fleet", 1_000);
    let few = names("few", 100); // 9% of the keys: not a mass expiry
    heartbeat_for(&running, &[fleet.clone(), few.clone()].concat(), 2).await;
    heartbeat_for(&running, &fleet, 5).await;
    let (expired, guard) = running.drain();
    assert_eq!(expired.len(), 100);
    assert_eq!(guard, []);
    // An operator engages: due keys are held even though few are due.
    running.registry.guard_engage(Instant::now()).unwrap();
    let stopping = names("stopping", 10);
    running.beat(&stopping);
    heartbeat_for(&running, &fleet, 5).await;
    assert_eq!(running.registry.held_count(), 10);
    let (expired, guard) = running.drain();
    assert_eq!(expired, BTreeMap::new());
    assert_eq!(guard, [EventKind::GuardEngaged]);
    // Engaging again does not move the end.
    let ends = running.registry.guard_status(Instant::now()).hold_ends_at;
    running.registry.guard_engage(Instant::now()).unwrap();
    assert_eq!(
        running.registry.guard_status(Instant::now()).hold_ends_at,
        ends
    );
    let status = running.registry.guard_release(Instant::now());
    assert_eq!(status.state, "releasing");
    assert!(
        running.registry.guard_engage(Instant::now()).is_err(),
        "no re-engage mid-release"
    );
    heartbeat_for(&running, &fleet, 3).await;
    let (expired, guard) = running.drain();
    assert_eq!(expired.len(), 10);
    assert!(expired.values().all(|kinds| kinds == &[EventKind::Expired]));
    assert_eq!(guard, [EventKind::GuardReleased]);
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_operators_release_expires_every_held_key_at_once() {
    let mut running = Running::start();
    let fleet = names("fleet", 1_000);
    let survivors = names("survivor", 100);
    heartbeat_for(&running, &[fleet.clone(), survivors.clone()].concat(), 2).await;
    running.registry.guard_engage(Instant::now()).unwrap();
    // The fleet stops; its keys come due and are held while the survivors heartbeat.
    heartbeat_for(&running, &survivors, TTL_MS / 1000 + 2).await;
    assert_eq!(running.registry.held_count(), 1_000);
    let (expired, guard) = running.drain();
    assert_eq!(expired, BTreeMap::new());
    assert_eq!(guard, [EventKind::GuardEngaged]);
    let released_at = Instant::now();
    let status = running.registry.guard_release(released_at);
    assert_eq!(
        (status.held, status.released_by, status.release_per_s),
        (0, Some(ReleasedBy::Operator), None),
        "{status:?}"
    );
    // All 1,000 expired within the call, without the clock moving: at the bounded rate (1,000
    // over 10 s, 100 a second) only the first second's 100 could have gone by now.
    assert_eq!(Instant::now(), released_at);
    let (expired, guard) = running.drain();
    let mut dead = fleet.clone();
    dead.sort();
    assert_eq!(expired.keys().cloned().collect::<Vec<_>>(), dead);
    assert!(expired.values().all(|kinds| kinds == &[EventKind::Expired]));
    assert_eq!(guard, [EventKind::GuardReleased]);
    let held = running.registry.list_alive(
        &ListFilter {
            held_only: true,
            ..ListFilter::default()
        },
        1_000,
        Instant::now(),
    );
    assert_eq!(held.0.len(), 0);
    // The sweeper, woken by the release, arms the guard again, still without the clock moving.
    for _ in 0..100 {
        if running.registry.guard_status(Instant::now()).state == "armed" {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(running.registry.guard_status(Instant::now()).state, "armed");
    assert_eq!(Instant::now(), released_at);
    // The survivors were never held, and nothing else expired.
    heartbeat_for(&running, &survivors, 3).await;
    let (expired, guard) = running.drain();
    assert_eq!((expired, guard), (BTreeMap::new(), vec![]));
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_operators_release_hurries_the_release_after_the_maximum_hold() {
    let mut running = Running::start();
    let fleet = names("fleet", 5_000);
    heartbeat_for(&running, &fleet, 2).await;
    running.registry.guard_engage(Instant::now()).unwrap();
    // Nobody heartbeats: the hold runs out, and the release begins at 500 keys a second.
    tokio::time::sleep(Duration::from_millis(MAX_HOLD_MS + 500)).await;
    let status = running.registry.guard_status(Instant::now());
    assert_eq!(
        (status.state, status.release_per_s),
        ("releasing", Some(500)),
        "{status:?}"
    );
    assert!(status.held > 0 && status.held < 5_000, "{status:?}");
    let status = running.registry.guard_release(Instant::now());
    assert_eq!(status.held, 0, "{status:?}");
    assert_eq!(status.released_by, Some(ReleasedBy::MaxHold));
    let (expired, guard) = running.drain();
    assert_eq!(expired.len(), 5_000);
    assert!(expired.values().all(|kinds| kinds == &[EventKind::Expired]));
    assert_eq!(guard, [EventKind::GuardEngaged, EventKind::GuardReleased]);
    running.stop().await;
}

/// The binary: an operator's release of 1,000 held keys expires them all before its answer
/// (the bounded rate, 1,000 over the default 10 s, would have let about 100 go by then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_the_binary_an_operators_release_expires_the_whole_hold_at_once() {
    let dir = temp_data_dir("guard-release");
    let server = Server::start(&dir, &[]);
    server.ready().await;
    // Engaged first, so that however slow the machine, every key is held when it comes due.
    let (code, _) = server
        .call(reqwest::Method::POST, "/v1/guard/engage", None)
        .await;
    assert_eq!(code, StatusCode::OK);
    let heartbeats: Vec<Value> = names("fleet", 1_000)
        .iter()
        .map(|key| json!({"key": key, "ttl_ms": 1_000}))
        .collect();
    let (code, _) = server
        .call(
            reqwest::Method::POST,
            "/v1/heartbeats/batch?results=errors",
            Some(json!({ "heartbeats": heartbeats })),
        )
        .await;
    assert_eq!(code, StatusCode::OK);
    // Every key comes due after its TTL and is held.
    let mut status = Value::Null;
    for _ in 0..100 {
        (_, status) = server.call(reqwest::Method::GET, "/v1/guard", None).await;
        if status["held"] == 1_000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status["held"], 1_000, "{status}");
    let (code, released) = server
        .call(reqwest::Method::POST, "/v1/guard/release", None)
        .await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(
        (
            &released["held"],
            &released["released_by"],
            &released["release_per_s"]
        ),
        (&json!(0), &json!("operator"), &Value::Null),
        "{released}"
    );
    let (_, held) = server
        .call(reqwest::Method::GET, "/v1/keys?state=held&limit=1000", None)
        .await;
    assert_eq!(held["keys"].as_array().map(Vec::len), Some(0), "{held}");
    let (_, expired) = server
        .call(
            reqwest::Method::GET,
            "/v1/keys?state=expired&limit=1000",
            None,
        )
        .await;
    assert_eq!(
        expired["keys"].as_array().map(Vec::len),
        Some(1_000),
        "every held key expired before the answer"
    );
    // Armed again at the sweeper's next step.
    for _ in 0..50 {
        (_, status) = server.call(reqwest::Method::GET, "/v1/guard", None).await;
        if status["state"] == "armed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status["state"], "armed", "{status}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The binary, as an operator runs it: a partition (heartbeats stop for 8 s, TTL 3 s) with
/// webhooks for expiries and guard events; then the same keys die for good with a short hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_the_binary_a_healed_partition_sends_no_expiry_and_a_death_ends_in_expiry() {
    let receiver = Receiver::start(always(StatusCode::NO_CONTENT)).await;
    let dir = temp_data_dir("guard");
    let url = receiver.url().to_string();
    let args = [
        "--webhook-url",
        &url,
        "--webhook-events",
        "expired,guard",
        "--expiry-guard-max-hold",
        "15s",
        "--expiry-guard-release-over",
        "2s",
    ];
    let server = Server::start(&dir, &args);
    server.ready().await;
    let fleet = names("fleet", 1_000);
    let beat = |server: &Server| {
        let heartbeats: Vec<Value> = fleet
            .iter()
            .map(|key| json!({"key": key, "ttl_ms": TTL_MS}))
            .collect();
        let body = json!({ "heartbeats": heartbeats });
        let request = server
            .client
            .post(format!(
                "{}/v1/heartbeats/batch?results=errors",
                server.base
            ))
            .json(&body);
        async move {
            let answer = request.send().await.unwrap();
            assert_eq!(answer.status(), StatusCode::OK);
        }
    };
    for _ in 0..3 {
        beat(&server).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // The partition: 8 s without heartbeats.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let (_, status) = server.call(reqwest::Method::GET, "/v1/guard", None).await;
    assert_eq!(status["state"], "engaged", "{status}");
    assert_eq!(status["held"], 1_000);
    let (_, page) = server
        .call(reqwest::Method::GET, "/v1/keys?state=held&limit=5", None)
        .await;
    assert_eq!(page["keys"][0]["state"], "held", "{page}");
    // Healed: heartbeats again, past one guard window (10 s).
    for _ in 0..12 {
        beat(&server).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (_, status) = server.call(reqwest::Method::GET, "/v1/guard", None).await;
    assert_eq!(status["state"], "armed", "{status}");
    let types = |receiver: &Receiver| -> Vec<String> {
        receiver
            .requests()
            .iter()
            .map(|request| request.json["type"].as_str().unwrap().to_owned())
            .collect()
    };
    receiver
        .wait_until(Duration::from_secs(10), |requests| requests.len() >= 2)
        .await;
    assert_eq!(types(&receiver), ["guard.engaged", "guard.released"]);
    assert_eq!(receiver.requests()[1].json["data"]["released_by"], "healed");
    // Now they die for good: held for 15 s, then released over 2 s.
    receiver
        .wait_until(Duration::from_secs(40), |requests| {
            requests.len() >= 4 + fleet.len()
        })
        .await;
    let types = types(&receiver);
    // The engagement comes 15 s before any expiry; the release and the first expiries are
    // published together and delivered concurrently (order is kept per key, not across keys).
    assert_eq!(types[2], "guard.engaged");
    let count = |kind: &str| types[3..].iter().filter(|t| *t == kind).count();
    assert_eq!(
        (count("guard.released"), count("key.expired")),
        (1, 1_000),
        "{types:?}"
    );
    // Late by at most the hold plus the release window plus a tick, as the server measured it
    // (delivery to the receiver comes on top, and is not what the guard bounds).
    for request in receiver.requests().iter().skip(2) {
        if request.json["type"] == "key.expired" {
            let lateness_ms = request.json["data"]["lateness_ms"].as_u64().unwrap();
            assert!(
                lateness_ms <= 15_000 + 2_000 + 1_000 + 500,
                "{} expired {lateness_ms} ms late",
                request.key()
            );
        }
    }
    let (_, metrics) = server.call(reqwest::Method::GET, "/healthz", None).await;
    assert_eq!(metrics["status"], "ok");
    // An operator's levers over HTTP.
    let (code, engaged) = server
        .call(reqwest::Method::POST, "/v1/guard/engage", None)
        .await;
    assert_eq!(
        (code, engaged["engaged_by"].as_str()),
        (StatusCode::OK, Some("operator"))
    );
    let (code, released) = server
        .call(reqwest::Method::POST, "/v1/guard/release", None)
        .await;
    assert_eq!(code, StatusCode::OK);
    assert!(
        matches!(released["state"].as_str(), Some("releasing" | "armed")),
        "{released}"
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
