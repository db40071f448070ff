//! The per-shard ordered index of alive keys behind the liveness lists (the recently expired
//! ones are `expired`'s).
//!
//! It is updated on registration, expiry and deletion only, never on a renewal, so the
//! heartbeat hot path does not pay for it. A page of alive keys is a range scan from the
//! cursor: O(log n + page) per shard, whatever the number of keys.

use super::services::ServiceId;
use crate::expiry::wheel::SlotId;

/// What a page asks for. Keys are returned in byte order of their UTF-8 text.
#[derive(Clone, Debug, Default)]
pub struct ListFilter {
    pub service: Option<ServiceId>,
    pub prefix: Option<String>,
    /// Only keys held by the mass-expiry guard.
    pub held_only: bool,
    /// Only keys strictly after this one (the cursor of the previous page).
    pub after: Option<String>,
}

impl ListFilter {
    /// Where the scan starts: the lowest text a listed key may have, and whether a key equal to
    /// it is listed (a cursor is not; a prefix is).
    fn start(&self) -> (&str, bool) {
        let prefix = self.prefix.as_deref().unwrap_or("");
        match self.after.as_deref() {
            Some(after) if after >= prefix => (after, false),
            _ => (prefix, true),
        }
    }

    /// Whether the scan may stop at `key`: no later key can match the prefix.
    fn past_prefix(&self, key: &[u8]) -> bool {
        self.prefix
            .as_deref()
            .map(str::as_bytes)
            .is_some_and(|prefix| !key.starts_with(prefix) && key > prefix)
    }

    fn matches_prefix(&self, key: &[u8]) -> bool {
        self.prefix
            .as_deref()
            .is_none_or(|prefix| key.starts_with(prefix.as_bytes()))
    }
}

/// Most slots in one block of a [`SortedSlots`]; a full block is split in two before an
/// insertion, so a block's allocation never grows past 1 KiB (one size class for every full
/// block, where growing to 257 ids doubled it to 2 KiB). Small enough that an insertion's move
/// within a block is one short `memmove`, large enough that the block headers cost under 0.2
/// bytes per key.
const BLOCK_MAX: usize = 256;

/// How full [`OrderedIndex::build`] fills its blocks: room left for insertions before the
/// first splits, about the fill that insertions and splits leave on their own.
const BUILT_FILL: usize = BLOCK_MAX * 3 / 4;

/// Slot ids in the order of their keys, which stay in the entries: a sorted list cut into
/// blocks of at most [`BLOCK_MAX`], so an insertion or removal moves at most a block's ids,
/// and a position is found by a binary search over the blocks' last keys and then one within
/// the block, each comparison reading a key through `key_of` (a removal, knowing its id, scans
/// the block for it instead of the second search).
///
/// 4 bytes per key (plus the blocks' slack), where a `BTreeSet<Key>` held a copy of every key
/// (24 bytes inline, and a heap block for a key over 24 bytes).
///
/// The search over the blocks compares the first 8 bytes of each block's last key, kept in
/// one array ([`fence`]), and reads a key only where those are equal: reading a key is two or
/// three cache misses (the slot, the entry, a key over 30 bytes on the heap), and a binary
/// search over the blocks of a shard's ~300k keys read ~11 of them per creation. Measured
/// with `perf` while batches created keys at 4.7M keys: `Shard::insert`, where that search is
/// inlined, took 43 % of the server's CPU samples; growth to 10M keys over HTTP took 38-40 s
/// before the fences, 31-34 s with them (`bench/growth.sh`, BENCHMARKS.md).
///
/// Invariants ([`SortedSlots::check_invariants`]): the keys of the ids, read block after block,
/// are strictly increasing; no block is empty or over `BLOCK_MAX`; `fences[i]` is the fence of
/// block `i`'s last key.
#[derive(Debug, Default)]
pub(super) struct SortedSlots {
    /// The ids in key order, cut into blocks.
    blocks: Vec<Vec<SlotId>>,
    /// Per block, the [`fence`] of its last key.
    fences: Vec<u64>,
}

