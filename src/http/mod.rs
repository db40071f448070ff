//! The HTTP API (v1): heartbeats in, liveness lists and TTL control out.
//!
//! [`app`] builds the router from an [`AppState`]; tests drive it over a real socket. Each
//! resource has its own file; every error is an [`error::ApiError`]. Handlers never hold a
//! registry lock across an `.await`: each registry call is synchronous and short.

pub mod auth;
pub mod cluster;
pub mod dashboard;
pub mod error;
pub mod events;
pub mod extract;
pub mod gate;
pub mod guard;
pub mod health;
pub mod heartbeats;
pub mod keys;
pub mod observe;
pub mod replicate;
pub mod services;
pub mod webhooks;

use std::sync::Arc;

use axum::routing::{delete, get, post};
use axum::Router;

pub use crate::clock::{rfc3339, Rfc3339};
use crate::metrics::Metrics;
use crate::notify::Notifier;
use crate::registry::Registry;
use crate::routes;
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

impl AppState {
    /// With `--fsync always`, waits until the log records of the change just made are on disk
    /// (`lsn`: the change's last record; `None`: everything appended so far, which includes
    /// it). Answers `storage_unavailable` if the log cannot be written meanwhile: the change
    /// is then not acknowledged. Other modes acknowledge at once.
    pub async fn durable(&self, lsn: Option<u64>) -> Result<(), ApiError> {
        if !self.fsync_always {
            return Ok(());
        }
        let Some(journal) = self.registry.journal() else {
            return Ok(());
        };
        let lsn = lsn.unwrap_or_else(|| journal.appended());
        if lsn == 0 {
            return Ok(());
        }
        loop {
            let synced = tokio::time::timeout(DURABLE_POLL, journal.durable(lsn)).await;
            if synced.is_ok() {
                return Ok(());
            }
            if journal.is_failing() {
                return Err(crate::registry::RegistryError::StorageUnavailable.into());
            }
        }
    }

    /// Whether recovery has finished (always, without a data directory).
    pub fn is_ready(&self) -> bool {
        self.ready.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// How often a request waiting for its sync checks whether the log has started failing.
const DURABLE_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// The state's fields.
#[derive(Debug)]
pub struct Shared {
    pub registry: Arc<Registry>,
    /// Set once recovery from the data directory has finished: until then the registry routes
    /// answer 503 `recovering`.
    pub ready: Arc<std::sync::atomic::AtomicBool>,
    /// `--fsync always`: changes are answered once their log records are on disk.
    pub fsync_always: bool,
    /// TTL of a heartbeat that names none (`--default-ttl`).
    pub default_ttl: Ttl,
    /// Webhook delivery, for its status and dead letters.
    pub notifier: Arc<Notifier>,
    /// Recent events, for the live stream.
    pub hub: Arc<EventHub>,
    pub metrics: Arc<Metrics>,
    /// `--request-timeout`: a request not answered within it gets 408.
    pub request_timeout: std::time::Duration,
    /// `--max-stream-clients`.
    pub max_stream_clients: usize,
    /// Tokens and sessions (auth is off without `--auth-tokens`).
    pub auth: auth::AuthState,
    /// This member of a cluster; `None`: a single node.
    pub cluster: Option<Arc<crate::cluster::node::Cluster>>,
    /// Where large batches are applied (`placement`); `None`: on the serving runtime.
    pub bulk: Option<Arc<crate::bulk::Bulk>>,
}

/// The API router.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route(routes::HEARTBEATS.path, post(heartbeats::heartbeats_post))
        .route(
            routes::HEARTBEATS_BATCH.path,
            post(heartbeats::heartbeats_batch),
        )
        .route(routes::KEYS.path, get(keys::keys_list))
        .route(
            routes::KEY.path,
            get(keys::keys_get).delete(keys::keys_delete),
        )
        .route(
            routes::KEY_TTL.path,
            get(keys::ttl_get)
                .put(keys::ttl_put)
                .delete(keys::ttl_delete),
        )
        .route(routes::SERVICES.path, get(services::services_list))
        .route(routes::WEBHOOKS.path, get(webhooks::webhooks_status))
        .route(routes::DEAD_LETTERS.path, get(webhooks::dead_letters_list))
        .route(
            routes::DEAD_LETTER_RETRY.path,
            post(webhooks::dead_letter_retry),
        )
        .route(routes::GUARD.path, get(guard::guard_status))
        .route(routes::GUARD_ENGAGE.path, post(guard::guard_engage))
        .route(routes::GUARD_RELEASE.path, post(guard::guard_release))
        .route(
            routes::SESSION.path,
            post(auth::session_create).delete(auth::session_end),
        )
        .route(routes::HEALTHZ.path, get(health::healthz))
        .route(routes::READYZ.path, get(cluster::readyz))
        .route(routes::CLUSTER.path, get(cluster::cluster_status))
        .route(routes::CLUSTER_MEMBERS.path, post(cluster::member_add))
        .route(routes::CLUSTER_MEMBER.path, delete(cluster::member_remove))
        .route(routes::CLUSTER_SNAPSHOT.path, post(cluster::snapshot_take))
        .route(
            routes::CLUSTER_MEMBER_PROMOTE.path,
            post(cluster::member_promote),
        )
        .route(routes::OPENAPI.path, get(health::openapi_yaml))
        .route(routes::EVENTS.path, get(events::events_stream))
        .route(routes::METRICS.path, get(observe::metrics_text))
        .route(routes::DASHBOARD.path, get(dashboard::dashboard))
        .fallback(route_not_found)
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(gate::GateLayer(state.clone()))
        .layer(observe::RecordLayer(Arc::clone(&state.metrics)))
        .with_state(state)
}

/// The answer to a path no route matches. A key path with more segments than a route has is
/// most likely a key with an unencoded `/`, so that answer says how to send it.
async fn route_not_found(uri: axum::http::Uri) -> ApiError {
    let unencoded_key = uri.path().strip_prefix("/v1/keys/").and_then(|rest| {
        let (key, route) = rest
            .strip_suffix("/ttl")
            .map_or((rest, ""), |key| (key, "/ttl"));
        key.contains('/').then(|| (key.replace('/', "%2F"), route))
    });
    ApiError::RouteNotFound(match unencoded_key {
        Some((encoded, route)) => format!(
            "no such route: a key containing `/` must be percent-encoded in the path, `/` as \
             `%2F` (e.g. /v1/keys/{encoded}{route})"
        ),
        None => "no such route".to_owned(),
    })
}
