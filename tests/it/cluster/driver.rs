//! Keep-alive clients for the failover scenarios: each key is heartbeated every TTL/3 on its own
//! schedule, and every attempt is recorded as a [`history::Op`] with its invocation and
//! completion times, for [`history::check_all`].
//!
//! - **Clients**: a [`Driver`] runs a few client tasks, each owning some keys and sending, one
//!   request at a time, the keys due within [`DriverConfig::batch_window`] (a key is sent at
//!   most that early; renewals go before keys not registered yet, so that registering many
//!   keys never delays the renewal of those registered): one key on `POST /v1/heartbeats`, more in one
//!   `POST /v1/heartbeats/batch` (at most [`DriverConfig::max_batch`] items), as the client
//!   crate's batcher does. Client `i` starts on member `i mod n`, so followers forward from
//!   the start.
//! - **Failover**: a client stays on the member that answered; on a refused connection, a
//!   timeout, a 5xx or an item refused with `no_quorum`/`no_leader`, it moves to the next
//!   member and retries those keys after [`DriverConfig::retry_after`].
//! - **What is recorded** (the history's conventions): invocations rounded down and completions
//!   rounded up from one [`Origin`]. A 2xx is `Ok` (`created` says `Created` or `Renewed`); a
//!   4xx that refuses the input, or a connection that was never made, is `Failed`; anything
//!   else (a timeout, a reset, a 5xx, an item's `no_quorum`) is `Unknown`. A 503 is not
//!   `Failed`: a renewal is applied in memory before the second fence check may refuse it,
//!   and a creation answered `no_quorum` after the proposal's timeout may still commit.
//!   Heartbeat answers carry no log index, so `applied_index` is `None`.
//! - **Stopping** ([`Driver::stop`]): each client finishes its request in flight (bounded by
//!   the request timeout) and sends no other; the stop instant is taken after the last one
//!   completed, so no heartbeat of the driver's keys is sent after it.
//! - **Writes** ([`Writer`]): a client that creates keys with a service and a long TTL, deletes
//!   or moves some of them, and reads each write back through another member, recording every
//!   attempt under the same conventions; it says which keys must be present (with which
//!   service) or absent at the end ([`Fate`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::history::{Ms, Op, OpKind, Outcome, Renewal, Stopped};

/// Most heartbeats in one batch request (the API's limit).
pub const MAX_BATCH: usize = 1000;

/// The instant every recorded time counts from, in milliseconds.
#[derive(Clone, Copy, Debug)]
pub struct Origin(Instant);

impl Origin {
    pub fn now() -> Self {
        Self(Instant::now())
    }

    /// `at` in whole milliseconds, rounded down (invocations).
    pub fn floor(&self, at: Instant) -> Ms {
        at.saturating_duration_since(self.0).as_millis() as Ms
    }

    /// `at` in whole milliseconds, rounded up (completions, receptions).
    pub fn ceil(&self, at: Instant) -> Ms {
        let since = at.saturating_duration_since(self.0);
        since.as_nanos().div_ceil(1_000_000) as Ms
    }

    pub fn floor_now(&self) -> Ms {
        self.floor(Instant::now())
    }

    pub fn ceil_now(&self) -> Ms {
        self.ceil(Instant::now())
    }
}

/// A key and the TTL its client asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeySpec {
    pub key: String,
    pub ttl_s: u64,
}

impl KeySpec {
    /// `n` keys `<prefix>-<i>` with TTLs spread evenly over `ttls` (seconds).
    pub fn spread(prefix: &str, n: usize, ttls: std::ops::RangeInclusive<u64>) -> Vec<Self> {
        let span = ttls.end() - ttls.start() + 1;
        (0..n)
            .map(|i| Self {
                key: format!("{prefix}-{i:05}"),
                ttl_s: ttls.start() + (i as u64 % span),
            })
            .collect()
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(self.ttl_s)
    }
}

/// How a driver's clients behave.
#[derive(Clone, Copy, Debug)]
pub struct DriverConfig {
    /// Client tasks (keys are dealt to them in turn).
    pub clients: usize,
    /// The longest a request may take before it counts as failed (`Unknown`) and the client
    /// moves on: short enough that a paused member costs a client little of a 3 s TTL.
    pub request_timeout: Duration,
    /// Keys due within this are sent together (at most this early).
    pub batch_window: Duration,
    /// The most keys in one request (at most [`MAX_BATCH`]).
    pub max_batch: usize,
    /// The wait before retrying keys whose request failed, on the next member.
    pub retry_after: Duration,
}

