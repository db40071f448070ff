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
//! - A slot's SSE frame, once encoded, is the frame of that event for every client (it depends
//!   only on the run, the `seq` and the event).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::RwLock;
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::events::{Event, EventData, EventReceiver};

/// Default number of events the ring keeps.
pub const DEFAULT_RING: u64 = 65_536;

/// Readers are woken at most this often while events keep coming (the first event after a
/// quiet spell wakes them at once). Why: every wake-up costs each connected client a task poll
/// and a write; waking 1,000 clients per event is what made them cost 1 ms per heartbeat.
pub const WAKE_INTERVAL: Duration = Duration::from_millis(10);

/// Events examined per read, matched or not, so that one read holds the ring briefly.
const SCAN_LIMIT: usize = 4096;

/// What a read of the ring found.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// The frames of the matching events after the cursor were appended; `through` is the
    /// `seq` of the last event examined (the new cursor), `at_end` whether it is the newest.
    Frames { through: u64, at_end: bool },
    /// Events after the cursor have already left the ring.
    Gap,
}

/// An event in the ring, and its SSE frame once a reader has needed it.
#[derive(Debug)]
struct Slot {
    event: Event,
    /// `id:`, `event:` and `data:` lines and the blank line: the same bytes for every client,
    /// so encoded once, by the first reader, and copied by the others.
    frame: OnceLock<Box<[u8]>>,
}

#[derive(Debug)]
struct Ring {
    slots: VecDeque<Slot>,
    /// `seq` of `slots[0]`.
    first_seq: u64,
}

/// See the module documentation.
#[derive(Debug)]
pub struct EventHub {
    run: u32,
    capacity: usize,
    ring: RwLock<Ring>,
    /// The newest `seq` readers were told of (0 before any event); see [`WAKE_INTERVAL`].
    latest: watch::Sender<u64>,
    /// Set once at shutdown: streams end so the server can finish.
    closing: watch::Sender<bool>,
    clients: AtomicUsize,
    dropped_clients: AtomicU64,
    /// Events that dropped clients had not read when they were dropped.
    dropped_events: AtomicU64,
}

/// The `data` of a stream event: the webhook payload's `data` and its `type`.
#[derive(Serialize)]
struct StreamData<'a> {
    r#type: &'static str,
    #[serde(flatten)]
    data: EventData<'a>,
}

impl EventHub {
    pub fn new(capacity: usize) -> Self {
        Self {
            run: fastrand::u32(..),
            capacity: capacity.max(1),
            ring: RwLock::new(Ring {
                slots: VecDeque::new(),
                first_seq: 1,
            }),
            latest: watch::channel(0).0,
            closing: watch::channel(false).0,
            clients: AtomicUsize::new(0),
            dropped_clients: AtomicU64::new(0),
            dropped_events: AtomicU64::new(0),
        }
    }

    /// Appends events and wakes the readers at once (tests; `feed` paces its wake-ups).
    #[cfg(test)]
    pub fn push(&self, events: impl IntoIterator<Item = Event>) {
        self.append(events);
        self.wake();
    }

    /// Appends events, dropping the oldest past the capacity, without waking the readers.
    fn append(&self, events: impl IntoIterator<Item = Event>) {
        let mut ring = self.ring.write();
        for event in events {
            ring.slots.push_back(Slot {
                event,
                frame: OnceLock::new(),
            });
            if ring.slots.len() > self.capacity {
                ring.slots.pop_front();
                ring.first_seq += 1;
            }
        }
    }

    /// Tells the readers about every event appended so far.
    fn wake(&self) {
        let newest = self.newest();
        self.latest.send_if_modified(|current| {
            let changed = *current != newest;
            *current = newest;
            changed
        });
    }

