//! The live event stream (`GET /v1/events`) and the metrics (`GET /metrics`), over real HTTP.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use ttlwheel::config::Config;

use crate::exposition::{self, value, Sample};
use crate::server::TestServer;
use crate::tools::{self, Tool};

const PATIENCE: Duration = Duration::from_secs(20);

/// One Server-Sent Event.
#[derive(Debug, Clone)]
pub(crate) struct Sse {
    pub(crate) id: String,
    pub(crate) event: String,
    pub(crate) data: Value,
}

/// A real SSE client: a streaming HTTP response parsed frame by frame.
pub(crate) struct SseClient {
    response: reqwest::Response,
    pending: String,
}

impl SseClient {
    async fn connect(server: &TestServer, query: &str, last_event_id: Option<&str>) -> Self {
        Self::connect_with(&server.client, server, query, last_event_id).await
    }

    pub(crate) async fn connect_with(
        client: &reqwest::Client,
        server: &TestServer,
        query: &str,
        last_event_id: Option<&str>,
    ) -> Self {
        let mut request = client.get(server.url(&format!("/v1/events{query}")));
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let response = request.send().await.expect("connected");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        Self {
            response,
            pending: String::new(),
        }
    }

    /// The next event (comments skipped), or panics after `PATIENCE`.
    pub(crate) async fn next(&mut self) -> Sse {
        tokio::time::timeout(PATIENCE, self.next_inner())
            .await
            .expect("an event within the patience")
    }

    async fn next_inner(&mut self) -> Sse {
        loop {
            if let Some(end) = self.pending.find("\n\n") {
                let frame: String = self.pending.drain(..end + 2).collect();
                let (mut id, mut event, mut data) = (String::new(), String::new(), String::new());
                for line in frame.lines() {
                    if let Some(value) = line.strip_prefix("id:") {
                        id = value.trim().to_owned();
                    } else if let Some(value) = line.strip_prefix("event:") {
                        event = value.trim().to_owned();
                    } else if let Some(value) = line.strip_prefix("data:") {
                        data.push_str(value.trim());
                    }
                }
                if event.is_empty() {
                    continue; // a keep-alive comment
                }
                let data = serde_json::from_str(&data).expect("JSON data");
                return Sse { id, event, data };
            }
            let chunk = self
                .response
                .chunk()
                .await
                .expect("stream read")
                .expect("stream still open");
            self.pending
                .push_str(std::str::from_utf8(&chunk).expect("utf-8"));
        }
    }

    /// Whether the server ends the stream (within the patience).
    pub(crate) async fn ends(&mut self) -> bool {
        tokio::time::timeout(PATIENCE, async {
            loop {
                match self.response.chunk().await {
                    Ok(Some(_)) => continue,
                    Ok(None) | Err(_) => return true,
                }
            }
        })
        .await
        .unwrap_or(false)
    }
}

