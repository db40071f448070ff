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
//! - [`systemd`]: `READY=1` / `STOPPING=1` for a `Type=notify` unit.
//! - [`cluster`]: cluster mode on openraft (issue 28), being built: so far the Raft storage
//!   (log, state machine, snapshots) and the lease rules ([`cluster::lease`], pure), used only
//!   by their tests.
//! - [`cli`]: the operator's subcommands (`keys`, `events`, `guard`, ...), clients of a running
//!   server through `ttlwheel-client`.
//!
//! See `ARCHITECTURE.md` for the map and the invariants.

/// Declares the process's global allocator as the service binary has it: jemalloc by default,
/// with the settings built in (why: `src/main.rs`), mimalloc with the `alloc-mimalloc` feature,
/// the system's with neither. For the binary and for the benchmarks that measure what the
/// service pays. It expands in the caller, so the features and the allocator crates
/// (`tikv-jemallocator`, `mimalloc`) are the caller's: this package's binary and benches.
#[macro_export]
macro_rules! service_allocator {
    () => {
        #[cfg(all(feature = "alloc-jemalloc", not(feature = "alloc-mimalloc")))]
        #[global_allocator]
        static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
        #[cfg(feature = "alloc-mimalloc")]
        #[global_allocator]
        static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
    };
}

pub mod auth;
pub mod bulk;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod edge;
pub mod events;
pub mod expiry;
pub mod http;
pub mod metrics;
pub mod notify;
pub mod persist;
pub mod placement;
pub mod registry;
pub mod routes;
pub mod stream;
pub mod systemd;
pub mod ticker;
pub mod types;

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::time::Instant;

use config::Config;
use metrics::Metrics;
use notify::Notifier;
use persist::journal::FsyncMode;
use persist::store::DataDir;
use placement::Placement;
use registry::{Registry, RegistryConfig};
use stream::EventHub;
use types::Ttl;

/// The registry settings that `config` implies.
pub fn registry_config(config: &Config) -> RegistryConfig {
    RegistryConfig {
        max_ttl_s: config.max_ttl,
        expired_retention_ms: config.expired_retention.as_millis() as u64,
        expired_max: config.expired_max,
        max_keys: config.max_keys,
        guard: registry::GuardConfig {
            enabled: config.expiry_guard == config::Switch::On,
            threshold: config.expiry_guard_threshold,
            min_keys: config.expiry_guard_min_keys,
            window_ms: config.expiry_guard_window.as_millis() as u64,
            max_hold_ms: config.expiry_guard_max_hold.as_millis() as u64,
            release_over_ms: config.expiry_guard_release_over.as_millis() as u64,
        },
        ..RegistryConfig::default()
    }
}

/// The edge limits `config` implies; raises the open-files limit to size the connection cap.
fn edge_limits(config: &Config) -> edge::EdgeLimits {
    let open_files = edge::raise_open_files_limit();
    let max_connections = match config.max_connections {
        0 => edge::default_max_connections(open_files),
        max => max,
    };
    tracing::info!(
        open_files,
        max_connections,
        header_read_timeout = ?config.header_read_timeout,
        request_timeout = ?config.request_timeout,
        "connection capacity"
    );
    edge::EdgeLimits {
        max_connections,
        header_read_timeout: config.header_read_timeout,
        tls_handshake_timeout: config.tls_handshake_timeout,
        send_buffer: (config.socket_send_buffer > 0).then_some(config.socket_send_buffer as usize),
    }
}

