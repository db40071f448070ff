//! Events that could not be delivered: kept for operators to read and re-send.
//!
//! Bounded: at most `max` letters, the newest kept. Each letter dropped to make room is counted
//! in `dropped`, which `GET /v1/webhooks/dead-letters` reports. Ids increase with each letter
//! and are never reused within a run, so a page cursor is simply the last id seen.
//!
//! Where ids come from: a single node counts (1, 2, ...; counted again after a restart, past
//! those a snapshot kept). A cluster member files every letter with the id its log gives it
//! ([`letter_id`]: the report's entry and place in it), so one letter has one id on every
//! member, before and after a failover, and an operator's retry forwarded to the leader names
//! the letter it named where it was listed.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;

use super::message::Message;

/// One undelivered event for one URL.
#[derive(Clone, Debug)]
pub struct DeadLetter {
    pub id: u64,
    /// Index of the URL in the configured list.
    pub endpoint: usize,
    pub message: Arc<Message>,
    pub attempts: u32,
    /// Why the last attempt failed (or why none was made).
    pub last_error: String,
    /// Unix ms.
    pub failed_at_ms: u64,
}

/// The id a cluster gives the dead letter filed by report `place` of the entry at
/// `log_index`: the same on every member, increasing with the log, and below 2^53 for the
/// first 2^37 entries, so JSON readers keep it exact. A leader proposes at most 1,024 reports
/// an entry (`cluster::leadership`), far inside the 16 bits a place has.
pub fn letter_id(log_index: u64, place: usize) -> u64 {
    (log_index << 16) | (place as u64 & 0xffff)
}

/// A letter to file: everything but the id.
#[derive(Debug)]
pub struct NewLetter {
    pub endpoint: usize,
    pub message: Arc<Message>,
    pub attempts: u32,
    pub last_error: String,
    pub failed_at_ms: u64,
}

