//! `streams`: many `GET /v1/events` clients held open at once, to measure what stream clients
//! cost the server while another load runs (see `bench/streams.sh`), and, with
//! `--delivery-rate`, how long an event takes to reach them.
//!
//! Idle clients send the request and never read: what an idle or stuck consumer costs. Reading
//! clients read everything and count the events (frames with an `id:` line) they received, so
//! the script can relate the server's CPU time to events delivered per stream.
//!
//! Delivery latency (`--delivery-rate R`, reading clients only): once every stream is open, the
//! [`creator`](crate::creator) registers new keys open loop, R per second, creation `n` due at
//! a fixed time. Each key names its due time, `<prefix><n>-<µs since the epoch>` (the epoch is
//! an instant of this process), so a client that reads the key's `registered` event computes
//! `receipt - due` with no table shared with the creator. It counts from when the creation was
//! due, so a late send counts in full (as wrk2 counts), to when the client read the event: the
//! request, the server's publishing and its pacing of stream writes, and this tool's own event
//! loop, which reads all the streams.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use memchr::memmem;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::Instant;

#[cfg(test)]
use crate::creator::delivery_key;
use crate::creator::Creator;
use crate::stats::{Durations, Summary};
use crate::wire;

/// How long the reading clients' streams may take to answer before a delivery run starts.
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone, Debug)]
pub struct Settings {
    pub address: String,
    pub clients: usize,
    pub read: bool,
    pub duration: Duration,
    /// Measure delivery latency (reading clients only).
    pub delivery: Option<DeliverySettings>,
}

#[derive(Clone, Copy, Debug)]
pub struct DeliverySettings {
    /// Creations per second.
    pub rate: f64,
    /// The end of the run, with no creations, for the last events to arrive: creations run for
    /// the duration less this.
    pub drain: Duration,
}

#[derive(Debug, Default, serde::Serialize)]
pub struct Outcome {
    pub clients: usize,
    pub read: bool,
    /// Events received by all reading clients together.
    pub events: u64,
    /// Fewest and most events one reading client received.
    pub events_min: u64,
    pub events_max: u64,
    /// `reset` events received (a client told it fell behind).
    pub resets: u64,
    /// Streams that ended before the run did.
    pub ended: u64,
    /// With `--delivery-rate`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery: Option<DeliveryOutcome>,
}

/// What a delivery run measured.
#[derive(Debug, serde::Serialize)]
pub struct DeliveryOutcome {
    /// Creations per second scheduled.
    pub rate: f64,
    /// How long creations ran.
    pub seconds: f64,
    /// Creations due in that time that the creator sent (or tried to).
    pub creations: u64,
    /// Of those, the ones not acknowledged as creations: a non-2xx answer, no answer (an error,
    /// or none yet when the run ended), or a key that already existed (no event).
    pub creations_failed: u64,
    /// Reading clients still connected at the end: the streams every creation should reach.
    pub streams: u64,
    /// Acknowledged creations x `streams`.
    pub expected: u64,
    /// `registered` events of this run's creations that those streams received.
    pub received: u64,
    /// Delivery latency, from each creation's due time to each receipt (`count`: every
    /// receipt timed, including those of streams that ended early).
    #[serde(flatten)]
    pub latency: Summary,
    /// The creations' own latency, from the due time to the answer.
    pub creation_latency: Summary,
}

impl DeliveryOutcome {
    /// Every creation was acknowledged and every stream that stayed received its event.
    pub fn complete(&self) -> bool {
        self.creations_failed == 0 && self.received >= self.expected
    }
}

/// What one reading client saw.
#[derive(Default)]
struct Counts {
    events: AtomicU64,
    resets: AtomicU64,
    /// `registered` events of this run's creations.
    deliveries: AtomicU64,
}

/// A reading client's task and what it counts.
struct Reader {
    counts: Arc<Counts>,
    task: tokio::task::JoinHandle<()>,
}

