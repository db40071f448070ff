//! One webhook URL's undelivered events: per-key order, retry times, and the memory bound.
//!
//! Invariants:
//! - The events of one key form a FIFO *lane*. Only the head of a lane is ever sent, and only
//!   after the previous head was settled (delivered or given up), so a URL receives one key's
//!   events in the order they happened, retries included.
//! - Every lane is in exactly one state: `Ready` (its key is queued in `ready`), `InFlight` (one
//!   attempt outstanding) or `Waiting` (its key is in one failed job's retry, in `waiting` or,
//!   once due, in `ready`).
//! - A job is one request: a single event, or a *batch* of heads of distinct lanes. A failed
//!   job is retried whole: the same events, under the same batch id, so a receiver that
//!   deduplicates on `webhook-id` sees each batch once.
//! - `len` counts every event held, the ones in flight included, and never exceeds `capacity`:
//!   [`Outbox::push`] refuses past it and the caller counts what it refused.
//! - A failing key holds back only its own later events; other keys keep flowing.
//!
//! Pure: time comes in as arguments, so the tests drive it without a clock or a network.

use std::cmp::{Ordering, Reverse};
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

/// One request to make now: one event, or a batch of events of distinct keys.
#[derive(Clone, Debug)]
pub struct Job {
    /// A batch's `webhook-id`, repeated by every retry of the batch; `None` for a single event
    /// sent as itself, under its own id (no batching).
    pub batch_id: Option<Arc<str>>,
    /// Heads of distinct lanes, oldest first.
    pub messages: Vec<Arc<Message>>,
    /// 1 for the first attempt; for a batch whose events were held with different counts
    /// (restored from the log), the highest.
    pub attempt: u32,
}

impl Job {
    /// A job of `heads` (event and its attempt number), or none if there is no head.
    fn of(
        batch_id: Option<Arc<str>>,
        heads: impl IntoIterator<Item = (Arc<Message>, u32)>,
    ) -> Option<Self> {
        let mut attempt = 0;
        let messages: Vec<Arc<Message>> = heads
            .into_iter()
            .map(|(message, attempts)| {
                attempt = attempt.max(attempts);
                message
            })
            .collect();
        (!messages.is_empty()).then_some(Self {
            batch_id,
            messages,
            attempt,
        })
    }

    /// The `webhook-id` this job's request carries: the batch's, or the single event's.
    pub fn webhook_id(&self) -> &str {
        self.batch_id
            .as_deref()
            .unwrap_or_else(|| &self.messages[0].id)
    }

    pub fn keys(&self) -> impl Iterator<Item = &Key> {
        self.messages.iter().map(|message| &message.event.key)
    }
}

/// How [`Outbox::take_jobs`] groups ready events into requests.
pub struct Batching<'a> {
    /// Most events per request; 1 sends each event as itself.
    pub max: usize,
    /// A fresh batch id (only called when `max > 1`).
    pub mint: &'a mut dyn FnMut() -> Arc<str>,
}

/// Something that can be sent now.
#[derive(Debug)]
enum Ready {
    /// A lane whose head can go (in a new job).
    Lane(Key),
    /// A failed job whose retry time has come.
    Retry(Retry),
}

/// A failed job waiting to be tried again, whole.
#[derive(Debug)]
struct Retry {
    at: Instant,
    /// The oldest event's arrival: ties in retry time go in arrival order.
    arrival: u64,
    keys: Vec<Key>,
    batch_id: Option<Arc<str>>,
}

impl PartialEq for Retry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Retry {}

