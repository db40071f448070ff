//! One webhook attempt over HTTP: sign, POST, read (a bounded part of) the answer, and classify
//! how it ended. Nothing here decides what happens next: the endpoint settles an [`Outcome`]
//! with its outbox and its health.

use std::error::Error as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::header::{CONTENT_TYPE, RETRY_AFTER};
use reqwest::{StatusCode, Url};

use super::backoff;
use super::message::batch_body;
use super::outbox::Job;
use super::signing::WebhookSecret;

/// How much of a failed answer's body is kept in `last_error`.
const ERROR_SNIPPET_CHARS: usize = 200;
/// How much of any answer's body is read (so the connection can be reused) before giving up on it.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// What every attempt needs: the client, the secret, and the per-attempt timeout.
#[derive(Debug)]
pub(super) struct Sender {
    pub client: reqwest::Client,
    pub secret: Option<WebhookSecret>,
    /// Per attempt: connecting, sending, and reading the answer (enforced by the client).
    pub timeout: Duration,
}

/// How one attempt ended.
#[derive(Debug)]
pub(super) enum Outcome {
    Delivered,
    Gone(String),
    Failed {
        error: String,
        /// Connection errors, timeouts, 5xx and 429: the receiver, not this event, is failing.
        receiver_wide: bool,
        retry_after: Option<Duration>,
    },
}

impl Sender {
    /// One POST of `job` to `url`, signed now: a single event's body, or a batch's.
    pub async fn attempt(self: Arc<Self>, url: Url, job: Job) -> Outcome {
        let now_ms = unix_now_ms();
        let body = match &job.batch_id {
            None => job.messages[0].body(),
            Some(_) => batch_body(&job.messages, now_ms),
        };
        let id = job.webhook_id();
        let timestamp = (now_ms / 1000) as i64;
        let mut request = self
            .client
            .post(url)
            .header(CONTENT_TYPE, "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", timestamp);
        if let Some(secret) = &self.secret {
            request = request.header("webhook-signature", secret.sign(id, timestamp, &body));
        }
        match request.body(body).send().await {
            Ok(response) => classify(response).await,
            Err(error) => Outcome::Failed {
                error: describe(&error, self.timeout),
                receiver_wide: true,
                retry_after: None,
            },
        }
    }
}

/// 2xx delivered; 410 gone; anything else failed, with `Retry-After` read on 429 and 503.
async fn classify(mut response: reqwest::Response) -> Outcome {
    let status = response.status();
    let retry_after = match status {
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| backoff::parse_retry_after(value, SystemTime::now())),
        _ => None,
    };
    let answer = read_answer(&mut response).await;
    if status.is_success() {
        return Outcome::Delivered;
    }
    let snippet: String = String::from_utf8_lossy(&answer)
        .chars()
        .take(ERROR_SNIPPET_CHARS)
        .collect();
    let error = if snippet.trim().is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status}: {}", snippet.trim())
    };
    if status == StatusCode::GONE {
        Outcome::Gone(error)
    } else {
        Outcome::Failed {
            error,
            receiver_wide: status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS,
            retry_after,
        }
    }
}

/// Reads up to [`MAX_ANSWER_BYTES`] of the answer's body; errors end the read quietly (the status
/// is what counts).
async fn read_answer(response: &mut reqwest::Response) -> Vec<u8> {
    let mut answer = Vec::new();
    while answer.len() < MAX_ANSWER_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => answer.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    answer
}

/// A transport error with its causes, e.g. `connection failed: ...: Connection refused`.
fn describe(error: &reqwest::Error, timeout: Duration) -> String {
    if error.is_timeout() {
        return format!("timed out after {}", humantime::format_duration(timeout));
    }
    let mut text = if error.is_connect() {
        "connection failed".to_owned()
    } else {
        "request failed".to_owned()
    };
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Now, as Unix milliseconds (for `last_error` and dead letters).
pub(super) fn unix_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}
