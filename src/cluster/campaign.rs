//! The campaign gate: openraft 0.9 has no pre-vote, so this member lets openraft call an
//! election (`raft.runtime_config().elect(true)`) only while enough voters would vote for it
//! to win one; otherwise elections are off (`elect(false)`).
//!
//! **Why**: a follower cut off from the others times out, becomes a candidate and raises its
//! term at every election timeout; when the link heals, its higher term reaches the healthy
//! leader (an AppendEntries answer, a vote request) and the leader steps down: the term jumps
//! and clients get 0.5-1.6 s of 503s for nothing. With the gate, a member that cannot win never
//! campaigns, so its term stays and it rejoins quietly, as etcd's pre-vote gives.
//!
//! **How**: a task ([`run`]) pings every voter of the membership this member knows
//! (`POST /raft/ping`, signed like every peer request) every [`CampaignTiming::probe_every`]
//! (a quarter of `election_timeout_min`: 100 ms by default), each ping bounded by
//! [`CampaignTiming::fresh`] (a blackholed link hangs; pings overlap, so a slow answer does not
//! hold back the next one). A peer answers its id and whether it is *held* ([`held`]): it leads
//! with a quorum acknowledgment within the leader lease (`election_timeout_max`), or it accepted
//! an AppendEntries within that lease (then openraft refuses every vote until the lease runs
//! out: `engine_impl.rs`, `handle_vote_req`). A peer whose newest answered ping was *sent*
//! within `fresh` and said "not held" would vote for us (our log permitting): it *counts*.
//! Elections are on while, in every config of the membership (both of a joint one, as a
//! candidate needs), this member (if in it) and the peers that count are a majority
//! ([`may_campaign`]). A single voter always may; a learner may not (openraft would not let it
//! campaign anyway), and learners are not pinged.
//!
//! Only pings count, not the other RPCs this member exchanges: those would say a peer is
//! reachable, not whether it is held; and a follower, the member that needs the gate, sends its
//! peers almost nothing else (forwards to the leader, which is held anyway).
//!
//! **`fresh` is `election_timeout_max`** (800 ms by default), not shorter: on a loaded machine
//! (the heavy failover test: three debug members and 10,000 keys on two cores) answers came
//! 250-450 ms after their pings, so a 400 ms bound made the gate flap and could have kept it
//! shut while the peers were there. It stays below the soonest an isolated follower's own
//! timer fires, `election_timeout_max + election_timeout_min` (1.2 s) after its last
//! AppendEntries: even a peer whose last answer before a cut said "not held" stops counting
//! before then (see the isolated follower below).
//!
//! # Safety
//! Disabling elections never breaks Raft's safety: no vote, log or commit rule changes, and a
//! member that does not campaign only does less. What the gate risks is liveness, below.
//!
//! # Liveness
//! - **Leader killed** (or SIGSTOPped, or cut off from both followers): each follower stays
//!   held until its last AppendEntries plus the lease (`election_timeout_max`), then answers
//!   "not held"; the other follower's next ping (at most `probe_every` later, plus its round
//!   trip) opens its gate. Its own openraft timer fires no sooner than `election_timeout_max +
//!   election_timeout_min` after its last AppendEntries (the two followers' last ones a
//!   heartbeat, 150 ms, apart at most), so the gate is open 100-300 ms before: failover is not
//!   slower. A late answer only delays the election until it comes (openraft checks at each
//!   tick, every 225 ms, and elects at once when allowed). A resumed or healed old leader steps
//!   down at the new term, as before.
//! - **Cluster start**: the founder's first election comes from `initialize`, which the gate
//!   does not govern. Elections start off ([`super::node`] sets openraft's `enable_elect` false)
//!   and open at the first pings the peers answer (no leader yet: nobody is held), so a later
//!   election (the founder's first one lost because its peers were not up yet) waits only for
//!   the peers, which it needs anyway. Measured: the first leader ready 0.48-1.2 s after the
//!   processes start, as without the gate (0.46-0.99 s), on a loaded machine.
//! - **A member restarting**: its gate starts closed; the leader's members answer "held", so it
//!   stays closed and the member follows the leader's first AppendEntries. A whole cluster
//!   restarting: nobody is held, the gates open at the first answers.
//! - **An isolated follower**: its last answers before the cut said "held" (its peers follow a
//!   leader that has its quorum), and no answer comes after it, so it never campaigns and its
//!   term never moves; at the heal it takes the leader's AppendEntries in the same term. Should
//!   a last answer have said "not held" (a loaded leader whose quorum acknowledgment was late),
//!   it stops counting `fresh` after its ping, before the follower's timer fires (above). The same
//!   holds for a follower cut off from the leader only (its peers still follow the leader: held),
//!   and for one whose AppendEntries are lost but whose requests reach the leader (the leader,
//!   with its quorum, is held). Such a follower stays without a leader until the link heals, as
//!   with etcd's pre-vote and check-quorum, instead of deposing a leader that serves a quorum.
//! - **No deadlock**: a held peer is held by a leader that sends it AppendEntries. If that leader
//!   and the peers it holds are a majority, that leader has a quorum and the cluster is live; if
//!   not, the leader answers "not held" and the gate asks no more than openraft's own vote rules
//!   (which refuse a vote within the lease) already would. The one place the gate is stricter
//!   than openraft is a leader with a quorum (0.9's leader grants a higher vote), and then a
//!   leader serves.
//!
//! # Bounds and approximations
//! A "not held" answer counts for `fresh` after its ping: a peer that has just been cut off, or
//! has just started following a new leader, still counts that long, and a campaign then can fail
//! and raise this member's term once (as it would without the gate). "Held" is read from our own
//! stamp of the last accepted AppendEntries (`peer_server`'s `leader_contact`), taken as the
//! request arrives: openraft's lease starts a moment later, and it also counts AppendEntries it
//! answers with a conflict, so it can last a little longer than the answer says (near the lease's
//! end only). Under load a leader's quorum acknowledgment can pass the lease and the gate then
//! flaps (`ttlwheel_cluster_may_campaign`; transitions are logged at debug level): a follower
//! that hears from the leader does not campaign whatever the gate says.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::{Raft, RaftMetrics, ServerState};
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

