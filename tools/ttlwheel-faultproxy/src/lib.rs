//! `ttlwheel-faultproxy`: a fault-injecting TCP proxy for one link, driven in-process by a test.
//!
//! What it is for: the cluster tests run real ttlwheel processes on loopback and route every
//! peer link (node A dialing node B's cluster port) through a [`Link`]. The test holds each
//! link's [`LinkHandle`] and partitions, heals or slows the cluster link by link, without root
//! and without network namespaces, so it runs the same on a laptop and in CI:
//!
//! ```no_run
//! # async fn demo(peer: std::net::SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use ttlwheel_faultproxy::{Direction, Fault, Link};
//!
//! let link = Link::start(peer).await?; // give link.addr() to the dialing node instead of `peer`
//! link.set(Fault::Blackhole); // a partition: bytes vanish, connections stay open
//! link.set_one_way(Direction::ToClient, Fault::Blackhole)?; // answers vanish, requests arrive
//! link.set(Fault::Delay(Duration::from_millis(50)));
//! link.set(Fault::Cut); // every connection reset, new ones too
//! link.heal();
//! let stats = link.wait_until(|s| s.open == 0).await;
//! # let _ = stats; Ok(()) }
//! ```
//!
//! The faults ([`Fault`]): `Pass`, `Cut` (reset, refuse), `Blackhole` (drop bytes silently),
//! `Stall` (hold bytes, deliver on heal), `Delay` (fixed latency per chunk, order kept),
//! `Throttle` (bytes per second). Each can be set for both directions or, except `Cut`, one
//! ([`Direction`]): a one-way blackhole is the asymmetric partition Raft implementations trip on
//! (a leader's heartbeats arrive, its followers' answers do not). Counters ([`LinkStats`]) say
//! what crossed, what was dropped and how many connections were made, and
//! [`LinkHandle::wait_until`] waits for them rather than for a length of time. Every task a link
//! spawns ends with its handle; [`LinkHandle::shutdown`] waits until its port and sockets are
//! closed.
//!
//! Limits: what a proxy cannot simulate that a network namespace (netem, iptables) can.
//! - It sees byte streams, not packets: no reordering, duplication or corruption (TCP would hide
//!   them anyway, except as latency), and no partial packet loss (retransmission delays).
//! - A blackhole is per-connection state in the proxy, not a property of the network: the
//!   kernels still complete the client's handshake with the proxy (`connect` succeeds at once,
//!   where a real partition makes it hang until its timeout), and the target is not dialed until
//!   the blackhole lifts. TCP never loses bytes from a stream it keeps delivering, so a
//!   connection whose bytes were dropped is reset when the blackhole lifts; the real outcome
//!   would be retransmission (use `Stall`) or a reset after the retransmission timeout (minutes).
//! - Neither side's kernel sees the partition: no keepalive or retransmission timeouts fire, and
//!   a sender under `Blackhole` sees its writes succeed forever (the proxy keeps reading);
//!   under `Stall`, writes block once the kernel and proxy buffers fill, as on a real link.
//! - `Cut` resets (RST): both ends learn at once. A host that dies without a word is `Blackhole`.
//! - Only links the test routes through a proxy are faulty: a node that learns a peer's real
//!   address (from membership, or a redirect) bypasses it. Give every node only proxy addresses.
//! - Delay and throttle are applied by timers in the proxy, on top of loopback's own latency,
//!   and the proxy reads ahead of delivery (64 chunks per direction: up to 1 MiB, or 1.28 s'
//!   worth under a throttle), so a slowed sender feels the back-pressure only once that fills.

mod conn;
mod fault;
mod link;
mod stats;

pub use fault::{Direction, Fault, FaultError, Faults};
pub use link::{Link, LinkError, LinkHandle};
pub use stats::{FlowStats, LinkStats};
