//! The cluster's identity: a random 64-bit id that the founder draws, every member keeps in
//! its data directory, and every peer request names ([`HEADER`]), as etcd's cluster id.
//!
//! **Why**: Raft's own checks cannot tell two clusters apart. Two new clusters both elect
//! "term 1, node 1" and both start their logs the same way, so a member that another
//! cluster's leader reaches (a peer address that now names a member of another cluster: a
//! port or host reused, an old `--initial-cluster` string, a test's port taken by another
//! test) took that leader's entries as its own leader's. Measured before this module: a key
//! written to one cluster was listed on a member of the other, whose log then diverged from
//! its own cluster's for good (and openraft may panic on such a log). The cluster secret
//! does not help when both clusters share one or run without one on loopback.
//!
//! Rules ([`decide`]):
//! - a member that has an id refuses a request that names another (409 `cluster_mismatch`)
//!   before Raft sees it, and says so in its log; the sender's log names the refusal too;
//! - a member without one adopts the first id a request names, and keeps it (written and
//!   synced before the request is served): a founding member first reached by its founder, a
//!   `--join`er first reached by its leader;
//! - a request that names none is served: a member of an older version, in a rolling upgrade.
//!   A cluster founded before ids existed has none, and its members behave as before.
//!
//! Invariants: an id once held never changes (the file is written only by a member that held
//! none); 0 is never an id (it stands for "none" in memory).
//! Stored as a JSON string of 16 hex digits in `cluster-id` in the member's cluster directory,
//! written as the log store writes its vote (`write_json`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{io_error, read_json, write_json, StoreError};

/// The header every peer request names its cluster in (16 hex digits).
pub const HEADER: &str = "x-ttlwheel-cluster";

/// The file the id is kept in, in the member's cluster directory.
const FILE: &str = "cluster-id";

/// What a member does with a request that names `named`, holding `own`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Serve,
    /// Keep this id, then serve.
    Adopt(u64),
    /// Another cluster's request: refuse it.
    Refuse {
        own: u64,
        named: u64,
    },
}

/// The rules of the module documentation.
pub fn decide(own: Option<u64>, named: Option<u64>) -> Decision {
    match (own, named) {
        (_, None) => Decision::Serve,
        (None, Some(named)) => Decision::Adopt(named),
        (Some(own), Some(named)) if own == named => Decision::Serve,
        (Some(own), Some(named)) => Decision::Refuse { own, named },
    }
}

/// A request's [`HEADER`] value as an id; `Err` if it is not 16 hex digits of a non-zero id.
pub fn parse(value: &str) -> Result<u64, String> {
    // `from_str_radix` alone would take a sign.
    let digits = value.len() == 16 && value.bytes().all(|byte| byte.is_ascii_hexdigit());
    let id = digits
        .then(|| u64::from_str_radix(value, 16).ok())
        .flatten()
        .filter(|&id| id != 0);
    id.ok_or_else(|| format!("the {HEADER} header is not 16 hex digits of a cluster id: {value:?}"))
}

/// `id` as a header value (and as the file holds it).
pub fn format(id: u64) -> String {
    format!("{id:016x}")
}

/// This member's cluster id, if it has one. See the module documentation.
#[derive(Debug)]
pub struct Identity {
    /// The member's cluster directory, which holds [`FILE`].
    dir: PathBuf,
    /// 0: none yet.
    id: AtomicU64,
    /// Held while an id is drawn or adopted, so that only one is ever written.
    writing: tokio::sync::Mutex<()>,
}

