//! Batched webhooks (`--webhook-batch-max` above 1) end to end, against real receivers on
//! 127.0.0.1:0: every request verifies with the Standard Webhooks reference implementation,
//! each event arrives at least once under its own id, one key's events arrive in order, a failed
//! batch is retried whole under its `webhook-id`, and shutdown sends what it can and (with a data
//! directory) keeps the rest for the next start.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use ttlwheel::config::{Config, WebhookEvent};

use crate::process::{temp_data_dir, Server};
use crate::receiver::{always, Received, Receiver};
use crate::server::TestServer;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const PATIENCE: Duration = Duration::from_secs(30);

fn batched_config(receiver: &Receiver, batch_max: u16) -> Config {
    let mut config = Config::ephemeral();
    config.expiry_guard = ttlwheel::config::Switch::Off;
    config.webhook_urls = vec![receiver.url()];
    config.webhook_secret = Some(SECRET.parse().expect("secret"));
    config.webhook_retry_schedule = vec![Duration::from_millis(20), Duration::from_millis(50)];
    config.webhook_timeout = Duration::from_secs(5);
    config.webhook_drain_timeout = Duration::from_secs(2);
    config.webhook_batch_max = batch_max;
    config
}

/// One event inside a batch: `(id, type, key)`.
fn events_of(request: &Received) -> Vec<(String, String, String)> {
    assert_eq!(request.json["type"], "batch", "{}", request.json);
    request.json["data"]["events"]
        .as_array()
        .expect("data.events")
        .iter()
        .map(|event| {
            (
                event["id"].as_str().expect("id").to_owned(),
                event["type"].as_str().expect("type").to_owned(),
                event["data"]["key"].as_str().expect("key").to_owned(),
            )
        })
        .collect()
}

