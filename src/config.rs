//! Command-line flags, each also an environment variable `TTLWHEEL_<NAME>`.
//!
//! Bad values fail at start-up with clap's message and a non-zero exit; nothing is re-validated
//! later.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use reqwest::Url;

use crate::events::EventKind;
use crate::notify::signing::WebhookSecret;
use crate::notify::Settings;

use crate::types::MAX_TTL_MS;

/// Largest `--max-ttl`: one day. The wheel keeps `max_ttl + 2` buckets per shard; longer TTLs
/// still work, on the heap.
pub const MAX_WHEEL_TTL_S: u32 = 86_400;

/// How the service logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// ttlwheel's configuration.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "ttlwheel",
    version,
    about = "A small, fast liveness service: heartbeats with TTLs, expiry, liveness lists."
)]
pub struct Config {
    /// Address to listen on.
    #[arg(long, env = "TTLWHEEL_LISTEN", default_value = "127.0.0.1:7878")]
    pub listen: SocketAddr,

    /// How requests are served. `per-core`: each connection is served, for its whole life, by
    /// one of `--threads` serving threads (each an event loop of its own); the ticker has a
    /// thread of its own and webhook delivery runs beside them. `shared`: one work-stealing
    /// runtime of `--threads` workers runs everything (`--threads 1`: one event loop, as Redis).
    #[arg(long, env = "TTLWHEEL_SERVING", value_enum, default_value_t = Serving::PerCore)]
    pub serving: Serving,

