//! An entry's three times (deadline, TTL, last heartbeat) packed into 16 bytes instead of 24,
//! so that an entry is 64 bytes: 8 bytes less per key (measured: 140 -> 132 bytes of RSS
//! growth per key at 1M keys, `bench/memory_fleet.sh`), and, aligned to 64, one cache line
//! where a 72-byte entry always straddled two. The one line did not make renewals or a mass
//! expiry measurably faster (BENCHMARKS.md, "Entries of one cache line"): the processor
//! fetches the neighbouring line with the first, so the second was rarely a second wait.
//!
//! The widths follow the limits the service enforces, with room to spare:
//! - the deadline, in the registry's epoch ms (since the process started): 44 bits, 557 years
//!   of uptime. A deadline is at most a year ahead (`types::MAX_TTL_MS`, for a TTL and for an
//!   absolute instant alike); the all-ones value is [`NO_DEADLINE`](super::NO_DEADLINE);
//! - the TTL in ms: 36 bits, 2.2 years, above the one-year maximum TTL;
//! - the last heartbeat in Unix ms: 48 bits, until the year 10889.
//!
//! A value too wide for its field is a bug upstream (a limit not enforced), caught by a debug
//! assertion; a release build clamps it to the field's largest value rather than wrap it into
//! another time.

use super::NO_DEADLINE;

const DEADLINE_BITS: u32 = 44;
const TTL_BITS: u32 = 36;
const HEARTBEAT_BITS: u32 = 48;
const _: () = assert!(DEADLINE_BITS + TTL_BITS + HEARTBEAT_BITS == 128);

const TTL_SHIFT: u32 = DEADLINE_BITS;
const HEARTBEAT_SHIFT: u32 = DEADLINE_BITS + TTL_BITS;

/// The stored form of [`NO_DEADLINE`]: the deadline field's all-ones value, which no real
/// deadline reaches.
const NO_DEADLINE_FIELD: u64 = mask(DEADLINE_BITS);

const fn mask(bits: u32) -> u64 {
    (1 << bits) - 1
}

/// See the module documentation.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct Times(u128);

impl Times {
    pub fn new(deadline_ms: u64, ttl_ms: u64, last_heartbeat_unix_ms: u64) -> Self {
        let mut times = Self(0);
        times.set_deadline_ms(deadline_ms);
        times.set_ttl_ms(ttl_ms);
        times.set_last_heartbeat_unix_ms(last_heartbeat_unix_ms);
        times
    }

    /// Epoch ms, or [`NO_DEADLINE`].
    pub fn deadline_ms(self) -> u64 {
        match self.field(0, DEADLINE_BITS) {
            NO_DEADLINE_FIELD => NO_DEADLINE,
            deadline_ms => deadline_ms,
        }
    }

    pub fn set_deadline_ms(&mut self, deadline_ms: u64) {
        let stored = if deadline_ms == NO_DEADLINE {
            NO_DEADLINE_FIELD
        } else {
            fit(deadline_ms, NO_DEADLINE_FIELD - 1, "deadline")
        };
        self.set_field(0, DEADLINE_BITS, stored);
    }

    pub fn ttl_ms(self) -> u64 {
        self.field(TTL_SHIFT, TTL_BITS)
    }

    pub fn set_ttl_ms(&mut self, ttl_ms: u64) {
        self.set_field(TTL_SHIFT, TTL_BITS, fit(ttl_ms, mask(TTL_BITS), "TTL"));
    }

    pub fn last_heartbeat_unix_ms(self) -> u64 {
        self.field(HEARTBEAT_SHIFT, HEARTBEAT_BITS)
    }

    pub fn set_last_heartbeat_unix_ms(&mut self, unix_ms: u64) {
        let stored = fit(unix_ms, mask(HEARTBEAT_BITS), "last heartbeat");
        self.set_field(HEARTBEAT_SHIFT, HEARTBEAT_BITS, stored);
    }

    fn field(self, shift: u32, bits: u32) -> u64 {
        (self.0 >> shift) as u64 & mask(bits)
    }

    fn set_field(&mut self, shift: u32, bits: u32, value: u64) {
        let field = u128::from(mask(bits)) << shift;
        self.0 = (self.0 & !field) | (u128::from(value) << shift);
    }
}

/// `value`, which must not exceed `max` (see the module documentation).
fn fit(value: u64, max: u64, what: &str) -> u64 {
    debug_assert!(value <= max, "{what} {value} is wider than its field");
    value.min(max)
}

impl std::fmt::Debug for Times {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Times")
            .field("deadline_ms", &self.deadline_ms())
            .field("ttl_ms", &self.ttl_ms())
            .field("last_heartbeat_unix_ms", &self.last_heartbeat_unix_ms())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::MAX_TTL_MS;
    use proptest::prelude::*;

    /// A year of uptime past the latest deadline a year ahead allows.
    const LATEST_DEADLINE_MS: u64 = 2 * MAX_TTL_MS;
    /// The year 3000.
    const LATEST_UNIX_MS: u64 = 32_503_680_000_000;

    #[test]
    fn the_limits_fit_their_fields() {
        let times = Times::new(LATEST_DEADLINE_MS, MAX_TTL_MS, LATEST_UNIX_MS);
        assert_eq!(times.deadline_ms(), LATEST_DEADLINE_MS);
        assert_eq!(times.ttl_ms(), MAX_TTL_MS);
        assert_eq!(times.last_heartbeat_unix_ms(), LATEST_UNIX_MS);
    }

    #[test]
    fn no_deadline_round_trips_and_keeps_the_other_fields() {
        let mut times = Times::new(5, 7, 9);
        times.set_deadline_ms(NO_DEADLINE);
        assert_eq!(times.deadline_ms(), NO_DEADLINE);
        assert_eq!((times.ttl_ms(), times.last_heartbeat_unix_ms()), (7, 9));
    }

    proptest! {
        /// Setting one field leaves the others as they were, whatever the order.
        #[test]
        fn fields_are_independent(
            deadline_ms in prop_oneof![0..=LATEST_DEADLINE_MS, Just(NO_DEADLINE)],
            ttl_ms in 0..=MAX_TTL_MS,
            unix_ms in 0..=LATEST_UNIX_MS,
            deadline2 in 0..=LATEST_DEADLINE_MS,
            ttl2 in 0..=MAX_TTL_MS,
            unix2 in 0..=LATEST_UNIX_MS,
        ) {
            let mut times = Times::new(deadline_ms, ttl_ms, unix_ms);
            prop_assert_eq!(
                (times.deadline_ms(), times.ttl_ms(), times.last_heartbeat_unix_ms()),
                (deadline_ms, ttl_ms, unix_ms)
            );
            times.set_ttl_ms(ttl2);
            prop_assert_eq!((times.deadline_ms(), times.last_heartbeat_unix_ms()), (deadline_ms, unix_ms));
            times.set_last_heartbeat_unix_ms(unix2);
            prop_assert_eq!((times.deadline_ms(), times.ttl_ms()), (deadline_ms, ttl2));
            times.set_deadline_ms(deadline2);
            prop_assert_eq!(
                (times.deadline_ms(), times.ttl_ms(), times.last_heartbeat_unix_ms()),
                (deadline2, ttl2, unix2)
            );
        }
    }
}
