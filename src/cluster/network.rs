//! The Raft network: openraft's RPCs (append, vote, whole snapshots) as HTTP requests to the
//! peers' `--cluster-listen` ports ([`super::peer_server`] answers them), signed by
//! [`PeerAuth`]. Our own peer requests (`/raft/info`, `/raft/forward`, the campaign gate's
//! `/raft/ping`) go through [`Peers::post`] the same way.
//!
//! - **Addresses**: a peer is dialled at its membership entry's `peer_addr`, unless
//!   `--peer-route ID=HOST:PORT` routes it elsewhere (a sidecar, a NAT, or the fault proxy the
//!   cluster tests put on each link).
//! - **Errors**: a connection that cannot be made is `Unreachable` (openraft backs off before
//!   retrying, [`PeerClient::backoff`]); a timeout or a broken exchange is a `Network` error
//!   (retried at once); a refusal by the peer is its `RaftError`, carried back as such.
//! - **Acknowledgments**: every answered request stamps, per peer, the instant it was *sent*
//!   (taken before sending, so it only errs early) and its term: [`Contacts`], which the fence
//!   and `GET /v1/cluster`'s `last_contact_ms` read.
//! - **Identity**: every request names this member's cluster ([`identity::HEADER`]), once it
//!   has an id; a member of another cluster refuses it (409 `cluster_mismatch`).
//! - **Bodies**: JSON (openraft's types with serde; entries carry our records as base64). A
//!   snapshot is sent whole in one request: a 4-byte length, the JSON of its vote and meta, then
//!   the file's bytes; its timeout is its own ([`snapshot_timeout`]), not openraft's per-chunk
//!   one.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    Fatal, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, ReplicationClosed,
    StreamingError, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::OptionalSend;
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::auth::{self, PeerAuth};
use super::identity::{self, Identity};
use super::types::{Member, NodeId, Snapshot, SnapshotMeta, TypeConfig, Vote};

/// The peer routes of the Raft RPCs.
pub mod route {
    pub const APPEND: &str = "/raft/append";
    pub const VOTE: &str = "/raft/vote";
    pub const SNAPSHOT: &str = "/raft/snapshot";
    pub const FORWARD: &str = "/raft/forward";
    pub const INFO: &str = "/raft/info";
    /// The campaign gate's probe ([`crate::cluster::campaign`]).
    pub const PING: &str = "/raft/ping";
}

/// The last answered request to each peer: when it was sent, in which term.
#[derive(Debug, Default)]
pub struct Contacts {
    /// Per peer: (the term of the request, the instant it was sent).
    acks: Mutex<HashMap<NodeId, (u64, Instant)>>,
}

impl Contacts {
    /// A request of `term` sent to `peer` at `sent_at` was answered.
    pub fn acknowledged(&self, peer: NodeId, term: u64, sent_at: Instant) {
        let mut acks = self.acks.lock();
        let newest = acks.entry(peer).or_insert((term, sent_at));
        if (term, sent_at) > *newest {
            *newest = (term, sent_at);
        }
    }

    /// The newest answered request to `peer`: its term and send instant.
    pub fn last(&self, peer: NodeId) -> Option<(u64, Instant)> {
        self.acks.lock().get(&peer).copied()
    }

    /// The newest send instant of `term` a quorum of every config in `configs` acknowledged,
    /// `me` (the leader) counting as acknowledging at `now`: in each config the
    /// `(n/2 + 1)`-th newest stamp, and the earliest of those over the configs (a joint
    /// membership needs both majorities). `None` while some config has no such quorum.
    pub fn quorum_ack(
        &self,
        me: NodeId,
        term: u64,
        configs: &[std::collections::BTreeSet<NodeId>],
        now: Instant,
    ) -> Option<Instant> {
        let acks = self.acks.lock();
        let mut earliest: Option<Instant> = None;
        for config in configs {
            let mut stamps: Vec<Instant> = config
                .iter()
                .filter_map(|&id| match id == me {
                    true => Some(now),
                    false => acks
                        .get(&id)
                        .filter(|(acked_term, _)| *acked_term == term)
                        .map(|&(_, at)| at),
                })
                .collect();
            let needed = config.len() / 2 + 1;
            if stamps.len() < needed {
                return None;
            }
            stamps.sort_unstable_by(|a, b| b.cmp(a));
            let ack = stamps[needed - 1];
            earliest = Some(earliest.map_or(ack, |e| e.min(ack)));
        }
        earliest
    }
}

/// What every connection shares: the HTTP client, the signer, the routes, the stamps.
#[derive(Debug)]
pub struct Peers {
    /// One keep-alive pool per peer address.
    client: reqwest::Client,
    /// Signs every request.
    auth: PeerAuth,
    /// `--peer-route`: peers reached somewhere other than their `peer_addr`.
    routes: HashMap<NodeId, String>,
    /// Acknowledgment stamps.
    contacts: Arc<Contacts>,
    /// The cluster every request names ([`identity::HEADER`]).
    identity: Arc<Identity>,
}

