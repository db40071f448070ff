//! Forwarding: an API request that only the leader may serve, sent by a follower to the
//! leader over the peer link (`POST /raft/forward`) and served there by the leader's own API
//! router, with the caller's credentials, so that the leader checks the token itself.
//!
//! Why the peer link and not the leader's API port: a follower cut off from the leader cannot
//! reach it by a side door (it answers `no_leader`/`no_quorum` as the partition demands), and
//! the peer secret proves to the leader that the request comes from a member.
//!
//! Wire form, both ways: a 4-byte length, a JSON head, then the body as is. The request's head
//! is its method, path and query, and its headers but the hop-by-hop ones; the answer's, its
//! status and headers. A forwarded request carries [`FORWARDED`]: its receiver serves it or
//! refuses, and never forwards it again (no loops while leadership moves).

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde::{Deserialize, Serialize};
use tower_service::Service as _;

use super::network::{route, Peers};

/// The header that marks a request forwarded by a member.
pub const FORWARDED: &str = "x-ttlwheel-forwarded";
/// The header that names the member that served a forwarded request (its API address).
pub const LEADER: &str = "x-ttlwheel-leader";
/// The largest body forwarded either way (the API's own limits are far lower, but an answer
/// such as a listing page can be larger than a request).
const MAX_BODY: usize = 64 << 20;
/// How long a forwarded request may take, leader's work included.
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A forwarded request's or answer's head.
#[derive(Debug, Serialize, Deserialize)]
struct Head {
    /// The request's method (empty in an answer).
    #[serde(default)]
    method: String,
    /// The request's path and query (empty in an answer).
    #[serde(default)]
    uri: String,
    /// The answer's status (0 in a request).
    #[serde(default)]
    status: u16,
    /// Headers, in order.
    headers: Vec<(String, String)>,
}

/// Why a forwarded message cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("the forwarded message is cut short")]
    Truncated,
    #[error("the forwarded message's head is not valid: {0}")]
    Head(String),
    #[error("the forwarded body is larger than {MAX_BODY} bytes")]
    TooLarge,
}

fn encode(head: &Head, body: &[u8]) -> Vec<u8> {
    let head = serde_json::to_vec(head).expect("a head of strings serializes");
    let len = u32::try_from(head.len()).expect("a head is far smaller than 4 GiB");
    let mut out = Vec::with_capacity(4 + head.len() + body.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&head);
    out.extend_from_slice(body);
    out
}

fn decode(bytes: &[u8]) -> Result<(Head, &[u8]), ForwardError> {
    let (len, rest) = bytes
        .split_first_chunk::<4>()
        .ok_or(ForwardError::Truncated)?;
    let len = u32::from_le_bytes(*len) as usize;
    if len > rest.len() {
        return Err(ForwardError::Truncated);
    }
    let (head, body) = rest.split_at(len);
    let head =
        serde_json::from_slice(head).map_err(|error| ForwardError::Head(error.to_string()))?;
    Ok((head, body))
}

/// Headers that belong to one connection, not to the request.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "host"
            | "transfer-encoding"
            | "content-length"
            | "te"
            | "trailer"
            | "upgrade"
            | "proxy-authorization"
    )
}

fn headers_of(map: &HeaderMap) -> Vec<(String, String)> {
    map.iter()
        .filter(|(name, _)| !is_hop_by_hop(name))
        .filter_map(|(name, value)| Some((name.to_string(), value.to_str().ok()?.to_owned())))
        .collect()
}

fn header_map(headers: &[(String, String)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::try_from(name.as_str()),
            HeaderValue::try_from(value.as_str()),
        ) {
            if !is_hop_by_hop(&name) {
                map.append(name, value);
            }
        }
    }
    map
}

/// Whether `request` was forwarded by a member (and so must not be forwarded again).
pub fn is_forwarded(headers: &HeaderMap) -> bool {
    headers.contains_key(FORWARDED)
}

