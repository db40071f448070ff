//! The task that owns time.
//!
//! It sleeps until the next due millisecond (a wheel key in its last second, or a heap key) or the
//! start of the next tick's last second, whichever is first, is
//! woken early only when an earlier heap deadline arrives, and then sweeps what is due in
//! bounded steps, yielding to the runtime between them so that a mass expiry shares the
//! threads with the heartbeats instead of holding one for its whole length. It reads the clock
//! (`tokio::time::Instant::now`, so paused-time tests drive it); the registry never does.

use std::future::Future;
use std::sync::Arc;

use tokio::time::{sleep_until, Instant};

use crate::clock::stalls::WATCH_PERIOD_MS;
use crate::registry::Registry;

/// Slots one sweep step handles before yielding to the runtime (a few ms of work at most).
pub const SWEEP_BUDGET: usize = 16 * 1024;

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
        sweep_due_timed(&registry, &on_step).await;
    }
}

/// Sweeps everything due now, in budgeted steps.
pub async fn sweep_due(registry: &Registry) {
    sweep_due_timed(registry, &|_| {}).await;
}

async fn sweep_due_timed(registry: &Registry, on_step: &impl Fn(std::time::Duration)) {
    loop {
        let started = std::time::Instant::now();
        let more = registry.sweep(Instant::now(), SWEEP_BUDGET).more;
        on_step(started.elapsed());
        if !more {
            return;
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
