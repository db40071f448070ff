//! Changing who is in the cluster (issue 28, section 1): adding a learner, promoting it to a
//! voter once it has caught up, removing a member; and `--join`, which a new member runs
//! against any existing one to do the first two to itself.
//!
//! - **Only the leader changes the membership** (the API forwards these routes to it). Each
//!   change is one openraft membership change; openraft moves voters through a joint
//!   configuration, so a change is safe against a failover in its middle (a new leader
//!   finishes what it inherits on the next change).
//! - **Idempotent**: adding a member that is already there with the same addresses, promoting
//!   a voter and removing a member that is gone answer as if done, so a client (or `--join`)
//!   that retries after a timeout never gets a misleading error.
//! - **A learner becomes a voter only once caught up**: its replicated index within
//!   [`CAUGHT_UP_WITHIN`] entries of the leader's last one. A voter that could not yet vote
//!   sensibly would weaken the quorum: a 4th voter still receiving a snapshot makes a
//!   3-of-4 quorum out of 3 working members.
//! - **`--join`**: the joiner asks `POST /v1/cluster/members` (with `TTLWHEEL_TOKEN` when the
//!   cluster has tokens), then, unless `--learner`, `POST /v1/cluster/members/{id}/promote`
//!   until it is caught up. Skipped when this member's data directory already holds a cluster
//!   it belongs to: a restart does not join twice.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::ChangeMembers;
use serde::{Deserialize, Serialize};

use super::node::{Cluster, PROPOSE_TIMEOUT};
use super::types::{Member, NodeId};

/// A learner this close to the leader's last entry is caught up enough to vote.
pub const CAUGHT_UP_WITHIN: u64 = 64;
/// How often `--join` asks again (the member it joins through is restarting, the learner is
/// still catching up).
const JOIN_RETRY: Duration = Duration::from_millis(500);

/// `POST /v1/cluster/members`: the member to add as a learner.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewMember {
    pub id: NodeId,
    /// Where peers reach it (its `--cluster-listen`, as they can dial it).
    pub peer_addr: String,
    /// Its API's URL (`--advertise-api`).
    pub api_addr: String,
}

/// Why a membership change was not made.
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    #[error("{0}")]
    Invalid(String),
    #[error("member {0} is not in the cluster")]
    NoSuchMember(NodeId),
    #[error("{0}")]
    Conflict(String),
    #[error(
        "member {id} has replicated up to entry {matched} of {last}: it becomes a voter once \
         within {CAUGHT_UP_WITHIN} entries; retry"
    )]
    NotCaughtUp { id: NodeId, matched: u64, last: u64 },
    #[error("another membership change is in progress; retry when it is done")]
    Changing,
    #[error("this member does not lead; the leader is {0:?}")]
    NotLeader(Option<NodeId>),
    #[error("the membership change was not committed within {0:?}; it may still be; retry")]
    NoQuorum(Duration),
    #[error("the cluster member is stopping or failed: {0}")]
    Stopped(String),
}

impl NewMember {
    fn check(&self) -> Result<(), MembershipError> {
        if self.id == 0 {
            return Err(MembershipError::Invalid(
                "a member's id is 1 or more".into(),
            ));
        }
        let peer_ok = self
            .peer_addr
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !peer_ok {
            return Err(MembershipError::Invalid(format!(
                "peer_addr {:?} is not HOST:PORT",
                self.peer_addr
            )));
        }
        if !(self.api_addr.starts_with("http://") || self.api_addr.starts_with("https://")) {
            return Err(MembershipError::Invalid(format!(
                "api_addr {:?} is not an http:// or https:// URL",
                self.api_addr
            )));
        }
        Ok(())
    }
}

/// What openraft answers a membership change with, or the timeout's expiry.
type Written<T> = Result<
    Result<T, RaftError<NodeId, ClientWriteError<NodeId, Member>>>,
    tokio::time::error::Elapsed,
>;

/// openraft's answer to a membership change, as ours.
fn change_outcome<T>(written: Written<T>) -> Result<(), MembershipError> {
    match written {
        Err(_) => Err(MembershipError::NoQuorum(PROPOSE_TIMEOUT)),
        Ok(Ok(_)) => Ok(()),
        Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward)))) => {
            Err(MembershipError::NotLeader(forward.leader_id))
        }
        Ok(Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(refused)))) => {
            Err(match refused {
                // Transient (the leader's own address update, or a joint change finishing).
                ChangeMembershipError::InProgress(_) => MembershipError::Changing,
                other => MembershipError::Conflict(other.to_string()),
            })
        }
        Ok(Err(error)) => Err(MembershipError::Stopped(error.to_string())),
    }
}

impl Cluster {
    /// The membership as this member knows it: every member's addresses, and the voters.
    fn membership(&self) -> (BTreeMap<NodeId, Member>, BTreeSet<NodeId>) {
        let metrics = self.raft().metrics();
        let metrics = metrics.borrow();
        let membership = metrics.membership_config.membership();
        let nodes = membership
            .nodes()
            .map(|(id, member)| (*id, member.clone()))
            .collect();
        (nodes, membership.voter_ids().collect())
    }

    fn require_leader(&self) -> Result<(), MembershipError> {
        let leader = self.raft().metrics().borrow().current_leader;
        if leader == Some(self.id()) {
            Ok(())
        } else {
            Err(MembershipError::NotLeader(leader))
        }
    }