/// The running service before it serves: registry, ticker, webhooks, stream and metrics, wired
/// together. [`run`] is `Service::start` then [`Service::serve`]; tests that need a handle on a
/// part (the metrics, say) call the two themselves.
pub struct Service {
    app: axum::Router,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    notifier: Arc<Notifier>,
    hub: Arc<EventHub>,
    /// The data directory, unless memory-only.
    data_dir: Option<Arc<DataDir>>,
    /// A cluster member's hold on its data directory (its lock: one process per directory,
    /// as for a single node); the Raft log inside is the member's own business.
    member_dir: Option<Arc<DataDir>>,
    /// Sending (or dropping) it stops the ticker (and the snapshots).
    stop_ticker: tokio::sync::watch::Sender<bool>,
    /// Recovery, then the ticker until stopped; an error if recovery failed.
    lifecycle: tokio::task::JoinHandle<Result<(), String>>,
    /// Resolves (with the error) if recovery fails, which stops the server.
    recovery_failed: Option<tokio::sync::oneshot::Receiver<String>>,
    /// The task that feeds the stream ring and the event counters.
    observer: tokio::task::JoinHandle<()>,
    edge_limits: edge::EdgeLimits,
    edge_stats: Arc<edge::EdgeStats>,
    /// Tokens, reloaded on SIGHUP; `None`: auth is off.
    auth: Option<Arc<auth::Auth>>,
    /// HTTPS, reloaded on SIGHUP and when its files change; `None`: plain HTTP.
    tls: Option<Arc<edge::tls::Tls>>,
    /// The runtimes connections and the ticker run on.
    placement: Placement,
    /// Set once recovery has finished (the key routes then serve): for systemd's `READY=1`.
    ready: Arc<std::sync::atomic::AtomicBool>,
    /// This member of a cluster (`--node-id`); `None`: a single node.
    cluster: Option<Arc<cluster::node::Cluster>>,
}

/// Records appended since the last snapshot that make the next one due, at least: the log then
/// holds at most about this many records beyond the state (about 60 bytes each for a creation),
/// or as many as the last snapshot's keys, whichever is more ([`snapshot_when_due`]).
pub const SNAPSHOT_AFTER_RECORDS: u64 = 1_000_000;

/// The snapshot writer's nice value: it reads every shard and writes the whole state, and on a
/// 2-core machine at nice 0 it took a core for 25 ms at a time from the serving threads.
const SNAPSHOT_NICE: i32 = 10;
/// How often the snapshot rule is looked at.
const SNAPSHOT_CHECK: std::time::Duration = std::time::Duration::from_secs(10);

/// The registry's bus, subscribed before anything is published: the webhooks' end (to the
/// kinds they send only, so that the dispatcher is not woken for the rest) and the stream's.
struct Subscriptions {
    webhooks: events::EventReceiver,
    stream: events::EventReceiver,
}

impl Subscriptions {
    fn of(registry: &Registry, config: &Config) -> Self {
        let webhook_kinds = events::Kinds::of(&config.webhook_settings().events);
        Self {
            webhooks: registry.subscribe_to(webhook_kinds),
            stream: registry.subscribe(),
        }
    }
}

impl Service {
    /// Builds every part from `config` and starts the background tasks (recovery from the data
    /// directory, then the ticker and snapshots; webhook delivery; the event feed), everything
    /// on the current runtime ([`Placement::shared`]). Must be called within a tokio runtime.
    /// Fails at once if the data directory is in use.
    pub fn start(config: &Config) -> std::io::Result<Self> {
        Self::start_on(config, Placement::shared())
    }

    /// [`Service::start`], with connections and the ticker on `placement`'s runtimes (the rest
    /// on the current one).
    pub fn start_on(config: &Config, placement: Placement) -> std::io::Result<Self> {
        let registry = Arc::new(Registry::new(registry_config(config), Instant::now()));
        let subscriptions = Subscriptions::of(&registry, config);
        Self::assemble(config, placement, registry, subscriptions, None)
    }