    /// Threads that serve requests (0: one per core). With `--serving shared`, the runtime's
    /// worker threads, which also run the ticker and webhook delivery.
    #[arg(long, env = "TTLWHEEL_THREADS", default_value_t = 0,
          value_parser = clap::value_parser!(u16).range(0..=1024))]
    pub threads: u16,

    /// Longest TTL, in seconds, held by the per-second timing wheel (1..=86400). Whole-second
    /// TTLs up to it are O(1); any other TTL (up to 365 days) goes to the heap.
    #[arg(long, env = "TTLWHEEL_MAX_TTL", default_value_t = 3600,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_WHEEL_TTL_S)))]
    pub max_ttl: u32,

    /// TTL, in seconds, of a heartbeat that gives none (1..=31536000).
    #[arg(long, env = "TTLWHEEL_DEFAULT_TTL", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=MAX_TTL_MS / 1000))]
    pub default_ttl: u64,

    /// How long expired keys stay listable (`GET /v1/keys?state=expired`), e.g. `1h`, `15m`.
    #[arg(long, env = "TTLWHEEL_EXPIRED_RETENTION", default_value = "1h", value_parser = humantime::parse_duration)]
    pub expired_retention: Duration,

    /// How many expired keys stay listable at most; the oldest are dropped first.
    #[arg(long, env = "TTLWHEEL_EXPIRED_MAX", default_value_t = 100_000)]
    pub expired_max: usize,

    /// URL to POST each event to (http or https); repeat the flag, or separate URLs with commas
    /// in the environment variable. Every URL gets every event.
    #[arg(long = "webhook-url", env = "TTLWHEEL_WEBHOOK_URL", value_name = "URL",
          value_delimiter = ',', value_parser = parse_webhook_url)]
    pub webhook_urls: Vec<Url>,

    /// Standard Webhooks signing secret: `whsec_` + base64 of 24 to 64 random bytes. Without it,
    /// webhooks are sent unsigned. Prefer the environment variable: flags show in `ps`.
    #[arg(
        long,
        env = "TTLWHEEL_WEBHOOK_SECRET",
        hide_env_values = true,
        value_name = "whsec_...",
        value_parser = SecretParser
    )]
    pub webhook_secret: Option<WebhookSecret>,

    /// Which events are sent to webhooks, comma-separated.
    #[arg(
        long,
        env = "TTLWHEEL_WEBHOOK_EVENTS",
        value_enum,
        value_delimiter = ',',
        default_value = "expired"
    )]
    pub webhook_events: Vec<WebhookEvent>,

    /// Time limit of one delivery attempt: connect, send, and read the answer (e.g. `10s`).
    #[arg(long, env = "TTLWHEEL_WEBHOOK_TIMEOUT", default_value = "10s",
          value_parser = parse_positive_duration)]
    pub webhook_timeout: Duration,

    /// Delivery attempts in flight per URL (1..=1024).
    #[arg(long, env = "TTLWHEEL_WEBHOOK_CONCURRENCY", default_value_t = 16,
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub webhook_concurrency: u16,

    /// Most events per webhook request (1..=1000). 1 (the default) sends each event as its
    /// own signed request; above 1, one signed request carries up to this many events of one
    /// URL as `{"type": "batch", ...}` (see README, "Batched webhooks"), and a failed batch is
    /// retried whole under the same `webhook-id`.
    #[arg(long, env = "TTLWHEEL_WEBHOOK_BATCH_MAX", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub webhook_batch_max: u16,

    /// Attempts per event before it becomes a dead letter (1..=100).
    #[arg(long, env = "TTLWHEEL_WEBHOOK_MAX_ATTEMPTS", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub webhook_max_attempts: u32,

    /// Waits between attempts, comma-separated; the last one repeats. Each wait is jittered by
    /// up to 20% either way; a 429 or 503 with `Retry-After` sets the wait instead (at most 1h).
    #[arg(long, env = "TTLWHEEL_WEBHOOK_RETRY_SCHEDULE", value_delimiter = ',',
          default_value = crate::notify::backoff::DEFAULT_SCHEDULE, value_parser = parse_positive_duration)]
    pub webhook_retry_schedule: Vec<Duration>,

    /// Events held per URL at most (pending, retrying and in flight). Past it, new events for
    /// that URL are dropped and counted (`dropped.queue_full` in `GET /v1/webhooks`).
    #[arg(long, env = "TTLWHEEL_WEBHOOK_QUEUE_MAX", default_value_t = 1_000_000,
          value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub webhook_queue_max: u64,

    /// Undeliverable events kept for `GET /v1/webhooks/dead-letters`; the newest are kept.
    #[arg(
        long,
        env = "TTLWHEEL_WEBHOOK_DEAD_LETTERS_MAX",
        default_value_t = 10_000
    )]
    pub webhook_dead_letters_max: usize,

    /// How long shutdown waits for held webhook events to be delivered.
    #[arg(long, env = "TTLWHEEL_WEBHOOK_DRAIN_TIMEOUT", default_value = "10s",
          value_parser = humantime::parse_duration)]
    pub webhook_drain_timeout: Duration,

    /// Events kept for the live stream (`GET /v1/events`): a client resuming with
    /// `Last-Event-ID` gets what it missed if it is still in this ring, else a `reset` event; a
    /// client that falls this far behind is dropped.
    #[arg(long, env = "TTLWHEEL_EVENTS_RING", default_value_t = crate::stream::DEFAULT_RING,
          value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub events_ring: u64,

    /// Bytes the live stream's ring may hold (its blocks of events and their encoded frames;
    /// `ttlwheel_sse_ring_bytes` in `/metrics`): the oldest events leave first when either this
    /// or `--events-ring` is reached.
    #[arg(long, env = "TTLWHEEL_EVENTS_RING_BYTES", default_value_t = crate::stream::DEFAULT_RING_BYTES,
          value_parser = clap::value_parser!(u64).range(65_536..=1 << 40))]
    pub events_ring_bytes: u64,

    /// Log format.
    #[arg(long, env = "TTLWHEEL_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// Where keys are persisted (a log and snapshots, see the README's "Persistence and
    /// restarts"); created if missing, and owned by one process at a time. An empty value is
    /// `--ephemeral`.
    #[arg(long, env = "TTLWHEEL_DATA_DIR", default_value = "ttlwheel-data")]
    pub data_dir: std::path::PathBuf,

    /// Keep everything in memory only, as before persistence: a restart forgets every key.
    /// For tests and benchmarks.
    #[arg(long, env = "TTLWHEEL_EPHEMERAL")]
    pub ephemeral: bool,

    /// When the log is synced to disk: `always` (a change is answered once it is on disk;
    /// concurrent requests share a sync), `interval` (every `--fsync-interval`: a crash loses
    /// at most that window, a clean stop nothing), `never` (the operating system decides).
    #[arg(long, env = "TTLWHEEL_FSYNC", value_enum, default_value = "interval")]
    pub fsync: FsyncPolicy,

    /// The sync period of `--fsync interval`, e.g. `100ms`, `1s`.
    #[arg(long, env = "TTLWHEEL_FSYNC_INTERVAL", default_value = "100ms",
          value_parser = parse_positive_duration)]
    pub fsync_interval: Duration,

    /// The mass-expiry guard (see the README's "Protection against false deaths"): `on` holds
    /// due keys instead of expiring them when a large share of the fleet would expire at once;
    /// `off` never trips by itself (an operator can still engage it).
    #[arg(long, env = "TTLWHEEL_EXPIRY_GUARD", value_enum, default_value = "on")]
    pub expiry_guard: Switch,

    /// The share of alive keys (0-1, exclusive of 0) whose expiry within a window trips the guard.
    #[arg(long, env = "TTLWHEEL_EXPIRY_GUARD_THRESHOLD", default_value_t = 0.3,
          value_parser = parse_share)]
    pub expiry_guard_threshold: f64,

    /// Fewer expiries than this within a window never trip the guard.
    #[arg(long, env = "TTLWHEEL_EXPIRY_GUARD_MIN_KEYS", default_value_t = 100)]
    pub expiry_guard_min_keys: u64,

    /// The window the guard counts expiries over.
    #[arg(long, env = "TTLWHEEL_EXPIRY_GUARD_WINDOW", default_value = "10s",
          value_parser = parse_positive_duration)]
    pub expiry_guard_window: Duration,

    /// The longest the guard holds: then held keys are released by themselves.
    #[arg(long, env = "TTLWHEEL_EXPIRY_GUARD_MAX_HOLD", default_value = "2m",
          value_parser = parse_positive_duration)]
    pub expiry_guard_max_hold: Duration,

    /// Held keys are released (expired) at a rate that empties the hold within this long, so
    /// webhook receivers are not flooded.
    #[arg(long, env = "TTLWHEEL_EXPIRY_GUARD_RELEASE_OVER", default_value = "10s",
          value_parser = parse_positive_duration)]
    pub expiry_guard_release_over: Duration,

    /// The most keys the registry holds: past it, a heartbeat that would create a key gets 429
    /// `too_many_keys` (renewals of existing keys go on). See the README's sizing guidance.
    #[arg(long, env = "TTLWHEEL_MAX_KEYS", default_value_t = 50_000_000,
          value_parser = clap::value_parser!(u64).range(1..=4_000_000_000))]
    pub max_keys: u64,

    /// Most client connections open at once; past it new ones wait in the kernel's backlog.
    /// 0: what the open-files limit allows (raised to its hard limit at start) less 256.
    #[arg(long, env = "TTLWHEEL_MAX_CONNECTIONS", default_value_t = 0)]
    pub max_connections: usize,

    /// A request head must arrive within this long of when the server starts waiting for one:
    /// after connecting (slow or half-sent headers) and after each response (idle keep-alive).
    #[arg(long, env = "TTLWHEEL_HEADER_READ_TIMEOUT", default_value = "30s",
          value_parser = parse_positive_duration)]
    pub header_read_timeout: Duration,

    /// A request (its body included) must be answered within this long, or it gets 408
    /// `request_timeout` (a body sent slowly is cut off). The live stream's events are not
    /// counted: only the time to its first byte.
    #[arg(long, env = "TTLWHEEL_REQUEST_TIMEOUT", default_value = "30s",
          value_parser = parse_positive_duration)]
    pub request_timeout: Duration,

    /// Each connection's kernel send buffer (SO_SNDBUF) in bytes, which Linux doubles; 0 leaves
    /// it to the kernel's autotuning. Why a fixed size: with autotuning, an event-stream client
    /// that stops reading holds up to ~2 MB of events in the kernel, all copied before the
    /// server sees it is stuck (1,000 such clients: 2 GB); API responses are small.
    #[arg(long, env = "TTLWHEEL_SOCKET_SEND_BUFFER", default_value_t = 65_536)]
    pub socket_send_buffer: u32,

    /// Most `GET /v1/events` clients at once; past it 429 `too_many_stream_clients`.
    #[arg(long, env = "TTLWHEEL_MAX_STREAM_CLIENTS", default_value_t = 1_000)]
    pub max_stream_clients: usize,

    /// The token file (JSON; see the README's "Security"): with it every route but the
    /// dashboard page, the API document and `--auth-public` needs a token with the right scope.
    /// SIGHUP reloads it. Without it ttlwheel serves only on a loopback address.
    #[arg(long, env = "TTLWHEEL_AUTH_TOKENS", value_name = "FILE")]
    pub auth_tokens: Option<std::path::PathBuf>,

    /// Routes left open when tokens are on (comma-separated): `healthz` (probes), `metrics`
    /// (scrapers); `none` for neither.
    #[arg(
        long,
        env = "TTLWHEEL_AUTH_PUBLIC",
        value_enum,
        value_delimiter = ',',
        default_value = "healthz"
    )]
    pub auth_public: Vec<PublicPath>,

    /// A PEM certificate chain: serve HTTPS (with `--tls-key`). Reloaded on SIGHUP and when
    /// the file changes.
    #[arg(
        long,
        env = "TTLWHEEL_TLS_CERT",
        value_name = "PEM",
        requires = "tls_key"
    )]
    pub tls_cert: Option<std::path::PathBuf>,

    /// The PEM private key of `--tls-cert`.
    #[arg(
        long,
        env = "TTLWHEEL_TLS_KEY",
        value_name = "PEM",
        requires = "tls_cert"
    )]
    pub tls_key: Option<std::path::PathBuf>,

    /// PEM CA certificates: clients must present a certificate one of them signed (mTLS).
    #[arg(
        long,
        env = "TTLWHEEL_TLS_CLIENT_CA",
        value_name = "PEM",
        requires = "tls_cert"
    )]
    pub tls_client_ca: Option<std::path::PathBuf>,

    /// A TLS handshake must finish within this long.
    #[arg(long, env = "TTLWHEEL_TLS_HANDSHAKE_TIMEOUT", default_value = "10s",
          value_parser = parse_positive_duration)]
    pub tls_handshake_timeout: Duration,

    /// Serve without tokens on a non-loopback address (anyone who can reach the port can do
    /// anything): a warning at start and in `/healthz`.
    #[arg(long, env = "TTLWHEEL_INSECURE_NO_AUTH")]
    pub insecure_no_auth: bool,

    /// Cluster mode (README, "A cluster"): this member's id, 1 or more. Without it, a single
    /// node, and the cluster flags below are not read.
    #[arg(long, env = "TTLWHEEL_NODE_ID", value_parser = clap::value_parser!(u64).range(1..),
          help_heading = "Cluster")]
    pub node_id: Option<u64>,

    /// Where this member listens for its peers (its own port, not the API's), e.g.
    /// `127.0.0.1:7879`.
    #[arg(
        long,
        env = "TTLWHEEL_CLUSTER_LISTEN",
        requires = "node_id",
        help_heading = "Cluster"
    )]
    pub cluster_listen: Option<SocketAddr>,

    /// The founding voters' peer addresses, the same string on each:
    /// `1=HOST:PORT,2=HOST:PORT,3=HOST:PORT`. Read only while the data directory holds no
    /// cluster yet.
    #[arg(long, env = "TTLWHEEL_INITIAL_CLUSTER", requires = "node_id",
          value_parser = parse_initial_cluster, help_heading = "Cluster")]
    pub initial_cluster: Option<std::collections::BTreeMap<u64, String>>,

    /// How peers and clients reach this member's API (default: `http://` and `--listen`).
    #[arg(
        long,
        env = "TTLWHEEL_ADVERTISE_API",
        requires = "node_id",
        help_heading = "Cluster"
    )]
    pub advertise_api: Option<String>,

    /// The secret every peer request is signed with (HMAC-SHA256); the same on every member.
    /// Required unless `--cluster-listen` is a loopback address.
    #[arg(
        long,
        env = "TTLWHEEL_CLUSTER_SECRET",
        hide_env_values = true,
        requires = "node_id",
        help_heading = "Cluster"
    )]
    pub cluster_secret: Option<String>,

    /// Join an existing cluster through any member's API URL: this member asks to be added
    /// as a learner, catches up (a snapshot, then the log), and asks to become a voter once
    /// caught up (unless --learner). Read on every start; a member already in the cluster is
    /// not added twice. With tokens on, TTLWHEEL_TOKEN (an admin token) is sent.
    #[arg(
        long,
        env = "TTLWHEEL_JOIN",
        requires = "node_id",
        conflicts_with = "initial_cluster",
        help_heading = "Cluster"
    )]
    pub join: Option<String>,

    /// With --join: stay a learner (receives the log, serves stale reads, never votes).
    #[arg(
        long,
        env = "TTLWHEEL_LEARNER",
        requires = "join",
        help_heading = "Cluster"
    )]
    pub learner: bool,

    /// The admin token --join sends (prefer the environment variable: flags show in `ps`).
    #[arg(
        long,
        env = "TTLWHEEL_TOKEN",
        hide_env_values = true,
        help_heading = "Cluster"
    )]
    pub join_token: Option<String>,

    /// Reach peer ID at HOST:PORT instead of the peer address in the membership (a sidecar, a
    /// NAT, a test's fault proxy): `ID=HOST:PORT`, repeatable or comma-separated.
    #[arg(long, env = "TTLWHEEL_PEER_ROUTES", value_delimiter = ',', requires = "node_id",
          value_parser = parse_peer_route, help_heading = "Cluster")]
    pub peer_route: Vec<(u64, String)>,

    /// How often the leader writes a deadline checkpoint (the keys renewed since the last one,
    /// with their time left) into the log: what a new leader counts from after a failover.
    /// At most half of the election timeout's minimum (200ms).
    #[arg(long, env = "TTLWHEEL_CHECKPOINT_INTERVAL", default_value = "200ms",
          value_parser = parse_positive_duration, requires = "node_id", help_heading = "Cluster")]
    pub checkpoint_interval: Duration,

    /// After a failover, the least time a new leader gives a key that fell due during the
    /// election (capped by the key's TTL), for its client to reach the new leader. Bounds how
    /// much longer a dead client's key can live. At least the election timeout's maximum (800ms).
    #[arg(long, env = "TTLWHEEL_FAILOVER_GRACE", default_value = "5s",
          value_parser = parse_positive_duration, requires = "node_id", help_heading = "Cluster")]
    pub failover_grace: Duration,

    /// The least time a follower waits, after it last heard from the leader, before it may
    /// call an election (openraft's `election_timeout_min`; the maximum is twice it). In
    /// openraft 0.9 a follower that has known a leader calls an election the maximum plus a
    /// random time in [min, max] after its last contact: 1.2-1.6 s by default. Lower fails over
    /// faster but risks needless elections on a loaded machine. At least 300ms (twice the
    /// 150 ms heartbeat, which is also the replication timeout); the same on every member.
    #[arg(long, env = "TTLWHEEL_ELECTION_TIMEOUT", default_value = "400ms",
          value_parser = parse_positive_duration, requires = "node_id", help_heading = "Cluster")]
    pub election_timeout: Duration,

    /// Bytes of Raft log entries after the last snapshot past which a member takes another and
    /// purges the log behind it. Smaller makes a restart's replay and a new member's catch-up
    /// (a snapshot transfer, then the log) shorter, for more snapshot work. At least 1 MiB.
    #[arg(long, env = "TTLWHEEL_SNAPSHOT_LOG_BYTES",
          default_value_t = crate::cluster::node::SNAPSHOT_AFTER_LOG_BYTES,
          value_parser = clap::value_parser!(u64).range(1 << 20..=1 << 40),
          requires = "node_id", help_heading = "Cluster")]
    pub snapshot_log_bytes: u64,

    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Subcommands (without one, ttlwheel serves).
