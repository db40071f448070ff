//! One integration-test binary (one link step for every suite).

mod absolute;
mod api;
mod auth;
mod binary;
mod bounds;
mod browser;
mod cli;
mod client;
mod cluster;
mod cluster_storage;
mod concurrency;
mod contract;
mod deploy;
mod durability;
mod edge;
mod engine;
mod exposition;
mod guard;
mod layout;
mod model;
mod process;
mod receiver;
mod restart;
mod robustness;
mod server;
mod serving;
mod slow_clients;
mod stalls;
mod stream;
mod tls;
mod tools;
mod webhook_batches;
mod webhooks;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use ttlwheel::clock::Clock;
use ttlwheel::events::{Event, EventKind, EventReceiver};
use ttlwheel::registry::{GuardConfig, Heartbeat, HeartbeatOutcome, Registry, RegistryConfig};
use ttlwheel::types::{Key, ServiceName, Ttl};

/// Unix time the test clocks pin their epoch to.
pub const UNIX_AT_EPOCH: u64 = 1_700_000_000_000;

/// A registry driven by hand: the test says what time it is and when the sweeper runs.
pub struct Harness {
    pub registry: Arc<Registry>,
    pub events: EventReceiver,
    pub epoch: Instant,
    pub now_ms: u64,
}

impl Harness {
    pub fn new(max_ttl_s: u32) -> Self {
        Self::with_config(RegistryConfig {
            max_ttl_s,
            shards: 4,
            guard: GuardConfig::off(),
            ..RegistryConfig::default()
        })
    }

    /// Every renewal removes its old wheel element at once instead of leaving it stale. (The
    /// harness tests the expiry mechanics: its mass expiries are meant, so the guard is off;
    /// `guard.rs` tests the guard.)
    pub fn eager(max_ttl_s: u32) -> Self {
        Self::with_config(RegistryConfig {
            max_ttl_s,
            shards: 4,
            stale_per_key: 0,
            stale_slack: 0,
            guard: GuardConfig::off(),
            ..RegistryConfig::default()
        })
    }

    pub fn with_config(config: RegistryConfig) -> Self {
        let epoch = Instant::now();
        let registry =
            Registry::with_clock(config, Clock::with_unix_ms_at_epoch(epoch, UNIX_AT_EPOCH));
        let events = registry.subscribe();
        Self {
            registry: Arc::new(registry),
            events,
            epoch,
            now_ms: 0,
        }
    }

    pub fn now(&self) -> Instant {
        self.epoch + Duration::from_millis(self.now_ms)
    }

    pub fn heartbeat(&self, key: &str, ttl_ms: u64) -> HeartbeatOutcome {
        self.heartbeat_in(key, ttl_ms, None)
    }

    /// A heartbeat that names a service (`None` keeps the stored one).
    pub fn heartbeat_in(&self, key: &str, ttl_ms: u64, service: Option<&str>) -> HeartbeatOutcome {
        let heartbeat = Heartbeat {
            key: key_of(key),
            ttl: Ttl::from_millis(ttl_ms).expect("valid ttl"),
            service: service.map(|name| ServiceName::new(name).expect("valid service")),
            meta: None,
        };
        self.registry
            .heartbeat(heartbeat, self.now())
            .expect("heartbeat accepted")
    }

    /// Moves the clock without sweeping (a stalled ticker).
    pub fn stall(&mut self, ms: u64) {
        self.now_ms += ms;
    }

    /// Moves the clock and sweeps everything due, as the ticker would.
    pub fn advance(&mut self, ms: u64) {
        self.now_ms += ms;
        self.sweep();
    }

    pub fn sweep(&self) {
        while self.registry.sweep(self.now(), 1000).more {}
    }

    /// Events published since the last call.
    /// The expiry and deletion events published since the last call.
    pub fn drain(&mut self) -> Vec<Event> {
        let mut events = self.drain_all();
        events.retain(|event| event.kind != EventKind::Registered);
        events
    }

    /// Every event published since the last call, registrations included.
    pub fn drain_all(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.events.try_recv()).collect()
    }

    /// Keys of the `kind` events published since the last call, sorted.
    pub fn drained_keys(&mut self, kind: EventKind) -> Vec<String> {
        let mut keys: Vec<String> = self
            .drain()
            .iter()
            .filter(|event| event.kind == kind)
            .map(|event| event.key.to_string())
            .collect();
        keys.sort();
        keys
    }

    pub fn alive(&self, key: &str) -> bool {
        self.registry.get(&key_of(key), self.now()).is_some()
    }
}

pub fn key_of(raw: &str) -> Key {
    Key::new(raw).expect("valid key")
}
