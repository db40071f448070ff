//! The per-second timing wheel: a circular array of buckets, one per tick (second).
//!
//! Geometry: `n_buckets = max_ttl_s + 2`. A key whose deadline is `d` ms lives in the bucket of
//! tick `ceil(d / 1000)`. The wheel remembers the last tick it has handed out (`swept_through`,
//! written `s` below); the ticks it can hold are exactly `s + 1 ..= s + n_buckets`, which map to
//! `n_buckets` distinct buckets, so two live ticks never share a bucket.
//!
//! Why `+ 2`: a heartbeat at time `now` (with `s = floor(now_s) - 1` while the sweeper is on
//! time) asks for at most tick `floor(now_s) + 1 + max_ttl_s = s + n_buckets`: in range. A sweeper
//! that fell behind makes `s` smaller; the owner clamps later ticks to `s + n_buckets` (see
//! [`TimingWheel::clamp`]) and re-files the key when that bucket comes due, so nothing expires
//! early and no bucket is ever skipped.
//!
//! Costs: insert and remove are O(1) (a bucket is a `Vec` of [`Element`]s and each key remembers
//! its position in it: removal is a `swap_remove` whose moved element is reported back so the
//! owner can fix that key's position). Detaching the due bucket is O(1) (`mem::take`); the owner
//! then spends work only on the elements it finds there.
//!
//! An element carries its deadline's millisecond within the tick (6 bytes in all): when the
//! tick's last second begins, the owner files each element under its millisecond from the
//! element alone. Reading each key's entry there instead was a cache miss per key, ~10 % of a
//! mass expiry (the entry is read once more anyway, when the key expires).
//!
//! A bucket may also hold *stale* slot ids: the owner may leave a renewed key's old element in
//! place rather than remove it (see `registry::shard` for when and why). The owner marks the
//! position it leaves ([`TimingWheel::mark_stale`]), one bit per position beside the bucket, so
//! that the sweeper drops a marked element without reading its key's entry. With the reads,
//! the sweep was 3-8 % of a renewing fleet's cycles at 100k-1M keys, and a renewal took 5-24 %
//! longer at 10k-1M (BENCHMARKS.md, fifteenth session). The bits of a bucket are 1/48 of its
//! elements' bytes, and a fleet's renewals set those of one bucket at a time (the one their
//! previous deadlines fall in), so the bits being written stay in the cache. An element that is not
//! marked may still be stale (its key's entry says so): a mark is a shortcut, never the only
//! word.
//!
//! The wheel is pure: it is handed ticks, never reads a clock, knows nothing of keys. Its owner
//! (`registry::shard`) keeps each key's `(tick, pos)` and must call [`TimingWheel::remove`] only
//! for a tick the wheel still holds ([`TimingWheel::holds`]); slots of detached buckets belong to
//! the sweeper.

/// Index of an entry in its shard's slot table.
pub type SlotId = u32;
/// Seconds since the registry's epoch. `u32` lasts 136 years.
pub type Tick = u32;

/// [`Element::ms`] of an element filed at the horizon, whose deadline is past its tick's second
/// (see [`TimingWheel::clamp`]): the owner reads the deadline from the key and files it again.
const PAST_THE_TICK: u16 = u16::MAX;

/// One element of a bucket: a slot, and where its deadline falls in the bucket's tick.
/// Packed to 6 bytes (a bucket holds one per key, stale ones too).
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C, packed(2))]
pub struct Element {
    slot: SlotId,
    /// The deadline in ms after the tick's second began, `1..=1000`; 0 for a deadline at or
    /// before that (filed in the next tick to sweep because its own was already swept), or
    /// [`PAST_THE_TICK`].
    ms: u16,
}

impl Element {
    /// The element of `slot`, due at `deadline_ms`, in the bucket of `tick`.
    pub fn new(tick: Tick, slot: SlotId, deadline_ms: u64) -> Self {
        let second_began_ms = u64::from(tick.saturating_sub(1)) * 1000;
        let ms = match deadline_ms.saturating_sub(second_began_ms) {
            ms @ 0..=1000 => ms as u16,
            _ => PAST_THE_TICK,
        };
        Self { slot, ms }
    }

    pub fn slot(self) -> SlotId {
        self.slot
    }

    /// For an element of the bucket of `tick`: the deadline it was filed with, in epoch ms, or
    /// when that fell before the tick's second, the second's start (so never earlier than the
    /// deadline). `None` for an element filed at the horizon, whose deadline is later.
    pub fn deadline_ms(self, tick: Tick) -> Option<u64> {
        let ms = self.ms;
        (ms != PAST_THE_TICK).then(|| u64::from(tick.saturating_sub(1)) * 1000 + u64::from(ms))
    }
}