#[derive(Clone, Debug, clap::Subcommand)]
pub enum Command {
    /// Token management.
    #[command(subcommand)]
    Token(TokenCommand),
    /// The operator's commands, clients of a running server (see `crate::cli`).
    #[command(flatten)]
    Client(crate::cli::ClientCommand),
}

#[derive(Clone, Debug, clap::Subcommand)]
pub enum TokenCommand {
    /// Prints a new token (once: only its hash goes in the file) and the entry to add to the
    /// token file.
    New {
        /// The token's id: 1-64 of [A-Za-z0-9-].
        #[arg(long)]
        id: String,
        /// `admin`, `read`, `heartbeat`, optionally narrowed: `read:prefix=checkout/`,
        /// `heartbeat:prefix=checkout/,service=checkout`. Repeat for several.
        #[arg(long = "scope", required = true, value_parser = crate::auth::parse_scope)]
        scopes: Vec<crate::auth::Scope>,
        #[arg(long, default_value = "")]
        description: String,
    },
}

/// A route `--auth-public` can leave open.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PublicPath {
    Healthz,
    Metrics,
    None,
}

impl Config {
    /// The cluster settings, in cluster mode (`--node-id`); `Err` says why the flags cannot
    /// run a member (checked before anything starts).
    pub fn cluster(&self) -> Result<Option<crate::cluster::node::ClusterSettings>, String> {
        let Some(node_id) = self.node_id else {
            return Ok(None);
        };
        let listen = self
            .cluster_listen
            .ok_or("cluster mode (--node-id) needs --cluster-listen HOST:PORT for peer traffic")?;
        let secret = self
            .cluster_secret
            .clone()
            .filter(|secret| !secret.is_empty());
        if secret.is_none() && !listen.ip().is_loopback() {
            return Err(format!(
                "refusing to listen for peers on {listen} without --cluster-secret (or \
                 TTLWHEEL_CLUSTER_SECRET): anyone who could reach the port could join the \
                 cluster's log. Set the same secret on every member, or listen on 127.0.0.1"
            ));
        }
        let Some((data_dir, _)) = self.persistence() else {
            return Err(
                "cluster mode keeps its Raft log in --data-dir: it cannot run \
                        --ephemeral"
                    .into(),
            );
        };
        let election_timeout = crate::cluster::node::election_timeout(self.election_timeout)?;
        let lease = crate::cluster::node::lease_config(
            self.checkpoint_interval,
            self.failover_grace,
            election_timeout,
        )
        .validate()
        .map_err(|error| error.to_string())?;
        if let Some(via) = &self.join {
            if listen.ip().is_unspecified() {
                return Err(format!(
                    "--join advertises --cluster-listen {listen} as this member's peer address: \
                     give the address peers can dial, not {}",
                    listen.ip()
                ));
            }
            if !(via.starts_with("http://") || via.starts_with("https://")) {
                return Err(format!(
                    "--join {via:?} is not a member's API URL (http://HOST:PORT)"
                ));
            }
        }
        let initial = self.initial_cluster.clone().unwrap_or_default();
        if !initial.is_empty() && !initial.contains_key(&node_id) {
            return Err(format!(
                "--initial-cluster does not name this member (--node-id {node_id})"
            ));
        }
        Ok(Some(crate::cluster::node::ClusterSettings {
            node_id,
            listen,
            advertise_api: self
                .advertise_api
                .clone()
                .unwrap_or_else(|| format!("http://{}", self.listen)),
            initial,
            secret,
            peer_routes: self.peer_route.iter().cloned().collect(),
            dir: data_dir.join("raft"),
            lease,
            election_timeout,
            join: self.join.clone(),
            learner: self.learner,
            join_token: self.join_token.clone(),
            snapshot_log_bytes: self.snapshot_log_bytes,
        }))
    }

