//! A cluster member: its Raft (openraft over our log store, state machine and network), its
//! peer listener, its bootstrap, and what the API asks of it (who leads, proposing a command,
//! forwarding, the status `GET /v1/cluster` shows).
//!
//! - **Bootstrap**: with no cluster in its data directory, the member whose id is the smallest
//!   of `--initial-cluster` initializes it with every founding voter (openraft must be
//!   initialized on exactly one member); the others wait to be contacted. Once a cluster exists
//!   (a vote or a log), `--initial-cluster` is not read.
//! - **API addresses**: `--initial-cluster` names peer addresses only. The initializer asks
//!   the other founders for theirs (`POST /raft/info`, for up to [`FOUNDING_WAIT`]) before it
//!   initializes, so the founding membership normally holds every API address: `leader_api`
//!   and the leader named in forwarded answers are known from the first election (measured:
//!   0.16 s after the start, against 1.1 s when the leader filled them in afterwards), and no
//!   membership change follows the start. A founder that did not answer in time, or any member
//!   that lacks one later, is asked by the leader, which writes the answer into the
//!   membership (openraft's `SetNodes`, which keeps every peer address as it is: no risk of
//!   two leaders).
//! - **Proposals** wait for the entry to be applied here, at most [`PROPOSE_TIMEOUT`]; past it
//!   the caller answers 503 `no_quorum` (the entry may still commit later: the client retries,
//!   and every record is a whole state, so a retry is harmless).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use axum::response::Response;
use axum::Router;
use openraft::error::{ClientWriteError, RaftError};
use openraft::{ChangeMembers, Raft, ServerState};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::time::Instant;

use super::auth::PeerAuth;
use super::campaign::{self, CampaignGate, CampaignTiming};
use super::group_commit::{GroupCommit, Written};
use super::identity::{self, Identity};
use super::leadership::{self, Parts};
use super::lease::{LeaseConfig, LeaseRules};
use super::log_store::LogStore;
use super::membership::{self, Join, MembershipStatus, NewMember};
use super::metrics::{ClusterCollector, ClusterStats};
use super::network::{route, Contacts, PeerNetwork, Peers};
use super::peer_server::{self, PeerState};
use super::signals::LeaseSignals;
use super::state_machine::{MachineParts, StateMachine};
use super::types::{Applied, Command, Member, NodeId, TypeConfig};
use super::{forward, StoreError};
use crate::notify::replicated::Replication;
use crate::persist::record::Record;
use crate::registry::Registry;

/// How long a proposal may wait for its entry to be applied before the caller gives up.
pub const PROPOSE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the leader looks for members whose API address it lacks.
const API_ADDRESSES_EVERY: Duration = Duration::from_secs(1);
/// How long the initializer waits for the other founders' API addresses (they start at about
/// the same time; one that is not up by then is asked again once there is a leader).
const FOUNDING_WAIT: Duration = Duration::from_secs(2);
/// How long the initializer waits for one founder's answer before it asks the next.
const FOUNDING_ASK_TIMEOUT: Duration = Duration::from_millis(300);
/// openraft's heartbeat interval, ms: also its AppendEntries timeout (openraft
/// replication/mod.rs), so payloads are capped to ship well within it.
const HEARTBEAT_INTERVAL: u64 = 150;

/// openraft's `election_timeout_min` and `_max` for `--election-timeout` (the minimum; the
/// maximum is twice it), or why it cannot be. In 0.9 a follower that has known a leader calls
/// an election only `_max` (the leader lease, during which it also refuses votes) plus its own
/// timeout, drawn once from `[_min, _max]`, after it last heard from the leader: 1.2-1.6 s with
/// the default 400 ms. The design's first values, etcd's 1 s and 2 s, made that 3-4 s
/// (measured 3.1-4.0 s from a kill -9 to a new leader), against the 2 s from a kill
/// to the first acknowledged write (BENCHMARKS.md, "Cluster failover"). At least twice the
/// heartbeat: a minimum closer to it would call elections whenever one round of heartbeats is
/// late on a loaded machine.
pub fn election_timeout(min: Duration) -> Result<(Duration, Duration), String> {
    let floor = Duration::from_millis(2 * HEARTBEAT_INTERVAL);
    if min < floor {
        return Err(format!(
            "--election-timeout {min:?} is below {floor:?}: twice the {HEARTBEAT_INTERVAL} ms \
             heartbeat, which is also the replication timeout"
        ));
    }
    Ok((min, 2 * min))
}

