//! `soak`: K keys heartbeating every TTL/3 for D minutes while a fraction of them stop; the
//! tool's webhook receiver checks that every stopped key expires exactly once within its window
//! and that no other key ever expires.
//!
//! [`Ledger`] is the accounting, pure (it is given times): what was acknowledged, what stopped,
//! and the verdict on each delivery. [`run`] drives a real server and feeds the ledger.
//!
//! A stopped key's window is `[s + ttl, s + ttl + grace]` where `s` is when its last
//! acknowledged heartbeat was *sent*: the server's deadline is at least `s + ttl` (it read its
//! clock after we sent), so an expiry before that is early; `grace` is the allowed lateness
//! (20 ms on both paths by default: the wheel expires to the millisecond too). Lateness is measured from
//! `s + ttl`, so it includes the request's own time and the webhook delivery: the worst case.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::stats::{Durations, Summary};
use crate::wire::Conn;
use crate::workload::{self, Ttl};

/// The two timer paths a soak exercises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    Wheel = 0,
    Heap = 1,
}

/// A path's TTL and allowed lateness.
#[derive(Clone, Copy, Debug)]
pub struct PathSpec {
    pub ttl: Duration,
    pub grace: Duration,
}

#[derive(Clone, Copy, Debug, Default)]
struct KeyState {
    /// Send time of the last acknowledged heartbeat.
    last_acked_send: Option<Instant>,
    stopped: bool,
    expiries: u32,
}

/// What one delivery was judged to be.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Verdict {
    /// A stopped key's first expiry, within its window.
    InWindow(Duration),
    /// A stopped key's first expiry, after its window.
    Late(Duration),
    /// A stopped key's expiry before its deadline could have passed.
    Early(Duration),
    /// The expiry of a key that was still heartbeating (or never registered).
    False,
    /// A second expiry of the same key (a different webhook id).
    Duplicate,
    /// The same webhook id again (a retried delivery): ignored.
    Redelivery,
    /// A key that is not one of the soak's.
    Foreign,
}

/// The soak's counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    pub stopped: u64,
    pub in_window: u64,
    pub late: u64,
    pub early: u64,
    pub false_expirations: u64,
    pub duplicates: u64,
    pub missing: u64,
    /// Stopped keys whose window has not closed yet when the report is made.
    pub pending: u64,
    pub redeliveries: u64,
    pub foreign: u64,
}

impl Counts {
    /// Every stopped key expired exactly once within its window, and nothing else expired.
    pub fn clean(&self) -> bool {
        self.late == 0
            && self.early == 0
            && self.false_expirations == 0
            && self.duplicates == 0
            && self.missing == 0
            && self.pending == 0
    }
}

/// The accounting of a soak.
pub struct Ledger {
    specs: [PathSpec; 2],
    paths: Vec<Path>,
    keys: Vec<KeyState>,
    seen_ids: HashSet<String>,
    counts: Counts,
    lateness: [Durations; 2],
    /// Per path, the lateness the server itself measured and reported in the payload.
    server_lateness: [Durations; 2],
}

impl Ledger {
    /// A ledger for keys `0..paths.len()`, key `i` on `paths[i]`.
    pub fn new(specs: [PathSpec; 2], paths: Vec<Path>) -> Self {
        Self {
            specs,
            keys: vec![KeyState::default(); paths.len()],
            paths,
            seen_ids: HashSet::new(),
            counts: Counts::default(),
            lateness: [Durations::default(), Durations::default()],
            server_lateness: [Durations::default(), Durations::default()],
        }
    }

    fn spec(&self, key: usize) -> PathSpec {
        self.specs[self.paths[key] as usize]
    }

    /// The server acknowledged a heartbeat for `key` that was sent at `sent_at`.
    pub fn acked(&mut self, key: usize, sent_at: Instant) {
        let state = &mut self.keys[key];
        if state.last_acked_send.is_none_or(|last| sent_at > last) {
            state.last_acked_send = Some(sent_at);
        }
    }

    /// `key` gets no more heartbeats.
    pub fn stop(&mut self, key: usize) {
        if !self.keys[key].stopped {
            self.keys[key].stopped = true;
            self.counts.stopped += 1;
        }
    }

