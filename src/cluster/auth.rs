//! Authentication of peer traffic (`--cluster-secret`): every request between members carries
//! an HMAC-SHA256 of what it asks (method, path, a timestamp, the body's SHA-256) under the
//! shared secret, in [`HEADER`] as `<unix seconds>.<base64 signature>`.
//!
//! Invariants: a request is accepted only if its signature matches (compared in constant time)
//! and its timestamp is within [`WINDOW`] of the receiver's clock, so a recorded request
//! cannot be replayed later than that. Without a secret nothing is signed and nothing is
//! checked: start-up allows that only on a loopback `--cluster-listen` (as the API runs without
//! tokens only on loopback). Pure: the clock is an argument.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The header that carries a peer request's signature.
pub const HEADER: &str = "x-ttlwheel-peer-auth";

/// How far a request's timestamp may be from the receiver's clock, either way: members' clocks
/// differ by far less (NTP), and a replay must not outlive this.
pub const WINDOW: u64 = 30;

/// A peer request that is not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerAuthError {
    #[error("the request carries no {HEADER} header")]
    Missing,
    #[error("the {HEADER} header is not `<unix seconds>.<base64 signature>`")]
    Malformed,
    #[error("the request's timestamp is {0} s away from this member's clock (at most {WINDOW} s)")]
    Stale(u64),
    #[error(
        "the request's signature does not match: is --cluster-secret the same on every member?"
    )]
    BadSignature,
}

/// Signs and checks peer requests. See the module documentation.
#[derive(Clone)]
pub struct PeerAuth {
    /// The shared secret; `None`: loopback without authentication.
    secret: Option<Vec<u8>>,
}

impl std::fmt::Debug for PeerAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerAuth")
            .field("secret", &self.secret.as_ref().map(|_| "<hidden>"))
            .finish()
    }
}

impl PeerAuth {
    /// Signing with `secret` (`None` or empty: no authentication).
    pub fn new(secret: Option<&str>) -> Self {
        Self {
            secret: secret
                .filter(|secret| !secret.is_empty())
                .map(|secret| secret.as_bytes().to_vec()),
        }
    }

    /// Whether requests are signed and checked.
    pub fn is_on(&self) -> bool {
        self.secret.is_some()
    }

    /// The header value for a request of `method` to `path` with `body`, at `unix_s`; `None`
    /// without a secret.
    pub fn sign(&self, method: &str, path: &str, body: &[u8], unix_s: u64) -> Option<String> {
        let secret = self.secret.as_ref()?;
        let signature = signature(secret, method, path, body, unix_s);
        Some(format!(
            "{unix_s}.{}",
            base64::engine::general_purpose::STANDARD.encode(signature)
        ))
    }

    /// Accepts or refuses a request whose header is `header` (absent: `None`), at `unix_s`.
    pub fn verify(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
        header: Option<&str>,
        unix_s: u64,
    ) -> Result<(), PeerAuthError> {
        let Some(secret) = &self.secret else {
            return Ok(());
        };
        let header = header.ok_or(PeerAuthError::Missing)?;
        let (stamp, given) = header.split_once('.').ok_or(PeerAuthError::Malformed)?;
        let stamp: u64 = stamp.parse().map_err(|_| PeerAuthError::Malformed)?;
        let given = base64::engine::general_purpose::STANDARD
            .decode(given)
            .map_err(|_| PeerAuthError::Malformed)?;
        let skew = stamp.abs_diff(unix_s);
        if skew > WINDOW {
            return Err(PeerAuthError::Stale(skew));
        }
        let expected = signature(secret, method, path, body, stamp);
        if bool::from(expected.as_slice().ct_eq(&given)) {
            Ok(())
        } else {
            Err(PeerAuthError::BadSignature)
        }
    }
}

/// The HMAC of one request: every field on its own line, the body as its digest.
fn signature(secret: &[u8], method: &str, path: &str, body: &[u8], unix_s: u64) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(method.as_bytes());
    mac.update(b"\n");
    mac.update(path.as_bytes());
    mac.update(b"\n");
    mac.update(unix_s.to_string().as_bytes());
    mac.update(b"\n");
    mac.update(&Sha256::digest(body));
    mac.finalize().into_bytes().to_vec()
}

/// Now, in Unix seconds (0 before 1970: such a clock fails every check, visibly).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000;

    fn signed() -> (PeerAuth, String) {
        let auth = PeerAuth::new(Some("s3cret"));
        let header = auth.sign("POST", "/raft/append", b"{}", NOW).unwrap();
        (auth, header)
    }

    #[test]
    fn a_request_signed_with_the_same_secret_is_accepted_within_the_window() {
        let (auth, header) = signed();
        for now in [NOW - WINDOW, NOW, NOW + WINDOW] {
            assert_eq!(
                auth.verify("POST", "/raft/append", b"{}", Some(&header), now),
                Ok(())
            );
        }
    }

    #[test]
    fn any_change_to_what_was_signed_is_refused() {
        let (auth, header) = signed();
        let check = |method, path, body: &[u8]| auth.verify(method, path, body, Some(&header), NOW);
        assert_eq!(
            check("GET", "/raft/append", b"{}"),
            Err(PeerAuthError::BadSignature)
        );
        assert_eq!(
            check("POST", "/raft/vote", b"{}"),
            Err(PeerAuthError::BadSignature)
        );
        assert_eq!(
            check("POST", "/raft/append", b"{ }"),
            Err(PeerAuthError::BadSignature)
        );
        let other = PeerAuth::new(Some("other"));
        assert_eq!(
            other.verify("POST", "/raft/append", b"{}", Some(&header), NOW),
            Err(PeerAuthError::BadSignature)
        );
        // A timestamp moved forward to dodge the window breaks the signature.
        let (_, signature) = header.split_once('.').unwrap();
        let moved = format!("{}.{signature}", NOW + 100);
        assert_eq!(
            auth.verify("POST", "/raft/append", b"{}", Some(&moved), NOW + 100),
            Err(PeerAuthError::BadSignature)
        );
    }

    #[test]
    fn a_replay_outside_the_window_a_missing_or_malformed_header_is_refused() {
        let (auth, header) = signed();
        let at = |now| auth.verify("POST", "/raft/append", b"{}", Some(&header), now);
        assert_eq!(at(NOW + WINDOW + 1), Err(PeerAuthError::Stale(WINDOW + 1)));
        assert_eq!(at(NOW - WINDOW - 1), Err(PeerAuthError::Stale(WINDOW + 1)));
        let verify = |header| auth.verify("POST", "/raft/append", b"{}", header, NOW);
        assert_eq!(verify(None), Err(PeerAuthError::Missing));
        for bad in ["", "123", "x.abc", "123.!!!"] {
            assert_eq!(verify(Some(bad)), Err(PeerAuthError::Malformed), "{bad}");
        }
    }

    #[test]
    fn without_a_secret_nothing_is_signed_or_checked() {
        let auth = PeerAuth::new(None);
        assert!(!auth.is_on() && !PeerAuth::new(Some("")).is_on());
        assert_eq!(auth.sign("POST", "/raft/append", b"", NOW), None);
        assert_eq!(auth.verify("POST", "/raft/append", b"", None, NOW), Ok(()));
    }
}
