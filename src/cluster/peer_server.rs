//! The `--cluster-listen` listener: what peers ask this member. Its own port, never the API's,
//! so that peer traffic and client traffic are limited, authenticated and cut separately (the
//! fault proxy of the cluster tests sits on these links only).
//!
//! Routes (all `POST`, all checked by [`PeerAuth`] before anything is parsed):
//! - `/raft/append`, `/raft/vote`: openraft's RPCs, JSON in, `Result` as JSON out.
//! - `/raft/snapshot`: a whole snapshot ([`super::network`] describes the body), written to the
//!   state machine's incoming file and synced before it is installed.
//! - `/raft/info`: this member's id and API address (the leader fills in the membership).
//! - `/raft/ping`: this member's id and whether a leader holds it (it would refuse a vote):
//!   the probe of [`super::campaign`]'s gate.
//! - `/raft/forward`: an API request a follower forwards to this member (the leader), served by
//!   the API's own router with the caller's credentials ([`super::forward`]).
//!
//! A refused signature is a 401 with the API's JSON error shape, a request from another
//! cluster a 409 `cluster_mismatch` ([`super::identity`]); the body limit is the peer
//! limit below, far above any entry batch, and a snapshot's own.

use std::io::Write as _;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use openraft::Raft;
use parking_lot::Mutex;
use serde::Serialize;
use tokio::time::Instant;

use super::auth::{self, PeerAuth};
use super::campaign::{self, PingAnswer};
use super::forward;
use super::identity::{self, Identity};
use super::metrics::ClusterStats;
use super::network::{route, SnapshotHead};
use super::node::MemberInfo;
use super::types::{SnapshotFile, TypeConfig};

/// The largest peer request but a snapshot: 64 entries of up to 4,096 records are far below.
const MAX_RPC_BYTES: usize = 256 << 20;
/// The largest snapshot this member receives.
const MAX_SNAPSHOT_BYTES: usize = 16 << 30;

/// What the peer routes need.
#[derive(Clone)]
pub struct PeerState {
    /// This member's Raft.
    pub raft: Raft<TypeConfig>,
    /// Checks every request.
    pub auth: PeerAuth,
    /// The cluster this member belongs to: requests from another are refused.
    pub identity: Arc<Identity>,
    /// Counts the refusals.
    pub stats: Arc<ClusterStats>,
    /// The API's router, for forwarded requests (set once the API is built).
    pub api: Arc<OnceLock<Router>>,
    /// This member's API address, for `/raft/info`.
    pub advertise_api: String,
    /// Stamped whenever an AppendEntries from a leader is accepted.
    pub leader_contact: Arc<Mutex<Option<Instant>>>,
    /// The highest commit index a leader's accepted AppendEntries named (`/readyz` on a
    /// follower: caught up means applied that far, not only as far as its own log goes).
    pub leader_commit: Arc<std::sync::atomic::AtomicU64>,
    /// openraft's leader lease (`election_timeout_max`), for `/raft/ping`'s "held".
    pub leader_lease: std::time::Duration,
}

/// The peer listener's router.
pub fn router(state: PeerState) -> Router {
    Router::new()
        .route(route::APPEND, post(append))
        .route(route::VOTE, post(vote))
        .route(route::FORWARD, post(forward_request))
        .route(route::INFO, post(info))
        .route(route::PING, post(ping))
        .layer(DefaultBodyLimit::max(MAX_RPC_BYTES))
        .route(
            route::SNAPSHOT,
            post(snapshot).layer(DefaultBodyLimit::max(MAX_SNAPSHOT_BYTES)),
        )
        .with_state(state)
}

/// A peer request refused before Raft saw it, answered in the API's error shape.
struct Refusal {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": { "code": self.code, "message": self.message } });
        (self.status, axum::Json(body)).into_response()
    }
}

fn refusal(status: StatusCode, code: &'static str, message: impl std::fmt::Display) -> Refusal {
    Refusal {
        status,
        code,
        message: message.to_string(),
    }
}

/// A refusal, answered.
fn refuse(status: StatusCode, code: &'static str, message: impl std::fmt::Display) -> Response {
    refusal(status, code, message).into_response()
}

