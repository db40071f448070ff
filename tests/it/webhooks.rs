//! Webhook delivery end to end: a real ttlwheel server and real receivers on 127.0.0.1:0.
//!
//! These run on real time (a server and its HTTP client cannot share a paused clock), with retry
//! schedules in milliseconds; the schedule arithmetic itself is tested with pure functions in
//! `notify::backoff` and the ordering rules in `notify::outbox`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use ttlwheel::config::{Config, WebhookEvent};

use crate::receiver::{always, Receiver};
use crate::server::TestServer;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const PATIENCE: Duration = Duration::from_secs(30);

/// A config that delivers to `receiver`, signed, retrying quickly.
fn config_for(receiver: &Receiver) -> Config {
    let mut config = Config::ephemeral();
    // These tests expire many keys at once on purpose; the guard (tested in `guard.rs`) would
    // hold them.
    config.expiry_guard = ttlwheel::config::Switch::Off;
    config.webhook_urls = vec![receiver.url()];
    config.webhook_secret = Some(SECRET.parse().expect("secret"));
    config.webhook_retry_schedule = vec![Duration::from_millis(20), Duration::from_millis(50)];
    config.webhook_timeout = Duration::from_secs(5);
    config.webhook_drain_timeout = Duration::from_secs(2);
    config
}

