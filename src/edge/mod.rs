//! The edge: accepting connections and serving HTTP/1.1 on them, with the limits that keep slow
//! or greedy clients from taking the service down.
//!
//! - **Connections are capped** (`--max-connections`): past the cap the server stops accepting,
//!   so new connections wait in the kernel's backlog (or are refused by it when that is full);
//!   nothing ever makes the process fall over. The cap defaults to what the open-files limit
//!   allows, after [`raise_open_files_limit`] has raised the soft limit to the hard one at start.
//! - **A request head must arrive within `--header-read-timeout`** of when the server starts
//!   waiting for one: after connecting (a slowloris that sends half a header is closed), and
//!   after each response (so the same timeout closes idle keep-alive connections).
//! - Slow bodies are cut off by the request timeout (`http::app`'s `--request-timeout`).
//! - With TLS ([`tls`]), the handshake must finish within `--tls-handshake-timeout`, in the
//!   connection's own task (a slow handshake never holds up accepting).
//! - Accepting happens here, on the caller's runtime; each connection is then served, round
//!   robin, on one of the serving runtimes ([`crate::placement`]) for its whole life.
//!
//! Axum and hyper stay the HTTP stack: this is hyper-util's connection builder with a timer,
//! which `axum::serve` does not install (so hyper's header timeout never fired). Shutdown is
//! graceful: stop accepting, let in-flight requests finish, close idle connections.

pub mod tls;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::placement::Placement;

/// File descriptors kept for everything that is not a client connection (the data directory,
/// webhook connections, the runtime).
const RESERVED_FDS: u64 = 256;

/// At most one warning this often while the connection cap holds accepting back.
const CAP_WARNING_EVERY: Duration = Duration::from_secs(10);

/// The edge's limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EdgeLimits {
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    pub tls_handshake_timeout: Duration,
    /// SO_SNDBUF of each connection; `None`: the kernel's autotuning.
    pub send_buffer: Option<usize>,
}

/// What the edge is doing, for the metrics.
#[derive(Debug, Default)]
pub struct EdgeStats {
    /// Connections open now.
    pub open: AtomicU64,
    /// Connections accepted since start.
    pub accepted: AtomicU64,
    /// Times the cap was reached (accepting then waited for a slot).
    pub capped: AtomicU64,
}

/// Raises the soft open-files limit to the hard one (as Redis and nginx do), and returns the
/// soft limit in force after. A failure leaves it as it was.
pub fn raise_open_files_limit() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let limit = getrlimit(Resource::Nofile);
    // `None` is "unlimited".
    let (soft, hard) = (limit.current, limit.maximum);
    let below = match (soft, hard) {
        (Some(soft), Some(hard)) => soft < hard,
        (Some(_), None) => true,
        (None, _) => false,
    };
    if below {
        let raised = rustix::process::Rlimit {
            current: hard,
            maximum: hard,
        };
        if let Err(error) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(%error, ?soft, ?hard, "cannot raise the open-files limit");
        }
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// The default connection cap for an open-files limit: the limit less what the rest of the
/// process needs, at least 64, at most 1,000,000.
pub fn default_max_connections(open_files: u64) -> usize {
    open_files.saturating_sub(RESERVED_FDS).clamp(64, 1_000_000) as usize
}

/// Serves `app` on `listener` until `shutdown` resolves, then stops accepting and returns once
/// every connection has finished its in-flight request. Connections are served on `placement`'s
/// serving runtimes in turn.
pub async fn serve(
    listener: TcpListener,
    placement: &Placement,
    app: Router,
    limits: EdgeLimits,
    stats: Arc<EdgeStats>,
    tls: Option<Arc<tls::Tls>>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    tokio::pin!(shutdown);
    let mut last_warned: Option<std::time::Instant> = None;
    let mut next_runtime = placement.serving().iter().cycle();
    loop {
        // A connection slot first: at the cap, accepting waits (the kernel's backlog holds the
        // newcomers) instead of taking a connection the process cannot serve.
        let permit = match Arc::clone(&permits).try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                stats.capped.fetch_add(1, Ordering::Relaxed);
                if last_warned.is_none_or(|at| at.elapsed() >= CAP_WARNING_EVERY) {
                    tracing::warn!(
                        max_connections = limits.max_connections,
                        "the connection cap is reached: new connections wait in the backlog"
                    );
                    last_warned = Some(std::time::Instant::now());
                }
                tokio::select! {
                    () = &mut shutdown => break,
                    permit = Arc::clone(&permits).acquire_owned() => {
                        permit.expect("the semaphore is never closed")
                    }
                }
            }
        };
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of file descriptors or a connection reset before it was accepted:
                    // wait a moment rather than spin, and go on.
                    tracing::warn!(%error, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        if let Some(bytes) = limits.send_buffer {
            let _ = socket2::SockRef::from(&stream).set_send_buffer_size(bytes);
        }
        let Some(stream) = Moving::start(stream, placement.is_per_core()) else {
            continue;
        };
        let runtime = next_runtime.next().expect("serving is never empty");
        let service = TowerToHyperService::new(app.clone());
        stats.accepted.fetch_add(1, Ordering::Relaxed);
        stats.open.fetch_add(1, Ordering::Relaxed);
        let stats = Arc::clone(&stats);
        let (builder, watcher) = (builder.clone(), graceful.watcher());
        let tls = tls
            .as_ref()
            .map(|tls| (tls.acceptor(), limits.tls_handshake_timeout));
        // A connection ends in an error when a client goes away mid-request, misses a timeout
        // or fails the handshake: that is the client's business, not worth a log line.
        runtime.spawn(async move {
            if let Some(stream) = stream.into_tokio() {
                match tls {
                    None => {
                        let connection = builder.serve_connection(TokioIo::new(stream), service);
                        let _ = watcher.watch(connection).await;
                    }
                    Some((acceptor, handshake_timeout)) => {
                        if let Ok(Ok(stream)) =
                            tokio::time::timeout(handshake_timeout, acceptor.accept(stream)).await
                        {
                            let connection =
                                builder.serve_connection(TokioIo::new(stream), service);
                            let _ = watcher.watch(connection).await;
                        }
                    }
                }
            }
            stats.open.fetch_sub(1, Ordering::Relaxed);
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// An accepted connection on its way to the runtime that will serve it.
enum Moving {
    /// Served where it was accepted.
    Here(TcpStream),
    /// Deregistered from the accepting runtime; registered again by the one it goes to.
    Away(std::net::TcpStream),
}

impl Moving {
    /// Readies `stream` to be served on another runtime if it goes `away`; `None` if it cannot
    /// be (the connection is then closed).
    fn start(stream: TcpStream, away: bool) -> Option<Self> {
        if !away {
            return Some(Moving::Here(stream));
        }
        stream.into_std().ok().map(Moving::Away)
    }

    /// The stream registered with the current runtime; `None` if that fails (the connection is
    /// then closed).
    fn into_tokio(self) -> Option<TcpStream> {
        match self {
            Moving::Here(stream) => Some(stream),
            Moving::Away(stream) => TcpStream::from_std(stream).ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cap_leaves_room_for_the_rest_of_the_process() {
        assert_eq!(default_max_connections(1_024), 768);
        assert_eq!(default_max_connections(100), 64);
        assert_eq!(default_max_connections(u64::MAX), 1_000_000);
    }
}