use super::network::{route, Peers};
use super::types::{Member, NodeId, TypeConfig};

/// How the gate times its pings and judges their answers, from the member's election timeouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CampaignTiming {
    /// Between two pings to each voter: a quarter of `election_timeout_min`.
    pub probe_every: Duration,
    /// How long an answer counts, from when its ping was sent; also a ping's timeout:
    /// `election_timeout_max` (the module documentation says why).
    pub fresh: Duration,
    /// A peer that heard from a leader (or, leading, from a quorum) within this is held:
    /// `election_timeout_max`, openraft 0.9's leader lease.
    pub lease: Duration,
}

impl CampaignTiming {
    /// The timing for openraft's `election_timeout_min` and `_max`.
    pub fn new((election_min, election_max): (Duration, Duration)) -> Self {
        Self {
            probe_every: election_min / 4,
            fresh: election_max,
            lease: election_max,
        }
    }
}

/// What `POST /raft/ping` answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PingAnswer {
    /// The answering member's id (a ping answered by another member does not count).
    pub node_id: NodeId,
    /// Whether it would refuse a vote now ([`held`]).
    pub held: bool,
}

/// Whether a member would refuse to vote for a candidate now: it leads and a quorum
/// acknowledged it within `lease` (`millis_since_quorum_ack`), or it accepted an AppendEntries
/// within `lease` (`leader_contact`; openraft refuses votes in that lease). A leader without a
/// recent quorum is not held: a majority may have to replace it.
pub fn held(
    metrics: &RaftMetrics<NodeId, Member>,
    leader_contact: Option<Instant>,
    lease: Duration,
    now: Instant,
) -> bool {
    if metrics.state == ServerState::Leader {
        return (metrics.millis_since_quorum_ack)
            .is_some_and(|ms| u128::from(ms) < lease.as_millis());
    }
    leader_contact.is_some_and(|at| now.saturating_duration_since(at) < lease)
}

