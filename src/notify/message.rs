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

/// Hands out message ids.
#[derive(Debug)]
pub struct MessageIds {
    nonce: u64,
    next: AtomicU64,
}

impl Default for MessageIds {
    fn default() -> Self {
        Self {
            nonce: fastrand::u64(..) & 0xffff_ffff_ffff,
            next: AtomicU64::new(1),
        }
    }
}

impl MessageIds {
    pub fn next(&self) -> Box<str> {
        let sequence = self.next.fetch_add(1, Ordering::Relaxed);
        format!("msg_{:012x}{sequence:010x}", self.nonce).into_boxed_str()
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
