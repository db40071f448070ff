//! `GET /v1/guard`, `POST /v1/guard/engage`, `POST /v1/guard/release`: the mass-expiry guard's
//! state, and the operator's two levers (see `registry::guard`).

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

/// Ends the hold: held keys are released (expired) at the bounded rate. A no-op when the guard
/// is not engaged.
pub async fn guard_release(Ready(state): Ready) -> Json<GuardStatus> {
    Json(state.registry.guard_release(Instant::now()))
}