/// A peer's newest answered ping: when it was sent, and whether the peer was held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heard {
    /// When the ping was sent (before sending: an answer only ever looks older than it is).
    pub sent_at: Instant,
    /// What the peer answered: whether a leader held it ([`held`]).
    pub held: bool,
}

/// Whether a campaign by `me` could win now: `me` is a voter (in some config of `configs`: one,
/// or the two of a joint membership), and in every config `me` (if in it) and the peers whose
/// newest answer, sent within `fresh` of `now`, said "not held" are a majority. A learner, or a
/// member that knows no membership yet, may not (openraft would not let it anyway).
pub fn may_campaign(
    me: NodeId,
    configs: &[BTreeSet<NodeId>],
    heard: &HashMap<NodeId, Heard>,
    now: Instant,
    fresh: Duration,
) -> bool {
    let would_vote = |id: &NodeId| {
        *id == me
            || heard.get(id).is_some_and(|heard| {
                !heard.held && now.saturating_duration_since(heard.sent_at) < fresh
            })
    };
    let voter = configs.iter().any(|config| config.contains(&me));
    let majority = |config: &BTreeSet<NodeId>| {
        config.iter().filter(|id| would_vote(id)).count() > config.len() / 2
    };
    voter && configs.iter().all(majority)
}

/// The gate's state, shared with `/metrics` and `GET /v1/cluster`.
#[derive(Debug, Default)]
pub struct CampaignGate {
    /// Whether openraft may call an election now (starts false, as openraft's `enable_elect`).
    open: AtomicBool,
}

impl CampaignGate {
    /// Whether this member may call an election now.
    pub fn may_campaign(&self) -> bool {
        self.open.load(Ordering::Relaxed)
    }

    /// Turns openraft's elections on or off, and says so (debug: under load it flaps) when that
    /// changes.
    fn set(&self, open: bool, raft: &Raft<TypeConfig>, heard: &HashMap<NodeId, Heard>) {
        raft.runtime_config().elect(open);
        if self.open.swap(open, Ordering::Relaxed) != open {
            let now = Instant::now();
            let peers: BTreeMap<NodeId, (u128, bool)> = (heard.iter())
                .map(|(&id, heard)| {
                    let age = now.saturating_duration_since(heard.sent_at).as_millis();
                    (id, (age, heard.held))
                })
                .collect();
            tracing::debug!(
                may_campaign = open,
                ?peers,
                "campaign gate: elections {} (peers: ms since the newest answered ping, held)",
                if open { "allowed" } else { "held off" }
            );
        }
    }
}

/// The voters of `raft`'s membership other than `me`, with their entries, and its configs.
fn voters(raft: &Raft<TypeConfig>, me: NodeId) -> (Vec<(NodeId, Member)>, Vec<BTreeSet<NodeId>>) {
    let metrics = raft.metrics();
    let metrics = metrics.borrow();
    let membership = metrics.membership_config.membership();
    let others = (membership.voter_ids())
        .filter(|&id| id != me)
        .filter_map(|id| Some((id, membership.get_node(&id)?.clone())))
        .collect();
    (others, membership.get_joint_config().clone())
}

/// One ping to `peer` at `addr`: its answer, if it came within `timeout` and from `peer`.
async fn ping(
    peers: Arc<Peers>,
    peer: NodeId,
    addr: String,
    timeout: Duration,
) -> Option<(NodeId, Heard)> {
    let sent_at = Instant::now();
    let (status, body) = (peers.post(&addr, route::PING, Vec::new(), timeout).await).ok()?;
    if !status.is_success() {
        return None;
    }
    let answer: PingAnswer = serde_json::from_slice(&body).ok()?;
    let held = answer.held;
    (answer.node_id == peer).then_some((peer, Heard { sent_at, held }))
}

