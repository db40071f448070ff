//! A wheel tick's keys in their last second, ordered to the millisecond.
//!
//! The per-second wheel keeps renewals O(1) by filing a key under the second its deadline falls
//! in, which alone would expire it up to a second late. When the second in which a tick's
//! deadlines fall begins, the owner detaches that tick's bucket (O(1), as before) and hands its
//! live keys to this structure: 1,000 groups, one per millisecond of that second, filled by a
//! counting-sort pass (O(1) per key, no comparison). The sweeper then expires group by group as
//! each millisecond comes due, so a wheel key expires within the millisecond, like a heap key,
//! and only keys in their last second pay anything for it.
//!
//! Geometry: for tick `t`, deadlines fall in `((t - 1) * 1000, t * 1000]` ms; the deadline
//! `(t - 1) * 1000 + g + 1` goes to group `g` (0..1000). A deadline before the second (the
//! sweeper was late) goes to group 0; the owner never hands over a deadline past the tick. All
//! of a tick's keys are handed over before any is taken out.
//!
//! Invariants: groups before `next` are processed; group `next` is processed up to `offset`;
//! `nonempty` has a bit set exactly for the groups at or after `next` with unprocessed elements;
//! `len` counts those elements. A group's elements are never early: an element of group `g`
//! is only returned once `(t - 1) * 1000 + g + 1 <= now`.
//!
//! Like the wheel it is pure (given times, never reads a clock) and knows nothing of keys: it
//! holds whatever element the owner gives it (the shard: a slot and its position in the
//! detached bucket), and the owner checks each element it gets back against the key's current
//! timer, since a key renewed during its last second leaves its element behind (stale), as in
//! the wheel. The owner hands elements over from the bucket without reading the keys, stale
//! ones too.

use super::wheel::{SlotId, Tick};

/// A wheel element handed over to the last second: the slot, and the position it had in the
/// detached bucket, which the slot's timer still records while this element is its current one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandedOver {
    pub slot: SlotId,
    pub pos: u32,
}

/// Milliseconds in a tick, one group each.
pub const GROUPS: usize = 1000;
const WORDS: usize = GROUPS.div_ceil(64);
/// A group that grew past this many elements (a mass expiry) gives its memory back once
/// processed; smaller ones keep their capacity for the next second.
const KEEP_CAPACITY: usize = 1024;

/// One tick's elements in their last second, by millisecond.
#[derive(Debug)]
pub struct LastSecond<T> {
    /// The tick whose keys it holds; meaningful while `len > 0`.
    tick: Tick,
    groups: Box<[Vec<T>]>,
    /// Bit `g`: group `g` has unprocessed elements (lets the next due millisecond be found
    /// without walking 1,000 groups).
    nonempty: [u64; WORDS],
    /// The first group not fully processed, and how far into it processing got.
    next: usize,
    offset: usize,
    /// Unprocessed elements.
    len: usize,
}

impl<T> Default for LastSecond<T> {
    fn default() -> Self {
        Self {
            tick: 0,
            groups: (0..GROUPS).map(|_| Vec::new()).collect(),
            nonempty: [0; WORDS],
            next: 0,
            offset: 0,
            len: 0,
        }
    }
}

impl<T: Copy> LastSecond<T> {
    /// Starts taking the keys of `tick`. The previous tick's keys must all have been taken out.
    pub fn begin(&mut self, tick: Tick) {
        debug_assert_eq!(self.len, 0, "tick {} still has keys", self.tick);
        self.tick = tick;
        self.next = 0;
        self.offset = 0;
    }

    /// The tick whose keys it holds (the last one begun).
    pub fn tick(&self) -> Tick {
        self.tick
    }

    /// Unprocessed elements.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds `element`, whose deadline `deadline_ms` is at most the tick's end, to its
    /// millisecond. Every element is added before any is taken out (the hand-over precedes the
    /// expiries).
    pub fn push(&mut self, deadline_ms: u64, element: T) {
        let start_ms = self.start_ms();
        debug_assert!(
            deadline_ms <= start_ms + GROUPS as u64,
            "deadline {deadline_ms} is past tick {}",
            self.tick
        );
        debug_assert!(
            self.next == 0 && self.offset == 0,
            "added after expiries began"
        );
        // A deadline before the second (the sweeper was late) goes to the first group.
        let group = (deadline_ms.saturating_sub(start_ms + 1) as usize).min(GROUPS - 1);
        self.groups[group].push(element);
        self.nonempty[group / 64] |= 1 << (group % 64);
        self.len += 1;
    }

    /// The deadline (epoch ms) of the earliest unprocessed group, if any.
    pub fn next_due_ms(&self) -> Option<u64> {
        self.first_nonempty()
            .map(|group| self.start_ms() + group as u64 + 1)
    }

    /// Appends to `out` up to `max` elements whose millisecond has come at `now_ms`, in
    /// millisecond order, and marks them processed. Returns how many.
    pub fn take_due(&mut self, now_ms: u64, max: usize, out: &mut Vec<T>) -> usize {
        let mut taken = 0;
        while taken < max {
            let Some(group) = self.first_nonempty() else {
                break;
            };
            if self.start_ms() + group as u64 + 1 > now_ms {
                break;
            }
            // Groups before it are empty; a group part-processed would still be the first.
            debug_assert!(group == self.next || self.offset == 0);
            self.next = group;
            let elements = &self.groups[group];
            let end = elements.len().min(self.offset + (max - taken));
            out.extend_from_slice(&elements[self.offset..end]);
            taken += end - self.offset;
            self.offset = end;
            if end == elements.len() {
                self.finish_group(group);
            }
        }
        self.len -= taken;
        taken
    }