    /// The secure-by-default rule: without tokens, only a loopback address (unless
    /// `--insecure-no-auth`). The error says how to add tokens.
    pub fn check_secure_start(&self) -> Result<(), String> {
        if self.auth_tokens.is_some() || self.listen.ip().is_loopback() {
            return Ok(());
        }
        if self.insecure_no_auth {
            tracing::warn!(
                listen = %self.listen,
                "serving WITHOUT authentication on a non-loopback address (--insecure-no-auth): \
                 anyone who can reach it can register, delete and re-time any key"
            );
            return Ok(());
        }
        Err(format!(
            "refusing to listen on {} without authentication: anyone who could reach it could \
             register, delete or re-time any key. Create tokens (`ttlwheel token new --id ops \
             --scope admin`, add the printed entry to a file as {{\"tokens\": [...]}}) and pass \
             --auth-tokens FILE; or listen on 127.0.0.1; or, knowingly, --insecure-no-auth",
            self.listen
        ))
    }
}

/// An on/off flag.
/// `--serving`: see [`crate::placement`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Serving {
    PerCore,
    Shared,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Switch {
    On,
    Off,
}

fn parse_share(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(share) if share > 0.0 && share <= 1.0 => Ok(share),
        Ok(_) => Err("must be more than 0 and at most 1".into()),
        Err(error) => Err(error.to_string()),
    }
}

