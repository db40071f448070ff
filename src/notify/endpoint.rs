//! One webhook URL: its outbox, its counters, and the task that delivers to it. The decisions
//! live in pure parts: per-key order and retry times in [`super::outbox`], whether the receiver
//! as a whole is failing in [`super::health`]; one HTTP attempt is [`super::transport`].
//!
//! The delivery task keeps up to `concurrency` attempts in flight, each a spawned task, and
//! settles each as it finishes: delivered, retry later, or give up (to the dead letters). It is
//! woken by new events, by the earliest retry time, and by shutdown. The dispatcher only ever
//! takes this endpoint's mutex for a few pushes, so a slow receiver slows nothing upstream.
//!
//! A receiver that is down is not hammered event by event: after a few receiver-wide failures
//! in a row (connection errors, timeouts, 5xx, 429) the URL is *paused* and probed one attempt
//! at a time (the state machine and its constants are in [`super::health`]). Events waiting out
//! a pause spend none of their attempts, so an outage of hours loses nothing that fits in the
//! queue. A `Retry-After` on 429/503 pauses the whole URL for that long. Failures specific to
//! one event (other 4xx) never pause the URL.
//!
//! A 410 Gone answer marks the URL gone: nothing more is sent to it, what it held moves to the
//! dead letters, and new events for it are counted as dropped, until an operator re-sends a dead
//! letter to it (which re-enables it).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use reqwest::Url;
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tokio::time::{sleep_until, Instant};

use super::backoff;
use super::dead_letters::{DeadLetters, NewLetter};
use super::health::Health;
use super::message::{Message, MessageIds};
use super::outbox::{Batching, Full, Job, Outbox, Pending};
use super::replicated::{Replication, Settled, Settlement};
use super::transport::{unix_now_ms, Outcome, Sender};
use crate::persist::journal::Journal;
use crate::persist::record::{Record, WebhookMessage};

/// What every endpoint's delivery task shares.
#[derive(Debug)]
pub(super) struct Delivery {
    /// Sends one attempt (shared with the attempt tasks).
    pub sender: Arc<Sender>,
    pub concurrency: usize,
    /// Most events per request (1: each event on its own, under its own id).
    pub batch_max: usize,
    /// Mints the ids of batches.
    pub batch_ids: MessageIds,
    pub max_attempts: u32,
    pub retry_schedule: Vec<Duration>,
    pub dead_letters: Arc<DeadLetters>,
    /// Where deliveries and dead letters are logged, once attached (after recovery).
    pub journal: Arc<OnceLock<Arc<Journal>>>,
    /// In a cluster: whether this member sends, and where it reports what it settled.
    pub replication: Option<Arc<Replication>>,
}

impl Delivery {
    /// Whether this member may send now (always, outside a cluster).
    fn may_send(&self) -> bool {
        self.replication
            .as_ref()
            .is_none_or(|replication| replication.is_delivering())
    }
}

/// Counters of one URL since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Events delivered (a 2xx answer).
    pub delivered: u64,
    /// Requests that delivered them (fewer than `delivered` with batching).
    pub requests: u64,
    /// Events given up on: moved to the dead letters.
    pub failed: u64,
    /// Attempts that failed (each retry counts).
    pub failed_attempts: u64,
    /// Events refused because the outbox was full.
    pub dropped_queue_full: u64,
    /// Events not queued because the URL answered 410 Gone.
    pub dropped_gone: u64,
}

/// The last failed attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LastError {
    pub at_ms: u64,
    pub event_id: Box<str>,
    pub message: String,
}

/// A URL's state as `GET /v1/webhooks` shows it.
#[derive(Clone, Debug)]
pub struct EndpointStatus {
    pub url: String,
    pub gone: bool,
    /// The receiver is failing: attempts go out one at a time, after each pause.
    pub paused: bool,
    /// Until a paused URL sends its next probe.
    pub paused_for_ms: Option<u64>,
    /// Receiver-wide failures since the last success.
    pub consecutive_failures: u32,
    pub counters: Counters,
    pub pending: usize,
    pub in_flight: usize,
    pub oldest_pending_age_ms: Option<u64>,
    pub last_error: Option<LastError>,
    pub last_delivered_at_ms: Option<u64>,
}

