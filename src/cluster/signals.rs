//! What the lease task (`cluster::leadership`) tells the rest of the member, and what the
//! state machine tells it: shared atomics, read on hot paths without a lock.
//!
//! - `serve_until`: the instant up to which this member may acknowledge renewals, propose
//!   expiries and serve linearizable reads (`Lease::may_serve`: leader, promoted, and the
//!   quorum acknowledgment plus the fence). Only the lease task sets it, from the earlier of
//!   its two acknowledgment estimates, so a late update only ends serving early.
//! - `leading_term`: the term this member leads, 0 when it does not: the state machine skips
//!   the checkpoints of the term it leads (its own deadlines are the real ones).
//! - `blank_term`: the newest term whose blank entry was applied here, the promotion point.
//! - `events_complete_from`: the first log id this member has published every event from
//!   (the entry after the snapshot it loaded last); the live stream resumes only above it,
//!   and tells its live readers to re-read the lists when it changes (a snapshot installed
//!   while they read: its entries' events were never published here).

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{watch, Notify};
use tokio::time::Instant;

/// See the module documentation.
#[derive(Debug)]
pub struct LeaseSignals {
    /// The instant `serve_until` counts from.
    base: Instant,
    /// Nanoseconds after `base` until which this member may serve; 0: it may not.
    serve_until_ns: AtomicU64,
    /// The term this member leads (0: none).
    leading_term: AtomicU64,
    /// The newest term whose blank entry was applied here (0: none yet).
    blank_term: AtomicU64,
    /// Wakes the lease task early (a blank entry applied).
    pub wake: Notify,
    /// See the module documentation; watched by the live stream's hub.
    events_complete_from: watch::Sender<u64>,
}

impl LeaseSignals {
    pub fn new(base: Instant) -> Self {
        Self {
            base,
            serve_until_ns: AtomicU64::new(0),
            leading_term: AtomicU64::new(0),
            blank_term: AtomicU64::new(0),
            wake: Notify::new(),
            events_complete_from: watch::channel(0).0,
        }
    }

    /// Whether this member may serve at `now` (see the module documentation).
    pub fn may_serve(&self, now: Instant) -> bool {
        let until = self.serve_until_ns.load(Ordering::Acquire);
        until != 0 && (now.saturating_duration_since(self.base).as_nanos() as u64) < until
    }

    /// Serve until `until`, or not at all (`None`).
    pub fn set_serve_until(&self, until: Option<Instant>) {
        // An instant at or before `base` is 0 ns: no serving, as it should be.
        let ns = until.map_or(0, |until| {
            until.saturating_duration_since(self.base).as_nanos() as u64
        });
        self.serve_until_ns.store(ns, Ordering::Release);
    }

    /// A snapshot covering entries up to `last_index` was loaded: events of earlier entries
    /// were never published here.
    pub fn snapshot_loaded(&self, last_index: Option<u64>) {
        let from = last_index.map_or(0, |index| (index + 1) << 16);
        self.events_complete_from.send_replace(from);
    }

    /// See [`LeaseSignals::snapshot_loaded`].
    pub fn events_complete_from(&self) -> watch::Receiver<u64> {
        self.events_complete_from.subscribe()
    }

    pub fn leading_term(&self) -> u64 {
        self.leading_term.load(Ordering::Acquire)
    }

    pub fn set_leading_term(&self, term: u64) {
        self.leading_term.store(term, Ordering::Release);
    }

    pub fn blank_term(&self) -> u64 {
        self.blank_term.load(Ordering::Acquire)
    }

    /// The state machine applied the blank entry of `term`.
    pub fn blank_applied(&self, term: u64) {
        self.blank_term.fetch_max(term, Ordering::AcqRel);
        self.wake.notify_one();
    }

    /// The state machine applied an entry of `term`, or loaded a snapshot whose last entry is
    /// of `term`: every term's first entry is its leader's blank entry, so that one was
    /// applied, here or before the snapshot. (A leader restarted in its own term, its blank
    /// entry inside the snapshot it loaded, would otherwise never serve: openraft does not
    /// write a new one.)
    pub fn term_applied(&self, term: u64) {
        if term > self.blank_term() {
            self.blank_applied(term);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_member_serves_exactly_until_the_instant_it_was_given() {
        let base = Instant::now();
        let signals = LeaseSignals::new(base);
        assert!(!signals.may_serve(base), "nothing given: no serving");
        signals.set_serve_until(Some(base + Duration::from_millis(800)));
        assert!(signals.may_serve(base + Duration::from_millis(799)));
        assert!(!signals.may_serve(base + Duration::from_millis(800)));
        signals.set_serve_until(None);
        assert!(!signals.may_serve(base));
        signals.set_serve_until(Some(base));
        assert!(
            !signals.may_serve(base),
            "an instant already past serves nothing"
        );
    }
}