    /// A webhook said `key` (its index, or `None` for a key not of this soak) expired.
    /// `server_lateness`: the lateness the server measured (the payload's `lateness_ms`).
    pub fn expired(
        &mut self,
        key: Option<usize>,
        webhook_id: &str,
        at: Instant,
        server_lateness: Option<Duration>,
    ) -> Verdict {
        let verdict = self.judge(key, webhook_id, at);
        match verdict {
            Verdict::InWindow(lateness) | Verdict::Late(lateness) => {
                let path = self.paths[key.expect("judged a key of ours")] as usize;
                self.lateness[path].record(lateness);
                if let Some(server_lateness) = server_lateness {
                    self.server_lateness[path].record(server_lateness);
                }
                if matches!(verdict, Verdict::InWindow(_)) {
                    self.counts.in_window += 1;
                } else {
                    self.counts.late += 1;
                }
            }
            Verdict::Early(_) => self.counts.early += 1,
            Verdict::False => self.counts.false_expirations += 1,
            Verdict::Duplicate => self.counts.duplicates += 1,
            Verdict::Redelivery => self.counts.redeliveries += 1,
            Verdict::Foreign => self.counts.foreign += 1,
        }
        verdict
    }

    fn judge(&mut self, key: Option<usize>, webhook_id: &str, at: Instant) -> Verdict {
        let Some(key) = key.filter(|&key| key < self.keys.len()) else {
            return Verdict::Foreign;
        };
        if !self.seen_ids.insert(webhook_id.to_owned()) {
            return Verdict::Redelivery;
        }
        let spec = self.spec(key);
        let state = &mut self.keys[key];
        state.expiries += 1;
        let (true, Some(sent)) = (state.stopped, state.last_acked_send) else {
            return Verdict::False;
        };
        if state.expiries > 1 {
            return Verdict::Duplicate;
        }
        let deadline = sent + spec.ttl;
        if at < deadline {
            return Verdict::Early(deadline - at);
        }
        let lateness = at - deadline;
        if lateness <= spec.grace {
            Verdict::InWindow(lateness)
        } else {
            Verdict::Late(lateness)
        }
    }

    /// The counts as of `now`: stopped keys with no expiry are `missing` once their window has
    /// closed, `pending` before.
    pub fn counts(&self, now: Instant) -> Counts {
        let mut counts = self.counts;
        for (key, state) in self.keys.iter().enumerate() {
            if !state.stopped || state.expiries > 0 {
                continue;
            }
            let Some(sent) = state.last_acked_send else {
                continue; // stopped before it was ever registered: nothing to expire
            };
            let spec = self.spec(key);
            if now > sent + spec.ttl + spec.grace {
                counts.missing += 1;
            } else {
                counts.pending += 1;
            }
        }
        counts
    }

    pub fn lateness(&self, path: Path) -> Summary {
        self.lateness[path as usize].summary()
    }

    /// The lateness the server reported for `path`'s expiries in the window or late.
    pub fn server_lateness(&self, path: Path) -> Summary {
        self.server_lateness[path as usize].summary()
    }
}

/// The soak's settings.
#[derive(Clone, Debug)]
pub struct Settings {
    pub address: String,
    pub keys: u64,
    pub duration: Duration,
    pub wheel: PathSpec,
    pub heap: PathSpec,
    /// Share of keys on the heap path.
    pub heap_fraction: f64,
    /// Share of keys that stop heartbeating at a random time.
    pub stop_fraction: f64,
    pub connections: usize,
    pub prefix: String,
    pub seed: u64,
}

/// What a soak measured.
#[derive(Debug, serde::Serialize)]
pub struct Outcome {
    pub counts: Counts,
    pub heartbeats_sent: u64,
    pub heartbeats_failed: u64,
    /// Latest the scheduler sent a heartbeat after it was due (a late client can cause a real
    /// expiry; this tells whether the client was the cause).
    pub max_schedule_lag_ms: f64,
    pub wheel_lateness: Summary,
    pub heap_lateness: Summary,
    pub wheel_server_lateness: Summary,
    pub heap_server_lateness: Summary,
}

/// How often the scheduler looks for due heartbeats.
const TICK: Duration = Duration::from_millis(20);
const BATCH: usize = 1000;

/// Key `i`'s path: the first `heap_fraction` of the keys are on the heap.
fn path_of(settings: &Settings, key: u64) -> Path {
    if (key as f64) < settings.heap_fraction * settings.keys as f64 {
        Path::Heap
    } else {
        Path::Wheel
    }
}

