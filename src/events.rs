//! Registration, expiry and deletion events, and their fan-out to subscribers.
//!
//! The registry publishes one [`Event`] per registration (a heartbeat that creates a key), per
//! expiry and per deletion, while it still holds the
//! lock of the key's shard, so the events of one key reach every subscriber in the order they
//! happened. A shard publishes the events of one operation, or of one sweep chunk, as one batch:
//! one allocation and one queue push per batch instead of per event, which was two thirds of
//! the cost of a mass expiry (measured: 174 ms -> 62 ms for 1M keys without it).
//!
//! Slow consumers: publishing never blocks and never drops. Each subscriber has its own unbounded
//! queue; a consumer that falls behind costs memory, not heartbeats. The backlog is bounded in
//! practice by what can expire (one event per registration and per deletion) and is visible as
//! [`EventReceiver::backlog`]. Consumers that must bound their own memory (webhook delivery, live
//! streams) drain this queue promptly into their own bounded structures, where they count what
//! they shed. A subscriber that is dropped is unsubscribed at the next publish.
//!
//! A subscriber may take only some kinds of event ([`EventBus::subscribe_to`]): the bus then
//! never queues the others for it, so it is not woken for them. Webhooks never send
//! `registered` events, and a webhook dispatcher woken for each creation only to drop it was
//! a wake-up per heartbeat batch under a registration load.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use serde::Serialize;
use serde_json::value::RawValue;
use tokio::sync::mpsc;

use crate::clock::rfc3339;
use crate::types::{Key, Meta, ServiceName};

/// What happened to a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A heartbeat created it (a renewal of an alive key is not an event).
    Registered,
    /// Its deadline passed without a heartbeat.
    Expired,
    /// A client deleted it (`DELETE`, or an EXPIRE with a non-positive TTL or a past time).
    Deleted,
    /// The mass-expiry guard engaged: due keys are held. Not about one key: the event's `meta`
    /// carries its details (state, cause, baseline...), which are its `data`.
    GuardEngaged,
    /// The guard's hold ended: held keys are being released (expired at a bounded rate after
    /// the maximum hold, at once by an operator), or none are left to release. Details in
    /// `meta`, as for `GuardEngaged`.
    GuardReleased,
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
    /// An expiry of a key restored from the persistence log at start-up and not renewed since:
    /// its deadline was set by the restart rule (restart + TTL), not by a heartbeat.
    pub restored: bool,
    /// Cluster mode: the event's number in the Raft log, `index << 16 | position` (the
    /// entry's index and the record's or key's position in it), the same on every member:
    /// its webhook id comes from it, so every member's delivery of one event carries one id.
    pub log_id: Option<u64>,
}

impl EventKind {
    /// The kind's bit in a [`Kinds`] set.
    fn bit(self) -> u8 {
        1 << self as u8
    }

    /// The event's name in the live stream: `registered`, `expired`, `deleted`.
    pub fn stream_name(self) -> &'static str {
        match self {
            Self::Registered => "registered",
            Self::Expired => "expired",
            Self::Deleted => "deleted",
            Self::GuardEngaged => "guard.engaged",
            Self::GuardReleased => "guard.released",
        }
    }

    /// The event's `type` in webhook payloads (and live streams): `key.expired`, `key.deleted`.
    pub fn type_name(self) -> &'static str {
        match self {
            Self::Registered => "key.registered",
            Self::Expired => "key.expired",
            Self::Deleted => "key.deleted",
            Self::GuardEngaged => "guard.engaged",
            Self::GuardReleased => "guard.released",
        }
    }

    /// Whether the event is about the guard rather than a key.
    pub fn is_guard(self) -> bool {
        matches!(self, Self::GuardEngaged | Self::GuardReleased)
    }
}

impl Event {
    /// The event's fields as outside consumers see them (times in RFC 3339).
    pub fn data(&self) -> EventData<'_> {
        EventData {
            kind: self.kind,
            key: self.key.as_str(),
            service: self.service.as_ref().map(ServiceName::as_str),
            meta: self.meta.as_ref().map(Meta::raw),
            ttl_ms: self.ttl_ms,
            registered_at_ms: self.registered_at_ms,
            last_heartbeat_at_ms: self.last_heartbeat_at_ms,
            deadline_ms: self.deadline_ms,
            occurred_at_ms: self.occurred_at_ms,
            lateness_ms: self.lateness_ms,
            restored: self.restored,
        }
    }
}

