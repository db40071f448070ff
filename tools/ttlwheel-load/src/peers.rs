//! The peers' expiry lateness, measured as the soak measures ttlwheel's: keys are given a TTL
//! at a steady rate, each send time is noted, and lateness is `arrival − (send + TTL)` where
//! arrival is when the peer's own notification reaches this tool.
//!
//! - Redis: `SET k v PX ttl`, arrivals from keyspace notifications
//!   (`notify-keyspace-events Ex`, `SUBSCRIBE __keyevent@0__:expired`). Spoken over RESP with
//!   the small codec of `resp`.
//! - etcd 3.4 through its HTTP gateway: one lease per key (`/v3/lease/grant`), the key put on it
//!   (`/v3/kv/put`), arrivals from a watch (`/v3/watch`) as `DELETE` events.
//!
//! Both can hold a population of live keys with long TTLs beside the expiring ones, because a
//! peer's expiry cost can depend on how many keys have TTLs.

use std::time::Duration;

use base64::Engine;
use tokio::time::Instant;

use crate::resp::{self, Resp, RespConn};
use crate::stats::{Durations, Summary};
use crate::workload::Ttl;

#[derive(clap::Args, Debug)]
pub struct ExpiryArgs {
    /// Keys that expire.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Keys with a long TTL (1 h) set first, that stay alive.
    #[arg(long, default_value_t = 90_000)]
    live_keys: u64,
    #[arg(long, default_value = "5s", value_parser = Ttl::parse)]
    ttl: Ttl,
    /// The expiring keys are set evenly over this long.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    spread: Duration,
    /// How long after the last deadline to wait for notifications.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    wait: Duration,
}

#[derive(Debug, serde::Serialize)]
pub struct ExpiryOutcome {
    pub keys: u64,
    pub expired: u64,
    pub missing: u64,
    pub lateness: Summary,
}

pub fn print(outcome: &ExpiryOutcome, mode: &str) {
    println!(
        "{mode}: {} keys, {} expired, {} missing; lateness {}",
        outcome.keys, outcome.expired, outcome.missing, outcome.lateness
    );
    crate::print_result(mode, outcome);
}

/// Send times by key index, and the lateness of each first arrival.
struct Tally {
    ttl: Duration,
    sent: Vec<Option<Instant>>,
    arrived: Vec<bool>,
    lateness: Durations,
    expired: u64,
}

impl Tally {
    fn new(keys: u64, ttl: Duration) -> Self {
        Self {
            ttl,
            sent: vec![None; keys as usize],
            arrived: vec![false; keys as usize],
            lateness: Durations::default(),
            expired: 0,
        }
    }

    fn arrived(&mut self, key: &str, at: Instant) {
        let Some(index) = crate::workload::key_index(key, EXPIRING) else {
            return;
        };
        let index = index as usize;
        let Some(Some(sent)) = self.sent.get(index) else {
            return;
        };
        if !std::mem::replace(&mut self.arrived[index], true) {
            self.expired += 1;
            self.lateness
                .record(at.saturating_duration_since(*sent + self.ttl));
        }
    }

    fn outcome(&self) -> ExpiryOutcome {
        ExpiryOutcome {
            keys: self.sent.len() as u64,
            expired: self.expired,
            missing: self.sent.len() as u64 - self.expired,
            lateness: self.lateness.summary(),
        }
    }
}

const EXPIRING: &str = "exp-";
const LIVE_TTL_S: u64 = 3600;

/// When key `i` of `keys` is due to be set, spread evenly over `spread`.
fn send_offset(i: u64, keys: u64, spread: Duration) -> Duration {
    spread.mul_f64(i as f64 / keys.max(1) as f64)
}

// ---- Redis ----

/// `SET <prefix><n> 1 EX <ttl>` on keys picked by `order`: Redis's heartbeat, for the same
/// open-loop driver as ttlwheel's (`redis-set --rate`).
pub struct RedisSets {
    pub prefix: String,
    pub keys: u64,
    pub ttl_s: u64,
    pub order: crate::workload::KeyOrder,
}

impl crate::driver::Workload for RedisSets {
    fn request(&self, rng: &mut fastrand::Rng, out: &mut Vec<u8>) -> u64 {
        let key = format!("{}{}", self.prefix, self.order.next(rng, self.keys));
        let ttl = self.ttl_s.to_string();
        resp::command(out, &[b"SET", key.as_bytes(), b"1", b"EX", ttl.as_bytes()]);
        1
    }

    fn failed(&self, _response: &crate::wire::Response<'_>, _items: u64) -> u64 {
        0
    }

