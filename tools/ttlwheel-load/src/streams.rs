//! `streams`: many `GET /v1/events` clients held open at once, to measure what stream clients
//! cost the server while another load runs (see `bench/streams.sh`).
//!
//! Idle clients send the request and never read: what an idle or stuck consumer costs. Reading
//! clients read everything and count the events (frames with an `id:` line) they received, so
//! the script can relate the server's CPU time to events delivered per stream.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::wire;

#[derive(Clone, Debug)]
pub struct Settings {
    pub address: String,
    pub clients: usize,
    pub read: bool,
    pub duration: Duration,
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
}

/// What one reading client saw.
#[derive(Default)]
struct Counts {
    events: AtomicU64,
    resets: AtomicU64,
}

/// Connects every client, prints `streams: N connected` (scripts wait for that line), holds
/// them for the duration, and reports.
pub async fn run(settings: Settings) -> Result<Outcome, String> {
    let request = wire::get(&settings.address, "/v1/events");
    let mut idle = Vec::new();
    let mut readers = Vec::new();
    for n in 0..settings.clients {
        let mut stream = TcpStream::connect(&settings.address)
            .await
            .map_err(|error| format!("stream client {n}: {error}"))?;
        stream
            .write_all(&request)
            .await
            .map_err(|error| format!("stream client {n}: {error}"))?;
        if settings.read {
            let counts = Arc::new(Counts::default());
            let task = tokio::spawn(read_events(stream, Arc::clone(&counts)));
            readers.push((counts, task));
        } else {
            idle.push(stream);
        }
    }
    println!("streams: {} connected", settings.clients);
    tokio::time::sleep(settings.duration).await;
    let mut outcome = Outcome {
        clients: settings.clients,
        read: settings.read,
        events_min: if readers.is_empty() { 0 } else { u64::MAX },
        ..Outcome::default()
    };
    for (counts, task) in readers {
        if task.is_finished() {
            outcome.ended += 1;
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
    Ok(outcome)
}

/// Reads a stream to its end, counting events (`id:` lines) and resets.
async fn read_events(mut stream: TcpStream, counts: Arc<Counts>) {
    let mut buffer = vec![0u8; 64 * 1024];
    // The bytes after the last newline, kept so that a line split across reads counts once.
    let mut partial = Vec::new();
    loop {
        let n = match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        partial.extend_from_slice(&buffer[..n]);
        let Some(last_newline) = partial.iter().rposition(|&b| b == b'\n') else {
            continue;
        };
        let (events, resets) = count_lines(&partial[..=last_newline]);
        counts.events.fetch_add(events, Ordering::Relaxed);
        counts.resets.fetch_add(resets, Ordering::Relaxed);
        partial.drain(..=last_newline);
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

#[cfg(test)]
mod tests {
    use super::count_lines;

    #[test]
    fn counts_events_and_resets_but_not_comments() {
        let text = b": keep-alive\n\nid: a-1\nevent: registered\ndata: {}\n\nid: a-2\nevent: reset\ndata: {}\n\n";
        assert_eq!(count_lines(text), (2, 1));
    }
}
