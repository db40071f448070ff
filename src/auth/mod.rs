//! Who may do what: bearer tokens with scopes, read from `--auth-tokens FILE`.
//!
//! A token looks like `ttlw_<id>_<secret>`: lookup is by id, and the secret is checked by
//! comparing its SHA-256 with the hash the file holds, in constant time. The file never holds a
//! secret, and nothing logs one (the token id is what logs show).
//!
//! Scopes:
//! - `heartbeat` (optionally narrowed to a key prefix and/or a service): register and renew keys
//!   there, delete them. A token narrowed to a service must name it in every heartbeat.
//! - `read` (optionally narrowed likewise): lists, single keys, TTLs, events; unnarrowed, also the
//!   services overview, the guard's state and the metrics.
//! - `admin`: everything (TTL changes on any key, deletes, webhook status and dead letters, the
//!   guard's levers).
//!
//! Invariants: a [`TokenSet`] is immutable once loaded (a reload swaps the whole set, so a
//! request sees one set throughout); ids are unique within it; a check never returns early on
//! the secret's content (only on its length, which is public).

pub mod policy;
pub mod sessions;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use base64::Engine;
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The prefix of every token.
pub const TOKEN_PREFIX: &str = "ttlw_";

/// A part of the keyspace a scope is narrowed to: keys starting with `prefix`, and/or keys of
/// `service`. Both absent: every key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Narrow {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
}

impl Narrow {
    pub fn is_everything(&self) -> bool {
        self.prefix.is_none() && self.service.is_none()
    }

    /// Whether a key with this name and service (`None`: unknown or none) is inside.
    pub fn covers(&self, key: &str, service: Option<&str>) -> bool {
        self.prefix
            .as_deref()
            .is_none_or(|prefix| key.starts_with(prefix))
            && self
                .service
                .as_deref()
                .is_none_or(|wanted| service == Some(wanted))
    }

    /// Whether every key a listing with these filters could return is inside.
    pub fn covers_filter(&self, prefix: Option<&str>, service: Option<&str>) -> bool {
        self.prefix
            .as_deref()
            .is_none_or(|mine| prefix.is_some_and(|asked| asked.starts_with(mine)))
            && self
                .service
                .as_deref()
                .is_none_or(|mine| service == Some(mine))
    }
}

/// What a token may do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Scope {
    Admin,
    Read(Narrow),
    Heartbeat(Narrow),
}

/// A scope as the file writes it: `"admin"`, `"read"`, `"heartbeat"`, or `{"read": {...}}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ScopeText {
    Name(String),
    Narrowed(Scope),
}

impl TryFrom<ScopeText> for Scope {
    type Error = String;

    fn try_from(text: ScopeText) -> Result<Self, String> {
        match text {
            ScopeText::Narrowed(scope) => Ok(scope),
            ScopeText::Name(name) => match name.as_str() {
                "admin" => Ok(Self::Admin),
                "read" => Ok(Self::Read(Narrow::default())),
                "heartbeat" => Ok(Self::Heartbeat(Narrow::default())),
                other => Err(format!(
                    "unknown scope `{other}` (admin, read, heartbeat, or {{\"read\": {{\"prefix\": ...}}}})"
                )),
            },
        }
    }
}

/// One token as the file holds it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    id: String,
    /// Hex SHA-256 of the secret (the part after `ttlw_<id>_`).
    secret_sha256: String,
    #[serde(default)]
    description: String,
    scopes: Vec<ScopeText>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    tokens: Vec<TokenEntry>,
}

/// A loaded token: who, and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub id: String,
    pub description: String,
    pub scopes: Vec<Scope>,
    secret_sha256: [u8; 32],
}

impl Token {
    pub fn is_admin(&self) -> bool {
        self.scopes.contains(&Scope::Admin)
    }

    /// May it heartbeat `key` naming `service` (`None`: names none)?
    pub fn may_heartbeat(&self, key: &str, service: Option<&str>) -> bool {
        self.scopes.iter().any(|scope| match scope {
            Scope::Admin => true,
            Scope::Heartbeat(narrow) => narrow.covers(key, service),
            Scope::Read(_) => false,
        })
    }

    /// May it read `key`, whose service is `service`?
    pub fn may_read(&self, key: &str, service: Option<&str>) -> bool {
        self.scopes.iter().any(|scope| match scope {
            Scope::Admin => true,
            Scope::Read(narrow) => narrow.covers(key, service),
            Scope::Heartbeat(_) => false,
        })
    }

    /// May it list keys (or stream events) with these filters?
    pub fn may_list(&self, prefix: Option<&str>, service: Option<&str>) -> bool {
        self.scopes.iter().any(|scope| match scope {
            Scope::Admin => true,
            Scope::Read(narrow) => narrow.covers_filter(prefix, service),
            Scope::Heartbeat(_) => false,
        })
    }

