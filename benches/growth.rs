//! Growth without stalls: the longest single heartbeat while the registry grows from 0 to N keys
//! (default 10M), service configuration (listing on), one thread, each call timed on its own.
//! A creation that lands on a shard whose index or slot table must grow pays for that growth:
//! this shows how long the worst of them hold their shard's lock (the HTTP experiment in
//! `bench/growth.sh` shows what a client sees).
//!
//! Run: `cargo bench --bench growth` (`TTLWHEEL_BENCH_MAX_KEYS=1000000` for a quick run).
//!
//! On the allocator the service binary is built with (jemalloc by default, `src/main.rs`),
//! since a table's growth costs what that allocator makes it cost; with
//! `--no-default-features`, the system's.

ttlwheel::service_allocator!();

use std::time::Instant as StdInstant;

use tokio::time::Instant;
use ttlwheel::registry::{GuardConfig, Heartbeat, Registry, RegistryConfig};
use ttlwheel::types::{Key, Ttl};

fn main() {
    let n: usize = std::env::var("TTLWHEEL_BENCH_MAX_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let defaults = RegistryConfig::default();
    // TTLWHEEL_BENCH_SHARDS: another shard count than the service's default for this machine.
    let shards = std::env::var("TTLWHEEL_BENCH_SHARDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(defaults.shards);
    let config = RegistryConfig {
        shards,
        guard: GuardConfig::off(),
        ..defaults
    };
    let registry = Registry::new(config, Instant::now());
    let now = Instant::now();
    let ttl = Ttl::from_secs(3600).expect("valid");
    let mut took_ns: Vec<u32> = Vec::with_capacity(n);
    let started = StdInstant::now();
    for i in 0..n {
        let key = Key::new(&format!("service-{i:016}")).expect("valid");
        let heartbeat = Heartbeat {
            key,
            ttl,
            service: None,
            meta: None,
        };
        let call = StdInstant::now();
        registry.heartbeat(heartbeat, now).expect("accepted");
        took_ns.push(call.elapsed().as_nanos().min(u128::from(u32::MAX)) as u32);
    }
    let total = started.elapsed();
    let mut worst: Vec<(u32, usize)> = took_ns.iter().copied().zip(0..).collect();
    worst.sort_unstable_by(|a, b| b.cmp(a));
    let mut sorted = took_ns;
    sorted.sort_unstable();
    let pct = |p: f64| f64::from(sorted[((sorted.len() - 1) as f64 * p) as usize]) / 1000.0;
    println!(
        "growth/{n}/{shards} shards: {:.2} s; per creation p50 {:.2} us, p99 {:.2} us, p999 {:.2} us, max {:.2} ms",
        total.as_secs_f64(),
        pct(0.5),
        pct(0.99),
        pct(0.999),
        f64::from(worst[0].0) / 1e6
    );
    let worst: Vec<String> = worst
        .iter()
        .take(8)
        .map(|(ns, at)| format!("{:.1} ms at key {at}", f64::from(*ns) / 1e6))
        .collect();
    println!("growth/{n}/{shards} shards: slowest: {}", worst.join(", "));
}
