//! A key as its entry holds it, with the key's metadata: 32 bytes, so that a key of up to
//! [`MID_MAX`] bytes lives in the entry itself.
//!
//! Why: [`Key`] keeps 24 bytes inline and allocates beyond them, and fleets name their
//! instances in 25 to 30 bytes often enough (`svc-NNN/instance-NNNNNNNNNN` is 27): each such key
//! cost a 32-byte allocation beside its 64-byte entry, and a heartbeat one more dependent cache
//! miss to compare it. The entry's metadata pointer is spent on 6 more key bytes instead: the
//! metadata, which most keys do not carry, moves out with its key into one allocation.
//!
//! The forms (invariant: a key has the first form that fits it, which [`EntryKey::new`] and
//! [`EntryKey::set_meta`] choose):
//! - `WithMeta`: a key with metadata, both boxed;
//! - `Mid`: a key of 25 to [`MID_MAX`] bytes, its bytes inline;
//! - `Plain`: any other key (inline up to 24 bytes, allocated beyond 30).
//!
//! A `Plain` key is handed out as it is; a `Mid` key is made a [`Key`] again when one is
//! needed (an event, a listing page), which allocates as cloning it would have. The expired
//! log keeps its records' keys in this form too, without their metadata (`without_meta`), so
//! an expiry moves its key from the entry to its record.

use std::fmt;

use crate::types::{Key, Meta};

/// The longest key kept inline in the entry, in bytes.
const MID_MAX: usize = 30;

/// The longest key [`Key`] keeps without allocating.
const KEY_INLINE: usize = 24;

/// A key and its metadata, as an entry holds them (see the module's documentation).
pub(super) enum EntryKey {
    Plain(Key),
    Mid { len: u8, bytes: [u8; MID_MAX] },
    WithMeta(Box<(Key, Meta)>),
}

impl EntryKey {
    /// The form for `key` with `meta`: its bytes copied inline, or a clone of it.
    pub fn new(key: &Key, meta: Option<Meta>) -> Self {
        let raw = key.as_bytes();
        match meta {
            Some(meta) => Self::WithMeta(Box::new((key.clone(), meta))),
            None if raw.len() > KEY_INLINE && raw.len() <= MID_MAX => {
                let mut bytes = [0; MID_MAX];
                bytes[..raw.len()].copy_from_slice(raw);
                Self::Mid {
                    len: raw.len() as u8,
                    bytes,
                }
            }
            None => Self::Plain(key.clone()),
        }
    }

    /// The form for `key` with `meta`, taking `key` where the form keeps a [`Key`].
    pub fn from_owned(key: Key, meta: Option<Meta>) -> Self {
        match meta {
            Some(meta) => Self::WithMeta(Box::new((key, meta))),
            None if key.as_bytes().len() <= KEY_INLINE || key.as_bytes().len() > MID_MAX => {
                Self::Plain(key)
            }
            None => Self::new(&key, None),
        }
    }

    /// The key's bytes (UTF-8), read in place.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Plain(key) => key.as_bytes(),
            Self::Mid { len, bytes } => &bytes[..usize::from(*len)],
            Self::WithMeta(boxed) => boxed.0.as_bytes(),
        }
    }

    /// Whether this is `key`.
    pub fn is(&self, key: &Key) -> bool {
        self.as_bytes() == key.as_bytes()
    }

    /// The key, as a [`Key`] of its own.
    pub fn to_key(&self) -> Key {
        match self {
            Self::Plain(key) => key.clone(),
            Self::Mid { .. } => self.rebuilt(),
            Self::WithMeta(boxed) => boxed.0.clone(),
        }
    }

    /// The key without its metadata, and the metadata.
    pub fn without_meta(self) -> (Self, Option<Meta>) {
        match self {
            Self::WithMeta(boxed) => {
                let (key, meta) = *boxed;
                (Self::from_owned(key, None), Some(meta))
            }
            other => (other, None),
        }
    }

    pub fn meta(&self) -> Option<&Meta> {
        match self {
            Self::WithMeta(boxed) => Some(&boxed.1),
            Self::Plain(_) | Self::Mid { .. } => None,
        }
    }

    /// Replaces the metadata (`None` removes it), changing the form if it must.
    pub fn set_meta(&mut self, meta: Option<Meta>) {
        match (self, meta) {
            (Self::WithMeta(boxed), Some(meta)) => boxed.1 = meta,
            (Self::Plain(_) | Self::Mid { .. }, None) => {}
            (this, meta) => {
                let key = this.to_key();
                *this = Self::from_owned(key, meta);
            }
        }
    }

    /// A `Mid` key's bytes as a [`Key`]: they were copied from one, so they are one.
    fn rebuilt(&self) -> Key {
        Key::from_copied(self.as_bytes()).expect("an entry's key bytes were copied from a key")
    }

    /// Checks that the key has the first form that fits it (see the module's documentation).
    pub fn check_form(&self) {
        let len = self.as_bytes().len();
        let mid = len > KEY_INLINE && len <= MID_MAX;
        match self {
            Self::Plain(_) => assert!(!mid, "{self}: a key of {len} bytes allocated"),
            Self::Mid { .. } => assert!(mid, "{self}: a key of {len} bytes in the middle form"),
            Self::WithMeta(_) => {}
        }
    }
}

