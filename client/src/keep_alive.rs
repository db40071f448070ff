//! Keep-alive: keys the client heartbeats for their owner until told to stop.
//!
//! [`Client::keep_alive`](crate::Client::keep_alive) registers a key and returns a
//! [`KeepAliveHandle`]. Every key of one client is heartbeated by one task, the *batcher*,
//! which sends due heartbeats together in `POST /v1/heartbeats/batch` requests (at most
//! [`MAX_BATCH`] items and [`MAX_BATCH_BYTES`] each): a process with a thousand keys sends
//! a few requests a second, not a thousand.
//!
//! The rules (the timing ones are pure functions in [`crate::backoff`]):
//! - a key heartbeats every TTL/3 by default ([`KeepAlive::interval`] to change it, never above
//!   TTL/2), each wait shortened by up to 20% at random, per key, so keys drift apart;
//! - a key due within [`COALESCE`] (or an eighth of its interval, if less) of another that is
//!   due goes in the same request: a heartbeat a little early costs nothing;
//! - a failed request (no answer, 502/503/504) is retried for each of its keys after a backoff
//!   with jitter, on the next endpoint, capped at half the key's interval, so several retries
//!   fit before the key's deadline; retries go on after the deadline too (the key may come
//!   back), and the handle says the key was lost;
//! - a heartbeat answered `created: true` for a key that was registered means the server had
//!   lost it (it expired, or was deleted elsewhere, or another endpoint never had it): the
//!   handle reports [`Loss::Recreated`], and the key is alive again (that heartbeat
//!   registered it again);
//! - the batcher sends one request at a time and handles commands between requests, so once
//!   [`KeepAliveHandle::shutdown`] has been acknowledged no heartbeat of the key is in flight,
//!   and its `DELETE` cannot be overtaken by one.
//!
//! Deliberately absent: one task per key (thousands of timers and connections), and giving up
//! on a key (only its owner stops it: a registry that was down for a minute must find every
//! live service heartbeating again when it comes back).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use serde::Deserialize;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::backoff;
use crate::error::{Error, ErrorDetail};
use crate::model::{ttl_ms, Heartbeat, HeartbeatOutcome};
use crate::transport::{Attempt, Call, Transport};

/// Most heartbeats in one batch request (the API's limit).
pub const MAX_BATCH: usize = 1000;

/// Most bytes of one batch request's body: under the API's 1 MiB limit with room for the
/// envelope (a thousand keys with 4 KiB of metadata each would not fit in one).
pub const MAX_BATCH_BYTES: usize = 900 * 1024;

/// How early a key may be heartbeated to join a request that goes anyway.
pub const COALESCE: Duration = Duration::from_millis(250);

/// The first retry's delay; retries double from it up to half the key's interval.
pub const RETRY_BASE: Duration = Duration::from_millis(100);

/// The shortest time limit of a batch request: below it a loaded server's answers would be
/// counted as failures.
const MIN_BATCH_TIMEOUT: Duration = Duration::from_millis(200);

/// What to keep alive, and how.
#[derive(Clone, Debug)]
pub struct KeepAlive {
    /// The key's TTL: it expires this long after the last heartbeat that reached the server.
    pub ttl: Duration,
    /// The key's service.
    pub service: Option<String>,
    /// The key's metadata (a JSON object up to 4 KiB), sent with every heartbeat so that a key
    /// registered again has it.
    pub meta: Option<serde_json::Value>,
    /// How often to heartbeat; `None`: TTL/3. Never above TTL/2.
    pub interval: Option<Duration>,
}

impl Default for KeepAlive {
    /// A 30 s TTL, no service, no metadata, heartbeats every 10 s.
    fn default() -> Self {
        Self::ttl(Duration::from_secs(30))
    }
}

impl KeepAlive {
    /// A key with `ttl`.
    pub fn ttl(ttl: Duration) -> Self {
        Self {
            ttl,
            service: None,
            meta: None,
            interval: None,
        }
    }

    /// With a service.
    pub fn service(mut self, service: impl Into<String>) -> Self {
        self.service = Some(service.into());
        self
    }

    /// With metadata (a JSON object).
    pub fn meta(mut self, meta: serde_json::Value) -> Self {
        self.meta = Some(meta);
        self
    }

    /// Heartbeats every `interval` (clamped to TTL/2).
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = Some(interval);
        self
    }

    /// The interval it heartbeats at.
    pub fn effective_interval(&self) -> Duration {
        backoff::heartbeat_interval(self.ttl, self.interval)
    }
}