/// The lease settings of `--checkpoint-interval` and `--failover-grace` with this member's
/// election timeouts (`election_timeout`), to be validated at start-up.
pub fn lease_config(
    checkpoint_interval: Duration,
    failover_grace: Duration,
    (election_min, election_max): (Duration, Duration),
) -> LeaseConfig {
    LeaseConfig::new(
        checkpoint_interval,
        failover_grace,
        election_min,
        election_max,
    )
}

/// How a member runs: its flags, resolved.
#[derive(Clone, Debug)]
pub struct ClusterSettings {
    /// `--node-id`.
    pub node_id: NodeId,
    /// `--cluster-listen`.
    pub listen: SocketAddr,
    /// `--advertise-api`: the URL clients and peers reach this member's API at.
    pub advertise_api: String,
    /// `--initial-cluster`: the founding voters' peer addresses.
    pub initial: BTreeMap<NodeId, String>,
    /// `--cluster-secret`.
    pub secret: Option<String>,
    /// `--peer-route`: peers dialled somewhere other than their peer address.
    pub peer_routes: HashMap<NodeId, String>,
    /// Where the Raft log and snapshots live (`<data-dir>/raft`).
    pub dir: PathBuf,
    /// `--checkpoint-interval`, `--failover-grace` and the fence, validated.
    pub lease: LeaseRules,
    /// openraft's election timeout, minimum and maximum (`--election-timeout`).
    pub election_timeout: (Duration, Duration),
    /// `--join`: an existing member's API URL.
    pub join: Option<String>,
    /// `--learner`: stay a learner after joining.
    pub learner: bool,
    /// The admin token `--join` sends (`TTLWHEEL_TOKEN`).
    pub join_token: Option<String>,
    /// `--snapshot-log-bytes`: the log's size after the last snapshot that makes another.
    pub snapshot_log_bytes: u64,
}

/// A member that cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot listen for peers on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot build the peer client: {0}")]
    Client(#[from] reqwest::Error),
    #[error("openraft refused to start: {0}")]
    Raft(String),
}

/// Why a proposal was not applied.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ProposeError {
    #[error("this member does not lead; the leader is {leader:?}")]
    NotLeader { leader: Option<NodeId> },
    #[error("no quorum answered within {0:?}: the change may still be applied; retry")]
    NoQuorum(Duration),
    #[error("the cluster member is stopping or failed: {0}")]
    Stopped(String),
}

/// Appends `command` to `raft`'s log and waits until it is applied here, at most
/// [`PROPOSE_TIMEOUT`].
pub(super) async fn propose_to(
    raft: &Raft<TypeConfig>,
    command: Command,
) -> Result<Applied, ProposeError> {
    let written = tokio::time::timeout(PROPOSE_TIMEOUT, raft.client_write(command)).await;
    match written {
        Err(_) => Err(ProposeError::NoQuorum(PROPOSE_TIMEOUT)),
        Ok(Ok(response)) => Ok(response.data),
        Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward)))) => {
            Err(ProposeError::NotLeader {
                leader: forward.leader_id,
            })
        }
        Ok(Err(error)) => Err(ProposeError::Stopped(error.to_string())),
    }
}

/// A member's role, as `GET /v1/cluster` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Leader,
    Follower,
    Learner,
    Candidate,
    Stopped,
}

impl From<ServerState> for Role {
    fn from(state: ServerState) -> Self {
        match state {
            ServerState::Leader => Self::Leader,
            ServerState::Follower => Self::Follower,
            ServerState::Learner => Self::Learner,
            ServerState::Candidate => Self::Candidate,
            ServerState::Shutdown => Self::Stopped,
        }
    }
}

/// One member, as `GET /v1/cluster` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberStatus {
    pub id: NodeId,
    pub peer_addr: String,
    /// Empty until the leader has learnt it.
    pub api_addr: String,
    /// In one of the voter sets in force (`membership.voters`): it counts in a quorum. While
    /// joint, a member being added or removed is one too.
    pub voter: bool,
    /// The last entry known replicated to it (the leader knows; `null` elsewhere).
    pub matched_index: Option<u64>,
    /// Milliseconds since this member last heard from it: for the leader, since the send of
    /// its newest answered request; for a follower, only the leader's contact is known.
    pub last_contact_ms: Option<u64>,
}

