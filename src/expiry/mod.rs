//! The two timer structures and the rule that picks between them.
//!
//! - [`wheel::TimingWheel`]: whole-second TTLs up to `max_ttl_s`; O(1) renew, 1 s buckets;
//!   a bucket's keys spend their last second in [`last_second::LastSecond`], 1,000 groups of
//!   one millisecond each, so they expire within the millisecond.
//! - [`heap::DeadlineHeap`]: everything else (sub-second, fractional seconds, longer than
//!   `max_ttl_s`, up to 365 days); O(log n), millisecond precision.
//!
//! Both are pure data structures: they are given times, never read a clock, do no I/O, and know
//! nothing about keys. `registry` is the only code that touches them.

pub mod heap;
pub mod last_second;
pub mod wheel;

/// Which structure holds a key's deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TimerKind {
    Wheel,
    Heap,
}

impl TimerKind {
    /// The wheel takes TTLs that are a whole number of seconds and at most `max_ttl_s`; the
    /// heap takes every other TTL.
    pub fn for_ttl(ttl_ms: u64, max_ttl_s: u32) -> Self {
        if ttl_ms.is_multiple_of(1000) && ttl_ms / 1000 <= u64::from(max_ttl_s) {
            Self::Wheel
        } else {
            Self::Heap
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_seconds_up_to_max_ttl_go_to_the_wheel() {
        let check = |ttl_ms: u64, kind: TimerKind| {
            assert_eq!(TimerKind::for_ttl(ttl_ms, 3600), kind, "ttl {ttl_ms} ms")
        };
        check(1_000, TimerKind::Wheel);
        check(30_000, TimerKind::Wheel);
        check(3_600_000, TimerKind::Wheel);
        check(3_601_000, TimerKind::Heap);
        check(999, TimerKind::Heap);
        check(1, TimerKind::Heap);
        check(1_500, TimerKind::Heap);
    }
}
