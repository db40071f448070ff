//! What the tool sends: key names, TTLs, and the JSON bodies of heartbeats and batches.
//!
//! Keys are `<prefix><n>` with `n` in `0..keys`, so a response or a webhook names its key's
//! index without a lookup table.

use std::time::Duration;

/// A TTL as the API takes it: whole seconds go as `ttl_s` (the wheel, when at most the
/// server's `--max-ttl`), anything else as `ttl_ms` (the heap).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ttl(pub Duration);

impl Ttl {
    pub fn parse(text: &str) -> Result<Self, String> {
        let duration = humantime::parse_duration(text).map_err(|error| error.to_string())?;
        if duration.as_millis() == 0 || duration.subsec_nanos() % 1_000_000 != 0 {
            return Err("a TTL is a positive whole number of milliseconds".into());
        }
        Ok(Self(duration))
    }

    /// The JSON field and value: `"ttl_s":30` or `"ttl_ms":4500`.
    fn write_field(self, out: &mut Vec<u8>) {
        let millis = self.0.as_millis() as u64;
        let mut number = itoa::Buffer::new();
        if millis.is_multiple_of(1000) {
            out.extend_from_slice(b"\"ttl_s\":");
            out.extend_from_slice(number.format(millis / 1000).as_bytes());
        } else {
            out.extend_from_slice(b"\"ttl_ms\":");
            out.extend_from_slice(number.format(millis).as_bytes());
        }
    }
}

/// Appends `<prefix><n>` to `out`.
pub fn write_key(out: &mut Vec<u8>, prefix: &str, n: u64) {
    out.extend_from_slice(prefix.as_bytes());
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// The index in a key named `<prefix><n>`, if it is one of ours.
pub fn key_index(key: &str, prefix: &str) -> Option<u64> {
    let digits = key.strip_prefix(prefix)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Appends one heartbeat object: `{"key":"<prefix><n>","ttl_s":30}`. Prefixes are checked by
/// [`check_prefix`], so the key needs no JSON escaping.
pub fn write_heartbeat(out: &mut Vec<u8>, prefix: &str, n: u64, ttl: Ttl) {
    out.extend_from_slice(b"{\"key\":\"");
    write_key(out, prefix, n);
    out.extend_from_slice(b"\",");
    ttl.write_field(out);
    out.push(b'}');
}

/// Appends a batch body: `{"heartbeats":[...]}`, one item per `(key index, TTL)`.
pub fn write_batch(out: &mut Vec<u8>, prefix: &str, keys: impl IntoIterator<Item = (u64, Ttl)>) {
    out.extend_from_slice(b"{\"heartbeats\":[");
    for (i, (n, ttl)) in keys.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_heartbeat(out, prefix, n, ttl);
    }
    out.extend_from_slice(b"]}");
}

/// Key prefixes are plain: letters, digits, `-`, `_`, `.`, `:`, `/` (no JSON escaping needed,
/// and a valid key once a number is appended).
pub fn check_prefix(prefix: &str) -> Result<String, String> {
    let plain = |b: u8| b.is_ascii_alphanumeric() || b"-_.:/".contains(&b);
    if prefix.len() <= 64 && prefix.bytes().all(plain) {
        Ok(prefix.to_owned())
    } else {
        Err("a key prefix is at most 64 of [A-Za-z0-9-_.:/]".into())
    }
}

/// The positions of the failed items in a `?results=errors` batch response
/// (`{"accepted":N,"failed":M,"errors":[{"index":i,"error":{...}}]}`).
pub fn failed_positions(body: &[u8]) -> Result<Vec<usize>, String> {
    #[derive(serde::Deserialize)]
    struct Compact {
        errors: Vec<Failed>,
    }
    #[derive(serde::Deserialize)]
    struct Failed {
        index: usize,
    }
    let compact: Compact = serde_json::from_slice(body)
        .map_err(|error| format!("not a `?results=errors` batch response: {error}"))?;
    Ok(compact
        .errors
        .into_iter()
        .map(|failed| failed.index)
        .collect())
}

/// How many items of a batch response failed. With `?results=errors` the server answers
/// `{"accepted":N,"failed":M,...}`; with full results every failed item is an `{"error":...}`.
pub fn failed_items(body: &[u8], items: u64) -> u64 {
    #[derive(serde::Deserialize)]
    struct Counts {
        accepted: u64,
    }
    if let Ok(counts) = serde_json::from_slice::<Counts>(body) {
        return items.saturating_sub(counts.accepted);
    }
    memchr::memmem::find_iter(body, b"{\"error\":{").count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_the_json_the_api_takes() {
        let mut out = Vec::new();
        let ttl = Ttl::parse("30s").unwrap();
        write_batch(&mut out, "k-", [(1, ttl), (22, ttl)]);
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"heartbeats": [{"key": "k-1", "ttl_s": 30}, {"key": "k-22", "ttl_s": 30}]})
        );
        out.clear();
        write_heartbeat(&mut out, "h", 7, Ttl::parse("4500ms").unwrap());
        assert_eq!(out, br#"{"key":"h7","ttl_ms":4500}"#);
    }

    #[test]
    fn key_indexes_round_trip_and_foreign_keys_are_not_ours() {
        let mut out = Vec::new();
        write_key(&mut out, "soak-", 123_456);
        assert_eq!(
            key_index(std::str::from_utf8(&out).unwrap(), "soak-"),
            Some(123_456)
        );
        assert_eq!(key_index("soak-", "soak-"), None);
        assert_eq!(key_index("soak-12x", "soak-"), None);
        assert_eq!(key_index("other-1", "soak-"), None);
    }

    #[test]
    fn ttls_and_prefixes_are_checked() {
        assert!(Ttl::parse("0s").is_err());
        assert!(Ttl::parse("1500us").is_err());
        assert!(check_prefix("a\"b").is_err());
        assert!(check_prefix("svc:a/b-1_").is_ok());
    }

    #[test]
    fn failed_items_are_counted_in_both_response_forms() {
        assert_eq!(
            failed_items(br#"{"accepted":998,"failed":2,"errors":[]}"#, 1000),
            2
        );
        let full = br#"{"results":[{"key":"a","created":true},{"error":{"code":"invalid_key","message":"m"}}]}"#;
        assert_eq!(failed_items(full, 2), 1);
        let compact = br#"{"accepted":1,"failed":1,"errors":[{"index":1,"error":{"code":"c","message":"m"}}]}"#;
        assert_eq!(failed_positions(compact).unwrap(), vec![1]);
        assert!(failed_positions(full).is_err());
    }
}

/// How a load picks the key of each heartbeat among `0..keys`.
#[derive(Debug, Default)]
pub enum KeyOrder {
    /// At random (each connection with its own seeded generator).
    #[default]
    Random,
    /// In order, cycled, shared by every connection: at R heartbeats/s each of K keys is
    /// renewed every K/R seconds exactly.
    Sequential(std::sync::atomic::AtomicU64),
}

impl KeyOrder {
    pub fn sequential() -> Self {
        Self::Sequential(std::sync::atomic::AtomicU64::new(0))
    }

    pub fn next(&self, rng: &mut fastrand::Rng, keys: u64) -> u64 {
        match self {
            Self::Random => rng.u64(0..keys),
            Self::Sequential(next) => {
                next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % keys
            }
        }
    }
}
