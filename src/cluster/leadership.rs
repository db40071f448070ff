//! The lease rules in force (docs/cluster-design.md section 6): the task that feeds a
//! [`Lease`] what Raft and the network report and carries out its [`Action`]s, and the
//! leader's sweeper, which proposes expiries instead of removing keys.
//!
//! - **The lease task** runs every [`POLL`] (and when a blank entry is applied): it reads the
//!   metrics (role, term, `millis_since_quorum_ack`), our network's quorum acknowledgment
//!   (`Contacts::quorum_ack` over every config of the membership), the last contact with a
//!   leader and the newest blank entry applied; it promotes (the registry's pass over every
//!   key, done before serving starts), demotes (renewals not checkpointed are forgotten),
//!   proposes checkpoints, and publishes `serve_until` (`LeaseSignals`), which renewals, reads
//!   and the sweeper check. Polling only delays an acknowledgment, so it only ends serving
//!   early, never late.
//! - **The sweeper** runs only while this member leads: it moves due keys onto the expiring
//!   lists (`Registry::sweep` in cluster mode), and, while `may_serve` holds, proposes them
//!   as `Expiries` entries of at most [`MAX_ITEMS`] keys, one at a time; a key leaves when its
//!   entry is applied. A proposal that fails leaves the keys listed for the next round.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use openraft::{Raft, ServerState};
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::lease::{Action, Lease, LeaseRules, MetricsView, RaftRole};
use super::metrics::ClusterStats;
use super::network::Contacts;
use super::node::PROPOSE_TIMEOUT;
use super::signals::LeaseSignals;
use super::types::{
    checkpoint_item_len, entry_sized, expiry_len, report_len, Command, NodeId, TypeConfig,
};
use crate::notify::replicated::Replication;
use crate::registry::Registry;

/// How often the lease task looks at Raft and the network.
pub const POLL: Duration = Duration::from_millis(20);
/// The most keys one `Expiries` or `Checkpoint` entry carries (design section 3).
pub const MAX_ITEMS: usize = 4096;
/// The most webhook reports one entry carries (~100 bytes each: an entry stays far below the
/// network's payload cap).
const MAX_REPORTS: usize = 1024;
/// Slots a sweep call handles before yielding.
const SWEEP_BUDGET: usize = 16 * 1024;
/// The longest the sweeper sleeps while leading.
const SWEEPER_IDLE: Duration = Duration::from_millis(100);
/// How long the sweeper waits after a failed proposal.
const RETRY_AFTER: Duration = Duration::from_millis(200);

/// What the lease task and the sweeper share with the member.
#[derive(Clone)]
pub struct Parts {
    pub id: NodeId,
    pub raft: Raft<TypeConfig>,
    pub registry: Arc<Registry>,
    pub signals: Arc<LeaseSignals>,
    pub contacts: Arc<Contacts>,
    /// When this member last accepted an AppendEntries from a leader.
    pub leader_contact: Arc<Mutex<Option<Instant>>>,
    pub rules: LeaseRules,
    /// What the tasks count for `/metrics`.
    pub stats: Arc<ClusterStats>,
    /// Webhook delivery: on while this member may serve; its reports proposed each tick.
    pub webhooks: Arc<Replication>,
}

/// Starts the lease task and the sweeper.
pub fn spawn(parts: Parts) -> Vec<JoinHandle<()>> {
    vec![
        tokio::spawn(lease_task(parts.clone())),
        tokio::spawn(sweeper(parts)),
    ]
}

fn role_of(state: ServerState) -> RaftRole {
    match state {
        ServerState::Leader => RaftRole::Leader,
        ServerState::Candidate => RaftRole::Candidate,
        ServerState::Follower => RaftRole::Follower,
        ServerState::Learner => RaftRole::Learner,
        ServerState::Shutdown => RaftRole::Shutdown,
    }
}

