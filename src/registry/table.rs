//! The key table: one shard's map from a key to the slot of its entry, behind the shard's own
//! lock. Together with the slot table (`slots`) it is the store: each key is stored once, inline
//! in its entry, and found through this table in one probe.
//!
//! An element is 8 bytes: the high 32 bits of the key's hash (the *tag*) and the slot id. The
//! tag does two jobs. A probe compares tags before it looks at an entry, so a lookup touches
//! only the entry of the key it finds (a different key with the same 32-bit tag in one shard is
//! rare: one in 4 billion per comparison). And the table rehashes from its elements alone when
//! it grows, without reading a single entry: growing a shard of 600k keys moves 5 MB of
//! elements (~9 ms under the lock at 10M keys, `cargo bench --bench growth`), where a table
//! that had to hash each key again through its entry took a random memory access per key
//! (hundreds of milliseconds under the lock at 10M keys, measured in the first engine pass).
//!
//! Why a table of slot ids beside a slot table, rather than the entries inline in the table:
//! the wheel, the last second's groups, the held list and the heap's back-references all refer
//! to a key by its dense slot id, which never moves while the key lives; entries inline in a
//! hash table move on every resize (64 bytes each, under the lock), and references to them
//! would need a second probe. See ARCHITECTURE.md, "The store".
//!
//! The table is open addressing with linear probing over one array of elements, not
//! `hashbrown`: a probe starts at the place the tag's low bits name and reads on, eight
//! elements to a cache line, so a lookup is one cache miss in the table and one in the entry.
//! `hashbrown` keeps its control bytes apart from its elements, so it was two in the table,
//! and with the entry three dependent misses per heartbeat, where a map holding its entries
//! inline has two (measured: renewals at 1M keys on one thread went from 1.21-1.29x to
//! 1.06-1.16x the inline `dashmap+bucket-sets` baseline; BENCHMARKS.md, "Entries of one cache
//! line"). It grows by doubling at three quarters full, which keeps a probe for an absent key
//! (every creation makes one) to about two lines. A removal shifts the rest of its run back
//! into the hole (backward-shift deletion): no tombstones, so probes never lengthen with churn.
//!
//! Which bits do what, so that the choices do not follow each other: the registry picks a
//! key's shard from bits 16.. of its hash; the tag is bits 32..64, and its low bits are the
//! probe's start.
//!
//! Invariants (checked by [`KeyTable::check_invariants`], through the shard's check): the
//! table holds exactly one element per live slot, tagged with the tag of that slot's key, and
//! each is found by its own probe (no empty place between its home and it); it is at most
//! three quarters full.

use std::hash::BuildHasher;

use foldhash::fast::RandomState;

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

/// An empty place; an element is never 0 because it stores its slot id plus one.
const EMPTY: u64 = 0;

/// The smallest table, in elements: one cache line.
const MIN_PLACES: usize = 8;

/// An element: the tag in the high 32 bits, the slot id plus one in the low 32.
fn element(tag: u32, slot: SlotId) -> u64 {
    debug_assert!(slot < SlotId::MAX, "slot ids stay below u32::MAX");
    (u64::from(tag) << 32) | u64::from(slot + 1)
}

fn tag_of(element: u64) -> u32 {
    (element >> 32) as u32
}

fn slot_of(element: u64) -> SlotId {
    (element as u32) - 1
}

/// See the module documentation.
#[derive(Debug, Default)]
pub(super) struct KeyTable {
    /// A power of two of places (or none before the first insert), [`EMPTY`] or an element.
    places: Vec<u64>,
    len: usize,
}

impl KeyTable {
    /// The slot of the key with `hash` for which `is_key(slot)` holds (the caller compares the
    /// key stored in that slot's entry).
    pub fn find(&self, hash: KeyHash, mut is_key: impl FnMut(SlotId) -> bool) -> Option<SlotId> {
        let tag = hash.tag();
        self.probe(tag)
            .map_while(|at| self.occupied(at))
            .find(|&element| tag_of(element) == tag && is_key(slot_of(element)))
            .map(slot_of)
    }

    /// The slot of the first element tagged like `hash`, found without reading any entry: the
    /// key's own slot but for a tag shared in this shard (one time in billions). A hint only,
    /// for warming the cache before the real lookup ([`Shard::warm`](super::shard::Shard::warm)).
    pub fn first_with_tag(&self, hash: KeyHash) -> Option<SlotId> {
        self.find(hash, |_| true)
    }