/// When each key stops, if it does: uniformly in the part of the run that leaves time for its
/// window to close before the end, and never before its first heartbeat (due within one
/// interval, TTL/3, of the start).
fn stop_plan(
    settings: &Settings,
    rng: &mut fastrand::Rng,
) -> Result<Vec<Option<Duration>>, String> {
    let longest_ttl = settings.wheel.ttl.max(settings.heap.ttl);
    let tail = longest_ttl + settings.wheel.grace.max(settings.heap.grace) + Duration::from_secs(3);
    let first = (settings.duration / 20).max(longest_ttl);
    if settings.duration <= first + tail {
        return Err(format!(
            "the soak must be longer than {:?} so that stopped keys' windows close before its end",
            first + tail
        ));
    }
    let span = (settings.duration - tail - first).as_millis() as u64;
    Ok((0..settings.keys)
        .map(|_| {
            (rng.f64() < settings.stop_fraction)
                .then(|| first + Duration::from_millis(rng.u64(0..=span)))
        })
        .collect())
}

/// Runs a soak against the server at `settings.address`, whose webhooks go to the receiver
/// that delivered `arrivals`.
pub async fn run(
    settings: Settings,
    mut arrivals: tokio::sync::mpsc::UnboundedReceiver<crate::receiver::Arrival>,
) -> Result<Outcome, String> {
    let mut rng = fastrand::Rng::with_seed(settings.seed);
    let paths: Vec<Path> = (0..settings.keys)
        .map(|key| path_of(&settings, key))
        .collect();
    let stops = stop_plan(&settings, &mut rng)?;
    let ledger = Arc::new(Mutex::new(Ledger::new(
        [settings.wheel, settings.heap],
        paths.clone(),
    )));

    let listener = {
        let ledger = Arc::clone(&ledger);
        let prefix = settings.prefix.clone();
        tokio::spawn(async move {
            while let Some(arrival) = arrivals.recv().await {
                // Anything but an expiry of one of our keys is counted as foreign.
                let key = workload::key_index(&arrival.key, &prefix)
                    .filter(|_| arrival.kind == crate::receiver::EXPIRED)
                    .map(|key| key as usize);
                let server_lateness = arrival.lateness_ms.map(Duration::from_millis);
                ledger
                    .lock()
                    .expired(key, &arrival.id, arrival.at, server_lateness);
            }
        })
    };

    // The scheduler and its connections run on a thread of their own: the webhook receiver on
    // the tool's main runtime stamps each arrival, and a busy shared event loop would stamp
    // them late (and send heartbeats late, which can cause real expiries).
    let sender = crate::driver::sender_runtime("soak-sender")?;
    let sending = sender.spawn(schedule(
        settings.clone(),
        paths,
        stops,
        Arc::clone(&ledger),
        rng,
    ));
    let sent = sending.await.map_err(|error| error.to_string());
    sender.shutdown_background();
    let Sent {
        heartbeats: sent,
        failed,
        max_lag,
    } = sent??;
    // Deliveries of the last stopped keys are in the receiver's queue by now (every window
    // closed before the end); give the queue a moment to drain.
    tokio::time::sleep(Duration::from_millis(500)).await;
    listener.abort();
    let ledger = ledger.lock();
    Ok(Outcome {
        counts: ledger.counts(Instant::now()),
        heartbeats_sent: sent,
        heartbeats_failed: failed,
        max_schedule_lag_ms: crate::stats::ms(max_lag),
        wheel_lateness: ledger.lateness(Path::Wheel),
        heap_lateness: ledger.lateness(Path::Heap),
        wheel_server_lateness: ledger.server_lateness(Path::Wheel),
        heap_server_lateness: ledger.server_lateness(Path::Heap),
    })
}

/// What the scheduler sent.
struct Sent {
    heartbeats: u64,
    failed: u64,
    /// Latest the scheduler handed out a heartbeat after it was due.
    max_lag: Duration,
}