async fn lease_task(parts: Parts) {
    let mut lease = Lease::new(parts.rules, Instant::now());
    let mut blank_seen = 0;
    loop {
        tokio::select! {
            () = tokio::time::sleep(POLL) => {}
            () = parts.signals.wake.notified() => {}
        }
        let now = Instant::now();
        let (view, configs) = {
            let metrics = parts.raft.metrics();
            let metrics = metrics.borrow();
            let view = MetricsView {
                role: role_of(metrics.state),
                term: metrics.current_term,
                millis_since_quorum_ack: metrics.millis_since_quorum_ack,
            };
            let configs = metrics
                .membership_config
                .membership()
                .get_joint_config()
                .clone();
            (view, configs)
        };
        let mut actions = lease.on_metrics(now, view);
        if lease.is_leader() {
            let acked = parts
                .contacts
                .quorum_ack(parts.id, view.term, &configs, now);
            if let Some(sent_at) = acked {
                actions.extend(lease.on_quorum_ack(now, view.term, sent_at));
            }
        }
        let contact = *parts.leader_contact.lock();
        if let Some(received_at) = contact {
            actions.extend(lease.on_leader_contact(now, received_at));
        }
        let blank = parts.signals.blank_term();
        if blank > blank_seen {
            blank_seen = blank;
            actions.extend(lease.on_blank_applied(now, blank));
        }
        actions.extend(lease.on_tick(now));
        parts
            .signals
            .set_leading_term(if lease.is_leader() { view.term } else { 0 });
        for action in actions {
            carry_out(&parts, action).await;
        }
        let now = Instant::now();
        let serve_until = match lease.may_serve(now) {
            Ok(()) => lease.quorum_ack().map(|ack| ack + parts.rules.fence()),
            Err(_) => None,
        };
        parts.signals.set_serve_until(serve_until);
        // The member that may serve sends the webhooks; the others hold them.
        parts.webhooks.set_delivering(serve_until.is_some());
    }
}

/// Carries out one of the lease's actions.
async fn carry_out(parts: &Parts, action: Action) {
    match action {
        Action::Promote {
            at,
            last_leader_contact,
        } => {
            let (registry, rules) = (Arc::clone(&parts.registry), parts.rules);
            let started = std::time::Instant::now();
            let promoted = tokio::task::spawn_blocking(move || {
                // The keys whose checkpointed time left was below min(TTL, grace).
                let graced = std::cell::Cell::new(0_u64);
                registry.promote(last_leader_contact, &|remaining_ms, ttl_ms| {
                    let (remaining, ttl) = (
                        Duration::from_millis(remaining_ms),
                        Duration::from_millis(ttl_ms),
                    );
                    if ttl.min(rules.failover_grace()) > remaining {
                        graced.set(graced.get() + 1);
                    }
                    rules.failover_deadline(at, remaining, ttl)
                });
                graced.get()
            })
            .await;
            let graced = match promoted {
                Ok(graced) => graced,
                Err(error) => {
                    tracing::error!(%error, "the promotion pass failed");
                    0
                }
            };
            parts.stats.promotions.fetch_add(1, Ordering::Relaxed);
            parts.stats.grace_keys.fetch_add(graced, Ordering::Relaxed);
            tracing::info!(
                keys_given_grace = graced,
                node_id = parts.id,
                since_last_contact_ms = at
                    .saturating_duration_since(last_leader_contact)
                    .as_millis() as u64,
                pass_ms = started.elapsed().as_millis() as u64,
                "promoted: every key has its failover deadline"
            );
        }
        Action::Demote => {
            parts.signals.set_serve_until(None);
            parts.registry.forget_renewals();
            tracing::info!(node_id = parts.id, "no longer leading");
        }
        Action::ProposeCheckpoint => {
            propose_webhook_reports(parts);
            let items = parts.registry.take_checkpoint(Instant::now());
            if items.is_empty() {
                return;
            }
            // Off the lease task: a slow commit must not delay the fence's updates.
            let (raft, stats) = (parts.raft.clone(), Arc::clone(&parts.stats));
            tokio::spawn(async move {
                for chunk in entry_sized(&items, MAX_ITEMS, checkpoint_item_len) {
                    let command = Command::Checkpoint(chunk.to_vec());
                    let proposed = Instant::now();
                    let written =
                        tokio::time::timeout(PROPOSE_TIMEOUT, raft.client_write(command)).await;
                    if !matches!(written, Ok(Ok(_))) {
                        stats.checkpoints_failed.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!("a checkpoint was not committed");
                        return;
                    }
                    stats.checkpoints.fetch_add(1, Ordering::Relaxed);
                    stats.checkpoint_keys.observe(chunk.len() as f64);
                    stats
                        .checkpoint_seconds
                        .observe(proposed.elapsed().as_secs_f64());
                }
            });
        }
        Action::PauseExpiry | Action::ResumeExpiry => {
            // The sweeper asks `LeaseSignals::may_serve` before each proposal.
        }
    }
}

