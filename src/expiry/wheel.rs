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
//! Costs: insert and remove are O(1) (a bucket is a `Vec` of slot ids and each key remembers its
//! position in it: removal is a `swap_remove` whose moved element is reported back so the owner
//! can fix that key's position). Detaching the due bucket is O(1) (`mem::take`); the owner then
//! spends work only on the slots it finds there.
//!
//! A bucket may also hold *stale* slot ids: the owner may leave a renewed key's old element in
//! place rather than remove it (see `registry::shard` for when and why); whoever reads a bucket
//! checks each element against the key's recorded tick.
//!
//! The wheel is pure: it is handed ticks, never reads a clock, knows nothing of keys. Its owner
//! (`registry::shard`) keeps each key's `(tick, pos)` and must call [`TimingWheel::remove`] only
//! for a tick the wheel still holds ([`TimingWheel::holds`]); slots of detached buckets belong to
//! the sweeper.

/// Index of an entry in its shard's slot table.
pub type SlotId = u32;
/// Seconds since the registry's epoch. `u32` lasts 136 years.
pub type Tick = u32;

/// A bucket at or below this capacity is never shrunk (so a small one does not reallocate as it
/// fills and empties).
const MIN_SHRINK_CAPACITY: usize = 64;

/// One bucket per tick in a circular array; see the module documentation for the geometry.
#[derive(Debug)]
pub struct TimingWheel {
    /// `buckets[tick % n_buckets]` holds the slots scheduled at `tick`, in no particular order.
    /// Invariant: every slot in a bucket was placed there for a tick in `swept_through + 1 ..=
    /// swept_through + n_buckets`, and its owner records that tick and its position.
    buckets: Box<[Vec<SlotId>]>,
    /// The last tick whose bucket was detached. Ticks up to it are in the sweeper's hands.
    swept_through: Tick,
    /// `live[tick % n_buckets]`: the elements of that bucket that are their slot's current one
    /// (the owner says which are not: [`TimingWheel::forget`]). Known before a bucket is swept,
    /// so the mass-expiry guard can count what is about to expire in O(1).
    live: Box<[u32]>,
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

    /// Adds `slot` to the bucket of `tick` (which must be in range: see [`Self::clamp`]) and
    /// returns its position there.
    pub fn insert(&mut self, tick: Tick, slot: SlotId) -> u32 {
        debug_assert_eq!(self.clamp(tick), tick, "tick {tick} outside the wheel");
        let bucket_idx = self.bucket_idx(tick);
        self.live[bucket_idx] += 1;
        let bucket = &mut self.buckets[bucket_idx];
        bucket.push(slot);
        (bucket.len() - 1) as u32
    }

    /// Removes the slot at `pos` in the bucket of `tick`. Returns the slot that was moved into
    /// `pos` to fill the hole, if any, with the position it came from: if that was the moved
    /// slot's recorded position, its owner must record the new one.
    pub fn remove(&mut self, tick: Tick, pos: u32) -> Option<(SlotId, u32)> {
        debug_assert!(self.holds(tick), "tick {tick} was already detached");
        let bucket = self.bucket_mut(tick);
        bucket.swap_remove(pos as usize);
        // Give memory back as a bucket empties. Renewals that move every key every second fill
        // a new bucket each second and empty the previous one; kept at its peak, each of the
        // `max_ttl + 2` buckets would end up holding a whole fleet's capacity (measured: RSS
        // growing by ~5 bytes per renewal for an hour). Halving at a quarter full is amortised
        // O(1): each shrink copies at most a quarter of the capacity it frees half of.
        if bucket.capacity() > MIN_SHRINK_CAPACITY && bucket.len() * 4 <= bucket.capacity() {
            bucket.shrink_to(bucket.capacity() / 2);
        }
        let moved = *bucket.get(pos as usize)?;
        Some((moved, bucket.len() as u32))
    }

    /// Detaches the bucket of the next tick, `swept_through + 1`, in O(1), and returns that tick
    /// with the slots that were scheduled at it.
    pub fn detach_next(&mut self) -> (Tick, Vec<SlotId>) {
        self.swept_through += 1;
        let tick = self.swept_through;
        let bucket_idx = self.bucket_idx(tick);
        self.live[bucket_idx] = 0;
        (tick, std::mem::take(self.bucket_mut(tick)))
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

    /// The slots in the bucket of `tick`, which the wheel must hold; an element's index is its
    /// position (for the owner's invariant checks).
    pub fn bucket(&self, tick: Tick) -> &[SlotId] {
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

    fn bucket_mut(&mut self, tick: Tick) -> &mut Vec<SlotId> {
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
            wheel.insert(5, slot);
        }
        let peak = wheel.buckets[5].capacity();
        while wheel.bucket_len(5) > 10 {
            let last = wheel.bucket_len(5) as u32 - 1;
            wheel.remove(5, last);
        }
        let left = wheel.buckets[5].capacity();
        assert!(left <= MIN_SHRINK_CAPACITY * 2, "{left} of {peak} kept");
        assert_eq!(wheel.bucket(5), &(0..10).collect::<Vec<SlotId>>()[..]);
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
        wheel.insert(101, 1);
        wheel.insert(112, 2);
        assert_eq!(wheel.bucket_len(101), 1);
        assert_eq!(wheel.bucket_len(112), 1);
        assert_eq!(wheel.detach_next(), (101, vec![1]));
    }

    #[test]
    fn remove_reports_the_slot_that_filled_the_hole() {
        let mut wheel = TimingWheel::new(10, 0);
        assert_eq!(wheel.insert(5, 10), 0);
        assert_eq!(wheel.insert(5, 11), 1);
        assert_eq!(wheel.insert(5, 12), 2);
        assert_eq!(wheel.remove(5, 0), Some((12, 2)));
        assert_eq!(wheel.remove(5, 1), None); // 11 was last: nothing moves
        assert_eq!(wheel.bucket_len(5), 1);
    }

    #[test]
    fn detaching_walks_every_tick_in_order_across_the_wrap_around() {
        let mut wheel = TimingWheel::new(1, 0); // 3 buckets
        for expected in 1..=10 {
            let tick = wheel.clamp(expected + 2);
            wheel.insert(tick, tick);
            let (detached, slots) = wheel.detach_next();
            assert_eq!(detached, expected);
            assert!(slots.iter().all(|&slot| slot == expected), "{slots:?}");
        }
    }
}