    fn protocol(&self) -> crate::driver::Protocol {
        crate::driver::Protocol::Resp
    }
}

pub async fn redis_expiry(address: &str, args: &ExpiryArgs) -> Result<ExpiryOutcome, String> {
    let mut commands = RespConn::connect(address).await?;
    let mut out = Vec::new();
    resp::command(
        &mut out,
        &[b"CONFIG", b"SET", b"notify-keyspace-events", b"Ex"],
    );
    commands.pipeline(&out, 1).await?;
    let mut subscriber = RespConn::connect(address).await?;
    out.clear();
    resp::command(&mut out, &[b"SUBSCRIBE", b"__keyevent@0__:expired"]);
    subscriber.pipeline(&out, 1).await?;

    let live_ttl = LIVE_TTL_S.to_string();
    for chunk_start in (0..args.live_keys).step_by(1000) {
        out.clear();
        let chunk_end = args.live_keys.min(chunk_start + 1000);
        for i in chunk_start..chunk_end {
            let key = format!("live-{i}");
            resp::command(
                &mut out,
                &[b"SET", key.as_bytes(), b"v", b"EX", live_ttl.as_bytes()],
            );
        }
        commands
            .pipeline(&out, (chunk_end - chunk_start) as usize)
            .await?;
    }

    let tally = std::sync::Arc::new(parking_lot::Mutex::new(Tally::new(args.keys, args.ttl.0)));
    let listener = {
        let tally = std::sync::Arc::clone(&tally);
        tokio::spawn(async move {
            while let Ok(message) = subscriber.read().await {
                let at = Instant::now();
                if let Resp::Array(parts) = message {
                    if let Some(Resp::Bulk(Some(key))) = parts.get(2) {
                        tally.lock().arrived(&String::from_utf8_lossy(key), at);
                    }
                }
            }
        })
    };

    let ttl_ms = (args.ttl.0.as_millis() as u64).to_string();
    let started = Instant::now();
    let mut next = 0;
    while next < args.keys {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let elapsed = started.elapsed();
        out.clear();
        let first = next;
        while next < args.keys && send_offset(next, args.keys, args.spread) <= elapsed {
            let key = format!("{EXPIRING}{next}");
            resp::command(
                &mut out,
                &[b"SET", key.as_bytes(), b"v", b"PX", ttl_ms.as_bytes()],
            );
            next += 1;
        }
        let sent_at = Instant::now();
        {
            let mut tally = tally.lock();
            for i in first..next {
                tally.sent[i as usize] = Some(sent_at);
            }
        }
        commands.pipeline(&out, (next - first) as usize).await?;
    }
    wait_for_arrivals(&tally, started + args.spread + args.ttl.0 + args.wait).await;
    listener.abort();
    let outcome = tally.lock().outcome();
    Ok(outcome)
}

