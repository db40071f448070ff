//! Load over `connections` keep-alive connections, closed loop or open loop.
//!
//! - Closed loop (no rate): each connection sends its next request as soon as the previous
//!   response is read (as `wrk` and `redis-benchmark` do). Latency counts from the send, so a
//!   server stall delays the requests that would have measured it (coordinated omission).
//! - Open loop (`rate`): requests are due at fixed times, `rate` per second spread evenly over
//!   the connections, and each one's latency counts from the time it was due, whether or not
//!   the connection was free then (as `wrk2` does): a stall shows in full in the percentiles.
//!
//! Time is split into phases that the caller moves through (`Phases::set`): every request is
//! counted and timed in the phase it started in, so one run yields e.g. "before the storm" and
//! "during the storm" separately. Phase [`PAUSE`] holds every connection idle; [`STOP`] ends
//! the run.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::stats::Durations;
use crate::wire::{Conn, Response};

pub const STOP: usize = usize::MAX;
/// Connections send nothing while this is the phase (and keep their connections open).
pub const PAUSE: usize = usize::MAX - 1;

/// What one connection sends and how it judges the answer.
pub trait Workload: Send + Sync + 'static {
    /// Writes the next request into `out` (cleared); returns how many items it carries.
    fn request(&self, rng: &mut fastrand::Rng, out: &mut Vec<u8>) -> u64;
    /// How many of the request's `items` failed, given a response.
    fn failed(&self, response: &Response<'_>, items: u64) -> u64;
    /// What the requests are written in.
    fn protocol(&self) -> Protocol {
        Protocol::Http
    }
}

/// The wire protocol of a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1 requests; the response's status counts.
    Http,
    /// Redis commands (RESP), one reply each: a simple string or integer is a 200, an error
    /// reply a 500.
    Resp,
}

/// An open connection of either protocol.
enum Link {
    Http(Conn),
    Resp(crate::resp::RespConn),
}

impl Link {
    async fn connect(address: &str, protocol: Protocol) -> Option<Self> {
        match protocol {
            Protocol::Http => Conn::connect(address).await.ok().map(Self::Http),
            Protocol::Resp => crate::resp::RespConn::connect(address)
                .await
                .ok()
                .map(Self::Resp),
        }
    }

    async fn exchange(&mut self, request: &[u8]) -> io::Result<Response<'_>> {
        match self {
            Self::Http(conn) => conn.exchange(request).await,
            Self::Resp(conn) => {
                let status = conn.exchange(request).await.map_err(io::Error::other)?;
                Ok(Response { status, body: &[] })
            }
        }
    }
}

/// A runtime with one worker thread named `name`, for senders that must not share an event loop
/// with the tool's webhook receiver (which would make their sends, and its arrival stamps, late).
pub fn sender_runtime(name: &str) -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(name)
        .enable_all()
        .build()
        .map_err(|error| format!("cannot start the sender's runtime: {error}"))
}

/// The phase every connection reads before each request.
#[derive(Default)]
pub struct Phases(AtomicUsize);

impl Phases {
    pub fn set(&self, phase: usize) {
        self.0.store(phase, Ordering::Relaxed);
    }
    fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// What happened in one phase.
#[derive(Clone, Default)]
pub struct PhaseStats {
    pub requests: u64,
    pub items: u64,
    pub failed_items: u64,
    /// Requests that got no response (connection errors) or a non-2xx status.
    pub errors: u64,
    pub latencies: Durations,
    /// Open loop: how late the tool itself woke for requests it had to wait for (its timer and
    /// its thread's share of the CPU), which the latencies include but the server did not cause.
    pub wake_lag: Durations,
    /// From each request's write to its answer: the latency without the time a request waited
    /// for its connection (open loop, a connection sends one request at a time).
    pub round_trips: Durations,
}

impl PhaseStats {
    fn merge(&mut self, other: &Self) {
        self.requests += other.requests;
        self.items += other.items;
        self.failed_items += other.failed_items;
        self.errors += other.errors;
        self.latencies.merge(&other.latencies);
        self.wake_lag.merge(&other.wake_lag);
        self.round_trips.merge(&other.round_trips);
    }
}

/// A running load.
pub struct Load {
    tasks: Vec<JoinHandle<Vec<PhaseStats>>>,
}

impl Load {
    /// Starts `connections` connections to `address` on `runtime`, counting into `n_phases`
    /// phases; with a `rate` (requests per second, all connections together), open loop.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        runtime: &tokio::runtime::Handle,
        address: &str,
        connections: usize,
        n_phases: usize,
        phases: Arc<Phases>,
        workload: Arc<dyn Workload>,
        seed: u64,
        rate: Option<f64>,
    ) -> Self {
        let start = Instant::now();
        let tasks = (0..connections)
            .map(|index| {
                let address = address.to_owned();
                let phases = Arc::clone(&phases);
                let workload = Arc::clone(&workload);
                let rng = fastrand::Rng::with_seed(seed.wrapping_add(index as u64));
                let schedule =
                    rate.map(|rate| Schedule::of_connection(start, rate, index, connections));
                runtime.spawn(connection(
                    address, n_phases, phases, workload, rng, schedule,
                ))
            })
            .collect();
        Self { tasks }
    }

    /// Waits for every connection to see [`STOP`] and sums their counts per phase.
    pub async fn finish(self) -> Vec<PhaseStats> {
        let mut total: Vec<PhaseStats> = Vec::new();
        for task in self.tasks {
            let stats = task.await.expect("a load connection panicked");
            total.resize(stats.len(), PhaseStats::default());
            for (sum, one) in total.iter_mut().zip(&stats) {
                sum.merge(one);
            }
        }
        total
    }
}