/// Why a key was lost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Loss {
    /// A heartbeat created the key again: the server had lost it (it expired, was deleted
    /// elsewhere, or the endpoint that answered never had it). It is alive again.
    Recreated,
    /// No heartbeat got through before the key's deadline: the server has expired it, or will
    /// have by the time it hears from the client. Heartbeats go on, and register it again.
    DeadlinePassed,
}

/// Where a key stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// The last heartbeat was accepted.
    Alive,
    /// The last heartbeat failed; the deadline has not passed yet.
    Retrying,
    /// The deadline passed without a heartbeat getting through; retries go on.
    Lost,
    /// The handle stopped heartbeating (shut down or dropped).
    Stopped,
}

/// A keep-alive's state, as its handle sees it.
#[derive(Clone, Debug)]
pub struct Status {
    /// Where the key stands.
    pub liveness: Liveness,
    /// How often it was lost so far.
    pub losses: u64,
    /// Why it was last lost.
    pub last_loss: Option<Loss>,
    /// Heartbeats accepted so far (the registration included).
    pub accepted: u64,
    /// The last failure, until a heartbeat is accepted again.
    pub last_error: Option<String>,
    /// When the key expires if no heartbeat gets through, as the client reckons it (measured
    /// from when the last accepted heartbeat was sent, so never later than the server's).
    pub deadline: Option<Instant>,
}

impl Status {
    /// Before the first heartbeat is accepted: retrying, nothing lost or accepted yet.
    fn registering() -> Self {
        Self {
            liveness: Liveness::Retrying,
            losses: 0,
            last_loss: None,
            accepted: 0,
            last_error: None,
            deadline: None,
        }
    }
}

/// The owner's end of a kept-alive key.
///
/// Dropping it stops the heartbeats without deleting the key, which then expires after its
/// TTL (as if the process had died); [`KeepAliveHandle::shutdown`] deregisters it at once.
#[derive(Debug)]
pub struct KeepAliveHandle {
    /// The batcher's id of the key.
    id: u64,
    /// The key.
    key: String,
    /// The key's state, published by the batcher.
    status: watch::Receiver<Status>,
    /// Losses already returned by [`KeepAliveHandle::lost`].
    losses_seen: u64,
    /// The batcher's command queue.
    commands: mpsc::UnboundedSender<Command>,
    /// For the final `DELETE`.
    client: crate::Client,
    /// Whether `shutdown` ran (so `Drop` has nothing left to do).
    stopped: bool,
}

impl KeepAliveHandle {
    /// The key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The key's state now.
    pub fn status(&self) -> Status {
        self.status.borrow().clone()
    }

    /// A receiver of every change of the key's state.
    pub fn watch(&self) -> watch::Receiver<Status> {
        self.status.clone()
    }

    /// Waits until the key is lost (a loss since the last call, or the next one) and says why.
    /// Several losses between two calls are reported once, with the last reason; `Status`
    /// counts them all. [`Error::Stopped`] if the keep-alive task is gone.
    pub async fn lost(&mut self) -> Result<Loss, Error> {
        loop {
            {
                let status = self.status.borrow_and_update();
                if status.losses > self.losses_seen {
                    self.losses_seen = status.losses;
                    return Ok(status
                        .last_loss
                        .clone()
                        .expect("a counted loss has a reason"));
                }
            }
            self.status.changed().await.map_err(|_| Error::Stopped)?;
        }
    }

    /// Stops heartbeating and deletes the key (a clean deregistration: subscribers see a
    /// `deleted` event, not an `expired` one). A key already gone is not an error.
    pub async fn shutdown(mut self) -> Result<(), Error> {
        self.stopped = true;
        let (done, stopped) = oneshot::channel();
        if self
            .commands
            .send(Command::Remove {
                id: self.id,
                done: Some(done),
            })
            .is_ok()
        {
            // The batcher acknowledges between requests: no heartbeat of the key is in flight.
            let _ = stopped.await;
        }
        match self.client.delete(&self.key).await {
            Ok(_) => Ok(()),
            Err(error) if error.is_not_found() => Ok(()),
            Err(error) => Err(error),
        }
    }
}

impl Drop for KeepAliveHandle {
    fn drop(&mut self) {
        if !self.stopped {
            let _ = self.commands.send(Command::Remove {
                id: self.id,
                done: None,
            });
        }
    }
}

/// Where a registration's first answer goes: the heartbeat's answer and the key's status.
type Registered = oneshot::Sender<Result<(HeartbeatOutcome, watch::Receiver<Status>), Error>>;

