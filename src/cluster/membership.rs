//! Changing who is in the cluster (issue 28, section 1): adding a learner, promoting it to a
//! voter once it has caught up, removing a member; and `--join`, which a new member runs
//! against any existing one to do the first two to itself.
//!
//! - **Only the leader changes the membership** (the API forwards these routes to it). Each
//!   change is one openraft membership change; openraft moves voters through a joint
//!   configuration (the old and the new voter set, each needing its majority), then to the
//!   new set alone: two log entries, the second proposed once the first is committed.
//! - **A change is never left half-made.** The change runs in a task of its own, so a caller
//!   that stops waiting (the API's [`PROPOSE_TIMEOUT`], a client gone) does not abandon its
//!   second step: a joint configuration committed later is still finished by this leader. A
//!   committed joint configuration that no change is finishing (a new leader inherited it
//!   from one that failed between the two steps; a change of addresses only, which openraft
//!   makes in two steps too, rewrote it) is finished by the leader by itself
//!   ([`finish_left_over_joint`]), towards the new set, as the failed change would have.
//! - **Idempotent, and true while joint**: adding a member that is already there with the same
//!   addresses, promoting a voter and removing a member that is gone answer as if done, so a
//!   client (or `--join`) that retries after a timeout never gets a misleading error. A member
//!   is "already a voter" only in a uniform configuration: while joint, retrying the promotion
//!   (or the removal) makes the change that finishes the joint phase; openraft goes from the
//!   joint configuration straight to the asked-for set. `GET /v1/cluster` shows the voter sets
//!   in force and whether a change is unfinished ([`MembershipStatus`]).
//! - **A learner becomes a voter only once caught up**: its replicated index within
//!   [`CAUGHT_UP_WITHIN`] entries of the leader's last one. A voter that could not yet vote
//!   sensibly would weaken the quorum: a 4th voter still receiving a snapshot makes a
//!   3-of-4 quorum out of 3 working members. (A member already in the new set of a joint
//!   configuration counts in a quorum already: finishing the phase is not held back for it.)
//! - **`--join`**: the joiner asks `POST /v1/cluster/members` (with `TTLWHEEL_TOKEN` when the
//!   cluster has tokens), then, unless `--learner`, `POST /v1/cluster/members/{id}/promote`
//!   until it is caught up. Skipped when this member's data directory already holds a cluster
//!   it belongs to: a restart does not join twice.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::{ChangeMembers, Membership, Raft, RaftMetrics, ServerState};
use serde::{Deserialize, Serialize};

use super::node::{Cluster, PROPOSE_TIMEOUT};
use super::types::{LogId, Member, NodeId, StoredMembership, TypeConfig};

/// A learner this close to the leader's last entry is caught up enough to vote.
pub const CAUGHT_UP_WITHIN: u64 = 64;
/// How often a leader looks for a left-over joint configuration to finish.
const FINISH_CHECK_EVERY: Duration = Duration::from_millis(500);
/// A committed joint configuration unchanged this long is left over: no change is finishing
/// it. Far longer than the gap between openraft's two steps (the second is proposed as soon
/// as the first is committed), so the leader does not race a change in progress.
const LEFT_OVER_AFTER: Duration = Duration::from_secs(2);
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

/// The membership as `GET /v1/cluster` shows it (`membership`): the voter sets in force and
/// whether a change is unfinished.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembershipStatus {
    /// The voter sets a quorum is counted in: one set when the configuration is uniform; the
    /// old set then the new one while a change of voters is in its joint phase (a quorum then
    /// needs a majority of each).
    pub voters: Vec<Vec<NodeId>>,
    /// The index of the log entry that set this membership (0: none yet).
    pub log_index: u64,
    /// Whether this member knows that entry committed.
    pub committed: bool,
    /// Whether a change is unfinished: the entry is not committed yet, or the configuration is
    /// joint. The leader finishes a change it proposed or inherited; retrying the change (the
    /// same call) finishes it too.
    pub changing: bool,
}

