//! Memory per key: resident-set growth divided by the number of keys, for 24-byte keys with a
//! whole-second TTL (the wheel path) and no metadata.
//!
//! Each configuration runs in its own child process so that memory freed by one run cannot
//! hide the cost of the next. Keys are generated on the fly; the benchmark keeps no copy.
//!
//! Run: `cargo bench --bench memory` (prints one line per configuration).
//!
//! On the allocator the service binary is built with (jemalloc by default, `src/main.rs`),
//! with its settings: its retention is part of each key's cost; with
//! `--no-default-features`, the system's.

ttlwheel::service_allocator!();

use std::process::Command;

use tokio::time::Instant;
use ttlwheel::registry::{Heartbeat, Registry, RegistryConfig};
use ttlwheel::types::{Key, Ttl};

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let resident_pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("statm field");
    resident_pages * 4096
}

/// Registers `n` keys in a registry with `listing` on or off; prints bytes per key.
fn measure(n: usize, listing: bool) {
    let config = RegistryConfig {
        listing,
        expired_max: if listing {
            RegistryConfig::default().expired_max
        } else {
            0
        },
        ..RegistryConfig::default()
    };
    let before = rss_bytes();
    let registry = Registry::new(config, Instant::now());
    let now = Instant::now();
    let ttl = Ttl::from_secs(30).expect("valid");
    for i in 0..n {
        let key = Key::new(&format!("service-{i:016}")).expect("valid");
        registry
            .heartbeat(
                Heartbeat {
                    key,
                    ttl,
                    service: None,
                    meta: None,
                },
                now,
            )
            .expect("accepted");
    }
    let after = rss_bytes();
    assert_eq!(registry.len(), n);
    let per_key = (after - before) as f64 / n as f64;
    let label = if listing {
        "service (with listing index)"
    } else {
        "engine (wheel path)"
    };
    println!("memory/{n}/{label}: {per_key:.1} bytes per key, of which 24 are the key itself: {:.1} beyond the key", per_key - 24.0);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let (Some(n), Some(mode)) = (args.get(1).and_then(|v| v.parse().ok()), args.get(2)) {
        measure(n, mode == "listing");
        return;
    }
    let sizes: Vec<usize> = std::env::var("TTLWHEEL_BENCH_MAX_KEYS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(vec![1_000_000, 10_000_000], |max| {
            [1_000_000, 10_000_000]
                .into_iter()
                .filter(|n| *n <= max)
                .collect()
        });
    let exe = std::env::current_exe().expect("own path");
    for n in sizes {
        for mode in ["engine", "listing"] {
            let status = Command::new(&exe)
                .arg(n.to_string())
                .arg(mode)
                .status()
                .expect("child runs");
            assert!(status.success());
        }
    }
}