impl NewLetter {
    fn numbered(self, id: u64) -> DeadLetter {
        DeadLetter {
            id,
            endpoint: self.endpoint,
            message: self.message,
            attempts: self.attempts,
            last_error: self.last_error,
            failed_at_ms: self.failed_at_ms,
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// In id order, oldest first.
    letters: VecDeque<DeadLetter>,
    next_id: u64,
    dropped: u64,
}

impl Inner {
    /// Drops the oldest letters past `max`, counting them.
    fn keep_newest(&mut self, max: usize) {
        while self.letters.len() > max {
            self.letters.pop_front();
            self.dropped += 1;
        }
    }
}

/// See the module documentation.
#[derive(Debug)]
pub struct DeadLetters {
    inner: Mutex<Inner>,
    max: usize,
}

/// A page of letters and what the store holds.
#[derive(Debug)]
pub struct Page {
    pub letters: Vec<DeadLetter>,
    /// The id to pass as `cursor` for the next page; `None` on the last page.
    pub next_cursor: Option<u64>,
    pub count: usize,
    pub dropped: u64,
}

impl DeadLetters {
    pub fn new(max: usize) -> Self {
        Self {
            inner: Mutex::new(Inner {
                next_id: 1,
                ..Inner::default()
            }),
            max,
        }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// Files a letter, dropping the oldest past the bound; returns its id.
    pub fn file(&self, letter: NewLetter) -> u64 {
        let mut inner = self.inner.lock();
        let id = inner.next_id;
        inner.next_id += 1;
        inner.letters.push_back(letter.numbered(id));
        inner.keep_newest(self.max);
        id
    }

    /// Files a letter under `id` (a cluster's, or one a snapshot kept), in id order; a letter
    /// already under `id` is replaced. Later [`DeadLetters::file`]s count on past it.
    pub fn file_numbered(&self, id: u64, letter: NewLetter) {
        let mut inner = self.inner.lock();
        inner.next_id = inner.next_id.max(id.saturating_add(1));
        let letter = letter.numbered(id);
        let at = inner.letters.partition_point(|l| l.id < id);
        match inner.letters.get_mut(at) {
            Some(same) if same.id == id => *same = letter,
            _ => inner.letters.insert(at, letter),
        }
        inner.keep_newest(self.max);
    }

    /// Up to `limit` letters with ids above `after`, oldest first.
    pub fn page(&self, after: Option<u64>, limit: usize) -> Page {
        let inner = self.inner.lock();
        let start = after.map_or(0, |after| inner.letters.partition_point(|l| l.id <= after));
        let letters: Vec<DeadLetter> = inner.letters.range(start..).take(limit).cloned().collect();
        let more = start + letters.len() < inner.letters.len();
        Page {
            next_cursor: letters.last().filter(|_| more).map(|last| last.id),
            letters,
            count: inner.letters.len(),
            dropped: inner.dropped,
        }
    }

    /// Removes and returns letter `id`.
    pub fn take(&self, id: u64) -> Option<DeadLetter> {
        let mut inner = self.inner.lock();
        let index = inner.letters.binary_search_by_key(&id, |l| l.id).ok()?;
        inner.letters.remove(index)
    }

    /// Removes and returns the letter of message `id` (a cluster's sender re-sent it).
    pub fn take_message(&self, id: &str) -> Option<DeadLetter> {
        let mut inner = self.inner.lock();
        let index = inner.letters.iter().position(|l| &*l.message.id == id)?;
        inner.letters.remove(index)
    }

    /// Removes every letter (a snapshot replaces them).
    pub fn clear(&self) {
        self.inner.lock().letters.clear();
    }

    /// Puts back a letter taken with [`DeadLetters::take`] (its re-send could not be queued).
    pub fn restore(&self, letter: DeadLetter) {
        let mut inner = self.inner.lock();
        let index = inner.letters.partition_point(|l| l.id < letter.id);
        inner.letters.insert(index, letter);
    }

    pub fn count(&self) -> usize {
        self.inner.lock().letters.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{Event, EventKind};
    use crate::types::Key;

    fn letter(n: u64) -> NewLetter {
        NewLetter {
            endpoint: 0,
            message: Arc::new(Message {
                id: format!("msg_{n}").into_boxed_str(),
                event: Event {
                    kind: EventKind::Expired,
                    key: Key::new("k").unwrap(),
                    service: None,
                    meta: None,
                    ttl_ms: None,
                    registered_at_ms: 0,
                    last_heartbeat_at_ms: 0,
                    deadline_ms: None,
                    occurred_at_ms: n,
                    lateness_ms: 0,
                    restored: false,
                    log_id: None,
                },
            }),
            attempts: 8,
            last_error: "HTTP 500".into(),
            failed_at_ms: n,
        }
    }

    #[test]
    fn keeps_the_newest_and_counts_the_dropped() {
        let store = DeadLetters::new(3);
        for n in 1..=5 {
            assert_eq!(store.file(letter(n)), n);
        }
        let page = store.page(None, 10);
        let ids: Vec<u64> = page.letters.iter().map(|l| l.id).collect();
        assert_eq!(ids, [3, 4, 5]);
        assert_eq!((page.count, page.dropped, page.next_cursor), (3, 2, None));
    }

    #[test]
    fn pages_take_and_restore_by_id() {
        let store = DeadLetters::new(10);
        for n in 1..=5 {
            store.file(letter(n));
        }
        let first = store.page(None, 2);
        assert_eq!(first.next_cursor, Some(2));
        let second = store.page(first.next_cursor, 2);
        assert_eq!(second.letters[0].id, 3);
        let taken = store.take(3).unwrap();
        assert!(store.take(3).is_none());
        assert_eq!(store.count(), 4);
        store.restore(taken);
        let ids: Vec<u64> = store.page(None, 10).letters.iter().map(|l| l.id).collect();
        assert_eq!(ids, [1, 2, 3, 4, 5]);
        assert_eq!(store.page(Some(5), 10).letters.len(), 0);
    }

    #[test]
    fn numbered_letters_keep_their_ids_in_order_and_counting_goes_on_past_them() {
        let store = DeadLetters::new(3);
        store.file_numbered(letter_id(9, 1), letter(1));
        store.file_numbered(letter_id(7, 0), letter(2));
        store.file_numbered(letter_id(9, 1), letter(3));
        let page = store.page(None, 10);
        let ids: Vec<u64> = page.letters.iter().map(|l| l.id).collect();
        assert_eq!(ids, [7 << 16, (9 << 16) | 1], "in id order, one per id");
        assert_eq!(
            &*page.letters[1].message.id, "msg_3",
            "the later filing replaced it"
        );
        assert_eq!(store.file(letter(4)), ((9 << 16) | 1) + 1);
        store.file_numbered(letter_id(10, 0), letter(5));
        let ids: Vec<u64> = store.page(None, 10).letters.iter().map(|l| l.id).collect();
        assert_eq!(
            ids,
            [(9 << 16) | 1, (9 << 16) | 2, 10 << 16],
            "the oldest dropped"
        );
        assert_eq!(store.page(None, 0).dropped, 1);
    }
}