/// `membership`, set by the entry `stored` names, as shown to an operator; `committed` is the
/// highest index this member knows committed (`None`: nothing yet).
pub(super) fn membership_status(
    stored: &StoredMembership,
    committed: Option<u64>,
) -> MembershipStatus {
    let voters: Vec<Vec<NodeId>> = (stored.membership().get_joint_config().iter())
        .map(|set| set.iter().copied().collect())
        .collect();
    let log_index = stored.log_id().map_or(0, |log_id| log_id.index);
    let committed = stored
        .log_id()
        .zip(committed)
        .is_some_and(|(written, committed)| written.index <= committed);
    let changing = !committed || voters.len() > 1;
    MembershipStatus {
        voters,
        log_index,
        committed,
        changing,
    }
}

/// What promoting a member takes, given the membership.
#[derive(Debug, PartialEq, Eq)]
enum Promotion {
    /// It is a voter of a uniform configuration: nothing.
    Done,
    /// It is in the new set of a joint configuration: the change that finishes the phase
    /// (it counts in a quorum already: no catching up to wait for).
    FinishJoint,
    /// A learner (or a voter being removed in a joint phase): the change, once it caught up.
    OnceCaughtUp,
}

fn promotion(
    membership: &Membership<NodeId, Member>,
    id: NodeId,
) -> Result<Promotion, MembershipError> {
    let sets = membership.get_joint_config();
    let in_new_set = sets.last().is_some_and(|set| set.contains(&id));
    match (in_new_set, sets.len()) {
        (true, 1) => Ok(Promotion::Done),
        (true, _) => Ok(Promotion::FinishJoint),
        (false, _) if membership.get_node(&id).is_some() => Ok(Promotion::OnceCaughtUp),
        (false, _) => Err(MembershipError::NoSuchMember(id)),
    }
}

/// The change that removes member `id` from `membership`: out of the voter sets if it is in
/// one (while joint, out of the new set, which finishes the phase), else out of the learners.
fn removal(
    membership: &Membership<NodeId, Member>,
    id: NodeId,
) -> Result<ChangeMembers<NodeId, Member>, MembershipError> {
    if membership.get_node(&id).is_none() {
        return Err(MembershipError::NoSuchMember(id));
    }
    let sets = membership.get_joint_config();
    if !sets.iter().any(|set| set.contains(&id)) {
        return Ok(ChangeMembers::RemoveNodes(BTreeSet::from([id])));
    }
    let left = sets
        .last()
        .map_or(0, |set| set.iter().filter(|&&voter| voter != id).count());
    if left == 0 {
        return Err(MembershipError::Conflict(format!(
            "member {id} is the last voter: a cluster cannot be left without one"
        )));
    }
    Ok(ChangeMembers::RemoveVoters(BTreeSet::from([id])))
}

/// The entry and new voter set of the joint configuration the leader `metrics` describes has
/// committed, if it has one (`None` on a follower, or while uniform or uncommitted).
fn committed_joint(metrics: &RaftMetrics<NodeId, Member>) -> Option<(LogId, BTreeSet<NodeId>)> {
    if metrics.state != ServerState::Leader || metrics.current_leader != Some(metrics.id) {
        return None;
    }
    let stored = &metrics.membership_config;
    let sets = stored.membership().get_joint_config();
    let written = (*stored.log_id())?;
    let applied = metrics.last_applied.map_or(0, |log_id| log_id.index);
    if sets.len() < 2 || written.index > applied {
        return None;
    }
    Some((written, sets.last()?.clone()))
}

/// Tells when a committed joint configuration has been left over: seen, the same entry, for
/// [`LEFT_OVER_AFTER`].
#[derive(Debug, Default)]
struct LeftOver {
    seen: Option<(LogId, Instant)>,
}

impl LeftOver {
    /// Whether the committed joint configuration written at `joint` (if any), seen `now`, is
    /// left over.
    fn due(&mut self, joint: Option<LogId>, now: Instant) -> bool {
        match (joint, self.seen) {
            (None, _) => {
                self.seen = None;
                false
            }
            (Some(joint), Some((seen, since))) if seen == joint => {
                now.saturating_duration_since(since) >= LEFT_OVER_AFTER
            }
            (Some(joint), _) => {
                self.seen = Some((joint, now));
                false
            }
        }
    }
}

