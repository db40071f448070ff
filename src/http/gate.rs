//! Every API request's way in, as one layer: the time limit (`--request-timeout`), then who
//! calls and whether the route lets them (`auth::admit`), then where the request is served
//! (`replicate::serve_where`: here, here from this member's applied state, or forwarded to the
//! leader).
//!
//! Why one hand-written layer rather than three `axum::middleware::from_fn` ones: each of those
//! clones and boxes the inner service and boxes its future for every request. Here the
//! decisions are made synchronously in `call`, and the inner service's future is polled in
//! place; only a forwarded request (a follower's) boxes its future.
//!
//! Invariants: a request refused by one step never reaches the next; the time limit covers the
//! whole request, body included (a body sent one byte a second is cut off), but a stream's
//! events come after its answer, so only its start counts; a timed-out answer closes the
//! connection, as the rest of its body will not be read.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::Request;
use axum::http::header::CONNECTION;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use tower_layer::Layer;
use tower_service::Service;

use super::replicate::{self, Serve};
use super::{auth, ApiError, AppState};
use crate::cluster::node::Cluster;

/// See the module documentation.
#[derive(Clone)]
pub struct GateLayer(pub AppState);

impl<S> Layer<S> for GateLayer {
    type Service = Gate<S>;

    fn layer(&self, inner: S) -> Gate<S> {
        Gate {
            inner,
            state: self.0.clone(),
        }
    }
}

/// The service of [`GateLayer`].
#[derive(Clone)]
pub struct Gate<S> {
    inner: S,
    state: AppState,
}

impl<S> Service<Request> for Gate<S>
where
    S: Service<Request, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Timed<Passage<S::Future>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request) -> Self::Future {
        let passage = match admit(&self.state, &mut request) {
            Err(refused) => Passage::Answered {
                response: Some(refused.into_response()),
            },
            Ok(Serve::Here) => Passage::Here {
                inner: self.inner.call(request),
                stale: None,
            },
            Ok(Serve::HereStale(cluster)) => Passage::Here {
                inner: self.inner.call(request),
                stale: Some(cluster),
            },
            Ok(Serve::Forward(cluster)) => Passage::Forwarded {
                forwarded: Box::pin(async move { cluster.forward(request).await }),
            },
        };
        let limit = self.state.request_timeout;
        Timed {
            inner: tokio::time::timeout(limit, passage),
            limit,
        }
    }
}

/// The caller's rights, then where the request is served.
fn admit(state: &AppState, request: &mut Request) -> Result<Serve, ApiError> {
    auth::admit(&state.auth, request)?;
    replicate::serve_where(state, request)
}

pin_project_lite::pin_project! {
    /// A request on its way through the gate: answered by the gate itself, served here, or
    /// forwarded.
    #[project = PassageProjection]
    pub enum Passage<F> {
        Answered { response: Option<Response> },
        Here { #[pin] inner: F, stale: Option<Arc<Cluster>> },
        Forwarded { forwarded: Pin<Box<dyn Future<Output = Response> + Send>> },
    }
}

impl<F, E> Future for Passage<F>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            PassageProjection::Answered { response } => {
                Poll::Ready(Ok(response.take().expect("polled after it answered")))
            }
            PassageProjection::Here { inner, stale } => {
                let mut response = std::task::ready!(inner.poll(cx))?;
                if let Some(cluster) = stale {
                    replicate::stamp_staleness(cluster, &mut response);
                }
                Poll::Ready(Ok(response))
            }
            PassageProjection::Forwarded { forwarded } => forwarded.as_mut().poll(cx).map(Ok),
        }
    }
}

pin_project_lite::pin_project! {
    /// A request's answer, or 408 `request_timeout` past the limit.
    pub struct Timed<F> {
        #[pin]
        inner: tokio::time::Timeout<F>,
        limit: Duration,
    }
}

impl<F, E> Future for Timed<F>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match std::task::ready!(this.inner.poll(cx)) {
            Ok(answered) => Poll::Ready(answered),
            Err(_) => {
                let mut response = ApiError::RequestTimeout(*this.limit).into_response();
                // The rest of the body will not be read: the connection cannot be reused.
                (response.headers_mut()).insert(CONNECTION, HeaderValue::from_static("close"));
                Poll::Ready(Ok(response))
            }
        }
    }
}
