//! The key index: every alive (or held, or due and not yet swept) key, mapped to the slot of
//! its entry in its shard's slot table. A `DashMap`, as the design card names it.
//!
//! Why a `DashMap` and not our own table: the card lets our own index stand only while a
//! benchmark shows it faster at every size, and it was not (ARCHITECTURE.md, "The key index").
//! The index is its own concurrent map; the shard's lock still covers the slot table, the wheel
//! and the heap.
//!
//! Invariants (checked by `Registry::check_invariants` and `Shard::check_invariants`):
//! - a key is in the index exactly when its shard's slot table holds an entry for it, and the
//!   index maps it to that entry's slot;
//! - every change to a key's mapping is made while its shard's lock is held, so a shard's lock
//!   holder sees the mappings of its keys stable (the map's own locks are taken inside it and
//!   never held across a call, so they cannot deadlock with the shards').

use dashmap::DashMap;
use foldhash::fast::RandomState;

use crate::expiry::wheel::SlotId;
use crate::types::Key;

/// See the module documentation.
#[derive(Debug)]
pub(super) struct KeyIndex {
    map: DashMap<Key, SlotId, RandomState>,
}

impl KeyIndex {
    /// An empty index with `shards` (a power of two, at least 2) locks of its own.
    pub fn new(hasher: RandomState, shards: usize) -> Self {
        Self {
            map: DashMap::with_hasher_and_shard_amount(hasher, shards.max(2).next_power_of_two()),
        }
    }

    /// The slot of `key`'s entry, if it is indexed.
    pub fn slot(&self, key: &Key) -> Option<SlotId> {
        self.map.view(key, |_, &slot| slot)
    }

    /// Indexes a key that is not indexed yet.
    pub fn insert(&self, key: Key, slot: SlotId) {
        let previous = self.map.insert(key, slot);
        debug_assert!(previous.is_none(), "a key indexed twice");
    }

    /// Takes an indexed key out of the index.
    pub fn remove(&self, key: &Key) {
        let removed = self.map.remove(key);
        debug_assert!(removed.is_some(), "removing a key that is not indexed");
    }

    /// Keys indexed now (exact only while no shard changes, as `check_invariants` arranges).
    pub fn len(&self) -> usize {
        self.map.len()
    }
}
