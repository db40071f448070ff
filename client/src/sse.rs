//! The event stream: a Server-Sent Events parser (pure) and the stream that follows
//! `GET /v1/events` across reconnects.
//!
//! The parser takes bytes as they come (a frame may be split anywhere, even inside a UTF-8
//! character) and gives back whole frames: `id`, `event`, `data` (several `data:` lines joined
//! by `\n`), comments ignored, `\n`, `\r\n` and `\r` line ends, as the HTML standard says.
//!
//! The stream reconnects when the connection ends or breaks, to the next endpoint if need be,
//! with `Last-Event-ID`: the server then sends what was missed from its ring, or a `reset`
//! event when it cannot (the reader should re-read the lists). It ends after an error the
//! server gave (4xx), or when no endpoint has answered for [`RECONNECT_FOR`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::HeaderValue;
use reqwest::Method;

use crate::error::Error;
use crate::model::{Event, EventsQuery};
use crate::transport::{Call, Transport};

/// The longest the stream waits for a byte: the server sends a comment every 15 s, so a
/// silent connection this long is dead (a half-open TCP connection never ends by itself).
pub const STREAM_IDLE: Duration = Duration::from_secs(45);

/// How long the stream keeps reconnecting while no endpoint answers before it ends with
/// [`Error::Unavailable`]: a restart (recovery included) fits in it.
pub const RECONNECT_FOR: Duration = Duration::from_secs(60);

/// The wait before reconnection number `reconnects`: 100 ms doubling to 5 s, jittered.
fn reconnect_delay(reconnects: u32) -> Duration {
    crate::backoff::retry_delay(
        reconnects,
        Duration::from_millis(100),
        Duration::from_secs(5),
        fastrand::f64(),
    )
}

/// One frame as sent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    /// `id:`; `None` when the frame has none.
    pub id: Option<String>,
    /// `event:`; `message` when the frame has none.
    pub event: String,
    /// The `data:` lines, joined by `\n`.
    pub data: String,
}

/// The parser's state between chunks.
#[derive(Debug, Default)]
pub struct Parser {
    /// Bytes of a line not ended yet.
    line: Vec<u8>,
    /// The previous chunk ended with `\r`: a `\n` starting this one belongs to that line end.
    after_cr: bool,
    /// The frame being read.
    frame: Frame,
    /// Whether the frame has a field yet (a blank line ends only a frame that has one).
    has_field: bool,
    /// Whether `data` has a line yet.
    has_data: bool,
}

impl Parser {
    /// Feeds `chunk`; returns the frames it completed.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<Frame> {
        let mut frames = Vec::new();
        for &byte in chunk {
            if std::mem::take(&mut self.after_cr) && byte == b'\n' {
                continue;
            }
            match byte {
                b'\n' | b'\r' => {
                    self.after_cr = byte == b'\r';
                    let line = std::mem::take(&mut self.line);
                    if let Some(frame) = self.end_line(&line) {
                        frames.push(frame);
                    }
                }
                _ => self.line.push(byte),
            }
        }
        frames
    }

    /// Forgets a half-read frame (the connection broke).
    pub fn reset(&mut self) {
        *self = Self::default();
    }

    fn end_line(&mut self, line: &[u8]) -> Option<Frame> {
        if line.is_empty() {
            if !std::mem::take(&mut self.has_field) {
                return None;
            }
            self.has_data = false;
            let mut frame = std::mem::take(&mut self.frame);
            if frame.event.is_empty() {
                "message".clone_into(&mut frame.event);
            }
            return Some(frame);
        }
        if line[0] == b':' {
            return None;
        }
        let line = String::from_utf8_lossy(line);
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line.as_ref(), ""),
        };
        match field {
            "id" => self.frame.id = Some(value.to_owned()),
            "event" => value.clone_into(&mut self.frame.event),
            "data" => {
                if std::mem::replace(&mut self.has_data, true) {
                    self.frame.data.push('\n');
                }
                self.frame.data.push_str(value);
            }
            _ => return None,
        }
        self.has_field = true;
        None
    }
}

/// The event a frame carries: its `data` is the event's JSON (with `type`), which is dropped
/// from `data` since the frame's `event` names it.
pub fn event_of(frame: Frame) -> Event {
    let mut data: serde_json::Value =
        serde_json::from_str(&frame.data).unwrap_or(serde_json::Value::String(frame.data));
    if let Some(object) = data.as_object_mut() {
        object.remove("type");
    }
    Event {
        id: frame.id.unwrap_or_default(),
        kind: frame.event,
        data,
    }
}

/// A followed stream between two items.
pub(crate) struct Follow {
    /// Where requests go.
    pub(crate) transport: Arc<Transport>,
    /// The filters; `last_event_id` moves with every event read.
    pub(crate) query: EventsQuery,
    /// The open answer, if connected.
    pub(crate) response: Option<reqwest::Response>,
    /// The frames' parser.
    pub(crate) parser: Parser,
    /// Events read and not yet handed out.
    pub(crate) ready: VecDeque<Event>,
    /// Reconnections since the last event (for their backoff).
    pub(crate) reconnects: u32,
    /// The stream has ended.
    pub(crate) done: bool,
    /// Since when reconnecting has failed on every endpoint (`None`: connected, or not tried).
    pub(crate) failing_since: Option<tokio::time::Instant>,
}

