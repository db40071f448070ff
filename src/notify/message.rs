//! A webhook message: one event with the id every attempt to every URL carries, and its body.
//!
//! Ids are `msg_` + a 48-bit random nonce drawn at start + a sequence number, so they are unique
//! within a run and, with overwhelming probability, across restarts: a receiver can deduplicate
//! on `webhook-id` alone. The body is built at send time from the event (it costs ~1 µs), so a
//! queued event holds its fields, not a serialized copy.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::clock::{rfc3339, Rfc3339};
use crate::events::{Event, EventData};

/// One event on its way to the webhook URLs.
#[derive(Debug)]
pub struct Message {
    /// The `webhook-id` header.
    pub id: Box<str>,
    pub event: Event,
}

impl Message {
    /// The JSON body: `{"type", "timestamp", "data"}`; `timestamp` is when the event happened.
    pub fn body(&self) -> Vec<u8> {
        serde_json::to_vec(&self.payload()).expect("an event always serializes")
    }

    /// The body as a value to serialize (also shown with dead letters).
    pub fn payload(&self) -> Payload<'_> {
        Payload {
            r#type: self.event.kind.type_name(),
            timestamp: rfc3339(self.event.occurred_at_ms),
            data: self.event.data(),
        }
    }
}

/// A webhook body.
#[derive(Debug, Serialize)]
pub struct Payload<'a> {
    r#type: &'static str,
    timestamp: Rfc3339,
    data: EventData<'a>,
}

/// The `type` of a batch's body.
pub const BATCH_TYPE: &str = "batch";

/// The body of a batch (`--webhook-batch-max` above 1), sent at Unix time `sent_at_ms`:
/// `{"type": "batch", "timestamp", "data": {"events": [{"id", "type", "timestamp", "data"}...]}}`.
/// Each event is the body it would have had alone plus its own `id`, which stays the same
/// whatever batch carries it: receivers deduplicate events on it.
pub fn batch_body(messages: &[std::sync::Arc<Message>], sent_at_ms: u64) -> Vec<u8> {
    #[derive(Serialize)]
    struct Batch<'a> {
        r#type: &'static str,
        timestamp: Rfc3339,
        data: BatchData<'a>,
    }
    #[derive(Serialize)]
    struct BatchData<'a> {
        events: Vec<BatchedEvent<'a>>,
    }
    #[derive(Serialize)]
    struct BatchedEvent<'a> {
        id: &'a str,
        #[serde(flatten)]
        payload: Payload<'a>,
    }
    let batch = Batch {
        r#type: BATCH_TYPE,
        timestamp: rfc3339(sent_at_ms),
        data: BatchData {
            events: messages
                .iter()
                .map(|message| BatchedEvent {
                    id: &message.id,
                    payload: message.payload(),
                })
                .collect(),
        },
    };
    serde_json::to_vec(&batch).expect("a batch always serializes")
}

/// Hands out message ids.
#[derive(Debug)]
pub struct MessageIds {
    prefix: &'static str,
    nonce: u64,
    next: AtomicU64,
}

impl Default for MessageIds {
    fn default() -> Self {
        Self::with_prefix("msg_")
    }
}

impl MessageIds {
    /// Ids that start with `prefix` (`msg_` for events, `batch_` for batches).
    pub fn with_prefix(prefix: &'static str) -> Self {
        Self {
            prefix,
            nonce: fastrand::u64(..) & 0xffff_ffff_ffff,
            next: AtomicU64::new(1),
        }
    }

    pub fn next(&self) -> Box<str> {
        let sequence = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{}{:012x}{sequence:010x}", self.prefix, self.nonce).into_boxed_str()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_distinct_and_share_the_run_prefix() {
        let ids = MessageIds::default();
        let first = ids.next();
        let second = ids.next();
        assert_ne!(first, second);
        assert_eq!(first.len(), "msg_".len() + 22);
        assert_eq!(first[..16], second[..16]);
    }
}
