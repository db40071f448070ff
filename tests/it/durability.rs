//! Restarts lose nothing: faults against the real binary with a data directory under a temp
//! dir. Each test says what must not be lost, and checks it after the fault:
//! - `kill -9` under a mixed load (creations, renewals, deletions, TTL changes, expiries),
//!   several rounds: with `--fsync always`, every acknowledged creation, deletion and TTL change
//!   is there after the restart, every key that expired stays expired (or expires within its
//!   TTL of the restart), and every key that is there is whole (the service and metadata it was
//!   sent with); with `--fsync interval`, nothing acknowledged longer than an interval ago is
//!   lost;
//! - webhook events not yet delivered at a kill are delivered after the restart with the same
//!   `webhook-id`, and dead letters survive;
//! - a torn tail (the log cut mid-record) recovers up to the last whole record and says so;
//! - a corrupted record in the middle refuses to start, naming the file and the offset;
//! - a clean stop (SIGTERM) writes a snapshot, so the next start replays no log record;
//! - a full disk (a 1 MiB tmpfs; needs root): changes get 503 `storage_unavailable`, renewals
//!   go on, changes resume when space returns, and nothing acknowledged is lost.

use std::collections::{BTreeMap, BTreeSet};

use crate::process::{temp_data_dir, Server};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

/// What clients were told, per key: the last acknowledged state.
#[derive(Clone, Debug, PartialEq)]
enum Acked {
    /// Created or changed with this service and metadata (and a TTL of an hour or more).
    Alive {
        service: String,
        meta: Value,
    },
    Deleted,
    /// A deletion was sent and the kill cut its answer: it may or may not have happened
    /// (not acknowledged, so either is right).
    Uncertain,
    /// Created with a 100 ms TTL and never renewed: expired, before the kill or (by the restart
    /// rule) within 100 ms of the restart; never alive for good.
    Short,
}

/// One client's mixed load until the server stops answering: creations with a service and
/// metadata, deletions and TTL changes of its own earlier keys. Returns what was acknowledged.
async fn mixed_load(
    server: Arc<Server>,
    client_idx: usize,
    round: usize,
    until: Option<tokio::time::Instant>,
) -> BTreeMap<String, Acked> {
    let mut acked = BTreeMap::new();
    for n in 0.. {
        if until.is_some_and(|until| tokio::time::Instant::now() >= until) {
            break;
        }
        let key = format!("r{round}-c{client_idx}-k{n}");
        let service = format!("svc-{}", n % 3);
        let meta = json!({ "n": n, "client": client_idx });
        let (status, _) = server
            .call(
                reqwest::Method::POST,
                "/v1/heartbeats",
                Some(json!({"key": key, "service": service, "meta": meta, "ttl_s": 3600})),
            )
            .await;
        if status == StatusCode::BAD_GATEWAY {
            break;
        }
        if status == StatusCode::OK {
            acked.insert(key.clone(), Acked::Alive { service, meta });
        }
        if n % 4 == 3 {
            let victim = format!("r{round}-c{client_idx}-k{}", n - 2);
            let path = format!("/v1/keys/{victim}");
            let (status, _) = server.call(reqwest::Method::DELETE, &path, None).await;
            match status {
                StatusCode::NO_CONTENT => {
                    acked.insert(victim, Acked::Deleted);
                }
                StatusCode::BAD_GATEWAY => {
                    acked.insert(victim, Acked::Uncertain);
                    break;
                }
                _ => {}
            }
        }
        if n % 3 == 2 {
            // A renewal that changes nothing but the deadline (no log record).
            let previous = format!("r{round}-c{client_idx}-k{}", n - 1);
            let service = format!("svc-{}", (n - 1) % 3);
            let meta = json!({ "n": n - 1, "client": client_idx });
            let body = json!({"key": previous, "service": service, "meta": meta, "ttl_s": 3600});
            if server
                .call(reqwest::Method::POST, "/v1/heartbeats", Some(body))
                .await
                .0
                == StatusCode::BAD_GATEWAY
            {
                break;
            }
        }
        if n % 6 == 5 {
            // A key that expires on its own, logged as an expiry by the sweeper.
            let short = format!("r{round}-c{client_idx}-short{n}");
            let body = json!({"key": short, "service": "short", "meta": {}, "ttl_ms": 100});
            match server
                .call(reqwest::Method::POST, "/v1/heartbeats", Some(body))
                .await
                .0
            {
                StatusCode::OK => {
                    acked.insert(short, Acked::Short);
                }
                StatusCode::BAD_GATEWAY => break,
                _ => {}
            }
        }
        if n % 5 == 4 {
            let target = format!("r{round}-c{client_idx}-k{}", n - 1);
            let path = format!("/v1/keys/{target}/ttl");
            // A longer relative TTL: the key must still be there after the restart.
            let body = json!({"ttl_ms": 7_200_000});
            let (status, _) = server.call(reqwest::Method::PUT, &path, Some(body)).await;
            if status == StatusCode::BAD_GATEWAY {
                break;
            }
        }
    }
    acked
}