impl Default for DriverConfig {
    fn default() -> Self {
        Self {
            clients: 4,
            request_timeout: Duration::from_secs(1),
            batch_window: Duration::from_millis(100),
            max_batch: MAX_BATCH,
            retry_after: Duration::from_millis(100),
        }
    }
}

/// Running keep-alive clients. See the module documentation.
pub struct Driver {
    keys: Vec<KeySpec>,
    ops: Arc<Mutex<Vec<Op>>>,
    /// Per member and kind of answer ("2xx renewed", "503 no_quorum", ...): how many
    /// heartbeats got it, the first and the last time.
    answers: Arc<Mutex<Answers>>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    origin: Origin,
}

impl Driver {
    /// Starts `config.clients` clients (history ids from `first_client`) heartbeating `keys`
    /// on `members` (API base URLs).
    pub fn start(
        first_client: u32,
        members: Vec<String>,
        keys: Vec<KeySpec>,
        config: DriverConfig,
        origin: Origin,
    ) -> Self {
        assert!(config.clients > 0 && !members.is_empty());
        let http = reqwest::Client::builder()
            .timeout(config.request_timeout)
            .connect_timeout(config.request_timeout)
            .build()
            .expect("a client");
        let ops = Arc::new(Mutex::new(Vec::new()));
        let answers = Arc::new(Mutex::new(Answers::default()));
        let (stop, stopped) = watch::channel(false);
        let now = Instant::now();
        let tasks = (0..config.clients)
            .map(|n| {
                let tracked = (keys.iter().skip(n).step_by(config.clients))
                    .map(|spec| Tracked {
                        spec: spec.clone(),
                        due: now,
                        acked: false,
                    })
                    .collect();
                let client = Client {
                    id: first_client + n as u32,
                    http: http.clone(),
                    members: members.clone(),
                    at: n % members.len(),
                    keys: tracked,
                    config,
                    origin,
                    ops: Arc::clone(&ops),
                    answers: Arc::clone(&answers),
                    rng: fastrand::Rng::with_seed(u64::from(first_client) + n as u64),
                };
                tokio::spawn(client.run(stopped.clone()))
            })
            .collect();
        Self {
            keys,
            ops,
            answers,
            stop,
            tasks,
            origin,
        }
    }

