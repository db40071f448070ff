//! The tool's webhook receiver: an HTTP server that stamps each delivery with its arrival time
//! (the moment the handler runs) and hands it to the mode's accounting. It answers `204` at once,
//! so deliveries are never retried because of the receiver. A batched delivery
//! (`--webhook-batch-max` above 1) is unpacked: each event inside is one arrival, under its own id.

use std::net::SocketAddr;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// The `type` of an expiry webhook.
pub const EXPIRED: &str = "key.expired";

/// One delivery as received.
#[derive(Debug)]
pub struct Arrival {
    pub at: Instant,
    /// The event's id: the `webhook-id` header, or the event's `id` inside a batch; the same on
    /// every retry of one event.
    pub id: String,
    /// `key.expired`, `key.deleted` or `key.registered`.
    pub kind: String,
    pub key: String,
    /// `data.occurred_at` as the server wrote it (RFC 3339, ms), when present.
    pub occurred_at: Option<String>,
    /// `data.lateness_ms`: how late the server expired the key, by its own clock.
    pub lateness_ms: Option<u64>,
}

/// Starts the receiver on `bind`; deliveries come out of the returned channel.
pub async fn start(
    bind: SocketAddr,
) -> std::io::Result<(SocketAddr, mpsc::UnboundedReceiver<Arrival>)> {
    let listener = tokio::net::TcpListener::bind(bind).await?;
    let address = listener.local_addr()?;
    let (sender, arrivals) = mpsc::unbounded_channel();
    let app = Router::new()
        .route("/hook", post(deliver))
        .with_state(sender);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((address, arrivals))
}

async fn deliver(
    State(sender): State<mpsc::UnboundedSender<Arrival>>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let at = Instant::now();
    match parse(&headers, &body) {
        Some(events) => {
            for (id, kind, key, occurred_at, lateness_ms) in events {
                let _ = sender.send(Arrival {
                    at,
                    id,
                    kind,
                    key,
                    occurred_at,
                    lateness_ms,
                });
            }
            StatusCode::NO_CONTENT
        }
        // Not a delivery we understand: refuse it visibly (it would be a bug in one side).
        None => StatusCode::BAD_REQUEST,
    }
}

/// `(event id, type, key, occurred_at, lateness_ms)` of a delivered event.
type Parsed = (String, String, String, Option<String>, Option<u64>);

/// The `type` of a batched delivery.
const BATCH: &str = "batch";

/// The events of a delivery: one, or a batch's.
fn parse(headers: &HeaderMap, body: &[u8]) -> Option<Vec<Parsed>> {
    #[derive(serde::Deserialize)]
    struct Payload<'a> {
        #[serde(borrow, default)]
        id: Option<&'a str>,
        #[serde(borrow)]
        r#type: &'a str,
        #[serde(borrow)]
        data: &'a serde_json::value::RawValue,
    }
    #[derive(serde::Deserialize)]
    struct Batch<'a> {
        #[serde(borrow)]
        events: Vec<Payload<'a>>,
    }
    #[derive(serde::Deserialize)]
    struct Data<'a> {
        #[serde(borrow)]
        key: std::borrow::Cow<'a, str>,
        #[serde(borrow, default)]
        occurred_at: Option<&'a str>,
        #[serde(default)]
        lateness_ms: Option<u64>,
    }
    fn event(id: &str, payload: &Payload<'_>) -> Option<Parsed> {
        let data: Data<'_> = serde_json::from_str(payload.data.get()).ok()?;
        Some((
            id.to_owned(),
            payload.r#type.to_owned(),
            data.key.into_owned(),
            data.occurred_at.map(str::to_owned),
            data.lateness_ms,
        ))
    }
    let id = headers.get("webhook-id")?.to_str().ok()?;
    let payload: Payload<'_> = serde_json::from_slice(body).ok()?;
    if payload.r#type != BATCH {
        return Some(vec![event(id, &payload)?]);
    }
    let batch: Batch<'_> = serde_json::from_str(payload.data.get()).ok()?;
    batch
        .events
        .iter()
        .map(|inner| event(inner.id?, inner))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_delivery_is_stamped_and_parsed_over_real_http() {
        let (address, mut arrivals) = start("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let body =
            br#"{"type":"key.expired","timestamp":"t","data":{"key":"soak-7","service":null,"occurred_at":"2026-11-21T10:00:01.250Z"}}"#;
        let mut request = crate::wire::post_json("x", "/hook", body);
        // Insert the id header after the request line.
        let at = request.windows(2).position(|w| w == b"\r\n").unwrap() + 2;
        request.splice(at..at, b"webhook-id: msg_1\r\n".iter().copied());
        let before = Instant::now();
        let (status, _) = crate::driver::one_request(&address.to_string(), &request)
            .await
            .unwrap();
        assert_eq!(status, 204);
        let arrival = arrivals.recv().await.unwrap();
        assert_eq!(
            (
                arrival.id.as_str(),
                arrival.kind.as_str(),
                arrival.key.as_str()
            ),
            ("msg_1", EXPIRED, "soak-7")
        );
        assert!(arrival.at >= before);
        assert_eq!(
            arrival.occurred_at.as_deref(),
            Some("2026-11-21T10:00:01.250Z")
        );
    }

    #[test]
    fn deliveries_without_an_id_or_a_key_are_refused() {
        let mut headers = HeaderMap::new();
        assert!(parse(&headers, br#"{"type":"expired","data":{"key":"a"}}"#).is_none());
        headers.insert("webhook-id", "msg_1".parse().unwrap());
        assert!(parse(&headers, br#"{"type":"expired","data":{}}"#).is_none());
        assert!(parse(&headers, br#"{"type":"expired","data":{"key":"a"}}"#).is_some());
    }

    #[test]
    fn a_batch_is_unpacked_into_its_events_under_their_own_ids() {
        let mut headers = HeaderMap::new();
        headers.insert("webhook-id", "batch_1".parse().unwrap());
        let body = br#"{"type":"batch","timestamp":"t","data":{"events":[
            {"id":"msg_1","type":"key.expired","timestamp":"t","data":{"key":"a","lateness_ms":3}},
            {"id":"msg_2","type":"key.deleted","timestamp":"t","data":{"key":"b"}}]}}"#;
        let events = parse(&headers, body).unwrap();
        let summary: Vec<(&str, &str, &str, Option<u64>)> = events
            .iter()
            .map(|(id, kind, key, _, lateness)| {
                (id.as_str(), kind.as_str(), key.as_str(), *lateness)
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("msg_1", EXPIRED, "a", Some(3)),
                ("msg_2", "key.deleted", "b", None)
            ]
        );
        let without_id =
            br#"{"type":"batch","data":{"events":[{"type":"key.expired","data":{"key":"a"}}]}}"#;
        assert!(
            parse(&headers, without_id).is_none(),
            "a batched event needs its id"
        );
    }
}