/// What the batcher is told.
#[derive(Debug)]
pub(crate) enum Command {
    /// Keep a key alive; its first heartbeat's answer goes to `first`.
    Add {
        id: u64,
        key: String,
        options: KeepAlive,
        first: Registered,
    },
    /// Stop a key; `done` is told once no heartbeat of it is in flight.
    Remove {
        id: u64,
        done: Option<oneshot::Sender<()>>,
    },
}

/// The batcher's side of a key.
#[derive(Debug)]
struct Entry {
    /// The key (for logs).
    key: String,
    /// The heartbeat as one JSON item of a batch, encoded once.
    item: Vec<u8>,
    /// Its heartbeat interval (clamped), before jitter.
    interval: Duration,
    /// When its next heartbeat is due.
    due: Instant,
    /// When it expires without a heartbeat (from the last accepted one's send time); `None`
    /// before the first.
    deadline: Option<Instant>,
    /// Failures since the last accepted heartbeat.
    failures: u32,
    /// Whether the current failure spell was reported as a loss (the deadline passed).
    lost: bool,
    /// The registration's caller, until its first heartbeat settles.
    first: Option<Registered>,
    /// Published state.
    status: watch::Sender<Status>,
}

impl Entry {
    fn update(&self, change: impl FnOnce(&mut Status)) {
        self.status.send_modify(change);
    }
}

/// The keys to send now: every key due by `now`, plus those due within the coalescing window
/// (`COALESCE`, or an eighth of the key's interval if less), earliest first, split into
/// requests of at most [`MAX_BATCH`] items and [`MAX_BATCH_BYTES`]. Pure: given the keys'
/// `(id, due, interval, item length)` and `now`.
pub(crate) fn plan_batches(
    keys: impl Iterator<Item = (u64, Instant, Duration, usize)>,
    now: Instant,
) -> Vec<Vec<u64>> {
    let mut chosen: Vec<(Instant, u64, usize)> = keys
        .filter(|&(_, due, interval, _)| due <= now + COALESCE.min(interval / 8))
        .map(|(id, due, _, len)| (due, id, len))
        .collect();
    chosen.sort_unstable();
    let mut batches: Vec<Vec<u64>> = Vec::new();
    let mut bytes = 0;
    for (_, id, len) in chosen {
        let full = batches
            .last()
            .is_none_or(|batch| batch.len() == MAX_BATCH || bytes + len + 1 > MAX_BATCH_BYTES);
        if full {
            batches.push(Vec::new());
            bytes = 0;
        }
        bytes += len + 1;
        batches.last_mut().expect("pushed above").push(id);
    }
    batches
}

/// The batch answer (`results`: each item's answer or error, in order).
#[derive(Debug, Deserialize)]
struct BatchAnswer {
    /// One per item, in order.
    results: Vec<BatchItem>,
}

/// One item's result: its error (`{"error": ...}`), or the heartbeat's answer.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum BatchItem {
    Failed { error: ErrorDetail },
    Accepted(HeartbeatOutcome),
}

/// The batcher: owns every kept-alive key of one client. Runs until every handle and the
/// client are dropped.
pub(crate) async fn run(transport: Arc<Transport>, mut commands: mpsc::UnboundedReceiver<Command>) {
    let mut keys: HashMap<u64, Entry> = HashMap::new();
    loop {
        let wake = next_wake(&keys);
        tokio::select! {
            command = commands.recv() => match command {
                Some(command) => apply(&mut keys, command),
                None => return,
            },
            () = sleep_until(wake) => {
                let now = Instant::now();
                mark_lost(&mut keys, now);
                let plan = plan_batches(
                    keys.iter().map(|(id, entry)| (*id, entry.due, entry.interval, entry.item.len())),
                    now,
                );
                for batch in plan {
                    send_batch(&transport, &mut keys, &batch).await;
                    // Commands (a shutdown waiting for its acknowledgement) between requests.
                    while let Ok(command) = commands.try_recv() {
                        apply(&mut keys, command);
                    }
                }
            }
        }
    }
}

/// Sleeps until `wake`, or forever when there is nothing to wait for.
async fn sleep_until(wake: Option<Instant>) {
    match wake {
        Some(wake) => tokio::time::sleep_until(wake).await,
        None => std::future::pending().await,
    }
}