    /// Waits until every key has an acknowledged heartbeat; after `limit`, says how far it got.
    pub async fn wait_registered(&self, limit: Duration) -> Result<(), String> {
        let started = Instant::now();
        loop {
            let acked: BTreeSet<String> = (self.ops.lock().iter())
                .filter(|op| {
                    matches!(
                        op.kind,
                        OpKind::Heartbeat {
                            outcome: Outcome::Ok(_),
                            ..
                        }
                    )
                })
                .map(|op| op.key.clone())
                .collect();
            if self.keys.iter().all(|spec| acked.contains(&spec.key)) {
                return Ok(());
            }
            if started.elapsed() >= limit {
                return Err(format!(
                    "only {} of {} keys registered within {limit:?}; answers:\n{:?}",
                    acked.len(),
                    self.keys.len(),
                    self.answers()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// How many heartbeats got each kind of answer so far.
    pub fn answers(&self) -> Answers {
        self.answers.lock().clone()
    }

    /// Stops every client after its request in flight; returns what they did and, for each
    /// key, the instant after which none of its heartbeats was sent.
    pub async fn stop(mut self) -> (Vec<Op>, Vec<Stopped>) {
        let _ = self.stop.send(true);
        for task in std::mem::take(&mut self.tasks) {
            task.await.expect("a driver client panicked");
        }
        let at_ms = self.origin.ceil_now();
        let stopped = (self.keys.iter())
            .map(|spec| Stopped {
                key: spec.key.clone(),
                at_ms,
            })
            .collect();
        let ops = self.ops.lock().clone();
        (ops, stopped)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// A key a client keeps alive.
struct Tracked {
    spec: KeySpec,
    /// When it is next sent.
    due: Instant,
    /// Whether a heartbeat of it was acknowledged yet (the first interval is drawn shorter, so
    /// that keys registered together spread their renewals).
    acked: bool,
}

/// Per member (its place in the driver's list, from 1: its id in the harness) and kind of
/// answer: how many heartbeats got it, when first and last (ms).
#[derive(Clone, Default)]
pub struct Answers(pub BTreeMap<(usize, String), (usize, Ms, Ms)>);

impl std::fmt::Debug for Answers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for ((member, why), (n, first, last)) in &self.0 {
            writeln!(f, "  member {member}: {why}: {n} in [{first}, {last}] ms")?;
        }
        Ok(())
    }
}

/// What one request's answer means for each key it carried, with a word on why.
enum Answer {
    /// Per key, in order.
    Items(Vec<(Outcome<Renewal>, String)>),
    /// The whole request failed this way (a `Failed` one was never applied).
    Whole(Outcome<Renewal>, String),
}

/// One client task.
struct Client {
    id: u32,
    http: reqwest::Client,
    members: Vec<String>,
    /// The member it sends to now.
    at: usize,
    keys: Vec<Tracked>,
    config: DriverConfig,
    origin: Origin,
    ops: Arc<Mutex<Vec<Op>>>,
    answers: Arc<Mutex<Answers>>,
    rng: fastrand::Rng,
}

impl Client {
    async fn run(mut self, mut stop: watch::Receiver<bool>) {
        loop {
            if *stop.borrow() {
                return;
            }
            let horizon = Instant::now() + self.config.batch_window;
            let mut due: Vec<usize> = (0..self.keys.len())
                .filter(|&i| self.keys[i].due <= horizon)
                .collect();
            // Renewals first, each by its time, then keys not registered yet: a registered
            // key's TTL is running, a new one's is not. Sending every due key in turn let a
            // client registering 1,000 keys in batches of 200 (about 3 s in a loaded debug
            // build) renew the first ones only after their 3 s TTL had run out.
            due.sort_by_key(|&i| (!self.keys[i].acked, self.keys[i].due));
            due.truncate(self.config.max_batch.clamp(1, MAX_BATCH));
            if due.is_empty() {
                let Some(next) = self.keys.iter().map(|key| key.due).min() else {
                    return;
                };
                let wake = next.checked_sub(self.config.batch_window).unwrap_or(next);
                tokio::select! {
                    () = tokio::time::sleep_until(wake.into()) => {}
                    _ = stop.changed() => {}
                }
                continue;
            }
            // One request, then the plan again: keys fall due while it is in flight.
            self.send(&due).await;
        }
    }

    /// Sends the keys at `indexes` to the current member and records each one's outcome.
    async fn send(&mut self, indexes: &[usize]) {
        let base = &self.members[self.at];
        let items: Vec<Value> = (indexes.iter())
            .map(|&i| json!({ "key": self.keys[i].spec.key, "ttl_s": self.keys[i].spec.ttl_s }))
            .collect();
        let invoked = Instant::now();
        let answer = match &items[..] {
            [one] => self.single(base, one).await,
            _ => self.batch(base, items).await,
        };
        let completed = Instant::now();
        let outcomes = match answer {
            Answer::Items(outcomes) => outcomes,
            Answer::Whole(outcome, why) => vec![(outcome, why); indexes.len()],
        };
        let mut move_on = false;
        let mut ops = Vec::with_capacity(indexes.len());
        let member = self.at + 1;
        let completed_ms = self.origin.ceil(completed);
        let mut answers = self.answers.lock();
        for (&i, (outcome, why)) in indexes.iter().zip(outcomes) {
            let seen = (answers.0)
                .entry((member, why))
                .or_insert((0, completed_ms, completed_ms));
            seen.0 += 1;
            seen.2 = completed_ms;
            let tracked = &mut self.keys[i];
            ops.push(Op {
                client: self.id,
                key: tracked.spec.key.clone(),
                kind: OpKind::Heartbeat {
                    ttl_ms: tracked.spec.ttl_s * 1000,
                    outcome,
                },
                invoked_ms: self.origin.floor(invoked),
                completed_ms: self.origin.ceil(completed),
                applied_index: None,
            });
            match outcome {
                Outcome::Ok(_) => {
                    let interval = tracked.spec.ttl() / 3;
                    let interval = match tracked.acked {
                        true => interval,
                        // Between a sixth and a third of the TTL, once.
                        false => interval / 2 + interval.mul_f64(self.rng.f64() / 2.0),
                    };
                    tracked.acked = true;
                    tracked.due = invoked + interval;
                }
                Outcome::Failed | Outcome::Unknown => {
                    move_on = true;
                    tracked.due = completed + self.config.retry_after;
                }
            }
        }
        drop(answers);
        self.ops.lock().extend(ops);
        if move_on {
            self.at = (self.at + 1) % self.members.len();
        }
    }

    async fn single(&self, base: &str, item: &Value) -> Answer {
        let sent = self
            .http
            .post(format!("{base}/v1/heartbeats"))
            .json(item)
            .send()
            .await;
        match read(sent).await {
            Ok(body) => {
                let (outcome, why) = renewal_of(&body);
                Answer::Whole(outcome, why)
            }
            Err((outcome, why)) => Answer::Whole(outcome, why),
        }
    }

    async fn batch(&self, base: &str, items: Vec<Value>) -> Answer {
        let n = items.len();
        let sent = self
            .http
            .post(format!("{base}/v1/heartbeats/batch"))
            .json(&json!({ "heartbeats": items }))
            .send()
            .await;
        let body = match read(sent).await {
            Ok(body) => body,
            Err((outcome, why)) => return Answer::Whole(outcome, why),
        };
        match body["results"].as_array() {
            Some(results) if results.len() == n => {
                Answer::Items(results.iter().map(renewal_of).collect())
            }
            _ => Answer::Whole(Outcome::Unknown, "a batch answer without results".into()),
        }
    }
}

/// A 2xx answer's JSON body, or what the failure means for its heartbeats and why.
async fn read(
    sent: reqwest::Result<reqwest::Response>,
) -> Result<Value, (Outcome<Renewal>, String)> {
    let response = match sent {
        Ok(response) => response,
        // No connection was made: nothing reached the member.
        Err(error) if error.is_connect() => return Err((Outcome::Failed, "no connection".into())),
        Err(error) if error.is_timeout() => return Err((Outcome::Unknown, "timed out".into())),
        Err(_) => return Err((Outcome::Unknown, "the exchange broke off".into())),
    };
    let status = response.status();
    let body: Option<Value> = response.json().await.ok();
    let code = (body.as_ref())
        .and_then(|body| body["error"]["code"].as_str())
        .unwrap_or_default();
    let why = format!("{} {code}", status.as_u16());
    match (status.is_success(), body) {
        (true, Some(body)) => Ok(body),
        // Acknowledged, but the answer was lost on the way: it took effect, how is unknown.
        (true, None) => Err((Outcome::Unknown, why)),
        (false, _) if refuses_input(status) => Err((Outcome::Failed, why)),
        (false, _) => Err((Outcome::Unknown, why)),
    }
}

/// Statuses that refuse a request before it changes anything.
fn refuses_input(status: StatusCode) -> bool {
    status.is_client_error() && status != StatusCode::REQUEST_TIMEOUT
}

/// One heartbeat's answer (a response, or a batch item): `created` says which; an item's error
/// is `Failed` when it refuses the input, `Unknown` when it is about the cluster.
fn renewal_of(answer: &Value) -> (Outcome<Renewal>, String) {
    match answer["created"].as_bool() {
        Some(true) => return (Outcome::Ok(Renewal::Created), "2xx created".into()),
        Some(false) => return (Outcome::Ok(Renewal::Renewed), "2xx renewed".into()),
        None => {}
    }
    let code = answer["error"]["code"].as_str().unwrap_or("?").to_owned();
    match code.starts_with("invalid_") {
        true => (Outcome::Failed, format!("item {code}")),
        false => (Outcome::Unknown, format!("item {code}")),
    }
}

/// How a [`Writer`] behaves.
#[derive(Clone, Debug)]
pub struct WriterConfig {
    /// Its keys are `<prefix>-<n>`, its services `<prefix>-svc-<n mod 3>`.
    pub prefix: String,
    /// Every creation's TTL: longer than the test, so that only a delete ends one of its keys.
    pub ttl_s: u64,
    /// Every `delete_every`-th step also deletes the oldest key it may delete (0: never).
    pub delete_every: usize,
    /// Every `move_every`-th step also moves the oldest key it may change to the service
    /// `<its service>-moved` (0: never).
    pub move_every: usize,
    /// The pause after each step.
    pub pace: Duration,
    /// As [`DriverConfig::request_timeout`].
    pub request_timeout: Duration,
    /// The wait before retrying a write that failed, on the next member.
    pub retry_after: Duration,
}

impl WriterConfig {
    /// Keys `<prefix>-<n>` with a 10 min TTL, one step every 100 ms, nothing deleted or moved.
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
            ttl_s: 600,
            delete_every: 0,
            move_every: 0,
            pace: Duration::from_millis(100),
            request_timeout: Duration::from_secs(1),
            retry_after: Duration::from_millis(100),
        }
    }
}

/// What a writer's acknowledged writes say of one of its keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Its last write (a creation or a move) was acknowledged with this service and no delete
    /// of it was sent: present at the end, with this service. `clean`: none of its writes had
    /// an unknown outcome, so none may land later (only a clean key is deleted or moved: a
    /// late creation would bring a deleted key back, or its old service).
    Kept { service: String, clean: bool },
    /// A delete of it was acknowledged (204, or 404: after an attempt that may have landed, or
    /// because the key was lost, which the tests flag), and only clean keys are deleted:
    /// absent at the end.
    Deleted,
    /// The writer stopped before a write of it was acknowledged: no promise.
    Uncertain,
}

/// Every key a writer wrote, with its fate.
pub type Written = BTreeMap<String, Fate>;

/// How many writes a writer had acknowledged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterCounts {
    pub created: usize,
    pub deleted: usize,
    pub moved: usize,
}

/// A client that creates keys and deletes or moves (to another service) some of them, one
/// request at a time, each retried on the next member until acknowledged, and reads each one
/// back (a linearizable `GET`) through the next member after it was written. Every attempt is
/// recorded as a history op, as the [`Driver`]'s are (a delete's 204 is `Existed`, its 404
/// `Missing`; a read's 200 `Present`, its 404 `Absent`; what the driver calls `Failed` or
/// `Unknown` is so here too). It runs until [`Writer::stop`], which lets the write in flight
/// end (its key is then [`Fate::Uncertain`] if it was not acknowledged).
pub struct Writer {
    ops: Arc<Mutex<Vec<Op>>>,
    written: Arc<Mutex<Written>>,
    counts: Arc<Mutex<WriterCounts>>,
    /// Per answer that was not an acknowledgment ("503 no_leader", "no connection", ...): how
    /// many attempts got it.
    refusals: Arc<Mutex<BTreeMap<String, usize>>>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl Writer {
    /// Starts writing through `members` (API base URLs) as history client `client`; the keys
    /// of `inherited` (another writer's, say) are its own to delete and move as well.
    pub fn start(
        client: u32,
        members: Vec<String>,
        config: WriterConfig,
        origin: Origin,
        inherited: Written,
    ) -> Self {
        assert!(!members.is_empty());
        let http = reqwest::Client::builder()
            .timeout(config.request_timeout)
            .connect_timeout(config.request_timeout)
            .build()
            .expect("a client");
        let ops = Arc::new(Mutex::new(Vec::new()));
        let written = Arc::new(Mutex::new(inherited));
        let counts = Arc::new(Mutex::new(WriterCounts::default()));
        let refusals = Arc::new(Mutex::new(BTreeMap::new()));
        let (stop, stopped) = watch::channel(false);
        let task = WriterTask {
            client,
            http,
            members,
            at: client as usize,
            config,
            origin,
            ops: Arc::clone(&ops),
            written: Arc::clone(&written),
            counts: Arc::clone(&counts),
            refusals: Arc::clone(&refusals),
            stop: stopped,
        };
        Self {
            ops,
            written,
            counts,
            refusals,
            stop,
            task: Some(tokio::spawn(task.run())),
        }
    }

    /// The writes acknowledged so far.
    pub fn counts(&self) -> WriterCounts {
        *self.counts.lock()
    }

    /// Attempts that were not acknowledged, per answer.
    pub fn refusals(&self) -> BTreeMap<String, usize> {
        self.refusals.lock().clone()
    }

    /// Stops after the write in flight; returns every attempt and each key's fate.
    pub async fn stop(mut self) -> (Vec<Op>, Written) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            task.await.expect("the writer panicked");
        }
        let ops = self.ops.lock().clone();
        let written = self.written.lock().clone();
        (ops, written)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// One write a writer retries until acknowledged.
enum Write<'a> {
    /// A heartbeat with the writer's TTL and this service: a creation or a move.
    Put {
        service: &'a str,
    },
    Delete,
}

/// The writer's task. See [`Writer`].
struct WriterTask {
    client: u32,
    http: reqwest::Client,
    members: Vec<String>,
    /// The member it sends to now (an index into `members`, taken modulo its length).
    at: usize,
    config: WriterConfig,
    origin: Origin,
    ops: Arc<Mutex<Vec<Op>>>,
    written: Arc<Mutex<Written>>,
    counts: Arc<Mutex<WriterCounts>>,
    refusals: Arc<Mutex<BTreeMap<String, usize>>>,
    stop: watch::Receiver<bool>,
}

impl WriterTask {
    async fn run(mut self) {
        for step in 1.. {
            if *self.stop.borrow() {
                return;
            }
            let key = format!("{}-{step:05}", self.config.prefix);
            let service = format!("{}-svc-{}", self.config.prefix, step % 3);
            if self.write(&key, Write::Put { service: &service }).await {
                self.counts.lock().created += 1;
            }
            if self.config.delete_every > 0 && step % self.config.delete_every == 0 {
                if let Some(victim) = self.oldest_clean(|_| true) {
                    if self.write(&victim, Write::Delete).await {
                        self.counts.lock().deleted += 1;
                    }
                }
            }
            if self.config.move_every > 0 && step % self.config.move_every == 0 {
                let unmoved = |service: &str| !service.ends_with("-moved");
                if let Some(moved) = self.oldest_clean(unmoved) {
                    let Some(Fate::Kept { service, .. }) = self.written.lock().get(&moved).cloned()
                    else {
                        unreachable!("a clean key is kept");
                    };
                    let service = format!("{service}-moved");
                    if self.write(&moved, Write::Put { service: &service }).await {
                        self.counts.lock().moved += 1;
                    }
                }
            }
            let pace = self.config.pace;
            tokio::select! {
                () = tokio::time::sleep(pace) => {}
                _ = self.stop.changed() => {}
            }
        }
    }