#[derive(Debug)]
struct State {
    outbox: Outbox,
    gone: bool,
    health: Health,
    /// Set while the outbox refuses events, so the warning is logged once per episode.
    overflowing: bool,
    counters: Counters,
    last_error: Option<LastError>,
    last_delivered_at_ms: Option<u64>,
    /// Reports of events settled elsewhere whose event has not arrived here yet (see
    /// `notify::replicated`): the settlement, and the id a dead letter it files takes.
    tombstones: ById<(Settlement, u64)>,
    /// A cluster sender's events given up on (with their attempts), kept until the log applies
    /// the report that says so: only then is each filed as a dead letter, under the id its
    /// entry gives it (`dead_letters::letter_id`), as on every other member. A snapshot keeps
    /// them as held events, so that the report, applied after a restart, still finds them.
    given_up: ById<(Arc<Message>, u32)>,
}

/// Values by `webhook-id`, at most `max`, the oldest forgotten first (tombstones: at worst that
/// event is sent once more after a failover; given-up events: bounded like the reports waiting
/// for a proposal, `replicated::MAX_HELD_REPORTS`).
#[derive(Debug)]
struct ById<V> {
    by_id: HashMap<Box<str>, V>,
    order: std::collections::VecDeque<Box<str>>,
    max: usize,
}

impl<V> ById<V> {
    fn new(max: usize) -> Self {
        Self {
            by_id: HashMap::new(),
            order: std::collections::VecDeque::new(),
            max,
        }
    }

    fn insert(&mut self, id: &str, value: V) {
        if self.by_id.insert(id.into(), value).is_none() {
            self.order.push_back(id.into());
        }
        while self.order.len() > self.max {
            if let Some(oldest) = self.order.pop_front() {
                self.by_id.remove(&oldest);
            }
        }
    }

    /// The value kept for `id`, taken.
    fn take(&mut self, id: &str) -> Option<V> {
        if self.by_id.is_empty() {
            return None;
        }
        let value = self.by_id.remove(id)?;
        self.order.retain(|waiting| &**waiting != id);
        Some(value)
    }

    /// In the order they were inserted.
    fn values(&self) -> impl Iterator<Item = &V> {
        self.order.iter().filter_map(|id| self.by_id.get(id))
    }

    fn clear(&mut self) {
        self.by_id.clear();
        self.order.clear();
    }
}

/// See the module documentation.
#[derive(Debug)]
pub struct Endpoint {
    index: usize,
    url: Url,
    /// The URL with any password hidden, for logs and the API.
    shown_url: String,
    state: Mutex<State>,
    wake: Notify,
}

impl Endpoint {
    pub(super) fn new(index: usize, url: Url, queue_max: usize) -> Self {
        Self {
            index,
            shown_url: redacted(&url),
            url,
            state: Mutex::new(State {
                outbox: Outbox::new(queue_max),
                gone: false,
                health: Health::default(),
                overflowing: false,
                counters: Counters::default(),
                last_error: None,
                last_delivered_at_ms: None,
                tombstones: ById::new(queue_max),
                given_up: ById::new(super::replicated::MAX_HELD_REPORTS),
            }),
            wake: Notify::new(),
        }
    }

    pub fn shown_url(&self) -> &str {
        &self.shown_url
    }

    /// Queues new events; past the bound, or when the URL is gone, counts them as dropped.
    /// With a journal, each queued event is logged before the lock is released, so its record
    /// precedes whatever settles it.
    pub(super) fn accept(
        &self,
        messages: &[Arc<Message>],
        now: Instant,
        journal: Option<&Journal>,
        dead_letters: &DeadLetters,
    ) {
        let mut state = self.state.lock();
        let mut records = Vec::new();
        for message in messages {
            if let Some((how, letter_id)) = state.tombstones.take(&message.id) {
                // Another member settled it already (a cluster's sender).
                self.file_settled(dead_letters, Arc::clone(message), &how, letter_id);
            } else if state.gone {
                state.counters.dropped_gone += 1;
            } else if state.outbox.push(Arc::clone(message), 0, now).is_ok() {
                if journal.is_some() {
                    records.push(Record::WebhookQueued(self.logged(message, 0)));
                }
                if state.overflowing {
                    state.overflowing = false;
                    tracing::warn!(url = %self.shown_url, dropped_total = state.counters.dropped_queue_full,
                        "webhook queue has room again");
                }
            } else {
                state.counters.dropped_queue_full += 1;
                if !state.overflowing {
                    state.overflowing = true;
                    tracing::warn!(url = %self.shown_url, pending = state.outbox.len(),
                        first_dropped = %message.id,
                        "webhook queue full: new events for this URL are dropped (and counted) until it drains");
                }
            }
        }
        if let Some(journal) = journal.filter(|_| !records.is_empty()) {
            journal.append(&records);
        }
        drop(state);
        self.wake.notify_one();
    }

