//! The records of the persistence log: each one durable change to the registry, encoded in a
//! compact, versioned binary form.
//!
//! Records are *logical* (what happened to a key), never physical (which bytes of which
//! structure changed), and each is complete on its own: replaying the same record twice, or
//! replaying records already reflected in a snapshot, leaves the same state. That is what lets
//! a snapshot be taken while writes go on, and what lets these records become the entries of a
//! replicated (Raft) log later: a follower applies them the way recovery does.
//!
//! What is *not* a record: a renewal that only moves a key's deadline (same TTL, same service,
//! same metadata). Renewals stay in memory, as etcd keeps lease keep-alives off its log; the
//! restart rule (see `persist`'s documentation) is what makes that safe.
//!
//! Encoding: a tag byte, then the fields in order; integers are LEB128 varints, text is a
//! varint length and UTF-8 bytes, an optional field is a 0/1 byte before it. Decoding goes
//! through the same constructors as the API (`Key::new`, `ServiceName::new`, `Meta::from_text`),
//! so a record can never bring in a value a client could not have sent. The framing (length,
//! checksum, format version) is the log's (`persist::log`).

use crate::events::{Event, EventKind};
use crate::types::{InvalidInput, Key, Meta, ServiceName};

/// How a key's deadline is kept across a restart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// No TTL (after PERSIST).
    Never,
    /// A TTL from a heartbeat or a relative EXPIRE: after a restart the key gets `restart +
    /// ttl_ms`, since clients could not renew it while the registry was down.
    Relative { ttl_ms: u64 },
    /// An instant from PEXPIREAT: it stays, and if it passed during the downtime the key
    /// expires at start-up.
    Absolute { at_unix_ms: u64 },
}

/// Everything durable about an alive key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyState {
    pub key: Key,
    pub service: Option<ServiceName>,
    pub meta: Option<Meta>,
    pub expiry: Expiry,
    pub registered_unix_ms: u64,
    /// The last heartbeat that wrote a record (renewals that changed nothing else write none).
    pub last_heartbeat_unix_ms: u64,
}

/// A key on the expired list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpiredState {
    pub key: Key,
    pub service: Option<ServiceName>,
    pub meta: Option<Meta>,
    pub last_heartbeat_unix_ms: u64,
    pub expired_unix_ms: u64,
}

/// One durable change. See the module documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// A key's durable state, whole: written when a key is created and whenever anything but
    /// its deadline changes (service, metadata, TTL, an EXPIRE or a PERSIST). Replaces what
    /// was known of the key.
    Upsert(KeyState),
    /// A client deleted the key (DEL, or an EXPIRE into the past).
    Deleted { key: Key, at_unix_ms: u64 },
    /// The key expired: it leaves the alive keys and joins the expired list, with the service
    /// and metadata of its last state.
    Expired {
        key: Key,
        at_unix_ms: u64,
        last_heartbeat_unix_ms: u64,
    },
    /// A key on the expired list, whole (the form a snapshot writes).
    ExpiredEntry(ExpiredState),
    /// An event held for a webhook URL (the URL with any password hidden), with the id every
    /// attempt carries and the attempts made so far.
    WebhookQueued(WebhookMessage),
    /// The event left that URL's queue: delivered, or filed as a dead letter (the next
    /// record then says so).
    WebhookDone { url: String, id: String },
    /// A dead letter: an event that could not be delivered to a URL. `letter_id` is the id
    /// the API shows for it, when it must survive the record (a cluster numbers a letter by
    /// the log place of the report that filed it, the same on every member); `None` (a single
    /// node's log) numbers it again at recovery.
    DeadLetter {
        letter_id: Option<u64>,
        message: WebhookMessage,
        last_error: String,
        failed_at_unix_ms: u64,
    },
    /// The dead letter of message `id` was re-sent (a `WebhookQueued` follows).
    DeadLetterTaken { id: String },
}

/// An event on its way to one webhook URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookMessage {
    pub url: String,
    pub id: String,
    pub attempts: u32,
    pub event: Event,
}

/// A record that cannot be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("the record ends early")]
    Truncated,
    #[error("unknown record tag {0}")]
    UnknownTag(u8),
    #[error("a number is longer than 64 bits")]
    Overflow,
    #[error("text is not UTF-8")]
    NotUtf8,
    #[error("{0}")]
    Invalid(#[from] InvalidInput),
    #[error("{0} bytes left over after the record")]
    TrailingBytes(usize),
}

