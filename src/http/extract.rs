//! Request extractors whose rejections are [`ApiError`]s, so that a malformed request gets the
//! same error format as every other mistake.

use axum::body::Bytes;
use axum::extract::path::ErrorKind;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::request::Parts;
use axum::http::HeaderMap;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use super::AppState;
use crate::types::Key;

/// Largest body of a single-item request.
pub const BODY_LIMIT: usize = 64 * 1024;
/// Largest body of a batch.
pub const BATCH_BODY_LIMIT: usize = 1024 * 1024;

/// `Prefer: return=minimal` (RFC 7240): the client wants no body back, only the status. Any
/// other preference, or none, is `false`; an unreadable header is ignored, as the RFC says.
pub struct ReturnMinimal(pub bool);

impl<S: Send + Sync> FromRequestParts<S> for ReturnMinimal {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(Self(prefers_minimal(&parts.headers)))
    }
}

/// Whether any `Prefer` header holds the preference `return=minimal` (names are
/// case-insensitive; a value may be quoted; preferences are comma-separated, parameters follow
/// a `;`).
fn prefers_minimal(headers: &HeaderMap) -> bool {
    headers
        .get_all("prefer")
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|preference| {
            let token = preference.split(';').next()?;
            let (name, value) = token.split_once('=')?;
            Some((
                name.trim().to_owned(),
                value.trim().trim_matches('"').to_owned(),
            ))
        })
        .any(|(name, value)| {
            name.eq_ignore_ascii_case("return") && value.eq_ignore_ascii_case("minimal")
        })
}

/// A JSON request body of at most `LIMIT` bytes, not yet parsed (handlers parse it with
/// [`parse_json`], borrowing from it where they can).
pub struct JsonBytes<const LIMIT: usize>(pub Bytes);

impl<S: Send + Sync, const LIMIT: usize> FromRequest<S> for JsonBytes<LIMIT> {
    type Rejection = ApiError;

    async fn from_request(request: Request, _state: &S) -> Result<Self, ApiError> {
        if !is_json(request.headers()) {
            return Err(ApiError::UnsupportedMediaType);
        }
        let declared = request
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok()?.parse::<usize>().ok());
        if declared.is_some_and(|length| length > LIMIT) {
            return Err(ApiError::PayloadTooLarge { limit: LIMIT });
        }
        match axum::body::to_bytes(request.into_body(), LIMIT).await {
            Ok(bytes) => Ok(Self(bytes)),
            Err(error) if is_length_limit(&error) => {
                Err(ApiError::PayloadTooLarge { limit: LIMIT })
            }
            Err(error) => Err(ApiError::InvalidJson(format!(
                "could not read the request body: {error}"
            ))),
        }
    }
}

fn is_length_limit(error: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        if current.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = current.source();
    }
    false
}

/// `application/json`, with or without parameters, or any `application/*+json`.
fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
    else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    let (kind, subtype) = essence.split_once('/').unwrap_or((essence, ""));
    kind.eq_ignore_ascii_case("application")
        && (subtype.eq_ignore_ascii_case("json")
            || (subtype.len() > 5
                && subtype.as_bytes()[subtype.len() - 5..].eq_ignore_ascii_case(b"+json")))
}

/// Parses a JSON object; anything else (an array, a string, a number), any syntax or type error
/// and any unknown field is `invalid_json`.
///
/// The object check comes first because serde's derived structs also accept a JSON array and
/// read it positionally: `["k1",null,5]` would otherwise be a heartbeat for `k1`.
pub fn parse_json<'a, T: serde::Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, ApiError> {
    let first = bytes.iter().find(|byte| !byte.is_ascii_whitespace());
    if first.is_some_and(|&byte| byte != b'{') {
        return Err(ApiError::InvalidJson("expected a JSON object".into()));
    }
    serde_json::from_slice(bytes).map_err(|error| ApiError::InvalidJson(error.to_string()))
}

/// A path parameter (`{id}`) as text, percent-decoded; one that is not UTF-8 once decoded is
/// `invalid_path`, in the API's JSON error format (axum's own rejection is plain text).
pub struct PathParam(pub String);

impl<S: Send + Sync> FromRequestParts<S> for PathParam {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Ok(Self(path_text(parts, state, ApiError::InvalidPath).await?))
    }
}

/// The one path parameter as text, or the error `invalid` makes of what is wrong with it.
async fn path_text<S: Send + Sync>(
    parts: &mut Parts,
    state: &S,
    invalid: fn(String) -> ApiError,
) -> Result<String, ApiError> {
    let Path(raw) = Path::<String>::from_request_parts(parts, state)
        .await
        .map_err(|rejection| invalid(path_problem(&rejection)))?;
    Ok(raw)
}

/// What is wrong with a path parameter, in words (axum's text names the parameter).
fn path_problem(rejection: &PathRejection) -> String {
    match rejection {
        PathRejection::FailedToDeserializePathParams(inner) => match inner.kind() {
            ErrorKind::InvalidUtf8InPathParam { key } => {
                format!("the path parameter `{key}` is not valid UTF-8 once percent-decoded")
            }
            _ => inner.body_text(),
        },
        other => other.body_text(),
    }
}

/// The `{key}` path segment, percent-decoded and validated.
pub struct KeyPath(pub Key);

impl<S: Send + Sync> FromRequestParts<S> for KeyPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let raw = path_text(parts, state, ApiError::InvalidKey).await?;
        Ok(Self(Key::new(&raw)?))
    }
}

/// Query parameters; unknown or malformed ones are `invalid_query`.
pub struct QueryParams<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Query(params) = Query::<T>::from_request_parts(parts, state)
            .await
            .map_err(|rejection| ApiError::InvalidQuery(query_problem(&rejection)))?;
        Ok(Self(params))
    }
}

/// What is wrong with a query string, without axum's "Failed to deserialize query string: "
/// prefix, so it reads like every other error message.
fn query_problem(rejection: &QueryRejection) -> String {
    match rejection {
        QueryRejection::FailedToDeserializeQueryString(inner) => {
            match std::error::Error::source(inner) {
                Some(cause) => format!("query: {cause}"),
                None => inner.body_text(),
            }
        }
        other => other.body_text(),
    }
}

/// The app state, once recovery has finished: a route that reads or changes keys takes this
/// instead of `State`, and answers 503 `recovering` before that.
pub struct Ready(pub AppState);

impl FromRequestParts<AppState> for Ready {
    type Rejection = ApiError;

    async fn from_request_parts(_parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        if state.is_ready() {
            Ok(Self(state.clone()))
        } else {
            Err(ApiError::Recovering)
        }
    }
}