/// Every acknowledged key is as acknowledged; every other key present is whole.
async fn check_acknowledged(server: &Server, acked: &BTreeMap<String, Acked>) {
    for (key, state) in acked {
        let (status, body) = server
            .call(reqwest::Method::GET, &format!("/v1/keys/{key}"), None)
            .await;
        match state {
            Acked::Alive { service, meta } => {
                assert_eq!(status, StatusCode::OK, "{key} was acknowledged and is lost");
                assert_eq!(&body["service"], service, "{key}");
                assert_eq!(&body["meta"], meta, "{key}");
                assert!(
                    body["ttl_ms"].as_u64().is_some_and(|ttl| ttl >= 3_600_000),
                    "{body}"
                );
            }
            Acked::Deleted => assert_eq!(status, StatusCode::NOT_FOUND, "{key} was deleted"),
            Acked::Uncertain | Acked::Short => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_under_load_loses_nothing_acknowledged_with_fsync_always() {
    let dir = temp_data_dir("kill9");
    let mut acked: BTreeMap<String, Acked> = BTreeMap::new();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for round in 0..4 {
        let server = Arc::new(Server::start(&dir, &["--fsync", "always"]));
        server.ready().await;
        // What earlier rounds acknowledged survived this restart, and the one before.
        check_acknowledged(&server, &acked).await;
        let clients: Vec<_> = (0..4)
            .map(|client| tokio::spawn(mixed_load(Arc::clone(&server), client, round, None)))
            .collect();
        // Killed at a different moment each round, mid-load.
        tokio::time::sleep(Duration::from_millis(150 + 130 * round as u64)).await;
        server.signal("-KILL");
        for client in clients {
            let round_acked = client.await.unwrap();
            seen.extend(round_acked.keys().cloned());
            acked.extend(round_acked);
        }
        drop(server);
    }
    let server = Server::start(&dir, &["--fsync", "always"]);
    server.ready().await;
    check_acknowledged(&server, &acked).await;
    let alive = acked
        .values()
        .filter(|state| matches!(state, Acked::Alive { .. }))
        .count();
    assert!(alive > 50, "the load acknowledged only {alive} creations");
    // Short-lived keys all expired: before a kill, or within their TTL of a restart.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let short: Vec<&String> = acked
        .iter()
        .filter(|(_, state)| **state == Acked::Short)
        .map(|(key, _)| key)
        .collect();
    assert!(short.len() > 5, "{} short-lived keys", short.len());
    for key in short {
        let path = format!("/v1/keys/{key}");
        assert_eq!(
            server.call(reqwest::Method::GET, &path, None).await.0,
            StatusCode::NOT_FOUND,
            "{key}"
        );
    }
    // Nothing is half there: every key listed is whole (a service and its metadata).
    let (_, listed) = server
        .call(reqwest::Method::GET, "/v1/keys?limit=1000", None)
        .await;
    for key in listed["keys"].as_array().unwrap() {
        assert!(
            key["service"].is_string() && key["meta"].is_object(),
            "{key}"
        );
    }
}

/// With `--fsync interval`, what a crash may lose is the last interval: everything acknowledged
/// longer ago than that is there after a `kill -9`, and the state is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_with_fsync_interval_loses_at_most_the_last_interval() {
    let dir = temp_data_dir("interval");
    let mut acked: BTreeMap<String, Acked> = BTreeMap::new();
    for round in 0..2 {
        let server = Arc::new(Server::start(
            &dir,
            &["--fsync", "interval", "--fsync-interval", "100ms"],
        ));
        server.ready().await;
        check_acknowledged(&server, &acked).await;
        let until = tokio::time::Instant::now() + Duration::from_millis(300);
        let clients: Vec<_> = (0..4)
            .map(|client| tokio::spawn(mixed_load(Arc::clone(&server), client, round, Some(until))))
            .collect();
        for client in clients {
            acked.extend(client.await.unwrap());
        }
        // Everything was acknowledged more than an interval before the kill.
        tokio::time::sleep(Duration::from_millis(300)).await;
        server.signal("-KILL");
    }
    let server = Server::start(&dir, &[]);
    server.ready().await;
    check_acknowledged(&server, &acked).await;
    assert!(acked.len() > 20, "{} keys", acked.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_tail_recovers_up_to_the_last_whole_record_and_says_so() {
    let dir = temp_data_dir("torn");
    let server = Server::start(&dir, &["--fsync", "always"]);
    server.ready().await;
    for n in 0..20 {
        let body = json!({"key": format!("t{n}"), "ttl_s": 3600});
        assert_eq!(
            server
                .call(reqwest::Method::POST, "/v1/heartbeats", Some(body))
                .await
                .0,
            200
        );
    }
    server.signal("-KILL");
    server.wait();
    // The crash tore the last record: cut its last 5 bytes.
    let segment = newest(&dir, "log-");
    let bytes = std::fs::read(&segment).unwrap();
    std::fs::write(&segment, &bytes[..bytes.len() - 5]).unwrap();
    let server = Server::start(&dir, &[]);
    server.ready().await;
    for n in 0..19 {
        let path = format!("/v1/keys/t{n}");
        assert_eq!(
            server.call(reqwest::Method::GET, &path, None).await.0,
            200,
            "t{n}"
        );
    }
    assert_eq!(
        server
            .call(reqwest::Method::GET, "/v1/keys/t19", None)
            .await
            .0,
        404
    );
    let log = server.log();
    assert!(
        log.iter()
            .any(|line| line.contains("torn record") && line.contains("dropped=")),
        "{log:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_record_in_the_middle_refuses_to_start_naming_the_file_and_offset() {
    let dir = temp_data_dir("corrupt");
    let server = Server::start(&dir, &["--fsync", "always"]);
    server.ready().await;
    for n in 0..10 {
        let body = json!({"key": format!("c{n}"), "ttl_s": 3600});
        server
            .call(reqwest::Method::POST, "/v1/heartbeats", Some(body))
            .await;
    }
    server.signal("-KILL");
    server.wait();
    let segment = newest(&dir, "log-");
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[20] ^= 0x55; // inside the first record, which has nine after it
    std::fs::write(&segment, &bytes).unwrap();
    let server = Server::start(&dir, &[]);
    let server_log = Arc::clone(&server.log);
    assert_ne!(server.wait(), Some(0), "started on a corrupted log");
    // The reader thread may still be taking the last lines off the pipe.
    std::thread::sleep(Duration::from_millis(100));
    let log = server_log.lock().unwrap().join("\n");
    assert!(log.contains(&segment.display().to_string()), "{log}");
    assert!(log.contains("corrupted at byte offset 8"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_writes_a_snapshot_so_the_next_start_replays_nothing() {
    let dir = temp_data_dir("snapshot");
    let server = Server::start(&dir, &[]);
    server.ready().await;
    let batch: Vec<Value> = (0..500)
        .map(|n| json!({"key": format!("s{n}"), "service": "api", "ttl_s": 3600}))
        .collect();
    let (status, _) = server
        .call(
            reqwest::Method::POST,
            "/v1/heartbeats/batch?results=errors",
            Some(json!({"heartbeats": batch})),
        )
        .await;
    assert_eq!(status, 200);
    server.signal("-TERM");
    assert_eq!(server.wait(), Some(0));
    let segments: Vec<_> = numbered(&dir, "log-");
    assert_eq!(
        segments.len(),
        1,
        "the snapshot replaced the log: {segments:?}"
    );
    assert_eq!(
        std::fs::metadata(&segments[0]).unwrap().len(),
        8,
        "the new segment is empty"
    );
    let server = Server::start(&dir, &[]);
    server.ready().await;
    let (_, services) = server
        .call(reqwest::Method::GET, "/v1/services", None)
        .await;
    assert_eq!(services["services"][0]["alive"], 500);
    let log = server.log().join("\n");
    assert!(
        log.contains("records=500") && log.contains("snapshot_lsn=501"),
        "{log}"
    );
}

/// Files in `dir` whose names start with `prefix`, sorted.
fn numbered(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with(prefix) && name.ends_with(".ttlw"))
        })
        .collect();
    found.sort();
    found
}

fn newest(dir: &Path, prefix: &str) -> PathBuf {
    numbered(dir, prefix).pop().expect("a file")
}

/// A tmpfs of `size` mounted at a fresh directory, unmounted on drop.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(name: &str, size: &str) -> Self {
        let dir = temp_data_dir(name);
        std::fs::create_dir_all(&dir).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .expect("mount runs");
        assert!(
            mounted.success(),
            "cannot mount a tmpfs (this test needs root)"
        );
        Self(dir)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root to mount a 1 MiB tmpfs: .ci/run runs as root"]
async fn a_full_disk_refuses_changes_keeps_renewals_and_loses_nothing_acknowledged() {
    let disk = SmallDisk::mount("full", "1m");
    let data_dir = disk.0.join("data");
    let server = Server::start(&data_dir, &["--fsync", "always"]);
    server.ready().await;
    let create = |n: usize| {
        let meta = json!({ "pad": "x".repeat(3000), "n": n });
        json!({"key": format!("f{n}"), "service": "api", "meta": meta, "ttl_s": 3600})
    };
    assert_eq!(
        server
            .call(reqwest::Method::POST, "/v1/heartbeats", Some(create(0)))
            .await
            .0,
        200
    );
    // Fill the disk but for a few records' worth.
    let filler = disk.0.join("filler");
    let free = 1024 * 1024 - std::fs::metadata(newest(&data_dir, "log-")).unwrap().len();
    std::fs::write(&filler, vec![0u8; free.saturating_sub(16 * 1024) as usize]).ok();
    let mut acknowledged = vec![0];
    let mut refused = None;
    for n in 1..200 {
        let (status, body) = server
            .call(reqwest::Method::POST, "/v1/heartbeats", Some(create(n)))
            .await;
        match status {
            StatusCode::OK => acknowledged.push(n),
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!(crate::server::code(&body), "storage_unavailable", "{body}");
                refused = Some(n);
                break;
            }
            other => panic!("{other}: {body}"),
        }
    }
    assert!(refused.is_some(), "a full disk refuses changes");
    // While full: a renewal that changes nothing durable still works; a creation does not.
    let renewal = json!({"key": "f0", "ttl_s": 3600});
    assert_eq!(
        server
            .call(reqwest::Method::POST, "/v1/heartbeats", Some(renewal))
            .await
            .0,
        200
    );
    let (status, body) = server
        .call(reqwest::Method::POST, "/v1/heartbeats", Some(create(500)))
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    // Space returns: changes resume.
    std::fs::remove_file(&filler).unwrap();
    let mut resumed = false;
    for _ in 0..100 {
        let (status, _) = server
            .call(reqwest::Method::POST, "/v1/heartbeats", Some(create(600)))
            .await;
        if status == StatusCode::OK {
            acknowledged.push(600);
            resumed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(resumed, "writes did not resume once space returned");
    server.signal("-KILL");
    server.wait();
    let server = Server::start(&data_dir, &[]);
    server.ready().await;
    for n in acknowledged {
        let path = format!("/v1/keys/f{n}");
        assert_eq!(
            server.call(reqwest::Method::GET, &path, None).await.0,
            200,
            "f{n} was acknowledged"
        );
    }
    assert!(server.log().iter().all(|line| !line.contains("corrupted")));
}

/// What must not be lost: an expiry that was not delivered yet when the server was killed is
/// delivered after the restart with the same `webhook-id`; a dead letter is still listed and
/// can be re-sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_events_and_dead_letters_survive_a_kill_and_keep_their_ids() {
    use crate::receiver::{always, Receiver};
    let receiver = Receiver::start(always(StatusCode::SERVICE_UNAVAILABLE)).await;
    let dir = temp_data_dir("webhooks");
    let url = receiver.url().to_string();
    let args = [
        "--fsync",
        "always",
        "--webhook-url",
        url.as_str(),
        "--webhook-retry-schedule",
        "20ms",
        "--webhook-max-attempts",
        "100",
    ];
    let server = Server::start(&dir, &args);
    server.ready().await;
    for n in 0..10 {
        let body = json!({"key": format!("w{n}"), "ttl_ms": 50});
        server
            .call(reqwest::Method::POST, "/v1/heartbeats", Some(body))
            .await;
    }
    // Every expiry was tried at least once (so it is queued), none delivered.
    receiver
        .wait_until(Duration::from_secs(30), |requests| {
            requests
                .iter()
                .map(|r| r.key().to_owned())
                .collect::<BTreeSet<_>>()
                .len()
                == 10
        })
        .await;
    let tried: BTreeMap<String, String> = receiver
        .unique()
        .into_values()
        .map(|request| (request.key().to_owned(), request.id().to_owned()))
        .collect();
    server.signal("-KILL");
    server.wait();
    receiver.answer_with(always(StatusCode::OK));
    let before_restart = receiver.requests().len();
    let server = Server::start(&dir, &args);
    server.ready().await;
    receiver
        .wait_until(Duration::from_secs(30), |requests| {
            let delivered: BTreeSet<&str> =
                requests[before_restart..].iter().map(|r| r.key()).collect();
            delivered.len() == 10
        })
        .await;
    for request in &receiver.requests()[before_restart..] {
        assert_eq!(
            tried[request.key()],
            request.id(),
            "the webhook-id changed across the restart"
        );
    }
    // A clean stop, so that no delivery of this phase is repeated in the next (a kill may
    // repeat some: at least once).
    server.signal("-TERM");
    assert_eq!(server.wait(), Some(0));

    // A dead letter: one attempt only, against a receiver that refuses.
    receiver.answer_with(always(StatusCode::BAD_REQUEST));
    let args_one = ["--webhook-url", url.as_str(), "--webhook-max-attempts", "1"];
    let server = Server::start(&dir, &args_one);
    server.ready().await;
    let body = json!({"key": "letter", "ttl_ms": 50});
    server
        .call(reqwest::Method::POST, "/v1/heartbeats", Some(body))
        .await;
    let mut letters = Value::Null;
    for _ in 0..300 {
        letters = server
            .call(reqwest::Method::GET, "/v1/webhooks/dead-letters", None)
            .await
            .1;
        if letters["count"] == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(letters["count"], 1, "{letters}");
    let event_id = letters["dead_letters"][0]["event_id"].clone();
    server.signal("-TERM");
    assert_eq!(server.wait(), Some(0));
    receiver.answer_with(always(StatusCode::OK));
    let before_retry = receiver.requests().len();
    let server = Server::start(&dir, &args_one);
    server.ready().await;
    let letters = server
        .call(reqwest::Method::GET, "/v1/webhooks/dead-letters", None)
        .await
        .1;
    assert_eq!(letters["count"], 1, "the dead letter survived: {letters}");
    assert_eq!(letters["dead_letters"][0]["event_id"], event_id);
    let retry = format!(
        "/v1/webhooks/dead-letters/{}/retry",
        letters["dead_letters"][0]["id"]
    );
    assert_eq!(
        server.call(reqwest::Method::POST, &retry, None).await.0,
        StatusCode::ACCEPTED
    );
    receiver
        .wait_until(Duration::from_secs(30), |requests| {
            requests[before_retry..].iter().any(|r| r.key() == "letter")
        })
        .await;
    let resent = receiver
        .requests()
        .into_iter()
        .rfind(|r| r.key() == "letter")
        .unwrap();
    assert_eq!(json!(resent.id()), event_id, "re-sent with the same id");
}