    /// Adds `member` as a learner: replication to it starts at once (a snapshot first when the
    /// log it needs was purged). Answers once the change is committed, not once it caught up.
    pub async fn add_learner(&self, member: NewMember) -> Result<(), MembershipError> {
        member.check()?;
        self.require_leader()?;
        let (nodes, _) = self.membership();
        if let Some(known) = nodes.get(&member.id) {
            if known.peer_addr == member.peer_addr && known.api_addr == member.api_addr {
                return Ok(());
            }
            return Err(MembershipError::Conflict(format!(
                "member {} is already in the cluster with peer_addr {:?} and api_addr {:?}: \
                 remove it first to change its addresses",
                member.id, known.peer_addr, known.api_addr
            )));
        }
        let node = Member {
            peer_addr: member.peer_addr,
            api_addr: member.api_addr,
        };
        let written = tokio::time::timeout(
            PROPOSE_TIMEOUT,
            self.raft().add_learner(member.id, node, false),
        )
        .await;
        change_outcome(written)
    }

    /// Makes learner `id` a voter once it has caught up.
    pub async fn promote_member(&self, id: NodeId) -> Result<(), MembershipError> {
        self.require_leader()?;
        let (nodes, voters) = self.membership();
        if voters.contains(&id) {
            return Ok(());
        }
        if !nodes.contains_key(&id) {
            return Err(MembershipError::NoSuchMember(id));
        }
        let (last, matched) = {
            let metrics = self.raft().metrics();
            let metrics = metrics.borrow();
            let matched = metrics
                .replication
                .as_ref()
                .and_then(|replication| replication.get(&id).cloned().flatten())
                .map(|log_id| log_id.index);
            (metrics.last_log_index.unwrap_or(0), matched)
        };
        // A learner that never acknowledged an entry is not caught up, however short the log:
        // it may not even be running (a young cluster's log is shorter than the margin).
        match matched {
            Some(matched) if matched + CAUGHT_UP_WITHIN >= last => {}
            _ => {
                let matched = matched.unwrap_or(0);
                return Err(MembershipError::NotCaughtUp { id, matched, last });
            }
        }
        let change = ChangeMembers::AddVoterIds(BTreeSet::from([id]));
        let written = tokio::time::timeout(
            PROPOSE_TIMEOUT,
            self.raft().change_membership(change, false),
        )
        .await;
        change_outcome(written)
    }

    /// Removes member `id`, voter or learner. A voter is removed through a joint
    /// configuration; the last voter cannot be.
    pub async fn remove_member(&self, id: NodeId) -> Result<(), MembershipError> {
        self.require_leader()?;
        let (nodes, voters) = self.membership();
        if !nodes.contains_key(&id) {
            return Err(MembershipError::NoSuchMember(id));
        }
        let change = if voters.contains(&id) {
            if voters.len() == 1 {
                return Err(MembershipError::Conflict(format!(
                    "member {id} is the last voter: a cluster cannot be left without one"
                )));
            }
            ChangeMembers::RemoveVoters(BTreeSet::from([id]))
        } else {
            ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        };
        let written = tokio::time::timeout(
            PROPOSE_TIMEOUT,
            self.raft().change_membership(change, false),
        )
        .await;
        change_outcome(written)
    }

    /// Whether this member is in the membership it knows (false on a new, empty member).
    pub fn is_member(&self) -> bool {
        self.membership().0.contains_key(&self.id())
    }
}

/// What `--join` needs.
#[derive(Clone, Debug)]
pub struct Join {
    /// An existing member's API URL.
    pub via: String,
    /// This member, as the cluster should know it.
    pub me: NewMember,
    /// `TTLWHEEL_TOKEN`: an admin token, when the cluster has tokens.
    pub token: Option<String>,
    /// `--learner`: stay a learner.
    pub learner: bool,
}

/// Runs `--join`: adds this member as a learner through `join.via`, then (unless `--learner`)
/// asks for its promotion until it is caught up. Retries while the answer says "later" (no
/// leader, no quorum, not caught up, a refused connection); stops, logging why, on a refusal.
pub async fn run_join(join: Join) {
    let client = match reqwest::Client::builder()
        .timeout(PROPOSE_TIMEOUT + Duration::from_secs(5))
        .build()
    {
        Ok(client) => client,
        Err(error) => {
            tracing::error!(%error, "--join: cannot build an HTTP client");
            return;
        }
    };
    let base = join.via.trim_end_matches('/').to_owned();
    let add = format!("{base}/v1/cluster/members");
    if !ask_until_done(&client, &add, Some(&join.me), join.token.as_deref()).await {
        return;
    }
    tracing::info!(via = %base, id = join.me.id, "--join: added as a learner");
    if join.learner {
        return;
    }
    let promote = format!("{base}/v1/cluster/members/{}/promote", join.me.id);
    if ask_until_done(&client, &promote, None, join.token.as_deref()).await {
        tracing::info!(id = join.me.id, "--join: promoted to a voter");
    }
}

/// POSTs `body` to `url` until a 2xx (true) or a refusal that retrying cannot change (false).
async fn ask_until_done(
    client: &reqwest::Client,
    url: &str,
    body: Option<&NewMember>,
    token: Option<&str>,
) -> bool {
    loop {
        let mut request = client.post(url);
        if let Some(body) = body {
            // reqwest's `json` feature is not ours (only the tests' build has it).
            let body = serde_json::to_vec(body).expect("a member serializes");
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body);
        }
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        match request.send().await {
            Ok(answer) if answer.status().is_success() => return true,
            Ok(answer) => {
                let status = answer.status();
                let text = answer.text().await.unwrap_or_default();
                let later = status.is_server_error()
                    || text.contains("\"not_caught_up\"")
                    || text.contains("\"membership_changing\"");
                if !later {
                    tracing::error!(%url, %status, answer = %text, "--join: refused; not retrying");
                    return false;
                }
                tracing::debug!(%url, %status, answer = %text, "--join: not yet; retrying");
            }
            Err(error) => tracing::debug!(%url, %error, "--join: no answer; retrying"),
        }
        tokio::time::sleep(JOIN_RETRY).await;
    }
}
