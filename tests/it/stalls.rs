//! Our pause is not your death: a stall of the process itself (a VM pause, `SIGSTOP`, swapping)
//! extends every deadline by its length, so keys whose heartbeats queued up during it do not
//! expire; keys whose clients really stopped still expire, late by at most the pause plus a tick.
//!
//! What must not be lost: the liveness of every key whose client kept heartbeating through the
//! pause (0 false expirations, 0 webhooks for them); and the expiry of every key whose client
//! stopped before it (each one expired, none more than the pause plus one tick late).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::time::Instant;
use ttlwheel::events::{EventKind, EventReceiver};
use ttlwheel::registry::{GuardConfig, Heartbeat, Registry, RegistryConfig};
use ttlwheel::ticker;
use ttlwheel::types::{ServiceName, Ttl};

use crate::key_of;
use crate::process::{temp_data_dir, Server};
use crate::receiver::{always, Receiver};

const TTL_MS: u64 = 3_000;

fn beat(registry: &Registry, keys: &[String]) {
    for key in keys {
        let heartbeat = Heartbeat {
            key: key_of(key),
            ttl: Ttl::from_millis(TTL_MS).unwrap(),
            service: None::<ServiceName>,
            meta: None,
        };
        registry.heartbeat(heartbeat, Instant::now()).unwrap();
    }
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// Expiries drained from `events`: `(key, lateness_ms)`.
fn expiries(events: &mut EventReceiver) -> Vec<(String, u64)> {
    std::iter::from_fn(|| events.try_recv())
        .filter(|event| event.kind == EventKind::Expired)
        .map(|event| (event.key.to_string(), event.lateness_ms))
        .collect()
}

/// The scenario with paused time: 2,000 keys heartbeating every second with a 3 s TTL, 100 keys
/// whose clients stop a second before the pause; the clock jumps by `pause` between two
/// heartbeats, and the ticker sweeps before the heartbeats queued during the jump are applied.
/// Returns the expiries of live keys and of stopped keys.
async fn jump_the_clock(
    pause: Duration,
    watchdog: bool,
) -> (Vec<(String, u64)>, Vec<(String, u64)>) {
    // The guard off: this is the stall compensation alone (the guard would also hold the
    // fleet in the control below).
    let config = RegistryConfig {
        guard: GuardConfig::off(),
        ..RegistryConfig::default()
    };
    let registry = Arc::new(Registry::new(config, Instant::now()));
    let mut events = registry.subscribe();
    let (stop, stopped) = watch::channel(false);
    let until_stopped = |mut stopped: watch::Receiver<bool>| async move {
        let _ = stopped.wait_for(|&stop| stop).await;
    };
    let ticker = tokio::spawn(ticker::run(
        Arc::clone(&registry),
        until_stopped(stopped.clone()),
    ));
    let watch = watchdog.then(|| {
        tokio::spawn(ticker::watch_for_stalls(
            Arc::clone(&registry),
            until_stopped(stopped.clone()),
        ))
    });
    let live = names("live", 2_000);
    let stopped_keys = names("stopped", 100);
    beat(&registry, &live);
    beat(&registry, &stopped_keys);
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        beat(&registry, &live);
    }
    // t = 2 s; the stopped keys' deadline is 3 s. Half a second later the process stalls.
    tokio::time::sleep(Duration::from_millis(500)).await;
    tokio::time::advance(pause).await;
    // The worst order: the ticker sweeps before any queued heartbeat is read.
    ticker::sweep_due(&registry).await;
    beat(&registry, &live);
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        beat(&registry, &live);
    }
    let _ = stop.send(true);
    ticker.await.unwrap();
    if let Some(watch) = watch {
        watch.await.unwrap();
    }
    registry.check_invariants();
    let (stopped_expiries, live_expiries) = expiries(&mut events)
        .into_iter()
        .partition(|(key, _)| key.starts_with("stopped"));
    (live_expiries, stopped_expiries)
}

#[tokio::test(start_paused = true)]
async fn a_clock_jump_between_ticks_expires_no_key_that_kept_heartbeating() {
    for pause_s in [2, 8] {
        let pause = Duration::from_secs(pause_s);
        let (live, stopped) = jump_the_clock(pause, true).await;
        assert_eq!(live, [], "false expirations after a {pause_s} s stall");
        let expired: BTreeSet<_> = stopped.iter().map(|(key, _)| key.clone()).collect();
        assert_eq!(
            expired,
            names("stopped", 100).into_iter().collect(),
            "{pause_s} s"
        );
        for (key, lateness_ms) in stopped {
            // Late by the stall (it held the expiry up), and by at most the pause plus a tick.
            assert!(
                lateness_ms >= pause_s * 1000 - 350 && lateness_ms <= pause_s * 1000 + 1000,
                "{key} expired {lateness_ms} ms late after a {pause_s} s stall"
            );
        }
    }
}