/// `--fsync`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FsyncPolicy {
    Always,
    Interval,
    Never,
}

/// An event kind that can be sent to webhooks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WebhookEvent {
    Expired,
    Deleted,
    /// The mass-expiry guard's `guard.engaged` and `guard.released`.
    Guard,
}

impl WebhookEvent {
    /// The event kinds it stands for.
    pub fn kinds(self) -> &'static [EventKind] {
        match self {
            WebhookEvent::Expired => &[EventKind::Expired],
            WebhookEvent::Deleted => &[EventKind::Deleted],
            WebhookEvent::Guard => &[EventKind::GuardEngaged, EventKind::GuardReleased],
        }
    }
}

/// An absolute http(s) URL with a host.
fn parse_webhook_url(text: &str) -> Result<Url, String> {
    let url = Url::parse(text).map_err(|error| format!("not a URL ({error})"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "webhook URLs must be http or https, not `{}`",
            url.scheme()
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("a webhook URL needs a host".into());
    }
    Ok(url)
}

/// Parses a webhook secret without ever echoing it (clap's own errors quote the bad value).
#[derive(Clone, Copy, Debug)]
struct SecretParser;

impl clap::builder::TypedValueParser for SecretParser {
    type Value = WebhookSecret;

    fn parse_ref(
        &self,
        command: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<WebhookSecret, clap::Error> {
        let refuse = |why: String| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("invalid --webhook-secret (value not shown): {why}\n"),
            )
            .with_cmd(command)
        };
        let text = value.to_str().ok_or_else(|| refuse("not UTF-8".into()))?;
        text.parse().map_err(refuse)
    }
}