    /// The first (by name) clean kept key whose service passes `service`.
    fn oldest_clean(&self, service: impl Fn(&str) -> bool) -> Option<String> {
        (self.written.lock().iter())
            .find(|(_, fate)| matches!(fate, Fate::Kept { service: s, clean: true } if service(s)))
            .map(|(key, _)| key.clone())
    }

    /// Sends `write` of `key`, on the next member after each failure, until it is acknowledged
    /// or the writer is stopped; records every attempt and the key's fate, then reads the key
    /// back through the next member. Whether it was acknowledged.
    async fn write(&mut self, key: &str, write: Write<'_>) -> bool {
        let mut clean = true;
        loop {
            let base = self.members[self.at % self.members.len()].clone();
            let invoked = Instant::now();
            let (kind, why) = match write {
                Write::Put { service } => {
                    let (outcome, why) = self.put_once(&base, key, service).await;
                    let ttl_ms = self.config.ttl_s * 1000;
                    (OpKind::Heartbeat { ttl_ms, outcome }, why)
                }
                Write::Delete => {
                    let (outcome, why) = self.delete_once(&base, key).await;
                    (OpKind::Delete { outcome }, why)
                }
            };
            self.record(key, kind, invoked);
            let acked = match kind {
                OpKind::Heartbeat { outcome, .. } => matches!(outcome, Outcome::Ok(_)),
                OpKind::Delete { outcome } => matches!(outcome, Outcome::Ok(_)),
                OpKind::Read { .. } => unreachable!("a write"),
            };
            let unknown = matches!(
                kind,
                OpKind::Heartbeat {
                    outcome: Outcome::Unknown,
                    ..
                } | OpKind::Delete {
                    outcome: Outcome::Unknown
                }
            );
            clean &= !unknown;
            if acked {
                let fate = match write {
                    Write::Put { service } => Fate::Kept {
                        service: service.to_owned(),
                        clean,
                    },
                    Write::Delete => Fate::Deleted,
                };
                self.written.lock().insert(key.to_owned(), fate);
                self.read_back(key).await;
                return true;
            }
            *self.refusals.lock().entry(why).or_default() += 1;
            self.at += 1;
            let retry_after = self.config.retry_after;
            tokio::select! {
                () = tokio::time::sleep(retry_after) => {}
                _ = self.stop.changed() => {}
            }
            if *self.stop.borrow() {
                let mut written = self.written.lock();
                let fate = written.entry(key.to_owned()).or_insert(Fate::Uncertain);
                // A write that never reached a member (every attempt refused) changed nothing.
                if !clean || matches!(write, Write::Delete) {
                    *fate = Fate::Uncertain;
                }
                return false;
            }
        }
    }

