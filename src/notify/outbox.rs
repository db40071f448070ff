//! One webhook URL's undelivered events: per-key order, retry times, and the memory bound.
//!
//! Invariants:
//! - The events of one key form a FIFO *lane*. Only the head of a lane is ever sent, and only
//!   after the previous head was settled (delivered or given up), so a URL receives one key's
//!   events in the order they happened, retries included.
//! - Every lane is in exactly one state: `Ready` (its key is queued in `ready`), `InFlight` (one
//!   attempt outstanding) or `Waiting` (its key is in `waiting` with a retry time).
//! - `len` counts every event held, the ones in flight included, and never exceeds `capacity`:
//!   [`Outbox::push`] refuses past it and the caller counts what it refused.
//! - A failing key holds back only its own later events; other keys keep flowing.
//!
//! Pure: time comes in as arguments, so the tests drive it without a clock or a network.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;

use tokio::time::Instant;

use super::message::Message;
use crate::types::Key;

/// An event held for one URL.
#[derive(Clone, Debug)]
pub struct Pending {
    pub message: Arc<Message>,
    /// Attempts made so far.
    pub attempts: u32,
    /// Position in this outbox's arrival order (for the oldest-pending age).
    arrival: u64,
}

/// One attempt to make now.
#[derive(Clone, Debug)]
pub struct Job {
    pub message: Arc<Message>,
    /// 1 for the first attempt.
    pub attempt: u32,
}

/// The outbox is at capacity; the event was not taken.
#[derive(Debug, PartialEq, Eq)]
pub struct Full;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LaneState {
    Ready,
    InFlight,
    Waiting,
}

#[derive(Debug)]
struct Lane {
    events: VecDeque<Pending>,
    state: LaneState,
}

/// See the module documentation.
#[derive(Debug)]
pub struct Outbox {
    lanes: HashMap<Key, Lane, foldhash::fast::RandomState>,
    /// Keys whose head can be sent now, in the order they became ready.
    ready: VecDeque<Key>,
    /// Keys waiting to retry their head, soonest first (ties in arrival order).
    waiting: BinaryHeap<Reverse<(Instant, u64, Key)>>,
    /// When each held event arrived, by arrival number: the first entry is the oldest.
    arrived_at: BTreeMap<u64, Instant>,
    next_arrival: u64,
    len: usize,
    in_flight: usize,
    capacity: usize,
}

impl Outbox {
    pub fn new(capacity: usize) -> Self {
        Self {
            lanes: HashMap::default(),
            ready: VecDeque::new(),
            waiting: BinaryHeap::new(),
            arrived_at: BTreeMap::new(),
            next_arrival: 0,
            len: 0,
            in_flight: 0,
            capacity,
        }
    }

    /// Events held, in flight included.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Every held event (in flight included), in arrival order, with its attempts so far.
    pub fn held(&self) -> Vec<&Pending> {
        let mut held: Vec<&Pending> = self
            .lanes
            .values()
            .flat_map(|lane| lane.events.iter())
            .collect();
        held.sort_by_key(|pending| pending.arrival);
        held
    }

    /// When the oldest held event arrived.
    pub fn oldest_arrival(&self) -> Option<Instant> {
        self.arrived_at.values().next().copied()
    }

    /// The earliest retry time, if any lane waits on one.
    pub fn next_retry_at(&self) -> Option<Instant> {
        self.waiting.peek().map(|Reverse((at, _, _))| *at)
    }

    /// Queues `message` behind the earlier events of its key, with `attempts` already made.
    pub fn push(&mut self, message: Arc<Message>, attempts: u32, now: Instant) -> Result<(), Full> {
        if self.len >= self.capacity {
            return Err(Full);
        }
        let arrival = self.next_arrival;
        self.next_arrival += 1;
        self.arrived_at.insert(arrival, now);
        self.len += 1;
        let key = message.event.key.clone();
        let pending = Pending {
            message,
            attempts,
            arrival,
        };
        match self.lanes.get_mut(&key) {
            Some(lane) => lane.events.push_back(pending),
            None => {
                self.lanes.insert(
                    key.clone(),
                    Lane {
                        events: VecDeque::from([pending]),
                        state: LaneState::Ready,
                    },
                );
                self.ready.push_back(key);
            }
        }
        Ok(())
    }