    /// Appends to `out` the frames of the events after `cursor` (the `seq` of the last event
    /// read) that `matches` accepts, stopping once `out` holds `max_bytes` or more.
    pub fn read_into(
        &self,
        cursor: u64,
        matches: impl Fn(&Event) -> bool,
        out: &mut Vec<u8>,
        max_bytes: usize,
    ) -> Read {
        let ring = self.ring.read();
        if cursor + 1 < ring.first_seq {
            return Read::Gap;
        }
        let start = ((cursor + 1 - ring.first_seq) as usize).min(ring.slots.len());
        let mut through = cursor.max(ring.first_seq - 1);
        for slot in ring.slots.range(start..).take(SCAN_LIMIT) {
            through += 1;
            if matches(&slot.event) {
                let frame = slot
                    .frame
                    .get_or_init(|| self.frame(through, &slot.event).into_boxed_slice());
                out.extend_from_slice(frame);
                if out.len() >= max_bytes {
                    break;
                }
            }
        }
        let newest = ring.first_seq + ring.slots.len() as u64 - 1;
        Read::Frames {
            through,
            at_end: through >= newest,
        }
    }

    /// The SSE frame of event `seq`.
    fn frame(&self, seq: u64, event: &Event) -> Vec<u8> {
        let data = StreamData {
            r#type: event.kind.stream_name(),
            data: event.data(),
        };
        let json = serde_json::to_string(&data).expect("an event always serializes");
        sse_frame(&self.id_of(seq), event.kind.stream_name(), &json)
    }

    /// The `seq` of the newest event in the ring (0 before any event), which readers may not
    /// have been told of yet.
    pub fn newest(&self) -> u64 {
        let ring = self.ring.read();
        ring.first_seq + ring.slots.len() as u64 - 1
    }