/// An event's fields, borrowed, as outside consumers see them: serialized as the `data` object
/// of a webhook payload: `{key, service, meta, ttl_ms, registered_at, last_heartbeat_at,
/// deadline, occurred_at, lateness_ms, restored}` (`service`, `meta`, `ttl_ms` and `deadline`
/// are `null` when the key had none; times in RFC 3339). Borrowed, so that an [`Event`] and the
/// stream ring's compact form of one (`stream::compact`) serialize through this one code.
#[derive(Clone, Copy, Debug)]
pub struct EventData<'a> {
    /// What happened.
    pub kind: EventKind,
    /// The key (for a guard event, a placeholder that is not serialized).
    pub key: &'a str,
    /// The key's service, if it had one.
    pub service: Option<&'a str>,
    /// The key's metadata, or a guard event's details (a JSON object).
    pub meta: Option<&'a RawValue>,
    /// See [`Event::ttl_ms`].
    pub ttl_ms: Option<u64>,
    /// Unix ms.
    pub registered_at_ms: u64,
    /// Unix ms.
    pub last_heartbeat_at_ms: u64,
    /// Unix ms; see [`Event::deadline_ms`].
    pub deadline_ms: Option<u64>,
    /// Unix ms.
    pub occurred_at_ms: u64,
    /// See [`Event::lateness_ms`].
    pub lateness_ms: u64,
    /// See [`Event::restored`].
    pub restored: bool,
}

impl Serialize for EventData<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        if self.kind.is_guard() {
            // As a map (not raw JSON), so the live stream can flatten it beside its `type`.
            let details: serde_json::Map<String, serde_json::Value> = self
                .meta
                .and_then(|details| serde_json::from_str(details.get()).ok())
                .unwrap_or_default();
            return details.serialize(serializer);
        }
        let mut data = serializer.serialize_struct("EventData", 10)?;
        data.serialize_field("key", self.key)?;
        data.serialize_field("service", &self.service)?;
        data.serialize_field("meta", &self.meta)?;
        data.serialize_field("ttl_ms", &self.ttl_ms)?;
        data.serialize_field("registered_at", &rfc3339(self.registered_at_ms))?;
        data.serialize_field("last_heartbeat_at", &rfc3339(self.last_heartbeat_at_ms))?;
        data.serialize_field("deadline", &self.deadline_ms.map(rfc3339))?;
        data.serialize_field("occurred_at", &rfc3339(self.occurred_at_ms))?;
        data.serialize_field("lateness_ms", &self.lateness_ms)?;
        data.serialize_field("restored", &self.restored)?;
        data.end()
    }
}

/// A set of event kinds: what a subscriber takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kinds(u8);

impl Kinds {
    /// Every kind, including any added later.
    pub const ALL: Self = Self(u8::MAX);

    pub fn of(kinds: &[EventKind]) -> Self {
        Self(kinds.iter().fold(0, |bits, kind| bits | kind.bit()))
    }

    pub fn contains(self, kind: EventKind) -> bool {
        self.0 & kind.bit() != 0
    }
}

/// A batch of events, shared by every subscriber that takes all of them.
type Batch = Arc<Vec<Event>>;

/// One subscriber's end as the bus sees it.
#[derive(Debug)]
struct Subscriber {
    sender: mpsc::UnboundedSender<Batch>,
    /// Events sent and not yet received.
    backlog: Arc<AtomicUsize>,
    /// Events ever sent.
    published: Arc<AtomicU64>,
    /// What it takes: the bus sends it nothing else.
    kinds: Kinds,
}

