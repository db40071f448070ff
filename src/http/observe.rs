//! `GET /metrics`, and the middleware that counts and times every request for it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::{MatchedPath, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use tower_layer::Layer;
use tower_service::Service;

use super::AppState;
use crate::metrics::{self, Metrics};

/// `GET /metrics`: OpenMetrics text (Prometheus scrapes it as is).
pub async fn metrics_text(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(CONTENT_TYPE, metrics::CONTENT_TYPE)],
        state.metrics.render(),
    )
}

/// Counts every request by route template, method and status, and times it to the response
/// head (a stream's body is not included). A hand-written layer rather than
/// `axum::middleware::from_fn`, which boxes and clones the inner service for every request.
#[derive(Clone, Debug)]
pub struct RecordLayer(pub Arc<Metrics>);

impl<S> Layer<S> for RecordLayer {
    type Service = Record<S>;

    fn layer(&self, inner: S) -> Record<S> {
        Record {
            inner,
            metrics: Arc::clone(&self.0),
        }
    }
}

/// The service of [`RecordLayer`].
#[derive(Clone, Debug)]
pub struct Record<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S> Service<Request> for Record<S>
where
    S: Service<Request, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Recorded<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let route = self.metrics.route_index(
            request
                .extensions()
                .get::<MatchedPath>()
                .map(MatchedPath::as_str),
        );
        let method = known_method(request.method());
        Recorded {
            started: std::time::Instant::now(),
            route,
            method,
            metrics: Arc::clone(&self.metrics),
            inner: self.inner.call(request),
        }
    }
}

pin_project_lite::pin_project! {
    /// A request's response on its way, timed.
    pub struct Recorded<F> {
        #[pin]
        inner: F,
        started: std::time::Instant,
        route: usize,
        method: &'static str,
        metrics: Arc<Metrics>,
    }
}

impl<F, E> Future for Recorded<F>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = std::task::ready!(this.inner.poll(cx));
        if let Ok(response) = &result {
            this.metrics.observe_request(
                *this.route,
                this.method,
                response.status().as_u16(),
                this.started.elapsed(),
            );
        }
        Poll::Ready(result)
    }
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