    /// [`Service::start_on`] for what `config` asks: a single node, or, with `--node-id`, a
    /// cluster member whose registry is fed by its Raft log (`api` is the address the API was
    /// bound to, advertised unless `--advertise-api` says otherwise).
    pub async fn start_member(
        config: &Config,
        placement: Placement,
        api: std::net::SocketAddr,
    ) -> std::io::Result<Self> {
        let invalid = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, why);
        let Some(mut settings) = config.cluster().map_err(invalid)? else {
            return Self::start_on(config, placement);
        };
        if config.advertise_api.is_none() {
            settings.advertise_api = format!("http://{api}");
        }
        let replicated = RegistryConfig {
            replicated: true,
            ..registry_config(config)
        };
        let registry = Arc::new(Registry::new(replicated, Instant::now()));
        let data_dir = settings
            .dir
            .parent()
            .expect("the Raft directory is in the data directory");
        let member_dir = Arc::new(DataDir::open(data_dir).map_err(std::io::Error::other)?);
        let founder = settings.initial.keys().next() == Some(&settings.node_id);
        let import = {
            let (dir, raft_dir, keys) = (
                Arc::clone(&member_dir),
                settings.dir.clone(),
                registry_config(config),
            );
            tokio::task::spawn_blocking(move || {
                cluster::upgrade::prepare(&dir, &raft_dir, founder, keys)
            })
            .await
            .map_err(std::io::Error::other)?
            .map_err(invalid)?
        };
        // Before the state machine applies anything: events of entries applied at start
        // (after the snapshot) reach the webhooks and the stream.
        let subscriptions = Subscriptions::of(&registry, config);
        let webhooks = Arc::new(notify::replicated::Replication::default());
        let member =
            cluster::node::Cluster::start(settings, Arc::clone(&registry), Arc::clone(&webhooks))
                .await
                .map_err(|error| std::io::Error::other(error.to_string()))?;
        let member = Arc::new(member);
        let mut service = Self::assemble(
            config,
            placement,
            registry,
            subscriptions,
            Some((Arc::clone(&member), webhooks)),
        )?;
        member.set_api(service.app.clone());
        if let Some(import) = import {
            tokio::spawn(cluster::upgrade::run(import, Arc::clone(&member)));
        }
        service.member_dir = Some(member_dir);
        Ok(service)
    }

    /// Builds every part around `registry` (`subscriptions` are its bus's, for the webhooks
    /// and the stream); `cluster`: this member's Raft feeds the registry and shares webhook
    /// delivery with the other members, and the single node's data directory is not used.
    fn assemble(
        config: &Config,
        placement: Placement,
        registry: Arc<Registry>,
        subscriptions: Subscriptions,
        cluster: Option<(
            Arc<cluster::node::Cluster>,
            Arc<notify::replicated::Replication>,
        )>,
    ) -> std::io::Result<Self> {
        let (cluster, webhooks) = cluster.unzip();
        let default_ttl = Ttl::from_secs(config.default_ttl)
            .map_err(|invalid| std::io::Error::new(std::io::ErrorKind::InvalidInput, invalid))?;
        let persistence = match config.persistence().filter(|_| cluster.is_none()) {
            Some((path, mode)) => Some((
                Arc::new(DataDir::open(path).map_err(std::io::Error::other)?),
                mode,
            )),
            None => None,
        };
        let notifier = Notifier::start(config.webhook_settings(), subscriptions.webhooks, webhooks)
            .map_err(|error| std::io::Error::other(error.to_string()))?;
        let hub = EventHub::new(
            config.events_ring as usize,
            usize::try_from(config.events_ring_bytes).unwrap_or(usize::MAX),
        );
        let hub = Arc::new(match &cluster {
            Some(member) => hub.numbered_by_log(member.events_complete_from()),
            None => hub,
        });
        let auth = match &config.auth_tokens {
            Some(path) => {
                let auth = auth::Auth::load(path).map_err(|error| {
                    std::io::Error::new(std::io::ErrorKind::InvalidInput, error.to_string())
                })?;
                tracing::info!(tokens = auth.tokens().len(), file = %path.display(), "auth on: tokens loaded");
                Some(Arc::new(auth))
            }
            None => None,
        };
        let tls = match (&config.tls_cert, &config.tls_key) {
            (Some(cert), Some(key)) => {
                let files = edge::tls::TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                    client_ca: config.tls_client_ca.clone(),
                };
                let tls = edge::tls::Tls::load(files).map_err(|error| {
                    std::io::Error::new(std::io::ErrorKind::InvalidInput, error)
                })?;
                tracing::info!(mtls = config.tls_client_ca.is_some(), "serving HTTPS");
                Some(Arc::new(tls))
            }
            _ => None,
        };
        let edge_limits = edge_limits(config);
        let edge_stats = Arc::new(edge::EdgeStats::default());
        let mut metrics = Metrics::new(metrics::Live {
            registry: Arc::clone(&registry),
            notifier: Arc::clone(&notifier),
            hub: Arc::clone(&hub),
            edge: Arc::clone(&edge_stats),
        });
        if let Some(member) = &cluster {
            metrics.add_collector(Box::new(member.metrics_collector()));
        }
        let metrics = Arc::new(metrics);
        let observer = tokio::spawn(stream::feed(subscriptions.stream, Arc::clone(&hub), {
            let metrics = Arc::clone(&metrics);
            move |event| metrics.observe(event)
        }));
        let ready = Arc::new(std::sync::atomic::AtomicBool::new(persistence.is_none()));
        let (stop_ticker, stopped) = tokio::sync::watch::channel(false);
        let (failed, recovery_failed) = tokio::sync::oneshot::channel();
        let lifecycle = placement.ticker().spawn(lifecycle(Lifecycle {
            registry: Arc::clone(&registry),
            notifier: Arc::clone(&notifier),
            persistence: persistence.clone(),
            ready: Arc::clone(&ready),
            metrics: Arc::clone(&metrics),
            stopped,
            failed,
            clustered: cluster.is_some(),
        }));
        let app = http::app(http::AppState::new(http::Shared {
            registry: Arc::clone(&registry),
            ready: Arc::clone(&ready),
            fsync_always: persistence
                .as_ref()
                .is_some_and(|(_, mode)| *mode == FsyncMode::Always),
            default_ttl,
            notifier: Arc::clone(&notifier),
            hub: Arc::clone(&hub),
            metrics: Arc::clone(&metrics),
            request_timeout: config.request_timeout,
            cluster: cluster.clone(),
            bulk: placement.bulk().cloned(),
            max_stream_clients: config.max_stream_clients,
            auth: http::auth::AuthState {
                auth: auth.clone(),
                public: auth::policy::PublicPaths {
                    healthz: config.auth_public.contains(&config::PublicPath::Healthz),
                    metrics: config.auth_public.contains(&config::PublicPath::Metrics),
                },
                secure_cookies: tls.is_some(),
                insecure: auth.is_none() && !config.listen.ip().is_loopback(),
            },
        }));
        Ok(Self {
            app,
            registry,
            metrics,
            notifier,
            hub,
            data_dir: persistence.map(|(dir, _)| dir),
            member_dir: None,
            stop_ticker,
            lifecycle,
            recovery_failed: Some(recovery_failed),
            observer,
            edge_limits,
            edge_stats,
            auth,
            tls,
            placement,
            ready,
            cluster,
        })
    }

    /// The flag set once recovery from the data directory has finished (at once without
    /// one): from then on the key routes serve (`main` tells systemd).
    pub fn ready_flag(&self) -> Arc<std::sync::atomic::AtomicBool> {
        Arc::clone(&self.ready)
    }

    /// The metrics the service records (tests read the requests it answered from them).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Serves the API on `listener` until `shutdown` resolves (or recovery fails): then stops
    /// accepting, finishes in-flight requests, stops the ticker, gives webhook deliveries up to
    /// the drain timeout, writes a snapshot and closes the log, and returns.
    pub async fn serve(
        mut self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let closing_hub = Arc::clone(&self.hub);
        let recovery_failed = self.recovery_failed.take().expect("serve runs once");
        let reloader = tokio::spawn(reload_on_hangup(self.auth.clone(), self.tls.clone()));
        let tls_watcher = self.tls.clone().map(|tls| tokio::spawn(tls.watch_files()));
        let served = edge::serve(
            listener,
            &self.placement,
            self.app,
            self.edge_limits,
            self.edge_stats,
            self.tls.clone(),
            async move {
                tokio::select! {
                    () = shutdown => {}
                    Ok(_) = recovery_failed => {}
                }
                // Event streams never end on their own; end them so in-flight requests can finish.
                closing_hub.close();
            },
        )
        .await;
        reloader.abort();
        if let Some(watcher) = tls_watcher {
            watcher.abort();
        }
        let _ = self.stop_ticker.send(true);
        let recovered = match self.lifecycle.await {
            Ok(result) => result,
            Err(panicked) => Err(format!("the ticker task failed: {panicked}")),
        };
        self.notifier.shutdown().await;
        self.observer.abort();
        if let Some(cluster) = &self.cluster {
            cluster.shutdown().await;
        }
        if let Err(error) = recovered {
            return Err(std::io::Error::other(error));
        }
        if let Some(dir) = self.data_dir {
            close_data_dir(self.registry, self.notifier, dir).await;
        }
        served
    }
}

