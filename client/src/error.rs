//! The one error type of the client: what a call can end with.
//!
//! A server that answered with a 4xx (or a 5xx other than 502/503/504) is [`Error::Api`], with
//! the API's error code as a [`Code`]; no endpoint answering (connection refused, timeouts,
//! 502/503/504 on every attempt) is [`Error::Unavailable`], with each attempt's reason.

/// The API's error codes (`{"error":{"code": ...}}`), as `openapi.yaml` lists them; a code this
/// version does not know is kept as [`Code::Other`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Code {
    InvalidJson,
    InvalidKey,
    InvalidService,
    InvalidMeta,
    InvalidTtl,
    InvalidQuery,
    InvalidPath,
    BatchTooLarge,
    TooManyServices,
    TooManyKeys,
    NotFound,
    WebhookQueueFull,
    GuardReleasing,
    Unauthorized,
    Forbidden,
    RequestTimeout,
    TooManyStreamClients,
    RouteNotFound,
    MethodNotAllowed,
    PayloadTooLarge,
    UnsupportedMediaType,
    StorageUnavailable,
    Recovering,
    Internal,
    /// A code this client does not know (a newer server), or `http_<status>` when the answer
    /// had no error body (a proxy's page, say).
    Other(String),
}

impl Code {
    /// The code as the API spells it.
    pub fn parse(code: &str) -> Self {
        match code {
            "invalid_json" => Self::InvalidJson,
            "invalid_key" => Self::InvalidKey,
            "invalid_service" => Self::InvalidService,
            "invalid_meta" => Self::InvalidMeta,
            "invalid_ttl" => Self::InvalidTtl,
            "invalid_query" => Self::InvalidQuery,
            "invalid_path" => Self::InvalidPath,
            "batch_too_large" => Self::BatchTooLarge,
            "too_many_services" => Self::TooManyServices,
            "too_many_keys" => Self::TooManyKeys,
            "not_found" => Self::NotFound,
            "webhook_queue_full" => Self::WebhookQueueFull,
            "guard_releasing" => Self::GuardReleasing,
            "unauthorized" => Self::Unauthorized,
            "forbidden" => Self::Forbidden,
            "request_timeout" => Self::RequestTimeout,
            "too_many_stream_clients" => Self::TooManyStreamClients,
            "route_not_found" => Self::RouteNotFound,
            "method_not_allowed" => Self::MethodNotAllowed,
            "payload_too_large" => Self::PayloadTooLarge,
            "unsupported_media_type" => Self::UnsupportedMediaType,
            "storage_unavailable" => Self::StorageUnavailable,
            "recovering" => Self::Recovering,
            "internal" => Self::Internal,
            other => Self::Other(other.to_owned()),
        }
    }

