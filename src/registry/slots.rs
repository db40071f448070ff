//! A slot table: entries stored by a dense `u32` id, freed ids reused.
//!
//! The shard keeps each key's entry here and refers to it by [`SlotId`] everywhere else (the
//! hash index, wheel buckets, the heap's back-references), so a key is stored once and every
//! reference to it is 4 bytes. Ids stay dense because freed ones are handed out again first,
//! which keeps the heap's `positions` array and the table itself compact.
//!
//! Costs: insert, remove and lookup are O(1). The table grows a chunk of [`CHUNK`] entries at a
//! time and never moves an entry: a registry growing to 10M keys never copies its entries
//! under a shard's lock (a single vector of 625k entries, a shard's share of 10M, is 45 MB to
//! copy when it grows, and an allocator that cannot remap pages copies it). It never shrinks.
//!
//! An id may also be *held* after its entry left ([`Slots::remove_holding_id`]): not live, and
//! not handed out again until [`Slots::release_held_ids`], for a structure that still names it
//! (the shard's listing, which lets go of a mass expiry's ids in one pass later).
//!
//! Invariants ([`Slots::check_invariants`]): an id is either live (its entry is `Some`), in
//! `free` or in `held` (its entry is `None`), never two of them, and `free` and `held` hold each
//! id at most once; every chunk but the last is full.

use crate::expiry::wheel::SlotId;

/// log2 of [`CHUNK`]; 16 entries in the unit tests, so that they cross chunk boundaries.
const CHUNK_BITS: u32 = if cfg!(test) { 4 } else { 12 };
/// Entries per chunk: 4,096 outside tests (256 KiB of 64-byte entries, of which only the pages written count
/// in the process's memory), so a lookup's extra step is into a chunk list that stays in cache
/// (2,500 chunk pointers for 10M keys).
const CHUNK: usize = 1 << CHUNK_BITS;

/// Entries by slot id; see the module documentation.
#[derive(Debug)]
pub(super) struct Slots<T> {
    /// `chunks[id / CHUNK][id % CHUNK]` is the entry of slot `id`, or `None` when the slot is
    /// free; each chunk is allocated whole (capacity `CHUNK`) and filled in order.
    chunks: Vec<Vec<Option<T>>>,
    /// Freed ids, reused last-freed first.
    free: Vec<SlotId>,
    /// Ids whose entries left but which are not to be reused yet.
    held: Vec<SlotId>,
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Self {
            chunks: Vec::new(),
            free: Vec::new(),
            held: Vec::new(),
        }
    }
}

