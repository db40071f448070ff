//! Cluster mode against real processes (issue 28): a harness that starts members with a fault
//! proxy on every peer link, the scenarios run on it, membership, membership changes
//! interrupted in their joint phase (`joint`), the upgrade from a single node, TTL changes
//! through the log (`ttl`), the pure history checker the fault scenarios feed, the keep-alive
//! clients and the writer that record their histories, and the fault scenarios under load:
//! failover, a rolling restart of every member (`rolling`), a follower cut off and healed
//! (`partition`), and a slow peer link under the largest batch (`slow_link`).

pub mod driver;
pub mod events;
pub mod failover;
pub mod harness;
pub mod history;
pub mod identity;
pub mod joint;
pub mod membership;
pub mod partition;
pub mod rolling;
pub mod scenarios;
pub mod slow_link;
pub mod ttl;
pub mod upgrade;
