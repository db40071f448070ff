//! `storm`: `keys` keys that were alive all stop at once: they are registered first with a long
//! TTL, then renewed in one fast pass with the storm TTL (as a fleet that heartbeats and then
//! loses its network would), so they expire in the same wheel tick or two while single
//! heartbeats on other keys go on. Reports the heartbeat latency before and during the storm,
//! how many keys expired in each second of the server's clock, and the time until the last
//! webhook arrives.
//!
//! The storm is timed from the earliest moment any storm key can expire (start of the renewal
//! pass + TTL) to the arrival of its last webhook; heartbeats that *start* in that span count as
//! "during". Keys of the background load have a TTL of an hour and must never expire: any
//! expiry of one is a false expiration.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::driver::{Load, PhaseStats, Phases, PAUSE, STOP};
use crate::receiver::Arrival;
use crate::stats::Summary;
use crate::workload::{self, Ttl};
use crate::{register, SingleHeartbeats};

#[derive(Clone, Debug)]
pub struct Settings {
    pub address: String,
    pub keys: u64,
    pub ttl: Ttl,
    pub register_connections: usize,
    pub live_keys: u64,
    pub live_connections: usize,
    /// Open loop at this many heartbeats per second; `None`: closed loop.
    pub live_rate: Option<f64>,
    pub live_ttl: Ttl,
    pub baseline: Duration,
    pub timeout: Duration,
    pub seed: u64,
}

#[derive(Debug, serde::Serialize)]
pub struct Outcome {
    pub keys: u64,
    /// The renewal pass that gave every storm key the storm TTL.
    pub renew_ms: f64,
    pub expired: u64,
    pub duplicates: u64,
    pub false_expirations: u64,
    /// Deliveries of keys of no key of this run (left over from an earlier one).
    pub foreign: u64,
    /// Storm keys expired in each second (server clock) that saw any, in order.
    pub expired_per_second: Vec<u64>,
    /// From the earliest possible expiry (registration start + TTL) to the first and the last
    /// webhook of a storm key.
    pub first_webhook_ms: f64,
    pub last_webhook_ms: f64,
    /// Storm-key webhooks per second between the first and the last.
    pub webhooks_per_s: f64,
    pub heartbeat_before: Summary,
    pub heartbeat_during: Summary,
    /// The sender's own lateness waking for its scheduled heartbeats during the storm: the part
    /// of `heartbeat_during` that is the tool's, not the server's.
    pub sender_wake_lag_during: Summary,
    /// Write to answer of each heartbeat during the storm, without the time it waited for its
    /// connection.
    pub round_trip_during: Summary,
    pub heartbeats_per_s_before: f64,
    pub heartbeats_per_s_during: f64,
    pub heartbeat_errors: u64,
}

/// A storm is exactly what ttlwheel's mass-expiry guard holds (a million keys expiring at once
/// looks like a partition): to measure a real storm, the server must run with
/// `--expiry-guard off`. Checks it, and says so.
async fn require_guard_off(address: &str) -> Result<(), String> {
    let mut conn = crate::wire::Conn::connect(address)
        .await
        .map_err(|error| format!("cannot connect to {address}: {error}"))?;
    let request = crate::wire::get(address, "/v1/guard");
    let response = conn
        .exchange(&request)
        .await
        .map_err(|error| format!("GET /v1/guard: {error}"))?;
    let status: serde_json::Value = serde_json::from_slice(response.body)
        .map_err(|error| format!("GET /v1/guard answered {}: {error}", response.status))?;
    if status["enabled"] != false {
        return Err(
            "the server's mass-expiry guard is on, and a storm is exactly what it holds: start \
             ttlwheel with --expiry-guard off to measure a real storm"
                .into(),
        );
    }
    eprintln!("storm: the server's expiry guard is off (checked): the storm expires for real");
    Ok(())
}

const BASELINE: usize = 0;
const WAITING: usize = 1;
const STORM: usize = 2;