    /// `message` as logged for this URL.
    fn logged(&self, message: &Message, attempts: u32) -> WebhookMessage {
        WebhookMessage {
            url: self.shown_url.clone(),
            id: message.id.to_string(),
            attempts,
            event: message.event.clone(),
        }
    }

    /// The records that rebuild this URL's queue: every held event, in arrival order, then
    /// those given up on whose report the log has not applied yet (held until it does).
    pub(super) fn durable_records(&self) -> Vec<Record> {
        let state = self.state.lock();
        let held = state.outbox.held();
        let held = held
            .iter()
            .map(|pending| (&pending.message, pending.attempts));
        let given_up = state
            .given_up
            .values()
            .map(|(message, attempts)| (message, *attempts));
        held.chain(given_up)
            .map(|(message, attempts)| Record::WebhookQueued(self.logged(message, attempts)))
            .collect()
    }

    /// Queues events read back from the log (at start-up, before anything new arrives), with
    /// their ids and attempts; returns how many did not fit.
    pub(super) fn restore(&self, messages: Vec<(Arc<Message>, u32)>, now: Instant) -> usize {
        let mut state = self.state.lock();
        let mut refused = 0;
        for (message, attempts) in messages {
            if state.outbox.push(message, attempts, now).is_err() {
                refused += 1;
            }
        }
        drop(state);
        self.wake.notify_one();
        refused
    }

    /// Queues a re-send of a dead letter with a fresh attempt budget; re-enables a gone URL.
    pub(super) fn requeue(
        &self,
        message: Arc<Message>,
        now: Instant,
        journal: Option<&Journal>,
        replication: Option<&Replication>,
    ) -> Result<(), Full> {
        let mut state = self.state.lock();
        state.outbox.push(Arc::clone(&message), 0, now)?;
        if let Some(replication) = replication {
            replication.settled([Settled {
                endpoint: self.position(),
                id: message.id.to_string(),
                key: message.event.key.clone(),
                how: Settlement::Requeued,
            }]);
        }
        if let Some(journal) = journal {
            journal.append(&[
                Record::DeadLetterTaken {
                    id: message.id.to_string(),
                },
                Record::WebhookQueued(self.logged(&message, 0)),
            ]);
        }
        if state.gone {
            state.gone = false;
            tracing::warn!(url = %self.shown_url, "webhook URL re-enabled by a dead-letter retry");
        }
        drop(state);
        self.wake.notify_one();
        Ok(())
    }

    pub fn status(&self, now: Instant) -> EndpointStatus {
        let state = self.state.lock();
        EndpointStatus {
            url: self.shown_url.clone(),
            gone: state.gone,
            paused_for_ms: state
                .health
                .paused_until(now)
                .map(|until| until.duration_since(now).as_millis() as u64),
            paused: state.health.is_paused(),
            consecutive_failures: state.health.consecutive_failures(),
            counters: state.counters,
            pending: state.outbox.len(),
            in_flight: state.outbox.in_flight(),
            oldest_pending_age_ms: state
                .outbox
                .oldest_arrival()
                .map(|at| now.saturating_duration_since(at).as_millis() as u64),
            last_error: state.last_error.clone(),
            last_delivered_at_ms: state.last_delivered_at_ms,
        }
    }