/// Checks the request's signature, then that it comes from this member's cluster (adopting
/// its id if this member has none: [`super::identity`]); the refusal to send if either fails.
async fn check(
    state: &PeerState,
    path: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(), Refusal> {
    let header = headers
        .get(auth::HEADER)
        .and_then(|value| value.to_str().ok());
    state
        .auth
        .verify("POST", path, body, header, auth::unix_now())
        .map_err(|error| {
            tracing::warn!(%error, path, "a peer request was refused");
            state.stats.unauthorized_peer_requests.fetch_add(1, Relaxed);
            refusal(StatusCode::UNAUTHORIZED, "peer_unauthorized", error)
        })?;
    let named = match headers.get(identity::HEADER) {
        None => None,
        Some(value) => Some(
            (value.to_str().map_err(|error| error.to_string()))
                .and_then(identity::parse)
                .map_err(|error| refusal(StatusCode::BAD_REQUEST, "invalid_peer_request", error))?,
        ),
    };
    state.identity.admit(named).await.map_err(|refused| {
        tracing::error!(error = %refused, path, "a peer request was refused");
        match refused {
            identity::Refused::Mismatch { .. } => {
                state.stats.foreign_peer_requests.fetch_add(1, Relaxed);
                refusal(StatusCode::CONFLICT, "cluster_mismatch", refused)
            }
            identity::Refused::Store(_) => {
                refusal(StatusCode::SERVICE_UNAVAILABLE, "storage_failed", refused)
            }
        }
    })
}

fn json<T: Serialize>(value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => ([("content-type", "application/json")], body).into_response(),
        Err(error) => refuse(StatusCode::INTERNAL_SERVER_ERROR, "internal", error),
    }
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Refusal> {
    serde_json::from_slice(body)
        .map_err(|error| refusal(StatusCode::BAD_REQUEST, "invalid_peer_request", error))
}

async fn append(State(state): State<PeerState>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(refused) = check(&state, route::APPEND, &headers, &body).await {
        return refused.into_response();
    }
    match parse::<openraft::raft::AppendEntriesRequest<TypeConfig>>(&body) {
        Ok(request) => {
            let received = Instant::now();
            let leader_commit = request.leader_commit.map_or(0, |log_id| log_id.index);
            let answer = state.raft.append_entries(request).await;
            if answer.as_ref().is_ok_and(|response| response.is_success()) {
                *state.leader_contact.lock() = Some(received);
                (state.leader_commit).fetch_max(leader_commit, std::sync::atomic::Ordering::AcqRel);
            }
            json(&answer)
        }
        Err(refused) => refused.into_response(),
    }
}

async fn info(State(state): State<PeerState>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(refused) = check(&state, route::INFO, &headers, &body).await {
        return refused.into_response();
    }
    json(&MemberInfo {
        node_id: state.raft.metrics().borrow().id,
        api_addr: state.advertise_api.clone(),
    })
}

async fn ping(State(state): State<PeerState>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(refused) = check(&state, route::PING, &headers, &body).await {
        return refused.into_response();
    }
    let leader_contact = *state.leader_contact.lock();
    let metrics = state.raft.metrics();
    let metrics = metrics.borrow();
    let held = campaign::held(&metrics, leader_contact, state.leader_lease, Instant::now());
    json(&PingAnswer {
        node_id: metrics.id,
        held,
    })
}

async fn vote(State(state): State<PeerState>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(refused) = check(&state, route::VOTE, &headers, &body).await {
        return refused.into_response();
    }
    match parse(&body) {
        Ok(request) => json(&state.raft.vote(request).await),
        Err(refused) => refused.into_response(),
    }
}

async fn snapshot(State(state): State<PeerState>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(refused) = check(&state, route::SNAPSHOT, &headers, &body).await {
        return refused.into_response();
    }
    let Some((head_len, rest)) = body.split_first_chunk::<4>() else {
        return refuse(StatusCode::BAD_REQUEST, "invalid_peer_request", "no head");
    };
    let head_len = u32::from_le_bytes(*head_len) as usize;
    if head_len > rest.len() {
        return refuse(
            StatusCode::BAD_REQUEST,
            "invalid_peer_request",
            "short head",
        );
    }
    let (head, file) = rest.split_at(head_len);
    let head: SnapshotHead = match parse(head) {
        Ok(head) => head,
        Err(refused) => return refused.into_response(),
    };
    let incoming = match state.raft.begin_receiving_snapshot().await {
        Ok(incoming) => incoming,
        Err(error) => return refuse(StatusCode::SERVICE_UNAVAILABLE, "not_ready", error),
    };
    let written = tokio::task::spawn_blocking({
        let (path, file) = (incoming.path.clone(), body.slice(4 + head_len..));
        move || write_synced(&path, &file)
    })
    .await
    .unwrap_or_else(|panicked| Err(std::io::Error::other(panicked.to_string())));
    if let Err(error) = written {
        return refuse(
            StatusCode::INSUFFICIENT_STORAGE,
            "snapshot_not_written",
            error,
        );
    }
    let snapshot = openraft::Snapshot {
        meta: head.meta,
        snapshot: Box::new(SnapshotFile {
            path: incoming.path.clone(),
            len: file.len() as u64,
        }),
    };
    let installed = state.raft.install_full_snapshot(head.vote, snapshot).await;
    json(&installed)
}

/// Writes `bytes` to `path` and syncs it (blocking).
fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

async fn forward_request(
    State(state): State<PeerState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(refused) = check(&state, route::FORWARD, &headers, &body).await {
        return refused.into_response();
    }
    let Some(api) = state.api.get().cloned() else {
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "starting",
            "this member's API is not up yet",
        );
    };
    match forward::serve_forwarded(api, &body).await {
        Ok(response) => response,
        Err(error) => refuse(StatusCode::BAD_REQUEST, "invalid_peer_request", error),
    }
}
