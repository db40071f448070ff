//! The live event stream behind `GET /v1/events`: a bounded ring of recent events, numbered,
//! that each SSE client reads at its own pace.
//!
//! Invariants:
//! - The ring holds the last `capacity` events; event `seq` numbers are consecutive, so a
//!   client's position is one number and a read is an index computation.
//! - Nothing waits on a client: the feeder pushes into the ring and moves on. A client that
//!   falls more than `capacity` events behind is told (`reset`), dropped and counted.
//! - Event ids are `<run>-<seq>`, where `run` is random per process: a client resuming with an
//!   id from another run (or from before the ring) gets a `reset` instead of a silent gap.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;

use crate::events::{Event, EventReceiver};

/// Default number of events the ring keeps.
pub const DEFAULT_RING: u64 = 65_536;

/// What a read of the ring found.
#[derive(Debug)]
pub enum Read {
    /// Events after the cursor, oldest first (possibly none yet).
    Events(Vec<(u64, Arc<Event>)>),
    /// Events after the cursor have already left the ring.
    Gap,
}

#[derive(Debug)]
struct Ring {
    events: VecDeque<Arc<Event>>,
    /// `seq` of `events[0]`.
    first_seq: u64,
}

/// See the module documentation.
#[derive(Debug)]
pub struct EventHub {
    run: u32,
    capacity: usize,
    ring: Mutex<Ring>,
    /// The newest `seq` (0 before any event).
    latest: watch::Sender<u64>,
    /// Set once at shutdown: streams end so the server can finish.
    closing: watch::Sender<bool>,
    clients: AtomicUsize,
    dropped_clients: AtomicU64,
    /// Events that dropped clients had not read when they were dropped.
    dropped_events: AtomicU64,
}

impl EventHub {
    pub fn new(capacity: usize) -> Self {
        Self {
            run: fastrand::u32(..),
            capacity: capacity.max(1),
            ring: Mutex::new(Ring {
                events: VecDeque::new(),
                first_seq: 1,
            }),
            latest: watch::channel(0).0,
            closing: watch::channel(false).0,
            clients: AtomicUsize::new(0),
            dropped_clients: AtomicU64::new(0),
            dropped_events: AtomicU64::new(0),
        }
    }

    /// Appends events, dropping the oldest past the capacity, and wakes the readers.
    pub fn push(&self, events: impl IntoIterator<Item = Event>) {
        let latest = {
            let mut ring = self.ring.lock();
            for event in events {
                ring.events.push_back(Arc::new(event));
                if ring.events.len() > self.capacity {
                    ring.events.pop_front();
                    ring.first_seq += 1;
                }
            }
            ring.first_seq + ring.events.len() as u64 - 1
        };
        self.latest.send_if_modified(|current| {
            let changed = *current != latest;
            *current = latest;
            changed
        });
    }

    /// Up to `limit` events after `cursor` (the `seq` of the last event read).
    pub fn read_after(&self, cursor: u64, limit: usize) -> Read {
        let ring = self.ring.lock();
        if cursor + 1 < ring.first_seq {
            return Read::Gap;
        }
        let start = (cursor + 1 - ring.first_seq) as usize;
        Read::Events(
            ring.events
                .range(start.min(ring.events.len())..)
                .take(limit)
                .enumerate()
                .map(|(i, event)| (cursor + 1 + i as u64, Arc::clone(event)))
                .collect(),
        )
    }

    /// The newest `seq`: a new client starts after it.
    pub fn latest(&self) -> u64 {
        *self.latest.borrow()
    }

    pub fn subscribe_latest(&self) -> watch::Receiver<u64> {
        self.latest.subscribe()
    }

    pub fn subscribe_closing(&self) -> watch::Receiver<bool> {
        self.closing.subscribe()
    }

    /// Ends every stream (at shutdown).
    pub fn close(&self) {
        self.closing.send_replace(true);
    }

    /// The SSE `id` of event `seq`.
    pub fn id_of(&self, seq: u64) -> String {
        format!("{:08x}-{seq}", self.run)
    }