async fn post_batch(server: &TestServer, keys: &[String], ttl_ms: u64) {
    let items: Vec<Value> = keys
        .iter()
        .map(|key| json!({"key": key, "ttl_ms": ttl_ms}))
        .collect();
    let (status, body) = server
        .post("/v1/heartbeats/batch", json!({ "heartbeats": items }))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// 60 keys are deleted and then expire (two events each) while the receiver fails its first
/// requests: every request is signed and verifies, holds at most `batch_max` events of distinct
/// keys, and each key's deletion reaches the receiver before its expiry, retries included.
#[tokio::test]
async fn batches_verify_hold_distinct_keys_and_keep_each_keys_order() {
    const KEYS: usize = 60;
    const BATCH_MAX: u16 = 16;
    let failures_left = Arc::new(AtomicUsize::new(3));
    let receiver = Receiver::start(Arc::new({
        let failures_left = Arc::clone(&failures_left);
        move |_, _| {
            let failing = failures_left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            let status = if failing {
                StatusCode::INTERNAL_SERVER_ERROR
            } else {
                StatusCode::OK
            };
            (status, Vec::new())
        }
    }))
    .await;
    let mut config = batched_config(&receiver, BATCH_MAX);
    config.webhook_events = vec![WebhookEvent::Expired, WebhookEvent::Deleted];
    let server = TestServer::with_config(config).await;
    let keys: Vec<String> = (0..KEYS).map(|i| format!("svc-{i:02}")).collect();
    post_batch(&server, &keys, 60_000).await;
    for key in &keys {
        let (code, _) = server
            .call(reqwest::Method::DELETE, &format!("/v1/keys/{key}"), None)
            .await;
        assert_eq!(code, StatusCode::NO_CONTENT);
    }
    post_batch(&server, &keys, 100).await;
    let delivered_all = |requests: &[Received]| {
        let ok: BTreeSet<String> = requests[3.min(requests.len())..]
            .iter()
            .flat_map(|request| events_of(request).into_iter().map(|(id, _, _)| id))
            .collect();
        ok.len() == 2 * KEYS
    };
    receiver.wait_until(PATIENCE, delivered_all).await;

    let requests = receiver.requests();
    let verifier = standardwebhooks::Webhook::new(SECRET).expect("secret");
    let mut seen_types: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut event_ids: BTreeMap<String, (String, String)> = BTreeMap::new();
    for request in &requests {
        verifier
            .verify(&request.body, &request.headers)
            .expect("every batch verifies with the reference implementation");
        assert!(request.id().starts_with("batch_"), "{}", request.id());
        let events = events_of(request);
        assert!(!events.is_empty() && events.len() <= usize::from(BATCH_MAX));
        let distinct: BTreeSet<&str> = events.iter().map(|(_, _, key)| key.as_str()).collect();
        assert_eq!(distinct.len(), events.len(), "one event per key per batch");
        for (id, kind, key) in events {
            assert!(id.starts_with("msg_"));
            let known = event_ids
                .entry(id.clone())
                .or_insert((kind.clone(), key.clone()));
            assert_eq!(
                known,
                &(kind.clone(), key.clone()),
                "an event id names one event"
            );
            seen_types.entry(key).or_default().push(kind);
        }
    }
    assert_eq!(event_ids.len(), 2 * KEYS, "each event has its own id");
    for (key, kinds) in &seen_types {
        let first_expired = kinds.iter().position(|kind| kind == "key.expired");
        let last_deleted = kinds.iter().rposition(|kind| kind == "key.deleted");
        assert!(
            matches!((last_deleted, first_expired), (Some(d), Some(e)) if d < e),
            "{key}: its deletion (with every retry) comes before its expiry: {kinds:?}"
        );
    }
    assert!(
        requests.len() < 2 * KEYS,
        "batching sent fewer requests ({}) than events",
        requests.len()
    );
    let (_, status) = server.get("/v1/webhooks").await;
    let endpoint = &status["webhooks"][0];
    assert_eq!(status["batch_max"], BATCH_MAX);
    assert_eq!(endpoint["delivered"], 2 * KEYS);
    assert_eq!(endpoint["delivered_requests"], requests.len() - 3);
    assert_eq!(endpoint["failed_attempts"], 3);
    server.shutdown().await.expect("clean shutdown");
}

/// A batch the receiver refuses is sent again whole: the same `webhook-id`, the same events,
/// the same bytes of `data` (only the send `timestamp` and signature move).
#[tokio::test]
async fn a_failed_batch_is_retried_whole_under_the_same_id() {
    let receiver = Receiver::start(Arc::new(|_, before| {
        let status = if before < 2 {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::OK
        };
        (status, Vec::new())
    }))
    .await;
    let server = TestServer::with_config(batched_config(&receiver, 100)).await;
    let keys: Vec<String> = (0..25).map(|i| format!("flaky-{i}")).collect();
    post_batch(&server, &keys, 50).await;
    receiver
        .wait_until(PATIENCE, |requests| {
            requests
                .iter()
                .filter(|r| r.id() == requests[0].id())
                .count()
                == 3
        })
        .await;
    let requests = receiver.requests();
    let first: Vec<&Received> = requests
        .iter()
        .filter(|r| r.id() == requests[0].id())
        .collect();
    assert_eq!(first.len(), 3, "two refusals, then the delivery");
    for retry in &first[1..] {
        assert_eq!(retry.json["data"], first[0].json["data"], "the same events");
    }
    let delivered: BTreeSet<String> = requests
        .iter()
        .flat_map(|r| events_of(r).into_iter().map(|(_, _, key)| key))
        .collect();
    assert_eq!(delivered.len(), keys.len(), "every key's expiry arrived");
    server.shutdown().await.expect("clean shutdown");
}

/// Shutdown sends what is held in batches, the last one partial.
#[tokio::test]
async fn shutdown_sends_held_events_in_batches_the_last_one_partial() {
    let receiver = Receiver::start(always(StatusCode::OK)).await;
    let server = TestServer::with_config(batched_config(&receiver, 64)).await;
    let keys: Vec<String> = (0..200).map(|i| format!("late-{i}")).collect();
    post_batch(&server, &keys, 1).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.shutdown().await.expect("clean shutdown");
    let requests = receiver.requests();
    let delivered: BTreeSet<String> = requests
        .iter()
        .flat_map(|r| events_of(r).into_iter().map(|(_, _, key)| key))
        .collect();
    assert_eq!(
        delivered.len(),
        200,
        "held events were delivered before exit"
    );
    assert!(
        requests.len() >= 4,
        "200 events in batches of 64 take 4 requests"
    );
    assert!(requests.iter().any(|r| events_of(r).len() < 64));
}

/// What must not be lost: with a data directory, the events of a batch cut off by the shutdown
/// (the receiver hangs) and those that never left are delivered after the restart, under their
/// own event ids; what was delivered before the shutdown is not sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_cut_off_by_shutdown_is_delivered_after_the_restart() {
    const KEYS: usize = 35;
    let receiver = Receiver::start(always(StatusCode::OK)).await;
    receiver.hold_after(2, Duration::from_secs(60));
    let dir = temp_data_dir("webhook-batches");
    let url = receiver.url().to_string();
    let args = [
        "--expiry-guard",
        "off",
        "--webhook-url",
        url.as_str(),
        "--webhook-batch-max",
        "10",
        "--webhook-concurrency",
        "1",
        "--webhook-drain-timeout",
        "500ms",
    ];
    let server = Server::start(&dir, &args);
    server.ready().await;
    let items: Vec<Value> = (0..KEYS)
        .map(|i| json!({"key": format!("cut-{i:02}"), "ttl_ms": 100}))
        .collect();
    let (status, _) = server
        .call(
            reqwest::Method::POST,
            "/v1/heartbeats/batch",
            Some(json!({ "heartbeats": items })),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    // Two batches answered, the third held by the receiver.
    receiver
        .wait_until(PATIENCE, |requests| requests.len() == 3)
        .await;
    server.signal("-TERM");
    assert_eq!(server.wait(), Some(0));
    let before: Vec<Received> = receiver.requests();
    assert_eq!(
        before.len(),
        3,
        "one request at a time: nothing after the held one"
    );
    let answered: BTreeSet<String> = before[..2]
        .iter()
        .flat_map(|r| events_of(r).into_iter().map(|(id, _, _)| id))
        .collect();
    let cut_off: BTreeSet<String> = events_of(&before[2])
        .into_iter()
        .map(|(id, _, _)| id)
        .collect();
    // How many events each batch carried depends on how the expiries reached the outbox (one
    // publication per shard): at most 10, and the cut-off batch carried some.
    assert!(before.iter().all(|r| events_of(r).len() <= 10));
    assert!(!cut_off.is_empty(), "the held request carried events");

    receiver.hold_after(usize::MAX, Duration::ZERO);
    let server = Server::start(&dir, &args);
    server.ready().await;
    receiver
        .wait_until(PATIENCE, |requests| {
            let after: BTreeSet<String> = requests[3..]
                .iter()
                .flat_map(|r| events_of(r).into_iter().map(|(_, _, key)| key))
                .collect();
            after.len() == KEYS - answered.len()
        })
        .await;
    let after: Vec<(String, String, String)> = receiver.requests()[3..]
        .iter()
        .flat_map(events_of)
        .collect();
    let after_ids: BTreeSet<String> = after.iter().map(|(id, _, _)| id.clone()).collect();
    assert!(
        cut_off.is_subset(&after_ids),
        "the cut-off batch's events come back under their own ids"
    );
    assert!(
        answered.is_disjoint(&after_ids),
        "nothing delivered before the shutdown is sent again"
    );
    let keys: BTreeSet<&str> = before
        .iter()
        .flat_map(|r| r.json["data"]["events"].as_array().unwrap().iter())
        .map(|event| event["data"]["key"].as_str().unwrap())
        .chain(after.iter().map(|(_, _, key)| key.as_str()))
        .collect();
    assert_eq!(keys.len(), KEYS, "every expiry arrived");
    server.signal("-TERM");
    assert_eq!(server.wait(), Some(0));
}

/// The README's batch handler (with its verifier) takes a real batched delivery, hands on each
/// event once (a repeat of the delivery yields nothing), and refuses a tampered body.
#[tokio::test]
#[ignore = "needs python3: .ci/run installs it"]
async fn the_readme_batch_handler_takes_a_real_batch_once() {
    crate::tools::require(&[crate::tools::Tool::Python]);
    let readme = include_str!("../../README.md");
    let blocks: Vec<&str> = readme
        .split("```python\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .collect();
    assert_eq!(blocks.len(), 2, "the verifier and the batch handler");
    let receiver = Receiver::start(always(StatusCode::OK)).await;
    let server = TestServer::with_config(batched_config(&receiver, 50)).await;
    let keys: Vec<String> = (0..7).map(|i| format!("py-{i}")).collect();
    post_batch(&server, &keys, 20).await;
    let delivered = |requests: &[Received]| {
        requests.iter().map(|r| events_of(r).len()).sum::<usize>() == keys.len()
    };
    receiver.wait_until(PATIENCE, delivered).await;
    let request = receiver.requests().remove(0);
    let n_events = events_of(&request).len();
    let program = format!(
        "{}\n{}\nimport json, sys\nd = sys.argv[1]\nh = json.load(open(d + '/headers.json'))\n\
         b = open(d + '/body', 'rb').read()\nfirst = events_of({SECRET:?}, h, b)\n\
         again = events_of({SECRET:?}, h, b)\n\
         try:\n    events_of({SECRET:?}, h, b + b' ')\n    tampered = 'accepted'\n\
         except ValueError:\n    tampered = 'refused'\n\
         print(len(first), len(again), tampered, all(e['type'] == 'key.expired' for e in first))\n",
        blocks[0], blocks[1]
    );
    let output = crate::webhooks::run_python_on(&request, &program);
    assert_eq!(output, format!("{n_events} 0 refused True"));
    server.shutdown().await.expect("clean shutdown");
}
