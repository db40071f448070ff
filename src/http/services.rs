//! `GET /v1/services`: alive and recently expired counts per service, for the keys without a
//! service, and in total.

use axum::Json;
use serde::Serialize;

use super::extract::Ready;

#[derive(Debug, Serialize)]
pub struct ServiceEntry {
    service: String,
    alive: u64,
    expired: u64,
}

#[derive(Debug, Serialize)]
pub struct Counts {
    alive: u64,
    expired: u64,
}

#[derive(Debug, Serialize)]
pub struct ServicesResponse {
    services: Vec<ServiceEntry>,
    /// Keys registered without a service: in no service's counts.
    without_service: Counts,
    /// Every key: the services' counts plus `without_service`.
    total: Counts,
    /// `--max-keys`: past it, creations are refused.
    max_keys: u64,
}

pub async fn services_list(Ready(state): Ready) -> Json<ServicesResponse> {
    let overview = state.registry.service_counts();
    let unassigned = overview.without_service;
    let total = overview.services.iter().fold(
        Counts {
            alive: unassigned.alive,
            expired: unassigned.expired,
        },
        |total, counts| Counts {
            alive: total.alive + counts.alive,
            expired: total.expired + counts.expired,
        },
    );
    let services = overview
        .services
        .into_iter()
        .map(|counts| ServiceEntry {
            service: counts.service.as_str().to_owned(),
            alive: counts.alive,
            expired: counts.expired,
        })
        .collect();
    Json(ServicesResponse {
        services,
        without_service: Counts {
            alive: unassigned.alive,
            expired: unassigned.expired,
        },
        total,
        max_keys: state.registry.config().max_keys,
    })
}