/// Connects every client, prints `streams: N connected` (scripts wait for that line), holds
/// them for the duration (creating keys meanwhile if delivery is measured), and reports.
pub async fn run(settings: Settings) -> Result<Outcome, String> {
    let epoch = Instant::now();
    // A prefix of this run's own: keys of an earlier run against the same server would be
    // renewals (no event), and their events are not this run's.
    let prefix = format!("dl-{:08x}-", fastrand::u32(..));
    let receipts = settings
        .delivery
        .map(|_| Arc::new(Receipts::new(&prefix, epoch)));
    let request = wire::get(&settings.address, "/v1/events");
    let mut idle = Vec::new();
    let mut readers = Vec::new();
    let mut opened = Vec::new();
    for n in 0..settings.clients {
        let stream = open_stream(&settings.address, &request)
            .await
            .map_err(|error| format!("stream client {n}: {error}"))?;
        if settings.read {
            let counts = Arc::new(Counts::default());
            let (open, is_open) = oneshot::channel();
            let task = tokio::spawn(read_events(
                stream,
                Arc::clone(&counts),
                receipts.clone(),
                open,
            ));
            readers.push(Reader { counts, task });
            opened.push(is_open);
        } else {
            idle.push(stream);
        }
    }
    if receipts.is_some() {
        // Events published before a stream is open never reach it: wait for every one.
        wait_until_open(opened).await?;
    }
    println!("streams: {} connected", settings.clients);
    let creator = match settings.delivery {
        Some(delivery) => {
            let window = settings.duration.saturating_sub(delivery.drain);
            let creator =
                Creator::start(&settings.address, &prefix, epoch, delivery.rate, window).await?;
            Some((creator, delivery, window))
        }
        None => None,
    };
    tokio::time::sleep(settings.duration).await;
    let created = creator.map(|(creator, delivery, window)| (creator.finish(), delivery, window));
    let mut outcome = Outcome {
        clients: settings.clients,
        read: settings.read,
        events_min: if readers.is_empty() { 0 } else { u64::MAX },
        ..Outcome::default()
    };
    let mut streams = 0;
    let mut received = 0;
    for Reader { counts, task } in readers {
        if task.is_finished() {
            outcome.ended += 1;
        } else {
            streams += 1;
            received += counts.deliveries.load(Ordering::Relaxed);
        }
        task.abort();
        let events = counts.events.load(Ordering::Relaxed);
        outcome.events += events;
        outcome.events_min = outcome.events_min.min(events);
        outcome.events_max = outcome.events_max.max(events);
        outcome.resets += counts.resets.load(Ordering::Relaxed);
    }
    for mut stream in idle {
        // A stream the server ended reads as closed (0) or reset at once; an open one has the
        // response waiting or would block.
        let mut probe = [0u8; 1];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_millis(1), stream.read(&mut probe)).await
        {
            outcome.ended += 1;
        }
    }
    if let (Some((tally, delivery, window)), Some(receipts)) = (created, receipts) {
        outcome.delivery = Some(DeliveryOutcome {
            rate: delivery.rate,
            seconds: window.as_secs_f64(),
            creations: tally.sent,
            creations_failed: tally.sent - tally.created,
            streams,
            expected: tally.created * streams,
            received,
            latency: receipts.latencies.lock().summary(),
            creation_latency: tally.latencies.summary(),
        });
    }
    Ok(outcome)
}

/// Connects one client and sends its request.
async fn open_stream(address: &str, request: &[u8]) -> std::io::Result<TcpStream> {
    let mut stream = TcpStream::connect(address).await?;
    stream.write_all(request).await?;
    Ok(stream)
}

/// Waits until every reading client's stream has answered: the server has then set its
/// cursor, and sends it every event published from then on.
async fn wait_until_open(opened: Vec<oneshot::Receiver<()>>) -> Result<(), String> {
    // A client whose stream ended drops its sender: that counts as answered (and as ended).
    tokio::time::timeout(OPEN_TIMEOUT, futures_util::future::join_all(opened))
        .await
        .map(drop)
        .map_err(|_| format!("the streams did not all answer within {OPEN_TIMEOUT:?}"))
}

/// Reads a stream to its end, counting events (`id:` lines), resets and deliveries, and timing
/// the deliveries. Says `open` at the first bytes (the response head).
async fn read_events(
    mut stream: TcpStream,
    counts: Arc<Counts>,
    receipts: Option<Arc<Receipts>>,
    open: oneshot::Sender<()>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    let mut lines = Lines::default();
    let mut open = Some(open);
    loop {
        let n = match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let receipt = Instant::now();
        if let Some(open) = open.take() {
            let _ = open.send(());
        }
        lines.push(&buffer[..n], |whole| {
            let (events, resets) = count_lines(whole);
            counts.events.fetch_add(events, Ordering::Relaxed);
            counts.resets.fetch_add(resets, Ordering::Relaxed);
            if let Some(receipts) = &receipts {
                let delivered = receipts.record(whole, receipt);
                counts.deliveries.fetch_add(delivered, Ordering::Relaxed);
            }
        });
    }
}

