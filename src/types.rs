//! Validated input types: parse, don't validate.
//!
//! Every limit a client can hit is enforced here, in one constructor per type, so the rest of the
//! crate cannot hold an invalid key, service name, TTL or metadata object. The limits are part of
//! the public contract and are repeated in `openapi.yaml`; change both together.

use std::fmt;
use std::sync::Arc;

use compact_str::CompactString;
use serde_json::value::RawValue;

/// Longest accepted key, in bytes.
pub const MAX_KEY_BYTES: usize = 256;
/// Longest accepted service name, in bytes (the name is ASCII).
pub const MAX_SERVICE_BYTES: usize = 128;
/// Largest accepted metadata object, serialized, in bytes.
pub const MAX_META_BYTES: usize = 4096;
/// Shortest TTL: 1 ms.
pub const MIN_TTL_MS: u64 = 1;
/// Longest TTL: 365 days.
pub const MAX_TTL_MS: u64 = 365 * 24 * 3600 * 1000;

/// Why a value was refused. Each variant is one error code of the HTTP API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidInput {
    #[error("invalid key: {0}")]
    Key(&'static str),
    #[error("invalid service name: must match [A-Za-z0-9._:-]{{1,128}}")]
    Service,
    #[error("invalid meta: {0}")]
    Meta(&'static str),
    #[error("invalid ttl: must be between 1 ms and 365 days")]
    Ttl,
}

/// A registered key: 1 to 256 bytes of UTF-8 without control characters.
///
/// Stored inline (no allocation) up to 24 bytes, which is what keeps the per-key memory small
/// (a registry entry keeps up to 30 inline: `registry::entry_key`).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key(CompactString);

impl Key {
    pub fn new(raw: &str) -> Result<Self, InvalidInput> {
        if raw.is_empty() {
            return Err(InvalidInput::Key("must not be empty"));
        }
        if raw.len() > MAX_KEY_BYTES {
            return Err(InvalidInput::Key("longer than 256 bytes"));
        }
        if raw.chars().any(char::is_control) {
            return Err(InvalidInput::Key("contains control characters"));
        }
        Ok(Self(CompactString::new(raw)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    /// The key whose bytes these are, copied from a key (`registry`'s entries keep some keys
    /// as bytes): only checked to be UTF-8, as they are unless the copy was wrong.
    pub(crate) fn from_copied(bytes: &[u8]) -> Option<Self> {
        std::str::from_utf8(bytes)
            .ok()
            .map(|raw| Self(CompactString::new(raw)))
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl serde::Serialize for Key {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A service name: 1 to 128 characters of `[A-Za-z0-9._:-]`. Cheap to clone (shared).
///
/// One pointer, not `Arc<str>`'s two: every event carries an optional name, and an event of
/// at most 128 bytes is moved by inline copies where 136 bytes called `memcpy`, two or three
/// times an event (a mass expiry's profile, BENCHMARKS.md). The name's bytes are one more
/// pointer away, which only serializing pays.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceName(Arc<Box<str>>);

impl ServiceName {
    pub fn new(raw: &str) -> Result<Self, InvalidInput> {
        let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-');
        if raw.is_empty() || raw.len() > MAX_SERVICE_BYTES || !raw.bytes().all(allowed) {
            return Err(InvalidInput::Service);
        }
        Ok(Self(Arc::new(Box::from(raw))))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ServiceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// A time to live in milliseconds, within `MIN_TTL_MS..=MAX_TTL_MS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ttl(u64);

impl Ttl {
    pub fn from_millis(ms: u64) -> Result<Self, InvalidInput> {
        if (MIN_TTL_MS..=MAX_TTL_MS).contains(&ms) {
            Ok(Self(ms))
        } else {
            Err(InvalidInput::Ttl)
        }
    }

    pub fn from_secs(s: u64) -> Result<Self, InvalidInput> {
        Self::from_millis(s.checked_mul(1000).ok_or(InvalidInput::Ttl)?)
    }

    pub fn as_millis(self) -> u64 {
        self.0
    }
}

/// Client metadata: a JSON object of at most 4 KiB serialized, kept as its raw text.
///
/// Boxed twice on purpose: `Option<Meta>` is one pointer (8 bytes) in every event and record,
/// and most keys carry no metadata at all.
#[derive(Clone)]
pub struct Meta(Box<Box<RawValue>>);

impl PartialEq for Meta {
    fn eq(&self, other: &Self) -> bool {
        self.0.get() == other.0.get()
    }
}

impl Eq for Meta {}

impl Meta {
    /// Accepts a JSON object; anything else (array, string, null...) is refused.
    pub fn from_value(value: &serde_json::Value) -> Result<Self, InvalidInput> {
        if !value.is_object() {
            return Err(InvalidInput::Meta("must be a JSON object"));
        }
        let text = serde_json::to_string(value).map_err(|_| InvalidInput::Meta("not encodable"))?;
        if text.len() > MAX_META_BYTES {
            return Err(InvalidInput::Meta("larger than 4096 bytes serialized"));
        }
        // `to_string` grows its buffer by doubling, and `RawValue::from_string` shrinks it with
        // a `realloc` that mimalloc (the binary's allocator) may do in place, keeping the whole
        // block: 4 KiB of metadata then held 8 KiB. A copy of exactly the text's length is what
        // the entry keeps instead.
        let text = String::from(text.as_str());
        let raw = RawValue::from_string(text).map_err(|_| InvalidInput::Meta("not encodable"))?;
        Ok(Self(Box::new(raw)))
    }

    pub fn raw(&self) -> &RawValue {
        &self.0
    }

    /// Metadata read back from its stored text (the persistence log), checked again as if a
    /// client had sent it: a record can never bring in what the API would refuse.
    pub fn from_text(text: &str) -> Result<Self, InvalidInput> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|_| InvalidInput::Meta("not valid JSON"))?;
        Self::from_value(&value)
    }
}

impl fmt::Debug for Meta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.get())
    }
}

impl serde::Serialize for Meta {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked_for_length_emptiness_and_control_characters() {
        let check = |raw: &str, ok: bool| assert_eq!(Key::new(raw).is_ok(), ok, "{raw:?}");
        check("a", true);
        check("svc/host:1/π", true);
        check(&"k".repeat(MAX_KEY_BYTES), true);
        check(&"k".repeat(MAX_KEY_BYTES + 1), false);
        check("", false);
        check("a\nb", false);
        check("a\u{7f}b", false);
    }

    #[test]
    fn service_names_follow_the_documented_alphabet() {
        let check = |raw: &str, ok: bool| assert_eq!(ServiceName::new(raw).is_ok(), ok, "{raw:?}");
        check("api-v2.eu:west_1", true);
        check(&"s".repeat(MAX_SERVICE_BYTES), true);
        check(&"s".repeat(MAX_SERVICE_BYTES + 1), false);
        check("", false);
        check("has space", false);
        check("slash/no", false);
    }

    #[test]
    fn ttl_bounds_are_inclusive() {
        assert!(Ttl::from_millis(0).is_err());
        assert!(Ttl::from_millis(1).is_ok());
        assert!(Ttl::from_millis(MAX_TTL_MS).is_ok());
        assert!(Ttl::from_millis(MAX_TTL_MS + 1).is_err());
        assert!(Ttl::from_secs(u64::MAX).is_err());
    }

    #[test]
    fn meta_must_be_a_small_object() {
        assert!(Meta::from_value(&serde_json::json!({"zone": "a"})).is_ok());
        assert!(Meta::from_value(&serde_json::json!([1])).is_err());
        assert!(Meta::from_value(&serde_json::json!(null)).is_err());
        let big = serde_json::json!({ "x": "y".repeat(MAX_META_BYTES) });
        assert!(Meta::from_value(&big).is_err());
    }
}