/// When the batcher must next act: the earliest due heartbeat, or the earliest deadline of a
/// failing key not yet reported lost.
fn next_wake(keys: &HashMap<u64, Entry>) -> Option<Instant> {
    keys.values()
        .flat_map(|entry| {
            let deadline = (entry.failures > 0 && !entry.lost)
                .then_some(entry.deadline)
                .flatten();
            [Some(entry.due), deadline]
        })
        .flatten()
        .min()
}

fn apply(keys: &mut HashMap<u64, Entry>, command: Command) {
    match command {
        Command::Add {
            id,
            key,
            options,
            first,
        } => {
            let heartbeat = Heartbeat {
                key: key.clone(),
                ttl_ms: Some(ttl_ms(options.ttl)),
                service: options.service.clone(),
                meta: options.meta.clone(),
            };
            let item = serde_json::to_vec(&heartbeat).expect("a heartbeat serializes to JSON");
            let (status, _) = watch::channel(Status::registering());
            keys.insert(
                id,
                Entry {
                    key,
                    item,
                    interval: options.effective_interval(),
                    due: Instant::now(),
                    deadline: None,
                    failures: 0,
                    lost: false,
                    first: Some(first),
                    status,
                },
            );
        }
        Command::Remove { id, done } => {
            if let Some(entry) = keys.remove(&id) {
                entry.update(|status| status.liveness = Liveness::Stopped);
            }
            if let Some(done) = done {
                let _ = done.send(());
            }
        }
    }
}

/// Reports every failing key whose deadline has passed as lost (once per failure spell).
fn mark_lost(keys: &mut HashMap<u64, Entry>, now: Instant) {
    for entry in keys.values_mut() {
        let passed = entry.deadline.is_some_and(|deadline| deadline <= now);
        if entry.failures > 0 && passed && !entry.lost {
            entry.lost = true;
            tracing::warn!(key = %entry.key, "kept-alive key lost: no heartbeat got through before its deadline");
            entry.update(|status| {
                status.liveness = Liveness::Lost;
                status.losses += 1;
                status.last_loss = Some(Loss::DeadlinePassed);
            });
        }
    }
}

/// Sends one batch of `ids` and settles each key with its result.
async fn send_batch(transport: &Transport, keys: &mut HashMap<u64, Entry>, planned: &[u64]) {
    // A key removed since the plan was made is not sent.
    let ids: Vec<u64> = planned
        .iter()
        .copied()
        .filter(|id| keys.contains_key(id))
        .collect();
    if ids.is_empty() {
        return;
    }
    let mut body = b"{\"heartbeats\":[".to_vec();
    let mut shortest = Duration::MAX;
    for (n, entry) in ids.iter().filter_map(|id| keys.get(id)).enumerate() {
        if n > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&entry.item);
        shortest = shortest.min(entry.interval);
    }
    body.extend_from_slice(b"]}");
    let mut call = Call::new(Method::POST, "/v1/heartbeats/batch".to_owned());
    call.body = Some(body);
    call.timeout = Some(
        transport
            .request_timeout
            .min(shortest.max(MIN_BATCH_TIMEOUT)),
    );
    let sent_at = Instant::now();
    let outcome = match transport.send_once(&call).await {
        Attempt::Settled(Ok(answer)) => match answer.json::<BatchAnswer>() {
            Ok(parsed) if parsed.results.len() == ids.len() => Sent::Answered(parsed.results),
            Ok(parsed) => Sent::Failed(format!(
                "{} results for {} heartbeats",
                parsed.results.len(),
                ids.len()
            )),
            Err(error) => Sent::Failed(error.to_string()),
        },
        // The whole request was refused (401, 403...): every key failed alike.
        Attempt::Settled(Err(error)) => Sent::Refused(error),
        Attempt::Retry(retry) => Sent::Failed(retry.why),
    };
    match outcome {
        Sent::Answered(results) => {
            for (id, result) in ids.iter().zip(results) {
                let Some(entry) = keys.get_mut(id) else {
                    continue;
                };
                match result {
                    BatchItem::Accepted(answer) => accepted(entry, answer, sent_at),
                    BatchItem::Failed { error } => {
                        let error = error.into_error(400);
                        if let Some(first) = entry.first.take() {
                            // A registration the server refuses (a bad key, no right to it):
                            // the caller gets the error and the key is not kept.
                            let _ = first.send(Err(error));
                            keys.remove(id);
                        } else {
                            failed(entry, error.to_string(), sent_at, transport);
                        }
                    }
                }
            }
        }
        Sent::Refused(error) => {
            let why = error.to_string();
            for id in &ids {
                let Some(entry) = keys.get_mut(id) else {
                    continue;
                };
                if let Some(first) = entry.first.take() {
                    let _ = first.send(Err(error.clone()));
                    keys.remove(id);
                } else {
                    failed(entry, why.clone(), sent_at, transport);
                }
            }
        }
        Sent::Failed(why) => {
            let attempts = transport.retry.attempts_for(transport.endpoints().len());
            for id in &ids {
                let Some(entry) = keys.get_mut(id) else {
                    continue;
                };
                failed(entry, why.clone(), sent_at, transport);
                if entry.first.is_some() && entry.failures >= attempts {
                    // A registration that never got through: the caller decides what next.
                    let first = entry.first.take().expect("checked above");
                    let _ = first.send(Err(Error::Unavailable {
                        failures: vec![why.clone()],
                    }));
                    keys.remove(id);
                }
            }
        }
    }
}

