//! The key table: one shard's map from a key to the slot of its entry, behind the shard's own
//! lock. Together with the slot table (`slots`) it is the store: each key is stored once, inline
//! in its entry, and found through this table in one probe.
//!
//! An element is 8 bytes: the high 32 bits of the key's hash (the *tag*) and the slot id. The
//! tag does two jobs. A probe compares tags before it looks at an entry, so a lookup touches
//! only the entry of the key it finds (a different key with the same 32-bit tag in one shard is
//! rare: one in 4 billion per comparison). And the table rehashes from its elements alone when
//! it grows, without reading a single entry: growing a shard of 600k keys moves 5 MB of
//! elements, where a table that had to hash each key again through its entry took a random
//! memory access per key (hundreds of milliseconds under the lock at 10M keys, measured in the
//! first engine pass).
//!
//! Why a table of slot ids beside a slot table, rather than the entries inline in the table:
//! the wheel, the last second's groups, the held list and the heap's back-references all refer
//! to a key by its dense slot id, which never moves while the key lives; entries inline in a
//! hash table move on every resize (64 bytes each, under the lock), and references to them
//! would need a second probe. See ARCHITECTURE.md, "The store".
//!
//! Which bits do what, so that the choices do not follow each other: the registry picks a
//! key's shard from bits 16.. of its hash; the tag is bits 32..64; in the table, the probe
//! position comes from the tag's low bits and hashbrown's 7-bit control byte from its top bits.
//!
//! Invariants (checked by [`KeyTable::check_invariants`], through the shard's check): the
//! table holds exactly one element per live slot, tagged with the tag of that slot's key.

use std::hash::BuildHasher;

use foldhash::fast::RandomState;
use hashbrown::HashTable;

use crate::expiry::wheel::SlotId;
use crate::types::Key;

/// A key's 64-bit hash (the registry's `foldhash`, keyed at start), computed once per
/// operation and used both to pick the shard and to probe the shard's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct KeyHash(pub u64);

impl KeyHash {
    pub fn of(hasher: &RandomState, key: &Key) -> Self {
        Self::of_str(hasher, key.as_str())
    }

    /// The hash of a key not yet validated as a [`Key`] (for `Registry::warm`, which reads a
    /// batch's keys before they are applied): the same hash the key gets once it is one.
    pub fn of_str(hasher: &RandomState, key: &str) -> Self {
        Self(hasher.hash_one(key))
    }

    /// The bits the registry picks a shard from (mask them with the shard count).
    pub fn shard_bits(self) -> usize {
        (self.0 >> 16) as usize
    }