const UPSERT: u8 = 1;
const DELETED: u8 = 2;
const EXPIRED: u8 = 3;
const EXPIRED_ENTRY: u8 = 4;
const WEBHOOK_QUEUED: u8 = 16;
const WEBHOOK_DONE: u8 = 17;
const DEAD_LETTER: u8 = 18;
const DEAD_LETTER_TAKEN: u8 = 19;
/// A dead letter with its id (`DEAD_LETTER` has none: logs written before ids were kept).
const DEAD_LETTER_NUMBERED: u8 = 20;

const EXPIRY_NEVER: u8 = 0;
const EXPIRY_RELATIVE: u8 = 1;
const EXPIRY_ABSOLUTE: u8 = 2;

impl Record {
    /// Appends the record's encoding to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Self::Upsert(state) => {
                out.push(UPSERT);
                put_text(out, state.key.as_str());
                put_service(out, state.service.as_ref());
                put_meta(out, state.meta.as_ref());
                match state.expiry {
                    Expiry::Never => out.push(EXPIRY_NEVER),
                    Expiry::Relative { ttl_ms } => {
                        out.push(EXPIRY_RELATIVE);
                        put_varint(out, ttl_ms);
                    }
                    Expiry::Absolute { at_unix_ms } => {
                        out.push(EXPIRY_ABSOLUTE);
                        put_varint(out, at_unix_ms);
                    }
                }
                put_varint(out, state.registered_unix_ms);
                put_varint(out, state.last_heartbeat_unix_ms);
            }
            Self::Deleted { key, at_unix_ms } => {
                out.push(DELETED);
                put_text(out, key.as_str());
                put_varint(out, *at_unix_ms);
            }
            Self::Expired {
                key,
                at_unix_ms,
                last_heartbeat_unix_ms,
            } => {
                out.push(EXPIRED);
                put_text(out, key.as_str());
                put_varint(out, *at_unix_ms);
                put_varint(out, *last_heartbeat_unix_ms);
            }
            Self::ExpiredEntry(state) => {
                out.push(EXPIRED_ENTRY);
                put_text(out, state.key.as_str());
                put_service(out, state.service.as_ref());
                put_meta(out, state.meta.as_ref());
                put_varint(out, state.last_heartbeat_unix_ms);
                put_varint(out, state.expired_unix_ms);
            }
            Self::WebhookQueued(message) => {
                out.push(WEBHOOK_QUEUED);
                put_message(out, message);
            }
            Self::WebhookDone { url, id } => {
                out.push(WEBHOOK_DONE);
                put_text(out, url);
                put_text(out, id);
            }
            Self::DeadLetter {
                letter_id,
                message,
                last_error,
                failed_at_unix_ms,
            } => {
                match letter_id {
                    Some(id) => {
                        out.push(DEAD_LETTER_NUMBERED);
                        put_varint(out, *id);
                    }
                    None => out.push(DEAD_LETTER),
                }
                put_message(out, message);
                put_text(out, last_error);
                put_varint(out, *failed_at_unix_ms);
            }
            Self::DeadLetterTaken { id } => {
                out.push(DEAD_LETTER_TAKEN);
                put_text(out, id);
            }
        }
    }

    /// Reads one record that fills `bytes` exactly.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut reader = Reader(bytes);
        let record = match reader.byte()? {
            UPSERT => Self::Upsert(KeyState {
                key: reader.key()?,
                service: reader.service()?,
                meta: reader.meta()?,
                expiry: match reader.byte()? {
                    EXPIRY_NEVER => Expiry::Never,
                    EXPIRY_RELATIVE => Expiry::Relative {
                        ttl_ms: reader.varint()?,
                    },
                    EXPIRY_ABSOLUTE => Expiry::Absolute {
                        at_unix_ms: reader.varint()?,
                    },
                    other => return Err(DecodeError::UnknownTag(other)),
                },
                registered_unix_ms: reader.varint()?,
                last_heartbeat_unix_ms: reader.varint()?,
            }),
            DELETED => Self::Deleted {
                key: reader.key()?,
                at_unix_ms: reader.varint()?,
            },
            EXPIRED => Self::Expired {
                key: reader.key()?,
                at_unix_ms: reader.varint()?,
                last_heartbeat_unix_ms: reader.varint()?,
            },
            EXPIRED_ENTRY => Self::ExpiredEntry(ExpiredState {
                key: reader.key()?,
                service: reader.service()?,
                meta: reader.meta()?,
                last_heartbeat_unix_ms: reader.varint()?,
                expired_unix_ms: reader.varint()?,
            }),
            WEBHOOK_QUEUED => Self::WebhookQueued(reader.message()?),
            WEBHOOK_DONE => Self::WebhookDone {
                url: reader.text()?.to_owned(),
                id: reader.text()?.to_owned(),
            },
            DEAD_LETTER => Self::DeadLetter {
                letter_id: None,
                message: reader.message()?,
                last_error: reader.text()?.to_owned(),
                failed_at_unix_ms: reader.varint()?,
            },
            DEAD_LETTER_NUMBERED => Self::DeadLetter {
                letter_id: Some(reader.varint()?),
                message: reader.message()?,
                last_error: reader.text()?.to_owned(),
                failed_at_unix_ms: reader.varint()?,
            },
            DEAD_LETTER_TAKEN => Self::DeadLetterTaken {
                id: reader.text()?.to_owned(),
            },
            other => return Err(DecodeError::UnknownTag(other)),
        };
        match reader.0.len() {
            0 => Ok(record),
            left => Err(DecodeError::TrailingBytes(left)),
        }
    }

    /// About how many bytes [`Record::encode`] writes, without encoding: its variable parts
    /// (key, service, metadata) and a bound on the rest (a tag, varint times and lengths, 24
    /// bytes at most for a key's record). A webhook record counts its event as 256 bytes.
    pub fn approx_len(&self) -> usize {
        let state = |key: &Key, service: &Option<ServiceName>, meta: &Option<Meta>| {
            24 + key.as_str().len()
                + service.as_ref().map_or(0, |service| service.as_str().len())
                + meta.as_ref().map_or(0, |meta| meta.raw().get().len())
        };
        match self {
            Self::Upsert(key) => state(&key.key, &key.service, &key.meta),
            Self::ExpiredEntry(key) => state(&key.key, &key.service, &key.meta),
            Self::Deleted { key, .. } | Self::Expired { key, .. } => 16 + key.as_str().len(),
            Self::WebhookQueued(_) | Self::DeadLetter { .. } => 256,
            Self::WebhookDone { url, id } => 8 + url.len() + id.len(),
            Self::DeadLetterTaken { id } => 8 + id.len(),
        }
    }

    /// Whether the record is about webhook delivery (the notifier's), not the keys.
    pub fn is_webhook(&self) -> bool {
        matches!(
            self,
            Self::WebhookQueued(_)
                | Self::WebhookDone { .. }
                | Self::DeadLetter { .. }
                | Self::DeadLetterTaken { .. }
        )
    }
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_text(out: &mut Vec<u8>, text: &str) {
    put_varint(out, text.len() as u64);
    out.extend_from_slice(text.as_bytes());
}