/// Reloads what can change without a restart (the token file, the TLS files) on every SIGHUP;
/// a file that cannot be read or is invalid leaves the old one in force, with an error logged.
async fn reload_on_hangup(auth: Option<Arc<auth::Auth>>, tls: Option<Arc<edge::tls::Tls>>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hangups) = signal(SignalKind::hangup()) else {
            tracing::warn!("cannot listen for SIGHUP: reloading needs a restart");
            return;
        };
        while hangups.recv().await.is_some() {
            if let Some(tls) = &tls {
                match tls.reload() {
                    Ok(()) => tracing::info!(
                        "SIGHUP: the TLS certificate was reloaded for new connections"
                    ),
                    Err(error) => {
                        tracing::error!(%error, "SIGHUP: the TLS files cannot be used; the old certificate stays")
                    }
                }
            }
            if let Some(auth) = &auth {
                match auth.reload() {
                    Ok(tokens) => tracing::info!(tokens, "SIGHUP: the token file was reloaded"),
                    Err(error) => {
                        tracing::error!(%error, "SIGHUP: the token file cannot be used; the old tokens stay in force")
                    }
                }
            }
        }
    }
    #[cfg(not(unix))]
    let _ = (auth, tls);
}

/// What the lifecycle task needs.
struct Lifecycle {
    registry: Arc<Registry>,
    notifier: Arc<Notifier>,
    persistence: Option<(Arc<DataDir>, FsyncMode)>,
    ready: Arc<std::sync::atomic::AtomicBool>,
    metrics: Arc<Metrics>,
    stopped: tokio::sync::watch::Receiver<bool>,
    failed: tokio::sync::oneshot::Sender<String>,
    /// A cluster member: its keys change only by committed entries, so this member's ticker
    /// does not expire them itself (expiry proposals are the next step of issue 28).
    clustered: bool,
}