/// Whether `key` sorts before the place sought: below `text` (`inclusive`), or at most it.
fn before(key: &[u8], text: &[u8], inclusive: bool) -> bool {
    if inclusive {
        key < text
    } else {
        key <= text
    }
}

/// A key's first 8 bytes as a big-endian number, zero-padded: `fence(a) < fence(b)` implies
/// `a < b` in byte order (and `>` implies `>`); only equal fences leave the order open.
fn fence(bytes: &[u8]) -> u64 {
    let mut first = [0u8; 8];
    let n = bytes.len().min(8);
    first[..n].copy_from_slice(&bytes[..n]);
    u64::from_be_bytes(first)
}

impl SortedSlots {
    /// The first position whose key is at least `text` (`inclusive`) or above it: `(block,
    /// offset)`, `(blocks.len(), 0)` when there is none.
    fn position<'k>(
        &self,
        text: &[u8],
        inclusive: bool,
        key_of: impl Fn(SlotId) -> &'k [u8],
    ) -> (usize, usize) {
        let block = self.block_of(text, inclusive, &key_of);
        let before = |slot: SlotId| before(key_of(slot), text, inclusive);
        match self.blocks.get(block) {
            Some(slots) => (block, slots.partition_point(|&slot| before(slot))),
            None => (block, 0),
        }
    }

    /// The first block whose last key is not before the place sought (see
    /// [`SortedSlots::position`]; `blocks.len()` when there is none): by the fences, reading a
    /// block's last key only where its fence equals `text`'s.
    fn block_of<'k>(
        &self,
        text: &[u8],
        inclusive: bool,
        key_of: impl Fn(SlotId) -> &'k [u8],
    ) -> usize {
        let sought = fence(text);
        let is_before = |block: usize| match self.fences[block].cmp(&sought) {
            std::cmp::Ordering::Less => true,
            std::cmp::Ordering::Greater => false,
            std::cmp::Ordering::Equal => {
                let last = *self.blocks[block].last().expect("blocks are never empty");
                before(key_of(last), text, inclusive)
            }
        };
        // A binary search (the predicate holds for a prefix of the blocks).
        let (mut low, mut high) = (0, self.fences.len());
        while low < high {
            let middle = low + (high - low) / 2;
            if is_before(middle) {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        low
    }

    /// The list of `ids`, already in key order, in blocks filled to [`BUILT_FILL`].
    fn from_sorted<'k>(ids: &[SlotId], key_of: impl Fn(SlotId) -> &'k [u8]) -> Self {
        let blocks: Vec<Vec<SlotId>> = ids.chunks(BUILT_FILL).map(<[SlotId]>::to_vec).collect();
        let fences = (blocks.iter())
            .map(|block| fence(key_of(*block.last().expect("chunks are never empty"))))
            .collect();
        Self { blocks, fences }
    }

    /// Adds `slot`, whose key is not in the list yet.
    pub fn insert<'k>(&mut self, slot: SlotId, key_of: impl Fn(SlotId) -> &'k [u8]) {
        let key = key_of(slot);
        let (mut block, mut offset) = self.position(key, true, &key_of);
        if self.blocks.is_empty() {
            self.blocks.push(vec![slot]);
            self.fences.push(fence(key));
            return;
        }
        if block == self.blocks.len() {
            // Past every key: at the end of the last block.
            block -= 1;
            offset = self.blocks[block].len();
        }
        if self.blocks[block].len() == BLOCK_MAX {
            let upper = self.blocks[block].split_off(BLOCK_MAX / 2);
            self.blocks.insert(block + 1, upper);
            // The upper half keeps the last key; the lower half ends at another.
            self.fences.insert(block + 1, self.fences[block]);
            self.refresh_fence(block, &key_of);
            if offset > BLOCK_MAX / 2 {
                block += 1;
                offset -= BLOCK_MAX / 2;
            }
        }
        self.blocks[block].insert(offset, slot);
        if offset + 1 == self.blocks[block].len() {
            self.fences[block] = fence(key);
        }
    }

    /// Sets block `block`'s fence from its last key.
    fn refresh_fence<'k>(&mut self, block: usize, key_of: impl Fn(SlotId) -> &'k [u8]) {
        let last = *self.blocks[block].last().expect("blocks are never empty");
        self.fences[block] = fence(key_of(last));
    }

    /// Takes out `slot`, whose key is `key_of(slot)` (still readable: the caller removes the
    /// entry after).
    pub fn remove<'k>(&mut self, slot: SlotId, key_of: impl Fn(SlotId) -> &'k [u8]) {
        let key = key_of(slot);
        // The block by its keys, then the id by a scan of the block's ids: at most 1 KiB read
        // in order, where a binary search would read ~8 entries at random (a mass expiry
        // removes a million keys this way).
        let block = self.block_of(key, true, &key_of);
        let offset = self
            .blocks
            .get(block)
            .and_then(|slots| slots.iter().position(|&listed| listed == slot));
        let offset =
            offset.unwrap_or_else(|| panic!("slot {slot} is not listed where its key sorts"));
        self.blocks[block].remove(offset);
        // Keep blocks from thinning out after many removals: a small block joins its
        // predecessor when both fit in half a block.
        let left = self.blocks[block].len();
        if left > 0 && offset == left {
            // Its last key left (it is still readable, but no longer the block's).
            self.refresh_fence(block, &key_of);
        }
        let merge = block > 0 && left + self.blocks[block - 1].len() <= BLOCK_MAX / 2;
        if merge || left == 0 {
            let slots = self.blocks.remove(block);
            let last_fence = self.fences.remove(block);
            if let Some(previous) = block.checked_sub(1) {
                if !slots.is_empty() {
                    self.blocks[previous].extend(slots);
                    self.fences[previous] = last_fence;
                }
            }
        }
    }

    /// Takes out every id in `gone`, in one pass over the blocks: reads no key, so a sweep
    /// step that removes a good part of the list pays ~1 ns an id listed instead of a search
    /// (~10 keys read at random) for each id removed. Thin blocks merge as in
    /// [`SortedSlots::remove`].
    ///
    /// A block whose last id left reads its new last key for its fence (`key_of`: the ids
    /// kept are alive, their keys readable): one key a block at most.
    pub fn remove_all<'k>(&mut self, gone: &SlotSet, key_of: impl Fn(SlotId) -> &'k [u8]) {
        let mut kept: Vec<Vec<SlotId>> = Vec::with_capacity(self.blocks.len());
        let mut fences: Vec<u64> = Vec::with_capacity(self.blocks.len());
        let blocks = std::mem::take(&mut self.blocks);
        for (mut block, old_fence) in blocks.into_iter().zip(std::mem::take(&mut self.fences)) {
            let last = block.last().copied();
            block.retain(|&slot| !gone.contains(slot));
            let Some(&new_last) = block.last() else {
                continue;
            };
            let block_fence = match last == Some(new_last) {
                true => old_fence,
                false => fence(key_of(new_last)),
            };
            match kept.last_mut() {
                Some(previous) if previous.len() + block.len() <= BLOCK_MAX / 2 => {
                    previous.extend(block);
                    *fences.last_mut().expect("one per block") = block_fence;
                }
                _ => {
                    kept.push(block);
                    fences.push(block_fence);
                }
            }
        }
        self.blocks = kept;
        self.fences = fences;
    }

    /// Every id from the first whose key is at least `text` (`inclusive`) or above it, in order.
    fn from<'a, 'k>(
        &'a self,
        text: &[u8],
        inclusive: bool,
        key_of: impl Fn(SlotId) -> &'k [u8],
    ) -> impl Iterator<Item = SlotId> + 'a {
        let (block, offset) = self.position(text, inclusive, key_of);
        let first = self
            .blocks
            .get(block)
            .map_or(&[][..], |slots| &slots[offset..]);
        let rest = self.blocks.get(block + 1..).unwrap_or(&[]);
        first.iter().chain(rest.iter().flatten()).copied()
    }

    fn iter(&self) -> impl Iterator<Item = SlotId> + '_ {
        self.blocks.iter().flatten().copied()
    }

    /// Checks the invariants above; panics naming the first one broken. Ids in `leaving` (keys
    /// gone, ids not yet taken out: `Shard::flush_unlisting`) are passed over: their keys
    /// cannot be read, and a fence of one stays until the pass. O(n): for tests.
    fn check_invariants<'k>(&self, leaving: &SlotSet, key_of: impl Fn(SlotId) -> &'k [u8]) {
        assert!(
            self.blocks
                .iter()
                .all(|slots| !slots.is_empty() && slots.len() <= BLOCK_MAX),
            "a block is empty or over {BLOCK_MAX}"
        );
        for (slots, &kept) in self.blocks.iter().zip(&self.fences) {
            let last = *slots.last().expect("not empty");
            if !leaving.contains(last) {
                assert_eq!(kept, fence(key_of(last)), "a block's fence");
            }
        }
        assert_eq!(self.fences.len(), self.blocks.len(), "a fence per block");
        let keys: Vec<&[u8]> = (self.iter())
            .filter(|&slot| !leaving.contains(slot))
            .map(&key_of)
            .collect();
        if let Some(pair) = keys.windows(2).find(|pair| pair[0] >= pair[1]) {
            let (first, then) = (pair[0].escape_ascii(), pair[1].escape_ascii());
            panic!("sorted slots out of order: {first} then {then}");
        }
    }
}

