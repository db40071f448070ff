//! ttlwheel: a small, fast liveness service.
//!
//! Services send heartbeats with a TTL; a key that misses its TTL expires, drops out of the
//! liveness lists, and subscribers (webhooks, streams) are told.
//!
//! # Layout
//! - [`types`]: validated inputs (`Key`, `ServiceName`, `Ttl`, `Meta`) and their limits.
//! - [`expiry`]: the timer structures, pure: [`expiry::wheel::TimingWheel`] (whole seconds up to
//!   `max_ttl`, O(1)) and [`expiry::heap::DeadlineHeap`] (everything else, O(log n)).
//! - [`registry`]: keys, metadata and which timer holds each; the only door to the timers.
//! - [`ticker`]: the task that owns time and sweeps what is due.
//! - [`events`]: expiry and deletion events and their fan-out.
//! - [`notify`]: webhook delivery of those events: signed, retried, bounded.
//! - [`stream`]: the ring of recent events behind the live stream (`GET /v1/events`).
//! - [`metrics`]: Prometheus metrics (`GET /metrics`).
//! - [`routes`]: the table of every route, by name, that `http` and `metrics` both read.
//! - [`clock`]: monotonic epoch milliseconds and their display as wall time.
//!
//! See `ARCHITECTURE.md` for the map and the invariants.

pub mod clock;
pub mod config;
pub mod events;
pub mod expiry;
pub mod http;
pub mod metrics;
pub mod notify;
pub mod persist;
pub mod registry;
pub mod routes;
pub mod stream;
pub mod ticker;
pub mod types;

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::time::Instant;

use config::Config;
use metrics::Metrics;
use notify::Notifier;
use registry::{Registry, RegistryConfig};
use stream::EventHub;
use types::Ttl;

/// The registry settings that `config` implies.
pub fn registry_config(config: &Config) -> RegistryConfig {
    RegistryConfig {
        max_ttl_s: config.max_ttl,
        expired_retention_ms: config.expired_retention.as_millis() as u64,
        expired_max: config.expired_max,
        ..RegistryConfig::default()
    }
}

/// The running service before it serves: registry, ticker, webhooks, stream and metrics, wired
/// together. [`run`] is `Service::start` then [`Service::serve`]; tests that need a handle on a
/// part (the metrics, say) call the two themselves.
pub struct Service {
    app: axum::Router,
    metrics: Arc<Metrics>,
    notifier: Arc<Notifier>,
    hub: Arc<EventHub>,
    /// Sending (or dropping) it stops the ticker.
    stop_ticker: tokio::sync::oneshot::Sender<()>,
    ticker: tokio::task::JoinHandle<()>,
    /// The task that feeds the stream ring and the event counters.
    observer: tokio::task::JoinHandle<()>,
}

impl Service {
    /// Builds every part from `config` and starts the background tasks (ticker, webhook
    /// delivery, event feed). Must be called within a tokio runtime.
    pub fn start(config: &Config) -> std::io::Result<Self> {
        let registry = Arc::new(Registry::new(registry_config(config), Instant::now()));
        let default_ttl = Ttl::from_secs(config.default_ttl)
            .map_err(|invalid| std::io::Error::new(std::io::ErrorKind::InvalidInput, invalid))?;
        let notifier = Notifier::start(config.webhook_settings(), registry.subscribe())
            .map_err(|error| std::io::Error::other(error.to_string()))?;
        let hub = Arc::new(EventHub::new(config.events_ring as usize));
        let metrics = Arc::new(Metrics::new(metrics::Live {
            registry: Arc::clone(&registry),
            notifier: Arc::clone(&notifier),
            hub: Arc::clone(&hub),
        }));
        let observer = tokio::spawn(stream::feed(registry.subscribe(), Arc::clone(&hub), {
            let metrics = Arc::clone(&metrics);
            move |event| metrics.observe(event)
        }));
        let (stop_ticker, ticker_stopped) = tokio::sync::oneshot::channel::<()>();
        let ticker = tokio::spawn(ticker::run_timed(
            Arc::clone(&registry),
            {
                let metrics = Arc::clone(&metrics);
                move |took| metrics.observe_sweep(took)
            },
            async {
                // An error means the sender is gone, which also means: stop.
                let _ = ticker_stopped.await;
            },
        ));
        let app = http::app(http::AppState::new(http::Shared {
            registry,
            default_ttl,
            notifier: Arc::clone(&notifier),
            hub: Arc::clone(&hub),
            metrics: Arc::clone(&metrics),
        }));
        Ok(Self {
            app,
            metrics,
            notifier,
            hub,
            stop_ticker,
            ticker,
            observer,
        })
    }

    /// The metrics the service records (tests read the requests it answered from them).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Serves the API on `listener` until `shutdown` resolves: then stops accepting, finishes
    /// in-flight requests, stops the ticker, gives webhook deliveries up to the drain timeout,
    /// and returns.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let closing_hub = Arc::clone(&self.hub);
        let served = axum::serve(listener, self.app)
            .with_graceful_shutdown(async move {
                shutdown.await;
                // Event streams never end on their own; end them so in-flight requests can finish.
                closing_hub.close();
            })
            .await;
        let _ = self.stop_ticker.send(());
        if let Err(panicked) = self.ticker.await {
            tracing::error!(%panicked, "the ticker task failed");
        }
        self.notifier.shutdown().await;
        self.observer.abort();
        served
    }
}

/// Serves the API on `listener` until `shutdown` resolves (see [`Service::serve`]).
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    Service::start(&config)?.serve(listener, shutdown).await
}
