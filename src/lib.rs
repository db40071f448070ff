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
//! - [`clock`]: monotonic epoch milliseconds and their display as wall time.
//!
//! See `ARCHITECTURE.md` for the map and the invariants.

pub mod clock;
pub mod events;
pub mod expiry;
pub mod registry;
pub mod ticker;
pub mod types;