impl fmt::Display for EntryKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.as_bytes()))
    }
}

impl fmt::Debug for EntryKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&String::from_utf8_lossy(self.as_bytes()), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(text: &str) -> Meta {
        Meta::from_text(text).unwrap()
    }

    #[test]
    fn an_entry_key_is_32_bytes() {
        assert_eq!(std::mem::size_of::<EntryKey>(), 32);
    }

    #[test]
    fn each_length_gets_its_form_and_reads_back_the_same() {
        for len in 1..=40 {
            let key = Key::new(&"k".repeat(len)).unwrap();
            for entry_key in [
                EntryKey::new(&key, None),
                EntryKey::from_owned(key.clone(), None),
            ] {
                entry_key.check_form();
                let mid = (25..=MID_MAX).contains(&len);
                assert_eq!(
                    matches!(entry_key, EntryKey::Mid { .. }),
                    mid,
                    "{len} bytes"
                );
                assert!(entry_key.is(&key));
                assert_eq!(entry_key.to_key(), key);
                assert_eq!(entry_key.as_bytes(), key.as_bytes());
                let (without, meta) = entry_key.without_meta();
                assert!(without.is(&key) && meta.is_none());
            }
        }
    }

    #[test]
    fn a_multibyte_key_of_the_middle_length_reads_back_whole() {
        let key = Key::new("inst-é-ü-ñ-日本語-01").unwrap();
        assert!((25..=MID_MAX).contains(&key.as_bytes().len()));
        let entry_key = EntryKey::new(&key, None);
        assert!(matches!(entry_key, EntryKey::Mid { .. }));
        assert_eq!(entry_key.to_key(), key);
        assert_eq!(entry_key.to_string(), key.as_str());
    }

    #[test]
    fn metadata_moves_the_key_out_and_back() {
        let key = Key::new("svc-042/instance-0000000042").unwrap();
        let mut entry_key = EntryKey::new(&key, None);
        assert!(entry_key.meta().is_none());
        entry_key.set_meta(Some(meta(r#"{"zone":"a"}"#)));
        entry_key.check_form();
        assert_eq!(
            entry_key.meta().map(|meta| meta.raw().get()),
            Some(r#"{"zone":"a"}"#)
        );
        assert!(entry_key.is(&key));
        entry_key.set_meta(Some(meta(r#"{"zone":"b"}"#)));
        assert_eq!(
            entry_key.meta().map(|meta| meta.raw().get()),
            Some(r#"{"zone":"b"}"#)
        );
        let (back, kept) = EntryKey::from_owned(key.clone(), Some(meta("{}"))).without_meta();
        back.check_form();
        assert!(matches!(back, EntryKey::Mid { .. }) && back.is(&key));
        assert_eq!(kept.as_ref().map(|meta| meta.raw().get()), Some("{}"));
        entry_key.set_meta(None);
        entry_key.check_form();
        assert!(matches!(entry_key, EntryKey::Mid { .. }));
        assert!(entry_key.meta().is_none());
        assert_eq!(entry_key.to_key(), key);
    }

    #[test]
    fn a_key_leaves_its_metadata_in_the_form_it_has_without() {
        for text in ["short", "svc-042/instance-0000000042", &"long".repeat(10)] {
            let key = Key::new(text).unwrap();
            let (bare, meta) = EntryKey::new(&key, Some(meta(r#"{"zone":"a"}"#))).without_meta();
            bare.check_form();
            assert!(bare.meta().is_none() && bare.is(&key), "{text}");
            assert_eq!(
                meta.as_ref().map(|meta| meta.raw().get()),
                Some(r#"{"zone":"a"}"#)
            );
            let (same, none) = EntryKey::new(&key, None).without_meta();
            assert!(same.is(&key) && none.is_none(), "{text}");
        }
    }

    #[test]
    fn another_key_is_not_this_one() {
        let key = Key::new("svc-042/instance-0000000042").unwrap();
        let entry_key = EntryKey::new(&key, None);
        assert!(!entry_key.is(&Key::new("svc-042/instance-0000000043").unwrap()));
        assert!(!entry_key.is(&Key::new("svc-042/instance-000000004").unwrap()));
    }
}
