//! Many tasks heartbeating many keys on a multi-threaded runtime while the real ticker sweeps.
//!
//! Real time (a multi-threaded runtime cannot pause it), short TTLs. A key that kept heartbeating
//! within its TTL must never expire; a key that stopped must expire exactly once. Each heartbeat's
//! start and end are recorded, so a heartbeat gap that really exceeded the TTL (a starved task on
//! a loaded machine) is told apart from a false expiry instead of being blamed on the engine.
//! Meanwhile a checker thread runs the registry's full invariant check again and again, each
//! time with the sweeper paused wherever it was (mid-bucket included).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use ttlwheel::events::EventKind;
use ttlwheel::registry::{Heartbeat, Registry, RegistryConfig};
use ttlwheel::ticker;
use ttlwheel::types::{Key, Ttl};

const TASKS: usize = 8;
const KEYS_PER_TASK: usize = 500;
const INTERVAL: Duration = Duration::from_millis(150);

/// Wheel keys (1 s) and heap keys (700 ms) alternate. A 1 s wheel key renewed every 150 ms is
/// always within a second of its deadline: most renewals find it in its tick's last second
/// (handed over to the millisecond groups) and leave a stale element there, which the checker
/// thread's invariant check counts while the sweeper is anywhere in its work.
fn ttl_of(key_idx: usize) -> Duration {
    if key_idx.is_multiple_of(2) {
        Duration::from_millis(1_000)
    } else {
        Duration::from_millis(700)
    }
}

/// Heartbeats `keys` every `INTERVAL` until `until`; returns, per key, whether some gap between
/// heartbeats really exceeded its TTL (then an expiry would be legitimate).
async fn heartbeat_loop(
    registry: Arc<Registry>,
    keys: Vec<(Key, Duration)>,
    until: Instant,
) -> HashMap<Key, bool> {
    let mut last_start: HashMap<Key, Instant> = HashMap::new();
    let mut had_gap: HashMap<Key, bool> =
        keys.iter().map(|(key, _)| (key.clone(), false)).collect();
    while Instant::now() < until {
        for (key, ttl) in &keys {
            let start = Instant::now();
            let heartbeat = Heartbeat {
                key: key.clone(),
                ttl: Ttl::from_millis(ttl.as_millis() as u64).unwrap(),
                service: None,
                meta: None,
            };
            registry.heartbeat(heartbeat, start).unwrap();
            let end = Instant::now();
            if let Some(previous) = last_start.insert(key.clone(), start) {
                if end >= previous + *ttl {
                    had_gap.insert(key.clone(), true);
                }
            }
        }
        tokio::time::sleep(INTERVAL).await;
    }
    had_gap
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_keep_heartbeating_never_expire_and_stopped_keys_expire_once() {
    // Half the keys stop at once on purpose: the guard would (rightly) hold them.
    let config = RegistryConfig {
        guard: ttlwheel::registry::GuardConfig::off(),
        ..RegistryConfig::default()
    };
    let registry = Arc::new(Registry::new(config, Instant::now()));
    let mut events = registry.subscribe();
    let (stop_ticker, ticker_stopped) = tokio::sync::oneshot::channel::<()>();
    let ticker = tokio::spawn(ticker::run(Arc::clone(&registry), async {
        let _ = ticker_stopped.await;
    }));

    let checking = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let checker = std::thread::spawn({
        let (registry, checking) = (Arc::clone(&registry), Arc::clone(&checking));
        move || {
            let mut n_checks = 0;
            while checking.load(std::sync::atomic::Ordering::Relaxed) {
                registry.check_invariants();
                n_checks += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            n_checks
        }
    });

    let start = Instant::now();
    let mut tasks = Vec::new();
    for task_idx in 0..TASKS {
        let keys: Vec<(Key, Duration)> = (0..KEYS_PER_TASK)
            .map(|key_idx| {
                (
                    Key::new(&format!("t{task_idx}-k{key_idx}")).unwrap(),
                    ttl_of(key_idx),
                )
            })
            .collect();
        // Half the tasks stop after 1 s, the other half keep going for 2 s.
        let until = start + Duration::from_millis(if task_idx % 2 == 0 { 1_000 } else { 2_000 });
        tasks.push(tokio::spawn(heartbeat_loop(
            Arc::clone(&registry),
            keys,
            until,
        )));
    }
    let mut had_gap = HashMap::new();
    for task in tasks {
        had_gap.extend(task.await.unwrap());
    }
    // Every key has stopped by ~2 s and is due by ~3 s; its wheel tick is at most 4 s.
    tokio::time::sleep_until(start + Duration::from_millis(4_200)).await;

    let mut expiries: HashMap<Key, usize> = HashMap::new();
    while let Some(event) = events.try_recv() {
        if event.kind == EventKind::Registered {
            continue;
        }
        assert_eq!(event.kind, EventKind::Expired);
        *expiries.entry(event.key.clone()).or_default() += 1;
    }
    let mut false_expiries = Vec::new();
    for (key, gap) in &had_gap {
        let count = expiries.get(key).copied().unwrap_or(0);
        assert!(count >= 1, "{key:?} stopped heartbeating but never expired");
        // Without a real gap a key expires exactly once: after it stopped.
        if !gap && count > 1 {
            false_expiries.push(key.clone());
        }
    }
    assert_eq!(
        false_expiries,
        Vec::<Key>::new(),
        "keys that kept heartbeating within their TTL expired"
    );
    // Every key stopped by now and expired; none is left alive.
    assert_eq!(registry.len(), 0);
    checking.store(false, std::sync::atomic::Ordering::Relaxed);
    let n_checks = checker.join().expect("every invariant check passed");
    assert!(n_checks > 10, "the checker ran {n_checks} times");
    registry.check_invariants();
    stop_ticker.send(()).unwrap();
    ticker.await.unwrap();
}
