//! `GET /metrics`, and the middleware that counts and times every request for it.

use axum::extract::{MatchedPath, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{AppState, ROUTES};
use crate::metrics;

/// `GET /metrics`: OpenMetrics text (Prometheus scrapes it as is).
pub async fn metrics_text(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(CONTENT_TYPE, metrics::CONTENT_TYPE)],
        state.metrics.render(),
    )
}

/// Counts the request by route template, method and status, and times it to the response
/// head (a stream's body is not included).
pub async fn record(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = std::time::Instant::now();
    let route = route_label(request.extensions().get::<MatchedPath>());
    let method = known_method(request.method());
    let response = next.run(request).await;
    state
        .metrics
        .observe_request(route, method, response.status().as_u16(), started.elapsed());
    response
}

/// The route template as a label: the `'static` entry of [`ROUTES`], so counting a request
/// allocates nothing.
fn route_label(matched: Option<&MatchedPath>) -> &'static str {
    matched
        .and_then(|path| ROUTES.iter().find(|(route, _)| *route == path.as_str()))
        .map_or("(unmatched)", |(route, _)| route)
}

/// The method as a label: the standard ones by name, anything else as `other` (a client must
/// not be able to add label values at will).
fn known_method(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}
