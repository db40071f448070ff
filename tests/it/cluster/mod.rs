//! Cluster mode against real processes (issue 28): a harness that starts members with a fault
//! proxy on every peer link, and the scenarios run on it.

pub mod harness;
pub mod scenarios;
