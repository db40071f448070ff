//! The ring's storage: the events' compact forms ([`compact`](super::compact)) back to back in
//! blocks of bytes, numbered by `seq`, with the SSE frames readers have encoded.
//!
//! Why blocks of bytes rather than an allocation per event: a fleet registration's compact form
//! was 47 bytes, boxed on its own behind a 40-byte slot (the box and the frame's `OnceLock`) in
//! a slot array that doubled: 88 bytes and more. Here it costs its bytes (36-38: its time is
//! written from the block's first event's, `Block::base_ms`) and a 2-byte end offset, and a
//! block's table of frames is allocated only when a reader first needs a frame from it (a ring
//! nobody streams has none). Measured: BENCHMARKS.md, "Engine III", "The fixed cost at 10k
//! keys".
//!
//! Geometry: a block holds at most its byte capacity (`block_bytes`, or one event's size when an
//! event is larger) and `block_bytes / BYTES_PER_EVENT` events; both capacities are reserved
//! when the block is made and never grow, so the bytes the ring holds ([`Ring::bytes`]) are its
//! blocks' capacities, known without asking the allocator. Blocks leave whole, oldest first;
//! the count bound (`--events-ring`) moves `first_seq` within the oldest block and frees it once
//! every event in it is behind `first_seq`.
//!
//! Invariants ([`Ring::check_invariants`], run by the tests after every step): blocks are in
//! `seq` order and contiguous (a block starts where the one before ends, the last ends at
//! `next_seq`), none is empty; `first_seq` lies in the first block (or equals `next_seq` when
//! there is none); `bytes` is the sum of the blocks' costs.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use super::compact::{self, CompactEvent};
use crate::events::Event;

/// Most bytes in one block: 64 KiB less one, so that an end offset fits in a `u16` (an event is
/// under 5 KB: key, service and metadata are bounded); ~1,700 fleet registrations, so that a 2
/// MiB ring leaves by thirty-seconds.
const MAX_BLOCK_BYTES: usize = 64 * 1024 - 1;
/// Fewest bytes in one block (a ring bounded to a few KiB still keeps events by blocks).
const MIN_BLOCK_BYTES: usize = 256;
/// The events a block has room for: one per this many bytes of its capacity (a fleet
/// registration is 36-38 bytes, so its blocks fill by bytes first; an event is at least 7).
const BYTES_PER_EVENT: usize = 32;

/// A frame's cell: empty until a reader encodes the frame.
type FrameCell = OnceLock<Box<[u8]>>;

/// Events `first_seq..first_seq + len()`, back to back.
#[derive(Debug)]
pub(super) struct Block {
    /// `seq` of the block's first event.
    first_seq: u64,
    /// The Unix ms of its first event's occurrence, which every event's is written from.
    base_ms: u64,
    /// The events' compact forms, back to back; never grows past the capacity it was made with.
    bytes: Vec<u8>,
    /// Where each event ends in `bytes`; never grows past the capacity it was made with.
    ends: Vec<u16>,
    /// One cell per event the block has room for, made when a reader first needs a frame here.
    frames: OnceLock<Box<[FrameCell]>>,
}

impl Block {
    fn new(first_seq: u64, base_ms: u64, byte_capacity: usize, event_capacity: usize) -> Self {
        Self {
            first_seq,
            base_ms,
            bytes: Vec::with_capacity(byte_capacity),
            ends: Vec::with_capacity(event_capacity),
            frames: OnceLock::new(),
        }
    }

    /// What the block holds (capacities, not lengths), frames aside.
    fn cost(&self) -> usize {
        self.bytes.capacity() + self.ends.capacity() * std::mem::size_of::<u16>()
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    fn end_seq(&self) -> u64 {
        self.first_seq + self.len() as u64
    }

    fn fits(&self, len: usize) -> bool {
        self.ends.len() < self.ends.capacity() && self.bytes.len() + len <= self.bytes.capacity()
    }

    fn push(&mut self, encoded: &[u8]) {
        debug_assert!(self.fits(encoded.len()), "the caller made room");
        self.bytes.extend_from_slice(encoded);
        let end = u16::try_from(self.bytes.len()).expect("a block is under 64 KiB");
        self.ends.push(end);
    }

    /// The event at `index` in the block.
    pub fn event(&self, index: usize) -> CompactEvent<'_> {
        let start = index.checked_sub(1).map_or(0, |before| self.ends[before]);
        CompactEvent::new(
            &self.bytes[usize::from(start)..usize::from(self.ends[index])],
            self.base_ms,
        )
    }