/// Recovers from the data directory (if any), then runs the ticker, and the snapshots, until
/// stopped. The ticker starts only once recovery is done, so a key that a later record
/// re-registers is never expired on the way.
async fn lifecycle(parts: Lifecycle) -> Result<(), String> {
    let Lifecycle {
        registry,
        notifier,
        persistence,
        ready,
        metrics,
        mut stopped,
        failed,
        clustered,
    } = parts;
    if let Some((dir, mode)) = &persistence {
        let recovered = tokio::task::spawn_blocking({
            let (registry, notifier) = (Arc::clone(&registry), Arc::clone(&notifier));
            let (dir, mode) = (Arc::clone(dir), *mode);
            move || recover(&registry, &notifier, &dir, mode)
        })
        .await
        .map_err(|panicked| panicked.to_string())
        .and_then(|result| result);
        if let Err(error) = recovered {
            tracing::error!(%error, "cannot recover from the data directory; stopping");
            let _ = failed.send(error.clone());
            return Err(error);
        }
        ready.store(true, std::sync::atomic::Ordering::Release);
    }
    if clustered {
        let _ = stopped.wait_for(|&stop| stop).await;
        return Ok(());
    }
    let mut stopped_for_ticker = stopped.clone();
    let ticker = ticker::run_timed(
        Arc::clone(&registry),
        move |took| metrics.observe_sweep(took),
        async move {
            // An error means the sender is gone, which also means: stop.
            let _ = stopped_for_ticker.wait_for(|&stop| stop).await;
        },
    );
    let mut stopped_for_watch = stopped.clone();
    let watch = ticker::watch_for_stalls(Arc::clone(&registry), async move {
        let _ = stopped_for_watch.wait_for(|&stop| stop).await;
    });
    let snapshots = async {
        let Some((dir, _)) = &persistence else {
            return std::future::pending().await;
        };
        snapshot_when_due(&registry, &notifier, dir).await
    };
    tokio::select! {
        () = ticker => {}
        () = watch => {}
        () = snapshots => {}
        _ = stopped.wait_for(|&stop| stop) => {}
    }
    // Whichever ended first, the watchdog no longer turns: its silence is no stall.
    registry.clock().stop_watching();
    Ok(())
}