/// Proposes what this member's webhook deliveries settled since the last tick (off the lease
/// task), so the other members drop those events; reports not committed are put back.
fn propose_webhook_reports(parts: &Parts) {
    let reports = parts.webhooks.take_settled();
    if reports.is_empty() {
        return;
    }
    let (raft, webhooks) = (parts.raft.clone(), Arc::clone(&parts.webhooks));
    tokio::spawn(async move {
        let mut left = reports;
        while !left.is_empty() {
            let fit = entry_sized(&left, MAX_REPORTS, report_len).next();
            let rest = left.split_off(fit.map_or(0, <[_]>::len));
            let command = Command::Webhooks(left.clone());
            let written = tokio::time::timeout(PROPOSE_TIMEOUT, raft.client_write(command)).await;
            if !matches!(written, Ok(Ok(_))) {
                tracing::debug!("webhook delivery reports were not committed; kept for the next");
                left.extend(rest);
                webhooks.put_back(left);
                return;
            }
            left = rest;
        }
    });
}

/// The leader's sweeper: see the module documentation.
async fn sweeper(parts: Parts) {
    loop {
        if parts.signals.leading_term() == 0 {
            tokio::time::sleep(SWEEPER_IDLE).await;
            continue;
        }
        sweep_due(&parts.registry).await;
        if !propose_expiries(&parts).await {
            tokio::time::sleep(RETRY_AFTER).await;
            continue;
        }
        let next = parts
            .registry
            .next_sweep_at()
            .min(Instant::now() + SWEEPER_IDLE);
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = parts.registry.earlier_deadline() => {}
        }
    }
}

/// Lists every key due now for an expiry entry, yielding between budgets.
async fn sweep_due(registry: &Registry) {
    while registry.sweep(Instant::now(), SWEEP_BUDGET).more {
        tokio::task::yield_now().await;
    }
}

/// Proposes the listed keys' expiries, one entry at a time, while this member may serve.
/// Returns false when a proposal failed.
async fn propose_expiries(parts: &Parts) -> bool {
    loop {
        let mut keys = parts.registry.expiring_batch(MAX_ITEMS);
        if keys.is_empty() || !parts.signals.may_serve(Instant::now()) {
            return true;
        }
        // Those that fit one entry; the rest stay listed for the next.
        let fit = entry_sized(&keys, MAX_ITEMS, expiry_len).next();
        keys.truncate(fit.map_or(0, <[_]>::len));
        let n = keys.len();
        let written = tokio::time::timeout(
            PROPOSE_TIMEOUT,
            parts.raft.client_write(Command::Expiries(keys)),
        )
        .await;
        if !matches!(written, Ok(Ok(_))) {
            tracing::debug!(keys = n, "an expiry entry was not committed; retrying");
            return false;
        }
    }
}
