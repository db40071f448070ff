//! One link: a listener on loopback whose connections are proxied to a target, and the handle a
//! test holds to set the link's faults and read its counters.
//!
//! Invariant: everything the link spawns belongs to its accept task (connections live in its
//! `JoinSet`), and that task ends when the handle is dropped or shut down, so a link leaks no
//! task, listener or socket past its handle.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};

use crate::conn;
use crate::fault::{Direction, Fault, FaultError, Faults};
use crate::stats::{Counters, LinkStats};

/// How long the accept loop rests after an accept error (out of file descriptors): long enough
/// not to spin, short enough not to matter to a test.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(10);

/// Why a link could not start.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The listening address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// Starts links. A link is one direction of a peer connection's *establishment*: whoever
/// connects to [`LinkHandle::addr`] reaches the target; bytes flow both ways.
pub struct Link;

impl Link {
    /// A link from a fresh port on 127.0.0.1 to `target`, passing traffic.
    pub async fn start(target: SocketAddr) -> Result<LinkHandle, LinkError> {
        Link::start_on(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), target).await
    }

    /// A link from `listen` to `target`, passing traffic.
    pub async fn start_on(listen: SocketAddr, target: SocketAddr) -> Result<LinkHandle, LinkError> {
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| LinkError::Bind {
                addr: listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| LinkError::Bind {
            addr: listen,
            source,
        })?;
        let (faults, faults_rx) = watch::channel(Faults::both(Fault::Pass));
        let counters = Arc::new(Counters::default());
        let (stop, stop_rx) = oneshot::channel();
        let task = tokio::spawn(accept_loop(
            listener,
            target,
            faults_rx,
            Arc::clone(&counters),
            stop_rx,
        ));
        Ok(LinkHandle {
            addr,
            target,
            faults,
            counters,
            stop: Some(stop),
            task: Some(task),
        })
    }
}

/// A running link. Dropping it stops the link: the listener closes and every connection's task
/// is aborted (its sockets close); [`LinkHandle::shutdown`] does the same and waits for it.
pub struct LinkHandle {
    /// Where the link listens.
    addr: SocketAddr,
    /// Where it connects.
    target: SocketAddr,
    /// The faults of each direction, watched by the accept loop and every connection.
    faults: watch::Sender<Faults>,
    /// The counters the link's tasks update.
    counters: Arc<Counters>,
    /// Tells the accept loop to stop (dropping it does too).
    stop: Option<oneshot::Sender<()>>,
    /// The accept loop, which owns every connection task.
    task: Option<JoinHandle<()>>,
}

impl LinkHandle {
    /// The address to connect to instead of the target.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The target.
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// Applies `fault` in both directions, to open connections and new ones.
    pub fn set(&self, fault: Fault) {
        self.faults.send_replace(Faults::both(fault));
    }

    /// Applies `fault` in one direction only, leaving the other as it is (or passing, if the
    /// link was cut). `Fault::Cut` is refused: a connection cannot be cut one way.
    pub fn set_one_way(&self, direction: Direction, fault: Fault) -> Result<(), FaultError> {
        let next = self.faults.borrow().with_one_way(direction, fault)?;
        self.faults.send_replace(next);
        Ok(())
    }

    /// Both directions pass again. Connections that lost bytes to a blackhole are reset;
    /// stalled ones deliver what waited; new connections reach the target.
    pub fn heal(&self) {
        self.set(Fault::Pass);
    }

    /// The faults in force.
    pub fn faults(&self) -> Faults {
        *self.faults.borrow()
    }

    /// The counters now.
    pub fn stats(&self) -> LinkStats {
        self.counters.snapshot()
    }

    /// Waits until `done` holds for the counters (e.g. `|s| s.open == 0`), and returns them.
    /// Bound it with `tokio::time::timeout` in a test.
    pub async fn wait_until(&self, done: impl Fn(&LinkStats) -> bool) -> LinkStats {
        self.counters.wait_until(done).await
    }

    /// Stops the link and returns once its listener and every connection are closed.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for LinkHandle {
    fn drop(&mut self) {
        // Dropping `stop` ends the accept loop, which aborts its connections. Abort it too, in
        // case the runtime is going away and would not poll it again.
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Accepts connections until told to stop: each is reset at once while the link is cut, and
/// otherwise served on its own task in `connections`. On stop, every connection task is
/// aborted and awaited, so their sockets are closed when this returns.
async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    faults: watch::Receiver<Faults>,
    counters: Arc<Counters>,
    mut stop: oneshot::Receiver<()>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    counters.accepted();
                    if faults.borrow().is_cut() {
                        let _ = socket2::SockRef::from(&client).set_linger(Some(Duration::ZERO));
                        counters.reset();
                        continue;
                    }
                    connections.spawn(conn::serve(
                        client,
                        target,
                        faults.clone(),
                        Arc::clone(&counters),
                    ));
                }
                Err(_) => tokio::time::sleep(ACCEPT_ERROR_PAUSE).await,
            },
            // Reap finished connections so the set holds only live ones.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    connections.shutdown().await;
}