/// Sends every key's heartbeats on schedule, over `settings.connections` connections, until
/// the soak's end; a key stops at its planned time (the ledger is told).
async fn schedule(
    settings: Settings,
    paths: Vec<Path>,
    stops: Vec<Option<Duration>>,
    ledger: Arc<Mutex<Ledger>>,
    mut rng: fastrand::Rng,
) -> Result<Sent, String> {
    let (batches, batch_queue) = tokio::sync::mpsc::unbounded_channel::<Vec<u32>>();
    let batch_queue = Arc::new(tokio::sync::Mutex::new(batch_queue));
    let senders: Vec<_> = (0..settings.connections)
        .map(|_| {
            tokio::spawn(send_batches(
                settings.clone(),
                paths.clone(),
                Arc::clone(&batch_queue),
                Arc::clone(&ledger),
            ))
        })
        .collect();

    let interval_of = |key: usize| match paths[key] {
        Path::Wheel => settings.wheel.ttl / 3,
        Path::Heap => settings.heap.ttl / 3,
    };
    let mut due: BinaryHeap<Reverse<(Duration, u32)>> = (0..settings.keys as usize)
        .map(|key| {
            let phase = interval_of(key).as_millis() as u64;
            Reverse((Duration::from_millis(rng.u64(0..phase.max(1))), key as u32))
        })
        .collect();
    let started = Instant::now();
    let mut max_lag = Duration::ZERO;
    let mut ticks = tokio::time::interval(TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let elapsed = started.elapsed();
        if elapsed >= settings.duration {
            break;
        }
        let mut batch = Vec::with_capacity(BATCH);
        while let Some(&Reverse((when, key))) = due.peek() {
            if when > elapsed {
                break;
            }
            due.pop();
            max_lag = max_lag.max(elapsed - when);
            let key_index = key as usize;
            if stops[key_index].is_some_and(|stop| when >= stop) {
                ledger.lock().stop(key_index);
                continue;
            }
            batch.push(key);
            due.push(Reverse((when + interval_of(key_index), key)));
            if batch.len() == BATCH {
                let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
                let _ = batches.send(full);
            }
        }
        if !batch.is_empty() {
            let _ = batches.send(batch);
        }
    }
    drop(batches);
    let (mut heartbeats, mut failed) = (0, 0);
    for sender in senders {
        let (s, f) = sender.await.map_err(|error| error.to_string())??;
        heartbeats += s;
        failed += f;
    }
    Ok(Sent {
        heartbeats,
        failed,
        max_lag,
    })
}

