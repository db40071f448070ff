//! Replaying the webhook records of the log: which events were still held for which URL, and
//! which dead letters were kept, in their order. Pure: records in, state out; the notifier puts
//! the result back into its outboxes and dead letters after recovery.
//!
//! Every event held for a URL has a `WebhookQueued` record before any record that settles it,
//! because both are appended under that URL's lock; a replay that ends with an event queued and
//! not settled delivers it again after the restart, with the same `webhook-id` (at least once).

use std::collections::{BTreeMap, HashMap};

use super::record::{Record, WebhookMessage};

/// A dead letter read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Letter {
    /// Its id, if the record kept one (see `Record::DeadLetter`).
    pub letter_id: Option<u64>,
    pub message: WebhookMessage,
    pub last_error: String,
    pub failed_at_unix_ms: u64,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct WebhookReplay {
    /// Held events by the order they were (last) queued in.
    held: BTreeMap<u64, WebhookMessage>,
    /// `(url, id)` of a held event -> its place in `held`.
    held_at: HashMap<(String, String), u64>,
    letters: BTreeMap<u64, Letter>,
    /// Message id of a dead letter -> its place in `letters`.
    letter_at: HashMap<String, u64>,
    next: u64,
}

impl WebhookReplay {
    /// Applies one webhook record (others are ignored).
    pub fn apply(&mut self, record: Record) {
        self.next += 1;
        match record {
            Record::WebhookQueued(message) => {
                self.unhold(&message.url, &message.id);
                self.held_at
                    .insert((message.url.clone(), message.id.clone()), self.next);
                self.held.insert(self.next, message);
            }
            Record::WebhookDone { url, id } => self.unhold(&url, &id),
            Record::DeadLetter {
                letter_id,
                message,
                last_error,
                failed_at_unix_ms,
            } => {
                self.unhold(&message.url, &message.id);
                if let Some(earlier) = self.letter_at.insert(message.id.clone(), self.next) {
                    self.letters.remove(&earlier);
                }
                let letter = Letter {
                    letter_id,
                    message,
                    last_error,
                    failed_at_unix_ms,
                };
                self.letters.insert(self.next, letter);
            }
            Record::DeadLetterTaken { id } => {
                if let Some(at) = self.letter_at.remove(&id) {
                    self.letters.remove(&at);
                }
            }
            _ => {}
        }
    }

    /// The events still held, in the order they were queued, and the dead letters, oldest
    /// first.
    pub fn finish(self) -> (Vec<WebhookMessage>, Vec<Letter>) {
        (
            self.held.into_values().collect(),
            self.letters.into_values().collect(),
        )
    }

    fn unhold(&mut self, url: &str, id: &str) {
        if let Some(at) = self.held_at.remove(&(url.to_owned(), id.to_owned())) {
            self.held.remove(&at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{Event, EventKind};
    use crate::types::Key;

    fn message(url: &str, id: &str) -> WebhookMessage {
        WebhookMessage {
            url: url.into(),
            id: id.into(),
            attempts: 0,
            event: Event {
                kind: EventKind::Expired,
                key: Key::new(id).unwrap(),
                service: None,
                meta: None,
                ttl_ms: Some(1000),
                registered_at_ms: 1,
                last_heartbeat_at_ms: 2,
                deadline_ms: Some(3),
                occurred_at_ms: 4,
                lateness_ms: 1,
                restored: false,
                log_id: None,
            },
        }
    }

    #[test]
    fn held_events_and_letters_come_back_in_order_without_the_settled_ones() {
        let mut replay = WebhookReplay::default();
        let done = |url: &str, id: &str| Record::WebhookDone {
            url: url.into(),
            id: id.into(),
        };
        for record in [
            Record::WebhookQueued(message("a", "m1")),
            Record::WebhookQueued(message("b", "m1")),
            Record::WebhookQueued(message("a", "m2")),
            Record::WebhookQueued(message("a", "m3")),
            done("a", "m1"),
            Record::DeadLetter {
                letter_id: Some(7 << 16),
                message: message("a", "m2"),
                last_error: "HTTP 500".into(),
                failed_at_unix_ms: 9,
            },
            Record::WebhookQueued(message("a", "m4")),
            Record::DeadLetter {
                letter_id: None,
                message: message("b", "m5"),
                last_error: "timeout".into(),
                failed_at_unix_ms: 10,
            },
            Record::DeadLetterTaken { id: "m5".into() },
            Record::WebhookQueued(message("b", "m5")),
        ] {
            replay.apply(record);
        }
        let (held, letters) = replay.finish();
        let held: Vec<(String, String)> = held.into_iter().map(|m| (m.url, m.id)).collect();
        let expected = [("b", "m1"), ("a", "m3"), ("a", "m4"), ("b", "m5")];
        assert_eq!(
            held,
            expected.map(|(url, id)| (url.to_owned(), id.to_owned()))
        );
        assert_eq!(letters.len(), 1);
        assert_eq!(letters[0].message.id, "m2");
        assert_eq!(letters[0].last_error, "HTTP 500");
        assert_eq!(
            letters[0].letter_id,
            Some(7 << 16),
            "the id the record kept"
        );
    }
}
