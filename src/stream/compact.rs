//! The ring's form of an event: every field in one allocation of plain bytes, a third of what
//! the [`Event`] struct with its key costs, and nothing else. The stream needs an event for two
//! things only, filtering (kind, key, service) and, once, its SSE frame; both read these bytes.
//!
//! Layout (varints are LEB128; `±` marks a zigzag varint of a difference):
//!
//! ```text
//! kind u8 | flags u8 | key_len varint | key | [service_len u8 | service] | [meta_len varint | meta]
//! | occurred_at varint | ±(occurred_at - registered_at) | ±(occurred_at - last_heartbeat_at)
//! | [ttl_ms varint] | [±(deadline - occurred_at)] | lateness_ms varint
//! ```
//!
//! Bracketed parts are there when their flag is set. Key and service come first, so a filter
//! reads them without decoding the rest. The times of an event are within a TTL of each other,
//! so differences take 1-5 bytes where absolute Unix milliseconds take 6.
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

const KINDS: [EventKind; 5] = [
    EventKind::Registered,
    EventKind::Expired,
    EventKind::Deleted,
    EventKind::GuardEngaged,
    EventKind::GuardReleased,
];

/// One event, encoded as the module documentation says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactEvent {
    /// The encoded fields; the first two bytes are the kind and the flags.
    bytes: Box<[u8]>,
}

impl CompactEvent {
    pub fn encode(event: &Event) -> Self {
        let key = event.key.as_str().as_bytes();
        let service = event.service.as_ref().map(|s| s.as_str().as_bytes());
        let meta = event.meta.as_ref().map(|meta| meta.raw().get().as_bytes());
        let mut flags = 0;
        for (set, flag) in [
            (service.is_some(), HAS_SERVICE),
            (meta.is_some(), HAS_META),
            (event.ttl_ms.is_some(), HAS_TTL),
            (event.deadline_ms.is_some(), HAS_DEADLINE),
            (event.restored, RESTORED),
        ] {
            if set {
                flags |= flag;
            }
        }
        let kind = KINDS
            .iter()
            .position(|kind| *kind == event.kind)
            .expect("KINDS lists every EventKind") as u8;
        let mut out = Vec::with_capacity(
            2 + 2
                + key.len()
                + service.map_or(0, |s| 1 + s.len())
                + meta.map_or(0, |m| 3 + m.len())
                + 24,
        );
        out.extend_from_slice(&[kind, flags]);
        put_varint(&mut out, key.len() as u64);
        out.extend_from_slice(key);
        if let Some(service) = service {
            // Service names are at most 128 bytes (`ServiceName`).
            out.push(service.len() as u8);
            out.extend_from_slice(service);
        }
        if let Some(meta) = meta {
            put_varint(&mut out, meta.len() as u64);
            out.extend_from_slice(meta);
        }
        let at = event.occurred_at_ms;
        put_varint(&mut out, at);
        put_signed(&mut out, at, event.registered_at_ms);
        put_signed(&mut out, at, event.last_heartbeat_at_ms);
        if let Some(ttl_ms) = event.ttl_ms {
            put_varint(&mut out, ttl_ms);
        }
        if let Some(deadline) = event.deadline_ms {
            put_signed(&mut out, at, deadline);
        }
        put_varint(&mut out, event.lateness_ms);
        Self {
            bytes: out.into_boxed_slice(),
        }
    }

    pub fn kind(&self) -> EventKind {
        KINDS[usize::from(self.bytes[0])]
    }

    /// The key.
    pub fn key(&self) -> &str {
        self.reader().key()
    }

    /// The key's service, if it had one.
    pub fn service(&self) -> Option<&str> {
        let mut reader = self.reader();
        reader.key();
        reader.service()
    }

    /// Every field, borrowed from the bytes (to serialize the event).
    pub fn data(&self) -> EventData<'_> {
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
        let occurred_at_ms = reader.varint();
        let registered_at_ms = reader.signed(occurred_at_ms);
        let last_heartbeat_at_ms = reader.signed(occurred_at_ms);
        let ttl_ms = (flags & HAS_TTL != 0).then(|| reader.varint());
        let deadline_ms = (flags & HAS_DEADLINE != 0).then(|| reader.signed(occurred_at_ms));
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

    /// The bytes it holds on the heap.
    pub fn heap_bytes(&self) -> usize {
        self.bytes.len()
    }

    fn reader(&self) -> Reader<'_> {
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
    let difference = base.wrapping_sub(value) as i64;
    put_varint(out, ((difference << 1) ^ (difference >> 63)) as u64);
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::types::{Key, Meta, ServiceName};

    fn check(event: &Event) {
        let compact = CompactEvent::encode(event);
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
            });
        }
    }

    #[test]
    fn a_fleet_registration_takes_under_sixty_bytes() {
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
        };
        check(&event);
        // kind and flags 2, key 1 + 27, the time 6, two zero differences 1 + 1, TTL 4, the
        // deadline's difference 4, lateness 1.
        assert_eq!(CompactEvent::encode(&event).heap_bytes(), 47);
    }
}