    /// The frame of the event at `index`, made by `make` if no reader made it yet. The bytes a
    /// call allocates (the block's frame table, the frame) are added to `frame_bytes`.
    pub fn frame(
        &self,
        index: usize,
        frame_bytes: &AtomicUsize,
        make: impl FnOnce() -> Box<[u8]>,
    ) -> &[u8] {
        let table = self.frames.get_or_init(|| {
            frame_bytes.fetch_add(self.frame_table_bytes(), Ordering::Relaxed);
            (0..self.ends.capacity()).map(|_| OnceLock::new()).collect()
        });
        table[index].get_or_init(|| {
            let frame = make();
            frame_bytes.fetch_add(frame.len(), Ordering::Relaxed);
            frame
        })
    }

    fn frame_table_bytes(&self) -> usize {
        self.ends.capacity() * std::mem::size_of::<FrameCell>()
    }

    /// The bytes of the frame table and the frames made so far.
    fn frame_bytes(&self) -> usize {
        self.frames.get().map_or(0, |table| {
            self.frame_table_bytes()
                + table
                    .iter()
                    .filter_map(OnceLock::get)
                    .map(|frame| frame.len())
                    .sum::<usize>()
        })
    }
}

/// See the module documentation.
#[derive(Debug)]
pub(super) struct Ring {
    /// The blocks, oldest first.
    blocks: VecDeque<Block>,
    /// `seq` of the oldest event still readable.
    first_seq: u64,
    /// `seq` the next event gets (events are numbered from 1).
    next_seq: u64,
    /// The blocks' costs, summed.
    bytes: usize,
    /// The byte capacity of a new block.
    block_bytes: usize,
    /// Reused buffer: an event is encoded here first, to know whether it fits.
    scratch: Vec<u8>,
}

impl Ring {
    /// An empty ring for a byte bound of `max_bytes`: its blocks are a 32nd of it (256 B to 64
    /// KiB), so that eviction by whole blocks keeps most of what the bound allows.
    pub fn new(max_bytes: usize) -> Self {
        Self {
            blocks: VecDeque::new(),
            first_seq: 1,
            next_seq: 1,
            bytes: 0,
            block_bytes: (max_bytes / 32).clamp(MIN_BLOCK_BYTES, MAX_BLOCK_BYTES),
            scratch: Vec::new(),
        }
    }

    /// `seq` of the oldest event still readable (`next_seq` when there is none).
    pub fn first_seq(&self) -> u64 {
        self.first_seq
    }

    /// `seq` of the newest event (0 before any).
    pub fn newest(&self) -> u64 {
        self.next_seq - 1
    }

    /// Events readable.
    pub fn len(&self) -> usize {
        (self.next_seq - self.first_seq) as usize
    }

    /// What the blocks hold (their capacities), frames aside; the caller adds `frame_bytes`.
    pub fn bytes(&self) -> usize {
        self.bytes + self.blocks.capacity() * std::mem::size_of::<Block>()
    }

