//! `GET /healthz` and `GET /openapi.yaml`.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;
use tokio::time::Instant;

use super::AppState;
use crate::clock::{rfc3339, Clock};
use crate::ticker;

/// How many whole seconds the sweeper may trail the clock before the service reports itself
/// unhealthy: one tick in progress plus one of slack.
pub const MAX_LAG_S: u64 = 2;

/// 200 `{"status":"ok"}` while the ticker keeps up; 503 `{"status":"lagging","lag_s":n}` when it
/// has fallen behind (expiries are late), so a load balancer or orchestrator can react; 503
/// `{"status":"recovering"}` until the state is read back from the data directory. Once the
/// process has stalled, `stalls` tells how often, for how long in all, and the last one (a
/// stall is over when anyone can read this: it does not make the service unhealthy).
pub async fn healthz(State(state): State<AppState>) -> impl IntoResponse {
    if !state.is_ready() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "status": "recovering" })),
        );
    }
    // A cluster member's keys change only by committed entries: its sweeper's lag is not
    // measured (expiry through the log is the next step of issue 28).
    let lag_s = match state.cluster {
        Some(_) => 0,
        None => ticker::lag_s(&state.registry, Instant::now()),
    };
    let (status, mut body) = if lag_s <= MAX_LAG_S {
        (StatusCode::OK, json!({ "status": "ok" }))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({ "status": "lagging", "lag_s": lag_s }),
        )
    };
    if let Some(stalls) = stalls_json(state.registry.clock()) {
        body["stalls"] = stalls;
    }
    if state.auth.insecure {
        body["insecure_no_auth"] = json!(true);
    }
    (status, Json(body))
}

/// `{count, total_s, last: {began_at, seconds}}`, or nothing before the first stall.
fn stalls_json(clock: &Clock) -> Option<serde_json::Value> {
    let totals = clock.stalls();
    let last = totals.last?;
    Some(json!({
        "count": totals.count,
        "total_s": totals.total_ms as f64 / 1000.0,
        "last": {
            "began_at": rfc3339(clock.unix_ms_of_real(last.began_ms)),
            "seconds": last.length_ms as f64 / 1000.0,
        },
    }))
}

/// The OpenAPI document, compiled into the binary from the repository root.
pub const OPENAPI_YAML: &str = include_str!("../../openapi.yaml");

pub async fn openapi_yaml() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/yaml")], OPENAPI_YAML)
}
