//! `/v1/keys`: liveness lists, one key, deregistration, and Redis-style TTL control.

use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::time::Instant;

use super::auth::Caller;
use super::error::ApiError;
use super::extract::{parse_json, JsonBytes, KeyPath, QueryParams, Ready, BODY_LIMIT};
use super::{rfc3339, Rfc3339};
use crate::expiry::TimerKind;
use crate::registry::{
    ExpireAt, ExpireCondition, ExpireOutcome, ExpiredView, KeyState, KeyView, ListFilter, Logged,
    RegistryError,
};
use crate::types::{Key, ServiceName};

/// Page size when `limit` is not given.
pub const DEFAULT_PAGE: usize = 100;
/// Largest page.
pub const MAX_PAGE: usize = 1000;

/// A page size from the `limit` parameter: `DEFAULT_PAGE` when absent, else 1..=`MAX_PAGE`.
pub fn page_limit(limit: Option<usize>) -> Result<usize, ApiError> {
    let limit = limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::InvalidQuery(format!(
            "limit must be between 1 and {MAX_PAGE}"
        )));
    }
    Ok(limit)
}

#[derive(Debug, Default, Deserialize, PartialEq, Eq, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum ListState {
    /// Alive keys, held ones included.
    #[default]
    Alive,
    /// Only keys held by the mass-expiry guard.
    Held,
    Expired,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    service: Option<String>,
    prefix: Option<String>,
    #[serde(default)]
    state: ListState,
    limit: Option<usize>,
    cursor: Option<String>,
}

/// An alive key as listed and as `GET /v1/keys/{key}` returns it.
#[derive(Debug, Serialize)]
pub struct AliveKey {
    key: Key,
    service: Option<String>,
    meta: Option<Box<RawValue>>,
    /// `null` when the key has no TTL (after PERSIST); likewise the next three fields.
    ttl_ms: Option<u64>,
    expires_in_ms: Option<u64>,
    expires_at: Option<Rfc3339>,
    registered_at: Rfc3339,
    last_heartbeat_at: Rfc3339,
    timer: Option<TimerKind>,
    /// `alive`, or `held`: due, and held by the mass-expiry guard (not expired, no event; a
    /// heartbeat renews it as usual).
    state: &'static str,
}

impl From<KeyView> for AliveKey {
    fn from(view: KeyView) -> Self {
        Self {
            key: view.key,
            service: view.service.map(|name| name.as_str().to_owned()),
            meta: view.meta.map(|meta| meta.raw().to_owned()),
            ttl_ms: view.ttl_ms,
            expires_in_ms: view.expires_in_ms,
            expires_at: view.expires_at_ms.map(rfc3339),
            registered_at: rfc3339(view.registered_at_ms),
            last_heartbeat_at: rfc3339(view.last_heartbeat_at_ms),
            timer: view.timer,
            state: if view.held { "held" } else { "alive" },
        }
    }
}

/// A recently expired key.
#[derive(Debug, Serialize)]
pub struct ExpiredKey {
    key: Key,
    service: Option<String>,
    meta: Option<Box<RawValue>>,
    last_heartbeat_at: Rfc3339,
    expired_at: Rfc3339,
}