/// Keeps `answer` as `peer`'s if its ping was sent after the one kept (pings overlap, so
/// answers may come out of order).
fn keep_newest(heard: &mut HashMap<NodeId, Heard>, peer: NodeId, answer: Heard) {
    let kept = heard.entry(peer).or_insert(answer);
    if answer.sent_at > kept.sent_at {
        *kept = answer;
    }
}

/// Pings the voters and keeps openraft's elections on exactly while [`may_campaign`] holds,
/// until aborted (pings in flight go with it).
pub async fn run(
    gate: Arc<CampaignGate>,
    raft: Raft<TypeConfig>,
    peers: Arc<Peers>,
    me: NodeId,
    timing: CampaignTiming,
) {
    let mut heard: HashMap<NodeId, Heard> = HashMap::new();
    let mut pings = JoinSet::new();
    let mut configs = Vec::new();
    let mut every = tokio::time::interval(timing.probe_every);
    every.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {
                let (others, now_configs) = voters(&raft, me);
                configs = now_configs;
                heard.retain(|id, _| others.iter().any(|(other, _)| other == id));
                for (peer, member) in others {
                    let addr = peers.address_of(peer, &member);
                    pings.spawn(ping(Arc::clone(&peers), peer, addr, timing.fresh));
                }
            }
            Some(answered) = pings.join_next() => {
                if let Ok(Some((peer, answer))) = answered {
                    keep_newest(&mut heard, peer, answer);
                }
            }
        }
        let open = may_campaign(me, &configs, &heard, Instant::now(), timing.fresh);
        gate.set(open, &raft, &heard);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FRESH: Duration = Duration::from_millis(800);

    fn config(ids: &[NodeId]) -> BTreeSet<NodeId> {
        ids.iter().copied().collect()
    }

    fn heard(now: Instant, answers: &[(NodeId, u64, bool)]) -> HashMap<NodeId, Heard> {
        (answers.iter())
            .map(|&(id, ms_ago, held)| {
                let sent_at = now - Duration::from_millis(ms_ago);
                (id, Heard { sent_at, held })
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_single_voter_always_may_campaign() {
        let now = Instant::now();
        assert!(may_campaign(
            1,
            &[config(&[1])],
            &HashMap::new(),
            now,
            FRESH
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_learner_or_a_member_without_a_membership_may_not_campaign() {
        tokio::time::advance(Duration::from_secs(5)).await;
        let now = Instant::now();
        assert!(!may_campaign(1, &[], &HashMap::new(), now, FRESH));
        let others = heard(now, &[(2, 10, false), (3, 10, false)]);
        assert!(!may_campaign(1, &[config(&[2, 3])], &others, now, FRESH));
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_that_hears_no_voter_may_not_campaign() {
        tokio::time::advance(Duration::from_secs(5)).await;
        let now = Instant::now();
        let three = [config(&[1, 2, 3])];
        assert!(!may_campaign(1, &three, &HashMap::new(), now, FRESH));
        // Answers older than `fresh` do not count, however they answered.
        let stale = heard(now, &[(2, 800, false), (3, 900, false)]);
        assert!(!may_campaign(1, &three, &stale, now, FRESH));
    }

    #[tokio::test(start_paused = true)]
    async fn one_fresh_unheld_peer_of_three_is_a_majority_and_a_held_one_is_not() {
        tokio::time::advance(Duration::from_secs(5)).await;
        let now = Instant::now();
        let three = [config(&[1, 2, 3])];
        assert!(may_campaign(
            1,
            &three,
            &heard(now, &[(2, 799, false)]),
            now,
            FRESH
        ));
        // Held by a leader: it would refuse the vote.
        let held = heard(now, &[(2, 10, true), (3, 10, true)]);
        assert!(!may_campaign(1, &three, &held, now, FRESH));
        let one_held = heard(now, &[(2, 10, true), (3, 10, false)]);
        assert!(may_campaign(1, &three, &one_held, now, FRESH));
    }

    #[tokio::test(start_paused = true)]
    async fn five_voters_need_two_peers() {
        tokio::time::advance(Duration::from_secs(5)).await;
        let now = Instant::now();
        let five = [config(&[1, 2, 3, 4, 5])];
        let one = heard(now, &[(2, 10, false), (3, 10, true)]);
        assert!(!may_campaign(1, &five, &one, now, FRESH));
        let two = heard(now, &[(2, 10, false), (3, 10, false)]);
        assert!(may_campaign(1, &five, &two, now, FRESH));
    }

    #[tokio::test(start_paused = true)]
    async fn a_joint_membership_needs_a_majority_of_each_config() {
        tokio::time::advance(Duration::from_secs(5)).await;
        let now = Instant::now();
        // {1, 2, 3} -> {1, 4, 5}: 2 answers, 4 and 5 do not.
        let joint = [config(&[1, 2, 3]), config(&[1, 4, 5])];
        let old_only = heard(now, &[(2, 10, false)]);
        assert!(!may_campaign(1, &joint, &old_only, now, FRESH));
        let both = heard(now, &[(2, 10, false), (4, 10, false)]);
        assert!(may_campaign(1, &joint, &both, now, FRESH));
        // A member outside one config counts only its peers there: {2, 3, 4} -> {4, 5, 6}.
        let leaving = [config(&[1, 2, 3]), config(&[4, 5, 6])];
        let new_side = heard(now, &[(2, 10, false), (4, 10, false), (5, 10, false)]);
        assert!(may_campaign(1, &leaving, &new_side, now, FRESH));
        let one_new = heard(now, &[(2, 10, false), (4, 10, false)]);
        assert!(!may_campaign(1, &leaving, &one_new, now, FRESH));
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_to_an_older_ping_does_not_replace_a_newer_one() {
        let older = Heard {
            sent_at: Instant::now(),
            held: false,
        };
        tokio::time::advance(Duration::from_millis(100)).await;
        let newer = Heard {
            sent_at: Instant::now(),
            held: true,
        };
        let mut heard = HashMap::new();
        keep_newest(&mut heard, 2, newer);
        keep_newest(&mut heard, 2, older);
        assert_eq!(heard[&2], newer);
        let mut heard = HashMap::new();
        keep_newest(&mut heard, 2, older);
        keep_newest(&mut heard, 2, newer);
        assert_eq!(heard[&2], newer);
    }

    fn metrics(state: ServerState, quorum_ack_ms: Option<u64>) -> RaftMetrics<NodeId, Member> {
        let mut metrics = RaftMetrics::new_initial(1);
        metrics.state = state;
        metrics.millis_since_quorum_ack = quorum_ack_ms;
        metrics
    }

    #[tokio::test(start_paused = true)]
    async fn a_follower_is_held_within_the_lease_after_its_last_append_entries() {
        let lease = Duration::from_millis(800);
        let contact = Instant::now();
        tokio::time::advance(Duration::from_millis(799)).await;
        let follower = metrics(ServerState::Follower, None);
        assert!(held(&follower, Some(contact), lease, Instant::now()));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!held(&follower, Some(contact), lease, Instant::now()));
        assert!(!held(&follower, None, lease, Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_is_held_only_while_a_quorum_acknowledged_it_within_the_lease() {
        let lease = Duration::from_millis(800);
        let now = Instant::now();
        assert!(held(
            &metrics(ServerState::Leader, Some(150)),
            None,
            lease,
            now
        ));
        assert!(!held(
            &metrics(ServerState::Leader, Some(800)),
            None,
            lease,
            now
        ));
        assert!(!held(&metrics(ServerState::Leader, None), None, lease, now));
        // A leader's own last contact as a follower does not hold it.
        let leader = metrics(ServerState::Leader, None);
        assert!(!held(&leader, Some(now), lease, now));
    }

    #[test]
    fn the_timing_follows_the_election_timeouts() {
        let ms = Duration::from_millis;
        let timing = CampaignTiming::new((ms(400), ms(800)));
        assert_eq!(
            timing,
            CampaignTiming {
                probe_every: ms(100),
                fresh: ms(800),
                lease: ms(800),
            }
        );
    }
}