/// When one connection's requests are due in an open-loop run: every `interval` from `first`.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    first: Instant,
    interval: Duration,
    sent: u32,
}

impl Schedule {
    /// Connection `index` of `connections` sharing `rate` requests per second: each sends every
    /// `connections / rate` seconds, the connections staggered evenly across that interval.
    pub fn of_connection(start: Instant, rate: f64, index: usize, connections: usize) -> Self {
        let interval = Duration::from_secs_f64(connections as f64 / rate);
        Self {
            first: start + interval.mul_f64(index as f64 / connections as f64),
            interval,
            sent: 0,
        }
    }

    /// Drops the requests due before `now` (the load was paused on purpose: they are not
    /// late, they were never meant to be sent).
    pub fn skip_to(&mut self, now: Instant) {
        let behind = now.saturating_duration_since(self.first);
        let due_by_now = (behind.as_secs_f64() / self.interval.as_secs_f64()).ceil() as u32;
        self.sent = self.sent.max(due_by_now);
    }

    /// The time the next request is due, and moves on to the one after.
    pub fn next_due(&mut self) -> Instant {
        let due = self.first + self.interval * self.sent;
        self.sent += 1;
        due
    }
}

async fn connection(
    address: String,
    n_phases: usize,
    phases: Arc<Phases>,
    workload: Arc<dyn Workload>,
    mut rng: fastrand::Rng,
    mut schedule: Option<Schedule>,
) -> Vec<PhaseStats> {
    let mut stats = vec![PhaseStats::default(); n_phases];
    let mut request = Vec::with_capacity(64 * 1024);
    let mut conn: Option<Link> = None;
    let protocol = workload.protocol();
    loop {
        let phase = phases.get();
        if phase == STOP {
            return stats;
        }
        if phase == PAUSE {
            tokio::time::sleep(Duration::from_millis(1)).await;
            if let Some(schedule) = &mut schedule {
                schedule.skip_to(Instant::now());
            }
            continue;
        }
        // Open loop: wait for the request's time; a request already due (the connection was
        // busy) goes at once, its latency still counted from when it was due.
        let (due, woke_late) = match &mut schedule {
            Some(schedule) => {
                let due = schedule.next_due();
                let waits = due > Instant::now();
                tokio::time::sleep_until(due).await;
                if phases.get() == STOP {
                    return stats;
                }
                (Some(due), waits.then(|| due.elapsed()))
            }
            None => (None, None),
        };
        let phase = phases.get();
        let phase_stats = &mut stats[phase.min(n_phases - 1)];
        if let Some(lag) = woke_late {
            phase_stats.wake_lag.record(lag);
        }
        let Some(open) = connected(&mut conn, &address, protocol).await else {
            phase_stats.errors += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        request.clear();
        let items = workload.request(&mut rng, &mut request);
        let sent = Instant::now();
        let started = due.unwrap_or(sent);
        match open.exchange(&request).await {
            Ok(response) => {
                phase_stats.latencies.record(started.elapsed());
                phase_stats.round_trips.record(sent.elapsed());
                phase_stats.requests += 1;
                phase_stats.items += items;
                if (200..300).contains(&response.status) {
                    phase_stats.failed_items += workload.failed(&response, items);
                } else {
                    phase_stats.errors += 1;
                    phase_stats.failed_items += items;
                }
            }
            Err(_) => {
                phase_stats.errors += 1;
                phase_stats.failed_items += items;
                conn = None;
            }
        }
    }
}

/// The open connection, opening it first if needed.
async fn connected<'a>(
    conn: &'a mut Option<Link>,
    address: &str,
    protocol: Protocol,
) -> Option<&'a mut Link> {
    if conn.is_none() {
        *conn = Link::connect(address, protocol).await;
    }
    conn.as_mut()
}

/// Sends one request on a fresh connection and returns `(status, body)`: for set-up steps.
pub async fn one_request(address: &str, request: &[u8]) -> io::Result<(u16, Vec<u8>)> {
    let mut conn = Conn::connect(address).await?;
    let response = conn.exchange(request).await?;
    Ok((response.status, response.body.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_skips_what_fell_due_during_a_pause() {
        let start = Instant::now();
        let mut schedule = Schedule::of_connection(start, 100.0, 0, 1);
        assert_eq!(schedule.next_due(), start);
        schedule.skip_to(start + Duration::from_millis(55));
        assert_eq!(schedule.next_due(), start + Duration::from_millis(60));
        schedule.skip_to(start);
        assert_eq!(
            schedule.next_due(),
            start + Duration::from_millis(70),
            "never goes back"
        );
    }

    #[test]
    fn an_open_loop_schedule_spreads_the_rate_over_the_connections() {
        let start = Instant::now();
        // 1,000 requests/s over 4 connections: each every 4 ms, staggered by 1 ms.
        let mut schedules: Vec<Schedule> = (0..4)
            .map(|index| Schedule::of_connection(start, 1_000.0, index, 4))
            .collect();
        let mut due: Vec<Duration> = Vec::new();
        for _ in 0..3 {
            for schedule in &mut schedules {
                due.push(schedule.next_due() - start);
            }
        }
        due.sort();
        let expected: Vec<Duration> = (0..12).map(Duration::from_millis).collect();
        assert_eq!(due, expected);
    }
}