    /// The code as the API spells it.
    pub fn as_str(&self) -> &str {
        match self {
            Self::InvalidJson => "invalid_json",
            Self::InvalidKey => "invalid_key",
            Self::InvalidService => "invalid_service",
            Self::InvalidMeta => "invalid_meta",
            Self::InvalidTtl => "invalid_ttl",
            Self::InvalidQuery => "invalid_query",
            Self::InvalidPath => "invalid_path",
            Self::BatchTooLarge => "batch_too_large",
            Self::TooManyServices => "too_many_services",
            Self::TooManyKeys => "too_many_keys",
            Self::NotFound => "not_found",
            Self::WebhookQueueFull => "webhook_queue_full",
            Self::GuardReleasing => "guard_releasing",
            Self::Unauthorized => "unauthorized",
            Self::Forbidden => "forbidden",
            Self::RequestTimeout => "request_timeout",
            Self::TooManyStreamClients => "too_many_stream_clients",
            Self::RouteNotFound => "route_not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::PayloadTooLarge => "payload_too_large",
            Self::UnsupportedMediaType => "unsupported_media_type",
            Self::StorageUnavailable => "storage_unavailable",
            Self::Recovering => "recovering",
            Self::Internal => "internal",
            Self::Other(other) => other,
        }
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything a call can end with.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Error {
    /// The server refused the request: its status, code and message.
    #[error("{status} {code}: {message}")]
    Api {
        /// The HTTP status (a 4xx, or a 5xx other than 502/503/504).
        status: u16,
        /// The API's error code.
        code: Code,
        /// The API's message, meant for a human.
        message: String,
    },
    /// No endpoint answered: every attempt failed to connect, timed out, or got 502/503/504.
    #[error("no endpoint answered after {} attempts: {}", failures.len(), failures.join("; "))]
    Unavailable {
        /// Each attempt's endpoint and why it failed, in order.
        failures: Vec<String>,
    },
    /// `GET /v1/cluster` is not served: the server is a single node (clustering is issue 28).
    #[error("the server is a single node: it has no /v1/cluster")]
    NotClustered,
    /// An answer the client could not read (not the JSON the API documents).
    #[error("unexpected answer from {endpoint}: {detail}")]
    Decode {
        /// The endpoint that answered.
        endpoint: String,
        /// What was wrong with it.
        detail: String,
    },
    /// The builder was given something it cannot use (a bad URL, an unreadable PEM).
    #[error("invalid client configuration: {0}")]
    Config(String),
    /// The keep-alive task of this client has stopped (its runtime shut down).
    #[error("the keep-alive task has stopped")]
    Stopped,
}

impl Error {
    /// The API's error code, for an [`Error::Api`].
    pub fn code(&self) -> Option<&Code> {
        match self {
            Self::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// Whether the server said the key (or route) does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self.code(),
            Some(Code::NotFound) | Some(Code::RouteNotFound)
        )
    }

    /// Whether no endpoint could be reached.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }
}

/// The `{"error": {"code", "message"}}` body of an error answer.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct ErrorBody {
    pub(crate) error: ErrorDetail,
}

/// The inside of [`ErrorBody`] (also a failed batch item's `error`).
#[derive(Debug, serde::Deserialize)]
pub(crate) struct ErrorDetail {
    pub(crate) code: String,
    pub(crate) message: String,
}

impl ErrorDetail {
    /// The detail as an [`Error::Api`] of `status`.
    pub(crate) fn into_error(self, status: u16) -> Error {
        Error::Api {
            status,
            code: Code::parse(&self.code),
            message: self.message,
        }
    }
}

/// The error an answer of `status` with `body` stands for: the API's error body, or, when the
/// body is not one (a proxy's page), `http_<status>` with the start of the body.
pub(crate) fn api_error(status: u16, body: &[u8]) -> Error {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(parsed) => parsed.error.into_error(status),
        Err(_) => Error::Api {
            status,
            code: Code::Other(format!("http_{status}")),
            message: String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_reads_back_as_it_is_spelled() {
        for code in [
            "invalid_json",
            "invalid_key",
            "invalid_service",
            "invalid_meta",
            "invalid_ttl",
            "invalid_query",
            "invalid_path",
            "batch_too_large",
            "too_many_services",
            "too_many_keys",
            "not_found",
            "webhook_queue_full",
            "guard_releasing",
            "unauthorized",
            "forbidden",
            "request_timeout",
            "too_many_stream_clients",
            "route_not_found",
            "method_not_allowed",
            "payload_too_large",
            "unsupported_media_type",
            "storage_unavailable",
            "recovering",
            "internal",
            "from_the_future",
        ] {
            let parsed = Code::parse(code);
            assert_eq!(parsed.as_str(), code);
            assert_eq!(
                matches!(parsed, Code::Other(_)),
                code == "from_the_future",
                "{code}"
            );
        }
    }

    #[test]
    fn an_answer_without_an_error_body_gets_an_http_code() {
        let error = api_error(418, b"<html>teapot</html>");
        assert_eq!(error.code(), Some(&Code::Other("http_418".into())));
        let error = api_error(
            404,
            br#"{"error":{"code":"not_found","message":"no such key"}}"#,
        );
        assert!(error.is_not_found());
        assert_eq!(error.to_string(), "404 not_found: no such key");
    }
}