    /// Up to `limit` attempts to start now: lanes whose retry time has come rejoin the ready
    /// queue first, then ready lanes go in flight in the order they became ready.
    pub fn take_jobs(&mut self, now: Instant, limit: usize) -> Vec<Job> {
        while let Some(Reverse((at, _, _))) = self.waiting.peek() {
            if *at > now {
                break;
            }
            let Reverse((_, _, key)) = self.waiting.pop().expect("peeked");
            if let Some(lane) = self.lanes.get_mut(&key) {
                lane.state = LaneState::Ready;
                self.ready.push_back(key);
            }
        }
        let mut jobs = Vec::with_capacity(limit.min(self.ready.len()));
        while jobs.len() < limit {
            let Some(key) = self.ready.pop_front() else {
                break;
            };
            let Some(lane) = self.lanes.get_mut(&key) else {
                continue;
            };
            let head = lane.events.front_mut().expect("a lane is never empty");
            head.attempts += 1;
            lane.state = LaneState::InFlight;
            self.in_flight += 1;
            jobs.push(Job {
                message: Arc::clone(&head.message),
                attempt: head.attempts,
            });
        }
        jobs
    }

    /// The in-flight head of `key`'s lane was delivered.
    pub fn delivered(&mut self, key: &Key) {
        self.settle_head(key);
    }

    /// The in-flight head of `key`'s lane failed for good; it is returned for the dead letters.
    pub fn given_up(&mut self, key: &Key) -> Option<Pending> {
        self.settle_head(key)
    }

    /// The in-flight head of `key`'s lane failed and is to be tried again at `at`.
    pub fn retry_at(&mut self, key: &Key, at: Instant) {
        let Some(lane) = self.lanes.get_mut(key) else {
            return;
        };
        debug_assert_eq!(lane.state, LaneState::InFlight);
        lane.state = LaneState::Waiting;
        self.in_flight -= 1;
        let arrival = lane.events.front().map_or(0, |head| head.arrival);
        self.waiting.push(Reverse((at, arrival, key.clone())));
    }

    /// Takes out every event that is not in flight (when a URL is gone): they go to the dead
    /// letters. In-flight heads stay until their attempt settles.
    pub fn drain_idle(&mut self) -> Vec<Pending> {
        let mut drained = Vec::new();
        self.lanes.retain(|_, lane| {
            let keep_head = lane.state == LaneState::InFlight;
            let skip = usize::from(keep_head);
            drained.extend(lane.events.drain(skip..));
            keep_head
        });
        self.ready.clear();
        self.waiting.clear();
        for pending in &drained {
            self.arrived_at.remove(&pending.arrival);
        }
        self.len -= drained.len();
        drained
    }