    /// May it read everything (overviews, metrics, the guard's state)?
    pub fn may_read_all(&self) -> bool {
        self.scopes.iter().any(|scope| match scope {
            Scope::Admin => true,
            Scope::Read(narrow) => narrow.is_everything(),
            Scope::Heartbeat(_) => false,
        })
    }

    /// May it delete `key`, whose service is `service`? Admin, or a heartbeat scope over it
    /// (its own keys).
    pub fn may_delete(&self, key: &str, service: Option<&str>) -> bool {
        self.may_heartbeat(key, service)
    }
}

/// Why a token file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a valid token file: {reason}")]
    Invalid { path: String, reason: String },
}

/// Every token of the file, by id. Immutable: a reload builds a new one.
#[derive(Debug, Default)]
pub struct TokenSet {
    by_id: HashMap<String, Arc<Token>>,
}

impl TokenSet {
    /// Reads and checks a token file.
    pub fn load(path: &Path) -> Result<Self, TokenFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenFileError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text).map_err(|reason| TokenFileError::Invalid {
            path: path.display().to_string(),
            reason,
        })
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let file: TokenFile = serde_json::from_str(text).map_err(|error| error.to_string())?;
        let mut by_id = HashMap::new();
        for entry in file.tokens {
            check_id(&entry.id)?;
            let hash = hex_digest(&entry.secret_sha256).ok_or_else(|| {
                format!("token {}: secret_sha256 must be 64 hex digits", entry.id)
            })?;
            let scopes = entry
                .scopes
                .into_iter()
                .map(Scope::try_from)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|error| format!("token {}: {error}", entry.id))?;
            if scopes.is_empty() {
                return Err(format!("token {}: no scope", entry.id));
            }
            let token = Token {
                id: entry.id.clone(),
                description: entry.description,
                scopes,
                secret_sha256: hash,
            };
            if by_id.insert(entry.id.clone(), Arc::new(token)).is_some() {
                return Err(format!("token id {} appears twice", entry.id));
            }
        }
        Ok(Self { by_id })
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// The token a bearer string stands for, if it is one of ours and its secret matches.
    pub fn verify(&self, bearer: &str) -> Option<Arc<Token>> {
        let (id, secret) = split_token(bearer)?;
        let token = self.by_id.get(id)?;
        let digest: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
        bool::from(digest.ct_eq(&token.secret_sha256)).then(|| Arc::clone(token))
    }

    /// The token with this id (a session refers to its token by id, so a reload that removes
    /// the token ends the session).
    pub fn get(&self, id: &str) -> Option<Arc<Token>> {
        self.by_id.get(id).cloned()
    }
}

/// The tokens in force; `None` when auth is off. Swapped whole by a reload.
#[derive(Debug)]
pub struct Auth {
    tokens: RwLock<Arc<TokenSet>>,
    path: std::path::PathBuf,
    pub sessions: sessions::Sessions,
}

impl Auth {
    pub fn load(path: &Path) -> Result<Self, TokenFileError> {
        let tokens = TokenSet::load(path)?;
        Ok(Self {
            tokens: RwLock::new(Arc::new(tokens)),
            path: path.to_owned(),
            sessions: sessions::Sessions::default(),
        })
    }

    /// The set in force now.
    pub fn tokens(&self) -> Arc<TokenSet> {
        Arc::clone(&self.tokens.read())
    }

    /// Reads the file again (SIGHUP); on an error the old set stays in force. Returns how many
    /// tokens are loaded.
    pub fn reload(&self) -> Result<usize, TokenFileError> {
        let tokens = TokenSet::load(&self.path)?;
        let n = tokens.len();
        *self.tokens.write() = Arc::new(tokens);
        Ok(n)
    }
}

/// `ttlw_<id>_<secret>` -> `(id, secret)`.
fn split_token(bearer: &str) -> Option<(&str, &str)> {
    bearer.strip_prefix(TOKEN_PREFIX)?.split_once('_')
}

/// Ids are `[A-Za-z0-9-]{1,64}` (no `_`: it ends the id in a token).
fn check_id(id: &str) -> Result<(), String> {
    let valid = !id.is_empty()
        && id.len() <= 64
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if valid {
        Ok(())
    } else {
        Err(format!("token id `{id}` must be 1-64 of [A-Za-z0-9-]"))
    }
}

fn hex_digest(text: &str) -> Option<[u8; 32]> {
    let bytes = text.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let pair = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(out)
}

/// A new token: `(the token to hand out once, the file entry to add)`.
pub fn new_token(
    id: &str,
    description: &str,
    scopes: &[Scope],
) -> Result<(String, serde_json::Value), String> {
    check_id(id)?;
    if scopes.is_empty() {
        return Err("give at least one --scope".into());
    }
    let mut secret = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret)
        .map_err(|_| "the system's random source failed".to_owned())?;
    let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret);
    let digest = Sha256::digest(secret.as_bytes());
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    let entry = serde_json::json!({
        "id": id,
        "secret_sha256": hex,
        "description": description,
        "scopes": scopes,
    });
    Ok((format!("{TOKEN_PREFIX}{id}_{secret}"), entry))
}

