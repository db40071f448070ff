//! Webhook delivery: each expiry (and, if enabled, deletion) POSTed to every configured URL,
//! signed (Standard Webhooks v1), retried, at least once, never stalling the checker.
//!
//! Flow: the registry publishes events on its bus (never blocking). The *dispatcher* task drains
//! the bus promptly, gives each event a `webhook-id`, and pushes it into each URL's bounded
//! [`outbox::Outbox`]. One *delivery* task per URL ([`endpoint::Endpoint::deliver`]) sends,
//! retries and settles. Events that exhaust their attempts are kept in [`dead_letters`].
//!
//! Invariants:
//! - Nothing upstream waits on the network: the dispatcher only takes short outbox locks.
//! - Memory is bounded: at most `queue_max` events per URL (each ~200 bytes plus key and meta)
//!   and `dead_letters_max` letters. Events refused past the bound are counted per URL
//!   (`dropped.queue_full`) and logged when the overflow starts; nothing is dropped silently.
//! - One key's events reach a URL in the order they happened (see [`outbox`]).
//! - At least once: an event leaves an outbox only on a 2xx answer, or into the dead letters.
//!   Receivers deduplicate on `webhook-id`, which every retry of an event repeats.
//! - With a data directory, every event queued for a URL, every delivery and every dead letter
//!   is logged (under the URL's lock, so an event's queued record precedes what settles it);
//!   after a restart the events still held are delivered with the same `webhook-id`, and the
//!   dead letters are back. Memory-only, events still held at the end of the shutdown grace
//!   period are counted in the log and lost.

pub mod backoff;
pub mod dead_letters;
pub mod endpoint;
pub mod health;
pub mod message;
pub mod outbox;
pub mod replicated;
pub mod signing;
pub mod transport;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use reqwest::Url;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::events::{EventKind, EventReceiver};
use crate::persist::journal::Journal;
use crate::persist::record::{Record, WebhookMessage};
use crate::persist::webhooks::WebhookReplay;
use dead_letters::{DeadLetter, DeadLetters, NewLetter};
use endpoint::{Delivery, Endpoint, EndpointStatus};
use message::{Message, MessageIds};
use replicated::{Replication, Settled};
use signing::WebhookSecret;
use transport::Sender;

/// Most events the dispatcher moves per outbox lock.
const DISPATCH_BATCH: usize = 4096;

/// How webhooks are delivered (from the `--webhook-*` flags).
#[derive(Clone, Debug)]
pub struct Settings {
    pub urls: Vec<Url>,
    pub secret: Option<WebhookSecret>,
    /// Which kinds of event are sent.
    pub events: Vec<EventKind>,
    /// Per attempt: connecting, sending, and reading the answer.
    pub timeout: Duration,
    /// Attempts in flight per URL.
    pub concurrency: usize,
    /// Most events per request (1: one event per request, as itself).
    pub batch_max: usize,
    /// Attempts per event before it becomes a dead letter.
    pub max_attempts: u32,
    /// Waits between attempts (see [`backoff`]).
    pub retry_schedule: Vec<Duration>,
    /// Events held per URL at most.
    pub queue_max: usize,
    pub dead_letters_max: usize,
    /// How long shutdown waits for held events to be delivered.
    pub drain_timeout: Duration,
}

/// The notifier could not start.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("cannot build the webhook HTTP client: {0}")]
    Client(#[from] reqwest::Error),
}

/// Why a dead letter was not re-sent.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RetryError {
    #[error("no dead letter with id {0}")]
    NotFound(u64),
    #[error("the webhook queue of {0} is full; try again once it drains")]
    QueueFull(String),
}

/// The running notifier: its endpoints, dead letters and tasks.
#[derive(Debug)]
pub struct Notifier {
    settings: Settings,
    endpoints: Arc<[Arc<Endpoint>]>,
    dead_letters: Arc<DeadLetters>,
    /// `Some(deadline)` asks every task to finish by `deadline`.
    stop: watch::Sender<Option<Instant>>,
    dispatcher: parking_lot::Mutex<Option<JoinHandle<()>>>,
    deliverers: parking_lot::Mutex<Vec<JoinHandle<usize>>>,
    /// Where queued events, deliveries and dead letters are logged, once attached (after
    /// recovery); shared with the dispatcher and the delivery tasks.
    journal: Arc<OnceLock<Arc<Journal>>>,
    /// In a cluster: who sends, and what the sender settled (see [`replicated`]).
    replication: Option<Arc<Replication>>,
    /// Events ever published to the dispatcher, and how many of them it has put in the
    /// outboxes (or passed over): equal when it has caught up (`None` without a URL).
    bus: Option<BusProgress>,
}

