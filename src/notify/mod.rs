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
//! - Events are held in memory only: those still held when the shutdown grace period ends are
//!   counted in the log and lost. (Persistence is a later issue.)

pub mod backoff;
pub mod dead_letters;
pub mod endpoint;
pub mod health;
pub mod message;
pub mod outbox;
pub mod signing;
pub mod transport;

use std::sync::Arc;
use std::time::Duration;

use reqwest::Url;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::events::{EventKind, EventReceiver};
use dead_letters::{DeadLetter, DeadLetters};
use endpoint::{Delivery, Endpoint, EndpointStatus};
use message::{Message, MessageIds};
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
}

impl Notifier {
    /// Starts delivering the events that arrive on `events` (a subscription to the registry's
    /// bus). With no URL configured it drops the subscription (the bus prunes it) and starts no
    /// task.
    pub fn start(settings: Settings, events: EventReceiver) -> Result<Arc<Self>, NotifyError> {
        let dead_letters = Arc::new(DeadLetters::new(settings.dead_letters_max));
        let endpoints: Arc<[Arc<Endpoint>]> = settings
            .urls
            .iter()
            .enumerate()
            .map(|(index, url)| Arc::new(Endpoint::new(index, url.clone(), settings.queue_max)))
            .collect();
        let (stop, _) = watch::channel(None);
        let notifier = Arc::new(Self {
            endpoints: Arc::clone(&endpoints),
            dead_letters: Arc::clone(&dead_letters),
            stop,
            dispatcher: parking_lot::Mutex::new(None),
            deliverers: parking_lot::Mutex::new(Vec::new()),
            settings: settings.clone(),
        });
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
            max_attempts: settings.max_attempts,
            retry_schedule: settings.retry_schedule.clone(),
            dead_letters,
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
            endpoints,
            settings.events,
            notifier.stop.subscribe(),
        )));
        for url in &settings.urls {
            tracing::info!(url = %url.origin().ascii_serialization(), "delivering webhooks");
        }
        Ok(notifier)
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
        match endpoint.requeue(Arc::clone(&letter.message), now) {
            Ok(()) => Ok(letter),
            Err(_full) => {
                let url = endpoint.shown_url().to_owned();
                self.dead_letters.restore(letter);
                Err(RetryError::QueueFull(url))
            }
        }
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
            tracing::warn!(
                pending,
                drain_timeout = %humantime::format_duration(self.settings.drain_timeout),
                "webhooks: events still pending at shutdown are lost (they are held in memory only)"
            );
        }
    }
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

/// Moves events from the registry's bus into every outbox until asked to stop, then moves what
/// is left and returns.
async fn dispatch(
    mut events: EventReceiver,
    endpoints: Arc<[Arc<Endpoint>]>,
    kinds: Vec<EventKind>,
    mut stop: watch::Receiver<Option<Instant>>,
) {
    let ids = MessageIds::default();
    let mut batch: Vec<Arc<Message>> = Vec::new();
    loop {
        let stopping = tokio::select! {
            event = events.recv() => match event {
                Some(event) => {
                    admit(&mut batch, event, &kinds, &ids);
                    false
                }
                None => true,
            },
            _ = stop.changed() => true,
        };
        loop {
            while batch.len() < DISPATCH_BATCH {
                let Some(event) = events.try_recv() else {
                    break;
                };
                admit(&mut batch, event, &kinds, &ids);
            }
            if batch.is_empty() {
                break;
            }
            let now = Instant::now();
            for endpoint in endpoints.iter() {
                endpoint.accept(&batch, now);
            }
            batch.clear();
            if !stopping {
                break;
            }
        }
        if stopping {
            return;
        }
    }
}

fn admit(
    batch: &mut Vec<Arc<Message>>,
    event: crate::events::Event,
    kinds: &[EventKind],
    ids: &MessageIds,
) {
    if kinds.contains(&event.kind) {
        batch.push(Arc::new(Message {
            id: ids.next(),
            event,
        }));
    }
}
