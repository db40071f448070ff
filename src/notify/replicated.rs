//! Webhook delivery in a cluster: every member holds every event, one member sends.
//!
//! Every member applies the same committed entries, so every member's notifier queues the same
//! events under the same ids (`msg_log_<log id>`). Only the member that leads, with its lease,
//! sends ([`Replication::set_delivering`]); the others hold. What the sender settles
//! (delivered, dead-lettered, a dead letter queued again) it reports here
//! ([`Replication::settled`]), the leader proposes those reports through the log each lease
//! tick ([`Replication::take_settled`]), and every other member applies them
//! ([`Replication::apply`]): the event leaves its outbox, or becomes the same dead letter,
//! under the same id (its report's log place: the sender files its own letters only then). So
//! a receiver gets each event once in the normal case; after a failover the new leader sends
//! what it still holds, which is what was not reported settled, under the same ids (at least
//! once, never two ids for one event).
//!
//! Invariants:
//! - A member sends only while [`Replication::is_delivering`]; the lease task turns it on for
//!   a promoted leader that may serve and off otherwise.
//! - A report applies at most once per member and never to an event in flight there (only the
//!   sender has one in flight, and it skips the entries of its own term, but for filing the
//!   dead letters it gave up on).
//! - A dead letter has one id on every member: `dead_letters::letter_id` of its report's
//!   entry and place, kept in snapshots.
//! - A report may be applied before its event reached the outbox (the events travel through the
//!   registry's bus, a queue the notifier drains on its own task): it is then kept as a
//!   *tombstone* the event meets when it arrives (`notify::endpoint`). Tombstones are bounded
//!   per URL (the oldest forgotten first: at worst that event is sent once more after a
//!   failover).
//! - A member's snapshot holds what its notifier holds (`durable_records`), and installing one
//!   replaces it ([`Replication::replace`]).

use std::sync::{Arc, OnceLock, Weak};

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

use super::Notifier;
use crate::persist::record::Record;
use crate::types::Key;

/// Most reports held for the next proposal: past it the oldest are forgotten (their events are
/// sent again after a failover, never lost).
pub const MAX_HELD_REPORTS: usize = 1 << 16;

/// How one event was settled by the member that sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settlement {
    /// A 2xx answer.
    Delivered,
    /// Given up: the same dead letter on every member.
    DeadLettered {
        attempts: u32,
        last_error: String,
        failed_at_unix_ms: u64,
    },
    /// A dead letter an operator sent again: back in the outbox, with a fresh budget.
    Requeued,
}

/// One event settled on the sending member, as the log carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settled {
    /// The URL's place in `--webhook-url`: the i-th URL of every member is one destination
    /// (members may name it differently, e.g. a receiver beside each member).
    pub endpoint: u16,
    /// The event's `webhook-id`.
    pub id: String,
    /// The event's key (its lane in the outbox).
    pub key: Key,
    pub how: Settlement,
}

/// See the module documentation. Shared by the cluster (lease task, state machine, snapshots)
/// and the notifier, which starts after the cluster: what arrives before it is kept.
#[derive(Debug)]
pub struct Replication {
    delivering: watch::Sender<bool>,
    settled: Mutex<Vec<Settled>>,
    notifier: OnceLock<Weak<Notifier>>,
    /// Webhook records read from a snapshot before the notifier started.
    early: Mutex<Vec<Record>>,
}

impl Default for Replication {
    fn default() -> Self {
        Self {
            delivering: watch::Sender::new(false),
            settled: Mutex::default(),
            notifier: OnceLock::new(),
            early: Mutex::default(),
        }
    }
}

impl Replication {
    /// Whether this member sends webhooks now.
    pub fn is_delivering(&self) -> bool {
        *self.delivering.borrow()
    }

    /// Turns sending on (a promoted leader that may serve) or off.
    pub fn set_delivering(&self, on: bool) {
        self.delivering.send_if_modified(|delivering| {
            let changed = *delivering != on;
            *delivering = on;
            changed
        });
    }

    /// Follows [`Replication::is_delivering`] (the delivery tasks wait on it).
    pub fn delivering(&self) -> watch::Receiver<bool> {
        self.delivering.subscribe()
    }

    /// Reports events this member settled, for the next proposal.
    pub fn settled(&self, reports: impl IntoIterator<Item = Settled>) {
        let mut held = self.settled.lock();
        held.extend(reports);
        if held.len() > MAX_HELD_REPORTS {
            let excess = held.len() - MAX_HELD_REPORTS;
            held.drain(..excess);
        }
    }

    /// The reports not proposed yet, oldest first.
    pub fn take_settled(&self) -> Vec<Settled> {
        std::mem::take(&mut *self.settled.lock())
    }

    /// Puts back reports whose proposal failed, before any taken since.
    pub fn put_back(&self, mut reports: Vec<Settled>) {
        let mut held = self.settled.lock();
        reports.append(&mut held);
        *held = reports;
    }

    /// Applies the reports of the entry at `log_index`: each event leaves this member's
    /// outbox (or becomes a dead letter, or leaves the dead letters again). The leader that
    /// proposed them (`by_this_member`) settled them as it sent them, but for the dead
    /// letters: every member files those now, numbered by the entry.
    pub fn apply(&self, reports: &[Settled], log_index: u64, by_this_member: bool, now: Instant) {
        if let Some(notifier) = self.notifier() {
            notifier.apply_settled(reports, log_index, by_this_member, now);
        }
    }

    /// Replaces what the notifier holds with `records` (a snapshot's webhook records).
    pub fn replace(&self, records: Vec<Record>, now: Instant) {
        match self.notifier() {
            Some(notifier) => notifier.replace_held(records, now),
            None => *self.early.lock() = records,
        }
    }

    /// Waits until the events of the entries applied so far are in the outboxes.
    pub async fn caught_up(&self) {
        if let Some(notifier) = self.notifier() {
            notifier.caught_up().await;
        }
    }

    /// What the notifier holds, as records for a snapshot.
    pub fn durable_records(&self) -> Vec<Record> {
        match self.notifier() {
            Some(notifier) => notifier.records_by_place(),
            None => self.early.lock().clone(),
        }
    }

    /// Called by the notifier as it starts: returns what a snapshot held before it.
    pub(super) fn attach(&self, notifier: &Arc<Notifier>) -> Vec<Record> {
        let _ = self.notifier.set(Arc::downgrade(notifier));
        std::mem::take(&mut *self.early.lock())
    }

    fn notifier(&self) -> Option<Arc<Notifier>> {
        self.notifier.get().and_then(Weak::upgrade)
    }
}