impl std::fmt::Debug for Element {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (slot, ms) = (self.slot, self.ms);
        write!(f, "{slot}@{ms}")
    }
}

/// A bucket at or below this capacity is never shrunk (so a small one does not reallocate as it
/// fills and empties).
const MIN_SHRINK_CAPACITY: usize = 64;

/// One bucket per tick in a circular array; see the module documentation for the geometry.
#[derive(Debug)]
pub struct TimingWheel {
    /// `buckets[tick % n_buckets]` holds the slots scheduled at `tick`, in no particular order.
    /// Invariant: every slot in a bucket was placed there for a tick in `swept_through + 1 ..=
    /// swept_through + n_buckets`, and its owner records that tick and its position.
    buckets: Box<[Vec<Element>]>,
    /// The last tick whose bucket was detached. Ticks up to it are in the sweeper's hands.
    swept_through: Tick,
    /// `live[tick % n_buckets]`: the elements of that bucket that are their slot's current one
    /// (the owner says which are not: [`TimingWheel::forget`]). Known before a bucket is swept,
    /// so the mass-expiry guard can count what is about to expire in O(1).
    live: Box<[u32]>,
    /// `marks[tick % n_buckets]`: the positions of that bucket whose element its owner left
    /// stale. Invariant: a marked element is not its slot's current one, and no bit is set at
    /// or past the bucket's length (so a position a push reuses starts clear).
    marks: Box<[StaleMarks]>,
    /// The marks of the last bucket detached (`swept_through`'s), kept until the next detach:
    /// its elements are in the sweeper's hands, and may still be left stale meanwhile.
    detached_marks: StaleMarks,
}

/// One bit per position of a bucket: set when the element there was left stale.
#[derive(Debug, Default)]
struct StaleMarks {
    words: Vec<u64>,
}

impl StaleMarks {
    fn word_and_bit(pos: u32) -> (usize, u64) {
        ((pos / 64) as usize, 1 << (pos % 64))
    }

    /// Makes room for positions below `len`.
    fn cover(&mut self, len: usize) {
        let words = len.div_ceil(64);
        if self.words.len() < words {
            self.words.resize(words, 0);
        }
    }

    fn set(&mut self, pos: u32, marked: bool) {
        let (word, bit) = Self::word_and_bit(pos);
        if let Some(word) = self.words.get_mut(word) {
            *word = if marked { *word | bit } else { *word & !bit };
        }
    }

    fn is_marked(&self, pos: u32) -> bool {
        let (word, bit) = Self::word_and_bit(pos);
        self.words.get(word).is_some_and(|word| word & bit != 0)
    }

    /// The element at `from` (the last position) moved to `pos`: its mark goes with it.
    fn move_mark(&mut self, from: u32, pos: u32) {
        let moved = self.is_marked(from);
        self.set(from, false);
        self.set(pos, moved);
    }

    /// Lets go of the words past a bucket of `len` elements (all clear) and of spare capacity.
    fn shrink_to(&mut self, len: usize) {
        self.words.truncate(len.div_ceil(64));
        self.words.shrink_to(self.words.len() * 2);
    }

    /// Whether a bit is set at or past `len`.
    fn any_at_or_past(&self, len: usize) -> bool {
        (len as u32..self.words.len() as u32 * 64).any(|pos| self.is_marked(pos))
    }
}

impl TimingWheel {
    /// A wheel for TTLs up to `max_ttl_s` seconds, starting with every tick up to `start`
    /// already swept.
    pub fn new(max_ttl_s: u32, start: Tick) -> Self {
        let n_buckets = max_ttl_s as usize + 2;
        Self {
            buckets: (0..n_buckets).map(|_| Vec::new()).collect(),
            swept_through: start,
            live: vec![0; n_buckets].into_boxed_slice(),
            marks: (0..n_buckets).map(|_| StaleMarks::default()).collect(),
            detached_marks: StaleMarks::default(),
        }
    }

    pub fn n_buckets(&self) -> usize {
        self.buckets.len()
    }

    /// The last tick whose bucket was detached.
    pub fn swept_through(&self) -> Tick {
        self.swept_through
    }

    /// The tick whose bucket holds a deadline of `deadline_ms` (ms since the epoch): `ceil(d/1000)`.
    pub fn tick_of(deadline_ms: u64) -> Tick {
        let tick = deadline_ms.div_ceil(1000);
        Tick::try_from(tick).unwrap_or(Tick::MAX)
    }