/// What `GET /v1/cluster` answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub node_id: NodeId,
    pub role: Role,
    pub leader_id: Option<NodeId>,
    pub leader_api: Option<String>,
    pub term: u64,
    /// 0 before anything is committed.
    pub committed_index: u64,
    /// 0 before anything is applied.
    pub applied_index: u64,
    /// The last entry this member's latest snapshot covers; `None` before its first.
    pub snapshot_index: Option<u64>,
    /// The last entry this member dropped from its log (behind its snapshot); `None` while
    /// it holds the whole log. A member that lacks entries up to it catches up from a
    /// snapshot, not the log.
    pub purged_index: Option<u64>,
    /// Whether this member may call an election now (`campaign.rs`): enough voters answer
    /// that they would vote for it.
    pub may_campaign: bool,
    pub members: Vec<MemberStatus>,
    /// The voter sets in force and whether a membership change is unfinished.
    pub membership: MembershipStatus,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// A running member. See the module documentation.
pub struct Cluster {
    id: NodeId,
    raft: Raft<TypeConfig>,
    log: LogStore,
    peers: Arc<Peers>,
    contacts: Arc<Contacts>,
    /// When this member last accepted an AppendEntries from a leader.
    leader_contact: Arc<Mutex<Option<Instant>>>,
    /// The highest commit index an accepted AppendEntries named.
    leader_commit: Arc<std::sync::atomic::AtomicU64>,
    /// Requests' writes, gathered into entries.
    writes: GroupCommit,
    /// The API's router, for requests forwarded to this member.
    api: Arc<OnceLock<Router>>,
    /// Whether this member may serve now (the lease task keeps it).
    signals: Arc<LeaseSignals>,
    /// What the member counts for `/metrics`.
    stats: Arc<ClusterStats>,
    /// Whether openraft may call an election now (the campaign task keeps it).
    campaign: Arc<CampaignGate>,
    /// A member heard from its quorum (leader) or its leader (follower) within this is "in a
    /// quorum" for `/readyz`: openraft's `election_timeout_max`, its leader lease, within
    /// which no follower calls an election.
    in_quorum_within: Duration,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// The bytes of log entries after the last snapshot past which a member takes another (and
/// purges the log behind it), whatever the number of entries: `--snapshot-log-bytes`'s default.
pub const SNAPSHOT_AFTER_LOG_BYTES: u64 = 64 << 20;
/// Entries kept behind a snapshot, for a follower a little behind (openraft's default is
/// 1,000: as many batches of 1,000 creations are ~40 MB).
const KEPT_BEHIND_SNAPSHOT: u64 = 256;
/// How often the log's size is looked at.
const SNAPSHOT_SIZE_CHECK: Duration = Duration::from_secs(5);

/// Takes a snapshot when the entries after the last one pass `bound` bytes
/// ([`SNAPSHOT_AFTER_LOG_BYTES`] by default).
/// openraft 0.9's policy counts entries (`LogsSinceLast`), and entries vary from one record to
/// thousands: measured, checkpoints of ~3,500 keys at 28 entries/s (1M keys renewed at 100k/s)
/// grew each member's log by 2.4 MB/s and would have reached the 1M-entry policy after ~10
/// hours and ~87 GB, all of it replayed by a restart. Counted after the snapshot, not over the
/// whole log: openraft keeps [`KEPT_BEHIND_SNAPSHOT`] entries behind it, and segments leave
/// whole, so the log on disk stays above the bound for a while after each snapshot.
async fn snapshot_by_size(raft: Raft<TypeConfig>, log: LogStore, bound: u64) {
    loop {
        tokio::time::sleep(SNAPSHOT_SIZE_CHECK).await;
        let snapshots_before = raft.metrics().borrow().snapshot;
        let bytes = log.bytes_after(snapshots_before.map(|id| id.index));
        if bytes < bound {
            continue;
        }
        tracing::info!(
            log_bytes = bytes,
            "the log passed its size bound: taking a snapshot"
        );
        if let Err(error) = raft.trigger().snapshot().await {
            tracing::warn!(%error, "a snapshot could not be asked for");
            continue;
        }
        // One at a time: wait (bounded) for it before looking at the size again.
        let mut metrics = raft.metrics();
        let built = async {
            let built = metrics.wait_for(|metrics| metrics.snapshot != snapshots_before);
            built.await.map(drop)
        };
        if tokio::time::timeout(Duration::from_secs(120), built)
            .await
            .is_err()
        {
            tracing::warn!("the snapshot asked for was not built within 120 s");
        }
    }
}

/// How long `POST /v1/cluster/snapshot` waits for its snapshot (1M keys are written in ~1 s).
pub const SNAPSHOT_WAIT: Duration = Duration::from_secs(60);

/// openraft's settings (docs/cluster-design.md, section 8).
fn raft_config(
    (election_min, election_max): (Duration, Duration),
) -> Result<Arc<openraft::Config>, ClusterError> {
    let config = openraft::Config {
        cluster_name: "ttlwheel".into(),
        heartbeat_interval: HEARTBEAT_INTERVAL,
        election_timeout_min: election_min.as_millis() as u64,
        election_timeout_max: election_max.as_millis() as u64,
        // By count; `network::MAX_APPEND_BYTES` caps a payload's bytes (an entry holds up
        // to 4,096 records, and openraft 0.9 cuts an AppendEntries off after 150 ms).
        max_payload_entries: 64,
        max_in_snapshot_log_to_keep: KEPT_BEHIND_SNAPSHOT,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(1_000_000),
        // Off until the campaign gate (`campaign.rs`) hears that enough voters would vote.
        enable_elect: false,
        ..Default::default()
    };
    config
        .validate()
        .map(Arc::new)
        .map_err(|error| ClusterError::Raft(error.to_string()))
}

impl Cluster {
    /// Opens the member's storage under `settings.dir`, starts its Raft over `registry` (which
    /// the state machine fills), listens for peers, and initializes the cluster if this member
    /// founds it.
    pub async fn start(
        settings: ClusterSettings,
        registry: Arc<Registry>,
        webhooks: Arc<Replication>,
    ) -> Result<Self, ClusterError> {
        let listener =
            TcpListener::bind(settings.listen)
                .await
                .map_err(|source| ClusterError::Listen {
                    addr: settings.listen,
                    source,
                })?;
        let bound = listener
            .local_addr()
            .map_err(|source| ClusterError::Listen {
                addr: settings.listen,
                source,
            })?;
        // Port 0 given: the port bound is the one to advertise (`--join`).
        let settings = ClusterSettings {
            listen: bound,
            ..settings
        };
        let (log_dir, sm_dir) = (settings.dir.join("log"), settings.dir.join("snapshots"));
        let signals = Arc::new(LeaseSignals::new(Instant::now()));
        let machine_parts = MachineParts {
            registry: Arc::clone(&registry),
            signals: Arc::clone(&signals),
            webhooks: Arc::clone(&webhooks),
        };
        let dir = settings.dir.clone();
        // The snapshot's keys and the log re-applied at start arrive all at once: the listing
        // is built after them (`Registry::defer_listing`), before the API can list.
        registry.defer_listing();
        let (log, machine, identity) = tokio::task::spawn_blocking(move || {
            Ok::<_, StoreError>((
                LogStore::open(&log_dir)?,
                StateMachine::open(&sm_dir, machine_parts)?,
                Arc::new(Identity::open(&dir)?),
            ))
        })
        .await
        .map_err(|error| StoreError::Task(error.to_string()))??;
        let auth = PeerAuth::new(settings.secret.as_deref());
        let contacts = Arc::new(Contacts::default());
        let peers = Arc::new(Peers::new(
            auth.clone(),
            settings.peer_routes.clone(),
            Arc::clone(&contacts),
            Arc::clone(&identity),
        )?);
        let network = PeerNetwork {
            peers: Arc::clone(&peers),
        };
        let raft = Raft::new(
            settings.node_id,
            raft_config(settings.election_timeout)?,
            network,
            log.clone(),
            machine,
        )
        .await
        .map_err(|error| ClusterError::Raft(error.to_string()))?;
        let rebuilt = Arc::clone(&registry);
        tokio::task::spawn_blocking(move || rebuilt.rebuild_listing())
            .await
            .map_err(|error| StoreError::Task(error.to_string()))?;
        let api = Arc::new(OnceLock::new());
        let leader_contact = Arc::new(Mutex::new(None));
        let leader_commit = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let stats = Arc::new(ClusterStats::default());
        let peer_state = PeerState {
            raft: raft.clone(),
            auth,
            identity,
            stats: Arc::clone(&stats),
            api: Arc::clone(&api),
            advertise_api: settings.advertise_api.clone(),
            leader_contact: Arc::clone(&leader_contact),
            leader_commit: Arc::clone(&leader_commit),
            leader_lease: settings.election_timeout.1,
        };
        let server = tokio::spawn(async move {
            let router = peer_server::router(peer_state);
            if let Err(error) = axum::serve(listener, router).await {
                tracing::error!(%error, "the peer listener failed");
            }
        });
        tracing::info!(node_id = settings.node_id, peer_listen = %bound, "cluster member started");
        let mut tasks = leadership::spawn(Parts {
            id: settings.node_id,
            raft: raft.clone(),
            registry,
            signals: Arc::clone(&signals),
            contacts: Arc::clone(&contacts),
            leader_contact: Arc::clone(&leader_contact),
            rules: settings.lease,
            stats: Arc::clone(&stats),
            webhooks,
        });
        tasks.push(server);
        let (writes, proposer) = GroupCommit::start(raft.clone());
        tasks.push(proposer);
        tasks.push(tokio::spawn(snapshot_by_size(
            raft.clone(),
            log.clone(),
            settings.snapshot_log_bytes,
        )));
        tasks.push(tokio::spawn(super::metrics::count_leader_changes(
            raft.clone(),
            Arc::clone(&stats),
        )));
        let campaign = Arc::new(CampaignGate::default());
        tasks.push(tokio::spawn(campaign::run(
            Arc::clone(&campaign),
            raft.clone(),
            Arc::clone(&peers),
            settings.node_id,
            CampaignTiming::new(settings.election_timeout),
        )));
        let cluster = Self {
            id: settings.node_id,
            raft,
            log,
            peers,
            contacts,
            leader_contact,
            leader_commit,
            writes,
            api,
            signals,
            stats,
            campaign,
            in_quorum_within: settings.election_timeout.1,
            tasks,
        };
        cluster.bootstrap(&settings).await?;
        let mut cluster = cluster.with_api_address_task();
        let finisher = membership::finish_left_over_joint(cluster.raft.clone());
        cluster.tasks.push(tokio::spawn(finisher));
        if let Some(join) = cluster.join_to_run(&settings) {
            cluster.tasks.push(tokio::spawn(membership::run_join(join)));
        }
        Ok(cluster)
    }