impl Peers {
    /// The network's shared parts. Builds the HTTP client (plain HTTP on the peer links).
    pub fn new(
        auth: PeerAuth,
        routes: HashMap<NodeId, String>,
        contacts: Arc<Contacts>,
        identity: Arc<Identity>,
    ) -> Result<Self, reqwest::Error> {
        crate::notify::install_tls_provider();
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .tcp_nodelay(true)
            // Below a peer's header-read timeout (30 s by default), which closes a kept-alive
            // connection idle that long: an RPC sent on a connection as the peer closes it
            // fails. The client crate's rule, shared.
            .pool_idle_timeout(ttlwheel_client::DEFAULT_POOL_IDLE_TIMEOUT)
            .user_agent(concat!("ttlwheel-peer/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self {
            client,
            auth,
            routes,
            contacts,
            identity,
        })
    }

    /// The cluster this member belongs to.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The address `peer` is dialled at.
    pub fn address_of(&self, peer: NodeId, member: &Member) -> String {
        self.routes
            .get(&peer)
            .cloned()
            .unwrap_or_else(|| member.peer_addr.clone())
    }

    /// Sends `body` to `path` on `addr` and returns the answer's body, or why there is none.
    /// `timeout` bounds the whole exchange.
    pub async fn post(
        &self,
        addr: &str,
        path: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<(reqwest::StatusCode, axum::body::Bytes), PostError> {
        let mut request = self
            .client
            .post(format!("http://{addr}{path}"))
            .timeout(timeout);
        if let Some(signature) = self.auth.sign("POST", path, &body, auth::unix_now()) {
            request = request.header(auth::HEADER, signature);
        }
        if let Some(id) = self.identity.id() {
            request = request.header(identity::HEADER, identity::format(id));
        }
        let response = request
            .body(body)
            .send()
            .await
            .map_err(PostError::from_send)?;
        let status = response.status();
        let body = response.bytes().await.map_err(PostError::Broken)?;
        Ok((status, body))
    }
}

/// Why a peer request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    #[error("cannot connect: {0}")]
    Unreachable(reqwest::Error),
    #[error("the exchange broke off or timed out: {0}")]
    Broken(reqwest::Error),
}

impl PostError {
    fn from_send(error: reqwest::Error) -> Self {
        if error.is_connect() {
            Self::Unreachable(error)
        } else {
            Self::Broken(error)
        }
    }
}

/// openraft's factory of connections: one [`PeerClient`] per target.
#[derive(Clone, Debug)]
pub struct PeerNetwork {
    /// What the connections share.
    pub peers: Arc<Peers>,
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> PeerClient {
        PeerClient {
            addr: self.peers.address_of(target, node),
            target,
            peers: Arc::clone(&self.peers),
        }
    }
}

/// The connection to one peer.
#[derive(Debug)]
pub struct PeerClient {
    /// The peer's id.
    target: NodeId,
    /// Where it is dialled.
    addr: String,
    /// What connections share.
    peers: Arc<Peers>,
}

/// The most bytes of JSON one AppendEntries carries (when it holds more than one entry).
/// openraft 0.9 caps a payload by entries, not bytes, and cuts the request off after its
/// `heartbeat_interval` (150 ms), then sends the same payload again: entries of thousands of
/// records made payloads a follower could not take in that time on a loaded machine (a debug
/// build, in the failover tests' burst of batches), and replication stalled for good.
/// openraft's `PayloadTooLarge` answer makes it send fewer. 128 KiB (it was 256): at 3 MB/s,
/// the slow-link test's rate, 256 KiB payloads took ~90 ms on the wire and, with a loaded
/// debug build's encoding and apply, missed the 150 ms in the fresh-clone CI.
pub const MAX_APPEND_BYTES: usize = 128 * 1024;

/// How many of `entries`, from the first, fit in [`MAX_APPEND_BYTES`] (at least one): by
/// their commands' approximate encodings, as base64 in JSON (4/3 of it). The log store reads
/// no more than this for a replication (`LogStore::limited_get_log_entries`), so a payload
/// is refused here only when another reader chose the entries.
pub(super) fn entries_that_fit(entries: &[openraft::Entry<TypeConfig>]) -> usize {
    let mut bytes = 0;
    for (n, entry) in entries.iter().enumerate() {
        bytes += match &entry.payload {
            openraft::EntryPayload::Normal(command) => command.approx_len() * 4 / 3 + 64,
            _ => 256,
        };
        if bytes > MAX_APPEND_BYTES {
            return n.max(1);
        }
    }
    entries.len()
}

/// What a peer answers an RPC: openraft's result, as JSON.
type Answer<T> = Result<T, RaftError<NodeId>>;

type RpcError = RPCError<NodeId, Member, RaftError<NodeId>>;