/// Reads the data directory into the registry and the notifier, and attaches the journal to
/// both (blocking I/O).
fn recover(
    registry: &Registry,
    notifier: &Notifier,
    dir: &DataDir,
    mode: FsyncMode,
) -> Result<(), String> {
    let started = std::time::Instant::now();
    let restart = Instant::now();
    let mut webhooks = persist::webhooks::WebhookReplay::default();
    registry.defer_listing();
    let recovery = dir.recover(|record| {
        if record.is_webhook() {
            webhooks.apply(record);
        } else {
            registry.restore(record, restart);
        }
    });
    registry.rebuild_listing();
    let recovery = recovery.map_err(|error| error.to_string())?;
    notifier.restore(webhooks, restart);
    if let Some((path, offset, dropped)) = &recovery.torn {
        tracing::warn!(path = %path.display(), offset, dropped,
            "the log ended in a torn record (a crash mid-write): it was cut off there; nothing acknowledged with --fsync always is lost");
    }
    let journal = dir
        .open_journal(&recovery, mode)
        .map_err(|error| error.to_string())?;
    let journal = Arc::new(journal);
    registry.attach_journal(Arc::clone(&journal));
    notifier.attach_journal(journal);
    tracing::info!(
        keys = registry.len(),
        records = recovery.n_records,
        snapshot_lsn = recovery.snapshot.unwrap_or(0),
        took_ms = started.elapsed().as_millis() as u64,
        data_dir = %dir.path().display(),
        "recovered the registry from the data directory"
    );
    Ok(())
}

/// Writes a snapshot whenever the records appended since the last one reach
/// [`SNAPSHOT_AFTER_RECORDS`] or the number of keys the last one held, whichever is more, so
/// the log stays bounded by about the state's size (Redis rewrites its AOF when it has doubled,
/// for the same reason). A fixed count made growth quadratic: growing to 10M keys wrote ten
/// snapshots of 1M to 10M keys (55M records), now four (1M, 2M, 4M, 8M). Each is written on a
/// thread of its own at nice [`SNAPSHOT_NICE`].
async fn snapshot_when_due(registry: &Arc<Registry>, notifier: &Arc<Notifier>, dir: &Arc<DataDir>) {
    let mut last = registry.journal().map_or(0, |journal| journal.appended());
    let mut last_keys = registry.len() as u64;
    loop {
        tokio::time::sleep(SNAPSHOT_CHECK).await;
        let appended = registry.journal().map_or(0, |journal| journal.appended());
        if !snapshot_due(appended.saturating_sub(last), last_keys) {
            continue;
        }
        let (registry, notifier, dir) =
            (Arc::clone(registry), Arc::clone(notifier), Arc::clone(dir));
        let keys = registry.len() as u64;
        let snapshot = move || registry.snapshot(&dir, || notifier.durable_records());
        match on_own_thread("ttlwheel-snapshot", SNAPSHOT_NICE, snapshot).await {
            Some(Ok((lsn, size))) => {
                (last, last_keys) = (lsn, keys);
                tracing::info!(
                    lsn,
                    size,
                    keys,
                    "snapshot written; the log before it was removed"
                );
            }
            Some(Err(error)) => tracing::error!(%error, "cannot write a snapshot"),
            None => tracing::error!("the snapshot thread failed"),
        }
    }
}

