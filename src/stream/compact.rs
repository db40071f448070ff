//! The ring's form of an event: every field as plain bytes, a third of what the [`Event`]
//! struct with its key costs, and nothing else. The stream needs an event for two things only,
//! filtering (kind, key, service) and, once, its SSE frame; both read these bytes.
//! [`encode_into`] appends them to a buffer (the ring keeps events back to back in blocks of
//! bytes: `ring`); [`CompactEvent`] reads them where they lie.
//!
//! Layout (varints are LEB128; `±` marks a zigzag varint of a difference):
//!
//! ```text
//! kind u8 | flags u8 | key_len varint | key | [service_len u8 | service] | [meta_len varint | meta]
//! | ±(base - occurred_at) | [±(occurred_at - registered_at) | ±(occurred_at - last_heartbeat_at)]
//! | [ttl varint] | [±(occurred_at [+ ttl_ms] - deadline)] | lateness_ms varint
//! ```
//!
//! Bracketed parts are there when their flag says so. Key and service come first, so a filter
//! reads them without decoding the rest. Times are differences, small either way round: the
//! occurrence from a `base` the reader gives back (the ring's block keeps its first event's
//! time: 1-3 bytes where absolute Unix milliseconds take 6), the others from the occurrence
//! (within a TTL of it). What registrations have in common costs nothing: registration and
//! last heartbeat at the occurrence (one flag), a TTL in whole seconds (3600 in 2 bytes, not
//! 3,600,000 in 4), a deadline one TTL after the occurrence (its difference from
//! occurrence + TTL, 1 byte). A fleet registration takes 36-38 bytes.
//!
//! What it does not do: validate. It is only ever built from an [`Event`] (whose fields the API's
//! constructors made) and read back by this module, within one process.

use serde_json::value::RawValue;

use crate::events::{Event, EventData, EventKind};

const HAS_SERVICE: u8 = 1;
const HAS_META: u8 = 1 << 1;
const HAS_TTL: u8 = 1 << 2;
const HAS_DEADLINE: u8 = 1 << 3;
const RESTORED: u8 = 1 << 4;
/// Registration and last heartbeat are both the occurrence: neither is written.
const TIMES_AT_OCCURRED: u8 = 1 << 5;
/// The deadline is written as its difference from occurrence + TTL (else from the occurrence).
const DEADLINE_FROM_TTL: u8 = 1 << 6;
/// The TTL is written in whole seconds.
const TTL_IN_SECONDS: u8 = 1 << 7;

const KINDS: [EventKind; 5] = [
    EventKind::Registered,
    EventKind::Expired,
    EventKind::Deleted,
    EventKind::GuardEngaged,
    EventKind::GuardReleased,
];

/// One event, encoded as the module documentation says, read where its bytes lie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompactEvent<'a> {
    /// The encoded fields; the first two bytes are the kind and the flags.
    bytes: &'a [u8],
    /// The Unix ms the occurrence was written from.
    base_ms: u64,
}

/// Appends `event`'s compact form to `out`, its occurrence written from `base_ms` (any time:
/// the nearer, the shorter); the bytes appended read back with [`CompactEvent::new`] and the
/// same base.
pub fn encode_into(event: &Event, base_ms: u64, out: &mut Vec<u8>) {
    let key = event.key.as_str().as_bytes();
    let service = event.service.as_ref().map(|s| s.as_str().as_bytes());
    let meta = event.meta.as_ref().map(|meta| meta.raw().get().as_bytes());
    let at = event.occurred_at_ms;
    let times_at_occurred = event.registered_at_ms == at && event.last_heartbeat_at_ms == at;
    let ttl_in_seconds = event.ttl_ms.is_some_and(|ttl_ms| ttl_ms % 1000 == 0);
    // The deadline from occurrence + TTL when that difference is the smaller one.
    let deadline_base = match (event.deadline_ms, event.ttl_ms) {
        (Some(deadline), Some(ttl_ms))
            if zigzag(at.wrapping_add(ttl_ms), deadline) < zigzag(at, deadline) =>
        {
            Some(at.wrapping_add(ttl_ms))
        }
        _ => None,
    };
    let mut flags = 0;
    for (set, flag) in [
        (service.is_some(), HAS_SERVICE),
        (meta.is_some(), HAS_META),
        (event.ttl_ms.is_some(), HAS_TTL),
        (event.deadline_ms.is_some(), HAS_DEADLINE),
        (event.restored, RESTORED),
        (times_at_occurred, TIMES_AT_OCCURRED),
        (deadline_base.is_some(), DEADLINE_FROM_TTL),
        (ttl_in_seconds, TTL_IN_SECONDS),
    ] {
        if set {
            flags |= flag;
        }
    }
    let kind = KINDS
        .iter()
        .position(|kind| *kind == event.kind)
        .expect("KINDS lists every EventKind") as u8;
    out.extend_from_slice(&[kind, flags]);
    put_varint(out, key.len() as u64);
    out.extend_from_slice(key);
    if let Some(service) = service {
        // Service names are at most 128 bytes (`ServiceName`).
        out.push(service.len() as u8);
        out.extend_from_slice(service);
    }
    if let Some(meta) = meta {
        put_varint(out, meta.len() as u64);
        out.extend_from_slice(meta);
    }
    put_signed(out, base_ms, at);
    if !times_at_occurred {
        put_signed(out, at, event.registered_at_ms);
        put_signed(out, at, event.last_heartbeat_at_ms);
    }
    if let Some(ttl_ms) = event.ttl_ms {
        put_varint(
            out,
            if ttl_in_seconds {
                ttl_ms / 1000
            } else {
                ttl_ms
            },
        );
    }
    if let Some(deadline) = event.deadline_ms {
        put_signed(out, deadline_base.unwrap_or(at), deadline);
    }
    put_varint(out, event.lateness_ms);
}