/// See [`Notifier::caught_up`].
#[derive(Debug)]
struct BusProgress {
    published: Arc<AtomicU64>,
    handled: Arc<AtomicU64>,
}

impl Notifier {
    /// Starts delivering the events that arrive on `events` (a subscription to the registry's
    /// bus). With no URL configured it drops the subscription (the bus prunes it) and starts no
    /// task. In a cluster (`replication`), it sends only while this member is the sender, and
    /// what a snapshot read before it held is put back.
    pub fn start(
        settings: Settings,
        events: EventReceiver,
        replication: Option<Arc<Replication>>,
    ) -> Result<Arc<Self>, NotifyError> {
        let dead_letters = Arc::new(DeadLetters::new(settings.dead_letters_max));
        let endpoints: Arc<[Arc<Endpoint>]> = settings
            .urls
            .iter()
            .enumerate()
            .map(|(index, url)| Arc::new(Endpoint::new(index, url.clone(), settings.queue_max)))
            .collect();
        let (stop, _) = watch::channel(None);
        let journal: Arc<OnceLock<Arc<Journal>>> = Arc::default();
        let notifier = Arc::new(Self {
            journal: Arc::clone(&journal),
            endpoints: Arc::clone(&endpoints),
            dead_letters: Arc::clone(&dead_letters),
            stop,
            dispatcher: parking_lot::Mutex::new(None),
            deliverers: parking_lot::Mutex::new(Vec::new()),
            settings: settings.clone(),
            replication: replication.clone(),
            bus: (!settings.urls.is_empty()).then(|| BusProgress {
                published: events.published_counter(),
                handled: Arc::default(),
            }),
        });
        if let Some(replication) = &replication {
            let early = replication.attach(&notifier);
            if !early.is_empty() {
                notifier.replace_held(early, Instant::now());
            }
        }
        if endpoints.is_empty() {
            return Ok(notifier);
        }
        if settings.secret.is_none() {
            tracing::warn!(
                "no --webhook-secret: webhooks are sent UNSIGNED and receivers cannot verify them"
            );
        }
        let delivery = Arc::new(Delivery {
            sender: Arc::new(Sender {
                client: http_client(settings.timeout, settings.concurrency)?,
                secret: settings.secret.clone(),
                timeout: settings.timeout,
            }),
            concurrency: settings.concurrency,
            batch_max: settings.batch_max.max(1),
            batch_ids: MessageIds::with_prefix("batch_"),
            max_attempts: settings.max_attempts,
            retry_schedule: settings.retry_schedule.clone(),
            dead_letters: Arc::clone(&dead_letters),
            journal: Arc::clone(&journal),
            replication: replication.clone(),
        });
        let deliverers = endpoints
            .iter()
            .map(|endpoint| {
                let deliver =
                    Arc::clone(endpoint).deliver(Arc::clone(&delivery), notifier.stop.subscribe());
                tokio::spawn(deliver)
            })
            .collect();
        *notifier.deliverers.lock() = deliverers;
        *notifier.dispatcher.lock() = Some(tokio::spawn(dispatch(
            events,
            Outboxes {
                endpoints,
                dead_letters,
                journal,
                replication,
                handled: notifier
                    .bus
                    .as_ref()
                    .map(|bus| Arc::clone(&bus.handled))
                    .expect("a URL is configured"),
            },
            settings.events,
            notifier.stop.subscribe(),
        )));
        for url in &settings.urls {
            tracing::info!(url = %url.origin().ascii_serialization(), "delivering webhooks");
        }
        Ok(notifier)
    }