    /// The `seq` a `Last-Event-ID` names, if it comes from this run.
    pub fn parse_id(&self, id: &str) -> Option<u64> {
        let (run, seq) = id.trim().split_once('-')?;
        (u32::from_str_radix(run, 16).ok()? == self.run).then_some(())?;
        seq.parse().ok()
    }

    /// Counts a client in for as long as the guard lives.
    pub fn client(self: &Arc<Self>) -> ClientGuard {
        self.clients.fetch_add(1, Ordering::Relaxed);
        ClientGuard(Arc::clone(self))
    }

    /// Records a client dropped for falling behind at `cursor`.
    pub fn dropped(&self, cursor: u64) {
        let first_seq = self.ring.lock().first_seq;
        self.dropped_clients.fetch_add(1, Ordering::Relaxed);
        self.dropped_events
            .fetch_add(first_seq.saturating_sub(cursor + 1), Ordering::Relaxed);
    }

    pub fn clients(&self) -> usize {
        self.clients.load(Ordering::Relaxed)
    }

    pub fn dropped_clients(&self) -> u64 {
        self.dropped_clients.load(Ordering::Relaxed)
    }

    pub fn dropped_events(&self) -> u64 {
        self.dropped_events.load(Ordering::Relaxed)
    }
}

/// Keeps a stream client counted.
#[derive(Debug)]
pub struct ClientGuard(Arc<EventHub>);

impl Drop for ClientGuard {
    fn drop(&mut self) {
        self.0.clients.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Drains the registry's bus into the ring, calling `observe` on each event first (metrics).
/// Runs until the bus closes or the task is aborted.
pub async fn feed(mut events: EventReceiver, hub: Arc<EventHub>, observe: impl Fn(&Event)) {
    const BATCH: usize = 1024;
    let mut batch = Vec::with_capacity(BATCH);
    while let Some(first) = events.recv().await {
        batch.push(first);
        while batch.len() < BATCH {
            let Some(event) = events.try_recv() else {
                break;
            };
            batch.push(event);
        }
        batch.iter().for_each(&observe);
        hub.push(batch.drain(..));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::EventKind;
    use crate::types::Key;

    fn event(n: u64) -> Event {
        Event {
            kind: EventKind::Registered,
            key: Key::new(&format!("k{n}")).unwrap(),
            service: None,
            meta: None,
            ttl_ms: Some(1000),
            registered_at_ms: n,
            last_heartbeat_at_ms: n,
            deadline_ms: Some(n + 1000),
            occurred_at_ms: n,
            lateness_ms: 0,
            restored: false,
        }
    }

    fn keys(read: Read) -> Vec<(u64, String)> {
        match read {
            Read::Events(events) => events
                .into_iter()
                .map(|(seq, e)| (seq, e.key.to_string()))
                .collect(),
            Read::Gap => panic!("gap"),
        }
    }

    #[test]
    fn reads_continue_from_a_cursor_and_report_gaps() {
        let hub = EventHub::new(3);
        assert_eq!(hub.latest(), 0);
        hub.push((1..=2).map(event));
        assert_eq!(
            keys(hub.read_after(0, 10)),
            [(1, "k1".into()), (2, "k2".into())]
        );
        assert_eq!(keys(hub.read_after(1, 10)), [(2, "k2".into())]);
        assert!(keys(hub.read_after(2, 10)).is_empty());
        hub.push((3..=5).map(event)); // the ring keeps 3..=5
        assert_eq!(hub.latest(), 5);
        assert!(matches!(hub.read_after(1, 10), Read::Gap));
        assert_eq!(keys(hub.read_after(2, 1)), [(3, "k3".into())]);
        hub.dropped(1);
        assert_eq!((hub.dropped_clients(), hub.dropped_events()), (1, 1));
    }

    #[test]
    fn ids_round_trip_within_a_run_only() {
        let hub = EventHub::new(3);
        let other = EventHub::new(3);
        let id = hub.id_of(42);
        assert_eq!(hub.parse_id(&id), Some(42));
        if other.run != hub.run {
            assert_eq!(other.parse_id(&id), None);
        }
        assert_eq!(hub.parse_id("nonsense"), None);
    }
}
