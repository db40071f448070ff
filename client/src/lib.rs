//! The client of ttlwheel, a liveness service: keep-alive handles and the v1 API.
//!
//! ```rust,no_run
//! use std::time::Duration;
//! use ttlwheel_client::{Client, KeepAlive};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), ttlwheel_client::Error> {
//! let client = Client::builder().endpoint("http://127.0.0.1:7878").build()?;
//! let mut alive = client
//!     .keep_alive("api/host-1:8080", KeepAlive::ttl(Duration::from_secs(30)).service("api"))
//!     .await?;
//! tokio::select! {
//!     loss = alive.lost() => eprintln!("the registry lost our key ({loss:?}); it is registered again"),
//!     _ = tokio::signal::ctrl_c() => {}
//! }
//! alive.shutdown().await?; // deregisters: subscribers see `deleted`, not `expired`
//! # Ok(())
//! # }
//! ```
//!
//! # Layout
//! - [`Client`] / [`ClientBuilder`] (`client.rs`): endpoints, token, TLS; every API call.
//! - [`keep_alive`]: [`KeepAlive`] options, [`KeepAliveHandle`], and the one task per client
//!   that heartbeats every kept-alive key in batches.
//! - [`backoff`]: the timing rules, pure (interval, jitter, retry delays, `Retry-After`).
//! - `transport.rs`: failover between endpoints; [`LEADER_HEADER`].
//! - [`sse`]: the event stream's parser (pure) and its reconnecting follower.
//! - [`model`]: the API's requests and answers. [`Error`] and [`Code`]: what calls end with.
//!
//! Lists and the event stream are [`futures_util::Stream`]s: read them with
//! `futures_util::StreamExt::next` (or any stream combinator).

pub mod backoff;
mod client;
mod error;
pub mod keep_alive;
pub mod model;
pub mod sse;
mod transport;

pub use client::{Client, ClientBuilder, Tls, DEFAULT_ENDPOINT, DEFAULT_POOL_IDLE_TIMEOUT};
pub use error::{Code, Error};
pub use keep_alive::{KeepAlive, KeepAliveHandle, Liveness, Loss, Status};
pub use model::{
    AliveState, ClusterStatus, Event, EventsQuery, ExpireAt, ExpireCondition, ExpireOutcome,
    ExpiredKey, GuardStatus, Heartbeat, HeartbeatOutcome, KeyInfo, KeyTtl, ListQuery, Member,
    MembershipView, NodeId, Page, Services,
};
pub use transport::{RetryPolicy, LEADER_HEADER};

/// The crate's README, so its example is compiled as a doc-test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
