//! A member's Prometheus metrics (issue 28, section 4): what Raft reports, read at each scrape
//! (role, term, leader, committed and applied index, each follower's replication lag as the
//! leader sees it, the age of the leader's quorum acknowledgment), whether the campaign gate
//! lets it call an election, and what the member counts as it goes ([`ClusterStats`]: leader
//! changes, checkpoints' size and commit latency, promotions and the keys a promotion gave the
//! failover grace).
//!
//! Registered into the service's metrics by `Service::start_member` (`Metrics::add_collector`),
//! so `metrics` does not know the cluster. Label cardinality: one label, `member`, bounded by
//! the membership.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::{Raft, ServerState};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;

use super::campaign::CampaignGate;
use super::log_store::LogStore;
use super::types::{NodeId, TypeConfig};
use crate::metrics::{counter1, gauge1};

/// What the member counts as things happen; shared by the tasks that do them.
#[derive(Debug)]
pub struct ClusterStats {
    /// Times the leader this member knows changed (to another member or to none).
    pub leader_changes: AtomicU64,
    /// Times this member was promoted (took over the keys as a new leader).
    pub promotions: AtomicU64,
    /// Keys a promotion gave `min(TTL, --failover-grace)` because their checkpointed time left
    /// was shorter.
    pub grace_keys: AtomicU64,
    /// Checkpoint entries committed.
    pub checkpoints: AtomicU64,
    /// Checkpoint entries that did not commit (a lost lease, a timeout).
    pub checkpoints_failed: AtomicU64,
    /// Keys per checkpoint entry.
    pub checkpoint_keys: Histogram,
    /// From proposing a checkpoint entry to its commit, seconds.
    pub checkpoint_seconds: Histogram,
    /// Peer requests refused because they came from another cluster (`cluster::identity`).
    pub foreign_peer_requests: AtomicU64,
    /// Peer requests refused because their signature did not hold (`cluster::auth`).
    pub unauthorized_peer_requests: AtomicU64,
}

impl Default for ClusterStats {
    fn default() -> Self {
        Self {
            leader_changes: AtomicU64::new(0),
            promotions: AtomicU64::new(0),
            grace_keys: AtomicU64::new(0),
            checkpoints: AtomicU64::new(0),
            checkpoints_failed: AtomicU64::new(0),
            // 1 to 4,096 keys (an entry's most) and one bucket above.
            checkpoint_keys: Histogram::new(exponential_buckets(1.0, 4.0, 7)),
            // 100 µs to ~3.3 s.
            checkpoint_seconds: Histogram::new(exponential_buckets(0.000_1, 2.0, 16)),
            foreign_peer_requests: AtomicU64::new(0),
            unauthorized_peer_requests: AtomicU64::new(0),
        }
    }
}

