//! `POST /v1/heartbeats` and `POST /v1/heartbeats/batch`: register or renew keys.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::time::Instant;

use super::auth::Caller;
use super::error::ApiError;
use super::extract::{
    parse_json, JsonBytes, QueryParams, Ready, ReturnMinimal, BATCH_BODY_LIMIT, BODY_LIMIT,
};
use super::{replicate, rfc3339, AppState, Rfc3339};
use crate::expiry::TimerKind;
use crate::persist::record::Record;
use crate::registry::{Heartbeat, HeartbeatOutcome, RegistryError};
use crate::types::{Key, Meta, ServiceName, Ttl};

/// Most heartbeats in one batch.
pub const MAX_BATCH: usize = 1000;

/// On a serving runtime (no bulk threads: `--serving shared`, embeddings, tests, small bodies)
/// a batch is applied this many items at a time, yielding to the runtime's other tasks between
/// chunks: a serving thread is one event loop (`placement`), and a whole batch of 1,000
/// creations holds it for ~1-2 ms, so a single heartbeat on the same thread waited behind every
/// batch queued before it (issue 27: p99 37 ms, max 71 ms during a 1M-key registration). 64
/// items are ~0.1 ms of work; a yield costs well under a microsecond. On a bulk thread too, a
/// batch is parsed and applied a chunk at a time: the chunk's keys are read into the cache
/// before its items are applied (`apply_items`), and 64 keys' memory (~16 KiB) stays there.
const BATCH_CHUNK: usize = 64;

/// A batch body larger than this is applied on a bulk thread (`bulk`), when there are any: a
/// smaller one (up to ~100 items) costs the serving thread less than the hand-over's two
/// thread wake-ups would cost the request.
const INLINE_BATCH_BYTES: usize = 8 * 1024;

/// A heartbeat as sent. Unknown fields are refused so that typos (`"ttl"`) surface.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HeartbeatBody<'a> {
    #[serde(borrow)]
    key: std::borrow::Cow<'a, str>,
    ttl_s: Option<serde_json::Number>,
    ttl_ms: Option<serde_json::Number>,
    #[serde(borrow)]
    service: Option<std::borrow::Cow<'a, str>>,
    meta: Option<serde_json::Value>,
}

/// What a heartbeat answers.
#[derive(Debug, Serialize)]
pub struct HeartbeatResponse {
    key: Key,
    service: Option<String>,
    created: bool,
    ttl_ms: u64,
    expires_in_ms: u64,
    expires_at: Rfc3339,
    timer: TimerKind,
}