impl Identity {
    /// The identity kept in `dir` (created if needed), or none yet.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir).map_err(io_error(dir))?;
        let file = dir.join(FILE);
        let id = match read_json::<String>(&file)? {
            Some(text) => parse(&text).map_err(|reason| StoreError::Corrupt {
                path: file.clone(),
                reason,
            })?,
            None => 0,
        };
        Ok(Self {
            dir: dir.to_owned(),
            id: AtomicU64::new(id),
            writing: tokio::sync::Mutex::new(()),
        })
    }

    /// The id, if this member has one.
    pub fn id(&self) -> Option<u64> {
        Some(self.id.load(Ordering::Acquire)).filter(|&id| id != 0)
    }

    /// Draws an id and keeps it, unless this member has one (the founder, before it founds).
    pub async fn draw(&self) -> Result<u64, StoreError> {
        if let Some(held) = self.id() {
            return Ok(held);
        }
        let mut drawn = [0u8; 8];
        while u64::from_le_bytes(drawn) == 0 {
            ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut drawn).map_err(
                |_| io_error(&self.dir)(std::io::Error::other("the system's random source failed")),
            )?;
        }
        self.keep(u64::from_le_bytes(drawn)).await
    }

    /// Decides on a request that names `named` ([`decide`]), adopting it if this member has
    /// none. `Ok(())`: serve it.
    pub async fn admit(&self, named: Option<u64>) -> Result<(), Refused> {
        match decide(self.id(), named) {
            Decision::Serve => Ok(()),
            Decision::Refuse { own, named } => Err(Refused::Mismatch { own, named }),
            Decision::Adopt(named) => {
                let kept = self.keep(named).await.map_err(Refused::Store)?;
                match decide(Some(kept), Some(named)) {
                    // Another request's id was adopted first.
                    Decision::Refuse { own, named } => Err(Refused::Mismatch { own, named }),
                    _ => {
                        tracing::info!(cluster_id = %format(kept), "joined the cluster");
                        Ok(())
                    }
                }
            }
        }
    }

    /// Writes and syncs `id` unless this member holds one already; the id it holds after.
    async fn keep(&self, id: u64) -> Result<u64, StoreError> {
        let _writing = self.writing.lock().await;
        if let Some(held) = self.id() {
            return Ok(held);
        }
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || write_json(&dir, FILE, &format(id), true))
            .await
            .map_err(|error| StoreError::Task(error.to_string()))??;
        self.id.store(id, Ordering::Release);
        Ok(id)
    }
}

/// Why a peer request is not served.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error(
        "the request comes from cluster {}, this member belongs to cluster {}: a peer address \
         names a member of another cluster",
        format(*named),
        format(*own)
    )]
    Mismatch { own: u64, named: u64 },
    #[error("this member cannot keep the cluster's id: {0}")]
    Store(StoreError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_refuses_another_clusters_id_adopts_a_first_one_and_serves_none() {
        assert_eq!(decide(Some(7), Some(7)), Decision::Serve);
        assert_eq!(
            decide(Some(7), Some(8)),
            Decision::Refuse { own: 7, named: 8 }
        );
        assert_eq!(decide(None, Some(8)), Decision::Adopt(8));
        assert_eq!(decide(Some(7), None), Decision::Serve);
        assert_eq!(decide(None, None), Decision::Serve);
    }

    #[test]
    fn a_header_is_sixteen_hex_digits_of_a_non_zero_id() {
        assert_eq!(parse(&format(0xabc)), Ok(0xabc));
        assert_eq!(format(0xabc), "0000000000000abc");
        for bad in [
            "",
            "abc",
            "000000000000000g",
            "0000000000000000",
            "+000000000000abc",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn an_id_is_kept_across_opens_and_never_replaced() {
        let temp = crate::cluster::testing::TempDir::new("identity");
        let dir = temp.path();
        let identity = Identity::open(dir).unwrap();
        assert_eq!(identity.id(), None);
        identity.admit(None).await.unwrap();
        assert_eq!(identity.id(), None, "a request naming none adopts nothing");
        identity.admit(Some(42)).await.unwrap();
        assert_eq!(identity.id(), Some(42));
        let refused = identity.admit(Some(43)).await.unwrap_err();
        assert!(matches!(refused, Refused::Mismatch { own: 42, named: 43 }));
        assert_eq!(
            identity.draw().await.unwrap(),
            42,
            "a drawn id replaces none"
        );
        let reopened = Identity::open(dir).unwrap();
        assert_eq!(reopened.id(), Some(42));
        std::fs::write(dir.join(FILE), "not an id").unwrap();
        assert!(
            Identity::open(dir).is_err(),
            "a damaged file stops the start"
        );
    }

    #[tokio::test]
    async fn a_founder_draws_a_non_zero_id_once() {
        let temp = crate::cluster::testing::TempDir::new("identity-draw");
        let identity = Identity::open(temp.path()).unwrap();
        let drawn = identity.draw().await.unwrap();
        assert_ne!(drawn, 0);
        assert_eq!(identity.draw().await.unwrap(), drawn);
        assert_eq!(Identity::open(temp.path()).unwrap().id(), Some(drawn));
    }
}
