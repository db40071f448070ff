//! `GET /v1/cluster` (the member's view of its cluster) and `GET /readyz` (whether a load
//! balancer should send this member traffic).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

use super::{ApiError, AppState};

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