    /// Brings `tick` into the range the wheel can hold: never before the next tick to sweep (a
    /// deadline already due is swept next), never past the horizon (the key is re-filed then).
    pub fn clamp(&self, tick: Tick) -> Tick {
        let horizon = self.swept_through.saturating_add(self.n_buckets() as Tick);
        tick.clamp(self.swept_through + 1, horizon)
    }

    /// Whether `tick`'s bucket is still in the wheel (not yet detached by the sweeper).
    pub fn holds(&self, tick: Tick) -> bool {
        tick > self.swept_through
    }

    /// Adds `slot`, due at `deadline_ms`, to the bucket of `tick` (which must be in range: see
    /// [`Self::clamp`]) and returns its position there.
    pub fn insert(&mut self, tick: Tick, slot: SlotId, deadline_ms: u64) -> u32 {
        debug_assert_eq!(self.clamp(tick), tick, "tick {tick} outside the wheel");
        let bucket_idx = self.bucket_idx(tick);
        self.live[bucket_idx] += 1;
        let bucket = &mut self.buckets[bucket_idx];
        bucket.push(Element::new(tick, slot, deadline_ms));
        self.marks[bucket_idx].cover(bucket.len());
        (bucket.len() - 1) as u32
    }

    /// The element at `pos` in the bucket of `tick` (which the wheel must hold) is now due at
    /// `deadline_ms`, still in that tick: its key was renewed within the same second.
    pub fn refile(&mut self, tick: Tick, pos: u32, deadline_ms: u64) {
        debug_assert!(self.holds(tick), "tick {tick} was already detached");
        let element = &mut self.bucket_mut(tick)[pos as usize];
        *element = Element::new(tick, element.slot(), deadline_ms);
    }

    /// Removes the slot at `pos` in the bucket of `tick`. Returns the slot that was moved into
    /// `pos` to fill the hole, if any, with the position it came from: if that was the moved
    /// slot's recorded position, its owner must record the new one.
    pub fn remove(&mut self, tick: Tick, pos: u32) -> Option<(SlotId, u32)> {
        debug_assert!(self.holds(tick), "tick {tick} was already detached");
        let bucket_idx = self.bucket_idx(tick);
        let bucket = &mut self.buckets[bucket_idx];
        let marks = &mut self.marks[bucket_idx];
        bucket.swap_remove(pos as usize);
        marks.move_mark(bucket.len() as u32, pos);
        // Give memory back as a bucket empties. Renewals that move every key every second fill
        // a new bucket each second and empty the previous one; kept at its peak, each of the
        // `max_ttl + 2` buckets would end up holding a whole fleet's capacity (measured: RSS
        // growing by ~5 bytes per renewal for an hour). Halving at a quarter full is amortised
        // O(1): each shrink copies at most a quarter of the capacity it frees half of.
        if bucket.capacity() > MIN_SHRINK_CAPACITY && bucket.len() * 4 <= bucket.capacity() {
            bucket.shrink_to(bucket.capacity() / 2);
            marks.shrink_to(bucket.len());
        }
        let moved = bucket.get(pos as usize)?.slot();
        Some((moved, bucket.len() as u32))
    }

    /// Detaches the bucket of the next tick, `swept_through + 1`, in O(1), and returns that tick
    /// with the elements that were scheduled at it.
    pub fn detach_next(&mut self) -> (Tick, Vec<Element>) {
        self.swept_through += 1;
        let tick = self.swept_through;
        let bucket_idx = self.bucket_idx(tick);
        self.live[bucket_idx] = 0;
        // The marks go as the elements go (`mem::take`): a bucket that was once large keeps no
        // room for them.
        self.detached_marks = std::mem::take(&mut self.marks[bucket_idx]);
        (tick, std::mem::take(self.bucket_mut(tick)))
    }

    /// The owner leaves the element at `pos` of `tick`'s bucket in place, no longer its slot's
    /// current one: marks it, so that the sweeper can drop it unread. `tick` is one the wheel
    /// holds or the one last detached (in the sweeper's hands); its bucket had an element at
    /// `pos`.
    pub fn mark_stale(&mut self, tick: Tick, pos: u32) {
        if let Some(marks) = self.marks_mut(tick) {
            marks.set(pos, true);
        }
    }

    /// Whether the element at `pos` of `tick`'s bucket (held, or the one last detached) was
    /// marked stale. `false` says nothing: an element may be stale unmarked.
    pub fn is_marked_stale(&self, tick: Tick, pos: u32) -> bool {
        self.marks(tick).is_some_and(|marks| marks.is_marked(pos))
    }

