//! The HTTP API (v1): heartbeats in, liveness lists and TTL control out.
//!
//! [`app`] builds the router from an [`AppState`]; tests drive it over a real socket. Each
//! resource has its own file; every error is an [`error::ApiError`]. Handlers never hold a
//! registry lock across an `.await`: each registry call is synchronous and short.

pub mod dashboard;
pub mod error;
pub mod events;
pub mod extract;
pub mod health;
pub mod heartbeats;
pub mod keys;
pub mod observe;
pub mod services;
pub mod webhooks;

use std::sync::Arc;

use axum::routing::{get, post};
use axum::Router;

pub use crate::clock::{rfc3339, Rfc3339};
use crate::metrics::Metrics;
use crate::notify::Notifier;
use crate::registry::Registry;
use crate::stream::EventHub;
use crate::types::Ttl;
use error::ApiError;

/// What every handler can reach, behind one `Arc`: axum clones the state for every request,
/// and one reference count is cheaper than one per field.
#[derive(Clone, Debug)]
pub struct AppState(Arc<Shared>);

impl AppState {
    pub fn new(shared: Shared) -> Self {
        Self(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// The state's fields.
#[derive(Debug)]
pub struct Shared {
    pub registry: Arc<Registry>,
    /// TTL of a heartbeat that names none (`--default-ttl`).
    pub default_ttl: Ttl,
    /// Webhook delivery, for its status and dead letters.
    pub notifier: Arc<Notifier>,
    /// Recent events, for the live stream.
    pub hub: Arc<EventHub>,
    pub metrics: Arc<Metrics>,
}

/// Every route the API serves, as `(path, methods)`: the router is built from the same paths,
/// and the contract test checks this table against `openapi.yaml`.
pub const ROUTES: &[(&str, &[&str])] = &[
    ("/v1/heartbeats", &["POST"]),
    ("/v1/heartbeats/batch", &["POST"]),
    ("/v1/keys", &["GET"]),
    ("/v1/keys/{key}", &["GET", "DELETE"]),
    ("/v1/keys/{key}/ttl", &["GET", "PUT", "DELETE"]),
    ("/v1/services", &["GET"]),
    ("/v1/webhooks", &["GET"]),
    ("/v1/webhooks/dead-letters", &["GET"]),
    ("/v1/webhooks/dead-letters/{id}/retry", &["POST"]),
    ("/healthz", &["GET"]),
    ("/openapi.yaml", &["GET"]),
    ("/v1/events", &["GET"]),
    ("/metrics", &["GET"]),
    ("/", &["GET"]),
];

/// The API router.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route(ROUTES[0].0, post(heartbeats::heartbeats_post))
        .route(ROUTES[1].0, post(heartbeats::heartbeats_batch))
        .route(ROUTES[2].0, get(keys::keys_list))
        .route(ROUTES[3].0, get(keys::keys_get).delete(keys::keys_delete))
        .route(
            ROUTES[4].0,
            get(keys::ttl_get)
                .put(keys::ttl_put)
                .delete(keys::ttl_delete),
        )
        .route(ROUTES[5].0, get(services::services_list))
        .route(ROUTES[6].0, get(webhooks::webhooks_status))
        .route(ROUTES[7].0, get(webhooks::dead_letters_list))
        .route(ROUTES[8].0, post(webhooks::dead_letter_retry))
        .route(ROUTES[9].0, get(health::healthz))
        .route(ROUTES[10].0, get(health::openapi_yaml))
        .route(ROUTES[11].0, get(events::events_stream))
        .route(ROUTES[12].0, get(observe::metrics_text))
        .route(ROUTES[13].0, get(dashboard::dashboard))
        .fallback(|| async { ApiError::RouteNotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(observe::RecordLayer(Arc::clone(&state.metrics)))
        .with_state(state)
}