    pub fn tag(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

/// One element: a key's tag and the slot of its entry.
#[derive(Clone, Copy, Debug)]
struct Tagged {
    tag: u32,
    slot: SlotId,
}

/// The hash the table probes with, rebuilt from a tag alone (so a resize reads no entry).
/// Both halves are the tag: hashbrown takes the probe position from the low bits and the
/// control byte from the top seven, which are then the tag's low and top bits.
pub(super) fn table_hash(tag: u32) -> u64 {
    (u64::from(tag) << 32) | u64::from(tag)
}

/// See the module documentation.
#[derive(Debug, Default)]
pub(super) struct KeyTable {
    table: HashTable<Tagged>,
}

impl KeyTable {
    /// The slot of the key with `hash` for which `is_key(slot)` holds (the caller compares the
    /// key stored in that slot's entry).
    pub fn find(&self, hash: KeyHash, mut is_key: impl FnMut(SlotId) -> bool) -> Option<SlotId> {
        let tag = hash.tag();
        self.table
            .find(table_hash(tag), |element| {
                element.tag == tag && is_key(element.slot)
            })
            .map(|element| element.slot)
    }

    /// The slot of the first element tagged like `hash`, found without reading any entry: the
    /// key's own slot but for a tag shared in this shard (one time in billions). A hint only,
    /// for warming the cache before the real lookup ([`Shard::warm`](super::shard::Shard::warm)).
    pub fn first_with_tag(&self, hash: KeyHash) -> Option<SlotId> {
        let tag = hash.tag();
        (self.table)
            .find(table_hash(tag), |element| element.tag == tag)
            .map(|element| element.slot)
    }

    /// Adds the key with `hash`, stored in `slot`; the caller knows it is not in the table.
    pub fn insert(&mut self, hash: KeyHash, slot: SlotId) {
        let tag = hash.tag();
        self.table
            .insert_unique(table_hash(tag), Tagged { tag, slot }, |element| {
                table_hash(element.tag)
            });
    }

    /// Takes out the element of `slot`, whose key has `hash`.
    pub fn remove(&mut self, hash: KeyHash, slot: SlotId) {
        let found = self
            .table
            .find_entry(table_hash(hash.tag()), |element| element.slot == slot);
        match found {
            Ok(element) => {
                element.remove();
            }
            Err(_) => debug_assert!(false, "slot {slot} is not in the key table"),
        }
    }

    /// Takes out the elements of every `(hash, slot)` in `removals`, each in the table. One
    /// tight loop, so that the cache misses of consecutive removals overlap (see
    /// `Shard::begin_mass_removal`).
    pub fn remove_all(&mut self, removals: &[(KeyHash, SlotId)]) {
        for &(hash, slot) in removals {
            self.remove(hash, slot);
        }
    }

    /// Checks that the table holds exactly one element for each of the `n_live` slots, tagged
    /// with its key's hash (`hash_of(slot)`, `None` for a slot that is not live). Panics naming
    /// the first difference. O(elements): for tests.
    pub fn check_invariants(&self, n_live: usize, hash_of: impl Fn(SlotId) -> Option<KeyHash>) {
        assert_eq!(
            self.table.len(),
            n_live,
            "key table elements against live slots"
        );
        let mut seen = std::collections::HashSet::with_capacity(n_live);
        for element in &self.table {
            assert!(
                seen.insert(element.slot),
                "slot {} is in the key table twice",
                element.slot
            );
            let hash = hash_of(element.slot)
                .unwrap_or_else(|| panic!("slot {} is in the key table but free", element.slot));
            assert_eq!(element.tag, hash.tag(), "slot {}'s tag", element.slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// Hashes whose tags collide (same high 32 bits) while the keys differ: the table must
    /// tell them apart through `is_key`.
    #[test]
    fn keys_with_the_same_tag_are_told_apart_by_their_entries() {
        let mut table = KeyTable::default();
        let hash = KeyHash(0xdead_beef_0000_0001);
        table.insert(hash, 7);
        table.insert(hash, 9);
        assert_eq!(table.find(hash, |slot| slot == 9), Some(9));
        assert_eq!(table.find(hash, |slot| slot == 7), Some(7));
        assert_eq!(table.find(hash, |slot| slot == 8), None);
        table.remove(hash, 7);
        assert_eq!(table.find(hash, |slot| slot == 7), None);
        assert_eq!(table.find(hash, |slot| slot == 9), Some(9));
    }

    proptest! {
        /// Against a map from key to slot, through growth and removals: the same answers after
        /// every step, and a table that checks out against the model.
        #[test]
        fn the_table_matches_a_map_of_keys(
            ops in prop::collection::vec((any::<bool>(), 0u64..64), 1..400),
        ) {
            // A few distinct tags so that collisions of tags are common.
            let hash_of_key = |key: u64| KeyHash((key % 5) << 32 | key);
            let mut table = KeyTable::default();
            let mut model: BTreeMap<u64, SlotId> = BTreeMap::new();
            let mut next_slot = 0;
            for (insert, key) in ops {
                let hash = hash_of_key(key);
                let slot_key: BTreeMap<SlotId, u64> = model.iter().map(|(&k, &s)| (s, k)).collect();
                let found = table.find(hash, |slot| slot_key.get(&slot) == Some(&key));
                prop_assert_eq!(found, model.get(&key).copied());
                match (insert, found) {
                    (true, None) => {
                        table.insert(hash, next_slot);
                        model.insert(key, next_slot);
                        next_slot += 1;
                    }
                    (false, Some(slot)) => {
                        table.remove(hash, slot);
                        model.remove(&key);
                    }
                    _ => {}
                }
                let slot_key: BTreeMap<SlotId, u64> = model.iter().map(|(&k, &s)| (s, k)).collect();
                table.check_invariants(model.len(), |slot| slot_key.get(&slot).map(|&k| hash_of_key(k)));
            }
        }
    }
}