/// One connection sending the scheduler's batches; returns (heartbeats sent, failed).
async fn send_batches(
    settings: Settings,
    paths: Vec<Path>,
    queue: Arc<tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<Vec<u32>>>>,
    ledger: Arc<Mutex<Ledger>>,
) -> Result<(u64, u64), String> {
    let mut conn = Conn::connect(&settings.address)
        .await
        .map_err(|error| format!("cannot connect to {}: {error}", settings.address))?;
    let ttl_of = |key: u32| match paths[key as usize] {
        Path::Wheel => Ttl(settings.wheel.ttl),
        Path::Heap => Ttl(settings.heap.ttl),
    };
    let (mut sent, mut failed) = (0, 0);
    let mut body = Vec::new();
    loop {
        let Some(batch) = queue.lock().await.recv().await else {
            return Ok((sent, failed));
        };
        body.clear();
        workload::write_batch(
            &mut body,
            &settings.prefix,
            batch.iter().map(|&key| (u64::from(key), ttl_of(key))),
        );
        let request = crate::wire::post_json(
            &settings.address,
            "/v1/heartbeats/batch?results=errors",
            &body,
        );
        let sent_at = Instant::now();
        let response = conn
            .exchange(&request)
            .await
            .map_err(|error| format!("batch request failed: {error}"))?;
        if response.status != 200 {
            return Err(format!(
                "batch answered {}: {}",
                response.status,
                String::from_utf8_lossy(response.body)
            ));
        }
        let failures: HashSet<usize> = workload::failed_positions(response.body)?
            .into_iter()
            .collect();
        let mut ledger = ledger.lock();
        for (position, &key) in batch.iter().enumerate() {
            if failures.contains(&position) {
                failed += 1;
            } else {
                ledger.acked(key as usize, sent_at);
            }
        }
        sent += batch.len() as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPECS: [PathSpec; 2] = [
        PathSpec {
            ttl: Duration::from_secs(6),
            grace: Duration::from_millis(1050),
        },
        PathSpec {
            ttl: Duration::from_millis(4500),
            grace: Duration::from_millis(20),
        },
    ];

    fn ledger() -> (Ledger, Instant) {
        (
            Ledger::new(SPECS, vec![Path::Wheel, Path::Heap, Path::Wheel]),
            Instant::now(),
        )
    }

    #[test]
    fn a_stopped_key_that_expires_once_in_its_window_is_clean() {
        let (mut ledger, t0) = ledger();
        ledger.acked(0, t0);
        ledger.acked(0, t0 + Duration::from_secs(2));
        ledger.stop(0);
        let at = t0 + Duration::from_millis(8_700);
        assert_eq!(
            ledger.expired(Some(0), "m1", at, None),
            Verdict::InWindow(Duration::from_millis(700))
        );
        let counts = ledger.counts(at);
        assert!(counts.clean(), "{counts:?}");
        assert_eq!((counts.stopped, counts.in_window), (1, 1));
        assert_eq!(ledger.lateness(Path::Wheel).count, 1);
    }

    #[test]
    fn an_expiry_of_a_live_key_is_false_even_if_late_enough() {
        let (mut ledger, t0) = ledger();
        ledger.acked(1, t0);
        assert_eq!(
            ledger.expired(Some(1), "m1", t0 + Duration::from_secs(60), None),
            Verdict::False
        );
        // A key that never got a heartbeat acknowledged cannot expire either.
        ledger.stop(2);
        assert_eq!(ledger.expired(Some(2), "m2", t0, None), Verdict::False);
        assert_eq!(ledger.counts(t0).false_expirations, 2);
        assert!(!ledger.counts(t0).clean());
    }

    #[test]
    fn early_late_duplicate_and_redelivered_expiries_are_told_apart() {
        let (mut ledger, t0) = ledger();
        ledger.acked(1, t0);
        ledger.stop(1);
        // Heap path: deadline t0 + 4.5 s, grace 20 ms.
        let early = ledger.expired(Some(1), "m1", t0 + Duration::from_millis(4_499), None);
        assert_eq!(early, Verdict::Early(Duration::from_millis(1)));
        assert_eq!(
            ledger.expired(Some(1), "m1", t0 + Duration::from_secs(5), None),
            Verdict::Redelivery
        );
        assert_eq!(
            ledger.expired(Some(1), "m2", t0 + Duration::from_secs(5), None),
            Verdict::Duplicate
        );
        ledger.acked(0, t0);
        ledger.stop(0);
        let late = ledger.expired(Some(0), "m3", t0 + Duration::from_millis(7_051), None);
        assert_eq!(late, Verdict::Late(Duration::from_millis(1_051)));
        assert_eq!(ledger.expired(None, "m4", t0, None), Verdict::Foreign);
        assert_eq!(ledger.expired(Some(99), "m5", t0, None), Verdict::Foreign);
        let counts = ledger.counts(t0);
        assert_eq!(
            (
                counts.early,
                counts.redeliveries,
                counts.duplicates,
                counts.late,
                counts.foreign
            ),
            (1, 1, 1, 1, 2)
        );
    }

    #[test]
    fn a_stopped_key_with_no_expiry_is_pending_then_missing() {
        let (mut ledger, t0) = ledger();
        ledger.acked(1, t0);
        ledger.stop(1);
        assert_eq!(ledger.counts(t0 + Duration::from_millis(4_520)).pending, 1);
        let after = ledger.counts(t0 + Duration::from_millis(4_521));
        assert_eq!((after.pending, after.missing), (0, 1));
        assert!(!after.clean());
    }

    #[test]
    fn only_the_latest_acknowledged_send_counts() {
        let (mut ledger, t0) = ledger();
        // Acknowledgements can arrive out of order across connections.
        ledger.acked(1, t0 + Duration::from_millis(1_500));
        ledger.acked(1, t0);
        ledger.stop(1);
        let at = t0 + Duration::from_millis(4_600);
        assert!(matches!(
            ledger.expired(Some(1), "m", at, None),
            Verdict::Early(_)
        ));
    }

    #[test]
    fn stop_times_leave_every_window_time_to_close() {
        let settings = Settings {
            address: String::new(),
            keys: 10_000,
            duration: Duration::from_secs(60),
            wheel: SPECS[0],
            heap: SPECS[1],
            heap_fraction: 0.5,
            stop_fraction: 0.1,
            connections: 1,
            prefix: "s-".into(),
            seed: 1,
        };
        let plan = stop_plan(&settings, &mut fastrand::Rng::with_seed(7)).unwrap();
        let stops: Vec<Duration> = plan.iter().flatten().copied().collect();
        assert!((800..1200).contains(&stops.len()), "{}", stops.len());
        let latest_window_end = Duration::from_secs(6) + Duration::from_millis(1050);
        assert!(stops
            .iter()
            .all(|&stop| stop >= Duration::from_secs(6)
                && stop + latest_window_end < settings.duration));
        assert_eq!(path_of(&settings, 0), Path::Heap);
        assert_eq!(path_of(&settings, 9_999), Path::Wheel);
        let short = Settings {
            duration: Duration::from_secs(15),
            ..settings
        };
        assert!(stop_plan(&short, &mut fastrand::Rng::with_seed(7)).is_err());
    }
}