/// Each member's task; on the leader, finishes a left-over joint configuration (see the
/// module documentation) towards its new voter set, as the change that made it would have.
/// Members only in the old set leave the membership, as a removal (`retain` false) asks.
pub(super) async fn finish_left_over_joint(raft: Raft<TypeConfig>) {
    let mut left_over = LeftOver::default();
    loop {
        tokio::time::sleep(FINISH_CHECK_EVERY).await;
        let joint = committed_joint(&raft.metrics().borrow());
        let written = joint.as_ref().map(|(written, _)| *written);
        if !left_over.due(written, Instant::now()) {
            continue;
        }
        let Some((_, new_set)) = joint else { continue };
        tracing::info!(voters = ?new_set, "finishing a left-over joint configuration");
        let change = ChangeMembers::ReplaceAllVoters(new_set);
        match change_outcome(propose(&raft, change).await) {
            Ok(()) => tracing::info!("the left-over membership change is finished"),
            Err(error) => {
                tracing::warn!(%error, "the left-over membership change is not finished yet")
            }
        }
        left_over = LeftOver::default();
    }
}

/// What openraft answers a membership change with: the timeout's expiry, the change task's
/// failure, or openraft's answer.
type Written = Result<
    Result<
        Result<
            openraft::raft::ClientWriteResponse<TypeConfig>,
            RaftError<NodeId, ClientWriteError<NodeId, Member>>,
        >,
        tokio::task::JoinError,
    >,
    tokio::time::error::Elapsed,
>;

/// Proposes a change of voters and waits for it at most [`PROPOSE_TIMEOUT`]. The change runs
/// in a task of its own: dropping this future (the timeout, an HTTP client gone) would drop
/// openraft's call between its two steps, leaving a committed joint configuration that no
/// one finishes.
async fn propose(raft: &Raft<TypeConfig>, change: ChangeMembers<NodeId, Member>) -> Written {
    let raft = raft.clone();
    let change = tokio::spawn(async move { raft.change_membership(change, false).await });
    tokio::time::timeout(PROPOSE_TIMEOUT, change).await
}

/// openraft's answer to a membership change, as ours.
fn change_outcome(written: Written) -> Result<(), MembershipError> {
    let answer = match written {
        Err(_) => return Err(MembershipError::NoQuorum(PROPOSE_TIMEOUT)),
        Ok(Err(failed)) => return Err(MembershipError::Stopped(failed.to_string())),
        Ok(Ok(answer)) => answer,
    };
    match answer {
        Ok(_) => Ok(()),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
            Err(MembershipError::NotLeader(forward.leader_id))
        }
        Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(refused))) => {
            Err(match refused {
                // Transient (the leader's own address update, or a joint change finishing).
                ChangeMembershipError::InProgress(_) => MembershipError::Changing,
                other => MembershipError::Conflict(other.to_string()),
            })
        }
        Err(error) => Err(MembershipError::Stopped(error.to_string())),
    }
}

impl Cluster {
    /// The membership as this member knows it (the newest entry's, committed or not).
    fn membership(&self) -> Membership<NodeId, Member> {
        let metrics = self.raft().metrics();
        let metrics = metrics.borrow();
        metrics.membership_config.membership().clone()
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
        if let Some(known) = self.membership().get_node(&member.id) {
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
        // One step (no joint phase): dropping it on the timeout abandons nothing.
        let written = tokio::time::timeout(
            PROPOSE_TIMEOUT,
            self.raft().add_learner(member.id, node, false),
        )
        .await;
        change_outcome(written.map(Ok))
    }

    /// Makes learner `id` a voter once it has caught up; while a joint configuration has it in
    /// its new set, finishes that change.
    pub async fn promote_member(&self, id: NodeId) -> Result<(), MembershipError> {
        self.require_leader()?;
        match promotion(&self.membership(), id)? {
            Promotion::Done => return Ok(()),
            Promotion::FinishJoint => {}
            Promotion::OnceCaughtUp => self.require_caught_up(id)?,
        }
        let change = ChangeMembers::AddVoterIds(BTreeSet::from([id]));
        change_outcome(propose(self.raft(), change).await)
    }

    /// Refuses unless member `id` replicated up to within [`CAUGHT_UP_WITHIN`] entries of
    /// this leader's last one.
    fn require_caught_up(&self, id: NodeId) -> Result<(), MembershipError> {
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
            Some(matched) if matched + CAUGHT_UP_WITHIN >= last => Ok(()),
            _ => {
                let matched = matched.unwrap_or(0);
                Err(MembershipError::NotCaughtUp { id, matched, last })
            }
        }
    }

