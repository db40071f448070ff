//! The task that owns time.
//!
//! It sleeps until the next due millisecond (a wheel key in its last second, or a heap key) or the
//! start of the next tick's last second, whichever is first, is
//! woken early only when an earlier heap deadline arrives, and then sweeps what is due in
//! bounded steps, yielding to the runtime between them so that a mass expiry shares the
//! threads with the heartbeats instead of holding one for its whole length. It reads the clock
//! (`tokio::time::Instant::now`, so paused-time tests drive it); the registry never does.
//!
//! During a mass expiry it sweeps in batches: after a pass that expired at least
//! [`MASS_EXPIRY_KEYS`] keys it waits [`MASS_EXPIRY_PAUSE`] before the next one. Keys that
//! registered over a second fall due over a second, a thousandth of them each millisecond;
//! swept each millisecond, a pass expires too few per shard (under 1/512 of its keys) to
//! leave the listing in its batched pass, and each key is taken out of the listing by a
//! search (~1 us) and logged alone.
//! Measured on 1M keys due over a second: in the running service (`bench/mass_expiry.sh`)
//! 15-25 % less sweep time and a third of the steps, and the expiry ends sooner, so lateness
//! p99 halved; in criterion (`evict/1M/one-tick/spread-on-time` swept every 10 ms instead of
//! every 1) 55 % less. A key due during a pause is at most the pause later than otherwise.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{sleep_until, Instant};

use crate::clock::stalls::WATCH_PERIOD_MS;
use crate::registry::Registry;

/// Slots one sweep step handles before yielding to the runtime (a few ms of work at most).
pub const SWEEP_BUDGET: usize = 16 * 1024;

/// A sweep pass that expires at least this many keys is a mass expiry's: the next one waits
/// [`MASS_EXPIRY_PAUSE`]. A fleet's ordinary churn is far below it (1M keys due over a second
/// is ~1,000 a millisecond).
pub const MASS_EXPIRY_KEYS: usize = 256;

/// The wait after a mass expiry's pass: the longest a key due meanwhile is made later.
pub const MASS_EXPIRY_PAUSE: Duration = Duration::from_millis(10);

/// Runs until `shutdown` resolves, then returns after at most the current sweep step.
pub async fn run(registry: Arc<Registry>, shutdown: impl Future<Output = ()>) {
    run_timed(registry, |_| {}, shutdown).await;
}

/// [`run`], reporting how long each sweep step took (for the metrics).
pub async fn run_timed(
    registry: Arc<Registry>,
    on_step: impl Fn(std::time::Duration),
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let wake_at = registry.next_sweep_at();
        tokio::select! {
            () = &mut shutdown => return,
            () = sleep_until(wake_at) => {}
            () = registry.earlier_deadline() => {}
        }
        let expired = sweep_due_timed(&registry, &on_step).await;
        if expired >= MASS_EXPIRY_KEYS {
            // Let the next keys gather into one batch (see the module documentation).
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(MASS_EXPIRY_PAUSE) => {}
            }
        }
    }
}

/// Sweeps everything due now, in budgeted steps.
pub async fn sweep_due(registry: &Registry) {
    sweep_due_timed(registry, &|_| {}).await;
}

/// Sweeps everything due now, in budgeted steps; returns how many keys expired (or were
/// released by the guard).
async fn sweep_due_timed(registry: &Registry, on_step: &impl Fn(std::time::Duration)) -> usize {
    let mut expired = 0;
    loop {
        let started = std::time::Instant::now();
        let report = registry.sweep(Instant::now(), SWEEP_BUDGET);
        on_step(started.elapsed());
        expired += report.n_expired + report.n_released;
        if !report.more {
            return expired;
        }
        tokio::task::yield_now().await;
    }
}

/// The stall watchdog (see `clock::stalls`): turns every `WATCH_PERIOD_MS` until `shutdown`
/// resolves, each turn promising the next; a turn, or any reading of the registry's clock, that
/// comes later than promised accounts a stall of the process and extends every deadline by it.
/// It runs as its own task, beside the ticker, so a long sweep does not look like a stall.
pub async fn watch_for_stalls(registry: Arc<Registry>, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    let period = std::time::Duration::from_millis(WATCH_PERIOD_MS);
    loop {
        registry.clock().watch(Instant::now());
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep(period) => {}
        }
    }
    registry.clock().stop_watching();
}

/// How far behind the ticker is: seconds between the last fully swept tick and `now`.
pub fn lag_s(registry: &Registry, now: Instant) -> u64 {
    let now_s = registry.clock().now_ms(now) / 1000;
    now_s.saturating_sub(u64::from(registry.swept_through()))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::events::EventKind;
    use crate::registry::{GuardConfig, Heartbeat, RegistryConfig};
    use crate::types::{Key, Ttl};

    /// Registers `names` now, each with a TTL of `ttl_ms` (not whole seconds: the heap, exact
    /// to the millisecond).
    fn register(registry: &Registry, names: impl IntoIterator<Item = String>, ttl_ms: u64) {
        for name in names {
            let heartbeat = Heartbeat {
                key: Key::new(&name).unwrap(),
                ttl: Ttl::from_millis(ttl_ms).unwrap(),
                service: None,
                meta: None,
            };
            registry.heartbeat(heartbeat, Instant::now()).unwrap();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_mass_expiry_the_next_keys_wait_for_the_pause_and_no_other_key_waits() {
        let config = RegistryConfig {
            guard: GuardConfig::off(),
            ..RegistryConfig::default()
        };
        let registry = Arc::new(Registry::new(config, Instant::now()));
        let mut events = registry.subscribe();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let ticker = tokio::spawn(run(Arc::clone(&registry), async move {
            let _ = stopped.await;
        }));
        let mass = (0..MASS_EXPIRY_KEYS).map(|i| format!("mass-{i}"));
        register(&registry, ["alone-before".to_owned()], 1_500);
        register(&registry, mass, 2_500);
        register(&registry, ["just-after".to_owned()], 2_503);
        register(&registry, ["alone-later".to_owned()], 4_001);
        tokio::time::sleep(Duration::from_secs(5)).await;
        let _ = stop.send(());
        ticker.await.unwrap();

        let mut lateness = HashMap::new();
        while let Some(event) = events.try_recv() {
            if event.kind == EventKind::Expired {
                lateness.insert(event.key.as_str().to_owned(), event.lateness_ms);
            }
        }
        assert_eq!(
            lateness.len(),
            MASS_EXPIRY_KEYS + 3,
            "every key expired once"
        );
        assert_eq!(
            lateness["alone-before"], 0,
            "no mass expiry before it: on time"
        );
        assert!(
            (0..MASS_EXPIRY_KEYS).all(|i| lateness[&format!("mass-{i}")] == 0),
            "the mass expiry itself is on time"
        );
        let pause_ms = MASS_EXPIRY_PAUSE.as_millis() as u64;
        assert_eq!(
            lateness["just-after"],
            pause_ms - 3,
            "due 3 ms after the mass expiry: it waits for the pause"
        );
        assert_eq!(lateness["alone-later"], 0, "long after: on time again");
        registry.check_invariants();
    }
}