    fn settle_head(&mut self, key: &Key) -> Option<Pending> {
        let lane = self.lanes.get_mut(key)?;
        debug_assert_eq!(lane.state, LaneState::InFlight);
        let head = lane.events.pop_front()?;
        self.in_flight -= 1;
        self.len -= 1;
        self.arrived_at.remove(&head.arrival);
        if lane.events.is_empty() {
            self.lanes.remove(key);
        } else {
            lane.state = LaneState::Ready;
            self.ready.push_back(key.clone());
        }
        Some(head)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::events::{Event, EventKind};

    fn message(key: &str, sequence: u64) -> Arc<Message> {
        Arc::new(Message {
            id: format!("msg_{sequence}").into_boxed_str(),
            event: Event {
                kind: EventKind::Expired,
                key: Key::new(key).unwrap(),
                service: None,
                meta: None,
                ttl_ms: Some(1000),
                registered_at_ms: 0,
                last_heartbeat_at_ms: 0,
                deadline_ms: Some(1000),
                occurred_at_ms: 1000 + sequence,
                lateness_ms: 0,
                restored: false,
            },
        })
    }

    fn ids(jobs: &[Job]) -> Vec<&str> {
        jobs.iter().map(|job| &*job.message.id).collect()
    }

    fn key(text: &str) -> Key {
        Key::new(text).unwrap()
    }

    #[test]
    fn one_key_one_event_in_flight_at_a_time() {
        let now = Instant::now();
        let mut outbox = Outbox::new(10);
        outbox.push(message("a", 1), 0, now).unwrap();
        outbox.push(message("a", 2), 0, now).unwrap();
        outbox.push(message("b", 3), 0, now).unwrap();
        assert_eq!(ids(&outbox.take_jobs(now, 10)), ["msg_1", "msg_3"]);
        assert!(
            outbox.take_jobs(now, 10).is_empty(),
            "a's second waits for its first"
        );
        outbox.delivered(&key("a"));
        assert_eq!(ids(&outbox.take_jobs(now, 10)), ["msg_2"]);
        assert_eq!((outbox.len(), outbox.in_flight()), (2, 2));
    }

    #[test]
    fn a_retrying_key_holds_back_only_its_own_events() {
        let now = Instant::now();
        let mut outbox = Outbox::new(10);
        outbox.push(message("a", 1), 0, now).unwrap();
        outbox.push(message("a", 2), 0, now).unwrap();
        outbox.push(message("b", 3), 0, now).unwrap();
        outbox.take_jobs(now, 10);
        outbox.retry_at(&key("a"), now + Duration::from_secs(5));
        outbox.delivered(&key("b"));
        outbox.push(message("b", 4), 0, now).unwrap();
        assert_eq!(ids(&outbox.take_jobs(now, 10)), ["msg_4"]);
        assert_eq!(outbox.next_retry_at(), Some(now + Duration::from_secs(5)));
        assert!(outbox
            .take_jobs(now + Duration::from_millis(4999), 10)
            .is_empty());
        let retried = outbox.take_jobs(now + Duration::from_secs(5), 10);
        assert_eq!(ids(&retried), ["msg_1"]);
        assert_eq!(retried[0].attempt, 2, "the retry is the second attempt");
    }

    #[test]
    fn refuses_past_capacity_and_counts_in_flight_events() {
        let now = Instant::now();
        let mut outbox = Outbox::new(2);
        outbox.push(message("a", 1), 0, now).unwrap();
        outbox.push(message("b", 2), 0, now).unwrap();
        outbox.take_jobs(now, 10);
        assert_eq!(outbox.push(message("c", 3), 0, now), Err(Full));
        outbox.delivered(&key("a"));
        assert_eq!(outbox.push(message("c", 3), 0, now), Ok(()));
    }

    #[test]
    fn the_oldest_arrival_follows_settlements() {
        let start = Instant::now();
        let later = start + Duration::from_secs(1);
        let mut outbox = Outbox::new(10);
        outbox.push(message("a", 1), 0, start).unwrap();
        outbox.push(message("b", 2), 0, later).unwrap();
        assert_eq!(outbox.oldest_arrival(), Some(start));
        outbox.take_jobs(later, 1);
        let given_up = outbox.given_up(&key("a")).unwrap();
        assert_eq!((&*given_up.message.id, given_up.attempts), ("msg_1", 1));
        assert_eq!(outbox.oldest_arrival(), Some(later));
    }

    #[test]
    fn draining_keeps_only_what_is_in_flight() {
        let now = Instant::now();
        let mut outbox = Outbox::new(10);
        for (key, sequence) in [("a", 1), ("a", 2), ("b", 3), ("c", 4)] {
            outbox.push(message(key, sequence), 0, now).unwrap();
        }
        outbox.take_jobs(now, 2); // a#1 and b#3 in flight
        outbox.retry_at(&key("b"), now + Duration::from_secs(1));
        let mut drained: Vec<_> = outbox
            .drain_idle()
            .iter()
            .map(|pending| pending.message.id.to_string())
            .collect();
        drained.sort();
        assert_eq!(drained, ["msg_2", "msg_3", "msg_4"]);
        assert_eq!((outbox.len(), outbox.in_flight()), (1, 1));
        outbox.delivered(&key("a"));
        assert!(outbox.is_empty());
        assert!(outbox
            .take_jobs(now + Duration::from_secs(2), 10)
            .is_empty());
    }

    #[derive(Clone, Debug)]
    enum Step {
        Push(u8),
        Take(usize),
        Deliver,
        Fail { retry_in_ms: u64 },
        GiveUp,
        Advance(u64),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => (0u8..4).prop_map(Step::Push),
            2 => (1usize..4).prop_map(Step::Take),
            2 => Just(Step::Deliver),
            1 => (0u64..50).prop_map(|retry_in_ms| Step::Fail { retry_in_ms }),
            1 => Just(Step::GiveUp),
            1 => (0u64..60).prop_map(Step::Advance),
        ]
    }

