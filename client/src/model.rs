//! The API's requests and answers, as `openapi.yaml` documents them.
//!
//! Answers ignore fields they do not know (a newer server may add some); requests send only
//! what the API accepts (it refuses unknown fields). Times are the API's RFC 3339 text.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One heartbeat as sent (`POST /v1/heartbeats`, or an item of a batch).
#[derive(Clone, Debug, Serialize)]
pub struct Heartbeat {
    /// The key: 1-256 bytes of UTF-8 without control characters.
    pub key: String,
    /// The TTL in ms; `None`: the server's `--default-ttl`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// The service the key belongs to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// Metadata: a JSON object up to 4 KiB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub meta: Option<serde_json::Value>,
}

impl Heartbeat {
    /// A heartbeat for `key` with `ttl` (whole milliseconds; a sub-millisecond rest is dropped).
    pub fn new(key: impl Into<String>, ttl: Duration) -> Self {
        Self {
            key: key.into(),
            ttl_ms: Some(ttl_ms(ttl)),
            service: None,
            meta: None,
        }
    }

    /// With a service.
    pub fn service(mut self, service: impl Into<String>) -> Self {
        self.service = Some(service.into());
        self
    }

    /// With metadata (a JSON object).
    pub fn meta(mut self, meta: serde_json::Value) -> Self {
        self.meta = Some(meta);
        self
    }
}

/// A duration as the API's whole milliseconds.
pub(crate) fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)
}

/// What an accepted heartbeat answers.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct HeartbeatOutcome {
    /// The key.
    pub key: String,
    /// Its service, if any.
    pub service: Option<String>,
    /// Whether the heartbeat created the key (it was not alive).
    pub created: bool,
    /// The TTL in ms.
    pub ttl_ms: u64,
    /// Time left, in ms, when the server answered.
    pub expires_in_ms: u64,
    /// The deadline, RFC 3339.
    pub expires_at: String,
    /// `wheel` or `heap`.
    pub timer: String,
}

/// An alive key (`GET /v1/keys/{key}` and alive listings).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct KeyInfo {
    /// The key.
    pub key: String,
    /// Its service, if any.
    pub service: Option<String>,
    /// Its metadata, if any.
    pub meta: Option<serde_json::Value>,
    /// The TTL in ms; `None` once the key has none (after PERSIST).
    pub ttl_ms: Option<u64>,
    /// Time left in ms; `None` without a TTL.
    pub expires_in_ms: Option<u64>,
    /// The deadline, RFC 3339; `None` without a TTL.
    pub expires_at: Option<String>,
    /// When the key was registered.
    pub registered_at: String,
    /// When it last heartbeated.
    pub last_heartbeat_at: String,
    /// `wheel` or `heap`; `None` without a TTL.
    pub timer: Option<String>,
    /// `alive`, or `held` (due, held by the mass-expiry guard).
    pub state: String,
}

/// A recently expired key (`GET /v1/keys?state=expired`).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct ExpiredKey {
    /// The key.
    pub key: String,
    /// Its service, if any.
    pub service: Option<String>,
    /// Its metadata, if any.
    pub meta: Option<serde_json::Value>,
    /// When it last heartbeated.
    pub last_heartbeat_at: String,
    /// When it expired.
    pub expired_at: String,
}

/// One page of a listing.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Page<T> {
    /// The keys, sorted by key.
    pub keys: Vec<T>,
    /// The cursor of the next page; `None` on the last.
    pub next_cursor: Option<String>,
}

/// Which alive keys a listing returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AliveState {
    /// Every alive key, held ones included.
    #[default]
    Alive,
    /// Only keys the mass-expiry guard holds.
    Held,
}

/// A listing's filters (`GET /v1/keys`).
#[derive(Clone, Debug, Default)]
pub struct ListQuery {
    /// Only keys of this service.
    pub service: Option<String>,
    /// Only keys starting with this.
    pub prefix: Option<String>,
    /// Keys per request (1-1000); `None`: the server's default (100).
    pub page_size: Option<u16>,
}

impl ListQuery {
    /// Every key.
    pub fn all() -> Self {
        Self::default()
    }

    /// Only keys of `service`.
    pub fn service(mut self, service: impl Into<String>) -> Self {
        self.service = Some(service.into());
        self
    }

    /// Only keys starting with `prefix`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// `size` keys per request.
    pub fn page_size(mut self, size: u16) -> Self {
        self.page_size = Some(size);
        self
    }
}

/// A key's TTL (`GET /v1/keys/{key}/ttl`, Redis PTTL).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyTtl {
    /// Time left.
    ExpiresIn(Duration),
    /// No TTL (after PERSIST): it never expires.
    Persistent,
}

/// A deadline for `PUT /v1/keys/{key}/ttl` (Redis PEXPIRE / PEXPIREAT).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpireAt {
    /// In this many ms from now; 0 or less deletes the key.
    In(i64),
    /// At this Unix time in ms; a past one deletes the key.
    AtUnixMs(i64),
}

/// When an EXPIRE applies (Redis 7's options).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpireCondition {
    /// Only when the key has no TTL.
    Nx,
    /// Only when it has one.
    Xx,
    /// Only when the new deadline is later.
    Gt,
    /// Only when it is earlier.
    Lt,
}

/// The body of `PUT /v1/keys/{key}/ttl`.
#[derive(Debug, Serialize)]
pub(crate) struct ExpireBody {
    /// A relative deadline (exactly one of the two).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ttl_ms: Option<i64>,
    /// An absolute deadline, Unix ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) at_ms: Option<i64>,
    /// When it applies.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) condition: Option<ExpireCondition>,
}