impl<'a> CompactEvent<'a> {
    /// The event whose compact form is `bytes` (exactly what [`encode_into`] appended with
    /// `base_ms`).
    pub fn new(bytes: &'a [u8], base_ms: u64) -> Self {
        debug_assert!(bytes.len() >= 2, "kind and flags at least");
        Self { bytes, base_ms }
    }

    pub fn kind(&self) -> EventKind {
        KINDS[usize::from(self.bytes[0])]
    }

    /// The key.
    pub fn key(&self) -> &'a str {
        self.reader().key()
    }

    /// The key's service, if it had one.
    pub fn service(&self) -> Option<&'a str> {
        let mut reader = self.reader();
        reader.key();
        reader.service()
    }

    /// Every field, borrowed from the bytes (to serialize the event).
    pub fn data(&self) -> EventData<'a> {
        let flags = self.bytes[1];
        let mut reader = self.reader();
        let key = reader.key();
        let service = reader.service();
        let meta = (flags & HAS_META != 0).then(|| {
            let len = reader.varint() as usize;
            let text = as_str(reader.take(len));
            serde_json::from_str::<&RawValue>(text)
                .expect("the metadata was copied from a RawValue")
        });
        let occurred_at_ms = reader.signed(self.base_ms);
        let (registered_at_ms, last_heartbeat_at_ms) = if flags & TIMES_AT_OCCURRED != 0 {
            (occurred_at_ms, occurred_at_ms)
        } else {
            (reader.signed(occurred_at_ms), reader.signed(occurred_at_ms))
        };
        let ttl_ms = (flags & HAS_TTL != 0).then(|| {
            let ttl = reader.varint();
            if flags & TTL_IN_SECONDS != 0 {
                ttl * 1000
            } else {
                ttl
            }
        });
        let deadline_ms = (flags & HAS_DEADLINE != 0).then(|| {
            let base = match ttl_ms {
                Some(ttl_ms) if flags & DEADLINE_FROM_TTL != 0 => {
                    occurred_at_ms.wrapping_add(ttl_ms)
                }
                _ => occurred_at_ms,
            };
            reader.signed(base)
        });
        let lateness_ms = reader.varint();
        EventData {
            kind: self.kind(),
            key,
            service,
            meta,
            ttl_ms,
            registered_at_ms,
            last_heartbeat_at_ms,
            deadline_ms,
            occurred_at_ms,
            lateness_ms,
            restored: flags & RESTORED != 0,
        }
    }

    fn reader(&self) -> Reader<'a> {
        Reader {
            flags: self.bytes[1],
            rest: &self.bytes[2..],
        }
    }
}

/// Reads the fields in order.
struct Reader<'a> {
    flags: u8,
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize) -> &'a [u8] {
        let (head, rest) = self.rest.split_at(len);
        self.rest = rest;
        head
    }

    fn varint(&mut self) -> u64 {
        let mut value = 0;
        for (i, byte) in self.rest.iter().enumerate() {
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                self.rest = &self.rest[i + 1..];
                return value;
            }
        }
        unreachable!("varints are written whole")
    }

    /// `base - difference`, the difference a zigzag varint.
    fn signed(&mut self, base: u64) -> u64 {
        let zigzag = self.varint();
        let difference = (zigzag >> 1) as i64 ^ -((zigzag & 1) as i64);
        base.wrapping_sub(difference as u64)
    }

    fn key(&mut self) -> &'a str {
        let len = self.varint() as usize;
        as_str(self.take(len))
    }

    /// After [`Reader::key`].
    fn service(&mut self) -> Option<&'a str> {
        (self.flags & HAS_SERVICE != 0).then(|| {
            let len = usize::from(self.take(1)[0]);
            as_str(self.take(len))
        })
    }
}

fn as_str(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).expect("encoded from a str")
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Writes `base - value` as a zigzag varint (small either way round).
fn put_signed(out: &mut Vec<u8>, base: u64, value: u64) {
    put_varint(out, zigzag(base, value));
}