impl<T> Slots<T> {
    /// Stores `entry` and returns its id: a freed one if there is one, else a new one.
    pub fn insert(&mut self, entry: T) -> SlotId {
        if let Some(slot) = self.free.pop() {
            let place = self.place_mut(slot).expect("a free id is within the table");
            debug_assert!(place.is_none(), "a free slot is empty");
            *place = Some(entry);
            return slot;
        }
        if self.chunks.last().is_none_or(|chunk| chunk.len() == CHUNK) {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        let slot = self.len_with_free();
        self.chunks
            .last_mut()
            .expect("a chunk with room was just ensured")
            .push(Some(entry));
        slot
    }

    fn place(&self, slot: SlotId) -> Option<&Option<T>> {
        self.chunks
            .get((slot >> CHUNK_BITS) as usize)?
            .get(slot as usize & (CHUNK - 1))
    }

    fn place_mut(&mut self, slot: SlotId) -> Option<&mut Option<T>> {
        self.chunks
            .get_mut((slot >> CHUNK_BITS) as usize)?
            .get_mut(slot as usize & (CHUNK - 1))
    }

    /// Removes and returns the entry of a live `slot`; the id becomes free.
    pub fn remove(&mut self, slot: SlotId) -> T {
        let entry = self.take(slot);
        self.free.push(slot);
        entry
    }

    /// Removes and returns the entry of a live `slot`, and holds the id: it is not reused
    /// until [`Slots::release_held_ids`].
    pub fn remove_holding_id(&mut self, slot: SlotId) -> T {
        let entry = self.take(slot);
        self.held.push(slot);
        entry
    }

    /// The entry of a live `slot`, taken out; the caller decides what becomes of the id.
    fn take(&mut self, slot: SlotId) -> T {
        self.place_mut(slot)
            .and_then(Option::take)
            .expect("removing a live slot")
    }

    /// The held ids (invariant checks).
    pub fn held_ids(&self) -> &[SlotId] {
        &self.held
    }

    /// Frees every held id at once.
    pub fn release_held_ids(&mut self) {
        self.free.append(&mut self.held);
    }

    /// The entry of `slot`, if it is live.
    pub fn get(&self, slot: SlotId) -> Option<&T> {
        self.place(slot)?.as_ref()
    }

    pub fn get_mut(&mut self, slot: SlotId) -> Option<&mut T> {
        self.place_mut(slot)?.as_mut()
    }

    /// The entry of a slot the caller knows is live (its id came from the key table or a
    /// current timer reference).
    pub fn entry(&self, slot: SlotId) -> &T {
        self.get(slot).expect("slot is live")
    }

    pub fn entry_mut(&mut self, slot: SlotId) -> &mut T {
        self.get_mut(slot).expect("slot is live")
    }

    /// Live entries.
    pub fn len(&self) -> usize {
        self.len_with_free() as usize - self.free.len() - self.held.len()
    }

    /// The number of ids handed out so far, live, free or held: every live id is below it.
    pub fn len_with_free(&self) -> SlotId {
        let full = self.chunks.len().saturating_sub(1) * CHUNK;
        let last = self.chunks.last().map_or(0, Vec::len);
        SlotId::try_from(full + last).expect("fewer than 2^32 slots per shard")
    }

    /// Every live `(slot, entry)`, in id order.
    pub fn iter(&self) -> impl Iterator<Item = (SlotId, &T)> {
        (0..)
            .zip(self.chunks.iter().flatten())
            .filter_map(|(slot, entry)| Some((slot, entry.as_ref()?)))
    }

    /// Checks the invariants of the module documentation; panics naming the first one broken.
    pub fn check_invariants(&self) {
        if let Some((_, full)) = self.chunks.split_last() {
            assert!(
                full.iter().all(|chunk| chunk.len() == CHUNK),
                "a chunk before the last is not full"
            );
        }
        let n_ids = self.len_with_free() as usize;
        let mut is_free = vec![false; n_ids];
        for &slot in self.free.iter().chain(&self.held) {
            let index = slot as usize;
            assert!(index < n_ids, "free or held id {slot} past the table");
            assert!(!is_free[index], "id {slot} is free or held twice");
            assert!(
                self.get(slot).is_none(),
                "free or held id {slot} has an entry"
            );
            is_free[index] = true;
        }
        let places = self.chunks.iter().flatten();
        for (index, entry) in places.enumerate() {
            assert!(
                entry.is_some() || is_free[index],
                "slot {index} is neither live nor free nor held"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn freed_ids_are_reused_last_freed_first() {
        let mut slots = Slots::default();
        let ids: Vec<SlotId> = (0..4).map(|n| slots.insert(n)).collect();
        assert_eq!(ids, [0, 1, 2, 3]);
        assert_eq!(slots.remove(1), 1);
        assert_eq!(slots.remove(3), 3);
        assert_eq!(slots.insert(30), 3);
        assert_eq!(slots.insert(10), 1);
        assert_eq!(slots.insert(4), 4);
        assert_eq!(slots.entry(3), &30);
        slots.check_invariants();
    }

    #[test]
    fn held_ids_are_not_reused_until_released() {
        let mut slots = Slots::default();
        let ids: Vec<SlotId> = (0..3).map(|n| slots.insert(n)).collect();
        assert_eq!(slots.remove_holding_id(ids[1]), 1);
        assert_eq!(slots.len(), 2);
        assert!(slots.get(ids[1]).is_none());
        slots.check_invariants();
        assert_eq!(slots.insert(3), 3, "a held id is not handed out");
        slots.release_held_ids();
        slots.check_invariants();
        assert_eq!(slots.insert(4), ids[1], "released, it is");
        slots.check_invariants();
    }

    #[test]
    fn lookups_of_free_or_unknown_ids_find_nothing() {
        let mut slots = Slots::default();
        let id = slots.insert("a");
        slots.remove(id);
        assert_eq!(slots.get(id), None);
        assert_eq!(slots.get(99), None);
        assert_eq!(slots.get_mut(99), None);
        assert_eq!(slots.iter().count(), 0);
    }

    #[test]
    #[should_panic(expected = "removing a live slot")]
    fn removing_a_free_slot_is_a_bug() {
        let mut slots = Slots::default();
        let id = slots.insert(());
        slots.remove(id);
        slots.remove(id);
    }

    #[test]
    #[should_panic(expected = "free or held twice")]
    fn the_check_finds_an_id_freed_twice() {
        let mut slots = Slots::default();
        let id = slots.insert(());
        slots.remove(id);
        slots.free.push(id); // planted: the double free a buggy owner would cause
        slots.check_invariants();
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u8),
        /// Removes the n-th live slot (modulo their number).
        Remove(usize),
        /// The same, holding its id.
        RemoveHolding(usize),
        ReleaseHeld,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            any::<u8>().prop_map(Op::Insert),
            any::<usize>().prop_map(Op::Remove),
            any::<usize>().prop_map(Op::RemoveHolding),
            Just(Op::ReleaseHeld),
        ]
    }

    proptest! {
        /// Against a map from id to value: the same live entries after every step, held ids
        /// never handed out, and ids that stay dense (never more ids than the most entries ever
        /// live or held at once).
        #[test]
        fn slots_match_a_map_of_live_entries(ops in prop::collection::vec(op(), 1..200)) {
            let mut slots = Slots::default();
            let mut model = BTreeMap::new();
            let mut held = std::collections::BTreeSet::new();
            let mut most_live = 0;
            for op in ops {
                match op {
                    Op::Insert(value) => {
                        let id = slots.insert(value);
                        prop_assert!(!held.contains(&id), "held id {} reused", id);
                        prop_assert!(model.insert(id, value).is_none(), "id {} reused while live", id);
                    }
                    Op::Remove(nth) | Op::RemoveHolding(nth) if !model.is_empty() => {
                        let id = *model.keys().nth(nth % model.len()).unwrap();
                        let removed = match op {
                            Op::Remove(_) => slots.remove(id),
                            _ => {
                                held.insert(id);
                                slots.remove_holding_id(id)
                            }
                        };
                        prop_assert_eq!(removed, model.remove(&id).unwrap());
                    }
                    Op::Remove(_) | Op::RemoveHolding(_) => {}
                    Op::ReleaseHeld => {
                        slots.release_held_ids();
                        held.clear();
                    }
                }
                prop_assert_eq!(slots.len(), model.len());
                most_live = most_live.max(model.len() + held.len());
                slots.check_invariants();
                let live: Vec<(SlotId, u8)> = slots.iter().map(|(id, &v)| (id, v)).collect();
                let expected: Vec<(SlotId, u8)> = model.iter().map(|(&id, &v)| (id, v)).collect();
                prop_assert_eq!(live, expected);
                prop_assert!(slots.len_with_free() as usize <= most_live);
            }
        }
    }
}