async fn heartbeat(server: &TestServer, key: &str, ttl_ms: u64) -> Value {
    let (status, body) = server
        .post("/v1/heartbeats", json!({"key": key, "ttl_ms": ttl_ms}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

async fn webhook_status(server: &TestServer) -> Value {
    let (status, body) = server.get("/v1/webhooks").await;
    assert_eq!(status, StatusCode::OK);
    body["webhooks"][0].clone()
}

/// Polls `GET /v1/webhooks` until `done` holds for the first URL's entry.
async fn wait_for_status(server: &TestServer, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let status = webhook_status(server).await;
        if done(&status) {
            return status;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "webhook status never got there: {status}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn an_expired_key_is_posted_once_signed_and_the_signature_verifies() {
    let receiver = Receiver::start(always(StatusCode::OK)).await;
    let server = TestServer::with_config(config_for(&receiver)).await;
    let (status, _) = server
        .post(
            "/v1/heartbeats",
            json!({"key": "pay-1", "service": "payments", "meta": {"zone": "a"}, "ttl_ms": 150}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    receiver
        .wait_until(PATIENCE, |requests| !requests.is_empty())
        .await;
    // Time for a duplicate to show up, if there were one.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let requests = receiver.requests();
    assert_eq!(requests.len(), 1, "exactly one POST: {requests:?}");
    let request = &requests[0];

    assert_eq!(request.headers["content-type"], "application/json");
    assert!(request.id().starts_with("msg_"));
    let verifier = standardwebhooks::Webhook::new(SECRET).expect("secret");
    verifier
        .verify(&request.body, &request.headers)
        .expect("the signature verifies with the Standard Webhooks implementation");
    let mut tampered = request.body.to_vec();
    tampered[10] ^= 1;
    assert!(
        verifier.verify(&tampered, &request.headers).is_err(),
        "verification has teeth"
    );

    let body = &request.json;
    assert_eq!(body["type"], "key.expired");
    let data = &body["data"];
    assert_eq!(data["key"], "pay-1");
    assert_eq!(data["service"], "payments");
    assert_eq!(data["meta"], json!({"zone": "a"}));
    assert_eq!(data["ttl_ms"], 150);
    assert_eq!(body["timestamp"], data["occurred_at"]);
    for field in [
        "registered_at",
        "last_heartbeat_at",
        "deadline",
        "occurred_at",
    ] {
        let text = data[field].as_str().expect(field);
        humantime::parse_rfc3339(text).unwrap_or_else(|_| panic!("{field}: {text}"));
    }
    assert!(data["lateness_ms"].as_u64().is_some());
    assert_eq!(
        data["restored"], false,
        "a key that was not restored from disk"
    );
    assert_eq!(
        data.as_object().unwrap().len(),
        10,
        "exactly the documented fields: {data}"
    );

    let status = webhook_status(&server).await;
    assert_eq!(status["delivered"], 1);
    assert_eq!(status["pending"], 0);
    assert_eq!(status["state"], "active");
    server.shutdown().await.expect("clean shutdown");
}

#[test]
fn our_signature_matches_the_reference_implementation_on_the_spec_vector() {
    let ours: ttlwheel::notify::signing::WebhookSecret = SECRET.parse().unwrap();
    let reference = standardwebhooks::Webhook::new(SECRET).unwrap();
    let (id, timestamp, payload) = (
        "msg_p5jXN8AQM9LWM0D4loKWxJek",
        1_614_265_330,
        br#"{"test": 2432232314}"#,
    );
    let expected = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
    assert_eq!(ours.sign(id, timestamp, payload), expected);
    assert_eq!(reference.sign(id, timestamp, payload).unwrap(), expected);
}

#[tokio::test]
async fn a_failing_receiver_gets_retries_with_the_same_id_until_it_recovers() {
    let receiver = Receiver::start(Arc::new(|_, before| {
        let status = if before < 2 {
            StatusCode::INTERNAL_SERVER_ERROR
        } else {
            StatusCode::OK
        };
        (status, Vec::new())
    }))
    .await;
    let server = TestServer::with_config(config_for(&receiver)).await;
    heartbeat(&server, "flaky", 50).await;
    let status = wait_for_status(&server, |s| s["delivered"] == 1).await;
    let requests = receiver.requests();
    assert_eq!(requests.len(), 3, "two failures, then the delivery");
    assert!(requests.iter().all(|r| r.id() == requests[0].id()));
    assert!(requests.iter().all(|r| r.body == requests[0].body));
    assert_eq!(status["failed_attempts"], 2);
    assert_eq!(status["failed"], 0);
    assert_eq!(status["pending"], 0);
    let last_error = &status["last_error"];
    assert!(
        last_error["message"].as_str().unwrap().contains("500"),
        "{status}"
    );
    assert_eq!(last_error["event_id"], requests[0].id());

    let metrics = crate::stream::metrics_of(&server).await;
    let url = receiver.url().to_string();
    let value =
        |name: &str, labels: &[(&str, &str)]| crate::exposition::value(&metrics, name, labels);
    let delivered = [("url", url.as_str()), ("outcome", "delivered")];
    assert_eq!(value("ttlwheel_webhook_deliveries_total", &delivered), 1.0);
    let failed = [("url", url.as_str()), ("outcome", "failed")];
    assert_eq!(value("ttlwheel_webhook_deliveries_total", &failed), 0.0);
    let by_url = [("url", url.as_str())];
    assert_eq!(
        value("ttlwheel_webhook_failed_attempts_total", &by_url),
        2.0
    );
    assert_eq!(value("ttlwheel_webhook_queue_depth", &by_url), 0.0);
    assert_eq!(
        value("ttlwheel_webhook_oldest_pending_seconds", &by_url),
        0.0
    );
}

#[tokio::test]
async fn retry_after_on_429_sets_the_wait() {
    let receiver = Receiver::start(Arc::new(|_, before| {
        if before == 0 {
            (
                StatusCode::TOO_MANY_REQUESTS,
                vec![("retry-after", "1".to_owned())],
            )
        } else {
            (StatusCode::OK, Vec::new())
        }
    }))
    .await;
    let server = TestServer::with_config(config_for(&receiver)).await;
    heartbeat(&server, "throttled", 50).await;
    wait_for_status(&server, |s| s["delivered"] == 1).await;
    let requests = receiver.requests();
    assert_eq!(requests.len(), 2);
    let waited = requests[1].arrived - requests[0].arrived;
    // The schedule alone would have retried after ~20 ms.
    assert!(
        waited >= Duration::from_millis(900),
        "retried after {waited:?}"
    );
}

#[tokio::test]
async fn every_event_arrives_after_the_receiver_was_down_and_heartbeats_stay_fast() {
    const KEYS: usize = 10_000;
    let mut receiver = Receiver::start(always(StatusCode::OK)).await;
    receiver.stop().await;
    let mut config = config_for(&receiver);
    config.webhook_max_attempts = 100;
    config.webhook_retry_schedule = vec![Duration::from_millis(100), Duration::from_millis(300)];
    let server = TestServer::with_config(config).await;

    let baseline = heartbeat_latencies(&server, "steady-a", 200).await;
    for chunk in 0..KEYS / 1000 {
        let items: Vec<Value> = (0..1000)
            .map(|i| json!({"key": format!("down-{}", chunk * 1000 + i), "ttl_ms": 1000}))
            .collect();
        let (status, body) = server
            .post("/v1/heartbeats/batch", json!({ "heartbeats": items }))
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let status = wait_for_status(&server, |s| s["pending"] == KEYS && s["state"] == "paused").await;
    assert_eq!(status["delivered"], 0);
    // Paused, the URL is probed one attempt at a time instead of every event being retried.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let status = webhook_status(&server).await;
    let failed_attempts = status["failed_attempts"].as_u64().unwrap();
    assert!(
        (3..100).contains(&failed_attempts),
        "{failed_attempts} failed attempts: the URL was not paused"
    );
    assert!(
        status["last_error"]["message"]
            .as_str()
            .unwrap()
            .contains("connection"),
        "{status}"
    );
    // The receiver is down with 10,000 events held and retrying: heartbeats still flow, and the
    // ticker keeps time.
    let during = heartbeat_latencies(&server, "steady-b", 200).await;
    let (health, body) = server.get("/healthz").await;
    assert_eq!(health, StatusCode::OK, "{body}");
    let (base_p50, during_p50) = (median(&baseline), median(&during));
    eprintln!("heartbeat p50: {base_p50:?} before, {during_p50:?} with the receiver down");
    assert!(
        during_p50 <= (base_p50 * 5).max(Duration::from_millis(10)),
        "heartbeats slowed from {base_p50:?} to {during_p50:?}"
    );

    receiver.restart().await;
    receiver
        .wait_until(PATIENCE * 2, |requests| {
            requests.len() >= KEYS && unique_ids(requests) >= KEYS
        })
        .await;
    let unique = receiver.unique();
    assert_eq!(unique.len(), KEYS);
    let mut per_key: HashMap<String, usize> = HashMap::new();
    for request in unique.values() {
        assert_eq!(request.json["type"], "key.expired");
        *per_key.entry(request.key().to_owned()).or_default() += 1;
    }
    assert_eq!(per_key.len(), KEYS, "every key's expiry arrived");
    assert!(per_key.values().all(|&n| n == 1), "one event per key");
    let status = wait_for_status(&server, |s| s["delivered"] == KEYS).await;
    assert_eq!(status["pending"], 0);
    assert_eq!(status["dropped"], json!({"queue_full": 0, "gone": 0}));
}

fn unique_ids(requests: &[crate::receiver::Received]) -> usize {
    requests
        .iter()
        .map(|r| r.id())
        .collect::<std::collections::HashSet<_>>()
        .len()
}

async fn heartbeat_latencies(server: &TestServer, key: &str, n: usize) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(n);
    for _ in 0..n {
        let started = std::time::Instant::now();
        heartbeat(server, key, 60_000).await;
        latencies.push(started.elapsed());
    }
    latencies
}

fn median(latencies: &[Duration]) -> Duration {
    let mut sorted = latencies.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}

#[tokio::test]
async fn past_the_queue_bound_events_are_counted_not_lost_silently() {
    let mut receiver = Receiver::start(always(StatusCode::OK)).await;
    receiver.stop().await;
    let mut config = config_for(&receiver);
    config.webhook_queue_max = 100;
    config.webhook_max_attempts = 100;
    let server = TestServer::with_config(config).await;
    let items: Vec<Value> = (0..300)
        .map(|i| json!({"key": format!("over-{i}"), "ttl_ms": 50}))
        .collect();
    server
        .post("/v1/heartbeats/batch", json!({ "heartbeats": items }))
        .await;
    let status = wait_for_status(&server, |s| s["dropped"]["queue_full"] == 200).await;
    assert_eq!(status["pending"], 100);
    receiver.restart().await;
    let status = wait_for_status(&server, |s| s["delivered"] == 100).await;
    assert_eq!(status["pending"], 0);
    assert_eq!(status["dropped"]["queue_full"], 200);
    assert_eq!(receiver.unique().len(), 100);
}

#[tokio::test]
async fn gone_stops_delivery_to_the_url() {
    let receiver = Receiver::start(always(StatusCode::GONE)).await;
    let server = TestServer::with_config(config_for(&receiver)).await;
    heartbeat(&server, "first", 30).await;
    let status = wait_for_status(&server, |s| s["state"] == "gone").await;
    assert_eq!(status["failed"], 1);
    heartbeat(&server, "second", 30).await;
    heartbeat(&server, "third", 30).await;
    let status = wait_for_status(&server, |s| s["dropped"]["gone"] == 2).await;
    assert_eq!(status["pending"], 0);
    assert_eq!(receiver.requests().len(), 1, "nothing sent after 410");
    let (_, letters) = server.get("/v1/webhooks/dead-letters").await;
    assert_eq!(letters["count"], 1);
    let letter = &letters["dead_letters"][0];
    assert_eq!(letter["key"], "first");
    assert!(letter["last_error"].as_str().unwrap().contains("410"));
}

#[tokio::test]
async fn exhausted_retries_become_a_dead_letter_that_the_api_resends() {
    let receiver = Receiver::start(always(StatusCode::BAD_GATEWAY)).await;
    let mut config = config_for(&receiver);
    config.webhook_max_attempts = 3;
    let server = TestServer::with_config(config).await;
    heartbeat(&server, "doomed", 30).await;
    let status = wait_for_status(&server, |s| s["failed"] == 1).await;
    assert_eq!(status["failed_attempts"], 3);
    assert_eq!(status["pending"], 0);
    assert_eq!(receiver.requests().len(), 3);

    let (code, letters) = server.get("/v1/webhooks/dead-letters").await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(
        (letters["count"].as_u64(), letters["dropped"].as_u64()),
        (Some(1), Some(0))
    );
    let letter = letters["dead_letters"][0].clone();
    assert_eq!(letter["event_id"], receiver.requests()[0].id());
    assert_eq!(letter["attempts"], 3);
    assert_eq!(letter["type"], "key.expired");
    assert_eq!(letter["payload"]["data"]["key"], "doomed");
    assert_eq!(letter["url"], receiver.url().as_str());
    assert!(letter["last_error"].as_str().unwrap().contains("502"));

    receiver.answer_with(always(StatusCode::NO_CONTENT));
    let retry_path = format!("/v1/webhooks/dead-letters/{}/retry", letter["id"]);
    let (code, body) = server.post(&retry_path, json!({})).await;
    assert_eq!(code, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["event_id"], letter["event_id"]);
    wait_for_status(&server, |s| s["delivered"] == 1).await;
    let requests = receiver.requests();
    assert_eq!(requests.len(), 4);
    assert_eq!(
        requests[3].id(),
        requests[0].id(),
        "the re-send keeps the id"
    );
    standardwebhooks::Webhook::new(SECRET)
        .unwrap()
        .verify(&requests[3].body, &requests[3].headers)
        .expect("re-signed at send time");

    let (_, letters) = server.get("/v1/webhooks/dead-letters").await;
    assert_eq!(letters["count"], 0);
    let (code, body) = server.post(&retry_path, json!({})).await;
    assert_eq!(
        (code, crate::server::code(&body)),
        (StatusCode::NOT_FOUND, "not_found")
    );
    let (code, _) = server
        .post("/v1/webhooks/dead-letters/not-an-id/retry", json!({}))
        .await;
    assert_eq!(code, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn deleted_events_are_sent_only_when_enabled() {
    for enabled in [false, true] {
        let receiver = Receiver::start(always(StatusCode::OK)).await;
        let mut config = config_for(&receiver);
        if enabled {
            config.webhook_events = vec![WebhookEvent::Expired, WebhookEvent::Deleted];
        }
        let server = TestServer::with_config(config).await;
        heartbeat(&server, "removed", 60_000).await;
        let (code, _) = server
            .call(reqwest::Method::DELETE, "/v1/keys/removed", None)
            .await;
        assert_eq!(code, StatusCode::NO_CONTENT);
        // An expiry after the deletion: once it has arrived, a deletion event would have too.
        heartbeat(&server, "lapsed", 30).await;
        receiver
            .wait_until(PATIENCE, |requests| {
                requests.iter().any(|r| r.json["type"] == "key.expired")
            })
            .await;
        let types: Vec<Value> = receiver
            .requests()
            .iter()
            .map(|r| r.json["type"].clone())
            .collect();
        if enabled {
            assert_eq!(types, [json!("key.deleted"), json!("key.expired")]);
            assert_eq!(receiver.requests()[0].json["data"]["key"], "removed");
        } else {
            assert_eq!(types, [json!("key.expired")]);
        }
    }
}

#[tokio::test]
async fn a_heartbeat_racing_an_expiry_never_yields_an_event_for_a_live_key() {
    const KEYS: usize = 40;
    let receiver = Receiver::start(always(StatusCode::OK)).await;
    let server = Arc::new(TestServer::with_config(config_for(&receiver)).await);
    // Each key is renewed around its 100 ms deadline, sometimes just before, sometimes after.
    let mut racers = Vec::new();
    for k in 0..KEYS {
        let server = Arc::clone(&server);
        racers.push(tokio::spawn(async move {
            let key = format!("racer-{k}");
            let mut created = 0;
            for round in 0..20u64 {
                if heartbeat(&server, &key, 100).await["created"] == true {
                    created += 1;
                }
                let gap = 85 + (round * 7 + k as u64 * 3) % 30;
                tokio::time::sleep(Duration::from_millis(gap)).await;
            }
            (key, created)
        }));
    }
    let mut registrations: BTreeMap<String, usize> = BTreeMap::new();
    for racer in racers {
        let (key, created) = racer.await.expect("racer");
        registrations.insert(key, created);
    }
    // Every registration ends in exactly one expiry, the last one included.
    let total: usize = registrations.values().sum();
    receiver
        .wait_until(PATIENCE, |requests| unique_ids(requests) >= total)
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut expiries: BTreeMap<String, usize> = BTreeMap::new();
    for request in receiver.unique().values() {
        *expiries.entry(request.key().to_owned()).or_default() += 1;
    }
    assert_eq!(
        expiries, registrations,
        "expiries per key must equal registrations per key"
    );
    assert!(
        total > KEYS,
        "some heartbeats must have lost the race ({total} registrations)"
    );
}

#[tokio::test]
async fn shutdown_delivers_what_is_held_within_the_drain_timeout() {
    let receiver = Receiver::start(always(StatusCode::OK)).await;
    let server = TestServer::with_config(config_for(&receiver)).await;
    let items: Vec<Value> = (0..200)
        .map(|i| json!({"key": format!("late-{i}"), "ttl_ms": 1}))
        .collect();
    server
        .post("/v1/heartbeats/batch", json!({ "heartbeats": items }))
        .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.shutdown().await.expect("clean shutdown");
    assert_eq!(
        receiver.unique().len(),
        200,
        "held events were delivered before exit"
    );

    // A receiver that never answers in time: shutdown still ends, after the drain timeout.
    let mut down = Receiver::start(always(StatusCode::OK)).await;
    down.stop().await;
    let mut config = config_for(&down);
    config.webhook_drain_timeout = Duration::from_millis(300);
    let server = TestServer::with_config(config).await;
    heartbeat(&server, "stranded", 1).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    tokio::time::timeout(Duration::from_secs(10), server.shutdown())
        .await
        .expect("shutdown is bounded")
        .expect("clean shutdown");
}

/// The Python verifier shown in the README accepts a real delivery and refuses a tampered one,
/// so the example cannot rot.
#[tokio::test]
#[ignore = "needs python3: .ci/run installs it"]
async fn the_readme_python_verifier_accepts_a_real_delivery() {
    crate::tools::require(&[crate::tools::Tool::Python]);
    let readme = include_str!("../../README.md");
    let snippet = readme
        .split("```python\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a python block in the README");
    let receiver = Receiver::start(always(StatusCode::OK)).await;
    let server = TestServer::with_config(config_for(&receiver)).await;
    heartbeat(&server, "verified", 20).await;
    receiver
        .wait_until(PATIENCE, |requests| !requests.is_empty())
        .await;
    let request = receiver.requests().remove(0);
    let program = format!(
        "{snippet}\nimport json, sys\nd = sys.argv[1]\nh = json.load(open(d + '/headers.json'))\n\
         b = open(d + '/body', 'rb').read()\nprint(verify({SECRET:?}, h, b), verify({SECRET:?}, h, b + b' '))\n"
    );
    let output = run_python_on(&request, &program);
    assert_eq!(output, "True False");
}

/// Runs `program` with python3, given a directory (its `sys.argv[1]`) holding the request's
/// `body` and its Standard Webhooks headers as `headers.json`; returns its trimmed output and
/// fails the test if it fails.
pub fn run_python_on(request: &crate::receiver::Received, program: &str) -> String {
    let headers: serde_json::Map<String, Value> =
        ["webhook-id", "webhook-timestamp", "webhook-signature"]
            .iter()
            .map(|name| {
                (
                    name.to_string(),
                    json!(request.headers[*name].to_str().unwrap()),
                )
            })
            .collect();
    let dir = std::env::temp_dir().join(format!(
        "ttlwheel-python-{}-{}",
        std::process::id(),
        request.id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("body"), &request.body).unwrap();
    std::fs::write(dir.join("headers.json"), Value::Object(headers).to_string()).unwrap();
    let output = std::process::Command::new(crate::tools::python())
        .arg("-c")
        .arg(program)
        .arg(&dir)
        .output()
        .expect("python3 runs");
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}
