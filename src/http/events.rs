//! `GET /v1/events`: the live event stream (Server-Sent Events).
//!
//! Each event is `id: <run>-<seq>` (on a cluster member, its place in the log, `log-<hex>`, the
//! same on every member, so a client resumes on any: `stream::log_ids`), `event:
//! registered|expired|deleted`, and `data:` the JSON of the webhook payload's `data` plus `type`. `service=` and `prefix=` filter it. A client that
//! reconnects with `Last-Event-ID` gets the events it missed from the ring, or a `reset` event
//! when they have left it (or the id is from another run): it should then re-read the lists.
//! A client that falls a whole ring behind gets a `reset` and is disconnected (and counted).
//! A comment every 15 s keeps idle connections open through proxies.
//!
//! Cost per client: the frames come from the ring already encoded (once, for every client), a
//! client is woken at most once per `stream::WAKE_INTERVAL` while events keep coming (at once
//! while they are sparse for the clients connected: `stream::wake`), from its own serving
//! thread (`stream::relay`), and each
//! wake-up sends everything it has as one chunk (one write). A client that does not read costs
//! nothing once its socket is full: the server stops polling its stream until it drains.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};

use super::error::ApiError;
use super::extract::QueryParams;
use super::AppState;
use crate::stream::compact::CompactEvent;
use crate::stream::log_ids::{Place, Resume};
use crate::stream::{sse_frame, ClientGuard, EventHub, Read};

/// Why a resuming client is told to re-read the lists: events after its id may be missing.
const OLDER_THAN_RING: &str = "Last-Event-ID is older than the event ring: re-read the lists";
/// A cluster member installed a snapshot from the leader while the client read: the events of
/// the entries it covers were never produced here. The stream goes on after it.
const SNAPSHOT_INSTALLED: &str =
    "this member caught up from a snapshot: events before it were skipped; re-read the lists";
use crate::types::ServiceName;

/// Interval of the keep-alive comments.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// A chunk is sent once it holds this many bytes (or the client is caught up).
const CHUNK_BYTES: usize = 64 * 1024;
/// The keep-alive comment.
const KEEP_ALIVE_COMMENT: &[u8] = b":\n\n";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamParams {
    service: Option<String>,
    prefix: Option<String>,
}

#[derive(Debug)]
struct Filter {
    service: Option<ServiceName>,
    prefix: Option<String>,
}

impl Filter {
    /// Guard events are about the whole registry: every client gets them.
    fn matches(&self, event: &CompactEvent<'_>) -> bool {
        if event.kind().is_guard() {
            return true;
        }
        let service_ok = self
            .service
            .as_ref()
            .is_none_or(|wanted| event.service() == Some(wanted.as_str()));
        let prefix_ok = self
            .prefix
            .as_deref()
            .is_none_or(|prefix| event.key().starts_with(prefix));
        service_ok && prefix_ok
    }
}

/// Where one client is.
struct Client {
    hub: Arc<EventHub>,
    filter: Filter,
    /// `seq` of the last event examined in the ring.
    cursor: u64,
    /// On a cluster member, events at or below this place are passed over (a client that
    /// came from a member ahead of this one).
    passed: Option<Place>,
    /// `KEEP_ALIVE` after the last chunk was sent, when a keep-alive comment is due. One timer
    /// per client, moved on as chunks go: moving a timer later only stores the new deadline,
    /// where a new one per wait took the runtime's timer lock twice per event per client.
    keep_alive: Pin<Box<Sleep>>,
    /// Whether the last read stopped short of the newest event (a full chunk): the next one
    /// comes after other tasks had a turn.
    behind: bool,
    /// A `reset` to send before anything else.
    reset: Option<&'static str>,
    /// Whether a read has succeeded yet: a gap before it is a resume from too far back, a
    /// gap after it means the client fell behind.
    streaming: bool,
    /// Whether the client was dropped (the stream ends after the `reset`).
    dropped: bool,
    /// The snapshot marks this client was told of (see `stream::log_ids`).
    marks_told: u64,
    latest: watch::Receiver<u64>,
    closing: watch::Receiver<bool>,
    _counted: ClientGuard,
}