    /// Logs queued events, deliveries and dead letters to `journal` from now on (once, after
    /// recovery).
    pub fn attach_journal(&self, journal: Arc<Journal>) {
        let _ = self.journal.set(journal);
    }

    /// The records that rebuild the held events and the dead letters (for a snapshot).
    pub fn durable_records(&self) -> Vec<Record> {
        let mut records: Vec<Record> = self
            .endpoints
            .iter()
            .flat_map(|endpoint| endpoint.durable_records())
            .collect();
        let mut cursor = None;
        loop {
            let page = self.dead_letters.page(cursor, 1024);
            for letter in &page.letters {
                records.push(Record::DeadLetter {
                    letter_id: Some(letter.id),
                    message: WebhookMessage {
                        url: self.shown_url(letter.endpoint).to_owned(),
                        id: letter.message.id.to_string(),
                        attempts: letter.attempts,
                        event: letter.message.event.clone(),
                    },
                    last_error: letter.last_error.clone(),
                    failed_at_unix_ms: letter.failed_at_ms,
                });
            }
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        records
    }

    /// Puts back what the log held (at start-up, before any new event): the events still to
    /// deliver, with their `webhook-id`s and attempts, and the dead letters. Events and letters
    /// of a URL that is no longer configured are dropped with a warning.
    pub fn restore(&self, replay: WebhookReplay, now: Instant) {
        let (held, letters) = replay.finish();
        let endpoint_of = |url: &str| {
            self.endpoints
                .iter()
                .position(|endpoint| endpoint.shown_url() == url)
        };
        let mut unknown = 0;
        let mut by_endpoint: Vec<Vec<(Arc<Message>, u32)>> = vec![Vec::new(); self.endpoints.len()];
        let (n_held, n_letters) = (held.len(), letters.len());
        for logged in held {
            match endpoint_of(&logged.url) {
                Some(index) => by_endpoint[index].push((message_of(&logged), logged.attempts)),
                None => unknown += 1,
            }
        }
        let mut refused = 0;
        for (endpoint, messages) in self.endpoints.iter().zip(by_endpoint) {
            refused += endpoint.restore(messages, now);
        }
        for letter in letters {
            match endpoint_of(&letter.message.url) {
                Some(endpoint) => {
                    let new = NewLetter {
                        endpoint,
                        message: message_of(&letter.message),
                        attempts: letter.message.attempts,
                        last_error: letter.last_error,
                        failed_at_ms: letter.failed_at_unix_ms,
                    };
                    match letter.letter_id {
                        Some(id) => self.dead_letters.file_numbered(id, new),
                        None => drop(self.dead_letters.file(new)),
                    }
                }
                None => unknown += 1,
            }
        }
        if n_held + n_letters > 0 {
            tracing::info!(
                events = n_held,
                dead_letters = n_letters,
                "webhook events and dead letters restored"
            );
        }
        if unknown > 0 {
            tracing::warn!(
                unknown,
                "webhook events and dead letters of URLs no longer configured were dropped"
            );
        }
        if refused > 0 {
            tracing::warn!(
                refused,
                "restored webhook events over --webhook-queue-max were dropped"
            );
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Each URL's state, in configuration order.
    pub fn status(&self, now: Instant) -> Vec<EndpointStatus> {
        self.endpoints
            .iter()
            .map(|endpoint| endpoint.status(now))
            .collect()
    }

    pub fn dead_letters(&self) -> &DeadLetters {
        &self.dead_letters
    }

    /// The shown (password-hidden) URL of endpoint `index`.
    pub fn shown_url(&self, index: usize) -> &str {
        self.endpoints
            .get(index)
            .map_or("", |endpoint| endpoint.shown_url())
    }

    /// Re-sends dead letter `id` to its URL, with a fresh attempt budget and the same
    /// `webhook-id`. The letter leaves the store once queued.
    pub fn retry(&self, id: u64, now: Instant) -> Result<DeadLetter, RetryError> {
        let letter = self.dead_letters.take(id).ok_or(RetryError::NotFound(id))?;
        let endpoint = &self.endpoints[letter.endpoint];
        match endpoint.requeue(
            Arc::clone(&letter.message),
            now,
            self.journal.get().map(|j| &**j),
            self.replication.as_deref(),
        ) {
            Ok(()) => Ok(letter),
            Err(_full) => {
                let url = endpoint.shown_url().to_owned();
                self.dead_letters.restore(letter);
                Err(RetryError::QueueFull(url))
            }
        }
    }

    /// Whether every event published so far is in the outboxes (a snapshot reads them).
    fn bus_idle(&self) -> bool {
        self.bus.as_ref().is_none_or(|bus| {
            bus.handled.load(Ordering::Acquire) >= bus.published.load(Ordering::Acquire)
        })
    }

    /// Waits (up to a second) until every event published so far is in the outboxes.
    pub async fn caught_up(&self) {
        let deadline = Instant::now() + Duration::from_secs(1);
        while !self.bus_idle() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Applies the settled reports of the log entry at `log_index` (see [`replicated`]);
    /// `by_this_member` when this member sent them, in its term as leader.
    pub fn apply_settled(
        &self,
        reports: &[Settled],
        log_index: u64,
        by_this_member: bool,
        now: Instant,
    ) {
        for endpoint in self.endpoints.iter() {
            let mine = (reports.iter().enumerate())
                .filter(|(_, report)| report.endpoint == endpoint.position())
                .map(|(place, report)| (dead_letters::letter_id(log_index, place), report));
            endpoint.apply_settled(mine, by_this_member, &self.dead_letters, now);
        }
    }

    /// Replaces the held events and dead letters with those `records` rebuild (a cluster
    /// snapshot's webhook records). Events in flight stay until their attempt settles.
    pub fn replace_held(&self, records: Vec<Record>, now: Instant) {
        for endpoint in self.endpoints.iter() {
            endpoint.clear_held();
        }
        self.dead_letters.clear();
        let mut replay = WebhookReplay::default();
        for mut record in records {
            if let Some(url) = record_url(&mut record) {
                // Named by place in a cluster's snapshot (see `records_by_place`).
                let place = url.strip_prefix('#').and_then(|n| n.parse::<usize>().ok());
                if let Some(endpoint) = place.and_then(|place| self.endpoints.get(place)) {
                    *url = endpoint.shown_url().to_owned();
                }
            }
            replay.apply(record);
        }
        self.restore(replay, now);
    }

    /// [`Notifier::durable_records`] with each URL named by its place in `--webhook-url`
    /// (`#0`, `#1`...): the members of a cluster may name one destination differently.
    pub fn records_by_place(&self) -> Vec<Record> {
        let mut records = self.durable_records();
        for record in &mut records {
            if let Some(url) = record_url(record) {
                let place = (self.endpoints.iter()).position(|e| e.shown_url() == url.as_str());
                if let Some(place) = place {
                    *url = format!("#{place}");
                }
            }
        }
        records
    }

    /// Stops taking events, delivers what is held for up to the drain timeout, and logs how
    /// many events were still pending. Call after the ticker has stopped, so that its last
    /// events are delivered too.
    pub async fn shutdown(&self) {
        let deadline = Instant::now() + self.settings.drain_timeout;
        self.stop.send_replace(Some(deadline));
        let dispatcher = self.dispatcher.lock().take();
        if let Some(dispatcher) = dispatcher {
            let _ = dispatcher.await;
        }
        let deliverers = std::mem::take(&mut *self.deliverers.lock());
        let mut pending = 0;
        for deliverer in deliverers {
            pending += deliverer.await.unwrap_or(0);
        }
        if self.endpoints.is_empty() {
            return;
        }
        if pending == 0 {
            tracing::info!(
                "webhooks: every event was delivered (or dead-lettered) before shutdown"
            );
        } else {
            if self.journal.get().is_some() {
                tracing::warn!(
                    pending,
                    "webhooks: events still pending at shutdown are kept in the data directory and delivered after the restart"
                );
            } else {
                tracing::warn!(
                    pending,
                    drain_timeout = %humantime::format_duration(self.settings.drain_timeout),
                    "webhooks: events still pending at shutdown are lost (memory only: --ephemeral)"
                );
            }
        }
    }
}

/// The URL a held event's or a dead letter's record names.
fn record_url(record: &mut Record) -> Option<&mut String> {
    match record {
        Record::WebhookQueued(message) | Record::DeadLetter { message, .. } => {
            Some(&mut message.url)
        }
        Record::WebhookDone { url, .. } => Some(url),
        _ => None,
    }
}

/// A logged message as the outbox holds it, with its original `webhook-id`.
fn message_of(logged: &WebhookMessage) -> Arc<Message> {
    Arc::new(Message {
        id: logged.id.clone().into_boxed_str(),
        event: logged.event.clone(),
    })
}

/// The client every attempt uses: no redirects, no proxy, a total timeout per attempt, one
/// pooled keep-alive connection per attempt in flight.
fn http_client(timeout: Duration, concurrency: usize) -> Result<reqwest::Client, reqwest::Error> {
    install_tls_provider();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .timeout(timeout)
        .pool_max_idle_per_host(concurrency)
        .user_agent(concat!("ttlwheel/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// Installs rustls's `ring` crypto provider for the process, once; every reqwest client needs
/// it before it is built (we do not build reqwest's default provider, aws-lc-rs).
pub fn install_tls_provider() {
    // An error means a provider is already installed, which is all we need.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// What the dispatcher feeds.
struct Outboxes {
    endpoints: Arc<[Arc<Endpoint>]>,
    dead_letters: Arc<DeadLetters>,
    journal: Arc<OnceLock<Arc<Journal>>>,
    replication: Option<Arc<Replication>>,
    /// Events taken off the bus and moved (or passed over), counted after the move.
    handled: Arc<AtomicU64>,
}

/// Moves events from the registry's bus into every outbox until asked to stop, then moves what
/// is left and returns.
async fn dispatch(
    mut events: EventReceiver,
    outboxes: Outboxes,
    kinds: Vec<EventKind>,
    mut stop: watch::Receiver<Option<Instant>>,
) {
    let local_events = LocalEvents(outboxes.replication.clone());
    let ids = MessageIds::default();
    let mut batch: Vec<Arc<Message>> = Vec::new();
    loop {
        let stopping = tokio::select! {
            event = events.recv() => match event {
                Some(event) => {
                    admit(&mut batch, event, &kinds, &ids, &local_events);
                    false
                }
                None => true,
            },
            _ = stop.changed() => true,
        };
        // Events taken off the bus and not yet counted as handled.
        let mut taken = u64::from(!stopping);
        loop {
            while batch.len() < DISPATCH_BATCH {
                let Some(event) = events.try_recv() else {
                    break;
                };
                taken += 1;
                admit(&mut batch, event, &kinds, &ids, &local_events);
            }
            if !batch.is_empty() {
                let now = Instant::now();
                let journal = outboxes.journal.get().map(|journal| &**journal);
                for endpoint in outboxes.endpoints.iter() {
                    endpoint.accept(&batch, now, journal, &outboxes.dead_letters);
                }
            }
            outboxes
                .handled
                .fetch_add(std::mem::take(&mut taken), Ordering::Release);
            if batch.is_empty() || !stopping {
                batch.clear();
                break;
            }
            batch.clear();
        }
        if stopping {
            return;
        }
    }
}

/// Which events that the log did not number (a member's own, such as the guard's) this
/// member sends: all of them outside a cluster; in one, only while it is the sender, since no
/// other member holds them.
struct LocalEvents(Option<Arc<Replication>>);

impl LocalEvents {
    fn admits(&self, event: &crate::events::Event) -> bool {
        event.log_id.is_some()
            || self
                .0
                .as_ref()
                .is_none_or(|replication| replication.is_delivering())
    }
}

fn admit(
    batch: &mut Vec<Arc<Message>>,
    event: crate::events::Event,
    kinds: &[EventKind],
    ids: &MessageIds,
    local_events: &LocalEvents,
) {
    if kinds.contains(&event.kind) && local_events.admits(&event) {
        // A cluster's event is numbered by the log, the same on every member: every member
        // that delivers it sends one id, which receivers deduplicate on.
        let id = match event.log_id {
            Some(log_id) => format!("msg_log_{log_id:016x}").into_boxed_str(),
            None => ids.next(),
        };
        batch.push(Arc::new(Message { id, event }));
    }
}