impl Subscriber {
    /// What of `batch` this subscriber takes: all of it shared, a copy of the part it takes,
    /// or nothing.
    fn share_of(&self, batch: &Batch) -> Option<Batch> {
        if self.kinds == Kinds::ALL {
            return Some(Arc::clone(batch));
        }
        let taken = batch
            .iter()
            .filter(|event| self.kinds.contains(event.kind))
            .count();
        match taken {
            0 => None,
            n if n == batch.len() => Some(Arc::clone(batch)),
            _ => Some(Arc::new(
                batch
                    .iter()
                    .filter(|event| self.kinds.contains(event.kind))
                    .cloned()
                    .collect(),
            )),
        }
    }
}

/// Fans events out to every current subscriber.
#[derive(Debug, Default)]
pub struct EventBus {
    /// One unbounded queue per subscriber; closed ones are pruned on the next publish.
    subscribers: RwLock<Vec<Subscriber>>,
}

/// The receiving end of a subscription: events one at a time, in publication order.
#[derive(Debug)]
pub struct EventReceiver {
    receiver: mpsc::UnboundedReceiver<Batch>,
    /// The batch being handed out, and the index of its next event.
    current: Option<(Batch, usize)>,
    backlog: Arc<AtomicUsize>,
    published: Arc<AtomicU64>,
}

impl EventReceiver {
    /// The next event, or `None` once the bus is gone.
    pub async fn recv(&mut self) -> Option<Event> {
        loop {
            if let Some(event) = self.next_in_batch() {
                return Some(event);
            }
            self.current = Some((self.receiver.recv().await?, 0));
        }
    }

    /// The next event if one is queued.
    pub fn try_recv(&mut self) -> Option<Event> {
        loop {
            if let Some(event) = self.next_in_batch() {
                return Some(event);
            }
            self.current = Some((self.receiver.try_recv().ok()?, 0));
        }
    }

    /// Events queued and not yet received.
    pub fn backlog(&self) -> usize {
        self.backlog.load(Ordering::Relaxed)
    }

    /// How many events were ever published to this subscriber, for another task to read
    /// (it compares them with how many it has handled).
    pub fn published_counter(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.published)
    }

    fn next_in_batch(&mut self) -> Option<Event> {
        let (batch, next) = self.current.as_mut()?;
        let event = batch.get(*next)?.clone();
        *next += 1;
        self.backlog.fetch_sub(1, Ordering::Relaxed);
        Some(event)
    }
}

impl EventBus {
    /// A subscriber to every event.
    pub fn subscribe(&self) -> EventReceiver {
        self.subscribe_to(Kinds::ALL)
    }

    /// A subscriber to the events of `kinds` only.
    pub fn subscribe_to(&self, kinds: Kinds) -> EventReceiver {
        let (sender, receiver) = mpsc::unbounded_channel();
        let backlog = Arc::new(AtomicUsize::new(0));
        let published = Arc::new(AtomicU64::new(0));
        self.subscribers.write().push(Subscriber {
            sender,
            backlog: Arc::clone(&backlog),
            published: Arc::clone(&published),
            kinds,
        });
        EventReceiver {
            receiver,
            current: None,
            backlog,
            published,
        }
    }

