//! `GET /v1/events`: the live event stream (Server-Sent Events).
//!
//! Each event is `id: <run>-<seq>`, `event: registered|expired|deleted`, and `data:` the JSON of
//! the webhook payload's `data` plus `type`. `service=` and `prefix=` filter it. A client that
//! reconnects with `Last-Event-ID` gets the events it missed from the ring, or a `reset` event
//! when they have left it (or the id is from another run): it should then re-read the lists.
//! A client that falls a whole ring behind gets a `reset` and is disconnected (and counted).
//! A comment every 15 s keeps idle connections open through proxies.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::stream::Stream;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::watch;

use super::error::ApiError;
use super::extract::QueryParams;
use super::AppState;
use crate::events::{Event, EventData};
use crate::stream::{ClientGuard, EventHub, Read};
use crate::types::ServiceName;

/// Interval of the keep-alive comments.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Events taken from the ring per read.
const READ_BATCH: usize = 256;

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
    fn matches(&self, event: &Event) -> bool {
        if event.kind.is_guard() {
            return true;
        }
        let service_ok = self.service.as_ref().is_none_or(|wanted| {
            event
                .service
                .as_ref()
                .is_some_and(|s| s.as_str() == wanted.as_str())
        });
        let prefix_ok = self
            .prefix
            .as_deref()
            .is_none_or(|prefix| event.key.as_str().starts_with(prefix));
        service_ok && prefix_ok
    }
}

/// The `data` of a stream event.
#[derive(Serialize)]
struct StreamData<'a> {
    r#type: &'static str,
    #[serde(flatten)]
    data: EventData<'a>,
}

/// Where one client is.
struct Client {
    hub: Arc<EventHub>,
    filter: Filter,
    /// `seq` of the last event taken from the ring.
    cursor: u64,
    buffer: VecDeque<(u64, Arc<Event>)>,
    /// A `reset` to send before anything else.
    reset: Option<&'static str>,
    /// Whether a read has succeeded yet: a gap before it is a resume from too far back, a
    /// gap after it means the client fell behind.
    streaming: bool,
    /// Whether the client was dropped (the stream ends after the `reset`).
    dropped: bool,
    latest: watch::Receiver<u64>,
    closing: watch::Receiver<bool>,
    _counted: ClientGuard,
}

pub async fn events_stream(
    State(state): State<AppState>,
    caller: super::auth::Caller,
    headers: HeaderMap,
    QueryParams(params): QueryParams<StreamParams>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
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
    let resume_from = headers
        .get("last-event-id")
        .map(|value| value.to_str().ok().and_then(|id| hub.parse_id(id)));
    let latest = hub.latest();
    let (cursor, reset) = match resume_from {
        None => (latest, None),
        Some(Some(seq)) if seq <= latest => (seq, None),
        // An id from another run, unreadable, or from the future.
        Some(_) => (latest, Some("unknown Last-Event-ID: re-read the lists")),
    };
    let client = Client {
        filter,
        cursor,
        buffer: VecDeque::new(),
        reset,
        streaming: false,
        dropped: false,
        latest: hub.subscribe_latest(),
        closing: hub.subscribe_closing(),
        _counted: hub.client(),
        hub,
    };
    let stream = futures_util::stream::unfold(client, |mut client| async move {
        let event = client.next().await?;
        Some((Ok(event), client))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE)))
}

impl Client {
    /// The next event to send; `None` ends the stream.
    async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if *self.closing.borrow() {
                return None;
            }
            if let Some(reason) = self.reset.take() {
                return Some(self.reset_event(reason));
            }
            if self.dropped {
                return None;
            }
            while let Some((seq, event)) = self.buffer.pop_front() {
                if self.filter.matches(&event) {
                    return Some(self.hub_event(seq, &event));
                }
            }
            self.latest.borrow_and_update();
            match self.hub.read_after(self.cursor, READ_BATCH) {
                Read::Gap => self.fell_behind(),
                Read::Events(events) if events.is_empty() => {
                    self.streaming = true;
                    tokio::select! {
                        changed = self.latest.changed() => changed.ok()?,
                        _ = self.closing.changed() => return None,
                    }
                }
                Read::Events(events) => {
                    self.streaming = true;
                    self.cursor = events.last().map_or(self.cursor, |(seq, _)| *seq);
                    self.buffer.extend(events);
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
            self.reset = Some("Last-Event-ID is older than the event ring: re-read the lists");
        }
        self.cursor = self.hub.latest();
    }

    fn hub_event(&self, seq: u64, event: &Event) -> SseEvent {
        let data = StreamData {
            r#type: event.kind.stream_name(),
            data: event.data(),
        };
        SseEvent::default()
            .id(self.hub.id_of(seq))
            .event(event.kind.stream_name())
            .data(serde_json::to_string(&data).expect("an event always serializes"))
    }

    fn reset_event(&self, reason: &str) -> SseEvent {
        SseEvent::default()
            .id(self.hub.id_of(self.cursor))
            .event("reset")
            .data(json!({ "type": "reset", "reason": reason }).to_string())
    }
}
