//! TTL changes through the Raft log (issue 28, section 2), against real members: EXPIRE and
//! PERSIST sent to a follower are served by the leader, committed on a quorum and applied on
//! every member alike; a fenced leader refuses them. Each test states what must not be lost.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::task::JoinHandle;

use super::harness::{Cluster, WAIT};

/// Past its deadline, a key expired through the log is gone from every member within this
/// (the leader's sweeper wakes at least every 100 ms; the rest is a commit and an apply, with
/// a wide margin for a loaded two-core machine).
const EXPIRY_GRACE: Duration = Duration::from_secs(10);

/// Registers `key` for `ttl_s` through member `via`; panics unless it is created.
async fn register(cluster: &Cluster, via: u64, key: &str, ttl_s: u64) {
    let body = json!({ "key": key, "ttl_s": ttl_s, "service": "ttl" });
    let (status, body, _) = answer(cluster, via, Method::POST, "/v1/heartbeats", Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{key}: {body}\n{}", cluster.logs());
    assert_eq!(body["created"], true, "{key}: {body}");
}

/// [`Cluster::call`], which must be answered.
async fn answer(
    cluster: &Cluster,
    id: u64,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value, Option<String>) {
    let what = format!("{method} {path} on member {id}");
    match cluster.call(id, method, path, body).await {
        Some(answer) => answer,
        None => panic!("no answer to {what}\n{}", cluster.logs()),
    }
}

/// What member `id` has applied of `key`: its view (`None`: it has no such key).
async fn stale_view(cluster: &Cluster, id: u64, key: &str) -> Option<Value> {
    let path = format!("/v1/keys/{key}?consistency=stale");
    let (status, body, _) = answer(cluster, id, Method::GET, &path, None).await;
    match status {
        StatusCode::OK => Some(body),
        StatusCode::NOT_FOUND => None,
        other => panic!("{path} on member {id}: {other} {body}"),
    }
}

/// Member `id`'s `GET .../ttl` (`stale`: what it has applied; else the leader's): the TTL
/// in ms (-1: none), or `None` for a missing key.
async fn ttl(cluster: &Cluster, id: u64, key: &str, stale: bool) -> Option<i64> {
    let query = if stale { "?consistency=stale" } else { "" };
    let path = format!("/v1/keys/{key}/ttl{query}");
    let (status, body, _) = answer(cluster, id, Method::GET, &path, None).await;
    match status {
        StatusCode::OK => Some(body["ttl_ms"].as_i64().expect("ttl_ms")),
        StatusCode::NOT_FOUND => None,
        other => panic!("{path} on member {id}: {other} {body}"),
    }
}

/// Polls member `id`'s view of `key` until `holds`; panics after [`WAIT`].
async fn wait_for_view(
    cluster: &Cluster,
    id: u64,
    key: &str,
    what: &str,
    holds: impl Fn(Option<&Value>) -> bool,
) {
    let started = Instant::now();
    loop {
        let view = stale_view(cluster, id, key).await;
        if holds(view.as_ref()) {
            return;
        }
        assert!(
            started.elapsed() < WAIT,
            "member {id}: {key} never {what}; it has {view:?}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A member that is not `leader`.
fn follower_of(cluster: &Cluster, leader: u64) -> u64 {
    let running = cluster.running();
    running
        .into_iter()
        .find(|&id| id != leader)
        .expect("a follower")
}

/// One event of a member's live stream, stamped when the test read it.
#[derive(Clone, Debug)]
struct Seen {
    at: Instant,
    event: String,
    key: String,
}

/// A member's `/v1/events`, read by a task of its own into `seen` until dropped.
struct Stream {
    seen: Arc<Mutex<Vec<Seen>>>,
    reader: JoinHandle<()>,
}

impl Stream {
    async fn open(cluster: &Cluster, id: u64) -> Self {
        let response = cluster
            .client
            .get(format!("{}/v1/events", cluster.base(id)))
            .timeout(Duration::from_secs(3600))
            .send()
            .await
            .expect("the stream opens");
        assert_eq!(response.status(), StatusCode::OK);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let reader = tokio::spawn(read_events(response, Arc::clone(&seen)));
        Self { seen, reader }
    }

    /// The events read so far of `key`.
    fn of(&self, key: &str) -> Vec<Seen> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|seen| seen.key == key)
            .cloned()
            .collect()
    }

    /// Waits until an event `event` of `key` was read; returns it.
    async fn wait_for(&self, event: &str, key: &str) -> Seen {
        let started = Instant::now();
        loop {
            let found = self.of(key).into_iter().find(|seen| seen.event == event);
            if let Some(seen) = found {
                return seen;
            }
            assert!(
                started.elapsed() < WAIT,
                "no `{event}` of {key} in the stream within {WAIT:?}: {:?}",
                self.of(key)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Parses SSE frames (`event:` and `data:` lines, a blank line after each) into `seen`.
async fn read_events(mut response: reqwest::Response, seen: Arc<Mutex<Vec<Seen>>>) {
    let mut pending = String::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        pending.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = pending.find("\n\n") {
            let frame: String = pending.drain(..end + 2).collect();
            let mut event = None;
            let mut data = String::new();
            for line in frame.lines() {
                if let Some(value) = line.strip_prefix("event:") {
                    event = Some(value.trim().to_owned());
                } else if let Some(value) = line.strip_prefix("data:") {
                    data.push_str(value.trim());
                }
            }
            let Some(event) = event else { continue }; // a keep-alive comment
            let data: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
            let key = data["key"].as_str().unwrap_or_default().to_owned();
            let at = Instant::now();
            seen.lock().unwrap().push(Seen { at, event, key });
        }
    }
}

/// Must not happen: the key expiring before the TTL the EXPIRE gave it (counted from when the
/// request was sent), on any member; a member keeping it, or expiring it twice. Must not be
/// lost: the other key, which nothing changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expire_through_a_follower_expires_the_key_once_on_every_member() {
    let cluster = Cluster::start("ttl-expire", 3, &[]).await;
    let leader = cluster.leader().await;
    let via = follower_of(&cluster, leader);
    let mut streams = Vec::new();
    for id in cluster.running() {
        streams.push((id, Stream::open(&cluster, id).await));
    }
    register(&cluster, via, "doomed", 600).await;
    register(&cluster, via, "bystander", 600).await;

    let sent = Instant::now();
    let path = "/v1/keys/doomed/ttl";
    let body = json!({ "ttl_ms": 3000 });
    let (status, body, served_by) = answer(&cluster, via, Method::PUT, path, Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{body}\n{}", cluster.logs());
    assert_eq!(
        body,
        json!({ "applied": true, "deleted": false, "ttl_ms": 3000 })
    );
    assert_eq!(
        served_by,
        Some(cluster.base(leader)),
        "served by the leader"
    );
    // Every member applies the same state: the new TTL, counted from its own apply.
    for id in cluster.running() {
        wait_for_view(&cluster, id, "doomed", "got the TTL 3000", |view| {
            let view = view.expect("the key is there until it expires through the log");
            view["ttl_ms"] == 3000 && view["expires_in_ms"].as_u64() <= Some(3000)
        })
        .await;
        let left = ttl(&cluster, id, "doomed", true).await;
        assert!(
            left.is_some_and(|ms| (0..=3000).contains(&ms)),
            "{id}: {left:?}"
        );
    }
    // A single node's answers: a missing key, a failed condition.
    let nobody = json!({ "ttl_ms": 3000 });
    let path_nobody = "/v1/keys/nobody/ttl";
    let (status, _, _) = answer(&cluster, via, Method::PUT, path_nobody, Some(nobody)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let nx = json!({ "ttl_ms": 1, "condition": "nx" });
    let (status, body, _) = answer(&cluster, via, Method::PUT, path, Some(nx)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["applied"], false, "{body}");
    assert!(
        body["ttl_ms"]
            .as_i64()
            .is_some_and(|ms| (0..=3000).contains(&ms)),
        "{body}"
    );

    for (id, stream) in &streams {
        let expired = stream.wait_for("expired", "doomed").await;
        let after = expired.at.duration_since(sent);
        assert!(
            after >= Duration::from_millis(3000),
            "member {id} expired the key {after:?} after the EXPIRE was sent, before its TTL"
        );
        assert!(
            after <= Duration::from_millis(3000) + EXPIRY_GRACE,
            "member {id} expired the key only {after:?} after the EXPIRE"
        );
    }
    for id in cluster.running() {
        cluster.wait_for_keys(id, &["bystander".to_owned()]).await;
    }
    // A delete after it is a marker: once each stream has it, the expiry came exactly once.
    let (status, _, _) = answer(&cluster, via, Method::DELETE, "/v1/keys/bystander", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    for (id, stream) in &streams {
        stream.wait_for("deleted", "bystander").await;
        let events: Vec<String> = stream.of("doomed").into_iter().map(|s| s.event).collect();
        assert_eq!(events, ["registered", "expired"], "member {id}");
    }
}

/// Must not be lost: a PERSIST acknowledged through a follower, on every member, past the
/// key's old TTL and after the leader's `kill -9` (the new leader's promotion gives it no
/// deadline), and on the killed member once it is back. The keys beside it that kept their
/// TTL must still expire (the check that time and expiry did run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persisted_key_outlives_its_ttl_on_every_member_and_across_a_leader_kill() {
    let mut cluster = Cluster::start("ttl-persist", 3, &[]).await;
    let old = cluster.leader().await;
    let via = follower_of(&cluster, old);
    register(&cluster, via, "kept", 2).await;
    register(&cluster, via, "control", 2).await;
    let path = "/v1/keys/kept/ttl";
    let (status, body, _) = answer(&cluster, via, Method::DELETE, path, None).await;
    assert_eq!(status, StatusCode::OK, "{body}\n{}", cluster.logs());
    assert_eq!(body, json!({ "applied": true }));
    assert_eq!(ttl(&cluster, via, "kept", false).await, Some(-1));
    let (status, body, _) = answer(&cluster, via, Method::DELETE, path, None).await;
    assert_eq!(
        (status, body),
        (StatusCode::OK, json!({ "applied": false }))
    );
    let (status, _, _) = answer(&cluster, via, Method::DELETE, "/v1/keys/nobody/ttl", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Past the old TTL: the control key expired everywhere, the persisted one nowhere.
    for id in cluster.running() {
        cluster.wait_for_keys(id, &["kept".to_owned()]).await;
        assert_eq!(
            ttl(&cluster, id, "kept", true).await,
            Some(-1),
            "member {id}"
        );
        let view = stale_view(&cluster, id, "kept").await.expect("kept");
        assert_eq!(
            (&view["ttl_ms"], &view["expires_at"]),
            (&Value::Null, &Value::Null),
            "member {id}: {view}"
        );
    }

    // A key with a TTL beside it across the failover: the new leader must expire it.
    register(&cluster, via, "control-2", 2).await;
    cluster.kill(old);
    let new = cluster.leader().await;
    assert_ne!(new, old);
    for id in cluster.running() {
        cluster.wait_for_keys(id, &["kept".to_owned()]).await;
        assert_eq!(
            ttl(&cluster, id, "kept", true).await,
            Some(-1),
            "member {id}"
        );
    }
    assert_eq!(
        ttl(&cluster, via, "kept", false).await,
        Some(-1),
        "the new leader's"
    );
    cluster.restart(old);
    cluster.wait_for_keys(old, &["kept".to_owned()]).await;
    assert_eq!(
        ttl(&cluster, old, "kept", true).await,
        Some(-1),
        "the restarted member"
    );
}

/// Must not happen: a leader cut off from the others acknowledging, or applying, a TTL change
/// it cannot commit. Must not be lost: the TTL change the majority's leader acknowledged
/// meanwhile, on every member once healed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_change_on_an_isolated_leader_is_refused_and_the_majoritys_is_kept() {
    let cluster = Cluster::start("ttl-isolate", 3, &[]).await;
    let old = cluster.leader().await;
    register(&cluster, old, "a", 600).await;
    register(&cluster, old, "b", 600).await;
    cluster.isolate(old);
    // Within its lease (the 640 ms fence) after the last acknowledgment, the leader stops serving.
    let started = Instant::now();
    let path = "/v1/keys/a/ttl";
    loop {
        let body = json!({ "ttl_ms": 1000 });
        let (status, body, _) = answer(&cluster, old, Method::PUT, path, Some(body)).await;
        if status == StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(body["error"]["code"], "no_quorum", "{body}");
            break;
        }
        // Before the fence closed: the change cannot commit, so it is never acknowledged.
        assert_ne!(status, StatusCode::OK, "{body}");
        assert!(started.elapsed() < WAIT, "never refused: {status} {body}");
    }
    let (status, body, _) = answer(&cluster, old, Method::DELETE, path, None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "no_quorum", "{body}");
    let view = stale_view(&cluster, old, "a").await.expect("a");
    assert_eq!(
        view["ttl_ms"], 600_000,
        "the isolated leader changed nothing: {view}"
    );

    let majority: Vec<u64> = cluster
        .running()
        .into_iter()
        .filter(|&id| id != old)
        .collect();
    let new = cluster.leader_among(&majority).await;
    let (status, body, _) = answer(&cluster, new, Method::DELETE, "/v1/keys/b/ttl", None).await;
    assert_eq!((status, body), (StatusCode::OK, json!({ "applied": true })));
    cluster.heal();
    for id in cluster.running() {
        wait_for_view(&cluster, id, "b", "lost its TTL", |view| {
            view.is_some_and(|view| view["ttl_ms"].is_null())
        })
        .await;
        let view = stale_view(&cluster, id, "a").await.expect("a");
        assert_eq!(view["ttl_ms"], 600_000, "member {id}: {view}");
    }
}