fn put_service(out: &mut Vec<u8>, service: Option<&ServiceName>) {
    match service {
        None => out.push(0),
        Some(service) => {
            out.push(1);
            put_text(out, service.as_str());
        }
    }
}

fn put_meta(out: &mut Vec<u8>, meta: Option<&Meta>) {
    match meta {
        None => out.push(0),
        Some(meta) => {
            out.push(1);
            put_text(out, meta.raw().get());
        }
    }
}

fn put_message(out: &mut Vec<u8>, message: &WebhookMessage) {
    put_text(out, &message.url);
    put_text(out, &message.id);
    put_varint(out, u64::from(message.attempts));
    let event = &message.event;
    out.push(match event.kind {
        EventKind::Registered => 0,
        EventKind::Expired => 1,
        EventKind::Deleted => 2,
        EventKind::GuardEngaged => 3,
        EventKind::GuardReleased => 4,
    });
    put_text(out, event.key.as_str());
    put_service(out, event.service.as_ref());
    put_meta(out, event.meta.as_ref());
    put_optional(out, event.ttl_ms);
    put_varint(out, event.registered_at_ms);
    put_varint(out, event.last_heartbeat_at_ms);
    put_optional(out, event.deadline_ms);
    put_varint(out, event.occurred_at_ms);
    put_varint(out, event.lateness_ms);
    out.push(u8::from(event.restored));
}

fn put_optional(out: &mut Vec<u8>, value: Option<u64>) {
    match value {
        None => out.push(0),
        Some(value) => {
            out.push(1);
            put_varint(out, value);
        }
    }
}