    /// Appends `event`, then drops the oldest blocks past the bounds: at most `max_events`
    /// readable, at most `max_bytes` with the frames (`frame_bytes`, which eviction lowers),
    /// always keeping the block of the newest event.
    pub fn append(
        &mut self,
        event: &Event,
        max_events: usize,
        max_bytes: usize,
        frame_bytes: &AtomicUsize,
    ) {
        let mut encoded = std::mem::take(&mut self.scratch);
        encoded.clear();
        let base_ms = self.blocks.back().map(|block| block.base_ms);
        compact::encode_into(event, base_ms.unwrap_or(event.occurred_at_ms), &mut encoded);
        if !self
            .blocks
            .back()
            .is_some_and(|block| block.fits(encoded.len()))
        {
            // A new block: the event is written again, from its own time.
            encoded.clear();
            compact::encode_into(event, event.occurred_at_ms, &mut encoded);
            let block = Block::new(
                self.next_seq,
                event.occurred_at_ms,
                self.block_bytes.max(encoded.len()),
                self.block_bytes / BYTES_PER_EVENT,
            );
            // Room is made before the block is, so the ring never holds more than its bound
            // (but for one block, whatever the bound).
            while !self.blocks.is_empty()
                && self.total(frame_bytes) + block.cost() + std::mem::size_of::<Block>() > max_bytes
            {
                self.drop_oldest(frame_bytes);
            }
            self.bytes += block.cost();
            self.blocks.push_back(block);
        }
        self.blocks
            .back_mut()
            .expect("a block with room was just ensured")
            .push(&encoded);
        self.scratch = encoded;
        self.next_seq += 1;
        if self.len() > max_events {
            self.first_seq = self.next_seq - max_events as u64;
        }
        while self
            .blocks
            .front()
            .is_some_and(|block| block.end_seq() <= self.first_seq)
            || (self.blocks.len() > 1 && self.total(frame_bytes) > max_bytes)
        {
            self.drop_oldest(frame_bytes);
        }
        if self.total(frame_bytes) > max_bytes {
            // One block is over the bound on its own: of its events, only the newest is kept.
            self.first_seq = self.newest();
        }
    }

    fn total(&self, frame_bytes: &AtomicUsize) -> usize {
        self.bytes() + frame_bytes.load(Ordering::Relaxed)
    }

    fn drop_oldest(&mut self, frame_bytes: &AtomicUsize) {
        if let Some(block) = self.blocks.pop_front() {
            self.bytes -= block.cost();
            frame_bytes.fetch_sub(block.frame_bytes(), Ordering::Relaxed);
            self.first_seq = self.first_seq.max(block.end_seq());
        }
    }

    /// Every readable event from `seq` on (`seq` at least [`Ring::first_seq`]), oldest first:
    /// its `seq`, its block and its index there.
    pub fn from(&self, seq: u64) -> impl Iterator<Item = (u64, &Block, usize)> {
        debug_assert!(seq >= self.first_seq, "reading before the ring");
        let start = self.blocks.partition_point(|block| block.end_seq() <= seq);
        self.blocks.range(start..).flat_map(move |block| {
            let skip = seq.saturating_sub(block.first_seq) as usize;
            (skip..block.len()).map(move |index| (block.first_seq + index as u64, block, index))
        })
    }

