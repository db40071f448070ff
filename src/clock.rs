//! Time as the registry sees it: milliseconds on the monotonic clock since the registry's epoch.
//!
//! Deadlines live on `tokio::time::Instant` so tests control them with paused time. Wall-clock
//! time is for display only: it is the wall time read once at the epoch plus the monotonic time
//! since, so a clock step after start-up does not move any deadline (and is not reflected in the
//! displayed times either).
//!
//! Rounding: an instant is read down to the millisecond (`now_ms`), and a deadline is computed from
//! the instant rounded *up* (`deadline_ms`), so `deadline_ms <= now_ms` is never true before the
//! exact deadline: expiry is never early, not even by a fraction of a millisecond.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// An instant in epoch milliseconds: rounded down for "has it passed", up for new deadlines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    /// Whole milliseconds since the epoch, rounded down.
    pub ms: u64,
    /// The same, rounded up.
    ceil_ms: u64,
}

impl Now {
    /// The deadline `ttl_ms` from now: never before the exact instant plus the TTL.
    pub fn deadline_ms(self, ttl_ms: u64) -> u64 {
        self.ceil_ms.saturating_add(ttl_ms)
    }
}

/// Converts between instants, epoch milliseconds and Unix milliseconds.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    /// Monotonic time zero: ms and ticks count from here.
    epoch: Instant,
    /// Unix time in ms at `epoch`, read once.
    unix_ms_at_epoch: u64,
}

impl Clock {
    pub fn new(epoch: Instant) -> Self {
        let unix_ms_at_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as u64);
        Self::with_unix_ms_at_epoch(epoch, unix_ms_at_epoch)
    }

    /// A clock whose epoch maps to the given Unix time (tests pin the wall clock with this).
    pub fn with_unix_ms_at_epoch(epoch: Instant, unix_ms_at_epoch: u64) -> Self {
        Self {
            epoch,
            unix_ms_at_epoch,
        }
    }

    /// `now` in epoch milliseconds, read once (an `Instant` subtraction is not free on the
    /// heartbeat path).
    pub fn at(&self, now: Instant) -> Now {
        let since = now.saturating_duration_since(self.epoch);
        let ms = since.as_millis() as u64;
        Now {
            ms,
            ceil_ms: ms + u64::from(since.subsec_nanos() % 1_000_000 != 0),
        }
    }

    /// Whole milliseconds elapsed between the epoch and `now`, rounded down.
    pub fn now_ms(&self, now: Instant) -> u64 {
        self.at(now).ms
    }

    /// The instant at `ms` after the epoch.
    pub fn instant_at(&self, ms: u64) -> Instant {
        self.epoch + Duration::from_millis(ms)
    }

    /// The Unix time, in ms, of `ms` after the epoch.
    pub fn unix_ms(&self, ms: u64) -> u64 {
        self.unix_ms_at_epoch.saturating_add(ms)
    }

    /// Epoch milliseconds of a Unix time; negative when it lies before the epoch.
    pub fn ms_from_unix(&self, unix_ms: i64) -> i64 {
        unix_ms.saturating_sub(self.unix_ms_at_epoch as i64)
    }
}

/// A Unix time in ms as RFC 3339 UTC with milliseconds, as every API and payload shows times.
pub fn rfc3339(unix_ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(unix_ms)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn deadlines_round_up_and_now_rounds_down() {
        let epoch = Instant::now();
        let clock = Clock::with_unix_ms_at_epoch(epoch, 1_000_000);
        let now = epoch + Duration::from_micros(1_500);
        assert_eq!(clock.now_ms(now), 1);
        assert_eq!(clock.at(now).deadline_ms(10), 12);
        assert_eq!(
            clock.at(epoch + Duration::from_millis(2)).deadline_ms(10),
            12
        );
        assert_eq!(clock.unix_ms(12), 1_000_012);
        assert_eq!(clock.ms_from_unix(999_000), -1_000);
        assert_eq!(clock.instant_at(12), epoch + Duration::from_millis(12));
    }
}