    /// How many of the `len` elements from `first_pos` of `tick`'s bucket (held, or the one
    /// last detached) are marked stale.
    pub fn count_marked_stale(&self, tick: Tick, first_pos: usize, len: usize) -> usize {
        let Some(marks) = self.marks(tick) else {
            return 0;
        };
        (first_pos..first_pos + len)
            .filter(|&pos| marks.is_marked(pos as u32))
            .count()
    }

    /// The marks of `tick`'s bucket: held, or the one last detached.
    fn marks(&self, tick: Tick) -> Option<&StaleMarks> {
        if self.holds(tick) {
            Some(&self.marks[self.bucket_idx(tick)])
        } else if tick == self.swept_through {
            Some(&self.detached_marks)
        } else {
            None
        }
    }

    /// [`Self::marks`], to change.
    fn marks_mut(&mut self, tick: Tick) -> Option<&mut StaleMarks> {
        if self.holds(tick) {
            let bucket_idx = self.bucket_idx(tick);
            Some(&mut self.marks[bucket_idx])
        } else if tick == self.swept_through {
            Some(&mut self.detached_marks)
        } else {
            None
        }
    }

    /// Panics unless every bucket's marks leave its length and past clear (the owner checks
    /// that each marked element is stale: it knows which slot is current where).
    pub fn check_invariants(&self) {
        for tick in self.held_ticks() {
            let bucket_idx = self.bucket_idx(tick);
            assert!(
                !self.marks[bucket_idx].any_at_or_past(self.buckets[bucket_idx].len()),
                "a mark past the end of tick {tick}'s bucket"
            );
        }
    }

    /// The element of `tick` its owner placed is no longer current (renewed, moved, removed):
    /// one fewer live element there. Ticks already detached are the sweeper's; nothing to do.
    pub fn forget(&mut self, tick: Tick) {
        if self.holds(tick) {
            let bucket_idx = self.bucket_idx(tick);
            debug_assert!(
                self.live[bucket_idx] > 0,
                "forgot more than was placed at {tick}"
            );
            self.live[bucket_idx] -= 1;
        }
    }

    /// The live elements of a tick the wheel holds (0 for one it does not).
    pub fn live_count(&self, tick: Tick) -> u32 {
        if self.holds(tick) && tick <= self.swept_through.saturating_add(self.n_buckets() as Tick) {
            self.live[self.bucket_idx(tick)]
        } else {
            0
        }
    }

    /// Number of slots in the bucket of `tick` (for tests and debug checks).
    pub fn bucket_len(&self, tick: Tick) -> usize {
        self.buckets[self.bucket_idx(tick)].len()
    }

    /// The elements in the bucket of `tick`, which the wheel must hold; an element's index is
    /// its position (for the owner's invariant checks).
    pub fn bucket(&self, tick: Tick) -> &[Element] {
        debug_assert!(self.holds(tick), "tick {tick} was already detached");
        &self.buckets[self.bucket_idx(tick)]
    }

    /// Every tick the wheel holds, in order: `swept_through + 1 ..= swept_through + n_buckets`.
    pub fn held_ticks(&self) -> impl Iterator<Item = Tick> {
        let first = self.swept_through.saturating_add(1);
        let last = self.swept_through.saturating_add(self.n_buckets() as Tick);
        first..=last
    }

    fn bucket_idx(&self, tick: Tick) -> usize {
        tick as usize % self.buckets.len()
    }