/// How a batch request ended.
enum Sent {
    /// One result per item.
    Answered(Vec<BatchItem>),
    /// The server refused the whole request (a 4xx).
    Refused(Error),
    /// No answer (or an unreadable one): retry.
    Failed(String),
}

/// A key's heartbeat was accepted.
fn accepted(entry: &mut Entry, answer: HeartbeatOutcome, sent_at: Instant) {
    let deadline = sent_at + Duration::from_millis(answer.expires_in_ms);
    entry.deadline = Some(deadline);
    entry.due = sent_at + backoff::jittered(entry.interval, fastrand::f64());
    entry.failures = 0;
    let was_lost = std::mem::take(&mut entry.lost);
    let recreated = answer.created && entry.first.is_none() && !was_lost;
    if recreated {
        tracing::warn!(key = %entry.key, "kept-alive key lost: the server had forgotten it; registered again");
    }
    entry.update(|status| {
        status.liveness = Liveness::Alive;
        status.accepted += 1;
        status.last_error = None;
        status.deadline = Some(deadline);
        if recreated {
            status.losses += 1;
            status.last_loss = Some(Loss::Recreated);
        }
    });
    if let Some(first) = entry.first.take() {
        let _ = first.send(Ok((answer, entry.status.subscribe())));
    }
}

/// A key's heartbeat failed: retry after a backoff, on the next endpoint (the transport has
/// moved its preference already).
fn failed(entry: &mut Entry, why: String, sent_at: Instant, transport: &Transport) {
    entry.failures += 1;
    let cap = (entry.interval / 2).max(RETRY_BASE);
    let delay = backoff::retry_delay(entry.failures, RETRY_BASE, cap, fastrand::f64());
    entry.due = sent_at.max(Instant::now()) + delay;
    tracing::debug!(key = %entry.key, failures = entry.failures, %why, retry_in = ?delay, endpoints = transport.endpoints().len(), "heartbeat failed");
    let lost = entry.lost;
    entry.update(|status| {
        if !lost {
            status.liveness = Liveness::Retrying;
        }
        status.last_error = Some(why);
    });
}

