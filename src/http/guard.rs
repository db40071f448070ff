//! `GET /v1/guard`, `POST /v1/guard/engage`, `POST /v1/guard/release`: the mass-expiry guard's
//! state, and the operator's two levers (see `registry::guard`).

use std::sync::Arc;

use axum::Json;
use tokio::time::Instant;

use super::error::ApiError;
use super::extract::Ready;
use crate::registry::GuardStatus;

pub async fn guard_status(Ready(state): Ready) -> Json<GuardStatus> {
    Json(state.registry.guard_status(Instant::now()))
}

/// Holds due keys from now, for at most the maximum hold; engaging an engaged guard changes
/// nothing. 409 `guard_releasing` while held keys are being released.
pub async fn guard_engage(Ready(state): Ready) -> Result<Json<GuardStatus>, ApiError> {
    let status = state
        .registry
        .guard_engage(Instant::now())
        .map_err(|error| ApiError::GuardReleasing(error.to_string()))?;
    Ok(Json(status))
}

/// Ends the hold: every held key is released (expired) before the answer, which shows
/// `held: 0`; a release at the bounded rate under way (after the maximum hold) is hurried the
/// same way. A no-op when the guard is armed. The release is O(held keys) (a hold can be a
/// whole fleet), so it runs on the blocking pool, not on a worker that serves requests.
pub async fn guard_release(Ready(state): Ready) -> Result<Json<GuardStatus>, ApiError> {
    let registry = Arc::clone(&state.registry);
    let now = Instant::now();
    let status = tokio::task::spawn_blocking(move || registry.guard_release(now))
        .await
        .map_err(|error| ApiError::Internal(format!("the guard's release failed: {error}")))?;
    Ok(Json(status))
}
