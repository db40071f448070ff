//! Command-line flags, each also an environment variable `TTLWHEEL_<NAME>`.
//!
//! Bad values fail at start-up with clap's message and a non-zero exit; nothing is re-validated
//! later.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Parser, ValueEnum};

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

    /// Log format.
    #[arg(long, env = "TTLWHEEL_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

impl Config {
    /// The embedded defaults, as `ttlwheel` with no flags and no environment would run.
    pub fn defaults() -> Self {
        Self::parse_from(["ttlwheel"])
    }
}
