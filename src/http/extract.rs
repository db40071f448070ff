//! Request extractors whose rejections are [`ApiError`]s, so that a malformed request gets the
//! same error format as every other mistake.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::request::Parts;
use axum::http::HeaderMap;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use crate::types::Key;

/// Largest body of a single-item request.
pub const BODY_LIMIT: usize = 64 * 1024;
/// Largest body of a batch.
pub const BATCH_BODY_LIMIT: usize = 1024 * 1024;

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

/// Parses a JSON body; any syntax or type error (including an unknown field) is `invalid_json`.
pub fn parse_json<'a, T: serde::Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|error| ApiError::InvalidJson(error.to_string()))
}

/// The `{key}` path segment, percent-decoded and validated.
pub struct KeyPath(pub Key);

impl<S: Send + Sync> FromRequestParts<S> for KeyPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|rejection| {
                ApiError::InvalidKey(format!("invalid key in path: {}", rejection.body_text()))
            })?;
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
            .map_err(|rejection| ApiError::InvalidQuery(rejection.body_text()))?;
        Ok(Self(params))
    }
}