/// With `Prefer: return=minimal`, an accepted heartbeat is answered `204 No Content` with
/// `Preference-Applied: return=minimal` and no body: the cheapest answer, for clients that only
/// need to know it was taken.
pub async fn heartbeats_post(
    Ready(state): Ready,
    caller: Caller,
    ReturnMinimal(minimal): ReturnMinimal,
    JsonBytes(body): JsonBytes<BODY_LIMIT>,
) -> Result<Response, ApiError> {
    let body: HeartbeatBody<'_> = parse_json(&body)?;
    let now = Instant::now();
    let outcome = match apply(&state, &caller, body, now)? {
        Step::Done(outcome) => outcome,
        Step::Log(heartbeat, record) => {
            let written = replicate::propose(&state, vec![*record]).await?;
            (state.registry).outcome_after_log(heartbeat, written.created(0), now)
        }
    };
    replicate::fence(&state)?;
    state.durable(Some(outcome.lsn)).await?;
    Ok(if minimal {
        (
            StatusCode::NO_CONTENT,
            [("preference-applied", "return=minimal")],
        )
            .into_response()
    } else {
        Json(respond(outcome)).into_response()
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchBody<'a> {
    #[serde(borrow)]
    heartbeats: Vec<&'a RawValue>,
}

/// One result of a batch: the heartbeat's answer or its error.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum BatchItem {
    Ok(HeartbeatResponse),
    Err(serde_json::Value),
}

#[derive(Debug, Serialize)]
pub struct BatchResponse {
    results: Vec<BatchItem>,
}

/// `?results=`: every item's answer (`all`, the default), or only the failures (`errors`),
/// which spares building and sending an answer per accepted heartbeat.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchQuery {
    #[serde(default)]
    results: ResultsMode,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ResultsMode {
    #[default]
    All,
    Errors,
}

/// The answer to `?results=errors`: counts, and each failed item by its position.
#[derive(Debug, Serialize)]
pub struct BatchErrorsResponse {
    accepted: usize,
    failed: usize,
    errors: Vec<BatchError>,
}

#[derive(Debug, Serialize)]
struct BatchError {
    index: usize,
    error: serde_json::Value,
}

pub async fn heartbeats_batch(
    Ready(state): Ready,
    caller: Caller,
    QueryParams(query): QueryParams<BatchQuery>,
    JsonBytes(body): JsonBytes<BATCH_BODY_LIMIT>,
) -> Result<Response, ApiError> {
    // Every item at the instant the batch arrived: a batch is one client's heartbeats of one
    // moment, so its keys' deadlines stay together however long a loaded machine takes to apply
    // it (spread over a second boundary, they split the expiry guard's count: a partition then
    // expired the first share before the guard tripped). The registry never moves a renewal's
    // deadline back (`Shard::heartbeat`), so a batch applied after a newer heartbeat of the
    // same key shortens nothing; a deadline the sweeper has passed meanwhile is due at once.
    let now = Instant::now();
    let steps = match &state.bulk {
        Some(bulk) if body.len() > INLINE_BATCH_BYTES => {
            let (state, caller) = (state.clone(), caller.clone());
            let applied = bulk
                .run(move || apply_batch(&state, &caller, &body, now))
                .await;
            applied.unwrap_or_else(|| Err(ApiError::Internal("the server is stopping".into())))?
        }
        _ => {
            let batch = parse_batch(&body)?;
            in_chunks(&batch.heartbeats, |items| {
                apply_items(&state, &caller, items, now)
            })
            .await
        }
    };
    let outcomes = through_the_log(&state, steps).await;
    replicate::fence(&state)?;
    // One wait for the whole batch: its last record's sync covers every earlier one.
    let last_lsn = outcomes
        .iter()
        .filter_map(|outcome| outcome.as_ref().ok().map(|outcome| outcome.lsn))
        .max()
        .unwrap_or(0);
    state.durable(Some(last_lsn)).await?;
    let outcomes = outcomes.into_iter();
    Ok(match query.results {
        ResultsMode::All => {
            let results = outcomes
                .map(|outcome| match outcome {
                    Ok(outcome) => BatchItem::Ok(respond(outcome)),
                    Err(error) => BatchItem::Err(error.body()),
                })
                .collect();
            Json(BatchResponse { results }).into_response()
        }
        ResultsMode::Errors => {
            let mut answer = BatchErrorsResponse {
                accepted: 0,
                failed: 0,
                errors: Vec::new(),
            };
            for (index, outcome) in outcomes.enumerate() {
                match outcome {
                    Ok(_) => answer.accepted += 1,
                    Err(error) => answer.errors.push(BatchError {
                        index,
                        error: error.detail(),
                    }),
                }
            }
            answer.failed = answer.errors.len();
            Json(answer).into_response()
        }
    })
}

/// A batch body, parsed; refused if it holds more than [`MAX_BATCH`] heartbeats.
fn parse_batch(body: &[u8]) -> Result<BatchBody<'_>, ApiError> {
    let batch: BatchBody<'_> = parse_json(body)?;
    if batch.heartbeats.len() > MAX_BATCH {
        return Err(ApiError::BatchTooLarge {
            max: MAX_BATCH,
            got: batch.heartbeats.len(),
        });
    }
    Ok(batch)
}