    /// What `--join` still has to do: nothing once this member is a voter (or a learner with
    /// `--learner`); otherwise add it (idempotent) and promote it.
    fn join_to_run(&self, settings: &ClusterSettings) -> Option<Join> {
        let via = settings.join.clone()?;
        let metrics = self.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        let voter = membership.voter_ids().any(|id| id == self.id);
        let learner = membership.get_node(&self.id).is_some() && !voter;
        if voter || (learner && settings.learner) {
            return None;
        }
        Some(Join {
            via,
            me: NewMember {
                id: self.id,
                peer_addr: settings.listen.to_string(),
                api_addr: settings.advertise_api.clone(),
            },
            token: settings.join_token.clone(),
            learner: settings.learner,
        })
    }

    /// Initializes the cluster if none exists and this member has the smallest founding id.
    async fn bootstrap(&self, settings: &ClusterSettings) -> Result<(), ClusterError> {
        let initialized = self
            .raft
            .is_initialized()
            .await
            .map_err(|error| ClusterError::Raft(error.to_string()))?;
        let founder = settings.initial.keys().next() == Some(&self.id);
        if initialized || !founder {
            return Ok(());
        }
        // Drawn before the first request to a founder, which adopts it (`identity`).
        let id = self.peers.identity().draw().await?;
        tracing::info!(cluster_id = %identity::format(id), "the cluster's id");
        let mut members: BTreeMap<NodeId, Member> = settings
            .initial
            .iter()
            .map(|(&id, peer_addr)| {
                let api_addr = if id == self.id {
                    settings.advertise_api.clone()
                } else {
                    String::new()
                };
                let peer_addr = peer_addr.clone();
                (
                    id,
                    Member {
                        peer_addr,
                        api_addr,
                    },
                )
            })
            .collect();
        self.learn_api_addresses(&mut members).await;
        tracing::info!(?members, "founding the cluster");
        match self.raft.initialize(members).await {
            Ok(()) => Ok(()),
            // Another start of this member got there first (a restart mid-bootstrap).
            Err(RaftError::APIError(openraft::error::InitializeError::NotAllowed(_))) => Ok(()),
            Err(error) => Err(ClusterError::Raft(error.to_string())),
        }
    }