/// Bytes read from a stream, handed on in whole lines, so that a line split across reads is
/// seen once, whole.
#[derive(Default)]
struct Lines {
    /// The bytes after the last newline.
    partial: Vec<u8>,
}

impl Lines {
    /// Adds `read`, and calls `whole` with the lines it completed (through the last newline),
    /// if any.
    fn push(&mut self, read: &[u8], whole: impl FnOnce(&[u8])) {
        self.partial.extend_from_slice(read);
        let Some(last_newline) = memchr::memrchr(b'\n', &self.partial) else {
            return;
        };
        whole(&self.partial[..=last_newline]);
        self.partial.drain(..=last_newline);
    }
}

/// Events (`id:` lines) and resets (`event: reset` lines) in whole lines of SSE text.
fn count_lines(text: &[u8]) -> (u64, u64) {
    let mut events = 0;
    let mut resets = 0;
    for line in text.split(|&b| b == b'\n') {
        if line.starts_with(b"id:") {
            events += 1;
        } else if line.starts_with(b"event: reset") || line.starts_with(b"event:reset") {
            resets += 1;
        }
    }
    (events, resets)
}

/// The due time (µs after the epoch) in what follows a delivery key's prefix in an event's
/// JSON: `<n>-<µs>"...`.
fn due_micros(after_prefix: &[u8]) -> Option<u64> {
    let end = memchr::memchr(b'"', after_prefix)?;
    let (n, micros) = std::str::from_utf8(&after_prefix[..end])
        .ok()?
        .split_once('-')?;
    let digits = |text: &str| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    (digits(n) && digits(micros))
        .then(|| micros.parse().ok())
        .flatten()
}

/// From a creation's due time (`due_micros` after `epoch`) to its receipt. The creator wrote
/// the due time truncated to the microsecond, so this reads at most 1 µs long.
fn delivery_latency(epoch: Instant, due_micros: u64, receipt: Instant) -> Duration {
    receipt.saturating_duration_since(epoch + Duration::from_micros(due_micros))
}

/// How the reading clients time deliveries: one histogram for all of them (one per client
/// would take 1,000 x 160 KB).
struct Receipts {
    /// How a delivery's key starts in an event's JSON ([`key_marker`]: the server writes
    /// compact JSON, and the prefix needs no escaping).
    marker: Vec<u8>,
    epoch: Instant,
    latencies: parking_lot::Mutex<Durations>,
}

impl Receipts {
    fn new(prefix: &str, epoch: Instant) -> Self {
        Self {
            marker: key_marker(prefix),
            epoch,
            latencies: parking_lot::Mutex::new(Durations::default()),
        }
    }

    /// Records the latency of every delivery in `text` (whole lines), all received at
    /// `receipt`; returns how many there were.
    fn record(&self, text: &[u8], receipt: Instant) -> u64 {
        let mut latencies = None;
        let mut delivered = 0;
        for due in registered_due_times(text, &self.marker) {
            let latency = delivery_latency(self.epoch, due, receipt);
            latencies
                .get_or_insert_with(|| self.latencies.lock())
                .record(latency);
            delivered += 1;
        }
        delivered
    }
}

/// `"key":"<prefix>`: how a key with `prefix` starts in an event's JSON.
fn key_marker(prefix: &str) -> Vec<u8> {
    format!("\"key\":\"{prefix}").into_bytes()
}

