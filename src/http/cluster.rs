//! `GET /v1/cluster` (the member's view of its cluster), the membership routes (add a
//! learner, promote it, remove a member: admin only, served by the leader), a snapshot on
//! demand (admin, served by the member asked), and `GET /readyz` (whether a load balancer
//! should send this member traffic).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

use super::extract::{parse_json, JsonBytes, PathParam};
use super::{ApiError, AppState};
use crate::cluster::membership::{MembershipError, NewMember};
use crate::cluster::node::Cluster;

/// The largest body `POST /v1/cluster/members` reads.
const MEMBER_BODY_LIMIT: usize = 4 * 1024;

impl From<MembershipError> for ApiError {
    fn from(error: MembershipError) -> Self {
        let message = error.to_string();
        match error {
            MembershipError::Invalid(_) => Self::InvalidJson(message),
            MembershipError::NoSuchMember(_) => Self::NoSuchMember(message),
            MembershipError::Conflict(_) => Self::MembershipConflict(message),
            MembershipError::NotCaughtUp { .. } => Self::NotCaughtUp(message),
            MembershipError::Changing => Self::MembershipChanging(message),
            MembershipError::NotLeader(_) => Self::NoLeader(message),
            MembershipError::NoQuorum(_) => Self::NoQuorum(message),
            MembershipError::Stopped(_) => Self::Internal(message),
        }
    }
}

fn member_of(state: &AppState) -> Result<&Cluster, ApiError> {
    state.cluster.as_deref().ok_or(ApiError::NotACluster)
}

fn member_id(raw: &str) -> Result<u64, ApiError> {
    raw.parse::<u64>()
        .ok()
        .filter(|&id| id > 0)
        .ok_or_else(|| ApiError::InvalidPath(format!("{raw:?} is not a member id (1 or more)")))
}

/// `POST /v1/cluster/members`: adds a learner; the cluster as it is then.
pub async fn member_add(
    State(state): State<AppState>,
    JsonBytes(body): JsonBytes<MEMBER_BODY_LIMIT>,
) -> Result<impl IntoResponse, ApiError> {
    let member: NewMember = parse_json(&body)?;
    let cluster = member_of(&state)?;
    cluster.add_learner(member).await?;
    Ok(Json(cluster.status()))
}

/// `POST /v1/cluster/members/{id}/promote`: makes a caught-up learner a voter.
pub async fn member_promote(
    State(state): State<AppState>,
    PathParam(id): PathParam,
) -> Result<impl IntoResponse, ApiError> {
    let id = member_id(&id)?;
    let cluster = member_of(&state)?;
    cluster.promote_member(id).await?;
    Ok(Json(cluster.status()))
}

/// `DELETE /v1/cluster/members/{id}`: removes a member, voter or learner.
pub async fn member_remove(
    State(state): State<AppState>,
    PathParam(id): PathParam,
) -> Result<impl IntoResponse, ApiError> {
    let id = member_id(&id)?;
    let cluster = member_of(&state)?;
    cluster.remove_member(id).await?;
    Ok(Json(cluster.status()))
}

/// `POST /v1/cluster/snapshot`: this member (not the leader: each member snapshots its own
/// state) takes a snapshot of what it applied and drops the log behind it (all but the entries
/// kept for a follower a little behind). Answers once it is written.
pub async fn snapshot_take(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let cluster = member_of(&state)?;
    let snapshot = cluster.take_snapshot().await.map_err(|pending| {
        ApiError::StorageUnavailable(format!(
            "the snapshot was not written within {pending:?}; it may still be"
        ))
    })?;
    Ok(Json(json!({ "snapshot_index": snapshot })))
}

/// The member's view: its role, the leader, term, indexes and every member. A single node has
/// none: 404 `not_a_cluster`.
pub async fn cluster_status(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let cluster = state.cluster.as_ref().ok_or(ApiError::NotACluster)?;
    Ok(Json(cluster.status()))
}

/// 200 `{"ready":true}` when this member should take traffic; 503 with the reason otherwise. A
/// single node: once recovered from its data directory. A cluster member: when it is in a
/// quorum (the leader heard from one recently; a follower from the leader) and has applied
/// everything it knows committed.
pub async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    let verdict = match &state.cluster {
        None if state.is_ready() => Ok(()),
        None => Err("recovering".to_owned()),
        Some(cluster) => cluster.readiness(),
    };
    match verdict {
        Ok(()) => (StatusCode::OK, Json(json!({ "ready": true }))),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "ready": false, "reason": reason })),
        ),
    }
}