    /// Hands `events`, in order, to every subscriber that takes them, without waiting.
    pub fn publish(&self, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        let subscribers = self.subscribers.read();
        if subscribers.is_empty() {
            return;
        }
        let batch = Arc::new(events);
        let mut saw_closed = false;
        for subscriber in subscribers.iter() {
            let Some(share) = subscriber.share_of(&batch) else {
                // Pruned on an event it would not take too: a dropped subscriber that takes
                // few kinds would otherwise stay, and be filtered for, until one of them came.
                saw_closed |= subscriber.sender.is_closed();
                continue;
            };
            subscriber.backlog.fetch_add(share.len(), Ordering::Relaxed);
            subscriber
                .published
                .fetch_add(share.len() as u64, Ordering::Release);
            saw_closed |= subscriber.sender.send(share).is_err();
        }
        drop(subscribers);
        if saw_closed {
            self.subscribers
                .write()
                .retain(|subscriber| !subscriber.sender.is_closed());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: EventKind, key: &str) -> Event {
        Event {
            kind,
            key: Key::new(key).unwrap(),
            service: None,
            meta: None,
            ttl_ms: Some(1_000),
            registered_at_ms: 0,
            last_heartbeat_at_ms: 0,
            deadline_ms: Some(1_000),
            occurred_at_ms: 1_000,
            lateness_ms: 0,
            restored: false,
            log_id: None,
        }
    }

    /// At most 128 bytes, an event is moved by inline copies; at 136 each move called
    /// `memcpy` (see `ServiceName`).
    #[test]
    fn an_event_is_at_most_128_bytes() {
        assert!(std::mem::size_of::<Event>() <= 128);
    }

    fn drain(receiver: &mut EventReceiver) -> Vec<(EventKind, String)> {
        std::iter::from_fn(|| receiver.try_recv())
            .map(|event| (event.kind, event.key.as_str().to_owned()))
            .collect()
    }

    /// A subscriber to some kinds gets those, in order, and nothing is queued for it (so
    /// nothing wakes it) when a batch holds none of them; one to every kind gets everything.
    #[test]
    fn a_subscriber_gets_only_the_kinds_it_takes() {
        let bus = EventBus::default();
        let mut all = bus.subscribe();
        let mut expiries = bus.subscribe_to(Kinds::of(&[EventKind::Expired, EventKind::Deleted]));
        let published = expiries.published_counter();

        bus.publish(vec![
            event(EventKind::Registered, "a"),
            event(EventKind::Registered, "b"),
        ]);
        assert_eq!(published.load(Ordering::Acquire), 0);
        assert_eq!(expiries.backlog(), 0);
        assert!(
            expiries.receiver.is_empty(),
            "nothing queued, so no wake-up"
        );

        bus.publish(vec![
            event(EventKind::Expired, "a"),
            event(EventKind::Registered, "c"),
            event(EventKind::Deleted, "b"),
        ]);
        bus.publish(vec![event(EventKind::Expired, "c")]);
        assert_eq!(published.load(Ordering::Acquire), 3);
        assert_eq!(expiries.backlog(), 3);
        assert_eq!(
            drain(&mut expiries),
            [
                (EventKind::Expired, "a".to_owned()),
                (EventKind::Deleted, "b".to_owned()),
                (EventKind::Expired, "c".to_owned()),
            ]
        );
        assert_eq!(expiries.backlog(), 0);
        let keys: Vec<String> = drain(&mut all).into_iter().map(|(_, key)| key).collect();
        assert_eq!(keys, ["a", "b", "a", "c", "b", "c"]);
    }

    /// A dropped subscriber is unsubscribed at the next publish, also when it would not
    /// have taken that publish's events.
    #[test]
    fn a_dropped_subscriber_to_some_kinds_is_unsubscribed() {
        let bus = EventBus::default();
        let _stream = bus.subscribe();
        drop(bus.subscribe_to(Kinds::of(&[EventKind::Expired])));
        assert_eq!(bus.subscribers.read().len(), 2);
        bus.publish(vec![event(EventKind::Registered, "a")]);
        assert_eq!(bus.subscribers.read().len(), 1);
    }

    /// A guard event's `data` is its details as a map, so the live stream can flatten it
    /// beside its `type` (raw JSON cannot be flattened).
    #[test]
    fn a_guard_event_flattens_beside_a_type() {
        #[derive(Serialize)]
        struct Flattened<'a> {
            r#type: &'static str,
            #[serde(flatten)]
            data: EventData<'a>,
        }
        let details = serde_json::json!({"state": "engaged", "baseline": 7});
        let event = Event {
            kind: EventKind::GuardEngaged,
            key: Key::new("guard").unwrap(),
            service: None,
            meta: Meta::from_value(&details).ok(),
            ttl_ms: None,
            registered_at_ms: 0,
            last_heartbeat_at_ms: 0,
            deadline_ms: None,
            occurred_at_ms: 0,
            lateness_ms: 0,
            restored: false,
            log_id: None,
        };
        let text = serde_json::to_value(Flattened {
            r#type: event.kind.stream_name(),
            data: event.data(),
        })
        .expect("serializes");
        assert_eq!(
            text,
            serde_json::json!({"type": "guard.engaged", "state": "engaged", "baseline": 7})
        );
    }
}