/// What an EXPIRE did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct ExpireOutcome {
    /// Whether the condition held and the deadline was set.
    pub applied: bool,
    /// Whether the key was deleted (a deadline not in the future).
    pub deleted: bool,
    /// The TTL after the call in ms (-1: none); absent when deleted.
    #[serde(default)]
    pub ttl_ms: Option<i64>,
}

/// Alive and recently expired keys of one service (`GET /v1/services`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct ServiceCount {
    /// The service.
    pub service: String,
    /// Alive keys.
    pub alive: u64,
    /// Recently expired keys (still listed).
    pub expired: u64,
}

/// Counts without a service name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct Counts {
    /// Alive keys.
    pub alive: u64,
    /// Recently expired keys.
    pub expired: u64,
}

/// `GET /v1/services`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct Services {
    /// Per service.
    pub services: Vec<ServiceCount>,
    /// Keys without a service.
    pub without_service: Counts,
    /// Every key.
    pub total: Counts,
}

/// The mass-expiry guard (`GET /v1/guard`); fields this client does not name are kept in
/// `other`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct GuardStatus {
    /// `armed`, `engaged`, `releasing`, or `off`.
    pub state: String,
    /// Whether it can trip by itself.
    pub enabled: bool,
    /// Keys held now.
    pub held: u64,
    /// When the current engagement or release began.
    pub since: Option<String>,
    /// When an engagement ends by itself.
    pub hold_ends_at: Option<String>,
    /// Seconds left of the hold.
    pub time_left_s: Option<f64>,
    /// Every other field (`engaged_by`, `baseline`, the thresholds...).
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

/// A member id: a number or a string, as the cluster answers it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum NodeId {
    /// A numeric id (openraft's default).
    Number(u64),
    /// A textual id.
    Text(String),
}

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Number(id) => write!(f, "{id}"),
            Self::Text(id) => f.write_str(id),
        }
    }
}

/// One cluster member as `GET /v1/cluster` describes it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct Member {
    /// Its id.
    pub id: NodeId,
    /// Its address for peers.
    pub peer_addr: String,
    /// Its API address.
    pub api_addr: String,
    /// Whether it votes.
    pub voter: bool,
    /// The last log index known replicated to it (from the leader's view).
    #[serde(default)]
    pub matched_index: Option<u64>,
    /// Milliseconds since the leader last heard from it.
    #[serde(default)]
    pub last_contact_ms: Option<u64>,
}

/// `GET /v1/cluster`: the answering member's view of the cluster (issue 28's route).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct ClusterStatus {
    /// The answering member.
    pub node_id: NodeId,
    /// `leader`, `follower`, `candidate` or `learner`.
    pub role: String,
    /// The leader, if one is known.
    pub leader_id: Option<NodeId>,
    /// The leader's API address, if known.
    pub leader_api: Option<String>,
    /// The current term.
    pub term: u64,
    /// The last committed log index.
    pub committed_index: u64,
    /// The last applied log index.
    pub applied_index: u64,
    /// The last entry the answering member's latest snapshot covers; `None` before its first
    /// (or from a server that does not report it).
    #[serde(default)]
    pub snapshot_index: Option<u64>,
    /// The last entry the answering member dropped from its log, behind its snapshot; `None`
    /// while it holds the whole log (or from a server that does not report it).
    #[serde(default)]
    pub purged_index: Option<u64>,
    /// Whether the answering member may call an election now (its campaign gate: enough
    /// voters answer that they would vote for it); `None` from a server without the gate.
    #[serde(default)]
    pub may_campaign: Option<bool>,
    /// Every member.
    pub members: Vec<Member>,
    /// The voter sets in force and whether a membership change is unfinished; `None` from a
    /// server that does not report it.
    #[serde(default)]
    pub membership: Option<MembershipView>,
}

/// `GET /v1/cluster`'s `membership`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct MembershipView {
    /// One voter set when the configuration is uniform; the old then the new set while a
    /// change of voters is in its joint phase (a quorum needs a majority of each).
    pub voters: Vec<Vec<NodeId>>,
    /// The log index of the entry that set this membership.
    pub log_index: u64,
    /// Whether the answering member knows that entry committed.
    pub committed: bool,
    /// Whether a change is unfinished (uncommitted, or joint): the leader finishes it, and
    /// retrying the same call does too.
    pub changing: bool,
}

/// One event of `GET /v1/events`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct Event {
    /// The event's id (`Last-Event-ID` resumes after it).
    pub id: String,
    /// `registered`, `expired`, `deleted`, `guard.engaged`, `guard.released`, or `reset` (events
    /// were missed: re-read the lists).
    #[serde(rename = "type")]
    pub kind: String,
    /// The event's data: for key events `key`, `service`, `meta`, `ttl_ms`, `registered_at`,
    /// `last_heartbeat_at`, `deadline`, `occurred_at`, `lateness_ms`, `restored`.
    pub data: serde_json::Value,
}

impl Event {
    /// The key, for a key event.
    pub fn key(&self) -> Option<&str> {
        self.data.get("key").and_then(serde_json::Value::as_str)
    }

    /// The service, for a key event of a key with one.
    pub fn service(&self) -> Option<&str> {
        self.data.get("service").and_then(serde_json::Value::as_str)
    }
}

/// An event stream's filters and starting point.
#[derive(Clone, Debug, Default)]
pub struct EventsQuery {
    /// Only events of this service (guard events always come).
    pub service: Option<String>,
    /// Only events of keys starting with this.
    pub prefix: Option<String>,
    /// Resume after this event id (the events since then, or a `reset`).
    pub last_event_id: Option<String>,
}