    proptest! {
        /// Whatever happens, each key's events leave the outbox (delivered or given up) in the
        /// order they came in, at most one per key is in flight, and the counts add up.
        #[test]
        fn per_key_order_and_counts_hold(steps in proptest::collection::vec(step(), 1..200)) {
            let mut now = Instant::now();
            let mut outbox = Outbox::new(8);
            let mut sequence = 0u64;
            let mut pushed: HashMap<String, Vec<u64>> = HashMap::new();
            let mut settled: HashMap<String, Vec<u64>> = HashMap::new();
            let mut in_flight: Vec<Job> = Vec::new();
            for step in steps {
                match step {
                    Step::Push(which) => {
                        sequence += 1;
                        let name = format!("k{which}");
                        if outbox.push(message(&name, sequence), 0, now).is_ok() {
                            pushed.entry(name).or_default().push(sequence);
                        }
                    }
                    Step::Take(limit) => {
                        for job in outbox.take_jobs(now, limit) {
                            let key = &job.message.event.key;
                            prop_assert!(in_flight.iter().all(|other| other.message.event.key != *key));
                            in_flight.push(job);
                        }
                    }
                    Step::Deliver | Step::GiveUp | Step::Fail { .. } if !in_flight.is_empty() => {
                        let job = in_flight.remove(0);
                        let key = job.message.event.key.clone();
                        match step {
                            Step::Fail { retry_in_ms } => {
                                outbox.retry_at(&key, now + Duration::from_millis(retry_in_ms));
                            }
                            Step::Deliver => {
                                outbox.delivered(&key);
                                settled.entry(key.as_str().to_owned()).or_default().push(job.message.event.occurred_at_ms - 1000);
                            }
                            _ => {
                                let head = outbox.given_up(&key).expect("in flight");
                                prop_assert!(Arc::ptr_eq(&head.message, &job.message));
                                settled.entry(key.as_str().to_owned()).or_default().push(job.message.event.occurred_at_ms - 1000);
                            }
                        }
                    }
                    Step::Advance(ms) => now += Duration::from_millis(ms),
                    _ => {}
                }
                prop_assert_eq!(outbox.in_flight(), in_flight.len());
                let n_settled: usize = settled.values().map(Vec::len).sum();
                let n_pushed: usize = pushed.values().map(Vec::len).sum();
                prop_assert_eq!(outbox.len(), n_pushed - n_settled);
                prop_assert!(outbox.len() <= 8);
            }
            for (key, order) in &settled {
                prop_assert_eq!(&pushed[key][..order.len()], &order[..]);
            }
        }
    }
}