/// The snapshot rule: `since` records appended since the last snapshot, which held `last_keys`.
fn snapshot_due(since: u64, last_keys: u64) -> bool {
    since >= SNAPSHOT_AFTER_RECORDS.max(last_keys)
}

/// Runs `job` on a new thread named `name` at nice `nice`; its result, or `None` if the thread
/// could not start or the job panicked.
async fn on_own_thread<T: Send + 'static>(
    name: &str,
    nice: i32,
    job: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (done, result) = tokio::sync::oneshot::channel();
    let started = std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            bulk::lower_priority(nice);
            let _ = done.send(job());
        });
    if let Err(error) = started {
        tracing::error!(%error, "cannot start a thread");
        return None;
    }
    result.await.ok()
}

/// On a clean stop: a snapshot (so the next start replays almost nothing), then the log closed.
async fn close_data_dir(registry: Arc<Registry>, notifier: Arc<Notifier>, dir: Arc<DataDir>) {
    let closed = tokio::task::spawn_blocking(move || {
        let snapshot = registry.snapshot(&dir, || notifier.durable_records());
        let closed = registry.journal().map(|journal| journal.close());
        (snapshot, closed)
    })
    .await;
    match closed {
        Ok((Ok((lsn, size)), Some(Ok(())) | None)) => {
            tracing::info!(lsn, size, "snapshot written at shutdown")
        }
        Ok((snapshot, closed)) => {
            if let Err(error) = snapshot {
                tracing::error!(%error, "cannot write the shutdown snapshot; the log has everything");
            }
            if let Some(Err(error)) = closed {
                tracing::error!(%error, "cannot close the log cleanly");
            }
        }
        Err(panicked) => tracing::error!(%panicked, "the shutdown snapshot failed"),
    }
}

/// Serves the API on `listener` until `shutdown` resolves (see [`Service::serve`]), everything
/// on the current runtime: the binary's default, `--serving per-core`, is
/// `Service::start_on(config, placement(config)?)`.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    Service::start(&config)?.serve(listener, shutdown).await
}

/// The placement `--serving` and `--threads` ask for: per-core with one serving thread per core
/// (or `--threads`), or everything on the current runtime.
pub fn placement(config: &Config) -> std::io::Result<Placement> {
    match config.serving {
        config::Serving::PerCore => Placement::per_core(config.serving_threads()),
        config::Serving::Shared => Ok(Placement::shared()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The log may grow to the state's size before a snapshot replaces it, and never needs
    /// fewer than `SNAPSHOT_AFTER_RECORDS` records: growing from empty to 10M keys writes
    /// snapshots of about 1M, 2M, 4M and 8M keys, not one per million records.
    #[test]
    fn a_snapshot_is_due_when_the_log_reaches_the_last_ones_size() {
        let million = SNAPSHOT_AFTER_RECORDS;
        assert!(!snapshot_due(million - 1, 0));
        assert!(snapshot_due(million, 0));
        assert!(snapshot_due(million, million / 2));
        assert!(!snapshot_due(million, 3 * million));
        assert!(snapshot_due(3 * million, 3 * million));
        let (mut keys, mut since, mut taken) = (0, 0, Vec::new());
        for _ in 0..10_000_000 / 100_000 {
            (keys, since) = (keys + 100_000, since + 100_000);
            if snapshot_due(since, taken.last().copied().unwrap_or(0)) {
                taken.push(keys);
                since = 0;
            }
        }
        assert_eq!(taken, [1_000_000, 2_000_000, 4_000_000, 8_000_000]);
    }
}