/// The due times of the delivery keys in the `data:` lines of `registered` events in `text`
/// (whole lines), found by their `marker` (`"key":"<prefix>`) with no JSON parsing.
fn registered_due_times<'a>(text: &'a [u8], marker: &'a [u8]) -> impl Iterator<Item = u64> + 'a {
    memmem::find_iter(text, marker).filter_map(move |at| {
        let line = line_around(text, at);
        // The data's `type` is the frame's `event:` name, so the data line alone tells.
        let registered =
            line.starts_with(b"data:") && memmem::find(line, br#""type":"registered""#).is_some();
        registered
            .then(|| due_micros(&text[at + marker.len()..]))
            .flatten()
    })
}

/// The line of `text` that holds byte `at`, without its newline.
fn line_around(text: &[u8], at: usize) -> &[u8] {
    let start = memchr::memrchr(b'\n', &text[..at]).map_or(0, |newline| newline + 1);
    let end = memchr::memchr(b'\n', &text[at..]).map_or(text.len(), |newline| at + newline);
    &text[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_events_and_resets_but_not_comments() {
        let text = b": keep-alive\n\nid: a-1\nevent: registered\ndata: {}\n\nid: a-2\nevent: reset\ndata: {}\n\n";
        assert_eq!(count_lines(text), (2, 1));
    }

    /// The frame the server sends for a registration of `key`.
    fn registered_frame(key: &str) -> String {
        format!(
            "id: 7a-12\nevent: registered\ndata: {{\"type\":\"registered\",\"key\":\"{key}\",\"service\":null,\"ttl_ms\":3600000}}\n\n"
        )
    }

    #[test]
    fn a_delivery_key_names_its_due_time() {
        let key = delivery_key("dl-0000abcd-", 42, 1_234_567);
        assert_eq!(key, "dl-0000abcd-42-1234567");
        let after_prefix = format!("{}\",\"service\":null}}", &key["dl-0000abcd-".len()..]);
        assert_eq!(due_micros(after_prefix.as_bytes()), Some(1_234_567));
        assert_eq!(due_micros(b"42-\""), None);
        assert_eq!(due_micros(b"42-12x\""), None);
        assert_eq!(due_micros(b"4212\""), None);
        assert_eq!(due_micros(b"42-12"), None, "no closing quote");
    }

    #[test]
    fn only_this_runs_registrations_are_deliveries() {
        let marker = &key_marker("dl-1-");
        let mut text = registered_frame(&delivery_key("dl-1-", 0, 500));
        text += &registered_frame(&delivery_key("dl-2-", 1, 600)); // another run's
        text += &registered_frame("other-7");
        text +=
            "id: 7a-13\nevent: expired\ndata: {\"type\":\"expired\",\"key\":\"dl-1-2-700\"}\n\n";
        text += &registered_frame(&delivery_key("dl-1-", 3, 800));
        let due: Vec<u64> = registered_due_times(text.as_bytes(), marker).collect();
        assert_eq!(due, vec![500, 800]);
    }

    #[test]
    fn a_key_split_across_reads_is_read_once_whole() {
        let marker = &key_marker("dl-1-");
        let mut text = registered_frame(&delivery_key("dl-1-", 0, 1_000));
        text += &registered_frame(&delivery_key("dl-1-", 1, 2_000));
        let bytes = text.as_bytes();
        // Every split point, including inside the marker and inside the digits.
        for split in 0..bytes.len() {
            let mut lines = Lines::default();
            let mut due = Vec::new();
            let mut events = 0;
            for read in [&bytes[..split], &bytes[split..]] {
                lines.push(read, |whole| {
                    events += count_lines(whole).0;
                    due.extend(registered_due_times(whole, marker));
                });
            }
            assert_eq!(due, vec![1_000, 2_000], "split at {split}");
            assert_eq!(events, 2, "split at {split}");
        }
    }

    #[test]
    fn latency_counts_from_the_due_time() {
        let epoch = Instant::now();
        let receipt = epoch + Duration::from_micros(12_345);
        assert_eq!(
            delivery_latency(epoch, 10_000, receipt),
            Duration::from_micros(2_345)
        );
        // A due time after the receipt (impossible but for the truncation) reads zero.
        assert_eq!(delivery_latency(epoch, 20_000, receipt), Duration::ZERO);
    }

    #[test]
    fn receipts_record_every_delivery_in_a_read() {
        let epoch = Instant::now();
        let receipts = Receipts::new("dl-1-", epoch);
        let mut text = registered_frame(&delivery_key("dl-1-", 0, 3_000));
        text += &registered_frame(&delivery_key("dl-1-", 1, 4_000));
        let receipt = epoch + Duration::from_millis(5);
        assert_eq!(receipts.record(text.as_bytes(), receipt), 2);
        let latencies = receipts.latencies.lock().summary();
        assert_eq!(latencies.count, 2);
        assert_eq!(latencies.max, Duration::from_millis(2));
    }
}
