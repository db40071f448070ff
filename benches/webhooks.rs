//! Webhook delivery throughput: a real ttlwheel server, a real receiver that answers 200 at once,
//! both on 127.0.0.1 in this process (they share the machine's cores, as they would in a
//! one-box deployment), and a mass expiry of `TTLWHEEL_BENCH_WEBHOOK_KEYS` keys (100,000 by
//! default) due within the same second.
//!
//! Per round it reports:
//! - deliveries per second, from the first to the last arrival at the receiver;
//! - the time from the first expiry (`occurred_at` of the earliest event) to the last arrival;
//! - as a baseline from the same process, a plain reqwest client posting the same number of
//!   bodies of the same size with the same concurrency (16) to the same receiver: the receiver's
//!   and the loopback's own ceiling.
//!
//! Run: `cargo bench --bench webhooks` (about a minute).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Router;
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use ttlwheel::config::Config;

const ROUNDS: usize = 3;
const CONCURRENCY: usize = 16;
const TTL_MS: u64 = 3000;

#[derive(Default)]
struct Tally {
    received: AtomicU64,
    /// Unix ms of the first and last arrival, and the earliest `occurred_at`.
    times: Mutex<Times>,
}

#[derive(Default, Clone, Copy)]
struct Times {
    first_arrival: Option<u64>,
    last_arrival: u64,
    earliest_occurred: Option<u64>,
}

#[derive(Deserialize)]
struct Payload {
    data: Data,
}

#[derive(Deserialize)]
struct Data {
    occurred_at: String,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

async fn receive(State(tally): State<Arc<Tally>>, body: Bytes) -> StatusCode {
    let arrived = unix_ms();
    let occurred = serde_json::from_slice::<Payload>(&body)
        .ok()
        .and_then(|p| humantime::parse_rfc3339(&p.data.occurred_at).ok())
        .map(|at| at.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64);
    {
        let mut times = tally.times.lock();
        times.first_arrival.get_or_insert(arrived);
        times.last_arrival = times.last_arrival.max(arrived);
        if let Some(occurred) = occurred {
            times.earliest_occurred = Some(
                times
                    .earliest_occurred
                    .map_or(occurred, |e| e.min(occurred)),
            );
        }
    }
    tally.received.fetch_add(1, Ordering::Relaxed);
    StatusCode::OK
}

async fn start_receiver() -> (String, Arc<Tally>) {
    let tally = Arc::new(Tally::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let app = Router::new()
        .fallback(receive)
        .with_state(Arc::clone(&tally));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, tally)
}

async fn wait_for(tally: &Tally, n: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    while tally.received.load(Ordering::Relaxed) < n {
        assert!(tokio::time::Instant::now() < deadline, "deliveries stalled");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn reset(tally: &Tally) {
    tally.received.store(0, Ordering::Relaxed);
    *tally.times.lock() = Times::default();
}

struct Round {
    per_second: f64,
    expiry_to_last_ms: u64,
    baseline_per_second: f64,
}

async fn mass_expiry(
    server: &str,
    client: &reqwest::Client,
    tally: &Tally,
    round: usize,
    keys: usize,
) -> (f64, u64) {
    reset(tally);
    for chunk in 0..keys.div_ceil(1000) {
        let items: Vec<Value> = (chunk * 1000..((chunk + 1) * 1000).min(keys))
            .map(|i| json!({"key": format!("r{round}-svc-{i:07}"), "service": "bench", "ttl_ms": TTL_MS}))
            .collect();
        let response = client
            .post(format!("{server}/v1/heartbeats/batch"))
            .json(&json!({ "heartbeats": items }))
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success());
    }
    wait_for(tally, keys as u64).await;
    let times = *tally.times.lock();
    let span_ms = (times.last_arrival - times.first_arrival.unwrap()).max(1);
    let per_second = keys as f64 * 1000.0 / span_ms as f64;
    (
        per_second,
        times.last_arrival - times.earliest_occurred.unwrap(),
    )
}

/// The same number of POSTs of a webhook-sized body, from a bare client with the same concurrency.
async fn baseline(url: &str, tally: &Arc<Tally>, keys: usize) -> f64 {
    reset(tally);
    ttlwheel::notify::install_tls_provider();
    let client = reqwest::Client::new();
    let body = json!({"type": "key.expired", "timestamp": "2026-11-21T10:00:00.000Z", "data": {
        "key": "r0-svc-0000001", "service": "bench", "meta": null, "ttl_ms": TTL_MS,
        "registered_at": "2026-11-21T10:00:00.000Z", "last_heartbeat_at": "2026-11-21T10:00:00.000Z",
        "deadline": "2026-11-21T10:00:03.000Z", "occurred_at": "2026-11-21T10:00:03.000Z", "lateness_ms": 0}})
    .to_string();
    let next = Arc::new(AtomicU64::new(0));
    let started = std::time::Instant::now();
    let workers: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (client, url, body, next) = (
                client.clone(),
                url.to_owned(),
                body.clone(),
                Arc::clone(&next),
            );
            tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < keys as u64 {
                    let response = client
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body.clone())
                        .send()
                        .await
                        .unwrap();
                    assert!(response.status().is_success());
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
    keys as f64 / started.elapsed().as_secs_f64()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    values[values.len() / 2]
}

fn main() {
    let keys: usize = std::env::var("TTLWHEEL_BENCH_WEBHOOK_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let (url, tally) = start_receiver().await;
        let mut config = Config::ephemeral();
        config.webhook_urls = vec![url.parse().unwrap()];
        config.webhook_secret = Some("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".parse().unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(ttlwheel::run(listener, config, std::future::pending()));
        ttlwheel::notify::install_tls_provider();
        let client = reqwest::Client::new();
        let mut rounds = Vec::new();
        for round in 0..ROUNDS {
            let (per_second, expiry_to_last_ms) = mass_expiry(&server, &client, &tally, round, keys).await;
            let baseline_per_second = baseline(&url, &tally, keys).await;
            println!(
                "round {round}: {keys} keys: {per_second:.0} deliveries/s, first expiry -> last delivery {expiry_to_last_ms} ms; \
                 bare client baseline {baseline_per_second:.0} POSTs/s"
            );
            rounds.push(Round { per_second, expiry_to_last_ms, baseline_per_second });
        }
        let per_second = median(rounds.iter().map(|r| r.per_second).collect());
        let baseline = median(rounds.iter().map(|r| r.baseline_per_second).collect());
        let to_last = median(rounds.iter().map(|r| r.expiry_to_last_ms as f64).collect());
        println!(
            "median of {ROUNDS}: {per_second:.0} deliveries/s (signed, concurrency {CONCURRENCY}); \
             {to_last:.0} ms from the mass expiry of {keys} keys to the last delivery; \
             bare client {baseline:.0} POSTs/s (ttlwheel at {:.0}% of it)",
            100.0 * per_second / baseline
        );
    });
}