    /// Checks the invariants of the module documentation; panics naming the first one broken.
    #[cfg(test)]
    pub fn check_invariants(&self) {
        let mut expected_first = self.blocks.front().map_or(self.next_seq, |b| b.first_seq);
        assert!(
            self.first_seq >= expected_first,
            "first_seq {} before the first block",
            self.first_seq
        );
        for block in &self.blocks {
            assert!(block.len() > 0, "an empty block");
            assert_eq!(block.first_seq, expected_first, "blocks are not contiguous");
            expected_first = block.end_seq();
        }
        assert_eq!(
            expected_first, self.next_seq,
            "the last block ends at next_seq"
        );
        assert!(
            self.blocks
                .front()
                .is_none_or(|b| self.first_seq < b.end_seq()),
            "the first block is wholly behind first_seq"
        );
        let costs: usize = self.blocks.iter().map(Block::cost).sum();
        assert_eq!(self.bytes, costs, "bytes against the blocks' costs");
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::events::EventKind;
    use crate::types::Key;

    fn event(key: &str) -> Event {
        Event {
            kind: EventKind::Registered,
            key: Key::new(key).unwrap(),
            service: None,
            meta: None,
            ttl_ms: Some(1000),
            registered_at_ms: 5,
            last_heartbeat_at_ms: 5,
            deadline_ms: Some(1005),
            occurred_at_ms: 5,
            lateness_ms: 0,
            restored: false,
            log_id: None,
        }
    }

    fn keys_from(ring: &Ring, seq: u64) -> Vec<(u64, String)> {
        ring.from(seq)
            .map(|(seq, block, index)| (seq, block.event(index).key().to_owned()))
            .collect()
    }

    #[test]
    fn a_fleet_registration_costs_its_bytes_and_an_offset() {
        let frames = AtomicUsize::new(0);
        let mut ring = Ring::new(usize::MAX);
        let at = 1_795_000_000_000;
        for n in 0..100_000 {
            let key = format!("svc-{:03}/instance-{n:010}", n % 1000);
            let event = Event {
                registered_at_ms: at,
                last_heartbeat_at_ms: at,
                occurred_at_ms: at,
                ttl_ms: Some(3_600_000),
                deadline_ms: Some(at + 3_600_000),
                ..event(&key)
            };
            ring.append(&event, usize::MAX, usize::MAX, &frames);
        }
        ring.check_invariants();
        assert_eq!(ring.len(), 100_000);
        // 35 bytes of compact form (all at one time here) and the room for a 2-byte end: 2,047
        // ends per block of 64 KiB less one, which ~1,872 such events fill (37.2 bytes each,
        // against 88 boxed one by one).
        let per_event = ring.bytes() as f64 / 100_000.0;
        assert!(
            (35.0..40.0).contains(&per_event),
            "{per_event} bytes per event"
        );
        assert_eq!(
            frames.load(Ordering::Relaxed),
            0,
            "no frame table without readers"
        );
    }

    #[test]
    fn frames_are_made_once_and_counted_until_their_block_leaves() {
        let frames = AtomicUsize::new(0);
        let max_bytes = 4096;
        let mut ring = Ring::new(max_bytes);
        for n in 0..20 {
            ring.append(&event(&format!("k{n}")), usize::MAX, max_bytes, &frames);
        }
        let (seq, block, index) = ring.from(ring.first_seq()).next().unwrap();
        let frame = block.frame(index, &frames, || b"frame".to_vec().into_boxed_slice());
        assert_eq!(frame, b"frame");
        let again = block.frame(index, &frames, || unreachable!("made once"));
        assert_eq!(again, b"frame");
        let counted = frames.load(Ordering::Relaxed);
        assert_eq!(counted, block.frame_table_bytes() + 5);
        // Enough events to push that block out: its frames are no longer counted.
        for n in 20..2000 {
            ring.append(&event(&format!("k{n}")), usize::MAX, max_bytes, &frames);
        }
        assert!(ring.first_seq() > seq);
        assert_eq!(frames.load(Ordering::Relaxed), 0);
        ring.check_invariants();
    }

    proptest! {
        /// Against a list of every event appended: the ring reads back exactly the newest
        /// `len()` of them, in order, from any `seq`; it keeps the newest; it stays within both
        /// bounds (bytes: but for the newest event's block).
        #[test]
        fn the_ring_reads_back_the_newest_events_within_its_bounds(
            keys in prop::collection::vec("[a-z]{1,200}", 1..300),
            max_events in 1usize..100,
            max_bytes in 1usize..20_000,
        ) {
            let frames = AtomicUsize::new(0);
            let mut ring = Ring::new(max_bytes);
            let mut all = Vec::new();
            for key in keys {
                ring.append(&event(&key), max_events, max_bytes, &frames);
                all.push(key);
                ring.check_invariants();
                prop_assert!(ring.len() >= 1 && ring.len() <= max_events);
                prop_assert_eq!(ring.newest(), all.len() as u64);
                prop_assert!(ring.blocks.len() == 1 || ring.bytes() <= max_bytes, "{} bytes", ring.bytes());
                let expected: Vec<(u64, String)> = all
                    .iter()
                    .enumerate()
                    .skip(all.len() - ring.len())
                    .map(|(i, key)| (i as u64 + 1, key.clone()))
                    .collect();
                prop_assert_eq!(keys_from(&ring, ring.first_seq()), expected.clone());
                let middle = ring.first_seq() + ring.len() as u64 / 2;
                prop_assert_eq!(
                    keys_from(&ring, middle),
                    expected[(middle - ring.first_seq()) as usize..].to_vec()
                );
            }
        }
    }
}
