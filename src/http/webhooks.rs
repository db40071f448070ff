//! `/v1/webhooks`: delivery status per URL, dead letters, and their re-sending.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::time::Instant;

use super::error::ApiError;
use super::extract::{PathParam, QueryParams};
use super::keys::page_limit;
use super::{rfc3339, AppState, Rfc3339};
use crate::notify::dead_letters::DeadLetter;
use crate::notify::endpoint::EndpointStatus;
use crate::notify::{Notifier, RetryError};

#[derive(Debug, Serialize)]
pub struct WebhooksResponse {
    webhooks: Vec<WebhookView>,
    events: Vec<&'static str>,
    signed: bool,
    timeout_ms: u64,
    concurrency: usize,
    batch_max: usize,
    max_attempts: u32,
    retry_schedule_ms: Vec<u64>,
    queue_max: usize,
    dead_letters: DeadLetterCounts,
}

#[derive(Debug, Serialize)]
struct WebhookView {
    url: String,
    /// `active`; `paused` while the receiver fails (one probe at a time); `gone` after a 410.
    state: &'static str,
    /// Until the next probe of a paused URL.
    paused_for_ms: Option<u64>,
    consecutive_failures: u32,
    delivered: u64,
    /// Requests that carried the delivered events (fewer with `--webhook-batch-max` above 1).
    delivered_requests: u64,
    failed: u64,
    failed_attempts: u64,
    pending: usize,
    in_flight: usize,
    dropped: Dropped,
    oldest_pending_age_ms: Option<u64>,
    last_error: Option<LastErrorView>,
    last_delivered_at: Option<Rfc3339>,
}

#[derive(Debug, Serialize)]
struct Dropped {
    queue_full: u64,
    gone: u64,
}

#[derive(Debug, Serialize)]
struct LastErrorView {
    at: Rfc3339,
    event_id: String,
    message: String,
}

#[derive(Debug, Serialize)]
struct DeadLetterCounts {
    count: usize,
    max: usize,
    dropped: u64,
}

impl From<EndpointStatus> for WebhookView {
    fn from(status: EndpointStatus) -> Self {
        Self {
            url: status.url,
            state: match (status.gone, status.paused) {
                (true, _) => "gone",
                (false, true) => "paused",
                (false, false) => "active",
            },
            paused_for_ms: status.paused_for_ms,
            consecutive_failures: status.consecutive_failures,
            delivered: status.counters.delivered,
            delivered_requests: status.counters.requests,
            failed: status.counters.failed,
            failed_attempts: status.counters.failed_attempts,
            pending: status.pending,
            in_flight: status.in_flight,
            dropped: Dropped {
                queue_full: status.counters.dropped_queue_full,
                gone: status.counters.dropped_gone,
            },
            oldest_pending_age_ms: status.oldest_pending_age_ms,
            last_error: status.last_error.map(|error| LastErrorView {
                at: rfc3339(error.at_ms),
                event_id: error.event_id.into(),
                message: error.message,
            }),
            last_delivered_at: status.last_delivered_at_ms.map(rfc3339),
        }
    }
}

/// `GET /v1/webhooks`
pub async fn webhooks_status(State(state): State<AppState>) -> Json<WebhooksResponse> {
    let notifier = &state.notifier;
    let settings = notifier.settings();
    let page = notifier.dead_letters().page(None, 0);
    Json(WebhooksResponse {
        webhooks: notifier
            .status(Instant::now())
            .into_iter()
            .map(WebhookView::from)
            .collect(),
        events: settings
            .events
            .iter()
            .map(|&kind| kind.stream_name())
            .collect(),
        signed: settings.secret.is_some(),
        timeout_ms: settings.timeout.as_millis() as u64,
        concurrency: settings.concurrency,
        batch_max: settings.batch_max,
        max_attempts: settings.max_attempts,
        retry_schedule_ms: settings
            .retry_schedule
            .iter()
            .map(|wait| wait.as_millis() as u64)
            .collect(),
        queue_max: settings.queue_max,
        dead_letters: DeadLetterCounts {
            count: page.count,
            max: notifier.dead_letters().max(),
            dropped: page.dropped,
        },
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterParams {
    limit: Option<usize>,
    cursor: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct DeadLettersResponse {
    dead_letters: Vec<DeadLetterView>,
    next_cursor: Option<u64>,
    count: usize,
    max: usize,
    dropped: u64,
}

#[derive(Debug, Serialize)]
struct DeadLetterView {
    id: u64,
    url: String,
    event_id: String,
    r#type: &'static str,
    key: String,
    attempts: u32,
    last_error: String,
    failed_at: Rfc3339,
    /// The webhook body that was (to be) sent.
    payload: Value,
}

fn dead_letter_view(notifier: &Notifier, letter: &DeadLetter) -> DeadLetterView {
    DeadLetterView {
        id: letter.id,
        url: notifier.shown_url(letter.endpoint).to_owned(),
        event_id: letter.message.id.to_string(),
        r#type: letter.message.event.kind.type_name(),
        key: letter.message.event.key.as_str().to_owned(),
        attempts: letter.attempts,
        last_error: letter.last_error.clone(),
        failed_at: rfc3339(letter.failed_at_ms),
        payload: serde_json::to_value(letter.message.payload()).unwrap_or(Value::Null),
    }
}

/// `GET /v1/webhooks/dead-letters`: oldest first, paged by id.
pub async fn dead_letters_list(
    State(state): State<AppState>,
    QueryParams(params): QueryParams<DeadLetterParams>,
) -> Result<Json<DeadLettersResponse>, ApiError> {
    let limit = page_limit(params.limit)?;
    let notifier = &state.notifier;
    let page = notifier.dead_letters().page(params.cursor, limit);
    Ok(Json(DeadLettersResponse {
        dead_letters: page
            .letters
            .iter()
            .map(|letter| dead_letter_view(notifier, letter))
            .collect(),
        next_cursor: page.next_cursor,
        count: page.count,
        max: notifier.dead_letters().max(),
        dropped: page.dropped,
    }))
}

#[derive(Debug, Serialize)]
pub struct RetryResponse {
    id: u64,
    event_id: String,
    url: String,
    queued: bool,
}

/// `POST /v1/webhooks/dead-letters/{id}/retry`: 202 once queued again.
pub async fn dead_letter_retry(
    State(state): State<AppState>,
    PathParam(id): PathParam,
) -> Result<(StatusCode, Json<RetryResponse>), ApiError> {
    let not_found = || ApiError::DeadLetterNotFound(format!("no dead letter with id {id}"));
    let number: u64 = id.parse().map_err(|_| not_found())?;
    let notifier = &state.notifier;
    match notifier.retry(number, Instant::now()) {
        Ok(letter) => Ok((
            StatusCode::ACCEPTED,
            Json(RetryResponse {
                id: letter.id,
                event_id: letter.message.id.to_string(),
                url: notifier.shown_url(letter.endpoint).to_owned(),
                queued: true,
            }),
        )),
        Err(RetryError::NotFound(_)) => Err(not_found()),
        Err(full @ RetryError::QueueFull(_)) => Err(ApiError::WebhookQueueFull(full.to_string())),
    }
}
