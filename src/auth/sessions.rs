//! Browser sessions for the dashboard: a browser's `EventSource` cannot send an
//! `Authorization` header, and a long-lived token must never travel in a URL. So the dashboard
//! trades a token for a session once (`POST /v1/session`), and the browser then sends an
//! `HttpOnly`, `SameSite=Strict` cookie, which other sites cannot make it send.
//!
//! A session refers to its token by id: a reload that removes or replaces the token ends what
//! the session may do. Sessions live [`SESSION_TTL`]; at most [`MAX_SESSIONS`] are kept (the
//! oldest go first), so minting sessions cannot exhaust memory.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use base64::Engine;
use parking_lot::Mutex;

/// The cookie's name.
pub const COOKIE: &str = "ttlwheel_session";
/// How long a session lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);
/// Most sessions kept at once.
pub const MAX_SESSIONS: usize = 10_000;

#[derive(Debug)]
struct Session {
    token_id: String,
    expires: Instant,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct Sessions {
    by_id: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    /// A new session for `token_id`: its id (the cookie's value).
    pub fn create(&self, token_id: &str) -> Result<String, String> {
        let mut secret = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret)
            .map_err(|_| "the system's random source failed".to_owned())?;
        let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret);
        let now = Instant::now();
        let mut sessions = self.by_id.lock();
        if sessions.len() >= MAX_SESSIONS {
            sessions.retain(|_, session| session.expires > now);
        }
        if sessions.len() >= MAX_SESSIONS {
            let oldest = sessions
                .iter()
                .min_by_key(|(_, session)| session.expires)
                .map(|(id, _)| id.clone());
            if let Some(oldest) = oldest {
                sessions.remove(&oldest);
            }
        }
        sessions.insert(
            id.clone(),
            Session {
                token_id: token_id.to_owned(),
                expires: now + SESSION_TTL,
            },
        );
        Ok(id)
    }

    /// The token id of a live session.
    pub fn token_id(&self, session: &str) -> Option<String> {
        let mut sessions = self.by_id.lock();
        let found = sessions.get(session)?;
        if found.expires <= Instant::now() {
            sessions.remove(session);
            return None;
        }
        Some(found.token_id.clone())
    }

    pub fn end(&self, session: &str) {
        self.by_id.lock().remove(session);
    }
}

/// The session id in a `Cookie` header, if any.
pub fn from_cookie_header(header: &str) -> Option<&str> {
    header
        .split(';')
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_names_its_token_until_it_ends() {
        let sessions = Sessions::default();
        let id = sessions.create("ops").unwrap();
        assert_eq!(sessions.token_id(&id).as_deref(), Some("ops"));
        assert_eq!(
            from_cookie_header(&format!("a=b; {COOKIE}={id}; c=d")),
            Some(id.as_str())
        );
        sessions.end(&id);
        assert_eq!(sessions.token_id(&id), None);
        assert_eq!(sessions.token_id("made-up"), None);
    }

    #[test]
    fn sessions_are_bounded() {
        let sessions = Sessions::default();
        let first = sessions.create("a").unwrap();
        for _ in 0..MAX_SESSIONS {
            sessions.create("a").unwrap();
        }
        assert_eq!(sessions.by_id.lock().len(), MAX_SESSIONS);
        assert_eq!(sessions.token_id(&first), None, "the oldest went first");
    }
}