    /// Adds the key with `hash`, stored in `slot`; the caller knows it is not in the table.
    pub fn insert(&mut self, hash: KeyHash, slot: SlotId) {
        if (self.len + 1) * 4 > self.places.len() * 3 {
            self.grow();
        }
        self.place(element(hash.tag(), slot));
        self.len += 1;
    }

    /// Takes out the element of `slot`, whose key has `hash`.
    pub fn remove(&mut self, hash: KeyHash, slot: SlotId) {
        let wanted = element(hash.tag(), slot);
        let found = self
            .probe(hash.tag())
            .take_while(|&at| self.places[at] != EMPTY)
            .find(|&at| self.places[at] == wanted);
        match found {
            Some(at) => self.vacate(at),
            None => debug_assert!(false, "slot {slot} is not in the key table"),
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

    /// The places a probe for `tag` visits, in order: from its home place on, wrapping (the
    /// caller stops at the first empty one; there always is one).
    fn probe(&self, tag: u32) -> impl Iterator<Item = usize> + '_ {
        let mask = self.places.len().wrapping_sub(1);
        let home = tag as usize & mask;
        (0..self.places.len()).map(move |step| (home + step) & mask)
    }

    /// The element at `at`, unless the place is empty.
    fn occupied(&self, at: usize) -> Option<u64> {
        let element = self.places[at];
        (element != EMPTY).then_some(element)
    }

    /// Puts `element` in the first empty place of its probe (there is room).
    fn place(&mut self, element: u64) {
        let mask = self.places.len() - 1;
        let mut at = tag_of(element) as usize & mask;
        while self.places[at] != EMPTY {
            at = (at + 1) & mask;
        }
        self.places[at] = element;
    }

    /// Empties place `at` and moves later elements of the run back into the hole where their
    /// probe passes it (backward-shift deletion: no tombstones, so probes stay as short as the
    /// load makes them).
    fn vacate(&mut self, at: usize) {
        let mask = self.places.len() - 1;
        let mut hole = at;
        let mut next = (at + 1) & mask;
        loop {
            let element = self.places[next];
            if element == EMPTY {
                break;
            }
            let home = tag_of(element) as usize & mask;
            // The element may move back to the hole if its probe passes the hole on the way
            // from home: the hole is no further from `next` than home is.
            if next.wrapping_sub(home) & mask >= next.wrapping_sub(hole) & mask {
                self.places[hole] = element;
                hole = next;
            }
            next = (next + 1) & mask;
        }
        self.places[hole] = EMPTY;
        self.len -= 1;
    }

    /// Doubles the places and puts every element back, from its tag alone.
    fn grow(&mut self) {
        let places = (self.places.len() * 2).max(MIN_PLACES);
        let old = std::mem::replace(&mut self.places, vec![EMPTY; places]);
        for element in old.into_iter().filter(|&element| element != EMPTY) {
            self.place(element);
        }
    }

    /// Checks that the table holds exactly one element for each of the `n_live` slots, tagged
    /// with its key's hash (`hash_of(slot)`, `None` for a slot that is not live), each found by
    /// its own probe, and that the table is at most three quarters full. Panics naming the
    /// first difference. O(elements): for tests.
    pub fn check_invariants(&self, n_live: usize, hash_of: impl Fn(SlotId) -> Option<KeyHash>) {
        let elements: Vec<u64> = self
            .places
            .iter()
            .copied()
            .filter(|&element| element != EMPTY)
            .collect();
        assert_eq!(
            elements.len(),
            self.len,
            "key table elements against its count"
        );
        assert_eq!(self.len, n_live, "key table elements against live slots");
        assert!(
            self.len * 4 <= self.places.len() * 3,
            "key table over three quarters full"
        );
        let mut seen = std::collections::HashSet::with_capacity(n_live);
        for element in elements {
            let slot = slot_of(element);
            assert!(seen.insert(slot), "slot {slot} is in the key table twice");
            let hash =
                hash_of(slot).unwrap_or_else(|| panic!("slot {slot} is in the key table but free"));
            assert_eq!(tag_of(element), hash.tag(), "slot {slot}'s tag");
            assert_eq!(
                self.find(hash, |found| found == slot),
                Some(slot),
                "slot {slot} is not found by its probe"
            );
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
            // A few distinct tags so that collisions of tags are common, and two of them
            // (u32::MAX - 1 and u32::MAX) at home in the table's last places, so that runs
            // wrap around its end.
            let hash_of_key = |key: u64| {
                let tag = ((key % 5) as u32).wrapping_sub(2);
                KeyHash(u64::from(tag) << 32 | key)
            };
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
