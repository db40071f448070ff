//! An indexed d-ary min-heap of deadlines, for TTLs the wheel cannot hold exactly.
//!
//! Array-packed: node `i`'s children are `ARITY * i + 1 ..= ARITY * i + ARITY`. Back-references
//! make every operation on *any* slot cheap: `positions[slot]` is that slot's index in `nodes`,
//! kept up to date on every move (the `heap_idx` of the C++ designs, as a plain array instead of a
//! pointer into the entry).
//!
//! Costs with `n` nodes: push, update, remove O(log n); peek O(1); memory 16 bytes per node plus
//! 4 bytes per slot id up to the largest one ever pushed (`positions` is indexed by slot id, and
//! slot ids are dense because the owner reuses them).
//!
//! `ARITY` defaults to 4: a 4-ary heap is shallower and its children share a cache line, and
//! `benches/expiry.rs` measures it against the binary one (see BENCHMARKS.md).
//!
//! The heap is pure: deadlines are plain numbers (ms since the registry's epoch); it never reads
//! a clock.

use super::wheel::SlotId;

/// `positions` value of a slot that is not in the heap.
const ABSENT: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Node {
    deadline_ms: u64,
    slot: SlotId,
}

/// Min-heap of `(deadline_ms, slot)` with O(log n) update and removal of any slot.
#[derive(Debug, Default)]
pub struct DeadlineHeap<const ARITY: usize = 4> {
    /// The heap array. Invariant: `nodes[parent(i)].deadline_ms <= nodes[i].deadline_ms`.
    nodes: Vec<Node>,
    /// Invariant: `positions[nodes[i].slot] == i` for every `i`, and `ABSENT` for slots not in
    /// the heap (including every slot id past the end of the vector).
    positions: Vec<u32>,
}