pub async fn events_stream(
    State(state): State<AppState>,
    caller: super::auth::Caller,
    headers: HeaderMap,
    QueryParams(params): QueryParams<StreamParams>,
) -> Result<Response, ApiError> {
    caller.check_list(params.prefix.as_deref(), params.service.as_deref())?;
    let filter = Filter {
        service: params
            .service
            .as_deref()
            .map(ServiceName::new)
            .transpose()?,
        prefix: params.prefix,
    };
    let hub = Arc::clone(&state.hub);
    if hub.clients() >= state.max_stream_clients {
        return Err(ApiError::TooManyStreamClients(format!(
            "{} event-stream clients are connected (--max-stream-clients): try again later",
            state.max_stream_clients
        )));
    }
    // A busy feed may still hold events published before this request: start after them.
    hub.settled().await;
    let resume_from = headers
        .get("last-event-id")
        .map(|value| value.to_str().ok().and_then(|id| hub.resume(id)));
    let newest = hub.newest();
    let (cursor, passed, reset) = match resume_from {
        None => (newest, None, None),
        Some(Some(Resume::After(seq))) if seq <= newest => (seq, None, None),
        Some(Some(Resume::Ahead { newest, through })) => (newest, Some(through), None),
        Some(Some(Resume::Gap)) => (newest, None, Some(OLDER_THAN_RING)),
        // An id from another run, unreadable, or from the future.
        Some(_) => (
            newest,
            None,
            Some("unknown Last-Event-ID: re-read the lists"),
        ),
    };
    let client = Client {
        filter,
        cursor,
        passed,
        keep_alive: Box::pin(tokio::time::sleep(KEEP_ALIVE)),
        behind: false,
        reset,
        streaming: false,
        dropped: false,
        marks_told: hub.marks_placed(),
        latest: crate::stream::relay::subscribe(&hub),
        closing: hub.subscribe_closing(),
        _counted: hub.client(),
        hub,
    };
    let stream = futures_util::stream::unfold(client, |mut client| async move {
        let chunk = client.next().await?;
        Some((Ok::<_, Infallible>(chunk), client))
    });
    let headers = [
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        ),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
    ];
    Ok((headers, Body::from_stream(stream)).into_response())
}

impl Client {
    /// The next chunk to send (frames or a keep-alive comment); `None` ends the stream.
    async fn next(&mut self) -> Option<Bytes> {
        // Let other tasks run between chunks while catching up, so that a thousand clients
        // behind take turns with requests instead of each writing all it can in one go. A
        // client that was sent everything waits for the next announcement, which is its turn.
        if std::mem::take(&mut self.behind) {
            tokio::task::yield_now().await;
        }
        let chunk = self.next_chunk().await?;
        self.keep_alive.as_mut().reset(Instant::now() + KEEP_ALIVE);
        Some(chunk)
    }

    async fn next_chunk(&mut self) -> Option<Bytes> {
        loop {
            if *self.closing.borrow() {
                return None;
            }
            if let Some(reason) = self.reset.take() {
                return Some(self.reset_frame(reason));
            }
            if self.dropped {
                return None;
            }
            self.latest.borrow_and_update();
            let mut chunk = Vec::new();
            let filter = &self.filter;
            match self.hub.read_into(
                self.cursor,
                self.passed,
                self.marks_told,
                |e| filter.matches(e),
                &mut chunk,
                CHUNK_BYTES,
            ) {
                Read::Gap => {
                    self.fell_behind();
                    continue;
                }
                Read::Replaced { told } => {
                    self.marks_told = told;
                    self.reset = Some(SNAPSHOT_INSTALLED);
                    continue;
                }
                Read::Frames { through, at_end } => {
                    self.streaming = true;
                    self.cursor = through;
                    if !chunk.is_empty() {
                        self.behind = !at_end;
                        return Some(chunk.into());
                    }
                    if !at_end {
                        continue;
                    }
                }
            }
            tokio::select! {
                changed = self.latest.changed() => changed.ok()?,
                _ = self.closing.changed() => return None,
                () = &mut self.keep_alive => {
                    return Some(Bytes::from_static(KEEP_ALIVE_COMMENT));
                }
            }
        }
    }

    /// The events after the cursor have left the ring: on (re)connect, say so and continue
    /// from now; while streaming, the client is too slow: say so and end.
    fn fell_behind(&mut self) {
        if self.streaming {
            self.hub.dropped(self.cursor);
            self.reset =
                Some("fell behind the event ring: dropped; reconnect and re-read the lists");
            self.dropped = true;
        } else {
            self.reset = Some(OLDER_THAN_RING);
        }
        self.cursor = self.hub.newest();
    }

    fn reset_frame(&self, reason: &str) -> Bytes {
        let data = json!({ "type": "reset", "reason": reason }).to_string();
        sse_frame(&self.hub.id_of(self.cursor), "reset", &data).into()
    }
}