    /// Asks the founders in `members` without an API address for theirs until each answered
    /// or [`FOUNDING_WAIT`] has passed.
    async fn learn_api_addresses(&self, members: &mut BTreeMap<NodeId, Member>) {
        let deadline = tokio::time::Instant::now() + FOUNDING_WAIT;
        loop {
            for (&id, member) in members.iter_mut() {
                if member.api_addr.is_empty() {
                    let asked = ask_api_address(&self.peers, id, member, FOUNDING_ASK_TIMEOUT);
                    member.api_addr = asked.await.unwrap_or_default();
                }
            }
            let missing = members.values().any(|member| member.api_addr.is_empty());
            if !missing || tokio::time::Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Starts the leader's task that fills in members' API addresses.
    fn with_api_address_task(mut self) -> Self {
        let (raft, peers, id) = (self.raft.clone(), Arc::clone(&self.peers), self.id);
        self.tasks.push(tokio::spawn(async move {
            loop {
                tokio::time::sleep(API_ADDRESSES_EVERY).await;
                fill_in_api_addresses(&raft, &peers, id).await;
            }
        }));
        self
    }

    /// Sets the API router requests forwarded to this member are served by.
    pub fn set_api(&self, api: Router) {
        let _ = self.api.set(api);
    }

    /// Whether this member may acknowledge renewals and serve linearizable reads now: it
    /// leads, is promoted, and a quorum acknowledged it within the fence (design section 6).
    pub fn may_serve(&self) -> bool {
        self.signals.may_serve(Instant::now())
    }

    /// This member's id (`--node-id`).
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The member's Raft, for the modules that extend what it does (`membership`).
    pub(super) fn raft(&self) -> &Raft<TypeConfig> {
        &self.raft
    }

    /// Whether this member leads now.
    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().current_leader == Some(self.id)
    }

    /// The leader this member knows of, with its addresses.
    pub fn leader(&self) -> Option<(NodeId, Member)> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let leader = metrics.current_leader?;
        let member = metrics
            .membership_config
            .membership()
            .get_node(&leader)
            .cloned()?;
        Some((leader, member))
    }