    /// Delivers until `stop` carries a deadline and then either everything is delivered or the
    /// deadline passes. Returns how many events were still held.
    pub(super) async fn deliver(
        self: Arc<Self>,
        delivery: Arc<Delivery>,
        mut stop: watch::Receiver<Option<Instant>>,
    ) -> usize {
        let mut attempts = JoinSet::new();
        let mut running: HashMap<tokio::task::Id, Job> = HashMap::new();
        let mut drain_until: Option<Instant> = None;
        let mut delivering = delivery.replication.as_ref().map(|r| r.delivering());
        loop {
            let (jobs, next_retry, empty) = self.next_jobs(&delivery, running.len());
            for job in jobs {
                let attempt = Arc::clone(&delivery.sender).attempt(self.url.clone(), job.clone());
                running.insert(attempts.spawn(attempt).id(), job);
            }
            if drain_until.is_some() && empty {
                break;
            }
            tokio::select! {
                Some(joined) = attempts.join_next_with_id() => {
                    let (id, outcome) = match joined {
                        Ok((id, outcome)) => (id, outcome),
                        Err(failed) => (failed.id(), Outcome::Failed {
                            error: format!("delivery task failed: {failed}"),
                            receiver_wide: false,
                            retry_after: None,
                        }),
                    };
                    if let Some(job) = running.remove(&id) {
                        self.settle(job, outcome, &delivery);
                    }
                }
                () = self.wake.notified() => {}
                Ok(()) = changed(&mut delivering) => {}
                () = sleep_until(next_retry.unwrap_or_else(far_future)), if next_retry.is_some() => {}
                _ = stop.changed(), if drain_until.is_none() => {
                    drain_until = Some(stop.borrow().unwrap_or_else(Instant::now));
                }
                () = sleep_until(drain_until.unwrap_or_else(far_future)), if drain_until.is_some() => break,
            }
        }
        attempts.abort_all();
        self.state.lock().outbox.len()
    }

    /// Jobs to start (none while gone or paused) with `running` requests in flight, when to
    /// look again, and whether nothing is held.
    fn next_jobs(&self, delivery: &Delivery, running: usize) -> (Vec<Job>, Option<Instant>, bool) {
        let now = Instant::now();
        let mut state = self.state.lock();
        // The health allowance and the concurrency count requests, not the events they carry.
        let allowance = state.health.allowance(now).saturating_sub(running);
        let free = delivery.concurrency.saturating_sub(running);
        let jobs = if state.gone || allowance == 0 || !delivery.may_send() {
            Vec::new()
        } else {
            let mut mint = || Arc::from(delivery.batch_ids.next());
            let batching = Batching {
                max: delivery.batch_max,
                mint: &mut mint,
            };
            state.outbox.take_jobs(now, free.min(allowance), batching)
        };
        // Nothing starts before a pause ends, so its end is the next time to look.
        let paused_until = state.health.paused_until(now);
        let wake = paused_until.or(state.outbox.next_retry_at());
        (jobs, wake, state.outbox.is_empty())
    }