impl Follow {
    /// Connects (failing over as any call does) and returns the follower.
    pub(crate) async fn connected(
        transport: Arc<Transport>,
        query: EventsQuery,
    ) -> Result<Self, Error> {
        let mut follow = Self {
            transport,
            query,
            response: None,
            parser: Parser::default(),
            ready: VecDeque::new(),
            reconnects: 0,
            done: false,
            failing_since: None,
        };
        follow.response = Some(follow.connect().await?);
        Ok(follow)
    }

    /// The next event, reconnecting as needed; `None` once the stream has ended.
    pub(crate) async fn next(&mut self) -> Option<Result<Event, Error>> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Some(Ok(event));
            }
            if self.done {
                return None;
            }
            let Some(response) = self.response.as_mut() else {
                match self.connect().await {
                    Ok(response) => {
                        self.failing_since = None;
                        self.response = Some(response);
                    }
                    // A server restarting: keep trying for a while, as the backoff allows.
                    Err(error)
                        if error.is_unavailable()
                            && self
                                .failing_since
                                .get_or_insert_with(tokio::time::Instant::now)
                                .elapsed()
                                < RECONNECT_FOR =>
                    {
                        self.reconnects += 1;
                        tokio::time::sleep(reconnect_delay(self.reconnects)).await;
                    }
                    Err(error) => {
                        self.done = true;
                        return Some(Err(error));
                    }
                }
                continue;
            };
            match tokio::time::timeout(STREAM_IDLE, response.chunk()).await {
                Ok(Ok(Some(bytes))) => {
                    for frame in self.parser.push(&bytes) {
                        if let Some(id) = &frame.id {
                            self.query.last_event_id = Some(id.clone());
                        }
                        self.reconnects = 0;
                        self.ready.push_back(event_of(frame));
                    }
                }
                // Ended (a server stopping), broken, or silent too long: resume elsewhere.
                Ok(Ok(None)) | Ok(Err(_)) | Err(_) => {
                    tracing::debug!(last_event_id = ?self.query.last_event_id, "event stream ended: resuming");
                    self.response = None;
                    self.parser.reset();
                    self.reconnects += 1;
                    tokio::time::sleep(reconnect_delay(self.reconnects)).await;
                }
            }
        }
    }

    async fn connect(&self) -> Result<reqwest::Response, Error> {
        let mut call = Call::new(Method::GET, "/v1/events".to_owned())
            .query("service", self.query.service.as_ref())
            .query("prefix", self.query.prefix.as_ref());
        call.headers.insert(
            reqwest::header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
        if let Some(id) = &self.query.last_event_id {
            let value = HeaderValue::from_str(id).map_err(|_| {
                Error::Config(format!("`{id}` cannot be sent as a Last-Event-ID header"))
            })?;
            call.headers.insert("last-event-id", value);
        }
        self.transport.open(&call).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(id: Option<&str>, event: &str, data: &str) -> Frame {
        Frame {
            id: id.map(str::to_owned),
            event: event.to_owned(),
            data: data.to_owned(),
        }
    }

    /// Feeds `stream` in chunks of every size from 1 to its length and checks each gives
    /// `expected`.
    fn check(stream: &str, expected: &[Frame]) {
        let bytes = stream.as_bytes();
        for size in 1..=bytes.len().max(1) {
            let mut parser = Parser::default();
            let frames: Vec<Frame> = bytes
                .chunks(size)
                .flat_map(|chunk| parser.push(chunk))
                .collect();
            assert_eq!(frames, expected, "chunks of {size} of {stream:?}");
        }
    }

    #[test]
    fn frames_are_read_whatever_the_chunking_and_line_ends() {
        check(
            "id: 1-1\nevent: expired\ndata: {\"key\":\"a\"}\n\n",
            &[frame(Some("1-1"), "expired", "{\"key\":\"a\"}")],
        );
        check(
            "id: 1-1\r\nevent: expired\r\ndata: x\r\n\r\n",
            &[frame(Some("1-1"), "expired", "x")],
        );
        check(
            "id: 1\revent: e\rdata: x\r\rdata: y\r\r",
            &[frame(Some("1"), "e", "x"), frame(None, "message", "y")],
        );
        check(":\n\n: keep-alive\n\n", &[]);
        check(
            "data: one\ndata: two\ndata\n\n",
            &[frame(None, "message", "one\ntwo\n")],
        );
        check("data:no-space\n\n", &[frame(None, "message", "no-space")]);
        check("data: ключ\n\n", &[frame(None, "message", "ключ")]);
        check("retry: 10\nunknown: x\n\n", &[]);
        check("data: unfinished", &[]);
    }

    #[test]
    fn a_frame_becomes_an_event_without_its_type_in_the_data() {
        let event = event_of(frame(
            Some("0000abcd-7"),
            "expired",
            r#"{"type":"expired","key":"api/1","service":"api"}"#,
        ));
        assert_eq!(event.id, "0000abcd-7");
        assert_eq!(event.kind, "expired");
        assert_eq!(event.key(), Some("api/1"));
        assert_eq!(event.service(), Some("api"));
        assert!(event.data.get("type").is_none());
        let odd = event_of(frame(None, "message", "not json"));
        assert_eq!(odd.data, serde_json::Value::String("not json".into()));
    }
}
