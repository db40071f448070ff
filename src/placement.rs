//! Where the service's work runs: the threads and tokio runtimes behind `--serving`.
//!
//! - **Per-core** ([`Placement::per_core`], `--serving per-core`, the binary's default): `N`
//!   serving threads, each a current-thread runtime of its own. The edge accepts on the caller's
//!   runtime and hands each connection, round robin, to one serving thread, which serves it for
//!   its whole life. The ticker (sweeps, the stall watchdog, snapshots) gets a thread of its own.
//!   The caller's runtime keeps everything else: accepting, webhook delivery, the stream feed,
//!   reloads. Large batches are applied on `N` bulk threads ([`Bulk`]), so that the serving
//!   threads' event loops stay free for single heartbeats.
//! - **Shared** ([`Placement::shared`], `--serving shared`, and every in-process embedding, the
//!   tests included): everything runs on the caller's runtime, so paused time reaches it all;
//!   batches too, in chunks between yields.
//!
//! Why per-core is the default (BENCHMARKS.md, "Serving mode"): a connection's requests never
//! move between threads, so no work-stealing and no cross-thread wake-ups on the request path;
//! and a mass expiry's webhook work runs on other threads than requests, where the kernel's
//! scheduler shares the cores between them instead of one event loop making requests wait behind
//! a batch. The ticker's own thread keeps sweeps on time while webhooks are busy.
//!
//! Invariant: the serving and ticker threads run until the `Placement` is dropped, and only share
//! state through `Arc`s (the registry's shard locks are the only lock a heartbeat takes).

use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

use crate::bulk::Bulk;

/// The runtimes the service's parts are spawned on.
pub struct Placement {
    /// Connections are spread over these, round robin.
    serving: Vec<Handle>,
    /// The ticker, the stall watchdog and the snapshots.
    ticker: Handle,
    /// The threads this placement started; empty when shared.
    threads: Vec<RuntimeThread>,
    /// Where large batches are applied; `None`: on the serving runtime.
    bulk: Option<Arc<Bulk>>,
}

impl Placement {
    /// Everything on the current runtime. Panics outside a runtime.
    pub fn shared() -> Self {
        let current = Handle::current();
        Self {
            serving: vec![current.clone()],
            ticker: current,
            threads: Vec::new(),
            bulk: None,
        }
    }

    /// `serving_threads` threads serving connections (at least one), and one for the ticker.
    pub fn per_core(serving_threads: usize) -> io::Result<Self> {
        let mut threads = Vec::with_capacity(serving_threads.max(1) + 1);
        for index in 0..serving_threads.max(1) {
            threads.push(RuntimeThread::start(format!("ttlwheel-serve-{index}"))?);
        }
        let ticker = RuntimeThread::start("ttlwheel-ticker".to_owned())?;
        let serving = threads.iter().map(|thread| thread.handle.clone()).collect();
        let ticker_handle = ticker.handle.clone();
        threads.push(ticker);
        Ok(Self {
            serving,
            ticker: ticker_handle,
            threads,
            bulk: Some(Arc::new(Bulk::start(serving_threads.max(1))?)),
        })
    }

    /// The runtimes that serve connections (never empty).
    pub fn serving(&self) -> &[Handle] {
        &self.serving
    }

    /// The runtime that runs the ticker.
    pub fn ticker(&self) -> &Handle {
        &self.ticker
    }

    /// The bulk threads large batches are applied on, if this placement has them.
    pub fn bulk(&self) -> Option<&Arc<Bulk>> {
        self.bulk.as_ref()
    }

    /// Whether connections are served on threads of their own (rather than the caller's).
    pub fn is_per_core(&self) -> bool {
        !self.threads.is_empty()
    }
}

/// A thread running a current-thread runtime until told to stop.
struct RuntimeThread {
    handle: Handle,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl RuntimeThread {
    fn start(name: String) -> io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            // Either a stop or the sender dropped: both mean stop. Tasks still spawned on the
            // runtime are dropped with it.
            let _ = runtime.block_on(stopped);
        })?;
        Ok(Self {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for RuntimeThread {
    /// Tells the thread to stop and waits for it, unless that would be this very thread.
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn per_core_runs_each_part_on_its_own_named_thread() {
        let placement = Placement::per_core(2).unwrap();
        assert!(placement.is_per_core());
        let mut names = Vec::new();
        for handle in placement.serving().iter().chain([placement.ticker()]) {
            let name = handle
                .spawn(async { std::thread::current().name().map(str::to_owned) })
                .await
                .unwrap();
            names.push(name.unwrap());
        }
        assert_eq!(
            names,
            ["ttlwheel-serve-0", "ttlwheel-serve-1", "ttlwheel-ticker"]
        );
    }

    #[tokio::test]
    async fn shared_runs_everything_on_the_callers_runtime() {
        let placement = Placement::shared();
        assert!(!placement.is_per_core());
        assert_eq!(placement.serving().len(), 1);
        let caller = std::thread::current().id();
        for handle in [&placement.serving()[0], placement.ticker()] {
            let thread = handle.spawn(async { std::thread::current().id() });
            assert_eq!(thread.await.unwrap(), caller);
        }
    }

    #[test]
    fn dropping_a_per_core_placement_stops_its_threads() {
        let placement = Placement::per_core(1).unwrap();
        let serving = placement.serving()[0].clone();
        drop(placement);
        // The runtime is gone with its thread: spawning on it now fails to run the task.
        let task = serving.spawn(async {});
        let outcome = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(task);
        assert!(outcome.unwrap_err().is_cancelled());
    }
}