    /// Every unprocessed element (for the owner's invariant checks).
    pub fn unprocessed(&self) -> impl Iterator<Item = T> + '_ {
        self.groups
            .iter()
            .enumerate()
            .skip(self.next)
            .flat_map(move |(group, elements)| {
                let from = if group == self.next { self.offset } else { 0 };
                elements[from.min(elements.len())..].iter().copied()
            })
    }

    /// Checks the module's invariants; panics naming the first one broken.
    pub fn check_invariants(&self) {
        let mut counted = 0;
        for (group, elements) in self.groups.iter().enumerate() {
            let unprocessed = match group.cmp(&self.next) {
                std::cmp::Ordering::Less => 0,
                std::cmp::Ordering::Equal => elements.len() - self.offset.min(elements.len()),
                std::cmp::Ordering::Greater => elements.len(),
            };
            let bit = self.nonempty[group / 64] & (1 << (group % 64)) != 0;
            assert_eq!(bit, unprocessed > 0, "group {group}'s bit");
            counted += unprocessed;
        }
        assert_eq!(self.len, counted, "unprocessed elements");
    }

    /// First ms of the tick's second, exclusive: deadlines are `start_ms + 1 ..= start_ms + 1000`.
    fn start_ms(&self) -> u64 {
        u64::from(self.tick.saturating_sub(1)) * 1000
    }

    fn first_nonempty(&self) -> Option<usize> {
        self.nonempty
            .iter()
            .enumerate()
            .find(|(_, &word)| word != 0)
            .map(|(index, word)| index * 64 + word.trailing_zeros() as usize)
    }

    /// Group `group` is processed: clear it (keeping its capacity unless it was a mass expiry's).
    fn finish_group(&mut self, group: usize) {
        self.nonempty[group / 64] &= !(1 << (group % 64));
        let elements = &mut self.groups[group];
        if elements.capacity() > KEEP_CAPACITY {
            *elements = Vec::new();
        } else {
            elements.clear();
        }
        self.next = group + 1;
        self.offset = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken(last: &mut LastSecond<SlotId>, now_ms: u64, max: usize) -> Vec<SlotId> {
        let mut out = Vec::new();
        last.take_due(now_ms, max, &mut out);
        last.check_invariants();
        out
    }

    #[test]
    fn keys_come_out_in_their_millisecond_never_before() {
        let mut last = LastSecond::<SlotId>::default();
        last.begin(5); // deadlines 4001..=5000
        last.push(4_500, 1);
        last.push(4_001, 2);
        last.push(5_000, 3);
        last.push(4_500, 4);
        last.check_invariants();
        assert_eq!(last.next_due_ms(), Some(4_001));
        assert_eq!(taken(&mut last, 4_000, 100), Vec::<SlotId>::new());
        assert_eq!(taken(&mut last, 4_001, 100), vec![2]);
        assert_eq!(last.next_due_ms(), Some(4_500));
        assert_eq!(taken(&mut last, 4_499, 100), Vec::<SlotId>::new());
        assert_eq!(taken(&mut last, 4_999, 100), vec![1, 4]);
        assert_eq!(taken(&mut last, 5_000, 100), vec![3]);
        assert!(last.is_empty());
        assert_eq!(last.next_due_ms(), None);
    }

    #[test]
    fn a_budget_stops_mid_group_and_goes_on_from_there() {
        let mut last = LastSecond::<SlotId>::default();
        last.begin(2);
        for slot in 0..10 {
            last.push(1_700, slot);
        }
        last.push(1_800, 99);
        assert_eq!(taken(&mut last, 2_000, 4), vec![0, 1, 2, 3]);
        assert_eq!(taken(&mut last, 2_000, 4), vec![4, 5, 6, 7]);
        assert_eq!(last.len(), 3);
        assert_eq!(taken(&mut last, 2_000, 4), vec![8, 9, 99]);
        assert!(last.is_empty());
    }

    #[test]
    fn a_deadline_before_the_second_goes_to_its_first_millisecond() {
        let mut last = LastSecond::<SlotId>::default();
        last.begin(3);
        last.push(2_600, 1);
        last.push(1_200, 2);
        assert_eq!(last.next_due_ms(), Some(2_001));
        assert_eq!(taken(&mut last, 2_001, 10), vec![2]);
        assert_eq!(taken(&mut last, 2_600, 10), vec![1]);
    }

    #[test]
    fn the_next_tick_starts_clean() {
        let mut last = LastSecond::<SlotId>::default();
        last.begin(7);
        last.push(7_000, 1);
        assert_eq!(taken(&mut last, 7_000, 10), vec![1]);
        last.begin(8);
        last.push(7_001, 2);
        assert_eq!(last.next_due_ms(), Some(7_001));
        assert_eq!(taken(&mut last, 7_001, 10), vec![2]);
    }

    #[test]
    fn a_mass_expiry_group_gives_its_memory_back() {
        let mut last = LastSecond::<SlotId>::default();
        last.begin(1);
        for slot in 0..10_000 {
            last.push(500, slot);
        }
        assert_eq!(taken(&mut last, 1_000, usize::MAX).len(), 10_000);
        assert_eq!(last.groups[499].capacity(), 0);
    }
}