    fn bucket_mut(&mut self, tick: Tick) -> &mut Vec<Element> {
        let bucket_idx = self.bucket_idx(tick);
        &mut self.buckets[bucket_idx]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_emptied_by_removals_gives_its_memory_back() {
        let mut wheel = TimingWheel::new(10, 0);
        for slot in 0..100_000 {
            wheel.insert(5, slot, 4_500);
        }
        let peak = wheel.buckets[5].capacity();
        while wheel.bucket_len(5) > 10 {
            let last = wheel.bucket_len(5) as u32 - 1;
            wheel.remove(5, last);
        }
        let left = wheel.buckets[5].capacity();
        assert!(left <= MIN_SHRINK_CAPACITY * 2, "{left} of {peak} kept");
        assert!((wheel.bucket(5).iter().map(|element| element.slot())).eq(0..10));
    }

    /// A mark stays with its element: it moves with the element that fills a hole, a position
    /// a push reuses starts clear, and a detached bucket's marks go with it until the next
    /// detach.
    #[test]
    fn a_stale_mark_follows_its_element() {
        let mut wheel = TimingWheel::new(10, 0);
        for slot in 0..130 {
            wheel.insert(5, slot, 4_500);
        }
        wheel.mark_stale(5, 129);
        wheel.mark_stale(5, 64);
        // The last element (marked) fills the hole at 3.
        assert_eq!(wheel.remove(5, 3), Some((129, 129)));
        assert!(wheel.is_marked_stale(5, 3));
        assert!(!wheel.is_marked_stale(5, 129));
        // A push takes position 129 again, clear.
        assert_eq!(wheel.insert(5, 200, 4_600), 129);
        assert!(!wheel.is_marked_stale(5, 129));
        // The last element (clear) fills a marked hole: the mark goes.
        assert_eq!(wheel.remove(5, 64), Some((200, 129)));
        assert!(!wheel.is_marked_stale(5, 64));
        wheel.check_invariants();
        for _ in 1..5 {
            wheel.detach_next();
        }
        let (tick, elements) = wheel.detach_next();
        assert_eq!((tick, elements.len()), (5, 129));
        assert!(wheel.is_marked_stale(5, 3));
        wheel.mark_stale(5, 7); // left stale in its last second
        assert!(wheel.is_marked_stale(5, 7));
        wheel.detach_next();
        assert!(!wheel.is_marked_stale(5, 3), "tick 5 is done");
        wheel.check_invariants();
    }

    #[test]
    fn tick_of_rounds_up_to_the_next_second() {
        let check =
            |deadline_ms: u64, tick: Tick| assert_eq!(TimingWheel::tick_of(deadline_ms), tick);
        check(0, 0);
        check(1, 1);
        check(999, 1);
        check(1000, 1);
        check(1001, 2);
        check(3_600_000, 3600);
    }

    #[test]
    fn clamp_keeps_ticks_between_the_next_sweep_and_the_horizon() {
        let wheel = TimingWheel::new(10, 100); // 12 buckets, holds 101..=112
        let check = |tick: Tick, expect: Tick| assert_eq!(wheel.clamp(tick), expect, "tick {tick}");
        check(50, 101);
        check(100, 101);
        check(101, 101);
        check(112, 112);
        check(113, 112);
        check(Tick::MAX, 112);
    }

    #[test]
    fn the_first_and_last_bucket_of_the_horizon_are_distinct() {
        let mut wheel = TimingWheel::new(10, 100);
        wheel.insert(101, 1, 100_500);
        wheel.insert(112, 2, 111_500);
        assert_eq!(wheel.bucket_len(101), 1);
        assert_eq!(wheel.bucket_len(112), 1);
        let (tick, elements) = wheel.detach_next();
        assert_eq!((tick, elements.len(), elements[0].slot()), (101, 1, 1));
    }

    #[test]
    fn remove_reports_the_slot_that_filled_the_hole() {
        let mut wheel = TimingWheel::new(10, 0);
        assert_eq!(wheel.insert(5, 10, 4_100), 0);
        assert_eq!(wheel.insert(5, 11, 4_200), 1);
        assert_eq!(wheel.insert(5, 12, 4_300), 2);
        assert_eq!(wheel.remove(5, 0), Some((12, 2)));
        assert_eq!(wheel.remove(5, 1), None); // 11 was last: nothing moves
        assert_eq!(wheel.bucket_len(5), 1);
    }

    #[test]
    fn detaching_walks_every_tick_in_order_across_the_wrap_around() {
        let mut wheel = TimingWheel::new(1, 0); // 3 buckets
        for expected in 1..=10 {
            let tick = wheel.clamp(expected + 2);
            wheel.insert(tick, tick, u64::from(tick) * 1000);
            let (detached, elements) = wheel.detach_next();
            assert_eq!(detached, expected);
            assert!(
                (elements.iter()).all(|element| element.slot() == expected),
                "{elements:?}"
            );
        }
    }

    /// An element gives back the deadline it was filed with when that falls in its tick's
    /// second; the second's start when it fell before (never earlier than the deadline); and
    /// nothing when it lies past the tick (filed at the horizon).
    #[test]
    fn an_element_carries_its_deadline_within_the_tick() {
        let mut wheel = TimingWheel::new(10, 100); // holds 101..=112
        for (deadline_ms, expected) in [
            (100_001, Some(100_001)),
            (100_999, Some(100_999)),
            (101_000, Some(101_000)),
            (100_000, Some(100_000)),
            (99_250, Some(100_000)),
            (0, Some(100_000)),
            (101_001, None),
            (900_000, None),
            (u64::MAX, None),
        ] {
            let pos = wheel.insert(101, 7, deadline_ms);
            let element = wheel.bucket(101)[pos as usize];
            assert_eq!(element.deadline_ms(101), expected, "deadline {deadline_ms}");
            assert_eq!(element.slot(), 7);
        }
        assert_eq!(std::mem::size_of::<Element>(), 6);
    }
}
