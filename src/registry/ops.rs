//! The registry's operation types: what callers pass in (a heartbeat, an EXPIRE's target and
//! condition) and what they get back (outcomes, views of keys, counts, errors). Plain data;
//! the semantics live in `shard` and the door in `Registry`.

use crate::expiry::TimerKind;
use crate::types::{InvalidInput, Key, Meta, ServiceName, Ttl};

use super::services::MAX_SERVICES;

/// A registration or renewal.
#[derive(Clone, Debug)]
pub struct Heartbeat {
    pub key: Key,
    pub ttl: Ttl,
    /// `None` keeps the stored service (or none, for a new key).
    pub service: Option<ServiceName>,
    /// `None` keeps the stored metadata.
    pub meta: Option<Meta>,
}

/// What a heartbeat did. Times are Unix ms.
#[derive(Clone, Debug)]
pub struct HeartbeatOutcome {
    /// The key, handed back so that a caller answering with it need not copy it (a key over 24
    /// bytes is a heap allocation).
    pub key: Key,
    pub created: bool,
    pub service: Option<ServiceName>,
    pub ttl_ms: u64,
    /// Milliseconds to the deadline (never more than `ttl_ms`: see `Clock` on rounding).
    pub expires_in_ms: u64,
    pub expires_at_ms: u64,
    pub timer: TimerKind,
    /// The LSN of the log record the heartbeat wrote, 0 when it wrote none (a renewal that
    /// changed only the deadline, or no journal): `--fsync always` answers once it is durable.
    pub lsn: u64,
}

/// A snapshot of an alive (or held) key. Times are Unix ms.
#[derive(Clone, Debug)]
pub struct KeyView {
    pub key: Key,
    pub service: Option<ServiceName>,
    pub meta: Option<Meta>,
    /// `None` when the key has no TTL (after PERSIST).
    pub ttl_ms: Option<u64>,
    pub expires_in_ms: Option<u64>,
    pub expires_at_ms: Option<u64>,
    pub registered_at_ms: u64,
    pub last_heartbeat_at_ms: u64,
    pub timer: Option<TimerKind>,
    /// Due, and held by the mass-expiry guard: not expired, no event yet; a heartbeat renews it.
    pub held: bool,
}

/// A recently expired key. Times are Unix ms.
#[derive(Clone, Debug)]
pub struct ExpiredView {
    pub key: Key,
    pub service: Option<ServiceName>,
    pub meta: Option<Meta>,
    pub last_heartbeat_at_ms: u64,
    pub expired_at_ms: u64,
}

/// The answer to TTL / PTTL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyState {
    /// Redis's -2.
    Missing,
    /// Redis's -1.
    Persistent,
    /// Remaining milliseconds, from the exact deadline.
    ExpiresIn(u64),
}

/// The new deadline of an EXPIRE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpireAt {
    /// EXPIRE / PEXPIRE: milliseconds from now; zero or less deletes the key.
    In(i64),
    /// PEXPIREAT: a Unix time in ms; one in the past deletes the key.
    AtUnixMs(i64),
}

/// EXPIRE's NX / XX / GT / LT. A key without a TTL counts as an infinite TTL for GT and LT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpireCondition {
    /// Only if the key has no TTL.
    Nx,
    /// Only if the key has a TTL.
    Xx,
    /// Only if the new deadline is later than the current one.
    Gt,
    /// Only if the new deadline is earlier than the current one.
    Lt,
}

impl ExpireCondition {
    /// Redis 7's `expireGenericCommand` checks, with `current` `None` for "no TTL".
    pub(super) fn allows(self, current: Option<u64>, target_ms: i64) -> bool {
        match (self, current) {
            (Self::Nx, current) => current.is_none(),
            (Self::Xx, current) => current.is_some(),
            (Self::Gt, None) => false,
            (Self::Gt, Some(current)) => target_ms > current as i64,
            (Self::Lt, None) => true,
            (Self::Lt, Some(current)) => target_ms < current as i64,
        }
    }
}

/// What an EXPIRE did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpireOutcome {
    NotFound,
    /// The condition failed; `ttl_ms` is the unchanged remaining TTL (`None`: no TTL).
    NotApplied {
        ttl_ms: Option<u64>,
    },
    Applied {
        ttl_ms: u64,
    },
    /// The new deadline was not in the future: the key was deleted.
    Deleted,
}

/// Why the registry refused an operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    #[error("too many distinct service names in use (at most {MAX_SERVICES})")]
    TooManyServices,
    /// A creation past `--max-keys`; renewals of existing keys go on.
    #[error(
        "the registry holds its maximum of {max} keys (--max-keys): new keys are refused until \
         some expire or are deleted; renewals of existing keys go on"
    )]
    TooManyKeys { max: u64 },
    /// The change must be logged and the persistence log cannot be written (a full disk):
    /// nothing was changed. Renewals that change nothing durable still work.
    #[error(
        "the persistence log cannot be written (is the disk full?): changes that must be \
         durable are refused until it can; renewals of existing keys still work"
    )]
    StorageUnavailable,
    /// A cluster member's registry changes only by committed log entries: the change must be
    /// proposed to the log (the caller does that), and nothing was changed here.
    #[error("in a cluster this change goes through the replicated log")]
    NeedsLog,
}

/// Per-service counts for the services overview.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceCounts {
    pub service: ServiceName,
    pub alive: u64,
    pub expired: u64,
}

/// Alive and listed-expired counts of a set of keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyCounts {
    pub alive: u64,
    pub expired: u64,
}

/// The services overview: every service with keys, and the keys that have no service (they
/// are in no service's counts, but they are alive or expired all the same).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServicesOverview {
    /// In name order; only services with an alive or listed-expired key.
    pub services: Vec<ServiceCounts>,
    pub without_service: KeyCounts,
}
