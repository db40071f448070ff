//! Time as the registry sees it: milliseconds on the monotonic clock since the registry's epoch,
//! standing still across stalls of the process itself (see [`stalls`]).
//!
//! Deadlines live on `tokio::time::Instant` so tests control them with paused time. Wall-clock
//! time is for display only: it is the wall time read once at the epoch plus the monotonic time
//! since, so a clock step after start-up does not move any deadline (and is not reflected in the
//! displayed times either).
//!
//! Rounding: an instant is read down to the millisecond (`now_ms`), and a deadline is computed from
//! the instant rounded *up* (`deadline_ms`), so `deadline_ms <= now_ms` is never true before the
//! exact deadline: expiry is never early, not even by a fraction of a millisecond.

pub mod stalls;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

pub use stalls::{Stall, StallTotals, Stalls};

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

/// Converts between instants, registry milliseconds and Unix milliseconds. Registry time is
/// real (monotonic) time since the epoch minus the stalls accounted so far.
#[derive(Debug)]
pub struct Clock {
    /// Monotonic time zero: ms and ticks count from here.
    epoch: Instant,
    /// Unix time in ms at `epoch`, read once.
    unix_ms_at_epoch: u64,
    stalls: Stalls,
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
            stalls: Stalls::default(),
        }
    }

    /// `now` in registry milliseconds, read once (an `Instant` subtraction is not free on the
    /// heartbeat path). The first reading after a stall of the process accounts it.
    pub fn at(&self, now: Instant) -> Now {
        let since = now.saturating_duration_since(self.epoch);
        let mapped = self.stalls.map(since.as_millis() as u64);
        let fraction = !mapped.frozen && !since.subsec_nanos().is_multiple_of(1_000_000);
        Now {
            ms: mapped.ms,
            ceil_ms: mapped.ms + u64::from(fraction),
        }
    }

    /// A watchdog turn (see [`stalls`]): the first one arms stall detection.
    pub fn watch(&self, now: Instant) {
        let since = now.saturating_duration_since(self.epoch);
        self.stalls.watch(since.as_millis() as u64);
    }

    /// The watchdog stopped: its silence is no stall.
    pub fn stop_watching(&self) {
        self.stalls.disarm();
    }

    /// The stalls accounted so far.
    pub fn stalls(&self) -> StallTotals {
        self.stalls.totals()
    }

    /// Stall time accounted since Unix time `unix_ms` (what a deadline set then was extended
    /// by, and what an expiry's lateness must still show).
    pub fn stalled_since_unix(&self, unix_ms: u64) -> u64 {
        self.stalls
            .stalled_since(unix_ms.saturating_sub(self.unix_ms_at_epoch))
    }

    /// The Unix time, in ms, of real time `real_ms` after the epoch (a stall's start).
    pub fn unix_ms_of_real(&self, real_ms: u64) -> u64 {
        self.unix_ms_at_epoch.saturating_add(real_ms)
    }

    /// Whole milliseconds elapsed between the epoch and `now`, rounded down.
    pub fn now_ms(&self, now: Instant) -> u64 {
        self.at(now).ms
    }

    /// The instant of registry time `ms`.
    pub fn instant_at(&self, ms: u64) -> Instant {
        let real_ms = self.stalls.unmap(ms.min(i64::MAX as u64) as i64).max(0) as u64;
        self.epoch + Duration::from_millis(real_ms)
    }

    /// The Unix time, in ms, of registry time `ms`.
    pub fn unix_ms(&self, ms: u64) -> u64 {
        let real_ms = self.stalls.unmap(ms.min(i64::MAX as u64) as i64);
        (self.unix_ms_at_epoch as i64)
            .saturating_add(real_ms)
            .max(0) as u64
    }

    /// Registry milliseconds of a Unix time; negative when it lies before the epoch.
    pub fn ms_from_unix(&self, unix_ms: i64) -> i64 {
        let real_ms = unix_ms.saturating_sub(self.unix_ms_at_epoch as i64);
        if real_ms < 0 {
            return real_ms;
        }
        self.stalls.map_quietly(real_ms as u64) as i64
    }
}

/// A Unix time in ms as RFC 3339 UTC with milliseconds, as every API and payload shows times.
pub fn rfc3339(unix_ms: u64) -> Rfc3339 {
    Rfc3339::from_unix_ms(unix_ms)
}

/// A time as `YYYY-MM-DDTHH:MM:SS.mmmZ`, formatted into a fixed buffer: answers and events
/// show several times each, and formatting them must not allocate (it is on the heartbeat
/// path). Times after 9999-12-31 show as that day's last millisecond.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Rfc3339([u8; 24]);

impl Rfc3339 {
    /// The last millisecond of year 9999.
    const MAX_UNIX_MS: u64 = 253_402_300_799_999;

    pub fn from_unix_ms(unix_ms: u64) -> Self {
        let unix_ms = unix_ms.min(Self::MAX_UNIX_MS);
        let days = unix_ms / 86_400_000;
        let ms_of_day = unix_ms % 86_400_000;
        let (year, month, day) = civil_from_days(days);
        let mut text = *b"0000-00-00T00:00:00.000Z";
        put_digits(&mut text[0..4], year);
        put_digits(&mut text[5..7], month);
        put_digits(&mut text[8..10], day);
        put_digits(&mut text[11..13], ms_of_day / 3_600_000);
        put_digits(&mut text[14..16], ms_of_day / 60_000 % 60);
        put_digits(&mut text[17..19], ms_of_day / 1000 % 60);
        put_digits(&mut text[20..23], ms_of_day % 1000);
        Self(text)
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("only ASCII digits and separators")
    }
}

/// Writes `value` as decimal digits filling `out` (zero-padded on the left).
fn put_digits(out: &mut [u8], mut value: u64) {
    for digit in out.iter_mut().rev() {
        *digit = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

/// Year, month, day of a day number since 1970-01-01 (H. Hinnant's `civil_from_days`, for
/// non-negative days).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

impl std::fmt::Display for Rfc3339 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Debug for Rfc3339 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl serde::Serialize for Rfc3339 {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
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

    /// The reference: humantime's formatter.
    fn reference(unix_ms: u64) -> String {
        humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(unix_ms)).to_string()
    }

    #[test]
    fn rfc3339_matches_the_reference_at_the_edges() {
        for unix_ms in [
            0,
            1,
            86_399_999,
            86_400_000,
            951_782_400_000,   // 2000-02-29
            1_709_164_800_000, // 2024-02-29
            4_107_542_399_999, // 2100-02-28T23:59:59.999
            4_107_542_400_000, // 2100-03-01 (no Feb 29 in 2100)
            Rfc3339::MAX_UNIX_MS,
        ] {
            assert_eq!(
                rfc3339(unix_ms).to_string(),
                reference(unix_ms),
                "{unix_ms}"
            );
        }
        assert_eq!(rfc3339(u64::MAX).as_str(), "9999-12-31T23:59:59.999Z");
        assert_eq!(
            serde_json::to_string(&rfc3339(1_000)).unwrap(),
            "\"1970-01-01T00:00:01.000Z\""
        );
    }

    proptest::proptest! {
        #[test]
        fn rfc3339_matches_the_reference(unix_ms in 0..=Rfc3339::MAX_UNIX_MS) {
            proptest::prop_assert_eq!(rfc3339(unix_ms).to_string(), reference(unix_ms));
        }
    }
}
