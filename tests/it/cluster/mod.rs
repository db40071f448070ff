//! Cluster mode against real processes (issue 28): a harness that starts members with a fault
//! proxy on every peer link, the scenarios run on it, TTL changes through the log (`ttl`), and
//! the pure history checker the fault scenarios will feed.

pub mod harness;
pub mod history;
pub mod membership;
pub mod scenarios;
pub mod ttl;
pub mod upgrade;