/// `--initial-cluster`: `ID=HOST:PORT` pairs, comma-separated, ids unique and at least 1.
fn parse_initial_cluster(text: &str) -> Result<std::collections::BTreeMap<u64, String>, String> {
    let mut members = std::collections::BTreeMap::new();
    for pair in text
        .split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
    {
        let (id, addr) = parse_peer_route(pair)?;
        if members.insert(id, addr).is_some() {
            return Err(format!("member {id} is named twice"));
        }
    }
    if members.is_empty() {
        return Err("names no member: expected 1=HOST:PORT,2=HOST:PORT,...".into());
    }
    Ok(members)
}

/// One `ID=HOST:PORT`.
fn parse_peer_route(text: &str) -> Result<(u64, String), String> {
    let (id, addr) = text
        .split_once('=')
        .ok_or_else(|| format!("`{text}` is not ID=HOST:PORT"))?;
    let id: u64 = id
        .trim()
        .parse()
        .ok()
        .filter(|&id| id >= 1)
        .ok_or_else(|| format!("`{id}` is not a member id (1 or more)"))?;
    let addr = addr.trim();
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
            Ok((id, addr.to_owned()))
        }
        _ => Err(format!("`{addr}` is not HOST:PORT")),
    }
}

fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(duration) if duration.is_zero() => Err("must be longer than zero".into()),
        Ok(duration) => Ok(duration),
        Err(error) => Err(error.to_string()),
    }
}