    fn record(&self, key: &str, kind: OpKind, invoked: Instant) {
        self.ops.lock().push(Op {
            client: self.client,
            key: key.to_owned(),
            kind,
            invoked_ms: self.origin.floor(invoked),
            completed_ms: self.origin.ceil_now(),
            applied_index: None,
        });
    }

    async fn put_once(&self, base: &str, key: &str, service: &str) -> (Outcome<Renewal>, String) {
        let item = json!({ "key": key, "ttl_s": self.config.ttl_s, "service": service });
        let sent = (self.http.post(format!("{base}/v1/heartbeats")))
            .json(&item)
            .send()
            .await;
        match read(sent).await {
            Ok(body) => renewal_of(&body),
            Err(failed) => failed,
        }
    }

    async fn delete_once(
        &self,
        base: &str,
        key: &str,
    ) -> (Outcome<super::history::Removal>, String) {
        use super::history::Removal;
        let sent = self
            .http
            .delete(format!("{base}/v1/keys/{key}"))
            .send()
            .await;
        match answered(sent) {
            Ok(StatusCode::NO_CONTENT) => (Outcome::Ok(Removal::Existed), "204".into()),
            Ok(StatusCode::NOT_FOUND) => (Outcome::Ok(Removal::Missing), "404".into()),
            Ok(status) if refuses_input(status) => (Outcome::Failed, status.to_string()),
            Ok(status) => (Outcome::Unknown, status.to_string()),
            Err((outcome, why)) => (outcome, why),
        }
    }