/// Bytes of a key [`sort_by_key`] keeps beside its id.
const PREFIX_BYTES: usize = 32;

/// Sorts `ids` (slot ids, each with a value carried along) by their keys (byte order): by the first [`PREFIX_BYTES`] bytes of each key,
/// read once and kept beside its id, then, only among ids whose keys share those bytes, by
/// the whole keys.
fn sort_by_key<'k, T: Copy>(ids: &mut [(SlotId, T)], key_of: impl Fn(SlotId) -> &'k [u8] + Copy) {
    let prefix = |slot: SlotId| {
        let mut first = [0u8; PREFIX_BYTES];
        let bytes = key_of(slot);
        let n = bytes.len().min(PREFIX_BYTES);
        first[..n].copy_from_slice(&bytes[..n]);
        first
    };
    let mut tagged: Vec<([u8; PREFIX_BYTES], (SlotId, T))> =
        ids.iter().map(|&item| (prefix(item.0), item)).collect();
    tagged.sort_unstable_by_key(|a| a.0);
    // Equal prefixes (zero-padded) leave the order open: keys that share their first bytes,
    // or a key that is a prefix of another. Whole keys decide there.
    for run in tagged.chunk_by_mut(|a, b| a.0 == b.0) {
        if run.len() > 1 {
            run.sort_unstable_by(|a, b| key_of(a.1 .0).cmp(key_of(b.1 .0)));
        }
    }
    for (id, (_, item)) in ids.iter_mut().zip(tagged) {
        *id = item;
    }
}