async fn beat(server: &TestServer, body: Value) {
    let (status, answer) = server.post("/v1/heartbeats", body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}

#[tokio::test]
async fn a_client_sees_registered_then_expired_with_the_payload_fields() {
    let server = TestServer::start().await;
    let mut client = SseClient::connect(&server, "", None).await;
    beat(
        &server,
        json!({"key": "s-1", "service": "api", "meta": {"v": 2}, "ttl_ms": 100}),
    )
    .await;
    let registered = client.next().await;
    assert_eq!(registered.event, "registered");
    assert_eq!(registered.data["type"], "registered");
    assert_eq!(registered.data["key"], "s-1");
    assert_eq!(registered.data["service"], "api");
    assert_eq!(registered.data["meta"], json!({"v": 2}));
    let expired = client.next().await;
    assert_eq!(expired.event, "expired");
    assert_eq!(expired.data["key"], "s-1");
    assert!(expired.data["lateness_ms"].as_u64().is_some());
    assert_ne!(registered.id, expired.id);
    // The same fields as the webhook payload's data, plus type.
    let fields: Vec<&String> = expired.data.as_object().unwrap().keys().collect();
    assert_eq!(fields.len(), 11, "{fields:?}");
    assert_eq!(expired.data["restored"], false);
    // A renewal is not an event; a deletion is.
    beat(&server, json!({"key": "s-2", "ttl_ms": 60_000})).await;
    beat(&server, json!({"key": "s-2", "ttl_ms": 60_000})).await;
    server
        .call(reqwest::Method::DELETE, "/v1/keys/s-2", None)
        .await;
    assert_eq!(client.next().await.event, "registered");
    let deleted = client.next().await;
    assert_eq!(
        (deleted.event.as_str(), &deleted.data["key"]),
        ("deleted", &json!("s-2"))
    );
}

#[tokio::test]
async fn filters_by_service_and_prefix() {
    let server = TestServer::start().await;
    let mut by_service = SseClient::connect(&server, "?service=pay", None).await;
    let mut by_prefix = SseClient::connect(&server, "?prefix=eu/", None).await;
    beat(&server, json!({"key": "us/1", "service": "web"})).await;
    beat(&server, json!({"key": "eu/1", "service": "web"})).await;
    beat(&server, json!({"key": "us/2", "service": "pay"})).await;
    let first = by_service.next().await;
    assert_eq!(first.data["key"], "us/2", "only the pay service: {first:?}");
    let first = by_prefix.next().await;
    assert_eq!(first.data["key"], "eu/1", "only keys under eu/: {first:?}");
    let (status, body) = server.get("/v1/events?service=bad%20name").await;
    assert_eq!(
        (status, crate::server::code(&body)),
        (StatusCode::BAD_REQUEST, "invalid_service")
    );
}

#[tokio::test]
async fn a_client_resumes_with_last_event_id_without_losing_events() {
    let server = TestServer::start().await;
    let mut client = SseClient::connect(&server, "", None).await;
    beat(&server, json!({"key": "r-1"})).await;
    let seen = client.next().await;
    drop(client);
    for key in ["r-2", "r-3", "r-4"] {
        beat(&server, json!({"key": key})).await;
    }
    let mut resumed = SseClient::connect(&server, "", Some(&seen.id)).await;
    let mut keys = Vec::new();
    for _ in 0..3 {
        keys.push(resumed.next().await.data["key"].clone());
    }
    assert_eq!(keys, [json!("r-2"), json!("r-3"), json!("r-4")]);
    beat(&server, json!({"key": "r-5"})).await;
    assert_eq!(
        resumed.next().await.data["key"],
        "r-5",
        "and then live events"
    );
}

/// A quiet stream gets a keep-alive comment 15 s after the last thing it was sent, and the
/// events sent meanwhile push it back. Paused time: the runtime jumps to each timer.
#[tokio::test(start_paused = true)]
async fn a_quiet_stream_gets_a_keep_alive_comment_every_15_s() {
    let server = TestServer::start().await;
    // The test server's client gives up reading after a while; paused time gets there at once.
    let patient = reqwest::Client::new();
    let mut client = SseClient::connect_with(&patient, &server, "", None).await;
    let connected = tokio::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    beat(&server, json!({"key": "quiet-1"})).await;
    let event = client.next().await;
    assert_eq!(event.data["key"], "quiet-1");
    let event_sent = tokio::time::Instant::now();
    assert!(event_sent - connected < Duration::from_secs(11));
    let quiet = wait_for_keep_alive(&mut client, "a keep-alive comment").await;
    assert!(
        (Duration::from_secs(15)..Duration::from_secs(16)).contains(&quiet),
        "15 s after the event, not after connecting: {quiet:?}"
    );
    // And the next one 15 s after that comment, not at once.
    let quiet = wait_for_keep_alive(&mut client, "a second keep-alive comment").await;
    assert!(
        (Duration::from_secs(15)..Duration::from_secs(16)).contains(&quiet),
        "15 s after the first comment: {quiet:?}"
    );
}

/// Reads `client`'s next chunk, which must be a keep-alive comment (`what`), and returns how
/// long it took to come.
async fn wait_for_keep_alive(client: &mut SseClient, what: &str) -> Duration {
    let asked = tokio::time::Instant::now();
    let chunk = tokio::time::timeout(Duration::from_secs(60), client.response.chunk())
        .await
        .expect("something within a minute")
        .expect("read")
        .expect("open");
    assert_eq!(&chunk[..], b":\n\n", "{what}");
    asked.elapsed()
}

#[tokio::test]
async fn a_gap_older_than_the_ring_or_another_run_gets_a_reset() {
    let mut config = Config::ephemeral();
    config.events_ring = 4;
    let server = TestServer::with_config(config).await;
    let mut client = SseClient::connect(&server, "", None).await;
    beat(&server, json!({"key": "g-0"})).await;
    let seen = client.next().await;
    drop(client);
    for i in 1..=10 {
        beat(&server, json!({"key": format!("g-{i}")})).await;
    }
    let mut resumed = SseClient::connect(&server, "", Some(&seen.id)).await;
    let reset = resumed.next().await;
    assert_eq!(reset.event, "reset", "{reset:?}");
    beat(&server, json!({"key": "g-11"})).await;
    assert_eq!(
        resumed.next().await.data["key"],
        "g-11",
        "continues from now"
    );

    let mut foreign = SseClient::connect(&server, "", Some("0badcafe-3")).await;
    assert_eq!(foreign.next().await.event, "reset");
}

#[tokio::test]
async fn a_client_that_falls_behind_the_ring_is_dropped_and_counted() {
    let mut config = Config::ephemeral();
    config.events_ring = 64;
    let server = TestServer::with_config(config).await;
    let stalled = SseClient::connect(&server, "", None).await; // never reads
                                                               // Enough events to fill the socket buffers and pass the ring many times over.
    for chunk in 0..20 {
        let items: Vec<Value> = (0..1000)
            .map(|i| json!({"key": format!("flood-{chunk}-{i}-{}", "x".repeat(100)), "ttl_ms": 600_000}))
            .collect();
        let (status, _) = server
            .post("/v1/heartbeats/batch", json!({ "heartbeats": items }))
            .await;
        assert_eq!(status, StatusCode::OK);
    }
    let mut stalled = stalled;
    let mut saw_reset = false;
    let drained = tokio::time::timeout(PATIENCE, async {
        loop {
            let event = stalled.next_inner().await;
            if event.event == "reset" {
                saw_reset = true;
                break;
            }
        }
    })
    .await;
    assert!(
        drained.is_ok() && saw_reset,
        "the stalled client is told it fell behind"
    );
    assert!(stalled.ends().await, "and disconnected");
    let metrics = metrics_of(&server).await;
    assert_eq!(
        value(&metrics, "ttlwheel_sse_clients_dropped_total", &[]),
        1.0
    );
    assert!(value(&metrics, "ttlwheel_sse_events_dropped_total", &[]) > 0.0);
}

/// `GET /metrics` as text, checking the status and content type.
pub async fn metrics_text(server: &TestServer) -> String {
    let response = server
        .client
        .get(server.url("/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
    response.text().await.unwrap()
}

/// `GET /metrics`, read into samples (in Rust: see `exposition`).
pub async fn metrics_of(server: &TestServer) -> Vec<Sample> {
    exposition::samples(&metrics_text(server).await)
}

fn histogram_count(samples: &[Sample], name: &str) -> u64 {
    value(samples, &format!("{name}_count"), &[]) as u64
}

#[tokio::test]
async fn metrics_count_known_traffic() {
    let server = TestServer::start().await;
    beat(
        &server,
        json!({"key": "m-1", "service": "api", "ttl_s": 60}),
    )
    .await;
    beat(
        &server,
        json!({"key": "m-1", "service": "api", "ttl_s": 60}),
    )
    .await;
    beat(
        &server,
        json!({"key": "m-2", "service": "api", "ttl_ms": 1500}),
    )
    .await;
    beat(
        &server,
        json!({"key": "m-3", "service": "db", "ttl_ms": 50}),
    )
    .await;
    beat(&server, json!({"key": "m-4"})).await;
    server
        .call(reqwest::Method::DELETE, "/v1/keys/m-4/ttl", None)
        .await; // PERSIST
    let (status, _) = server
        .call(reqwest::Method::DELETE, "/v1/keys/m-2", None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    server.get("/v1/keys/missing").await;
    // m-3 expires; wait until the counters saw it.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let metrics = loop {
        let metrics = metrics_of(&server).await;
        // 4 registrations, a deletion and the expiry, all in the stream's ring.
        if value(&metrics, "ttlwheel_expirations_total", &[]) == 1.0
            && value(&metrics, "ttlwheel_sse_ring_events", &[]) == 6.0
        {
            break metrics;
        }
        assert!(tokio::time::Instant::now() < deadline, "m-3 never expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(value(&metrics, "ttlwheel_heartbeats_total", &[]), 5.0);
    assert_eq!(value(&metrics, "ttlwheel_registrations_total", &[]), 4.0);
    assert_eq!(value(&metrics, "ttlwheel_deletions_total", &[]), 1.0);
    assert_eq!(
        histogram_count(&metrics, "ttlwheel_expiry_lateness_seconds"),
        1
    );
    assert!(histogram_count(&metrics, "ttlwheel_sweep_duration_seconds") >= 1);
    assert_eq!(
        value(&metrics, "ttlwheel_keys_alive", &[("timer", "wheel")]),
        1.0
    );
    assert_eq!(
        value(&metrics, "ttlwheel_keys_alive", &[("timer", "heap")]),
        0.0
    );
    assert_eq!(
        value(&metrics, "ttlwheel_keys_alive", &[("timer", "none")]),
        1.0
    );
    assert_eq!(
        value(
            &metrics,
            "ttlwheel_service_keys_alive",
            &[("service", "api")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &metrics,
            "ttlwheel_service_keys_alive",
            &[("service", "(other)")]
        ),
        0.0
    );
    let posts = [
        ("route", "/v1/heartbeats"),
        ("method", "POST"),
        ("status", "200"),
    ];
    assert_eq!(value(&metrics, "ttlwheel_http_requests_total", &posts), 5.0);
    let missing = [
        ("route", "/v1/keys/{key}"),
        ("method", "GET"),
        ("status", "404"),
    ];
    assert_eq!(
        value(&metrics, "ttlwheel_http_requests_total", &missing),
        1.0
    );
    assert!(value(&metrics, "ttlwheel_process_resident_memory_bytes", &[]) > 0.0);
    assert!(value(&metrics, "ttlwheel_memory_bytes_per_key", &[]) > 0.0);
    assert_eq!(value(&metrics, "ttlwheel_ticker_lag_seconds", &[]), 0.0);
    assert_eq!(value(&metrics, "ttlwheel_sse_clients", &[]), 0.0);
    let ring_bytes = value(&metrics, "ttlwheel_sse_ring_bytes", &[]);
    assert!(
        (6.0 * 40.0..=ttlwheel::stream::DEFAULT_RING_BYTES as f64).contains(&ring_bytes),
        "{ring_bytes}"
    );
}

/// The exposition is valid OpenMetrics by the Prometheus project's own parser (Python
/// `prometheus_client`, strict: a malformed line fails), and that parser reads the same samples
/// as the Rust reader the other tests use.
#[tokio::test]
#[ignore = "needs python3 and its prometheus_client module: .ci/run installs them"]
async fn the_exposition_parses_with_the_prometheus_parser() {
    tools::require(&[
        Tool::Python,
        Tool::PythonModule(
            "prometheus_client",
            "apt-get install python3-prometheus-client",
        ),
    ]);
    let server = TestServer::start().await;
    beat(
        &server,
        json!({"key": "p-1", "service": "api:v1.2", "ttl_ms": 50}),
    )
    .await;
    beat(&server, json!({"key": "p-2", "ttl_s": 60})).await;
    server.get("/v1/keys/missing").await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while server.get("/v1/keys/p-1").await.0 != StatusCode::NOT_FOUND {
        assert!(tokio::time::Instant::now() < deadline, "p-1 never expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = metrics_text(&server).await;
    let file = std::env::temp_dir().join(format!("ttlwheel-metrics-{}.txt", std::process::id()));
    std::fs::write(&file, &text).unwrap();
    let parser = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tools/parse_metrics.py");
    let output = std::process::Command::new(crate::tools::python())
        .arg(parser)
        .arg(&file)
        .output()
        .expect("python3 runs");
    std::fs::remove_file(&file).ok();
    assert!(
        output.status.success(),
        "the Prometheus parser refused the exposition: {}\n{text}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut by_python: Vec<Sample> = serde_json::from_slice(&output.stdout).expect("parser output");
    let mut by_rust = exposition::samples(&text);
    // The Python parser names a counter's samples with `_total` and adds `_created` samples of
    // its own only when present; compare what both read.
    let order = |a: &Sample, b: &Sample| {
        format!("{}{:?}", a.0, sorted(&a.1)).cmp(&format!("{}{:?}", b.0, sorted(&b.1)))
    };
    by_python.sort_by(order);
    by_rust.sort_by(order);
    assert_eq!(by_python, by_rust);
    assert_eq!(
        value(
            &by_python,
            "ttlwheel_service_keys_alive",
            &[("service", "api:v1.2")]
        ),
        0.0
    );
    assert_eq!(value(&by_python, "ttlwheel_expirations_total", &[]), 1.0);
    // No help text ends in two full stops (prometheus-client adds one to what it is given).
    for line in text.lines().filter(|line| line.starts_with("# HELP")) {
        assert!(!line.ends_with(".."), "{line}");
    }
}

fn sorted(labels: &std::collections::HashMap<String, String>) -> Vec<(&String, &String)> {
    let mut labels: Vec<_> = labels.iter().collect();
    labels.sort();
    labels
}