    /// The newest `seq` readers were told of (tests; clients start after [`EventHub::newest`]).
    #[cfg(test)]
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
        let first_seq = self.ring.read().first_seq;
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

/// One SSE frame: `id` and `event` lines, one `data` line (the JSON has no newlines) and the
/// blank line that ends it.
pub fn sse_frame(id: &str, event: &str, data: &str) -> Vec<u8> {
    debug_assert!(!data.contains('\n'), "one data line");
    format!("id: {id}\nevent: {event}\ndata: {data}\n\n").into_bytes()
}

/// Drains the registry's bus into the ring as events come, calling `observe` on each event
/// first (metrics), and wakes the readers at once after a quiet spell, else at most once per
/// [`WAKE_INTERVAL`]. Events are appended at once all the same, so a client that connects
/// starts after every event fed so far. Runs until the bus closes or the task is aborted.
pub async fn feed(mut events: EventReceiver, hub: Arc<EventHub>, observe: impl Fn(&Event)) {
    const BATCH: usize = 1024;
    let mut batch = Vec::with_capacity(BATCH);
    let mut last_wake: Option<Instant> = None;
    // Whether events were appended that readers were not told of.
    let mut unannounced = false;
    struct Closed;
    loop {
        let next = match last_wake {
            Some(last_wake) if unannounced => tokio::select! {
                event = events.recv() => event.map(Some).ok_or(Closed),
                () = tokio::time::sleep_until(last_wake + WAKE_INTERVAL) => Ok(None),
            },
            _ => events.recv().await.map(Some).ok_or(Closed),
        };
        match next {
            Ok(Some(first)) => {
                batch.push(first);
                while batch.len() < BATCH {
                    let Some(event) = events.try_recv() else {
                        break;
                    };
                    batch.push(event);
                }
                batch.iter().for_each(&observe);
                hub.append(batch.drain(..));
                unannounced = true;
                // Let other tasks run between batches (see `notify::dispatch`): a mass expiry
                // is a million events.
                tokio::task::yield_now().await;
            }
            Ok(None) => {} // time to announce
            Err(Closed) => {
                hub.wake();
                return;
            }
        }
        if unannounced && last_wake.is_none_or(|at| at + WAKE_INTERVAL <= Instant::now()) {
            hub.wake();
            last_wake = Some(Instant::now());
            unannounced = false;
        }
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

    /// The (seq, key) of each frame a read from `cursor` appends, and where it ended.
    fn read(hub: &EventHub, cursor: u64, max_bytes: usize) -> (Vec<(u64, String)>, Read) {
        let mut out = Vec::new();
        let read = hub.read_into(cursor, |_| true, &mut out, max_bytes);
        let text = String::from_utf8(out).unwrap();
        let frames = text
            .split_terminator("\n\n")
            .map(|frame| {
                let lines: Vec<&str> = frame.lines().collect();
                let seq = lines[0].rsplit_once('-').unwrap().1.parse().unwrap();
                let data: serde_json::Value =
                    serde_json::from_str(lines[2].strip_prefix("data: ").unwrap()).unwrap();
                assert_eq!(lines[1], "event: registered");
                assert_eq!(data["type"], "registered");
                (seq, data["key"].as_str().unwrap().to_owned())
            })
            .collect();
        (frames, read)
    }

    fn frames(read: (Vec<(u64, String)>, Read)) -> Vec<(u64, String)> {
        assert_ne!(read.1, Read::Gap);
        read.0
    }

    #[test]
    fn reads_continue_from_a_cursor_and_report_gaps() {
        let hub = EventHub::new(3);
        assert_eq!(hub.latest(), 0);
        hub.push((1..=2).map(event));
        assert_eq!(
            frames(read(&hub, 0, usize::MAX)),
            [(1, "k1".into()), (2, "k2".into())]
        );
        assert_eq!(frames(read(&hub, 1, usize::MAX)), [(2, "k2".into())]);
        assert_eq!(
            read(&hub, 2, usize::MAX),
            (
                vec![],
                Read::Frames {
                    through: 2,
                    at_end: true
                }
            )
        );
        hub.push((3..=5).map(event)); // the ring keeps 3..=5
        assert_eq!(hub.latest(), 5);
        assert_eq!(read(&hub, 1, usize::MAX).1, Read::Gap);
        // A read stops once it holds `max_bytes`: here, after the first frame.
        assert_eq!(
            read(&hub, 2, 1),
            (
                vec![(3, "k3".into())],
                Read::Frames {
                    through: 3,
                    at_end: false
                }
            )
        );
        hub.dropped(1);
        assert_eq!((hub.dropped_clients(), hub.dropped_events()), (1, 1));
    }

    #[test]
    fn a_filter_skips_events_and_the_cursor_moves_past_them() {
        let hub = EventHub::new(10);
        hub.push((1..=4).map(event));
        let mut out = Vec::new();
        let read = hub.read_into(0, |e| e.key.as_str() == "k3", &mut out, usize::MAX);
        assert_eq!(
            read,
            Read::Frames {
                through: 4,
                at_end: true
            }
        );
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with(&format!("id: {}\n", hub.id_of(3))),
            "{text}"
        );
        assert_eq!(text.matches("\n\n").count(), 1, "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_feed_wakes_readers_at_once_then_at_most_once_per_interval() {
        let bus = crate::events::EventBus::default();
        let hub = Arc::new(EventHub::new(100));
        let feeder = tokio::spawn(feed(bus.subscribe(), Arc::clone(&hub), |_| {}));
        let mut latest = hub.subscribe_latest();
        bus.publish(vec![event(1)]);
        latest.changed().await.unwrap();
        assert_eq!(
            *latest.borrow_and_update(),
            1,
            "the first event wakes at once"
        );
        let woken_at = Instant::now();
        bus.publish(vec![event(2)]);
        tokio::time::sleep(Duration::from_millis(1)).await;
        bus.publish(vec![event(3)]);
        latest.changed().await.unwrap();
        assert_eq!(*latest.borrow_and_update(), 3, "both events in one wake-up");
        assert!(
            woken_at.elapsed() >= WAKE_INTERVAL,
            "{:?}",
            woken_at.elapsed()
        );
        feeder.abort();
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