/// Sends `request` to the leader at `leader_peer_addr` and returns its answer, marked with
/// `leader_api` in [`LEADER`]. An unreachable leader is a 503 `no_leader`.
pub async fn to_leader(
    peers: &Peers,
    leader_peer_addr: &str,
    leader_api: &str,
    request: Request<Body>,
) -> Response {
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(body) => body,
        Err(error) => {
            return unavailable("invalid_body", format!("cannot read the body: {error}"));
        }
    };
    let uri = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_owned(), |pq| pq.as_str().to_owned());
    let head = Head {
        method: parts.method.to_string(),
        uri,
        status: 0,
        headers: headers_of(&parts.headers),
    };
    let sent = peers
        .post(
            leader_peer_addr,
            route::FORWARD,
            encode(&head, &body),
            TIMEOUT,
        )
        .await;
    let (status, answer) = match sent {
        Ok(answer) => answer,
        Err(error) => {
            let message = format!("the leader cannot be reached: {error}");
            return unavailable("no_leader", message);
        }
    };
    if !status.is_success() {
        // The leader's peer server refused the forwarding itself (not the API's answer).
        return unavailable(
            "no_leader",
            format!(
                "the leader refused the forwarded request ({status}): {}",
                String::from_utf8_lossy(&answer)
            ),
        );
    }
    match decode(&answer) {
        Ok((head, body)) => {
            let status = StatusCode::from_u16(head.status).unwrap_or(StatusCode::BAD_GATEWAY);
            let mut response = (status, Bytes::copy_from_slice(body)).into_response();
            *response.headers_mut() = header_map(&head.headers);
            if let Ok(leader) = HeaderValue::try_from(leader_api) {
                response.headers_mut().insert(LEADER, leader);
            }
            response
        }
        Err(error) => unavailable("no_leader", format!("the leader's answer: {error}")),
    }
}

/// A 503 in the API's shape, to be retried.
pub fn unavailable(code: &str, message: String) -> Response {
    let body = serde_json::json!({ "error": { "code": code, "message": message } });
    let mut response = (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
    response
        .headers_mut()
        .insert("retry-after", HeaderValue::from_static("1"));
    response
}

/// Serves a forwarded request (the body of `POST /raft/forward`) with `api`; the answer, in the
/// wire form.
pub async fn serve_forwarded(mut api: Router, message: &[u8]) -> Result<Response, ForwardError> {
    let (head, body) = decode(message)?;
    let method = Method::from_bytes(head.method.as_bytes())
        .map_err(|error| ForwardError::Head(error.to_string()))?;
    let mut request = Request::builder()
        .method(method)
        .uri(&head.uri)
        .body(Body::from(Bytes::copy_from_slice(body)))
        .map_err(|error| ForwardError::Head(error.to_string()))?;
    *request.headers_mut() = header_map(&head.headers);
    request
        .headers_mut()
        .insert(FORWARDED, HeaderValue::from_static("1"));
    let response = match api.call(request).await {
        Ok(response) => response,
        Err(infallible) => match infallible {},
    };
    let (parts, body) = response.into_parts();
    let body = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|_| ForwardError::TooLarge)?;
    let head = Head {
        method: String::new(),
        uri: String::new(),
        status: parts.status.as_u16(),
        headers: headers_of(&parts.headers),
    };
    Ok(encode(&head, &body).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_reads_back_as_written_and_a_cut_one_is_refused() {
        let head = Head {
            method: "PUT".into(),
            uri: "/v1/keys/a?x=1".into(),
            status: 0,
            headers: vec![("authorization".into(), "Bearer t".into())],
        };
        let bytes = encode(&head, b"{\"ttl\":5}");
        let (read, body) = decode(&bytes).unwrap();
        assert_eq!(
            (read.method.as_str(), read.uri.as_str()),
            ("PUT", "/v1/keys/a?x=1")
        );
        assert_eq!(read.headers, head.headers);
        assert_eq!(body, b"{\"ttl\":5}");
        for cut in 0..4 + 10 {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn hop_by_hop_headers_are_not_forwarded() {
        let mut map = HeaderMap::new();
        map.insert("connection", HeaderValue::from_static("close"));
        map.insert("host", HeaderValue::from_static("a:1"));
        map.insert("authorization", HeaderValue::from_static("Bearer t"));
        assert_eq!(
            headers_of(&map),
            vec![("authorization".to_owned(), "Bearer t".to_owned())]
        );
    }
}