pub async fn run(
    settings: Settings,
    mut arrivals: tokio::sync::mpsc::UnboundedReceiver<Arrival>,
) -> Result<Outcome, String> {
    require_guard_off(&settings.address).await?;
    // Prefixes of this run's own: deliveries left over from an earlier run are not ours.
    let run = fastrand::u32(..);
    let (storm_prefix, live_prefix) = (format!("storm-{run:08x}-"), format!("live-{run:08x}-"));
    eprintln!("storm: preloading {} live keys", settings.live_keys);
    register(
        &settings.address,
        &live_prefix,
        settings.live_keys,
        settings.live_ttl,
        settings.register_connections,
    )
    .await?;
    eprintln!("storm: registering {} storm keys (TTL 1 h)", settings.keys);
    register(
        &settings.address,
        &storm_prefix,
        settings.keys,
        settings.live_ttl,
        settings.register_connections,
    )
    .await?;
    let phases = Arc::new(Phases::default());
    // The heartbeats go out from a thread of their own: the webhook receiver on the tool's main
    // runtime takes up to ~300k events/s in a storm, and must not make them late.
    let sender = crate::driver::sender_runtime("storm-sender")?;
    let load = Load::start(
        sender.handle(),
        &settings.address,
        settings.live_connections,
        STORM + 1,
        Arc::clone(&phases),
        Arc::new(SingleHeartbeats {
            host: settings.address.clone(),
            prefix: live_prefix.clone(),
            keys: settings.live_keys,
            ttl: settings.live_ttl,
            order: crate::workload::KeyOrder::Random,
            minimal: false,
        }),
        settings.seed,
        settings.live_rate,
    );
    let baseline_started = Instant::now();
    tokio::time::sleep(settings.baseline).await;
    let baseline_took = baseline_started.elapsed();

    // The background load pauses during the renewal pass, so that the pass is as fast as the
    // server allows and the keys share one or two wheel ticks; it resumes long before any of
    // them can expire.
    phases.set(PAUSE);
    eprintln!(
        "storm: renewing the {} storm keys with TTL {:?}",
        settings.keys, settings.ttl.0
    );
    let renew_started = Instant::now();
    register(
        &settings.address,
        &storm_prefix,
        settings.keys,
        settings.ttl,
        settings.register_connections,
    )
    .await?;
    let renew_took = renew_started.elapsed();
    phases.set(WAITING);
    let storm_starts = renew_started + settings.ttl.0;
    let phase_switch = {
        let phases = Arc::clone(&phases);
        tokio::spawn(async move {
            tokio::time::sleep_until(storm_starts).await;
            phases.set(STORM);
        })
    };

    let mut seen = vec![false; settings.keys as usize];
    let (mut expired, mut duplicates, mut false_expirations) = (0u64, 0u64, 0u64);
    let mut foreign = 0u64;
    // Storm keys expired per second of the server's clock (`occurred_at` to the second).
    let mut per_second = std::collections::BTreeMap::<String, u64>::new();
    let (mut first, mut last) = (None, None);
    let give_up = storm_starts + settings.timeout;
    while expired < settings.keys {
        let arrival = match tokio::time::timeout_at(give_up, arrivals.recv()).await {
            Ok(Some(arrival)) => arrival,
            Ok(None) | Err(_) => break,
        };
        if arrival.kind != crate::receiver::EXPIRED {
            false_expirations += 1; // the server sends only expiries: anything else is wrong
            continue;
        }
        if !arrival.key.starts_with(&storm_prefix) && !arrival.key.starts_with(&live_prefix) {
            foreign += 1;
            continue;
        }
        if let Some(index) = workload::key_index(&arrival.key, &storm_prefix) {
            match seen.get_mut(index as usize) {
                Some(seen @ false) => {
                    *seen = true;
                    expired += 1;
                    first.get_or_insert(arrival.at);
                    let second = arrival.occurred_at.as_deref().and_then(|t| t.get(..19));
                    *per_second
                        .entry(second.unwrap_or("?").to_owned())
                        .or_default() += 1;
                    last = Some(arrival.at);
                }
                Some(true) => duplicates += 1,
                None => false_expirations += 1,
            }
        } else {
            false_expirations += 1;
        }
    }
    let storm_ended = Instant::now();
    phase_switch.abort();
    phases.set(STOP);
    let stats = load.finish().await;
    sender.shutdown_background();
    let storm_took = storm_ended.saturating_duration_since(storm_starts);

    let since_start = |at: Option<Instant>| {
        at.map_or(f64::NAN, |at| {
            crate::stats::ms(at.saturating_duration_since(storm_starts))
        })
    };
    let rate = |stats: &PhaseStats, took: Duration| stats.requests as f64 / took.as_secs_f64();
    let webhooks_per_s = match (first, last) {
        (Some(first), Some(last)) if last > first => expired as f64 / (last - first).as_secs_f64(),
        _ => f64::NAN,
    };
    Ok(Outcome {
        keys: settings.keys,
        renew_ms: crate::stats::ms(renew_took),
        expired,
        duplicates,
        false_expirations,
        foreign,
        expired_per_second: per_second.into_values().collect(),
        first_webhook_ms: since_start(first),
        last_webhook_ms: since_start(last),
        webhooks_per_s,
        heartbeat_before: stats[BASELINE].latencies.summary(),
        heartbeat_during: stats[STORM].latencies.summary(),
        sender_wake_lag_during: stats[STORM].wake_lag.summary(),
        round_trip_during: stats[STORM].round_trips.summary(),
        heartbeats_per_s_before: rate(&stats[BASELINE], baseline_took),
        heartbeats_per_s_during: rate(&stats[STORM], storm_took),
        heartbeat_errors: stats.iter().map(|s| s.errors + s.failed_items).sum(),
    })
}