    /// Appends `command` to the log and waits until it is applied here.
    pub async fn propose(&self, command: Command) -> Result<Applied, ProposeError> {
        propose_to(&self.raft, command).await
    }

    /// Appends a request's `records` to the log, in one entry with the other requests' that
    /// wait meanwhile ([`GroupCommit`]), and waits until it is applied here.
    pub async fn propose_writes(&self, records: Vec<Record>) -> Result<Written, ProposeError> {
        // The wait for a place in an entry counts too: never more than two proposals' time.
        let written = tokio::time::timeout(2 * PROPOSE_TIMEOUT, self.writes.write(records)).await;
        written.unwrap_or(Err(ProposeError::NoQuorum(2 * PROPOSE_TIMEOUT)))
    }

    /// Forwards `request` to the leader; 503 `no_leader` when none is known or reachable, or
    /// when this member has not heard from it within the leader lease (`in_quorum_within`):
    /// cut off from it, a follower keeps it as its leader (the campaign gate, `campaign.rs`,
    /// keeps it from becoming a candidate, which used to forget the leader), and a request
    /// forwarded into a dead link would wait the forward's whole timeout (30 s).
    pub async fn forward(&self, request: Request<Body>) -> Response {
        match self.leader() {
            Some((leader, _)) if leader == self.id => forward::unavailable(
                "no_leader",
                "this member leads, but the request was forwarded to it as to a follower".into(),
            ),
            Some((leader, _)) if !self.heard_from_leader_recently() => forward::unavailable(
                "no_leader",
                format!(
                    "this member has not heard from the leader it knows (member {leader}) within \
                     {:?}: it may be cut off from it",
                    self.in_quorum_within
                ),
            ),
            Some((leader, member)) => {
                let addr = self.peers.address_of(leader, &member);
                forward::to_leader(&self.peers, &addr, &member.api_addr, request).await
            }
            None => forward::unavailable(
                "no_leader",
                "no leader is known: an election is under way or no quorum is reachable".into(),
            ),
        }
    }