/// The unread rest of a record.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Result<u8, DecodeError> {
        let (&first, rest) = self.0.split_first().ok_or(DecodeError::Truncated)?;
        self.0 = rest;
        Ok(first)
    }

    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.byte()?;
            let bits = u64::from(byte & 0x7f);
            if shift == 63 && bits > 1 {
                return Err(DecodeError::Overflow);
            }
            value |= bits << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(DecodeError::Overflow)
    }

    fn text(&mut self) -> Result<&'a str, DecodeError> {
        let len = usize::try_from(self.varint()?).map_err(|_| DecodeError::Truncated)?;
        if len > self.0.len() {
            return Err(DecodeError::Truncated);
        }
        let (text, rest) = self.0.split_at(len);
        self.0 = rest;
        std::str::from_utf8(text).map_err(|_| DecodeError::NotUtf8)
    }

    fn present(&mut self) -> Result<bool, DecodeError> {
        match self.byte()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(DecodeError::UnknownTag(other)),
        }
    }

    fn optional(&mut self) -> Result<Option<u64>, DecodeError> {
        if !self.present()? {
            return Ok(None);
        }
        Ok(Some(self.varint()?))
    }

    fn message(&mut self) -> Result<WebhookMessage, DecodeError> {
        let url = self.text()?.to_owned();
        let id = self.text()?.to_owned();
        let attempts = u32::try_from(self.varint()?).map_err(|_| DecodeError::Overflow)?;
        let kind = match self.byte()? {
            0 => EventKind::Registered,
            1 => EventKind::Expired,
            2 => EventKind::Deleted,
            3 => EventKind::GuardEngaged,
            4 => EventKind::GuardReleased,
            other => return Err(DecodeError::UnknownTag(other)),
        };
        let event = Event {
            kind,
            key: self.key()?,
            service: self.service()?,
            meta: self.meta()?,
            ttl_ms: self.optional()?,
            registered_at_ms: self.varint()?,
            last_heartbeat_at_ms: self.varint()?,
            deadline_ms: self.optional()?,
            occurred_at_ms: self.varint()?,
            lateness_ms: self.varint()?,
            restored: self.present()?,
            log_id: None,
        };
        Ok(WebhookMessage {
            url,
            id,
            attempts,
            event,
        })
    }

    fn key(&mut self) -> Result<Key, DecodeError> {
        Ok(Key::new(self.text()?)?)
    }

    fn service(&mut self) -> Result<Option<ServiceName>, DecodeError> {
        if !self.present()? {
            return Ok(None);
        }
        Ok(Some(ServiceName::new(self.text()?)?))
    }

    fn meta(&mut self) -> Result<Option<Meta>, DecodeError> {
        if !self.present()? {
            return Ok(None);
        }
        Ok(Some(Meta::from_text(self.text()?)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key() -> impl Strategy<Value = Key> {
        "[a-z0-9/:._-]{1,40}".prop_map(|raw| Key::new(&raw).unwrap())
    }

    fn service() -> impl Strategy<Value = Option<ServiceName>> {
        proptest::option::of("[a-z0-9._:-]{1,20}".prop_map(|raw| ServiceName::new(&raw).unwrap()))
    }

    fn meta() -> impl Strategy<Value = Option<Meta>> {
        proptest::option::of(
            ("[a-z]{1,8}", any::<i64>())
                .prop_map(|(name, n)| Meta::from_value(&serde_json::json!({ name: n })).unwrap()),
        )
    }

    fn expiry() -> impl Strategy<Value = Expiry> {
        prop_oneof![
            Just(Expiry::Never),
            any::<u64>().prop_map(|ttl_ms| Expiry::Relative { ttl_ms }),
            any::<u64>().prop_map(|at_unix_ms| Expiry::Absolute { at_unix_ms }),
        ]
    }

    fn record() -> impl Strategy<Value = Record> {
        prop_oneof![
            (
                key(),
                service(),
                meta(),
                expiry(),
                any::<u64>(),
                any::<u64>()
            )
                .prop_map(|(key, service, meta, expiry, registered, last)| {
                    Record::Upsert(KeyState {
                        key,
                        service,
                        meta,
                        expiry,
                        registered_unix_ms: registered,
                        last_heartbeat_unix_ms: last,
                    })
                }),
            (key(), any::<u64>()).prop_map(|(key, at_unix_ms)| Record::Deleted { key, at_unix_ms }),
            (key(), any::<u64>(), any::<u64>()).prop_map(|(key, at, last)| Record::Expired {
                key,
                at_unix_ms: at,
                last_heartbeat_unix_ms: last,
            }),
            (key(), service(), meta(), any::<u64>(), any::<u64>()).prop_map(
                |(key, service, meta, last, at)| Record::ExpiredEntry(ExpiredState {
                    key,
                    service,
                    meta,
                    last_heartbeat_unix_ms: last,
                    expired_unix_ms: at,
                })
            ),
            (
                proptest::option::of(any::<u64>()),
                message(),
                "[ -~]{0,40}",
                any::<u64>()
            )
                .prop_map(|(letter_id, message, last_error, at)| {
                    Record::DeadLetter {
                        letter_id,
                        message,
                        last_error,
                        failed_at_unix_ms: at,
                    }
                }),
            message().prop_map(Record::WebhookQueued),
            ("[a-z:/.0-9]{1,30}", "msg_[0-9a-f]{22}")
                .prop_map(|(url, id)| Record::WebhookDone { url, id }),
            "msg_[0-9a-f]{22}".prop_map(|id| Record::DeadLetterTaken { id }),
        ]
    }

    fn message() -> impl Strategy<Value = WebhookMessage> {
        let kind = prop_oneof![
            Just(EventKind::Registered),
            Just(EventKind::Expired),
            Just(EventKind::Deleted),
            Just(EventKind::GuardEngaged),
            Just(EventKind::GuardReleased)
        ];
        let times = (
            any::<u64>(),
            any::<u64>(),
            proptest::option::of(any::<u64>()),
            any::<u64>(),
            any::<u64>(),
        );
        (
            ("[a-z:/.0-9]{1,30}", "msg_[0-9a-f]{22}", any::<u32>()),
            (
                kind,
                key(),
                service(),
                meta(),
                proptest::option::of(any::<u64>()),
                any::<bool>(),
            ),
            times,
        )
            .prop_map(
                |(
                    (url, id, attempts),
                    (kind, key, service, meta, ttl_ms, restored),
                    (registered, last, deadline, occurred, lateness),
                )| {
                    WebhookMessage {
                        url,
                        id,
                        attempts,
                        event: Event {
                            kind,
                            key,
                            service,
                            meta,
                            ttl_ms,
                            registered_at_ms: registered,
                            last_heartbeat_at_ms: last,
                            deadline_ms: deadline,
                            occurred_at_ms: occurred,
                            lateness_ms: lateness,
                            restored,
                            log_id: None,
                        },
                    }
                },
            )
    }

    proptest! {
        /// The network sizes payloads by it: a key's record within a factor of two of its
        /// encoding, give or take a record's fixed part (the webhook records, which never
        /// travel in entries, are counted flat).
        #[test]
        fn a_records_approximate_length_is_close_to_its_encoding(record in record()) {
            let mut bytes = Vec::new();
            record.encode(&mut bytes);
            if !record.is_webhook() {
                let (approx, real) = (record.approx_len(), bytes.len());
                // Times are varints: a record of small numbers is shorter than its bound.
                prop_assert!(approx <= 2 * real + 24 && real <= 2 * approx, "{approx} for {real}");
            }
        }

        #[test]
        fn every_record_reads_back_as_written(record in record()) {
            let mut bytes = Vec::new();
            record.encode(&mut bytes);
            prop_assert_eq!(Record::decode(&bytes), Ok(record));
        }

        /// A record cut short, or with bytes after it, is an error, never a different record.
        #[test]
        fn a_cut_or_padded_record_is_refused(record in record(), cut in any::<prop::sample::Index>()) {
            let mut bytes = Vec::new();
            record.encode(&mut bytes);
            let cut = cut.index(bytes.len());
            prop_assert!(Record::decode(&bytes[..cut]).is_err());
            bytes.push(0);
            prop_assert_eq!(Record::decode(&bytes), Err(DecodeError::TrailingBytes(1)));
        }

        #[test]
        fn arbitrary_bytes_never_panic_the_decoder(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = Record::decode(&bytes);
        }
    }

    #[test]
    fn a_record_cannot_smuggle_in_what_the_api_refuses() {
        let mut bytes = vec![DELETED];
        put_text(&mut bytes, "bad\u{1}key");
        put_varint(&mut bytes, 5);
        assert!(matches!(
            Record::decode(&bytes),
            Err(DecodeError::Invalid(InvalidInput::Key(_)))
        ));
        let mut bytes = vec![UPSERT];
        put_text(&mut bytes, "k");
        bytes.push(0);
        bytes.push(1);
        put_text(&mut bytes, "[1,2]"); // metadata must be an object
        assert!(matches!(
            Record::decode(&bytes),
            Err(DecodeError::Invalid(InvalidInput::Meta(_)))
        ));
    }

    #[test]
    fn varints_take_one_byte_below_128_and_refuse_65_bits() {
        let mut bytes = Vec::new();
        put_varint(&mut bytes, 127);
        assert_eq!(bytes, [127]);
        put_varint(&mut bytes, u64::MAX);
        assert_eq!(bytes.len(), 1 + 10);
        let mut reader = Reader(&bytes[1..]);
        assert_eq!(reader.varint(), Ok(u64::MAX));
        let too_long = [0xff; 10];
        assert_eq!(Reader(&too_long).varint(), Err(DecodeError::Overflow));
    }
}