/// Alive keys in order, overall and per service, as slot ids (the keys stay in the entries;
/// every call is given `key_of`, which reads a slot's key).
#[derive(Debug, Default)]
pub(super) struct OrderedIndex {
    by_key: SortedSlots,
    /// By service id; only keys that have a service.
    by_service: Vec<SortedSlots>,
}

impl OrderedIndex {
    /// The index of `alive` (each key's slot and service) built at once: the ids sorted by
    /// key, then cut into blocks, instead of one insertion each. Each insertion searches the
    /// list, reading ~10-20 keys at random through their slots; the sort reads each key once in
    /// slot order and compares the first [`PREFIX_BYTES`] bytes kept beside its id (recovery,
    /// where every key arrives at once: `Registry::defer_listing`).
    pub fn build<'k>(
        alive: impl Iterator<Item = (SlotId, ServiceId)>,
        key_of: impl Fn(SlotId) -> &'k [u8] + Copy,
    ) -> Self {
        let mut alive: Vec<(SlotId, ServiceId)> = alive.collect();
        sort_by_key(&mut alive, key_of);
        let ids: Vec<SlotId> = alive.iter().map(|&(slot, _)| slot).collect();
        let mut by_service: Vec<Vec<SlotId>> = Vec::new();
        for &(slot, service) in alive.iter().filter(|(_, service)| !service.is_none()) {
            if by_service.len() <= service.index() {
                by_service.resize_with(service.index() + 1, Vec::new);
            }
            by_service[service.index()].push(slot);
        }
        Self {
            by_key: SortedSlots::from_sorted(&ids, key_of),
            by_service: (by_service.iter())
                .map(|ids| SortedSlots::from_sorted(ids, key_of))
                .collect(),
        }
    }

    pub fn insert<'k>(
        &mut self,
        slot: SlotId,
        service: ServiceId,
        key_of: impl Fn(SlotId) -> &'k [u8],
    ) {
        self.by_key.insert(slot, &key_of);
        if !service.is_none() {
            if self.by_service.len() <= service.index() {
                self.by_service
                    .resize_with(service.index() + 1, SortedSlots::default);
            }
            self.by_service[service.index()].insert(slot, key_of);
        }
    }

    pub fn remove<'k>(
        &mut self,
        slot: SlotId,
        service: ServiceId,
        key_of: impl Fn(SlotId) -> &'k [u8],
    ) {
        self.by_key.remove(slot, &key_of);
        if !service.is_none() {
            self.by_service[service.index()].remove(slot, key_of);
        }
    }

    /// Takes out every id in `gone`, whose keys have the services `services` (see
    /// [`SortedSlots::remove_all`]).
    pub fn remove_all<'k>(
        &mut self,
        gone: &SlotSet,
        services: &[ServiceId],
        key_of: impl Fn(SlotId) -> &'k [u8],
    ) {
        self.by_key.remove_all(gone, &key_of);
        for service in services {
            if let Some(list) = self.by_service.get_mut(service.index()) {
                list.remove_all(gone, &key_of);
            }
        }
    }

    /// Checks that the index holds exactly `alive` (every alive slot and its service) and the
    /// ids of `leaving` (whose keys are gone and wait for [`OrderedIndex::remove_all`]), each
    /// list in key order; panics naming the difference. O(n log n): for tests.
    pub fn check_invariants<'k>(
        &self,
        alive: impl Iterator<Item = (SlotId, ServiceId)>,
        leaving: &SlotSet,
        key_of: impl Fn(SlotId) -> &'k [u8] + Copy,
    ) {
        let mut by_key = Vec::new();
        let mut by_service: Vec<Vec<SlotId>> = vec![Vec::new(); self.by_service.len()];
        for (slot, service) in alive {
            by_key.push(slot);
            if !service.is_none() {
                let list = by_service
                    .get_mut(service.index())
                    .unwrap_or_else(|| panic!("service {service:?} has no ordered list"));
                list.push(slot);
            }
        }
        let listed_leaving = (self.by_key.iter())
            .filter(|&slot| leaving.contains(slot))
            .count();
        assert_eq!(
            listed_leaving,
            leaving.len(),
            "ids waiting to leave the listing that it does not hold"
        );
        let check = |list: &SortedSlots, mut expected: Vec<SlotId>, what: &str| {
            list.check_invariants(leaving, key_of);
            expected.sort_unstable_by_key(|&slot| key_of(slot));
            let listed: Vec<SlotId> = (list.iter())
                .filter(|&slot| !leaving.contains(slot))
                .collect();
            assert!(
                listed == expected,
                "the ordered index {what} differs from the alive keys: {} listed, {} alive",
                listed.len(),
                expected.len()
            );
        };
        check(&self.by_key, by_key, "of all keys");
        for (list, expected) in self.by_service.iter().zip(by_service) {
            check(list, expected, "of a service");
        }
    }

    /// The slots of the keys matching `filter`, in key order, from the cursor on, for the
    /// caller to take from.
    pub fn scan<'a, F>(
        &'a self,
        filter: &'a ListFilter,
        key_of: F,
    ) -> impl Iterator<Item = SlotId> + 'a
    where
        F: Fn(SlotId) -> &'a [u8] + Copy + 'a,
    {
        let list = match filter.service {
            None => Some(&self.by_key),
            Some(service) => self.by_service.get(service.index()),
        };
        let (text, inclusive) = filter.start();
        list.into_iter()
            .flat_map(move |list| list.from(text.as_bytes(), inclusive, key_of))
            .take_while(move |&slot| !filter.past_prefix(key_of(slot)))
            .filter(move |&slot| filter.matches_prefix(key_of(slot)))
    }
}