async fn wait_for_arrivals(tally: &parking_lot::Mutex<Tally>, until: Instant) {
    while Instant::now() < until {
        {
            let tally = tally.lock();
            if tally.expired == tally.sent.len() as u64 {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---- etcd (HTTP gateway) ----

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Grants a lease and puts `key` on it; returns when both are acknowledged.
async fn etcd_lease_key(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    ttl_s: u64,
) -> Result<(), String> {
    #[derive(serde::Deserialize)]
    struct Grant {
        #[serde(rename = "ID")]
        id: String,
    }
    let answer = client
        .post(format!("{base}/v3/lease/grant"))
        .body(serde_json::json!({ "TTL": ttl_s }).to_string())
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|error| format!("lease grant: {error}"))?
        .bytes()
        .await
        .map_err(|error| format!("lease grant answer: {error}"))?;
    let grant: Grant =
        serde_json::from_slice(&answer).map_err(|error| format!("lease grant answer: {error}"))?;
    client
        .post(format!("{base}/v3/kv/put"))
        .body(
            serde_json::json!({ "key": b64(key.as_bytes()), "value": b64(b"v"), "lease": grant.id })
                .to_string(),
        )
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|error| format!("put: {error}"))?;
    Ok(())
}

pub async fn etcd_expiry(address: &str, args: &ExpiryArgs) -> Result<ExpiryOutcome, String> {
    // Only needed when a workspace-wide build unifies reqwest's rustls feature in; an error
    // means a provider is already installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let base = format!("http://{address}");
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(|error| error.to_string())?;
    let ttl_s = args.ttl.0.as_secs();
    if args.ttl.0.subsec_millis() != 0 {
        return Err("etcd leases have whole-second TTLs".into());
    }
    // Live keys: their leases are granted concurrently, 32 at a time.
    let live: Vec<u64> = (0..args.live_keys).collect();
    for chunk in live.chunks(32) {
        let grants = chunk.iter().map(|i| {
            let key = format!("live-{i}");
            let (client, base) = (&client, &base);
            async move { etcd_lease_key(client, base, &key, LIVE_TTL_S).await }
        });
        for result in futures_util::future::join_all(grants).await {
            result?;
        }
    }

    let tally = std::sync::Arc::new(parking_lot::Mutex::new(Tally::new(args.keys, args.ttl.0)));
    let watch = client
        .post(format!("{base}/v3/watch"))
        .body(
            serde_json::json!({"create_request": {
                "key": b64(EXPIRING.as_bytes()),
                "range_end": b64(b"exp."), // the prefix's end: '-' + 1
            }})
            .to_string(),
        )
        .send()
        .await
        .map_err(|error| format!("watch: {error}"))?;
    let listener = {
        let tally = std::sync::Arc::clone(&tally);
        tokio::spawn(read_watch(watch, tally))
    };

    let started = Instant::now();
    let mut next = 0;
    let mut in_flight = futures_util::stream::FuturesUnordered::new();
    while next < args.keys || !in_flight.is_empty() {
        use futures_util::StreamExt;
        let due = started + send_offset(next, args.keys, args.spread);
        tokio::select! {
            () = tokio::time::sleep_until(due), if next < args.keys => {
                let key = format!("{EXPIRING}{next}");
                tally.lock().sent[next as usize] = Some(Instant::now());
                let (client, base) = (client.clone(), base.clone());
                in_flight.push(async move { etcd_lease_key(&client, &base, &key, ttl_s).await });
                next += 1;
            }
            Some(result) = in_flight.next() => result?,
        }
    }
    wait_for_arrivals(&tally, started + args.spread + args.ttl.0 + args.wait).await;
    listener.abort();
    let outcome = tally.lock().outcome();
    Ok(outcome)
}

/// Reads the gateway's watch stream: one JSON object per line.
async fn read_watch(
    mut watch: reqwest::Response,
    tally: std::sync::Arc<parking_lot::Mutex<Tally>>,
) {
    #[derive(serde::Deserialize)]
    struct Line {
        result: Option<WatchResult>,
    }
    #[derive(serde::Deserialize)]
    struct WatchResult {
        #[serde(default)]
        events: Vec<WatchEvent>,
    }
    #[derive(serde::Deserialize)]
    struct WatchEvent {
        #[serde(default)]
        r#type: Option<String>,
        kv: Kv,
    }
    #[derive(serde::Deserialize)]
    struct Kv {
        key: String,
    }
    let mut buffer = Vec::new();
    while let Ok(Some(chunk)) = watch.chunk().await {
        let at = Instant::now();
        buffer.extend_from_slice(&chunk);
        while let Some(end) = buffer.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            let Ok(Line {
                result: Some(result),
            }) = serde_json::from_slice(&line)
            else {
                continue;
            };
            for event in result.events {
                if event.r#type.as_deref() != Some("DELETE") {
                    continue;
                }
                if let Ok(key) = base64::engine::general_purpose::STANDARD.decode(&event.kv.key) {
                    tally.lock().arrived(&String::from_utf8_lossy(&key), at);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tally_counts_first_arrivals_of_sent_keys_only() {
        let t0 = Instant::now();
        let mut tally = Tally::new(3, Duration::from_secs(5));
        tally.sent[0] = Some(t0);
        tally.sent[1] = Some(t0);
        tally.arrived("exp-0", t0 + Duration::from_millis(5_300));
        tally.arrived("exp-0", t0 + Duration::from_secs(9));
        tally.arrived("exp-2", t0 + Duration::from_secs(9)); // never sent
        tally.arrived("live-0", t0 + Duration::from_secs(9));
        let outcome = tally.outcome();
        assert_eq!((outcome.expired, outcome.missing), (1, 2));
        // HdrHistogram keeps 3 significant digits.
        let max = outcome.lateness.max.as_micros() as i64;
        assert!((max - 300_000).abs() <= 300, "{max}");
    }

    #[test]
    fn sends_are_spread_evenly() {
        let spread = Duration::from_secs(10);
        assert_eq!(send_offset(0, 100, spread), Duration::ZERO);
        assert_eq!(send_offset(50, 100, spread), Duration::from_secs(5));
        assert!(send_offset(99, 100, spread) < spread);
    }
}