impl<const ARITY: usize> DeadlineHeap<ARITY> {
    pub fn new() -> Self {
        const { assert!(ARITY >= 2, "a heap needs at least two children per node") };
        Self {
            nodes: Vec::new(),
            positions: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The deadline of `slot`, if it is in the heap.
    pub fn deadline_of(&self, slot: SlotId) -> Option<u64> {
        self.position(slot).map(|pos| self.nodes[pos].deadline_ms)
    }

    /// The earliest `(deadline_ms, slot)`.
    pub fn peek(&self) -> Option<(u64, SlotId)> {
        self.nodes.first().map(|node| (node.deadline_ms, node.slot))
    }

    /// Inserts `slot`, or moves it to `deadline_ms` if it is already in the heap.
    pub fn upsert(&mut self, slot: SlotId, deadline_ms: u64) {
        match self.position(slot) {
            Some(pos) => {
                let old = std::mem::replace(&mut self.nodes[pos].deadline_ms, deadline_ms);
                if deadline_ms < old {
                    self.sift_up(pos);
                } else {
                    self.sift_down(pos);
                }
            }
            None => {
                let slot_idx = slot as usize;
                if self.positions.len() <= slot_idx {
                    self.positions.resize(slot_idx + 1, ABSENT);
                }
                self.nodes.push(Node { deadline_ms, slot });
                let pos = self.nodes.len() - 1;
                self.positions[slot_idx] = pos as u32;
                self.sift_up(pos);
            }
        }
        self.debug_check();
    }

    /// How many nodes are due at `now_ms` (deadline at or before it), counting at most `cap`:
    /// a walk of the due part of the tree only, O(min(due, cap) * ARITY).
    pub fn count_due(&self, now_ms: u64, cap: usize) -> usize {
        let mut count = 0;
        let mut stack = vec![0usize];
        while let Some(pos) = stack.pop() {
            if count >= cap {
                break;
            }
            if self
                .nodes
                .get(pos)
                .is_none_or(|node| node.deadline_ms > now_ms)
            {
                continue;
            }
            count += 1;
            let first_child = pos * ARITY + 1;
            stack.extend(
                (first_child..first_child + ARITY).filter(|&child| child < self.nodes.len()),
            );
        }
        count
    }

    /// Removes `slot`; returns its deadline if it was in the heap.
    pub fn remove(&mut self, slot: SlotId) -> Option<u64> {
        let pos = self.position(slot)?;
        let removed = self.nodes.swap_remove(pos);
        self.positions[slot as usize] = ABSENT;
        if pos < self.nodes.len() {
            self.positions[self.nodes[pos].slot as usize] = pos as u32;
            // The node moved in from the end may belong above or below `pos`.
            self.sift_up(pos);
            self.sift_down(pos);
        }
        self.debug_check();
        Some(removed.deadline_ms)
    }

    /// Removes and returns the earliest slot if its deadline is `<= now_ms`.
    pub fn pop_due(&mut self, now_ms: u64) -> Option<(SlotId, u64)> {
        let (deadline_ms, slot) = self.peek()?;
        if deadline_ms > now_ms {
            return None;
        }
        self.remove(slot);
        Some((slot, deadline_ms))
    }

    fn position(&self, slot: SlotId) -> Option<usize> {
        match self.positions.get(slot as usize) {
            Some(&pos) if pos != ABSENT => Some(pos as usize),
            _ => None,
        }
    }

    fn sift_up(&mut self, mut pos: usize) {
        let node = self.nodes[pos];
        while pos > 0 {
            let parent = (pos - 1) / ARITY;
            if self.nodes[parent].deadline_ms <= node.deadline_ms {
                break;
            }
            self.place(pos, self.nodes[parent]);
            pos = parent;
        }
        self.place(pos, node);
    }

    fn sift_down(&mut self, mut pos: usize) {
        let node = self.nodes[pos];
        let len = self.nodes.len();
        loop {
            let first_child = ARITY * pos + 1;
            if first_child >= len {
                break;
            }
            let last_child = (first_child + ARITY).min(len);
            let mut min_child = first_child;
            for child in first_child + 1..last_child {
                if self.nodes[child].deadline_ms < self.nodes[min_child].deadline_ms {
                    min_child = child;
                }
            }
            if self.nodes[min_child].deadline_ms >= node.deadline_ms {
                break;
            }
            self.place(pos, self.nodes[min_child]);
            pos = min_child;
        }
        self.place(pos, node);
    }

    /// Writes `node` at `pos` and records the back-reference.
    fn place(&mut self, pos: usize, node: Node) {
        self.nodes[pos] = node;
        self.positions[node.slot as usize] = pos as u32;
    }

    /// Checks both invariants in debug builds on small heaps (O(n), so only while n is small
    /// enough not to turn tests quadratic); owners check larger heaps through
    /// [`Self::check_invariants`].
    fn debug_check(&self) {
        if cfg!(debug_assertions) && self.nodes.len() <= 64 {
            self.check_invariants();
        }
    }

    /// Checks the heap order and every back-reference, in O(n + slots); panics naming the
    /// first one broken.
    pub fn check_invariants(&self) {
        for (pos, node) in self.nodes.iter().enumerate() {
            assert_eq!(
                self.positions[node.slot as usize] as usize, pos,
                "stale back-reference"
            );
            if pos > 0 {
                let parent = &self.nodes[(pos - 1) / ARITY];
                assert!(parent.deadline_ms <= node.deadline_ms, "heap order broken");
            }
        }
        let present = self.positions.iter().filter(|&&pos| pos != ABSENT).count();
        assert_eq!(
            present,
            self.nodes.len(),
            "back-reference to a removed node"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[derive(Debug, Clone)]
    enum Op {
        Upsert(SlotId, u64),
        Remove(SlotId),
        PopDue(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        // Few slots and deadlines, so that updates, duplicates and ties are common.
        prop_oneof![
            4 => (0..40u32, 0..100u64).prop_map(|(slot, d)| Op::Upsert(slot, d)),
            2 => (0..40u32).prop_map(Op::Remove),
            1 => (0..100u64).prop_map(Op::PopDue),
        ]
    }

    /// Applies `ops` to the heap and to a plain map of deadlines, comparing after every step.
    fn check_against_model<const ARITY: usize>(ops: &[Op]) {
        let mut heap = DeadlineHeap::<ARITY>::new();
        let mut model: BTreeMap<SlotId, u64> = BTreeMap::new();
        for op in ops {
            match *op {
                Op::Upsert(slot, deadline) => {
                    heap.upsert(slot, deadline);
                    model.insert(slot, deadline);
                }
                Op::Remove(slot) => assert_eq!(heap.remove(slot), model.remove(&slot)),
                Op::PopDue(now) => {
                    let earliest = model.values().copied().min();
                    match heap.pop_due(now) {
                        Some((slot, deadline)) => {
                            assert_eq!(Some(deadline), earliest);
                            assert!(deadline <= now);
                            assert_eq!(model.remove(&slot), Some(deadline));
                        }
                        None => assert!(earliest.is_none_or(|d| d > now)),
                    }
                }
            }
            assert_eq!(heap.len(), model.len());
            for (now, cap) in [
                (0, usize::MAX),
                (50, usize::MAX),
                (50, 3),
                (100, usize::MAX),
            ] {
                let due = model.values().filter(|&&d| d <= now).count();
                assert_eq!(
                    heap.count_due(now, cap),
                    due.min(cap),
                    "due at {now}, cap {cap}"
                );
            }
            assert_eq!(heap.peek().map(|(d, _)| d), model.values().copied().min());
            for (&slot, &deadline) in &model {
                assert_eq!(heap.deadline_of(slot), Some(deadline));
            }
        }
    }

    proptest! {
        #[test]
        fn binary_heap_matches_a_map_of_deadlines(ops in prop::collection::vec(op(), 0..300)) {
            check_against_model::<2>(&ops);
        }

        #[test]
        fn four_ary_heap_matches_a_map_of_deadlines(ops in prop::collection::vec(op(), 0..300)) {
            check_against_model::<4>(&ops);
        }
    }

    #[test]
    fn pops_come_out_in_deadline_order() {
        let mut heap = DeadlineHeap::<4>::new();
        let deadlines = [50, 10, 40, 10, 30, 20, 60, 5];
        for (slot, &deadline) in deadlines.iter().enumerate() {
            heap.upsert(slot as SlotId, deadline);
        }
        let mut popped = Vec::new();
        while let Some((_, deadline)) = heap.pop_due(u64::MAX) {
            popped.push(deadline);
        }
        assert_eq!(popped, [5, 10, 10, 20, 30, 40, 50, 60]);
    }

    #[test]
    fn nothing_pops_before_its_deadline() {
        let mut heap = DeadlineHeap::<4>::new();
        heap.upsert(7, 1_000);
        assert_eq!(heap.pop_due(999), None);
        assert_eq!(heap.pop_due(1_000), Some((7, 1_000)));
    }
}