/// Parses a `--scope` argument: `admin`, `read`, `heartbeat`, optionally followed by
/// `:prefix=P,service=S`.
pub fn parse_scope(text: &str) -> Result<Scope, String> {
    let (name, narrowing) = text.split_once(':').unwrap_or((text, ""));
    let mut narrow = Narrow::default();
    for part in narrowing.split(',').filter(|part| !part.is_empty()) {
        match part.split_once('=') {
            Some(("prefix", value)) => narrow.prefix = Some(value.to_owned()),
            Some(("service", value)) => narrow.service = Some(value.to_owned()),
            _ => return Err(format!("`{part}`: expected prefix=... or service=...")),
        }
    }
    match name {
        "admin" if narrow.is_everything() => Ok(Scope::Admin),
        "admin" => Err("admin cannot be narrowed".into()),
        "read" => Ok(Scope::Read(narrow)),
        "heartbeat" => Ok(Scope::Heartbeat(narrow)),
        other => Err(format!("unknown scope `{other}` (admin, read, heartbeat)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set_with(scopes: &[Scope]) -> (TokenSet, String) {
        let (token, entry) = new_token("app-1", "test", scopes).unwrap();
        let file = serde_json::json!({ "tokens": [entry] });
        (TokenSet::parse(&file.to_string()).unwrap(), token)
    }

    #[test]
    fn a_new_token_verifies_and_a_changed_secret_does_not() {
        let (set, token) = set_with(&[Scope::Admin]);
        assert!(token.starts_with("ttlw_app-1_"));
        assert_eq!(
            set.verify(&token).map(|t| t.id.clone()),
            Some("app-1".into())
        );
        let mut wrong = token.clone();
        let last = wrong.pop().unwrap();
        wrong.push(if last == 'A' { 'B' } else { 'A' });
        assert!(set.verify(&wrong).is_none());
        assert!(set.verify("ttlw_other_secret").is_none());
        assert!(set.verify("Bearer nonsense").is_none());
    }

    #[test]
    fn scopes_narrow_by_prefix_and_service() {
        let (set, token) = set_with(&[
            parse_scope("heartbeat:prefix=checkout/,service=checkout").unwrap(),
            parse_scope("read:prefix=checkout/").unwrap(),
        ]);
        let token = set.verify(&token).unwrap();
        assert!(token.may_heartbeat("checkout/1", Some("checkout")));
        assert!(
            !token.may_heartbeat("checkout/1", None),
            "must name its service"
        );
        assert!(!token.may_heartbeat("billing/1", Some("checkout")));
        assert!(token.may_read("checkout/1", Some("billing")));
        assert!(!token.may_read("billing/1", None));
        assert!(token.may_list(Some("checkout/x"), None));
        assert!(
            !token.may_list(None, None),
            "an unfiltered list is wider than the scope"
        );
        assert!(!token.may_read_all());
        assert!(!token.is_admin());
    }

    #[test]
    fn a_file_with_mistakes_is_refused_with_a_reason() {
        for (text, reason) in [
            (
                r#"{"tokens":[{"id":"a_b","secret_sha256":"00","scopes":["admin"]}]}"#,
                "must be 1-64",
            ),
            (
                r#"{"tokens":[{"id":"a","secret_sha256":"00","scopes":["admin"]}]}"#,
                "64 hex",
            ),
            (
                r#"{"tokens":[{"id":"a","secret_sha256":"0000000000000000000000000000000000000000000000000000000000000000","scopes":["root"]}]}"#,
                "unknown scope",
            ),
            (
                r#"{"tokens":[{"id":"a","secret_sha256":"0000000000000000000000000000000000000000000000000000000000000000","scopes":[]}]}"#,
                "no scope",
            ),
            (
                r#"{"tokens":[{"id":"a","secret_sha256":"0000000000000000000000000000000000000000000000000000000000000000","scopes":["read"]},{"id":"a","secret_sha256":"0000000000000000000000000000000000000000000000000000000000000000","scopes":["read"]}]}"#,
                "twice",
            ),
        ] {
            let error = TokenSet::parse(text).unwrap_err();
            assert!(error.contains(reason), "{error}");
        }
        let narrowed = r#"{"tokens":[{"id":"a","secret_sha256":"0000000000000000000000000000000000000000000000000000000000000000","scopes":[{"read":{"service":"x"}},"heartbeat"]}]}"#;
        assert_eq!(TokenSet::parse(narrowed).unwrap().len(), 1);
    }
}