    /// Settles every event of `job` as its request ended: a batch is delivered, retried or
    /// given up whole.
    fn settle(&self, job: Job, outcome: Outcome, delivery: &Delivery) {
        let now_ms = unix_now_ms();
        let mut given_up: Vec<(Pending, String)> = Vec::new();
        let delivered = matches!(outcome, Outcome::Delivered);
        let mut state = self.state.lock();
        match outcome {
            Outcome::Delivered => {
                if state.health.succeeded() {
                    tracing::warn!(url = %self.shown_url, "webhook receiver answers again: deliveries resume");
                }
                for key in job.keys() {
                    state.outbox.delivered(key);
                }
                state.counters.delivered += job.messages.len() as u64;
                state.counters.requests += 1;
                state.last_delivered_at_ms = Some(now_ms);
            }
            Outcome::Gone(error) => {
                self.note_failure(&mut state, &job, &error, now_ms);
                if !state.gone {
                    state.gone = true;
                    tracing::error!(url = %self.shown_url, webhook_id = %job.webhook_id(),
                        "webhook receiver answered 410 Gone: delivery to this URL is STOPPED; \
                         its pending events move to the dead letters");
                }
                for key in job.keys() {
                    given_up.extend(state.outbox.given_up(key).map(|p| (p, error.clone())));
                }
                let idle = state.outbox.drain_idle();
                if !idle.is_empty() {
                    tracing::error!(url = %self.shown_url, events = idle.len(),
                        "events not attempted because the URL is gone, kept as dead letters");
                }
                given_up.extend(
                    idle.into_iter()
                        .map(|p| (p, "not attempted: 410 Gone".into())),
                );
            }
            Outcome::Failed {
                error,
                receiver_wide,
                retry_after,
            } => {
                self.note_failure(&mut state, &job, &error, now_ms);
                let now = Instant::now();
                if let Some(wait) = retry_after {
                    state.health.pause_until(now + wait);
                }
                if receiver_wide {
                    let was_paused = state.health.is_paused();
                    let jitter = fastrand::f64();
                    if let Some(pause) = state.health.failed(&delivery.retry_schedule, now, jitter)
                    {
                        if !was_paused {
                            tracing::warn!(url = %self.shown_url, %error,
                                pause = %humantime::format_duration(pause),
                                "webhook receiver failing: deliveries to this URL paused; probing with one attempt at a time");
                        }
                    }
                }
                if state.gone || job.attempt >= delivery.max_attempts {
                    tracing::error!(url = %self.shown_url, webhook_id = %job.webhook_id(),
                        events = job.messages.len(), first_key = %job.messages[0].event.key,
                        attempts = job.attempt, %error,
                        "webhook delivery failed for good; kept as dead letters");
                    for key in job.keys() {
                        given_up.extend(state.outbox.given_up(key).map(|p| (p, error.clone())));
                    }
                } else {
                    let wait = retry_after.unwrap_or_else(|| {
                        backoff::delay(&delivery.retry_schedule, job.attempt, fastrand::f64())
                    });
                    state.outbox.retry_at(&job, now + wait);
                }
            }
        }
        state.counters.failed += given_up.len() as u64;
        if let Some(replication) = &delivery.replication {
            replication.settled(self.reports(&job, delivered, &given_up, now_ms));
            // Filed when the report is applied, under the id the log gives it, as on every
            // member; kept here meanwhile (under the lock the report's applying takes).
            for (pending, _) in given_up.drain(..) {
                let id = Arc::clone(&pending.message);
                state
                    .given_up
                    .insert(&id.id, (pending.message, pending.attempts));
            }
        }
        if let Some(journal) = delivery.journal.get() {
            let mut records = Vec::with_capacity(given_up.len() + job.messages.len());
            if delivered {
                records.extend(job.messages.iter().map(|message| Record::WebhookDone {
                    url: self.shown_url.clone(),
                    id: message.id.to_string(),
                }));
            }
            for (pending, last_error) in &given_up {
                records.push(Record::DeadLetter {
                    letter_id: None,
                    message: self.logged(&pending.message, pending.attempts),
                    last_error: last_error.clone(),
                    failed_at_unix_ms: now_ms,
                });
            }
            if !records.is_empty() {
                journal.append(&records);
            }
        }
        drop(state);
        for (pending, last_error) in given_up {
            delivery.dead_letters.file(NewLetter {
                endpoint: self.index,
                message: pending.message,
                attempts: pending.attempts,
                last_error,
                failed_at_ms: now_ms,
            });
        }
    }

    /// This URL's place in `--webhook-url`, as reports name it (at most 65,535 URLs: far
    /// more than any configuration has).
    pub(super) fn position(&self) -> u16 {
        u16::try_from(self.index).unwrap_or(u16::MAX)
    }

    /// What settling `job` reports to the other members of a cluster.
    fn reports(
        &self,
        job: &Job,
        delivered: bool,
        given_up: &[(Pending, String)],
        now_ms: u64,
    ) -> Vec<Settled> {
        let report = |message: &Message, how: Settlement| Settled {
            endpoint: self.position(),
            id: message.id.to_string(),
            key: message.event.key.clone(),
            how,
        };
        let mut reports: Vec<Settled> = Vec::new();
        if delivered {
            reports.extend(
                job.messages
                    .iter()
                    .map(|message| report(message, Settlement::Delivered)),
            );
        }
        reports.extend(given_up.iter().map(|(pending, last_error)| {
            let how = Settlement::DeadLettered {
                attempts: pending.attempts,
                last_error: last_error.clone(),
                failed_at_unix_ms: now_ms,
            };
            report(&pending.message, how)
        }));
        reports
    }