impl Config {
    /// The webhook settings these flags imply.
    pub fn webhook_settings(&self) -> Settings {
        let mut events: Vec<EventKind> = self
            .webhook_events
            .iter()
            .flat_map(|event| event.kinds().iter().copied())
            .collect();
        events.sort_by_key(|kind| kind.type_name());
        events.dedup();
        Settings {
            urls: self.webhook_urls.clone(),
            secret: self.webhook_secret.clone(),
            events,
            timeout: self.webhook_timeout,
            concurrency: usize::from(self.webhook_concurrency),
            batch_max: usize::from(self.webhook_batch_max),
            max_attempts: self.webhook_max_attempts,
            retry_schedule: self.webhook_retry_schedule.clone(),
            queue_max: self.webhook_queue_max as usize,
            dead_letters_max: self.webhook_dead_letters_max,
            drain_timeout: self.webhook_drain_timeout,
        }
    }

    /// The embedded defaults, as `ttlwheel` with no flags and no environment would run.
    pub fn defaults() -> Self {
        Self::parse_from(["ttlwheel"])
    }

    /// The embedded defaults, memory only: what tests and benchmarks run (many servers at once
    /// cannot share one data directory).
    pub fn ephemeral() -> Self {
        Self::parse_from(["ttlwheel", "--ephemeral"])
    }