    /// Whether this member accepted an AppendEntries within the leader lease
    /// (`in_quorum_within`).
    fn heard_from_leader_recently(&self) -> bool {
        let contact = *self.leader_contact.lock();
        contact.is_some_and(|at| at.elapsed() < self.in_quorum_within)
    }

    /// Milliseconds since this member last heard from the leader (0 on the leader itself);
    /// `None` before it has heard from any.
    pub fn last_contact_ms(&self) -> Option<u64> {
        if self.is_leader() {
            return Some(0);
        }
        let contact = *self.leader_contact.lock();
        contact.map(|at| at.elapsed().as_millis() as u64)
    }

    /// The index of the last entry applied here (0 before any).
    pub fn applied_index(&self) -> u64 {
        let metrics = self.raft.metrics();
        let applied = metrics.borrow().last_applied;
        applied.map_or(0, |log_id| log_id.index)
    }

    /// What `GET /v1/cluster` shows.
    pub fn status(&self) -> ClusterStatus {
        let metrics = self.raft.metrics().borrow().clone();
        let now = Instant::now();
        let membership = metrics.membership_config.membership();
        let voters: std::collections::BTreeSet<NodeId> = membership.voter_ids().collect();
        let leading = metrics.current_leader == Some(self.id);
        let since = |at: Instant| Some(now.saturating_duration_since(at).as_millis() as u64);
        let members = membership
            .nodes()
            .map(|(&id, member)| {
                let matched_index = metrics
                    .replication
                    .as_ref()
                    .and_then(|replication| replication.get(&id).copied().flatten())
                    .map(|log_id| log_id.index);
                let last_contact_ms = if id == self.id {
                    Some(0)
                } else if leading {
                    self.contacts.last(id).and_then(|(_, at)| since(at))
                } else if metrics.current_leader == Some(id) {
                    (*self.leader_contact.lock()).and_then(since)
                } else {
                    None
                };
                MemberStatus {
                    id,
                    peer_addr: member.peer_addr.clone(),
                    api_addr: member.api_addr.clone(),
                    voter: voters.contains(&id),
                    matched_index,
                    last_contact_ms,
                }
            })
            .collect();
        let committed = self.log.committed().map(|log_id| log_id.index);
        let leader_api = metrics
            .current_leader
            .and_then(|leader| membership.get_node(&leader))
            .map(|member| member.api_addr.clone())
            .filter(|api| !api.is_empty());
        ClusterStatus {
            node_id: self.id,
            role: metrics.state.into(),
            leader_id: metrics.current_leader,
            leader_api,
            term: metrics.current_term,
            committed_index: committed.unwrap_or(0),
            applied_index: metrics.last_applied.map_or(0, |log_id| log_id.index),
            snapshot_index: metrics.snapshot.map(|log_id| log_id.index),
            purged_index: metrics.purged.map(|log_id| log_id.index),
            may_campaign: self.campaign.may_campaign(),
            members,
            membership: membership::membership_status(&metrics.membership_config, committed),
        }
    }

    /// Takes a snapshot of what this member applied, now, and purges the log behind it
    /// (openraft keeps [`KEPT_BEHIND_SNAPSHOT`] entries); the index it covers. One already
    /// covering every applied entry answers at once. `Err`: not written within
    /// [`SNAPSHOT_WAIT`] (it may still be).
    pub async fn take_snapshot(&self) -> Result<Option<u64>, Duration> {
        let mut metrics = self.raft.metrics();
        let (applied, before) = {
            let now = metrics.borrow();
            (now.last_applied, now.snapshot)
        };
        if applied.is_none() || before == applied {
            return Ok(before.map(|log_id| log_id.index));
        }
        let built = async {
            self.raft.trigger().snapshot().await.ok()?;
            let done = metrics.wait_for(|now| now.snapshot.is_some_and(|id| Some(id) >= applied));
            done.await.ok().and_then(|now| now.snapshot)
        };
        match tokio::time::timeout(SNAPSHOT_WAIT, built).await {
            Ok(Some(snapshot)) => Ok(Some(snapshot.index)),
            _ => Err(SNAPSHOT_WAIT),
        }
    }

    /// The first log id this member has every event from (see `stream::log_ids`), watched.
    pub fn events_complete_from(&self) -> tokio::sync::watch::Receiver<u64> {
        self.signals.events_complete_from()
    }

