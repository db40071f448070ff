//! Authentication at the HTTP boundary: the gate's step ([`admit`]) that finds who is calling
//! (a bearer token, or the dashboard's session cookie), refuses what the route's rule
//! (`auth::policy`) does not allow, and hands the handler a [`Caller`] for the checks that need
//! the key; and the session routes (`POST /v1/session` trades a token for a cookie, `DELETE`
//! ends it).
//!
//! 401 `unauthorized` (with `WWW-Authenticate: Bearer`) when no valid token came; 403
//! `forbidden` naming the scope needed when the token lacks it. Neither says whether a token id
//! exists. Secrets are never logged; denials log the token id.

use std::sync::Arc;

use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::http::header::{AUTHORIZATION, COOKIE, SET_COOKIE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::error::ApiError;
use super::extract::parse_json;
use crate::auth::policy::{self, Access, PublicPaths};
use crate::auth::sessions::{self, SESSION_TTL};
use crate::auth::{Auth, Token};

/// What authentication needs.
#[derive(Clone, Debug)]
pub struct AuthState {
    /// `None`: auth is off (no `--auth-tokens`); every request may do everything.
    pub auth: Option<Arc<Auth>>,
    pub public: PublicPaths,
    /// Cookies get `Secure` when served over TLS.
    pub secure_cookies: bool,
    /// Auth is off on a non-loopback address (`--insecure-no-auth`): `/healthz` says so.
    pub insecure: bool,
}

/// Who is calling, for the handlers' per-key checks. `None` inside: auth is off.
#[derive(Clone, Debug, Default)]
pub struct Caller(pub Option<Arc<Token>>);

impl Caller {
    pub fn check_heartbeat(&self, key: &str, service: Option<&str>) -> Result<(), ApiError> {
        self.check(
            |token| token.may_heartbeat(key, service),
            || match service {
                Some(service) => format!("heartbeat on key `{key}` with service `{service}`"),
                None => {
                    format!("heartbeat on key `{key}` (a token narrowed to a service must name it)")
                }
            },
        )
    }

    pub fn check_read(&self, key: &str, service: Option<&str>) -> Result<(), ApiError> {
        self.check(
            |token| token.may_read(key, service),
            || format!("read on key `{key}`"),
        )
    }

    pub fn check_list(&self, prefix: Option<&str>, service: Option<&str>) -> Result<(), ApiError> {
        self.check(
            |token| token.may_list(prefix, service),
            || "read over the whole listing (narrow it with the token's prefix or service)".into(),
        )
    }

    pub fn check_delete(&self, key: &str, service: Option<&str>) -> Result<(), ApiError> {
        self.check(
            |token| token.may_delete(key, service),
            || format!("admin, or heartbeat on key `{key}`"),
        )
    }

    fn check(
        &self,
        allowed: impl Fn(&Token) -> bool,
        needed: impl Fn() -> String,
    ) -> Result<(), ApiError> {
        match &self.0 {
            None => Ok(()),
            Some(token) if allowed(token) => Ok(()),
            Some(token) => {
                tracing::info!(token = %token.id, "forbidden");
                Err(ApiError::Forbidden(format!(
                    "this token lacks the scope: {}",
                    needed()
                )))
            }
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<Caller>()
            .cloned()
            .unwrap_or_default())
    }
}

/// Authenticates `request`, applies its route's rule, and leaves a [`Caller`] in it; the
/// refusal to answer instead (part of [`super::gate`], before anything else runs).
pub fn admit(state: &AuthState, request: &mut Request) -> Result<(), ApiError> {
    let Some(auth) = &state.auth else {
        return Ok(());
    };
    // Unmatched paths get their 404 / 405 without asking who calls.
    let Some(template) = request.extensions().get::<MatchedPath>() else {
        return Ok(());
    };
    let access = policy::access(template.as_str(), request.method().as_str(), state.public);
    let token = identify(auth, request.headers());
    if access != Access::Public {
        let Some(token) = &token else {
            return Err(ApiError::Unauthorized);
        };
        if let Err(needed) = allows(token, access) {
            tracing::info!(token = %token.id, route = %template.as_str(), "forbidden");
            return Err(ApiError::Forbidden(format!(
                "this token lacks the scope: {needed}"
            )));
        }
    }
    request.extensions_mut().insert(Caller(token));
    Ok(())
}

/// The token of a request: its bearer token, else its session cookie's.
fn identify(auth: &Auth, headers: &HeaderMap) -> Option<Arc<Token>> {
    let tokens = auth.tokens();
    if let Some(value) = headers.get(AUTHORIZATION) {
        let bearer = value.to_str().ok()?.strip_prefix("Bearer ")?;
        return tokens.verify(bearer.trim());
    }
    let session = headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .find_map(sessions::from_cookie_header)?;
    tokens.get(&auth.sessions.token_id(session)?)
}

/// Whether `token` passes a route-level rule; else the scope needed, for the 403.
fn allows(token: &Token, access: Access) -> Result<(), &'static str> {
    let heartbeat = token
        .scopes
        .iter()
        .any(|scope| matches!(scope, crate::auth::Scope::Heartbeat(_)));
    let read = token
        .scopes
        .iter()
        .any(|scope| matches!(scope, crate::auth::Scope::Read(_)));
    let allowed = token.is_admin()
        || match access {
            Access::Public => true,
            Access::Heartbeat | Access::DeleteKey => heartbeat,
            Access::Read => read,
            Access::ReadAll => token.may_read_all(),
            Access::Admin => false,
        };
    if allowed {
        return Ok(());
    }
    Err(match access {
        Access::Heartbeat => "heartbeat",
        Access::DeleteKey => "heartbeat (over the key) or admin",
        Access::Read => "read",
        Access::ReadAll => "read (not narrowed)",
        Access::Admin | Access::Public => "admin",
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionRequest {
    token: String,
}

/// `POST /v1/session` `{"token": "ttlw_..."}`: 204 and a session cookie for the dashboard.
pub async fn session_create(
    State(state): State<super::AppState>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let state = &state.auth;
    let Some(auth) = &state.auth else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    let request: SessionRequest = parse_json(&body)?;
    let token = auth
        .tokens()
        .verify(&request.token)
        .ok_or(ApiError::Unauthorized)?;
    let session = auth
        .sessions
        .create(&token.id)
        .map_err(ApiError::Internal)?;
    let secure = if state.secure_cookies { "; Secure" } else { "" };
    let cookie = format!(
        "{}={session}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}{secure}",
        sessions::COOKIE,
        SESSION_TTL.as_secs()
    );
    let mut response = StatusCode::NO_CONTENT.into_response();
    response.headers_mut().insert(
        SET_COOKIE,
        HeaderValue::from_str(&cookie).map_err(|e| ApiError::Internal(e.to_string()))?,
    );
    Ok(response)
}

/// `DELETE /v1/session`: ends the session of the cookie sent, if any, and clears the cookie.
pub async fn session_end(State(state): State<super::AppState>, headers: HeaderMap) -> Response {
    if let Some(auth) = &state.auth.auth {
        let session = headers
            .get_all(COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .find_map(sessions::from_cookie_header);
        if let Some(session) = session {
            auth.sessions.end(session);
        }
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    let clear = format!(
        "{}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0",
        sessions::COOKIE
    );
    response.headers_mut().insert(
        SET_COOKIE,
        HeaderValue::from_str(&clear).expect("a valid header"),
    );
    response
}
