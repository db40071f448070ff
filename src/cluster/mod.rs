//! The cluster (issue 28): compiled in, not yet wired; a single node never touches it.
//!
//! The plan is `docs/cluster-design.md`. What is here so far:
//! - [`lease`]: the lease rules (checkpoints, promotion, fencing, demotion), pure: given times
//!   and what Raft reports, it says what to do.

pub mod lease;