impl PartialOrd for Retry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Retry {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.arrival).cmp(&(other.at, other.arrival))
    }
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
    /// What can be sent now, in the order it became ready: lanes whose head can go, and
    /// failed jobs whose retry time has come.
    ready: VecDeque<Ready>,
    /// Failed jobs waiting to retry, soonest first.
    waiting: BinaryHeap<Reverse<Retry>>,
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

    /// The earliest retry time still to come, if any job waits on one (a due one waits only
    /// for room in flight, which the caller tracks).
    pub fn next_retry_at(&self) -> Option<Instant> {
        self.waiting.peek().map(|Reverse(retry)| retry.at)
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
                self.ready.push_back(Ready::Lane(key));
            }
        }
        Ok(())
    }

    /// Up to `limit` requests to start now, in the order their events became ready: failed
    /// jobs whose retry time has come rejoin that order whole (behind what was ready before
    /// them, so a URL that keeps failing one job still tries the others), and runs of ready
    /// lanes become new jobs of up to `batching.max` events.
    pub fn take_jobs(&mut self, now: Instant, limit: usize, batching: Batching<'_>) -> Vec<Job> {
        while self
            .waiting
            .peek()
            .is_some_and(|Reverse(retry)| retry.at <= now)
        {
            let Reverse(retry) = self.waiting.pop().expect("peeked");
            self.ready.push_back(Ready::Retry(retry));
        }
        let mut jobs = Vec::with_capacity(limit.min(self.ready.len()));
        while jobs.len() < limit {
            match self.ready.pop_front() {
                None => break,
                Some(Ready::Retry(retry)) => {
                    let heads = retry
                        .keys
                        .iter()
                        .filter_map(|key| self.start_head(key, LaneState::Waiting))
                        .collect::<Vec<_>>();
                    jobs.extend(Job::of(retry.batch_id, heads));
                }
                Some(Ready::Lane(key)) => {
                    let mut heads: Vec<_> = self
                        .start_head(&key, LaneState::Ready)
                        .into_iter()
                        .collect();
                    while heads.len() < batching.max {
                        let Some(Ready::Lane(_)) = self.ready.front() else {
                            break;
                        };
                        let Some(Ready::Lane(key)) = self.ready.pop_front() else {
                            unreachable!("just looked");
                        };
                        heads.extend(self.start_head(&key, LaneState::Ready));
                    }
                    if !heads.is_empty() {
                        let batch_id = (batching.max > 1).then(|| (batching.mint)());
                        jobs.extend(Job::of(batch_id, heads));
                    }
                }
            }
        }
        jobs
    }

    /// Sends the head of `key`'s lane if the lane is in state `from`: one more attempt.
    fn start_head(&mut self, key: &Key, from: LaneState) -> Option<(Arc<Message>, u32)> {
        let lane = self.lanes.get_mut(key).filter(|lane| lane.state == from)?;
        let head = lane.events.front_mut().expect("a lane is never empty");
        head.attempts += 1;
        lane.state = LaneState::InFlight;
        self.in_flight += 1;
        Some((Arc::clone(&head.message), head.attempts))
    }

    /// The in-flight head of `key`'s lane was delivered.
    pub fn delivered(&mut self, key: &Key) {
        self.settle_head(key);
    }

    /// The in-flight head of `key`'s lane failed for good; it is returned for the dead letters.
    pub fn given_up(&mut self, key: &Key) -> Option<Pending> {
        self.settle_head(key)
    }

    /// `job` failed and is to be tried again, whole, at `at`.
    pub fn retry_at(&mut self, job: &Job, at: Instant) {
        let mut keys = Vec::with_capacity(job.messages.len());
        let mut arrival = u64::MAX;
        for key in job.keys() {
            let Some(lane) = self.lanes.get_mut(key) else {
                continue;
            };
            debug_assert_eq!(lane.state, LaneState::InFlight);
            lane.state = LaneState::Waiting;
            self.in_flight -= 1;
            arrival = arrival.min(lane.events.front().map_or(0, |head| head.arrival));
            keys.push(key.clone());
        }
        if !keys.is_empty() {
            self.waiting.push(Reverse(Retry {
                at,
                arrival,
                keys,
                batch_id: job.batch_id.clone(),
            }));
        }
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

    /// Takes out event `id` of `key`'s lane, settled by another member (a cluster's sender),
    /// unless it is in flight here; `None` if it is not held (or in flight).
    pub fn remove_held(&mut self, key: &Key, id: &str) -> Option<Pending> {
        let lane = self.lanes.get_mut(key)?;
        let position = lane
            .events
            .iter()
            .position(|held| &*held.message.id == id)?;
        if position == 0 && lane.state == LaneState::InFlight {
            return None;
        }
        let removed = lane.events.remove(position).expect("found");
        self.len -= 1;
        self.arrived_at.remove(&removed.arrival);
        if lane.events.is_empty() {
            // A `Ready` or `Waiting` lane may still be named in `ready` or a retry: both skip
            // a key with no lane in that state (`start_head`).
            self.lanes.remove(key);
        }
        Some(removed)
    }

    /// Takes out every event not in flight (a snapshot replaces what is held).
    pub fn clear_idle(&mut self) -> usize {
        self.drain_idle().len()
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
            self.ready.push_back(Ready::Lane(key.clone()));
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
                log_id: None,
            },
        })
    }

    /// The event ids of `jobs`, in order.
    fn ids(jobs: &[Job]) -> Vec<&str> {
        jobs.iter()
            .flat_map(|job| job.messages.iter().map(|message| &*message.id))
            .collect()
    }

    /// Up to `limit` single-event jobs.
    fn take(outbox: &mut Outbox, now: Instant, limit: usize) -> Vec<Job> {
        let mut mint = || -> Arc<str> { unreachable!("no batch ids without batching") };
        outbox.take_jobs(
            now,
            limit,
            Batching {
                max: 1,
                mint: &mut mint,
            },
        )
    }

    /// Up to `limit` jobs of up to `max` events, with batch ids `batch_1`, `batch_2`...
    fn take_batched(outbox: &mut Outbox, now: Instant, limit: usize, max: usize) -> Vec<Job> {
        static MINTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let mut mint = || -> Arc<str> {
            let n = MINTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            format!("batch_{n}").into()
        };
        outbox.take_jobs(
            now,
            limit,
            Batching {
                max,
                mint: &mut mint,
            },
        )
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
        assert_eq!(ids(&take(&mut outbox, now, 10)), ["msg_1", "msg_3"]);
        assert!(
            take(&mut outbox, now, 10).is_empty(),
            "a's second waits for its first"
        );
        outbox.delivered(&key("a"));
        assert_eq!(ids(&take(&mut outbox, now, 10)), ["msg_2"]);
        assert_eq!((outbox.len(), outbox.in_flight()), (2, 2));
    }

    #[test]
    fn a_retrying_key_holds_back_only_its_own_events() {
        let now = Instant::now();
        let mut outbox = Outbox::new(10);
        outbox.push(message("a", 1), 0, now).unwrap();
        outbox.push(message("a", 2), 0, now).unwrap();
        outbox.push(message("b", 3), 0, now).unwrap();
        let jobs = take(&mut outbox, now, 10);
        outbox.retry_at(&jobs[0], now + Duration::from_secs(5));
        outbox.delivered(&key("b"));
        outbox.push(message("b", 4), 0, now).unwrap();
        assert_eq!(ids(&take(&mut outbox, now, 10)), ["msg_4"]);
        assert_eq!(outbox.next_retry_at(), Some(now + Duration::from_secs(5)));
        assert!(take(&mut outbox, now + Duration::from_millis(4999), 10).is_empty());
        let retried = take(&mut outbox, now + Duration::from_secs(5), 10);
        assert_eq!(ids(&retried), ["msg_1"]);
        assert_eq!(retried[0].attempt, 2, "the retry is the second attempt");
    }

    #[test]
    fn refuses_past_capacity_and_counts_in_flight_events() {
        let now = Instant::now();
        let mut outbox = Outbox::new(2);
        outbox.push(message("a", 1), 0, now).unwrap();
        outbox.push(message("b", 2), 0, now).unwrap();
        take(&mut outbox, now, 10);
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
        take(&mut outbox, later, 1);
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
        let jobs = take(&mut outbox, now, 2); // a#1 and b#3 in flight
        outbox.retry_at(&jobs[1], now + Duration::from_secs(1));
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
        assert!(take(&mut outbox, now + Duration::from_secs(2), 10).is_empty());
    }

    /// A cluster member that does not send drops what the sender settled, wherever it sits in
    /// its lane; an event in flight here is left to its attempt; the lanes keep their order
    /// and a key whose lane emptied starts a new one.
    #[test]
    fn events_settled_elsewhere_leave_the_outbox_but_one_in_flight_stays() {
        let now = Instant::now();
        let mut outbox = Outbox::new(10);
        for (key, sequence) in [("a", 1), ("a", 2), ("a", 3), ("b", 4), ("c", 5)] {
            outbox.push(message(key, sequence), 0, now).unwrap();
        }
        // The middle of a lane, then a whole lane.
        assert_eq!(
            &*outbox.remove_held(&key("a"), "msg_2").unwrap().message.id,
            "msg_2"
        );
        assert!(outbox.remove_held(&key("b"), "msg_4").is_some());
        assert!(
            outbox.remove_held(&key("b"), "msg_4").is_none(),
            "only once"
        );
        assert!(
            outbox.remove_held(&key("c"), "msg_1").is_none(),
            "another key's id"
        );
        assert_eq!(outbox.len(), 3);
        let jobs = take(&mut outbox, now, 10);
        assert_eq!(ids(&jobs), ["msg_1", "msg_5"]);
        // In flight here: not taken out.
        assert!(outbox.remove_held(&key("a"), "msg_1").is_none());
        outbox.delivered(&key("a"));
        outbox.delivered(&key("c"));
        assert_eq!(ids(&take(&mut outbox, now, 10)), ["msg_3"]);
        outbox.delivered(&key("a"));
        assert!(outbox.is_empty());
        assert_eq!(outbox.oldest_arrival(), None);
        // `b`'s lane emptied while named as ready: a new event of `b` goes out once.
        outbox.push(message("b", 6), 0, now).unwrap();
        assert_eq!(ids(&take(&mut outbox, now, 10)), ["msg_6"]);
        assert!(take(&mut outbox, now, 10).is_empty());
    }

    #[test]
    fn a_batch_holds_one_head_per_key_and_is_retried_whole_under_its_id() {
        let now = Instant::now();
        let mut outbox = Outbox::new(10);
        for (key, sequence) in [("a", 1), ("a", 2), ("b", 3), ("c", 4), ("d", 5)] {
            outbox.push(message(key, sequence), 0, now).unwrap();
        }
        let jobs = take_batched(&mut outbox, now, 10, 3);
        assert_eq!(jobs.len(), 2);
        assert_eq!(ids(&jobs[..1]), ["msg_1", "msg_3", "msg_4"]);
        assert_eq!(
            ids(&jobs[1..]),
            ["msg_5"],
            "a partial batch goes out at once"
        );
        assert_ne!(jobs[0].batch_id, jobs[1].batch_id);
        assert_eq!(outbox.in_flight(), 4);

        let retry_at = now + Duration::from_secs(1);
        outbox.retry_at(&jobs[0], retry_at);
        outbox.delivered(&key("d"));
        outbox.push(message("e", 6), 0, now).unwrap();
        assert_eq!(
            ids(&take_batched(&mut outbox, now, 10, 3)),
            ["msg_6"],
            "a's second event waits for its first; the failed batch waits whole"
        );
        let retried = take_batched(&mut outbox, retry_at, 10, 3);
        assert_eq!(retried.len(), 1);
        assert_eq!(ids(&retried), ["msg_1", "msg_3", "msg_4"]);
        assert_eq!(retried[0].batch_id, jobs[0].batch_id, "same batch, same id");
        assert_eq!(retried[0].attempt, 2);
    }

    #[test]
    fn due_retries_wait_for_room_without_being_reordered() {
        let now = Instant::now();
        let mut outbox = Outbox::new(10);
        for (key, sequence) in [("a", 1), ("b", 2), ("c", 3)] {
            outbox.push(message(key, sequence), 0, now).unwrap();
        }
        let jobs = take(&mut outbox, now, 3);
        let later = now + Duration::from_millis(10);
        outbox.retry_at(&jobs[1], later);
        outbox.retry_at(&jobs[0], later + Duration::from_millis(1));
        let until = later + Duration::from_secs(1);
        assert!(take(&mut outbox, until, 0).is_empty());
        assert_eq!(
            outbox.next_retry_at(),
            None,
            "both are due: only room is awaited"
        );
        assert_eq!(ids(&take(&mut outbox, until, 1)), ["msg_2"]);
        assert_eq!(ids(&take(&mut outbox, until, 1)), ["msg_1"]);
    }

    #[test]
    fn a_due_retry_queues_behind_what_was_ready_before_it() {
        let now = Instant::now();
        let mut outbox = Outbox::new(10);
        outbox.push(message("a", 1), 0, now).unwrap();
        let failed = take(&mut outbox, now, 1);
        outbox.retry_at(&failed[0], now);
        outbox.push(message("b", 2), 0, now).unwrap();
        // One request at a time (a paused URL's probe): the never-tried event goes first.
        assert_eq!(ids(&take(&mut outbox, now, 1)), ["msg_2"]);
        assert_eq!(ids(&take(&mut outbox, now, 1)), ["msg_1"]);
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
        fn per_key_order_and_counts_hold(
            steps in proptest::collection::vec(step(), 1..200),
            batch_max in 1usize..4,
        ) {
            let mut now = Instant::now();
            let mut outbox = Outbox::new(8);
            let mut sequence = 0u64;
            let mut pushed: HashMap<String, Vec<u64>> = HashMap::new();
            let mut settled: HashMap<String, Vec<u64>> = HashMap::new();
            let mut in_flight: Vec<Job> = Vec::new();
            let mut sent_batches: HashMap<Arc<str>, Vec<String>> = HashMap::new();
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
                        for job in take_batched(&mut outbox, now, limit, batch_max) {
                            prop_assert!(job.messages.len() <= batch_max);
                            prop_assert_eq!(job.batch_id.is_some(), batch_max > 1);
                            if let Some(id) = &job.batch_id {
                                // A batch id comes back only as the retry of the same batch.
                                let events: Vec<String> = ids(std::slice::from_ref(&job))
                                    .into_iter()
                                    .map(str::to_owned)
                                    .collect();
                                if let Some(first) = sent_batches.get(id) {
                                    prop_assert_eq!(first, &events);
                                }
                                sent_batches.insert(Arc::clone(id), events);
                            }
                            for key in job.keys() {
                                prop_assert!(in_flight.iter().flat_map(Job::keys).all(|other| other != key));
                            }
                            in_flight.push(job);
                        }
                    }
                    Step::Deliver | Step::GiveUp | Step::Fail { .. } if !in_flight.is_empty() => {
                        let job = in_flight.remove(0);
                        if let Step::Fail { retry_in_ms } = step {
                            outbox.retry_at(&job, now + Duration::from_millis(retry_in_ms));
                        } else {
                            for message in &job.messages {
                                let key = &message.event.key;
                                if matches!(step, Step::Deliver) {
                                    outbox.delivered(key);
                                } else {
                                    let head = outbox.given_up(key).expect("in flight");
                                    prop_assert!(Arc::ptr_eq(&head.message, message));
                                }
                                settled.entry(key.as_str().to_owned()).or_default().push(message.event.occurred_at_ms - 1000);
                            }
                        }
                    }
                    Step::Advance(ms) => now += Duration::from_millis(ms),
                    _ => {}
                }
                prop_assert_eq!(outbox.in_flight(), in_flight.iter().map(|job| job.messages.len()).sum::<usize>());
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