    /// Removes member `id`, voter or learner. A voter is removed through a joint
    /// configuration; the last voter cannot be.
    pub async fn remove_member(&self, id: NodeId) -> Result<(), MembershipError> {
        self.require_leader()?;
        let change = removal(&self.membership(), id)?;
        change_outcome(propose(self.raft(), change).await)
    }

    /// Whether this member is in the membership it knows (false on a new, empty member).
    pub fn is_member(&self) -> bool {
        self.membership().get_node(&self.id()).is_some()
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use openraft::CommittedLeaderId;

    use super::*;

    fn member(id: NodeId) -> (NodeId, Member) {
        let peer_addr = format!("127.0.0.1:{}", 7000 + id);
        let api_addr = format!("http://127.0.0.1:{}", 8000 + id);
        (
            id,
            Member {
                peer_addr,
                api_addr,
            },
        )
    }

    /// The membership with voter `sets` and every member of `nodes` (learners: the others).
    fn membership(sets: &[&[NodeId]], nodes: &[NodeId]) -> Membership<NodeId, Member> {
        let sets = sets
            .iter()
            .map(|set| set.iter().copied().collect())
            .collect();
        let nodes: BTreeMap<NodeId, Member> = nodes.iter().map(|&id| member(id)).collect();
        Membership::new(sets, nodes)
    }

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    #[test]
    fn a_member_in_the_new_set_of_a_joint_configuration_is_not_yet_a_voter() {
        let uniform = membership(&[&[1, 2, 3, 4]], &[1, 2, 3, 4]);
        assert_eq!(promotion(&uniform, 4).unwrap(), Promotion::Done);
        // Promoting 4 was interrupted between its two steps: the retry finishes it.
        let joint = membership(&[&[1, 2, 3], &[1, 2, 3, 4]], &[1, 2, 3, 4]);
        assert!(
            joint.voter_ids().any(|id| id == 4),
            "openraft counts it a voter"
        );
        assert_eq!(promotion(&joint, 4).unwrap(), Promotion::FinishJoint);
        // A voter being removed (old set only) and a learner need catching up.
        let removing = membership(&[&[1, 2, 3], &[1, 2]], &[1, 2, 3, 4]);
        assert_eq!(promotion(&removing, 3).unwrap(), Promotion::OnceCaughtUp);
        assert_eq!(promotion(&removing, 4).unwrap(), Promotion::OnceCaughtUp);
        assert!(matches!(
            promotion(&removing, 9),
            Err(MembershipError::NoSuchMember(9))
        ));
    }

    #[test]
    fn removing_a_voter_leaves_the_new_set_and_a_learner_the_nodes() {
        let joint = membership(&[&[1, 2, 3], &[1, 2, 3, 4]], &[1, 2, 3, 4, 5]);
        let voters = |change| match change {
            Ok(ChangeMembers::RemoveVoters(ids)) => ids,
            other => panic!("{other:?}"),
        };
        assert_eq!(voters(removal(&joint, 1)), BTreeSet::from([1]));
        // In the old set only: a removal being retried.
        let removing = membership(&[&[1, 2, 3], &[2, 3]], &[1, 2, 3]);
        assert_eq!(voters(removal(&removing, 1)), BTreeSet::from([1]));
        assert!(matches!(
            removal(&joint, 5),
            Ok(ChangeMembers::RemoveNodes(ids)) if ids == BTreeSet::from([5])
        ));
        assert!(matches!(
            removal(&joint, 9),
            Err(MembershipError::NoSuchMember(9))
        ));
        let last = membership(&[&[1]], &[1, 2]);
        assert!(matches!(
            removal(&last, 1),
            Err(MembershipError::Conflict(_))
        ));
        let leaving_last = membership(&[&[1, 2], &[2]], &[1, 2]);
        assert!(matches!(
            removal(&leaving_last, 2),
            Err(MembershipError::Conflict(_))
        ));
    }

    #[test]
    fn the_status_says_a_joint_or_uncommitted_membership_is_changing() {
        let joint = membership(&[&[1, 2, 3], &[1, 2, 3, 4]], &[1, 2, 3, 4]);
        let stored = StoredMembership::new(Some(log_id(2, 40)), joint);
        let status = membership_status(&stored, Some(39));
        assert_eq!(status.voters, vec![vec![1, 2, 3], vec![1, 2, 3, 4]]);
        assert_eq!(
            (status.log_index, status.committed, status.changing),
            (40, false, true)
        );
        let status = membership_status(&stored, Some(40));
        assert_eq!((status.committed, status.changing), (true, true));
        let uniform = membership(&[&[1, 2, 3, 4]], &[1, 2, 3, 4]);
        let stored = StoredMembership::new(Some(log_id(3, 45)), uniform);
        let status = membership_status(&stored, Some(44));
        assert_eq!((status.committed, status.changing), (false, true));
        assert!(!membership_status(&stored, None).committed);
        let status = membership_status(&stored, Some(50));
        assert_eq!(status.voters, vec![vec![1, 2, 3, 4]]);
        assert_eq!((status.committed, status.changing), (true, false));
    }

    /// Leader 2's metrics with the joint configuration written at `written`, `applied` applied.
    fn leader_metrics(written: LogId, applied: u64) -> RaftMetrics<NodeId, Member> {
        let joint = membership(&[&[1, 2, 3], &[1, 2, 3, 4]], &[1, 2, 3, 4]);
        let mut metrics = RaftMetrics::new_initial(2);
        metrics.state = ServerState::Leader;
        metrics.current_leader = Some(2);
        metrics.current_term = 3;
        metrics.last_applied = Some(log_id(3, applied));
        metrics.membership_config = Arc::new(StoredMembership::new(Some(written), joint));
        metrics
    }

    #[test]
    fn a_leader_looks_only_at_a_committed_joint_configuration() {
        let written = log_id(2, 40);
        let found = Some((written, BTreeSet::from([1, 2, 3, 4])));
        assert_eq!(committed_joint(&leader_metrics(written, 41)), found);
        // Not committed yet (a new leader's first entry is not).
        assert_eq!(committed_joint(&leader_metrics(written, 39)), None);
        let mut follower = leader_metrics(written, 41);
        follower.state = ServerState::Follower;
        follower.current_leader = Some(1);
        assert_eq!(committed_joint(&follower), None);
        let mut uniform = leader_metrics(written, 41);
        let members = membership(&[&[1, 2, 3]], &[1, 2, 3]);
        uniform.membership_config = Arc::new(StoredMembership::new(Some(written), members));
        assert_eq!(committed_joint(&uniform), None);
    }

    #[test]
    fn a_joint_configuration_is_left_over_once_unchanged_for_the_delay() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut left_over = LeftOver::default();
        assert!(!left_over.due(Some(log_id(2, 40)), at(0)));
        assert!(!left_over.due(Some(log_id(2, 40)), at(1_999)));
        assert!(left_over.due(Some(log_id(2, 40)), at(2_000)));
        // Rewritten (a change moved it): the delay starts again.
        assert!(!left_over.due(Some(log_id(3, 41)), at(2_500)));
        assert!(!left_over.due(Some(log_id(3, 41)), at(4_000)));
        assert!(left_over.due(Some(log_id(3, 41)), at(4_500)));
        // Gone (finished), then back: from the start.
        assert!(!left_over.due(None, at(5_000)));
        assert!(!left_over.due(Some(log_id(3, 41)), at(5_100)));
        assert!(!left_over.due(Some(log_id(3, 41)), at(7_000)));
        assert!(left_over.due(Some(log_id(3, 41)), at(7_100)));
    }
}