/// The control: without the watchdog the same jump expires every live key (the test can fail).
#[tokio::test(start_paused = true)]
async fn without_the_watchdog_the_same_jump_expires_the_fleet() {
    let (live, _) = jump_the_clock(Duration::from_secs(8), false).await;
    assert_eq!(live.len(), 2_000);
}

/// The experiment against the binary: `kill -STOP` for 2 s and for 8 s while 2,000 keys
/// heartbeat every second (3 s TTL) in batches sent on schedule, whether or not the last one
/// was answered (so they queue up in the sockets during the pause); 100 keys' clients stop
/// 1.5 s before the pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_stop_expires_no_key_that_kept_heartbeating() {
    let receiver = Receiver::start(always(reqwest::StatusCode::NO_CONTENT)).await;
    for pause_s in [2u64, 8] {
        let dir = temp_data_dir(&format!("stall-{pause_s}"));
        let url = receiver.url().to_string();
        // The guard off: the stall compensation alone must give 0 false expirations.
        let args = ["--webhook-url", &url, "--expiry-guard", "off"];
        let server = Arc::new(Server::start(&dir, &args));
        server.ready().await;
        let before = receiver.requests().len();
        let live = names(&format!("live{pause_s}"), 2_000);
        let stopped = names(&format!("stopped{pause_s}"), 100);
        let stopped_for_sender = stopped.clone();
        let server_for_sender = Arc::clone(&server);
        let send = move |keys: Vec<String>| {
            let server = Arc::clone(&server_for_sender);
            tokio::spawn(async move {
                let heartbeats: Vec<Value> = keys
                    .iter()
                    .map(|key| json!({"key": key, "ttl_ms": TTL_MS}))
                    .collect();
                let body = json!({ "heartbeats": heartbeats });
                server
                    .client
                    .post(format!(
                        "{}/v1/heartbeats/batch?results=errors",
                        server.base
                    ))
                    .timeout(Duration::from_secs(30))
                    .json(&body)
                    .send()
                    .await
                    .map(|answer| answer.status())
            })
        };
        let seconds = 9 + pause_s;
        let sender = tokio::spawn(async move {
            let mut sent = Vec::new();
            let mut schedule = tokio::time::interval(Duration::from_secs(1));
            for second in 0..seconds {
                schedule.tick().await;
                if second < 3 {
                    sent.push(send(stopped_for_sender.clone()));
                }
                for chunk in live.chunks(100) {
                    sent.push(send(chunk.to_vec()));
                }
            }
            sent
        });
        // Half a second after the stopped keys' last heartbeat (their deadline is 2.5 s on).
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        server.signal("-STOP");
        tokio::time::sleep(Duration::from_secs(pause_s)).await;
        server.signal("-CONT");
        let sent = sender.await.unwrap();
        for answer in sent {
            assert_eq!(answer.await.unwrap().ok(), Some(reqwest::StatusCode::OK));
        }
        // Every stopped key must have expired (deadline + pause + a tick, and delivery).
        receiver
            .wait_until(Duration::from_secs(20), |requests| {
                requests.len() >= before + stopped.len()
            })
            .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (_, health) = server.call(reqwest::Method::GET, "/healthz", None).await;
        let requests = receiver.requests()[before..].to_vec();
        let false_expiries: Vec<&str> = requests
            .iter()
            .map(|request| request.key())
            .filter(|key| key.starts_with("live"))
            .collect();
        assert_eq!(
            false_expiries,
            Vec::<&str>::new(),
            "after a {pause_s} s pause"
        );
        let expired: BTreeSet<&str> = requests.iter().map(|request| request.key()).collect();
        let expected: BTreeSet<&str> = stopped.iter().map(String::as_str).collect();
        assert_eq!(expired, expected, "after a {pause_s} s pause");
        for request in &requests {
            let lateness_ms = request.json["data"]["lateness_ms"].as_u64().unwrap();
            assert!(
                lateness_ms <= (pause_s + 1) * 1000 + 250,
                "{} expired {lateness_ms} ms late after a {pause_s} s pause",
                request.key()
            );
        }
        assert!(
            health["stalls"]["count"].as_u64() >= Some(1),
            "the stall shows in /healthz: {health}"
        );
        let log = server.log().join("\n");
        assert!(log.contains("the process stalled"), "a log line per stall");
        drop(server);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