/// A set of slot ids as a bitmap (a bit per id up to the largest inserted): the keys of a mass
/// expiry's sweep steps that wait for the listing's next pass (`Shard::flush_unlisting`).
/// Cleared, it keeps its memory for the next mass expiry.
#[derive(Debug, Default)]
pub(super) struct SlotSet {
    words: Vec<u64>,
    len: usize,
}

impl SlotSet {
    pub fn insert(&mut self, slot: SlotId) {
        let (word, bit) = (slot as usize / 64, slot % 64);
        if word >= self.words.len() {
            self.words.resize(word + 1, 0);
        }
        self.len += usize::from(self.words[word] & (1 << bit) == 0);
        self.words[word] |= 1 << bit;
    }

    pub fn contains(&self, slot: SlotId) -> bool {
        let (word, bit) = (slot as usize / 64, slot % 64);
        self.words
            .get(word)
            .is_some_and(|word| word & (1 << bit) != 0)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn clear(&mut self) {
        self.words.iter_mut().for_each(|word| *word = 0);
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Key;
    use proptest::prelude::{Just, Strategy};

    fn keys(index: &OrderedIndex, names: &[Key], filter: &ListFilter) -> Vec<String> {
        let key_of = |slot: SlotId| names[slot as usize].as_bytes();
        index
            .scan(filter, key_of)
            .map(|slot| names[slot as usize].to_string())
            .collect()
    }

    #[test]
    fn scans_respect_prefix_cursor_and_service() {
        let mut index = OrderedIndex::default();
        let web = ServiceId::default();
        let names: Vec<Key> = ["ba", "abc", "a", "b", "ab"]
            .into_iter()
            .map(|key| Key::new(key).unwrap())
            .collect();
        for slot in 0..names.len() as SlotId {
            index.insert(slot, web, |slot| names[slot as usize].as_bytes());
        }
        let filter = |prefix: Option<&str>, after: Option<&str>| ListFilter {
            service: None,
            prefix: prefix.map(String::from),
            after: after.map(String::from),
            held_only: false,
        };
        let keys = |filter: &ListFilter| keys(&index, &names, filter);
        assert_eq!(keys(&filter(None, None)), ["a", "ab", "abc", "b", "ba"]);
        assert_eq!(keys(&filter(Some("a"), None)), ["a", "ab", "abc"]);
        assert_eq!(keys(&filter(Some("a"), Some("ab"))), ["abc"]);
        assert_eq!(keys(&filter(Some("b"), Some("a"))), ["b", "ba"]);
        assert_eq!(keys(&filter(None, Some("b"))), ["ba"]);
        assert_eq!(keys(&filter(Some("c"), None)), Vec::<String>::new());
    }

    proptest::proptest! {
        // Each case checks the whole list after every removal (O(n^2)): fewer cases suffice.
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]

        /// Filling blocks past a split and emptying them again, in any order: the list stays
        /// sorted and compact after every step, and ends with no block at all.
        #[test]
        fn sorted_slots_fill_and_drain_in_any_order(
            inserts in Just((0..1200u32).collect::<Vec<_>>()).prop_shuffle(),
            removals in Just((0..1200u32).collect::<Vec<_>>()).prop_shuffle(),
            long in proptest::bool::ANY,
        ) {
            // Long keys share their first 8 bytes with many others (the blocks' fences tie).
            let name = |n: u32| match long {
                true => format!("svc-{:03}/instance-{n:010}", n % 7),
                false => format!("k{n:05}"),
            };
            let names: Vec<Key> = (0..1200u32).map(|n| Key::new(&name(n)).unwrap()).collect();
            let key_of = |slot: SlotId| names[slot as usize].as_bytes();
            let mut list = SortedSlots::default();
            for (step, &slot) in inserts.iter().enumerate() {
                list.insert(slot, key_of);
                if step % 50 == 0 {
                    list.check_invariants(&SlotSet::default(), key_of);
                }
            }
            list.check_invariants(&SlotSet::default(), key_of);
            let mut expected: Vec<SlotId> = (0..1200).collect();
            expected.sort_by_key(|&slot| key_of(slot));
            proptest::prop_assert_eq!(list.iter().collect::<Vec<_>>(), expected);
            for &slot in &removals {
                list.remove(slot, key_of);
                list.check_invariants(&SlotSet::default(), key_of);
            }
            proptest::prop_assert!(list.blocks.is_empty());
        }

        /// An index built at once (recovery) lists what inserting each key would, overall and
        /// per service, and stays usable: keys sharing more than the sort's kept prefix, keys
        /// that are prefixes of others, in any order.
        #[test]
        fn building_an_index_at_once_equals_inserting_each_key(
            order in Just((0..1500u32).collect::<Vec<_>>()).prop_shuffle(),
            kind in 0..3u8,
            services in proptest::collection::vec(0..4u16, 1500),
        ) {
            let name = |n: u32| match kind {
                0 => format!("k{n}"),
                1 => format!("svc-{:03}/instance-{n:010}", n % 7),
                _ => format!("a-common-prefix-longer-than-thirty-two-bytes/{}", n * 7919 % 1500),
            };
            let names: Vec<Key> = (0..1500u32).map(|n| Key::new(&name(n)).unwrap()).collect();
            let key_of = |slot: SlotId| names[slot as usize].as_bytes();
            let service = |slot: SlotId| ServiceId::from_index(services[slot as usize]);
            let (built_from, inserted_after) = order.split_at(1200);
            let alive = built_from.iter().map(|&slot| (slot, service(slot)));
            let mut built = OrderedIndex::build(alive.clone(), key_of);
            built.check_invariants(alive, &SlotSet::default(), key_of);
            let mut inserted = OrderedIndex::default();
            for &slot in built_from {
                inserted.insert(slot, service(slot), key_of);
            }
            for &slot in inserted_after {
                built.insert(slot, service(slot), key_of);
                inserted.insert(slot, service(slot), key_of);
            }
            for &slot in &built_from[..300] {
                built.remove(slot, service(slot), key_of);
                inserted.remove(slot, service(slot), key_of);
            }
            let alive = order[300..].iter().map(|&slot| (slot, service(slot)));
            built.check_invariants(alive, &SlotSet::default(), key_of);
            for service in [None, Some(ServiceId::from_index(2))] {
                let filter = ListFilter { service, ..ListFilter::default() };
                proptest::prop_assert_eq!(keys(&built, &names, &filter), keys(&inserted, &names, &filter));
            }
        }

        /// Removing sets of ids in one pass, between single insertions and removals: the same
        /// order and compact blocks as removing them one by one.
        #[test]
        fn removing_a_set_in_one_pass_equals_removing_each(
            inserts in Just((0..1200u32).collect::<Vec<_>>()).prop_shuffle(),
            batches in proptest::collection::vec(
                proptest::collection::btree_set(0..1200u32, 0..400), 1..6),
            long in proptest::bool::ANY,
        ) {
            // Long keys share their first 8 bytes with many others (the blocks' fences tie).
            let name = |n: u32| match long {
                true => format!("svc-{:03}/instance-{n:010}", n % 7),
                false => format!("k{n:05}"),
            };
            let names: Vec<Key> = (0..1200u32).map(|n| Key::new(&name(n)).unwrap()).collect();
            let key_of = |slot: SlotId| names[slot as usize].as_bytes();
            let (mut batched, mut single) = (SortedSlots::default(), SortedSlots::default());
            for &slot in &inserts {
                batched.insert(slot, key_of);
                single.insert(slot, key_of);
            }
            let mut listed: std::collections::BTreeSet<SlotId> = inserts.iter().copied().collect();
            let mut gone = SlotSet::default();
            for batch in batches {
                gone.clear();
                let present: Vec<SlotId> = batch.iter().copied().filter(|slot| listed.contains(slot)).collect();
                for slot in present {
                    gone.insert(slot);
                    single.remove(slot, key_of);
                    listed.remove(&slot);
                }
                batched.remove_all(&gone, key_of);
                batched.check_invariants(&SlotSet::default(), key_of);
                proptest::prop_assert_eq!(batched.iter().collect::<Vec<_>>(), single.iter().collect::<Vec<_>>());
                // The list stays usable: insertions land in order.
                if let Some(&back) = batch.iter().next() {
                    batched.insert(back, key_of);
                    single.insert(back, key_of);
                    listed.insert(back);
                }
            }
            batched.check_invariants(&SlotSet::default(), key_of);
            single.check_invariants(&SlotSet::default(), key_of);
            let mut expected: Vec<SlotId> = listed.into_iter().collect();
            expected.sort_by_key(|&slot| key_of(slot));
            proptest::prop_assert_eq!(batched.iter().collect::<Vec<_>>(), expected);
        }
    }

    proptest::proptest! {
        /// Against a sorted set of the same keys, through inserts and removals that split and
        /// merge blocks: the same order after every step, and scans from any start agree.
        #[test]
        fn sorted_slots_match_a_sorted_set(
            ops in proptest::collection::vec((proptest::bool::ANY, 0u16..2000), 1..1500),
            from in 0u16..2000,
        ) {
            let names: Vec<Key> = (0..2000u16).map(|n| Key::new(&format!("k{n:05}")).unwrap()).collect();
            let key_of = |slot: SlotId| names[slot as usize].as_bytes();
            let mut list = SortedSlots::default();
            let mut model = std::collections::BTreeSet::new();
            for (insert, n) in ops {
                let slot = SlotId::from(n);
                match (insert, model.contains(&slot)) {
                    (true, false) => { list.insert(slot, key_of); model.insert(slot); }
                    (false, true) => { list.remove(slot, key_of); model.remove(&slot); }
                    _ => {}
                }
            }
            list.check_invariants(&SlotSet::default(), key_of);
            let listed: Vec<SlotId> = list.iter().collect();
            proptest::prop_assert_eq!(&listed, &model.iter().copied().collect::<Vec<_>>());
            let text = names[from as usize].as_str();
            for inclusive in [true, false] {
                let scanned: Vec<SlotId> = list.from(text.as_bytes(), inclusive, key_of).collect();
                let expected: Vec<SlotId> = model
                    .iter()
                    .copied()
                    .filter(|&slot| if inclusive { slot >= from.into() } else { slot > from.into() })
                    .collect();
                proptest::prop_assert_eq!(scanned, expected);
            }
        }
    }
}