    /// A linearizable read of `key` through the next member, recorded (not retried).
    async fn read_back(&self, key: &str) {
        use super::history::Presence;
        let base = &self.members[(self.at + 1) % self.members.len()];
        let invoked = Instant::now();
        let sent = self.http.get(format!("{base}/v1/keys/{key}")).send().await;
        let outcome = match answered::<Presence>(sent) {
            Ok(StatusCode::OK) => Outcome::Ok(Presence::Present),
            Ok(StatusCode::NOT_FOUND) => Outcome::Ok(Presence::Absent),
            Ok(_) | Err((Outcome::Unknown, _)) => Outcome::Unknown,
            Err(_) => Outcome::Failed,
        };
        self.record(key, OpKind::Read { outcome }, invoked);
    }
}

/// A response's status, or what a request that got none means (as [`read`] says).
fn answered<T>(
    sent: reqwest::Result<reqwest::Response>,
) -> Result<StatusCode, (Outcome<T>, String)> {
    match sent {
        Ok(response) => Ok(response.status()),
        Err(error) if error.is_connect() => Err((Outcome::Failed, "no connection".into())),
        Err(error) if error.is_timeout() => Err((Outcome::Unknown, "timed out".into())),
        Err(_) => Err((Outcome::Unknown, "the exchange broke off".into())),
    }
}

/// Per key, the latest end of a TTL an acknowledged heartbeat promised (`invoked + ttl`): until
/// then, by the deadline lemma of [`super::history`], only a delete may end the key.
pub fn promises(ops: &[Op]) -> BTreeMap<String, Ms> {
    let mut promised: BTreeMap<String, Ms> = BTreeMap::new();
    for op in ops {
        if let OpKind::Heartbeat {
            ttl_ms,
            outcome: Outcome::Ok(_),
        } = op.kind
        {
            let until = promised.entry(op.key.clone()).or_default();
            *until = (*until).max(op.invoked_ms + ttl_ms);
        }
    }
    promised
}

/// How the operations ended, for a summary: per kind, acknowledged / refused / unknown.
pub fn tally(ops: &[Op]) -> String {
    let mut counts: BTreeMap<&str, [usize; 3]> = BTreeMap::new();
    for op in ops {
        let (kind, effect) = match op.kind {
            OpKind::Heartbeat { outcome, .. } => ("heartbeats", outcome_slot(&outcome)),
            OpKind::Delete { outcome } => ("deletes", outcome_slot(&outcome)),
            OpKind::Read { outcome } => ("reads", outcome_slot(&outcome)),
        };
        counts.entry(kind).or_default()[effect] += 1;
    }
    (counts.iter())
        .map(|(kind, [ok, failed, unknown])| {
            format!("{kind}: {ok} acknowledged, {failed} refused, {unknown} unknown")
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn outcome_slot<T>(outcome: &Outcome<T>) -> usize {
    match outcome {
        Outcome::Ok(_) => 0,
        Outcome::Failed => 1,
        Outcome::Unknown => 2,
    }
}