/// `base - value` as a zigzag number: the smaller the difference either way, the smaller it is.
fn zigzag(base: u64, value: u64) -> u64 {
    let difference = base.wrapping_sub(value) as i64;
    ((difference << 1) ^ (difference >> 63)) as u64
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::types::{Key, Meta, ServiceName};

    fn encode(event: &Event, base_ms: u64) -> Vec<u8> {
        let mut bytes = Vec::new();
        encode_into(event, base_ms, &mut bytes);
        bytes
    }

    fn check(event: &Event, base_ms: u64) {
        let bytes = encode(event, base_ms);
        let compact = CompactEvent::new(&bytes, base_ms);
        assert_eq!(compact.kind(), event.kind);
        assert_eq!(compact.key(), event.key.as_str());
        assert_eq!(
            compact.service(),
            event.service.as_ref().map(ServiceName::as_str)
        );
        let json = |data: EventData<'_>| serde_json::to_value(data).expect("serializes");
        assert_eq!(json(compact.data()), json(event.data()), "{event:?}");
        let data = compact.data();
        assert_eq!(
            (data.ttl_ms, data.deadline_ms, data.restored),
            (event.ttl_ms, event.deadline_ms, event.restored)
        );
    }

    fn kinds() -> impl Strategy<Value = EventKind> {
        proptest::sample::select(KINDS.to_vec())
    }

    proptest! {
        /// Every field comes back as it went in, whatever the times (earlier, later, far apart).
        #[test]
        fn every_event_reads_back_as_it_was(
            kind in kinds(),
            key in "[a-z/é\"\\\\]{1,40}",
            service in proptest::option::of("[a-z.:-]{1,128}"),
            meta in proptest::option::of(("[a-z\"]{1,8}", any::<i64>())),
            ttl_ms in proptest::option::of(any::<u64>()),
            times in proptest::array::uniform4(any::<u64>()),
            deadline in proptest::option::of(any::<u64>()),
            restored in any::<bool>(),
            base_ms in any::<u64>(),
        ) {
            let meta = meta.map(|(name, n)| {
                Meta::from_value(&serde_json::json!({ name: n })).expect("an object")
            });
            check(&Event {
                kind,
                key: Key::new(&key).expect("a valid key"),
                service: service.map(|s| ServiceName::new(&s).expect("a valid name")),
                meta,
                ttl_ms,
                registered_at_ms: times[0],
                last_heartbeat_at_ms: times[1],
                deadline_ms: deadline,
                occurred_at_ms: times[2],
                lateness_ms: times[3],
                restored,
                log_id: None,
            }, base_ms);
        }

        /// The same, with the times a registration or an expiry has (equal, one TTL apart, a
        /// TTL in seconds or not), where the shortcuts apply.
        #[test]
        fn every_registration_and_expiry_reads_back_as_it_was(
            at in any::<u64>(),
            ttl_ms in prop_oneof![(0u64..100_000).prop_map(|s| s * 1000), any::<u64>()],
            late in 0u64..3,
            earlier in proptest::option::of(any::<u64>()),
            base_ms in any::<u64>(),
        ) {
            check(&Event {
                kind: EventKind::Registered,
                key: Key::new("k").expect("a valid key"),
                service: None,
                meta: None,
                ttl_ms: Some(ttl_ms),
                registered_at_ms: earlier.unwrap_or(at),
                last_heartbeat_at_ms: at,
                deadline_ms: Some(at.wrapping_add(ttl_ms).wrapping_add(late)),
                occurred_at_ms: at,
                lateness_ms: late,
                restored: false,
                log_id: None,
            }, base_ms);
        }
    }

    #[test]
    fn a_fleet_registration_takes_thirty_six_bytes() {
        let at = 1_795_000_000_000;
        let event = Event {
            kind: EventKind::Registered,
            key: Key::new("svc-042/instance-0000012345").unwrap(),
            service: None,
            meta: None,
            ttl_ms: Some(3_600_000),
            registered_at_ms: at,
            last_heartbeat_at_ms: at,
            deadline_ms: Some(at + 3_600_000),
            occurred_at_ms: at,
            lateness_ms: 0,
            restored: false,
            log_id: None,
        };
        let base_ms = at - 2_000;
        check(&event, base_ms);
        // kind and flags 2, key 1 + 27, the time 2 s after the base 2, TTL 3600 s 2, the
        // deadline's difference from occurrence + TTL 1, lateness 1 (47 before the shortcuts:
        // the time 6, two zero differences 2, TTL 4, the deadline's difference 4).
        assert_eq!(encode(&event, base_ms).len(), 36);
        // Appended after other bytes, it reads back where it lies.
        let mut buffer = b"before".to_vec();
        encode_into(&event, base_ms, &mut buffer);
        let compact = CompactEvent::new(&buffer[6..], base_ms);
        assert_eq!(compact.key(), "svc-042/instance-0000012345");
        assert_eq!(compact.data().deadline_ms, Some(at + 3_600_000));
    }
}