    /// This member's metrics, for the service's `/metrics`.
    pub fn metrics_collector(&self) -> ClusterCollector {
        ClusterCollector {
            id: self.id,
            raft: self.raft.clone(),
            log: self.log.clone(),
            stats: Arc::clone(&self.stats),
            campaign: Arc::clone(&self.campaign),
        }
    }

    /// Whether this member should take traffic (`GET /readyz`); the reason when not.
    pub fn readiness(&self) -> Result<(), String> {
        let metrics = self.raft.metrics().borrow().clone();
        let applied = metrics.last_applied.map_or(0, |log_id| log_id.index);
        let committed = self.log.committed().map_or(0, |log_id| log_id.index);
        match metrics.current_leader {
            None => Err("no leader is known".into()),
            // A leader serves only under its lease (promoted, a quorum within the fence): a
            // load balancer should not send it traffic it would refuse.
            Some(leader) if leader == self.id => match metrics.millis_since_quorum_ack {
                Some(ms) if u128::from(ms) < self.in_quorum_within.as_millis() => {
                    if applied < committed {
                        Err(format!("applying: {applied} of {committed}"))
                    } else if !self.may_serve() {
                        Err("this leader is taking over or cannot confirm its lease".into())
                    } else {
                        Ok(())
                    }
                }
                _ => Err("this leader has not heard from a quorum recently".into()),
            },
            Some(_) if !self.heard_from_leader_recently() => {
                Err("this member has not heard from the leader recently".into())
            }
            Some(_) => {
                // Its own commit index only goes as far as its log: a member that has just
                // joined holds nothing and would look caught up. The leader's says how far.
                let leader_commit = self
                    .leader_commit
                    .load(std::sync::atomic::Ordering::Acquire);
                let committed = committed.max(leader_commit);
                if applied < committed {
                    Err(format!("catching up: {applied} of {committed}"))
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Stops Raft and the peer listener.
    pub async fn shutdown(&self) {
        for task in &self.tasks {
            task.abort();
        }
        if let Err(error) = self.raft.shutdown().await {
            tracing::warn!(%error, "openraft did not stop cleanly");
        }
        // openraft has stopped: the committed id it last reported is final.
        let log = self.log.clone();
        let _ = tokio::task::spawn_blocking(move || log.save_committed_now()).await;
    }
}

/// What `POST /raft/info` answers: who a member is.
#[derive(Debug, Serialize, Deserialize)]
pub struct MemberInfo {
    pub node_id: NodeId,
    pub api_addr: String,
}

/// On the leader: asks members without an API address for theirs and writes them into the
/// membership. A member that does not answer is asked again next time.
async fn fill_in_api_addresses(raft: &Raft<TypeConfig>, peers: &Peers, id: NodeId) {
    let membership = {
        let metrics = raft.metrics();
        let metrics = metrics.borrow();
        if metrics.current_leader != Some(id) {
            return;
        }
        metrics.membership_config.membership().clone()
    };
    let mut learnt = BTreeMap::new();
    for (&peer, member) in membership.nodes() {
        if !member.api_addr.is_empty() {
            continue;
        }
        let Some(api_addr) = ask_api_address(peers, peer, member, Duration::from_secs(2)).await
        else {
            continue;
        };
        let peer_addr = member.peer_addr.clone();
        learnt.insert(
            peer,
            Member {
                peer_addr,
                api_addr,
            },
        );
    }
    if learnt.is_empty() {
        return;
    }
    let ids: Vec<NodeId> = learnt.keys().copied().collect();
    match raft
        .change_membership(ChangeMembers::SetNodes(learnt), false)
        .await
    {
        Ok(_) => tracing::info!(?ids, "recorded members' API addresses in the membership"),
        Err(error) => tracing::debug!(%error, "cannot record members' API addresses yet"),
    }
}

/// Member `peer`'s API address, as it answers `POST /raft/info`; `None` without an answer.
async fn ask_api_address(
    peers: &Peers,
    peer: NodeId,
    member: &Member,
    timeout: Duration,
) -> Option<String> {
    let addr = peers.address_of(peer, member);
    let (status, body) = (peers.post(&addr, route::INFO, Vec::new(), timeout))
        .await
        .ok()?;
    let info = serde_json::from_slice::<MemberInfo>(&body).ok()?;
    let answered = status.is_success() && info.node_id == peer && !info.api_addr.is_empty();
    answered.then_some(info.api_addr)
}