impl PeerClient {
    /// One RPC: the request as JSON, the answer as the peer's `Result`, and the instant the
    /// request was sent.
    async fn rpc<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        path: &str,
        request: &Req,
        timeout: Duration,
    ) -> Result<(Resp, Instant), RpcError> {
        let body = serde_json::to_vec(request).map_err(|error| network_error(&error))?;
        self.rpc_body(path, body, timeout).await
    }

    /// [`PeerClient::rpc`] with the request already serialized.
    async fn rpc_body<Resp: DeserializeOwned>(
        &self,
        path: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<(Resp, Instant), RpcError> {
        let sent_at = Instant::now();
        let (status, answer) = self
            .peers
            .post(&self.addr, path, body, timeout)
            .await
            .map_err(|error| match error {
                PostError::Unreachable(_) => RPCError::Unreachable(Unreachable::new(&error)),
                PostError::Broken(_) => network_error(&error),
            })?;
        if !status.is_success() {
            return Err(network_error(&Refused {
                status,
                body: String::from_utf8_lossy(&answer).into_owned(),
            }));
        }
        let answer: Answer<Resp> =
            serde_json::from_slice(&answer).map_err(|error| network_error(&error))?;
        answer
            .map(|answer| (answer, sent_at))
            .map_err(|error| RPCError::RemoteError(RemoteError::new(self.target, error)))
    }
}

/// A peer answered with an HTTP error (it refused the request before Raft saw it: most often
/// authentication).
#[derive(Debug, thiserror::Error)]
#[error("the peer answered {status}: {body}")]
struct Refused {
    status: reqwest::StatusCode,
    body: String,
}

fn network_error(error: &(impl std::error::Error + 'static)) -> RpcError {
    RPCError::Network(NetworkError::new(error))
}

/// The head of a snapshot request: which leader sends it, what it covers.
#[derive(Debug, Serialize, Deserialize)]
pub struct SnapshotHead {
    pub vote: Vote,
    pub meta: SnapshotMeta,
}

/// How long a whole snapshot of `len` bytes may take: 30 s plus 20 MB/s.
pub fn snapshot_timeout(len: u64) -> Duration {
    Duration::from_secs(30) + Duration::from_millis(len / 20_000)
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcError> {
        let term = rpc.vote.leader_id().term;
        let fit = entries_that_fit(&rpc.entries);
        if fit < rpc.entries.len() {
            // Fewer entries, at once (openraft keeps the hint for the next requests). Sized
            // before serializing: a payload serialized only to be refused costs the CPU of
            // sending it.
            let hint = u64::try_from(fit).unwrap_or(1);
            return Err(RPCError::PayloadTooLarge(
                PayloadTooLarge::new_entries_hint(hint),
            ));
        }
        let body = serde_json::to_vec(&rpc).map_err(|error| network_error(&error))?;
        let (answer, sent_at) = self
            .rpc_body(route::APPEND, body, option.hard_ttl())
            .await?;
        // Any answer but "a higher vote" acknowledges this leader's term (design section 6):
        // the peer then refuses votes until `sent_at + election_timeout_max`.
        if !matches!(answer, AppendEntriesResponse::HigherVote(_)) {
            self.peers.contacts.acknowledged(self.target, term, sent_at);
        }
        Ok(answer)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcError> {
        let (answer, _) = self.rpc(route::VOTE, &rpc, option.hard_ttl()).await?;
        Ok(answer)
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<NodeId>, StreamingError<TypeConfig, Fatal<NodeId>>> {
        let path = snapshot.snapshot.path.clone();
        let file = tokio::task::spawn_blocking(move || std::fs::read(path))
            .await
            .map_err(|error| NetworkError::new(&error))?
            .map_err(|error| NetworkError::new(&error))?;
        let head = serde_json::to_vec(&SnapshotHead {
            vote,
            meta: snapshot.meta,
        })
        .map_err(|error| NetworkError::new(&error))?;
        let head_len = u32::try_from(head.len()).expect("a snapshot's head is a few KB");
        let mut body = Vec::with_capacity(4 + head.len() + file.len());
        body.extend_from_slice(&head_len.to_le_bytes());
        body.extend_from_slice(&head);
        body.extend_from_slice(&file);
        let timeout = snapshot_timeout(body.len() as u64);
        let sent = self.peers.post(&self.addr, route::SNAPSHOT, body, timeout);
        let (status, answer) = tokio::select! {
            closed = cancel => return Err(StreamingError::Closed(closed)),
            sent = sent => sent.map_err(|error| match error {
                PostError::Unreachable(_) => StreamingError::Unreachable(Unreachable::new(&error)),
                PostError::Broken(_) => StreamingError::Network(NetworkError::new(&error)),
            })?,
        };
        if !status.is_success() {
            let refused = Refused {
                status,
                body: String::from_utf8_lossy(&answer).into_owned(),
            };
            return Err(StreamingError::Network(NetworkError::new(&refused)));
        }
        let answer: Result<SnapshotResponse<NodeId>, Fatal<NodeId>> =
            serde_json::from_slice(&answer).map_err(|error| NetworkError::new(&error))?;
        answer.map_err(|fatal| StreamingError::RemoteError(RemoteError::new(self.target, fatal)))
    }

    /// A peer that cannot be reached is retried every 200 ms: often enough that a restarted
    /// member rejoins well within an election timeout, rarely enough to cost nothing.
    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(Duration::from_millis(200)))
    }
}
