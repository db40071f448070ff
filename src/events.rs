//! Expiry and deletion events, and their fan-out to subscribers.
//!
//! The registry publishes one [`Event`] per expiry and per deletion, while it still holds the
//! lock of the key's shard, so the events of one key reach every subscriber in the order they
//! happened.
//!
//! Slow consumers: publishing never blocks and never drops. Each subscriber has its own unbounded
//! queue; a consumer that falls behind costs memory, not heartbeats. The backlog is bounded in
//! practice by what can expire (one event per registration and per deletion) and is visible as
//! [`EventReceiver::backlog`]. Consumers that must bound their own memory (webhook delivery, live
//! streams) drain this queue promptly into their own bounded structures, where they count what
//! they shed. A subscriber that is dropped is unsubscribed at the next publish.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::types::{Key, Meta, ServiceName};

/// What happened to a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// Its deadline passed without a heartbeat.
    Expired,
    /// A client deleted it (`DELETE`, or an EXPIRE with a non-positive TTL or a past time).
    Deleted,
}

/// One expiry or deletion. Times are Unix milliseconds (display time; see `clock`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    pub key: Key,
    pub service: Option<ServiceName>,
    pub meta: Option<Meta>,
    /// The TTL the key last had; `None` when it had none (persistent).
    pub ttl_ms: Option<u64>,
    pub registered_at_ms: u64,
    pub last_heartbeat_at_ms: u64,
    /// When it was due; `None` for a persistent key that was deleted.
    pub deadline_ms: Option<u64>,
    pub occurred_at_ms: u64,
    /// `occurred_at - deadline` for an expiry; 0 for a deletion.
    pub lateness_ms: u64,
}

/// Fans events out to every current subscriber.
#[derive(Debug, Default)]
pub struct EventBus {
    /// One unbounded queue per subscriber; closed ones are pruned on the next publish.
    subscribers: RwLock<Vec<mpsc::UnboundedSender<Arc<Event>>>>,
    /// Events published since start, for observability and tests.
    n_published: AtomicU64,
}

/// The receiving end of a subscription.
#[derive(Debug)]
pub struct EventReceiver {
    receiver: mpsc::UnboundedReceiver<Arc<Event>>,
}

impl EventReceiver {
    /// The next event, or `None` once the bus is gone.
    pub async fn recv(&mut self) -> Option<Arc<Event>> {
        self.receiver.recv().await
    }

    /// The next event if one is queued.
    pub fn try_recv(&mut self) -> Option<Arc<Event>> {
        self.receiver.try_recv().ok()
    }

    /// Events queued and not yet received.
    pub fn backlog(&self) -> usize {
        self.receiver.len()
    }
}

impl EventBus {
    pub fn subscribe(&self) -> EventReceiver {
        let (sender, receiver) = mpsc::unbounded_channel();
        self.subscribers.write().push(sender);
        EventReceiver { receiver }
    }

    /// Hands `event` to every subscriber without waiting.
    pub fn publish(&self, event: Event) {
        self.n_published.fetch_add(1, Ordering::Relaxed);
        let event = Arc::new(event);
        let mut saw_closed = false;
        for subscriber in self.subscribers.read().iter() {
            saw_closed |= subscriber.send(Arc::clone(&event)).is_err();
        }
        if saw_closed {
            self.subscribers
                .write()
                .retain(|subscriber| !subscriber.is_closed());
        }
    }

    pub fn n_published(&self) -> u64 {
        self.n_published.load(Ordering::Relaxed)
    }
}
