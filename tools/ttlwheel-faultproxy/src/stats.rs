//! The link's counters: bytes delivered and dropped each way, connections. Updated by the
//! proxy's tasks, read by the test (a snapshot, or a wait until a condition holds, so a test
//! waits for an event rather than for a length of time).

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Notify;

use crate::fault::Direction;

/// One direction's counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowStats {
    /// Bytes written to the receiving side.
    pub delivered: u64,
    /// Bytes read from the sending side and dropped by a blackhole.
    pub dropped: u64,
}

/// A snapshot of a link's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Connections accepted, whatever became of them.
    pub accepted: u64,
    /// Connections open now (accepted and not closed yet, reaching the target or held short of it).
    pub open: u64,
    /// Connections that reached the target.
    pub connected: u64,
    /// Connections reset by the proxy: accepted while the link was cut, open when it was cut,
    /// or holding a hole when a blackhole lifted.
    pub reset: u64,
    /// Bytes towards the target.
    pub to_target: FlowStats,
    /// Bytes back from the target.
    pub to_client: FlowStats,
}

/// The live counters behind [`LinkStats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// See [`LinkStats::accepted`].
    accepted: AtomicU64,
    /// See [`LinkStats::open`].
    open: AtomicU64,
    /// See [`LinkStats::connected`].
    connected: AtomicU64,
    /// See [`LinkStats::reset`].
    reset: AtomicU64,
    /// Delivered towards the target.
    delivered_to_target: AtomicU64,
    /// Dropped on the way to the target.
    dropped_to_target: AtomicU64,
    /// Delivered back to the client.
    delivered_to_client: AtomicU64,
    /// Dropped on the way back.
    dropped_to_client: AtomicU64,
    /// Woken after every change, for [`Counters::wait_until`].
    changed: Notify,
}

impl Counters {
    /// A snapshot. Each counter is read on its own (Relaxed): a test that needs two to agree
    /// waits until they do.
    pub(crate) fn snapshot(&self) -> LinkStats {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        LinkStats {
            accepted: load(&self.accepted),
            open: load(&self.open),
            connected: load(&self.connected),
            reset: load(&self.reset),
            to_target: FlowStats {
                delivered: load(&self.delivered_to_target),
                dropped: load(&self.dropped_to_target),
            },
            to_client: FlowStats {
                delivered: load(&self.delivered_to_client),
                dropped: load(&self.dropped_to_client),
            },
        }
    }

    /// Waits until `done` holds for a snapshot, and returns that snapshot.
    pub(crate) async fn wait_until(&self, done: impl Fn(&LinkStats) -> bool) -> LinkStats {
        loop {
            // Registered before the check, so a change between the check and the await wakes it.
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let stats = self.snapshot();
            if done(&stats) {
                return stats;
            }
            notified.await;
        }
    }

    /// Adds `n` to `counter` and wakes the waiters.
    fn add(&self, counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
        self.changed.notify_waiters();
    }

    pub(crate) fn accepted(&self) {
        self.add(&self.accepted, 1);
    }

    pub(crate) fn connected(&self) {
        self.add(&self.connected, 1);
    }

    pub(crate) fn reset(&self) {
        self.add(&self.reset, 1);
    }

    pub(crate) fn delivered(&self, direction: Direction, n: usize) {
        let counter = match direction {
            Direction::ToTarget => &self.delivered_to_target,
            Direction::ToClient => &self.delivered_to_client,
        };
        self.add(counter, n as u64);
    }

    pub(crate) fn dropped(&self, direction: Direction, n: usize) {
        let counter = match direction {
            Direction::ToTarget => &self.dropped_to_target,
            Direction::ToClient => &self.dropped_to_client,
        };
        self.add(counter, n as u64);
    }

    /// Counts a connection open until the returned guard is dropped (also when its task is
    /// aborted).
    pub(crate) fn open(&self) -> OpenGuard<'_> {
        self.add(&self.open, 1);
        OpenGuard { counters: self }
    }
}

/// Holds one count of [`LinkStats::open`].
pub(crate) struct OpenGuard<'a> {
    /// Where the count is taken back.
    counters: &'a Counters,
}

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.counters.open.fetch_sub(1, Ordering::Relaxed);
        self.counters.changed.notify_waiters();
    }
}