/// Items of a batch, parsed, their keys' memory read into the cache (`Registry::warm`: the
/// keys of a large registry are mostly not in the cache, and one by one each renewal waits for
/// its own reads), then applied at `now` one by one, in order.
fn apply_items(
    state: &AppState,
    caller: &Caller,
    items: &[&RawValue],
    now: Instant,
) -> Vec<Result<Step, ApiError>> {
    let bodies: Vec<_> = (items.iter())
        .map(|item| parse_json::<HeartbeatBody<'_>>(item.get().as_bytes()))
        .collect();
    let keys = bodies
        .iter()
        .filter_map(|body| Some(&*body.as_ref().ok()?.key));
    state.registry.warm(keys);
    (bodies.into_iter())
        .map(|body| body.and_then(|body| apply(state, caller, body, now)))
        .collect()
}

/// A whole batch, parsed and applied at `now` without yielding (a bulk thread's job: the
/// kernel, not the event loop, shares the core), [`BATCH_CHUNK`] items at a time.
fn apply_batch(
    state: &AppState,
    caller: &Caller,
    body: &[u8],
    now: Instant,
) -> Result<Vec<Result<Step, ApiError>>, ApiError> {
    let batch = parse_batch(body)?;
    Ok((batch.heartbeats.chunks(BATCH_CHUNK))
        .flat_map(|items| apply_items(state, caller, items, now))
        .collect())
}

/// The items of a batch that need the log (cluster mode) proposed as one entry; every item's
/// outcome. A proposal that fails fails each of its items with its error.
async fn through_the_log(
    state: &AppState,
    steps: Vec<Result<Step, ApiError>>,
) -> Vec<Result<HeartbeatOutcome, ApiError>> {
    let records: Vec<_> = steps
        .iter()
        .filter_map(|step| match step {
            Ok(Step::Log(_, record)) => Some(Record::clone(record)),
            _ => None,
        })
        .collect();
    let proposed = match records.is_empty() {
        true => Ok(None),
        false => replicate::propose(state, records).await.map(Some),
    };
    let now = Instant::now();
    let mut logged = 0..;
    steps
        .into_iter()
        .map(|step| match step? {
            Step::Done(outcome) => Ok(outcome),
            Step::Log(heartbeat, _) => {
                let i = logged.next().expect("unbounded");
                match &proposed {
                    Ok(written) => {
                        let created = written.as_ref().is_some_and(|w| w.created(i));
                        Ok(state.registry.outcome_after_log(heartbeat, created, now))
                    }
                    Err(error) => Err(error.clone()),
                }
            }
        })
        .collect()
}

/// `apply(chunk)` for each chunk of [`BATCH_CHUNK`] items in order, yielding between chunks.
async fn in_chunks<T, R>(items: &[T], mut apply: impl FnMut(&[T]) -> Vec<R>) -> Vec<R> {
    let mut outcomes = Vec::with_capacity(items.len());
    for (i, chunk) in items.chunks(BATCH_CHUNK).enumerate() {
        if i > 0 {
            tokio::task::yield_now().await;
        }
        outcomes.extend(apply(chunk));
    }
    outcomes
}

/// What became of one heartbeat.
enum Step {
    /// Applied: what happened (the outcome carries the key).
    Done(HeartbeatOutcome),
    /// A cluster member's change: the record to propose. Whether it creates the key is
    /// known only once applied (`Written::created`).
    Log(Heartbeat, Box<Record>),
}

/// Validates one heartbeat, checks the caller may send it (a batch item outside the token's
/// scope gets its own 403), and hands it to the registry; in a cluster, a heartbeat that
/// changes more than the deadline comes back as the record to propose.
fn apply(
    state: &AppState,
    caller: &Caller,
    body: HeartbeatBody<'_>,
    now: Instant,
) -> Result<Step, ApiError> {
    let key = Key::new(&body.key)?;
    let ttl = match (body.ttl_s, body.ttl_ms) {
        (Some(_), Some(_)) => {
            return Err(ApiError::InvalidTtl(
                "give ttl_s or ttl_ms, not both".into(),
            ))
        }
        (Some(seconds), None) => Ttl::from_secs(whole_number(&seconds, "ttl_s")?)?,
        (None, Some(millis)) => Ttl::from_millis(whole_number(&millis, "ttl_ms")?)?,
        (None, None) => state.default_ttl,
    };
    let service = body.service.as_deref().map(ServiceName::new).transpose()?;
    caller.check_heartbeat(key.as_str(), service.as_ref().map(ServiceName::as_str))?;
    let meta = body.meta.as_ref().map(Meta::from_value).transpose()?;
    let heartbeat = Heartbeat {
        key,
        ttl,
        service,
        meta,
    };
    if state.cluster.is_none() {
        // A single node: no copy of the heartbeat on the hot path.
        return Ok(Step::Done(state.registry.heartbeat(heartbeat, now)?));
    }
    match state.registry.heartbeat(heartbeat.clone(), now) {
        Ok(outcome) => Ok(Step::Done(outcome)),
        Err(RegistryError::NeedsLog) => {
            let record = state.registry.upsert_for(&heartbeat, now);
            Ok(Step::Log(heartbeat, Box::new(record)))
        }
        Err(error) => Err(error.into()),
    }
}

/// The answer to one accepted heartbeat.
fn respond(outcome: HeartbeatOutcome) -> HeartbeatResponse {
    HeartbeatResponse {
        key: outcome.key,
        service: outcome.service.map(|name| name.as_str().to_owned()),
        created: outcome.created,
        ttl_ms: outcome.ttl_ms,
        expires_in_ms: outcome.expires_in_ms,
        expires_at: rfc3339(outcome.expires_at_ms),
        timer: outcome.timer,
    }
}

/// A TTL field: a non-negative integer (range is checked by `Ttl`).
fn whole_number(number: &serde_json::Number, field: &str) -> Result<u64, ApiError> {
    match number.as_u64() {
        Some(value) => Ok(value),
        None if number.as_i64().is_some() => Ok(0), // negative: out of range, refused by `Ttl`
        None => Err(ApiError::InvalidTtl(format!("{field} must be an integer"))),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    use super::*;

    /// The serving thread gets a turn after every chunk: the batch's future is pending (it
    /// yielded) exactly between chunks, with every item applied once, in order.
    #[test]
    fn a_batch_yields_to_other_requests_between_chunks() {
        let items: Vec<usize> = (0..MAX_BATCH).collect();
        let applied = Cell::new(0);
        let mut batch = std::pin::pin!(in_chunks(&items, |chunk| {
            let apply = |&item: &usize| {
                assert_eq!(item, applied.get(), "in order");
                applied.set(item + 1);
                item
            };
            chunk.iter().map(apply).collect()
        }));
        let mut context = Context::from_waker(Waker::noop());
        let mut paused_after = Vec::new();
        let outcomes = loop {
            match batch.as_mut().poll(&mut context) {
                Poll::Pending => paused_after.push(applied.get()),
                Poll::Ready(outcomes) => break outcomes,
            }
        };
        assert_eq!(outcomes, items);
        let chunk_ends: Vec<usize> = (1..MAX_BATCH.div_ceil(BATCH_CHUNK))
            .map(|n| n * BATCH_CHUNK)
            .collect();
        assert_eq!(paused_after, chunk_ends);
    }
}
