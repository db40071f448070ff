//! The cluster's fault tests (docs/cluster-design.md, section 10): so far the history checker.
pub mod history;
