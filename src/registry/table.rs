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
//! A large table doubles *incrementally*, so that no operation stops the shard for long: the
//! old array stays beside the new one, and each insert, removal or mutating lookup (the
//! shard's `find_alive`) moves the elements of the next [`MOVE_STEP`] old places across, in
//! place order. Moving a shard's 600k elements at
//! once held its lock ~9 ms at 10M keys (the longest creation while growing,
//! `cargo bench --bench growth`), the largest stall left in growth. Meanwhile a lookup probes
//! the new array, then the old; the old array takes no inserts, and a place whose element moved
//! or was removed becomes a tombstone (a probe passes it, as it passed the element), so every
//! element not yet moved stays on its probe. The move finishes long before the new array could
//! fill: it starts at 3/8 of the new array's room and needs `old places / MOVE_STEP`
//! operations, while the new array takes 3/8 more elements (`old places * 3/4` inserts)
//! before it is at three quarters.
//!
//! Which bits do what, so that the choices do not follow each other: the registry picks a
//! key's shard from bits 16.. of its hash; the tag is bits 32..64, and its low bits are the
//! probe's start.
//!
//! Invariants (checked by [`KeyTable::check_invariants`], through the shard's check): the
//! table (both arrays while growing) holds exactly one element per live slot, tagged with the
//! tag of that slot's key, and each is found by its own probe in its array (no empty place
//! between its home and it, tombstones aside); the elements are at most three quarters of the
//! new array's room; while growing, no old place before the move's cursor holds an element.

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
        Self::of_bytes(hasher, key.as_bytes())
    }

    /// The hash of a key not yet validated as a [`Key`] (for `Registry::warm`, which reads a
    /// batch's keys before they are applied): the same hash the key gets once it is one.
    pub fn of_str(hasher: &RandomState, key: &str) -> Self {
        Self::of_bytes(hasher, key.as_bytes())
    }

    /// The hash of a key's bytes, which every other form of a key hashes through (an entry
    /// keeps some keys as bytes: `registry::entry_key`).
    pub fn of_bytes(hasher: &RandomState, key: &[u8]) -> Self {
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

/// A place of the old array whose element moved or was removed while the table grows: a probe
/// goes on past it. Never an element: its slot half is 0, and an element's is a slot id plus 1.
const TOMBSTONE: u64 = u64::MAX << 32;

/// The smallest table, in elements: one cache line.
const MIN_PLACES: usize = 8;

/// From this many places up, the table doubles incrementally. Below, it moves every element
/// at once: at most 0.5 ms (`cargo bench --bench growth`), and no old array is left over a
/// registration that stops just after a doubling (at 100k keys over 16 shards, incremental
/// from 4,096 places kept 0.5 MiB of old arrays, 3 % of the process's growth:
/// `bench/memory_fleet.sh`). Small in the unit tests, so that their tables grow both ways.
const INCREMENTAL_FROM: usize = if cfg!(test) { 16 } else { 1 << 14 };

/// Old places whose elements each insert or removal moves while the table grows: two cache
/// lines. At least 4/3 keeps the move ahead of the fill (see the module documentation);
/// more ends the double probes sooner, fewer spreads the work thinner. Two in the unit tests,
/// so that their operations interleave with a move in progress.
const MOVE_STEP: usize = if cfg!(test) { 2 } else { 16 };

/// An element: the tag in the high 32 bits, the slot id plus one in the low 32.
fn element(tag: u32, slot: SlotId) -> u64 {
    debug_assert!(slot < SlotId::MAX, "slot ids stay below u32::MAX");
    (u64::from(tag) << 32) | u64::from(slot + 1)
}

/// The places of `places` a probe for `tag` visits, in order: from its home place on,
/// wrapping (the caller stops at the first empty one; there always is one); none in an empty
/// array.
fn probe(places: &[u64], tag: u32) -> impl Iterator<Item = usize> {
    let mask = places.len().wrapping_sub(1);
    let home = home(places, tag);
    (0..places.len()).map(move |step| (home + step) & mask)
}

/// Where the probe for `tag` starts (any value when `places` is empty).
fn home(places: &[u64], tag: u32) -> usize {
    tag as usize & places.len().wrapping_sub(1)
}

/// The element (or tombstone) at `at`, unless the place is empty.
fn occupied(places: &[u64], at: usize) -> Option<u64> {
    let element = places[at];
    (element != EMPTY).then_some(element)
}

/// Where `element` is in `places`, found by its probe.
fn place_of(places: &[u64], element: u64) -> Option<usize> {
    probe(places, tag_of(element))
        .take_while(|&at| places[at] != EMPTY)
        .find(|&at| places[at] == element)
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
    /// Elements in `places`.
    len: usize,
    /// While the table grows, the array before the doubling (empty otherwise): [`EMPTY`],
    /// [`TOMBSTONE`] or an element not yet moved.
    old: Vec<u64>,
    /// Elements in `old`.
    old_len: usize,
    /// The next place of `old` to move.
    cursor: usize,
}

impl KeyTable {
    /// The slot of the key with `hash` for which `is_key(slot)` holds (the caller compares the
    /// key stored in that slot's entry).
    pub fn find(&self, hash: KeyHash, mut is_key: impl FnMut(SlotId) -> bool) -> Option<SlotId> {
        let tag = hash.tag();
        let mut is_wanted = |element: u64| tag_of(element) == tag && is_key(slot_of(element));
        let found = probe(&self.places, tag)
            .map_while(|at| occupied(&self.places, at))
            .find(|&element| is_wanted(element));
        let found = found.or_else(|| {
            probe(&self.old, tag)
                .map_while(|at| occupied(&self.old, at))
                .find(|&element| element != TOMBSTONE && is_wanted(element))
        });
        found.map(slot_of)
    }

    /// The slot of the first element tagged like `hash`, found without reading any entry: the
    /// key's own slot but for a tag shared in this shard (one time in billions). A hint only,
    /// for warming the cache before the real lookup ([`Shard::warm`](super::shard::Shard::warm)).
    pub fn first_with_tag(&self, hash: KeyHash) -> Option<SlotId> {
        self.find(hash, |_| true)
    }

    /// Adds the key with `hash`, stored in `slot`; the caller knows it is not in the table.
    pub fn insert(&mut self, hash: KeyHash, slot: SlotId) {
        self.move_step();
        if (self.len + self.old_len + 1) * 4 > self.places.len() * 3 {
            self.grow();
        }
        self.place(element(hash.tag(), slot));
        self.len += 1;
    }

    /// Takes out the element of `slot`, whose key has `hash`.
    pub fn remove(&mut self, hash: KeyHash, slot: SlotId) {
        let wanted = element(hash.tag(), slot);
        if let Some(at) = place_of(&self.places, wanted) {
            self.vacate(at);
        } else if let Some(at) = place_of(&self.old, wanted) {
            self.old[at] = TOMBSTONE;
            self.old_len -= 1;
        } else {
            debug_assert!(false, "slot {slot} is not in the key table");
        }
        self.move_step();
    }

    /// Takes out the elements of every `(hash, slot)` in `removals`, each in the table (see
    /// `Shard::begin_mass_removal`). The removals wait on one cache miss each, the line their
    /// probe starts in, and cannot overlap them much: a removal's loop branches on what it
    /// reads. So a first loop only reads those lines, loads that depend on nothing before them
    /// and so all wait at once, and the removals then find their lines in the cache.
    pub fn remove_all(&mut self, removals: &[(KeyHash, SlotId)]) {
        let first_read = removals.iter().fold(0, |read, &(hash, _)| {
            read ^ self
                .places
                .get(home(&self.places, hash.tag()))
                .copied()
                .unwrap_or(0)
        });
        std::hint::black_box(first_read);
        for &(hash, slot) in removals {
            self.remove(hash, slot);
        }
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

    /// Doubles the places. A small table puts every element back at once, from its tag alone;
    /// a large one keeps its array as `old` for [`Self::move_step`] to empty.
    fn grow(&mut self) {
        // Never two growths at once: the move is far ahead of the fill, but if it were not,
        // this finishes it first.
        while !self.old.is_empty() {
            self.move_step();
        }
        let places = (self.places.len() * 2).max(MIN_PLACES);
        let old = std::mem::replace(&mut self.places, vec![EMPTY; places]);
        if old.len() < INCREMENTAL_FROM {
            for element in old.into_iter().filter(|&element| element != EMPTY) {
                self.place(element);
            }
        } else {
            self.old = old;
            self.old_len = std::mem::take(&mut self.len);
            self.cursor = 0;
        }
    }

    /// While the table grows: moves the elements of the next [`MOVE_STEP`] old places to the
    /// new array, leaving tombstones, and lets the old array go after its last place. Inserts
    /// and removals call it, and so does the shard's every mutating lookup: a fleet that only
    /// renews once it has registered must not keep probing two arrays.
    pub fn move_step(&mut self) {
        if self.old.is_empty() {
            return;
        }
        let end = (self.cursor + MOVE_STEP).min(self.old.len());
        for at in self.cursor..end {
            let element = self.old[at];
            if element != EMPTY && element != TOMBSTONE {
                self.old[at] = TOMBSTONE;
                self.place(element);
                self.len += 1;
                self.old_len -= 1;
            }
        }
        self.cursor = end;
        if self.cursor == self.old.len() {
            debug_assert_eq!(self.old_len, 0, "every old element moved");
            self.old = Vec::new();
            self.cursor = 0;
        }
    }

    /// Whether a doubling is moving elements still.
    #[cfg(test)]
    pub fn is_growing(&self) -> bool {
        !self.old.is_empty()
    }

    /// Checks that the table (both arrays while it grows) holds exactly one element for each
    /// of the `n_live` slots, tagged with its key's hash (`hash_of(slot)`, `None` for a slot
    /// that is not live), each found by its own probe; that the elements are at most three
    /// quarters of the new array's room; and, while growing, that the counts of both arrays
    /// hold and no old place before the cursor keeps an element. Panics naming the first
    /// difference. O(elements): for tests.
    pub fn check_invariants(&self, n_live: usize, hash_of: impl Fn(SlotId) -> Option<KeyHash>) {
        let is_element = |&element: &u64| element != EMPTY && element != TOMBSTONE;
        let elements: Vec<u64> = self.places.iter().copied().filter(is_element).collect();
        assert_eq!(
            elements.len(),
            self.len,
            "key table elements against its count"
        );
        assert!(
            !self.places.contains(&TOMBSTONE),
            "a tombstone in the new array"
        );
        let old_elements: Vec<u64> = self.old.iter().copied().filter(is_element).collect();
        assert_eq!(
            old_elements.len(),
            self.old_len,
            "old array elements against its count"
        );
        assert!(
            self.old[..self.cursor.min(self.old.len())]
                .iter()
                .all(|element| !is_element(element)),
            "an element before the move's cursor"
        );
        assert!(
            self.old.is_empty() || self.cursor < self.old.len(),
            "an old array kept after its last place moved"
        );
        let total = self.len + self.old_len;
        assert_eq!(total, n_live, "key table elements against live slots");
        assert!(
            total * 4 <= self.places.len() * 3,
            "key table over three quarters full"
        );
        let mut seen = std::collections::HashSet::with_capacity(n_live);
        for element in elements.into_iter().chain(old_elements) {
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
