//! `GET /v1/services`: alive and recently expired counts per service.

use axum::extract::State;
use axum::Json;
use serde::Serialize;

use super::AppState;

#[derive(Debug, Serialize)]
pub struct ServiceEntry {
    service: String,
    alive: u64,
    expired: u64,
}

#[derive(Debug, Serialize)]
pub struct ServicesResponse {
    services: Vec<ServiceEntry>,
}

pub async fn services_list(State(state): State<AppState>) -> Json<ServicesResponse> {
    let services = state
        .registry
        .service_counts()
        .into_iter()
        .map(|counts| ServiceEntry {
            service: counts.service.as_str().to_owned(),
            alive: counts.alive,
            expired: counts.expired,
        })
        .collect();
    Json(ServicesResponse { services })
}
