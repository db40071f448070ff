//! The one error type of the HTTP boundary.
//!
//! Every error answer is `{"error":{"code":"<snake_case>","message":"<text>"}}`; each variant
//! maps to exactly one status in [`ApiError::status`]. Client mistakes are 4xx with a message
//! that says what to fix; an internal failure is logged in full and answered with a generic 500.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::registry::RegistryError;
use crate::types::InvalidInput;

#[derive(Clone, Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    InvalidJson(String),
    #[error("{0}")]
    InvalidKey(String),
    #[error("{0}")]
    InvalidService(String),
    #[error("{0}")]
    InvalidMeta(String),
    #[error("{0}")]
    InvalidTtl(String),
    #[error("{0}")]
    InvalidQuery(String),
    /// A path parameter that cannot be read (not UTF-8 once percent-decoded).
    #[error("{0}")]
    InvalidPath(String),
    #[error("a batch holds at most {max} heartbeats, this one has {got}")]
    BatchTooLarge { max: usize, got: usize },
    #[error("{0}")]
    TooManyServices(String),
    /// A creation past `--max-keys`.
    #[error("{0}")]
    TooManyKeys(String),
    #[error("no such key")]
    KeyNotFound,
    #[error("{0}")]
    DeadLetterNotFound(String),
    #[error("{0}")]
    WebhookQueueFull(String),
    /// An operator engaged the guard while it releases held keys.
    #[error("{0}")]
    GuardReleasing(String),
    /// The message may carry a hint (a key with an unencoded `/`).
    #[error("{0}")]
    RouteNotFound(String),
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    #[error("request body larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("content type must be application/json")]
    UnsupportedMediaType,
    /// The change must be logged and the log cannot be written.
    #[error("{0}")]
    StorageUnavailable(String),
    /// The request was not answered within `--request-timeout` (a slow body).
    #[error("the request took longer than {0:?} (--request-timeout): a slow body is cut off")]
    RequestTimeout(std::time::Duration),
    /// `--max-stream-clients` streams are open.
    #[error("{0}")]
    TooManyStreamClients(String),
    /// No valid token came (none, unknown, or a wrong secret).
    #[error(
        "a valid token is needed: send `Authorization: Bearer ttlw_<id>_<secret>` (the dashboard \
         trades one for a session cookie)"
    )]
    Unauthorized,
    /// The token lacks the scope; the message names it.
    #[error("{0}")]
    Forbidden(String),
    /// The service is still recovering its state from the data directory.
    #[error("the service is recovering its state from disk; try again shortly")]
    Recovering,
    /// A cluster route on a single node.
    #[error("this server is a single node: it is not a cluster member (start it with --node-id)")]
    NotACluster,
    /// A membership route naming a member the cluster does not have.
    #[error("{0}")]
    NoSuchMember(String),
    /// A membership change that conflicts with the membership (addresses taken, the last
    /// voter, another change in progress).
    #[error("{0}")]
    MembershipConflict(String),
    /// A learner asked to become a voter before it has caught up.
    #[error("{0}")]
    NotCaughtUp(String),
    /// Another membership change is being committed: retry shortly.
    #[error("{0}")]
    MembershipChanging(String),
    /// A cluster member that knows no leader, or cannot reach it.
    #[error("{0}")]
    NoLeader(String),
    /// The leader could not get its change committed on a quorum in time.
    #[error("{0}")]
    NoQuorum(String),
    /// A bug or a failure of ours; the detail is logged, not sent.
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidJson(_)
            | Self::InvalidKey(_)
            | Self::InvalidService(_)
            | Self::InvalidMeta(_)
            | Self::InvalidTtl(_)
            | Self::InvalidQuery(_)
            | Self::InvalidPath(_)
            | Self::BatchTooLarge { .. } => StatusCode::BAD_REQUEST,
            Self::TooManyServices(_) => StatusCode::UNPROCESSABLE_ENTITY,
            // A capacity limit, not a malformed request: 429 says "later", as etcd's
            // ResourceExhausted does over HTTP; keys free up as they expire or are deleted.
            Self::TooManyKeys(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::KeyNotFound
            | Self::DeadLetterNotFound(_)
            | Self::RouteNotFound(_)
            | Self::NotACluster
            | Self::NoSuchMember(_) => StatusCode::NOT_FOUND,
            Self::WebhookQueueFull(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::GuardReleasing(_)
            | Self::MembershipConflict(_)
            | Self::NotCaughtUp(_)
            | Self::MembershipChanging(_) => StatusCode::CONFLICT,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::TooManyStreamClients(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::StorageUnavailable(_)
            | Self::Recovering
            | Self::NoLeader(_)
            | Self::NoQuorum(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidJson(_) => "invalid_json",
            Self::InvalidKey(_) => "invalid_key",
            Self::InvalidService(_) => "invalid_service",
            Self::InvalidMeta(_) => "invalid_meta",
            Self::InvalidTtl(_) => "invalid_ttl",
            Self::InvalidQuery(_) => "invalid_query",
            Self::InvalidPath(_) => "invalid_path",
            Self::BatchTooLarge { .. } => "batch_too_large",
            Self::TooManyServices(_) => "too_many_services",
            Self::TooManyKeys(_) => "too_many_keys",
            Self::KeyNotFound | Self::DeadLetterNotFound(_) => "not_found",
            Self::WebhookQueueFull(_) => "webhook_queue_full",
            Self::GuardReleasing(_) => "guard_releasing",
            Self::Unauthorized => "unauthorized",
            Self::Forbidden(_) => "forbidden",
            Self::RequestTimeout(_) => "request_timeout",
            Self::TooManyStreamClients(_) => "too_many_stream_clients",
            Self::RouteNotFound(_) => "route_not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::PayloadTooLarge { .. } => "payload_too_large",
            Self::UnsupportedMediaType => "unsupported_media_type",
            Self::StorageUnavailable(_) => "storage_unavailable",
            Self::Recovering => "recovering",
            Self::NotACluster => "not_a_cluster",
            Self::NoSuchMember(_) => "no_such_member",
            Self::MembershipConflict(_) => "membership_conflict",
            Self::NotCaughtUp(_) => "not_caught_up",
            Self::MembershipChanging(_) => "membership_changing",
            Self::NoLeader(_) => "no_leader",
            Self::NoQuorum(_) => "no_quorum",
            Self::Internal(_) => "internal",
        }
    }

    /// The `{"error":{...}}` body, also used for per-item errors in a batch.
    pub fn body(&self) -> serde_json::Value {
        json!({ "error": self.detail() })
    }

    /// The inside of [`ApiError::body`]: `{"code", "message"}` (a batch's failed items carry it).
    pub fn detail(&self) -> serde_json::Value {
        json!({ "code": self.code(), "message": self.to_string() })
    }
}

impl From<InvalidInput> for ApiError {
    fn from(invalid: InvalidInput) -> Self {
        let message = invalid.to_string();
        match invalid {
            InvalidInput::Key(_) => Self::InvalidKey(message),
            InvalidInput::Service => Self::InvalidService(message),
            InvalidInput::Meta(_) => Self::InvalidMeta(message),
            InvalidInput::Ttl => Self::InvalidTtl(message),
        }
    }
}

impl From<RegistryError> for ApiError {
    fn from(error: RegistryError) -> Self {
        match error {
            RegistryError::Invalid(invalid) => invalid.into(),
            RegistryError::TooManyServices => Self::TooManyServices(error.to_string()),
            RegistryError::TooManyKeys { .. } => Self::TooManyKeys(error.to_string()),
            RegistryError::StorageUnavailable => Self::StorageUnavailable(error.to_string()),
            // Every handler of a change proposes these to the log itself: one that reaches here
            // is a route that forgot to, a bug.
            RegistryError::NeedsLog => Self::Internal(format!("unproposed: {error}")),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let Self::Internal(detail) = &self {
            tracing::error!(%detail, "internal error");
        }
        let mut response = (self.status(), Json(self.body())).into_response();
        match self {
            Self::Unauthorized => {
                response.headers_mut().insert(
                    axum::http::header::WWW_AUTHENTICATE,
                    axum::http::HeaderValue::from_static("Bearer realm=\"ttlwheel\""),
                );
            }
            // "Later", and when: an election, a quorum or a learner's catching up takes about
            // a second (a forwarded request's 503 says the same, `cluster::forward`).
            Self::NoLeader(_)
            | Self::NoQuorum(_)
            | Self::NotCaughtUp(_)
            | Self::MembershipChanging(_) => {
                response.headers_mut().insert(
                    axum::http::header::RETRY_AFTER,
                    axum::http::HeaderValue::from_static("1"),
                );
            }
            _ => {}
        }
        response
    }
}