/// Starts a handle for `key` on the batcher behind `commands` and waits for its registration.
pub(crate) async fn start(
    client: crate::Client,
    commands: mpsc::UnboundedSender<Command>,
    id: u64,
    key: String,
    options: KeepAlive,
) -> Result<(KeepAliveHandle, HeartbeatOutcome), Error> {
    let (first, registered) = oneshot::channel();
    commands
        .send(Command::Add {
            id,
            key: key.clone(),
            options,
            first,
        })
        .map_err(|_| Error::Stopped)?;
    let (answer, status) = registered.await.map_err(|_| Error::Stopped)??;
    let handle = KeepAliveHandle {
        id,
        key,
        status,
        losses_seen: 0,
        commands,
        client,
        stopped: false,
    };
    Ok((handle, answer))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn due_keys_and_those_due_within_the_window_go_together_earliest_first() {
        let now = Instant::now();
        let second = Duration::from_secs(1);
        let keys = [
            (1, now + 100 * MS, 10 * second, 50), // within 250 ms: joins
            (2, now, 10 * second, 50),            // due
            (3, now + 300 * MS, 10 * second, 50), // past the window
            (4, now + 10 * MS, 40 * MS, 50),      // window 5 ms (interval/8): not yet
            (5, now - 20 * MS, 40 * MS, 50),      // late: first
            (6, now + 4 * MS, 40 * MS, 50),       // within its 5 ms
        ];
        let plan = plan_batches(keys.into_iter(), now);
        assert_eq!(plan, vec![vec![5, 2, 6, 1]]);
        assert!(plan_batches(std::iter::empty(), now).is_empty());
    }

    #[test]
    fn batches_hold_at_most_a_thousand_items_and_fit_the_body_limit() {
        let now = Instant::now();
        let many = (0..2500u64).map(|id| (id, now, Duration::from_secs(10), 40));
        let plan = plan_batches(many, now);
        assert_eq!(
            plan.iter().map(Vec::len).collect::<Vec<_>>(),
            [1000, 1000, 500]
        );
        // 4 KiB of metadata each: the byte limit splits first.
        let heavy = (0..1000u64).map(|id| (id, now, Duration::from_secs(10), 4400));
        let plan = plan_batches(heavy, now);
        for batch in &plan {
            assert!(batch.len() * 4401 <= MAX_BATCH_BYTES, "{}", batch.len());
        }
        assert_eq!(plan.iter().map(Vec::len).sum::<usize>(), 1000);
        assert_eq!(plan.len(), 5);
    }

    #[test]
    fn keep_alive_options_clamp_the_interval() {
        let ttl = Duration::from_secs(30);
        assert_eq!(
            KeepAlive::ttl(ttl).effective_interval(),
            Duration::from_secs(10)
        );
        assert_eq!(
            KeepAlive::ttl(ttl)
                .interval(Duration::from_secs(29))
                .effective_interval(),
            Duration::from_secs(15)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_key_is_reported_lost_once_its_deadline_passes_and_not_before() {
        let (status, mut seen) = watch::channel(Status {
            liveness: Liveness::Alive,
            losses: 0,
            last_loss: None,
            accepted: 1,
            last_error: None,
            deadline: None,
        });
        let now = Instant::now();
        let mut keys = HashMap::new();
        keys.insert(
            7,
            Entry {
                key: "k".into(),
                item: Vec::new(),
                interval: Duration::from_secs(1),
                due: now,
                deadline: Some(now + Duration::from_secs(3)),
                failures: 2,
                lost: false,
                first: None,
                status,
            },
        );
        assert_eq!(next_wake(&keys), Some(now));
        keys.get_mut(&7).unwrap().due = now + Duration::from_secs(10);
        assert_eq!(next_wake(&keys), Some(now + Duration::from_secs(3)));
        tokio::time::advance(Duration::from_millis(2999)).await;
        mark_lost(&mut keys, Instant::now());
        assert_eq!(seen.borrow_and_update().losses, 0);
        tokio::time::advance(MS).await;
        mark_lost(&mut keys, Instant::now());
        mark_lost(&mut keys, Instant::now());
        let status = seen.borrow_and_update().clone();
        assert_eq!(status.losses, 1, "reported once");
        assert_eq!(status.liveness, Liveness::Lost);
        assert_eq!(status.last_loss, Some(Loss::DeadlinePassed));
        // Once lost, the deadline no longer wakes the batcher.
        assert_eq!(next_wake(&keys), Some(now + Duration::from_secs(10)));
    }

    #[tokio::test(start_paused = true)]
    async fn an_accepted_heartbeat_sets_the_deadline_and_the_next_due_within_the_interval() {
        let (status, seen) = watch::channel(Status::registering());
        let now = Instant::now();
        let mut entry = Entry {
            key: "k".into(),
            item: Vec::new(),
            interval: Duration::from_secs(10),
            due: now,
            deadline: None,
            failures: 0,
            lost: false,
            first: None,
            status,
        };
        let answer = |created| HeartbeatOutcome {
            key: "k".into(),
            service: None,
            created,
            ttl_ms: 30_000,
            expires_in_ms: 30_000,
            expires_at: String::new(),
            timer: "wheel".into(),
        };
        accepted(&mut entry, answer(false), now);
        assert_eq!(entry.deadline, Some(now + Duration::from_secs(30)));
        assert!(
            entry.due >= now + Duration::from_secs(8) && entry.due <= now + Duration::from_secs(10)
        );
        assert_eq!(seen.borrow().losses, 0);
        // created again: a loss, and alive.
        accepted(&mut entry, answer(true), now);
        assert_eq!(seen.borrow().losses, 1);
        assert_eq!(seen.borrow().last_loss, Some(Loss::Recreated));
        assert_eq!(seen.borrow().liveness, Liveness::Alive);
        // created after a loss already reported (deadline passed): not counted twice.
        entry.lost = true;
        accepted(&mut entry, answer(true), now);
        assert_eq!(seen.borrow().losses, 1);
    }
}
