//! The creator of `streams --delivery-rate`: single heartbeats (`POST /v1/heartbeats`) of new
//! keys, open loop at a fixed rate over a few keep-alive connections, each key naming the time
//! its creation was due ([`delivery_key`]) so that stream clients can time the delivery
//! of its `registered` event.
//!
//! The schedule is the load driver's ([`Schedule::of_connection`]): at R per second over C
//! connections, connection `i` sends its `k`-th creation at `start + (k C + i) / R`, whether or
//! not its previous one was answered by then (a late one goes at once, still counted from its
//! due time). It runs on a thread of its own ([`driver::sender_runtime`]): the tool's main event
//! loop reads a thousand streams, and sends from it would be late.

use std::sync::Arc;
use std::time::Duration;

use memchr::memmem;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::driver::{self, Schedule};
use crate::stats::Durations;
use crate::wire::{self, Conn, Response};

/// Keep-alive connections the creations are spread over (staggered by the schedule), so that one
/// slow answer delays the next creation on its connection only.
const CONNECTIONS: usize = 4;
/// The keys' TTL: longer than any run, so that no key expires while it is measured.
const TTL_S: u64 = 3600;

/// What the creator did.
#[derive(Default)]
pub struct Tally {
    /// Creations sent (or tried: no connection could be opened).
    pub sent: u64,
    /// Creations answered 2xx with `"created":true`.
    pub created: u64,
    /// Latency of the created ones, from the due time to the answer.
    pub latencies: Durations,
}

/// A running creator.
pub struct Creator {
    runtime: tokio::runtime::Runtime,
    connections: Vec<JoinHandle<()>>,
    tally: Arc<parking_lot::Mutex<Tally>>,
}

impl Creator {
    /// Opens the connections to `address`, then creates `rate` keys per second named after
    /// `prefix` for `window`, the due times counted from `epoch`.
    pub async fn start(
        address: &str,
        prefix: &str,
        epoch: Instant,
        rate: f64,
        window: Duration,
    ) -> Result<Self, String> {
        let runtime = driver::sender_runtime("delivery-creator")?;
        // Opened on the creator's runtime, so that its own thread drives their sockets.
        let mut conns = Vec::with_capacity(CONNECTIONS);
        for _ in 0..CONNECTIONS {
            let target = address.to_owned();
            let conn = runtime
                .spawn(async move { Conn::connect(&target).await })
                .await
                .map_err(|error| error.to_string())?
                .map_err(|error| format!("the creator cannot connect to {address}: {error}"))?;
            conns.push(conn);
        }
        let start = Instant::now();
        let tally = Arc::new(parking_lot::Mutex::new(Tally::default()));
        let connections = conns
            .into_iter()
            .enumerate()
            .map(|(index, conn)| {
                let sender = Sender {
                    address: address.to_owned(),
                    prefix: prefix.to_owned(),
                    epoch,
                    index,
                    schedule: Schedule::of_connection(start, rate, index, CONNECTIONS),
                    stop: start + window,
                    tally: Arc::clone(&tally),
                };
                runtime.spawn(sender.run(conn))
            })
            .collect();
        Ok(Self {
            runtime,
            connections,
            tally,
        })
    }

    /// Stops the creator and returns what it did. A connection still sending then (the server
    /// answered later than the drain) is cut off: its creation in flight counts as sent, not
    /// created.
    pub fn finish(self) -> Tally {
        let cut_off = self.connections.iter().filter(|c| !c.is_finished()).count();
        if cut_off > 0 {
            eprintln!("streams: {cut_off} creator connections were still sending at the end");
        }
        // Not dropped: a runtime dropped on another runtime's thread panics.
        self.runtime.shutdown_background();
        std::mem::take(&mut *self.tally.lock())
    }
}

/// One connection's share of the creations.
struct Sender {
    address: String,
    prefix: String,
    epoch: Instant,
    /// The connection's place among the [`CONNECTIONS`].
    index: usize,
    schedule: Schedule,
    /// No creation is due from then on.
    stop: Instant,
    tally: Arc<parking_lot::Mutex<Tally>>,
}

impl Sender {
    async fn run(mut self, conn: Conn) {
        let mut conn = Some(conn);
        for k in 0u64.. {
            let due = self.schedule.next_due();
            if due >= self.stop {
                return;
            }
            tokio::time::sleep_until(due).await;
            // Its place in the whole schedule: due at `start + n / rate`.
            let n = k * CONNECTIONS as u64 + self.index as u64;
            let due_micros = u64::try_from(due.duration_since(self.epoch).as_micros())
                .expect("a run of less than 500,000 years");
            let key = delivery_key(&self.prefix, n, due_micros);
            self.tally.lock().sent += 1;
            if self.create(&mut conn, &key).await {
                let mut tally = self.tally.lock();
                tally.created += 1;
                tally.latencies.record(due.elapsed());
            }
        }
    }

    /// Sends the creation of `key`, reconnecting first if the connection was lost; whether it
    /// was acknowledged as a creation.
    async fn create(&self, conn: &mut Option<Conn>, key: &str) -> bool {
        if conn.is_none() {
            *conn = Conn::connect(&self.address).await.ok();
        }
        let Some(open) = conn.as_mut() else {
            return false;
        };
        let body = format!(r#"{{"key":"{key}","ttl_s":{TTL_S}}}"#);
        let request = wire::post_json(&self.address, "/v1/heartbeats", body.as_bytes());
        match open.exchange(&request).await {
            Ok(response) => is_creation(&response),
            Err(_) => {
                *conn = None;
                false
            }
        }
    }
}

/// The key of creation `n`, due `due_micros` after the epoch: `<prefix><n>-<due_micros>`,
/// which the stream clients read back (`streams::due_micros`).
pub fn delivery_key(prefix: &str, n: u64, due_micros: u64) -> String {
    format!("{prefix}{n}-{due_micros}")
}

/// A 2xx answer that registered the key (rather than renewing one that existed: no event).
fn is_creation(response: &Response<'_>) -> bool {
    (200..300).contains(&response.status)
        && memmem::find(response.body, br#""created":true"#).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_registration_is_a_creation() {
        let created = br#"{"key":"k","service":null,"created":true,"ttl_ms":3600000}"#;
        let renewed = br#"{"key":"k","service":null,"created":false,"ttl_ms":3600000}"#;
        let answer = |status, body| Response { status, body };
        assert!(is_creation(&answer(200, created)));
        assert!(!is_creation(&answer(200, renewed)));
        assert!(!is_creation(&answer(503, created)));
    }
}