    /// Applies settled reports, each with the id a dead letter it files takes (see
    /// `notify::replicated`): an event this member gave up on becomes its dead letter (or
    /// just leaves, if a later sender delivered it). The rest only from another member
    /// (`by_this_member` false: the sender settled them as it sent them): each event leaves
    /// the outbox, becomes a dead letter, or comes back from the dead letters; an event not
    /// here yet is met by a tombstone when it arrives.
    pub(super) fn apply_settled<'a>(
        &self,
        reports: impl Iterator<Item = (u64, &'a Settled)>,
        by_this_member: bool,
        dead_letters: &DeadLetters,
        now: Instant,
    ) {
        let mut state = self.state.lock();
        for (letter_id, report) in reports {
            if report.how != Settlement::Requeued {
                if let Some((message, _)) = state.given_up.take(&report.id) {
                    self.file_settled(dead_letters, message, &report.how, letter_id);
                    continue;
                }
            }
            if by_this_member {
                continue;
            }
            if report.how == Settlement::Requeued {
                if let Some(letter) = dead_letters.take_message(&report.id) {
                    // Room was made for it on the sender; here too it fits or is counted.
                    if state.outbox.push(letter.message, 0, now).is_err() {
                        state.counters.dropped_queue_full += 1;
                    }
                }
                continue;
            }
            match state.outbox.remove_held(&report.key, &report.id) {
                Some(pending) => {
                    self.file_settled(dead_letters, pending.message, &report.how, letter_id);
                }
                None => (state.tombstones).insert(&report.id, (report.how.clone(), letter_id)),
            }
        }
        drop(state);
        self.wake.notify_one();
    }

    /// Files `message` as dead letter `letter_id`, if `how` settled it as one.
    fn file_settled(
        &self,
        dead_letters: &DeadLetters,
        message: Arc<Message>,
        how: &Settlement,
        letter_id: u64,
    ) {
        if let Settlement::DeadLettered {
            attempts,
            last_error,
            failed_at_unix_ms,
        } = how
        {
            let letter = NewLetter {
                endpoint: self.index,
                message,
                attempts: *attempts,
                last_error: last_error.clone(),
                failed_at_ms: *failed_at_unix_ms,
            };
            dead_letters.file_numbered(letter_id, letter);
        }
    }

    /// Drops every held event not in flight, and the tombstones (a snapshot replaces them).
    pub(super) fn clear_held(&self) {
        let mut state = self.state.lock();
        state.outbox.clear_idle();
        state.tombstones.clear();
        state.given_up.clear();
    }

    fn note_failure(&self, state: &mut State, job: &Job, error: &str, now_ms: u64) {
        state.counters.failed_attempts += 1;
        state.last_error = Some(LastError {
            at_ms: now_ms,
            event_id: job.webhook_id().into(),
            message: error.to_owned(),
        });
        tracing::debug!(url = %self.shown_url, webhook_id = %job.webhook_id(), attempt = job.attempt, %error,
            "webhook attempt failed");
    }
}

/// `url` with its password, if any, replaced by `***`.
fn redacted(url: &Url) -> String {
    let mut shown = url.clone();
    if shown.password().is_some() {
        let _ = shown.set_password(Some("***"));
    }
    shown.to_string()
}

/// Waits for the next change of a cluster's `delivering` flag; never, outside a cluster.
async fn changed(
    delivering: &mut Option<watch::Receiver<bool>>,
) -> Result<(), watch::error::RecvError> {
    match delivering {
        Some(delivering) => delivering.changed().await,
        None => std::future::pending().await,
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400 * 365)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hides_passwords_in_shown_urls() {
        let url = Url::parse("https://ops:s3cret@hooks.example/ttl?x=1").unwrap();
        assert_eq!(redacted(&url), "https://ops:***@hooks.example/ttl?x=1");
        let plain = Url::parse("http://127.0.0.1:9000/hook").unwrap();
        assert_eq!(redacted(&plain), "http://127.0.0.1:9000/hook");
    }
}