    /// Serving threads: `--threads`, or one per core when 0.
    pub fn serving_threads(&self) -> usize {
        match self.threads {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            threads => usize::from(threads),
        }
    }

    /// The data directory, unless running memory-only.
    pub fn persistence(&self) -> Option<(&std::path::Path, crate::persist::journal::FsyncMode)> {
        use crate::persist::journal::FsyncMode;
        if self.ephemeral || self.data_dir.as_os_str().is_empty() {
            return None;
        }
        let mode = match self.fsync {
            FsyncPolicy::Always => FsyncMode::Always,
            FsyncPolicy::Interval => FsyncMode::Interval(self.fsync_interval),
            FsyncPolicy::Never => FsyncMode::Never,
        };
        Some((&self.data_dir, mode))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(extra: &[&str]) -> Result<Option<crate::cluster::node::ClusterSettings>, String> {
        let mut args = vec!["ttlwheel", "--node-id", "2"];
        args.extend_from_slice(extra);
        Config::try_parse_from(args)
            .map_err(|error| error.to_string())?
            .cluster()
    }

    #[test]
    fn a_member_gets_its_settings_from_the_flags() {
        let settings = member(&[
            "--cluster-listen",
            "127.0.0.1:7002",
            "--initial-cluster",
            "1=127.0.0.1:7001, 2=127.0.0.1:7002,3=h3:7003",
            "--peer-route",
            "3=127.0.0.1:9003",
        ])
        .unwrap()
        .expect("cluster mode");
        assert_eq!(settings.node_id, 2);
        assert_eq!(settings.initial.len(), 3);
        assert_eq!(settings.initial[&3], "h3:7003");
        assert_eq!(settings.peer_routes[&3], "127.0.0.1:9003");
        assert_eq!(settings.advertise_api, "http://127.0.0.1:7878");
        assert!(settings.dir.ends_with("raft"));
        let ms = Duration::from_millis;
        assert_eq!(settings.election_timeout, (ms(400), ms(800)));
        assert_eq!(settings.lease.checkpoint_interval(), ms(200));
        assert!(Config::try_parse_from(["ttlwheel"])
            .unwrap()
            .cluster()
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_member_that_could_not_run_safely_is_refused_with_the_reason() {
        let refused = |extra: &[&str], why: &str| {
            let error = member(extra).expect_err("refused");
            assert!(error.contains(why), "{extra:?}: {error}");
        };
        refused(&[], "--cluster-listen");
        refused(&["--cluster-listen", "0.0.0.0:7002"], "--cluster-secret");
        refused(
            &["--cluster-listen", "127.0.0.1:7002", "--ephemeral"],
            "--ephemeral",
        );
        refused(
            &[
                "--cluster-listen",
                "127.0.0.1:7002",
                "--initial-cluster",
                "1=a:1,3=b:2",
            ],
            "does not name this member",
        );
        for bad in ["1=a:1,1=b:2", "x=a:1", "0=a:1", "1=a", "1=:5", ""] {
            refused(
                &[
                    "--cluster-listen",
                    "127.0.0.1:7002",
                    "--initial-cluster",
                    bad,
                ],
                "initial-cluster",
            );
        }
        let listen = ["--cluster-listen", "127.0.0.1:7002"];
        refused(
            &[&listen[..], &["--election-timeout", "200ms"]].concat(),
            "--election-timeout",
        );
        // A longer election timeout allows a longer checkpoint interval; a shorter one needs a
        // shorter interval, and says so.
        let slow = member(&[&listen[..], &["--election-timeout", "1s"]].concat());
        let slow = slow.unwrap().expect("cluster mode");
        assert_eq!(slow.election_timeout.1, Duration::from_secs(2));
        refused(
            &[&listen[..], &["--election-timeout", "300ms"]].concat(),
            "--checkpoint-interval",
        );
        assert!(member(
            &[
                &listen[..],
                &[
                    "--election-timeout",
                    "300ms",
                    "--checkpoint-interval",
                    "150ms"
                ]
            ]
            .concat()
        )
        .unwrap()
        .is_some());
        let with_secret = member(&[
            "--cluster-listen",
            "0.0.0.0:7002",
            "--cluster-secret",
            "s3cret",
        ]);
        assert!(with_secret.unwrap().is_some());
    }
}