/// Counts the leader changes a member sees, until its Raft stops.
pub async fn count_leader_changes(raft: Raft<TypeConfig>, stats: Arc<ClusterStats>) {
    let mut metrics = raft.metrics();
    let mut leader = metrics.borrow().current_leader;
    while metrics.changed().await.is_ok() {
        let now = metrics.borrow().current_leader;
        if now != leader {
            leader = now;
            stats.leader_changes.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The collector registered into the service's metrics.
pub struct ClusterCollector {
    pub id: NodeId,
    pub raft: Raft<TypeConfig>,
    pub log: LogStore,
    pub stats: Arc<ClusterStats>,
    pub campaign: Arc<CampaignGate>,
}

impl std::fmt::Debug for ClusterCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCollector")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

fn role_value(state: ServerState) -> f64 {
    match state {
        ServerState::Learner => 0.0,
        ServerState::Follower => 1.0,
        ServerState::Candidate => 2.0,
        ServerState::Leader => 3.0,
        ServerState::Shutdown => -1.0,
    }
}

/// A counter read from one of [`ClusterStats`]' atomics.
fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: &AtomicU64,
) -> Result<(), std::fmt::Error> {
    counter1(encoder, name, help, value.load(Ordering::Relaxed))
}

impl Collector for ClusterCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let metrics = self.raft.metrics().borrow().clone();
        let last_log = metrics.last_log_index.unwrap_or(0);
        let committed = self.log.committed().map_or(0, |log_id| log_id.index);
        let applied = metrics.last_applied.map_or(0, |log_id| log_id.index);
        gauge1(
            &mut encoder,
            "ttlwheel_cluster_role",
            "This member's role: 0 learner, 1 follower, 2 candidate, 3 leader, -1 stopped.",
            role_value(metrics.state),
        )?;
        gauge1(
            &mut encoder,
            "ttlwheel_cluster_term",
            "The Raft term this member is in.",
            metrics.current_term as f64,
        )?;
        gauge1(
            &mut encoder,
            "ttlwheel_cluster_leader_id",
            "The leader this member knows (0: none).",
            metrics.current_leader.unwrap_or(0) as f64,
        )?;
        gauge1(
            &mut encoder,
            "ttlwheel_cluster_last_log_index",
            "The last entry in this member's log.",
            last_log as f64,
        )?;
        gauge1(
            &mut encoder,
            "ttlwheel_cluster_committed_index",
            "The last entry this member knows committed on a quorum.",
            committed as f64,
        )?;
        gauge1(
            &mut encoder,
            "ttlwheel_cluster_applied_index",
            "The last entry this member applied to its keys.",
            applied as f64,
        )?;
        gauge1(
            &mut encoder,
            "ttlwheel_cluster_quorum_ack_age_seconds",
            "On the leader: time since a quorum last acknowledged it (-1 elsewhere); past the fence it answers no_quorum.",
            metrics
                .millis_since_quorum_ack
                .map_or(-1.0, |ms| ms as f64 / 1000.0),
        )?;
        gauge1(
            &mut encoder,
            "ttlwheel_cluster_may_campaign",
            "1 while this member may call an election (enough voters answer that they would vote for it), 0 otherwise.",
            if self.campaign.may_campaign() { 1.0 } else { 0.0 },
        )?;
        if let Some(replication) = &metrics.replication {
            let mut family = encoder.encode_descriptor(
                "ttlwheel_cluster_replication_lag_entries",
                "On the leader: entries each member lacks (its last matched entry against the leader's last).",
                None,
                MetricType::Gauge,
            )?;
            for (member, matched) in replication {
                if *member == self.id {
                    continue;
                }
                let matched = matched.as_ref().map_or(0, |log_id| log_id.index);
                let name = member.to_string();
                let labels = [("member", name.as_str())];
                ConstGauge::new(last_log.saturating_sub(matched) as f64)
                    .encode(family.encode_family(&labels)?)?;
            }
        }
        let stats = &self.stats;
        counter(
            &mut encoder,
            "ttlwheel_cluster_leader_changes",
            "Times the leader this member knows changed.",
            &stats.leader_changes,
        )?;
        counter(
            &mut encoder,
            "ttlwheel_cluster_promotions",
            "Times this member took over as a new leader.",
            &stats.promotions,
        )?;
        counter(
            &mut encoder,
            "ttlwheel_cluster_grace_keys",
            "Keys a promotion gave the failover grace (their checkpointed time left was shorter).",
            &stats.grace_keys,
        )?;
        counter(
            &mut encoder,
            "ttlwheel_cluster_checkpoints",
            "Deadline checkpoint entries committed.",
            &stats.checkpoints,
        )?;
        counter(
            &mut encoder,
            "ttlwheel_cluster_checkpoints_failed",
            "Deadline checkpoint entries that did not commit.",
            &stats.checkpoints_failed,
        )?;
        counter(
            &mut encoder,
            "ttlwheel_cluster_foreign_peer_requests",
            "Peer requests refused because they came from another cluster (409 cluster_mismatch).",
            &stats.foreign_peer_requests,
        )?;
        counter(
            &mut encoder,
            "ttlwheel_cluster_unauthorized_peer_requests",
            "Peer requests refused because their signature did not hold (--cluster-secret).",
            &stats.unauthorized_peer_requests,
        )?;
        stats.checkpoint_keys.encode(encoder.encode_descriptor(
            "ttlwheel_cluster_checkpoint_keys",
            "Keys per deadline checkpoint entry.",
            None,
            MetricType::Histogram,
        )?)?;
        stats.checkpoint_seconds.encode(encoder.encode_descriptor(
            "ttlwheel_cluster_checkpoint_seconds",
            "From proposing a deadline checkpoint entry to its commit.",
            None,
            MetricType::Histogram,
        )?)?;
        Ok(())
    }
}
