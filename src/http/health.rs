//! `GET /healthz` and `GET /openapi.yaml`.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;
use tokio::time::Instant;

use super::AppState;
use crate::ticker;

/// How many whole seconds the sweeper may trail the clock before the service reports itself
/// unhealthy: one tick in progress plus one of slack.
pub const MAX_LAG_S: u64 = 2;

/// 200 `{"status":"ok"}` while the ticker keeps up; 503 `{"status":"lagging","lag_s":n}` when it
/// has fallen behind (expiries are late), so a load balancer or orchestrator can react; 503
/// `{"status":"recovering"}` until the state is read back from the data directory.
pub async fn healthz(State(state): State<AppState>) -> impl IntoResponse {
    if !state.is_ready() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "recovering" })),
        );
    }
    let lag_s = ticker::lag_s(&state.registry, Instant::now());
    if lag_s <= MAX_LAG_S {
        (StatusCode::OK, Json(json!({ "status": "ok" })))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "lagging", "lag_s": lag_s })),
        )
    }
}

/// The OpenAPI document, compiled into the binary from the repository root.
pub const OPENAPI_YAML: &str = include_str!("../../openapi.yaml");

pub async fn openapi_yaml() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/yaml")], OPENAPI_YAML)
}