impl From<ExpiredView> for ExpiredKey {
    fn from(view: ExpiredView) -> Self {
        Self {
            key: view.key,
            service: view.service.map(|name| name.as_str().to_owned()),
            meta: view.meta.map(|meta| meta.raw().to_owned()),
            last_heartbeat_at: rfc3339(view.last_heartbeat_at_ms),
            expired_at: rfc3339(view.expired_at_ms),
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Listed {
    Alive(AliveKey),
    Expired(ExpiredKey),
}

#[derive(Debug, Serialize)]
pub struct ListResponse {
    keys: Vec<Listed>,
    next_cursor: Option<String>,
}

pub async fn keys_list(
    Ready(state): Ready,
    caller: Caller,
    QueryParams(params): QueryParams<ListParams>,
) -> Result<Json<ListResponse>, ApiError> {
    caller.check_list(params.prefix.as_deref(), params.service.as_deref())?;
    let limit = page_limit(params.limit)?;
    let service = match params.service.as_deref() {
        None => None,
        Some(raw) => match state.registry.service_id(&ServiceName::new(raw)?) {
            Some(id) => Some(id),
            // A service never seen has no keys: an empty page, not an error.
            None => {
                return Ok(Json(ListResponse {
                    keys: Vec::new(),
                    next_cursor: None,
                }))
            }
        },
    };
    let filter = ListFilter {
        service,
        prefix: params.prefix,
        after: params.cursor,
        held_only: params.state == ListState::Held,
    };
    let (keys, more): (Vec<Listed>, bool) = match params.state {
        ListState::Alive | ListState::Held => {
            let (page, more) = state.registry.list_alive(&filter, limit, Instant::now());
            (
                page.into_iter()
                    .map(|view| Listed::Alive(view.into()))
                    .collect(),
                more,
            )
        }
        ListState::Expired => {
            let (page, more) = state.registry.list_expired(&filter, limit);
            (
                page.into_iter()
                    .map(|view| Listed::Expired(view.into()))
                    .collect(),
                more,
            )
        }
    };
    let next_cursor = more
        .then(|| {
            keys.last().map(|last| match last {
                Listed::Alive(key) => key.key.to_string(),
                Listed::Expired(key) => key.key.to_string(),
            })
        })
        .flatten();
    Ok(Json(ListResponse { keys, next_cursor }))
}

pub async fn keys_get(
    Ready(state): Ready,
    caller: Caller,
    KeyPath(key): KeyPath,
) -> Result<Json<AliveKey>, ApiError> {
    let view = state.registry.get(&key, Instant::now());
    caller.check_read(key.as_str(), service_of(view.as_ref()))?;
    Ok(Json(view.ok_or(ApiError::KeyNotFound)?.into()))
}

/// The service of a key's view, for scope checks (`None`: missing, or without one).
fn service_of(view: Option<&KeyView>) -> Option<&str> {
    view.and_then(|view| view.service.as_ref().map(ServiceName::as_str))
}

/// The caller's right to `key`, checked against the key's current service (a lookup only when
/// a token is in play).
fn check_key(
    state: &super::AppState,
    caller: &Caller,
    key: &Key,
    check: impl Fn(&Caller, &str, Option<&str>) -> Result<(), ApiError>,
) -> Result<(), ApiError> {
    if caller.0.is_none() {
        return Ok(());
    }
    let view = state.registry.get(key, Instant::now());
    check(caller, key.as_str(), service_of(view.as_ref()))
}

pub async fn keys_delete(
    Ready(state): Ready,
    caller: Caller,
    KeyPath(key): KeyPath,
) -> Result<StatusCode, ApiError> {
    check_key(&state, &caller, &key, Caller::check_delete)?;
    let now = Instant::now();
    let deleted = match state.registry.delete(&key, now) {
        Err(RegistryError::NeedsLog) => match state.registry.deletion_for(&key, now) {
            Some(record) => {
                super::replicate::propose(&state, vec![record]).await?;
                true
            }
            None => false,
        },
        deleted => deleted?,
    };
    if deleted {
        state.durable(None).await?;
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::KeyNotFound)
    }
}

#[derive(Debug, Serialize)]
pub struct TtlResponse {
    /// Remaining ms, or -1 when the key has no TTL.
    ttl_ms: i64,
}

pub async fn ttl_get(
    Ready(state): Ready,
    caller: Caller,
    KeyPath(key): KeyPath,
) -> Result<Json<TtlResponse>, ApiError> {
    check_key(&state, &caller, &key, Caller::check_read)?;
    match state.registry.state(&key, Instant::now()) {
        KeyState::Missing => Err(ApiError::KeyNotFound),
        KeyState::Persistent => Ok(Json(TtlResponse { ttl_ms: -1 })),
        KeyState::ExpiresIn(ms) => Ok(Json(TtlResponse { ttl_ms: ms as i64 })),
    }
}

#[derive(Debug, Deserialize, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum Condition {
    Nx,
    Xx,
    Gt,
    Lt,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpireBody {
    ttl_ms: Option<i64>,
    at_ms: Option<i64>,
    condition: Option<Condition>,
}

#[derive(Debug, Serialize)]
pub struct ExpireResponse {
    applied: bool,
    deleted: bool,
    /// The TTL after the call (-1: none); absent when the key was deleted.
    #[serde(skip_serializing_if = "Option::is_none")]
    ttl_ms: Option<i64>,
}

pub async fn ttl_put(
    Ready(state): Ready,
    KeyPath(key): KeyPath,
    JsonBytes(body): JsonBytes<BODY_LIMIT>,
) -> Result<Json<ExpireResponse>, ApiError> {
    let body: ExpireBody = parse_json(&body)?;
    let at = match (body.ttl_ms, body.at_ms) {
        (Some(ttl_ms), None) => ExpireAt::In(ttl_ms),
        (None, Some(at_ms)) => ExpireAt::AtUnixMs(at_ms),
        _ => {
            return Err(ApiError::InvalidTtl(
                "give exactly one of ttl_ms or at_ms".into(),
            ))
        }
    };
    let condition = body.condition.map(|condition| match condition {
        Condition::Nx => ExpireCondition::Nx,
        Condition::Xx => ExpireCondition::Xx,
        Condition::Gt => ExpireCondition::Gt,
        Condition::Lt => ExpireCondition::Lt,
    });
    let now = Instant::now();
    let outcome = match state.registry.expire(&key, at, condition, now) {
        Err(RegistryError::NeedsLog) => {
            let logged = state.registry.expire_for(&key, at, condition, now)?;
            through_the_log(&state, logged).await?
        }
        outcome => outcome?,
    };
    let response = match outcome {
        ExpireOutcome::NotFound => return Err(ApiError::KeyNotFound),
        ExpireOutcome::NotApplied { ttl_ms } => ExpireResponse {
            applied: false,
            deleted: false,
            ttl_ms: Some(ttl_ms.map_or(-1, |ms| ms as i64)),
        },
        ExpireOutcome::Applied { ttl_ms } => ExpireResponse {
            applied: true,
            deleted: false,
            ttl_ms: Some(ttl_ms as i64),
        },
        ExpireOutcome::Deleted => ExpireResponse {
            applied: true,
            deleted: true,
            ttl_ms: None,
        },
    };
    if response.applied {
        state.durable(None).await?;
    }
    Ok(Json(response))
}

#[derive(Debug, Serialize)]
pub struct PersistResponse {
    applied: bool,
}

pub async fn ttl_delete(
    Ready(state): Ready,
    KeyPath(key): KeyPath,
) -> Result<Json<PersistResponse>, ApiError> {
    let now = Instant::now();
    let persisted = match state.registry.persist(&key, now) {
        Err(RegistryError::NeedsLog) => {
            through_the_log(&state, state.registry.persist_for(&key, now)).await?
        }
        persisted => persisted?,
    };
    let applied = persisted.ok_or(ApiError::KeyNotFound)?;
    if applied {
        state.durable(None).await?;
    }
    Ok(Json(PersistResponse { applied }))
}

/// A TTL change on a cluster member (the leader: followers forward these routes): its record,
/// if it changes anything, proposed and applied here before the answer, which is a single
/// node's (`Registry::expire_for`, `Registry::persist_for`). A change decided on a key that
/// was gone when it applied (its expiry, decided before, was committed first) changed nothing:
/// 404, as for a missing key.
async fn through_the_log<T>(state: &super::AppState, logged: Logged<T>) -> Result<T, ApiError> {
    match (logged.record, logged.guard) {
        (Some(record), Some(generation)) => {
            if !super::replicate::propose_if(state, record, generation).await? {
                return Err(ApiError::KeyNotFound);
            }
        }
        (Some(record), None) => {
            super::replicate::propose(state, vec![record]).await?;
        }
        (None, _) => {}
    }
    Ok(logged.answer)
}
