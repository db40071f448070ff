//! Time as the registry sees it: milliseconds on the monotonic clock since the registry's epoch,
//! standing still across stalls of the process itself (see [`stalls`]).
//!
//! Deadlines live on `tokio::time::Instant` so tests control them with paused time. Wall-clock
//! time is the wall time read once at the epoch plus the monotonic time since, so a clock step
//! after start-up does not move any deadline (and is not reflected in the displayed times
//! either). It serves display, and absolute deadlines (`PEXPIREAT`).
//!
//! Rounding: an instant is read down to the millisecond (`now_ms`), and a deadline is computed from
//! the instant rounded *up* (`deadline_ms`), so `deadline_ms <= now_ms` is never true before the
//! exact deadline: expiry is never early, not even by a fraction of a millisecond. What is left
//! until a deadline is counted from the instant rounded up too (`Now::ms_left`), so it is never
//! more than what really is left.
//!
//! Absolute deadlines. A TTL once read 20,001 right after `PEXPIREAT now + 20 s`: what was left
//! was counted from `now` rounded down, one millisecond too many whenever the registry's
//! millisecond and the wall clock's do not begin together; it is counted from `now` rounded up.
//! The wall clock at the epoch is kept in nanoseconds rather than truncated to a millisecond
//! (the truncation made the registry's idea of the wall clock lag by up to a millisecond more,
//! which decides whether an instant is already past and is shown as "now"). It is read between
//! two monotonic readings and paired with the later one, so it is never ahead of the truth (ahead
//! would expire keys early), behind by at most the readings' spread, well under a microsecond
//! (before, a wall clock read a moment after the epoch's instant was taken as the epoch's, a
//! little ahead). A Unix instant becomes a registry
//! deadline rounded *up* (`ms_from_unix`: never early), a registry instant becomes Unix time
//! rounded *down* (`unix_ms`: a deadline shows as the instant asked for, "now" never later than
//! it is). Together: after `PEXPIREAT at`, the key is alive until the wall clock reaches `at`
//! and gone within the millisecond after, and its TTL read at any moment is at most `at` minus
//! the wall clock's whole milliseconds then.

pub mod stalls;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

pub use stalls::{Stall, StallTotals, Stalls};

/// An instant in epoch milliseconds: rounded down for "has it passed", up for new deadlines and
/// for what is left until one.
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

    /// Whole milliseconds left until `deadline_ms`, rounded down: never more than what really
    /// is left (0 once less than a millisecond is).
    pub fn ms_left(self, deadline_ms: u64) -> u64 {
        deadline_ms.saturating_sub(self.ceil_ms)
    }
}

/// Nanoseconds in a millisecond.
const NS_PER_MS: i128 = 1_000_000;

/// Wall-clock readings `Clock::new` takes, keeping the one whose two monotonic readings around
/// it are closest (a reading interrupted by the scheduler is not used).
const ANCHOR_READINGS: usize = 5;

/// Converts between instants, registry milliseconds and Unix milliseconds. Registry time is
/// real (monotonic) time since the epoch minus the stalls accounted so far.
#[derive(Debug)]
pub struct Clock {
    /// Monotonic time zero: ms and ticks count from here.
    epoch: Instant,
    /// Unix time in ns at `epoch`, read once; never ahead of the truth (see the module
    /// documentation). Only its whole ms below are used; tests check the reading itself.
    #[cfg(test)]
    unix_ns_at_epoch: i128,
    /// `unix_ns_at_epoch` in ms, rounded down and up: a whole number of ms after the epoch
    /// adds to these exactly, so the conversions on every expiry and event add rather than
    /// divide 128-bit numbers (a division took ~3 % of a mass expiry, measured).
    unix_ms_at_epoch_floor: i128,
    unix_ms_at_epoch_ceil: i128,
    stalls: Stalls,
}

impl Clock {
    pub fn new(epoch: Instant) -> Self {
        Self::with_unix_ns_at_epoch(epoch, unix_ns_at(epoch))
    }

    /// A clock whose epoch maps to the given Unix time (tests pin the wall clock with this).
    pub fn with_unix_ms_at_epoch(epoch: Instant, unix_ms_at_epoch: u64) -> Self {
        Self::with_unix_ns_at_epoch(epoch, i128::from(unix_ms_at_epoch) * NS_PER_MS)
    }

    /// A clock whose epoch maps to the given Unix time in ns (tests of sub-millisecond anchors).
    pub fn with_unix_ns_at_epoch(epoch: Instant, unix_ns_at_epoch: i128) -> Self {
        Self {
            epoch,
            #[cfg(test)]
            unix_ns_at_epoch,
            unix_ms_at_epoch_floor: unix_ns_at_epoch.div_euclid(NS_PER_MS),
            unix_ms_at_epoch_ceil: div_ceil(unix_ns_at_epoch, NS_PER_MS),
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
        // floor((unix_ms * 10^6 - anchor_ns) / 10^6) = unix_ms - ceil(anchor_ns / 10^6)
        let real_ms = i128::from(unix_ms) - self.unix_ms_at_epoch_ceil;
        let real_ms = real_ms.clamp(0, i128::from(u64::MAX)) as u64;
        self.stalls.stalled_since(real_ms)
    }

    /// The Unix time, in ms, of real time `real_ms` after the epoch (a stall's start), rounded
    /// down.
    pub fn unix_ms_of_real(&self, real_ms: u64) -> u64 {
        self.unix_ms_of_real_signed(i128::from(real_ms))
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

    /// The Unix time, in ms, of registry time `ms`, rounded down: the Unix instant a deadline
    /// from `ms_from_unix` was made from shows as itself.
    pub fn unix_ms(&self, ms: u64) -> u64 {
        let real_ms = self.stalls.unmap(ms.min(i64::MAX as u64) as i64);
        self.unix_ms_of_real_signed(i128::from(real_ms))
    }

    /// The first registry millisecond at or after a Unix time (rounded up, so a deadline made
    /// from it is never before that time); negative when it lies before the epoch.
    pub fn ms_from_unix(&self, unix_ms: i64) -> i64 {
        // ceil((unix_ms * 10^6 - anchor_ns) / 10^6) = unix_ms - floor(anchor_ns / 10^6)
        let real_ms = i128::from(unix_ms) - self.unix_ms_at_epoch_floor;
        let real_ms = real_ms.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64;
        if real_ms < 0 {
            return real_ms;
        }
        self.stalls.map_quietly(real_ms as u64) as i64
    }

    /// The Unix time, in ms, of real time `real_ms` after the epoch, rounded down (0 before
    /// 1970, `u64::MAX` past it).
    fn unix_ms_of_real_signed(&self, real_ms: i128) -> u64 {
        // floor((anchor_ns + real_ms * 10^6) / 10^6) = floor(anchor_ns / 10^6) + real_ms
        let unix_ms = self.unix_ms_at_epoch_floor + real_ms;
        unix_ms.clamp(0, i128::from(u64::MAX)) as u64
    }
}

/// The Unix time in ns at `epoch`, never ahead of the truth: the wall clock is read between
/// two monotonic readings and counted as if read at the later one (the reading with the closest
/// pair of the `ANCHOR_READINGS` is kept, so the error is that spread, a fraction of a
/// microsecond unless the thread was preempted in every one).
fn unix_ns_at(epoch: Instant) -> i128 {
    let mut best: Option<(Duration, SystemTime, Instant)> = None;
    for _ in 0..ANCHOR_READINGS {
        let before = Instant::now();
        let wall = SystemTime::now();
        let after = Instant::now();
        let spread = after.saturating_duration_since(before);
        if best.is_none_or(|(best_spread, _, _)| spread < best_spread) {
            best = Some((spread, wall, after));
        }
    }
    let (_, wall, after) = best.expect("ANCHOR_READINGS is at least 1");
    let wall_ns = match wall.duration_since(UNIX_EPOCH) {
        Ok(since) => since.as_nanos() as i128,
        Err(before_1970) => -(before_1970.duration().as_nanos() as i128),
    };
    let after_epoch_ns = after.saturating_duration_since(epoch).as_nanos() as i128;
    let before_epoch_ns = epoch.saturating_duration_since(after).as_nanos() as i128;
    wall_ns - after_epoch_ns + before_epoch_ns
}

/// `numerator / denominator` rounded up (towards positive infinity); `denominator > 0`.
fn div_ceil(numerator: i128, denominator: i128) -> i128 {
    -((-numerator).div_euclid(denominator))
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

    /// The case: a wall clock half a millisecond past a whole one at the epoch, read 0.7
    /// ms later, when the wall clock's millisecond has begun and the registry's has not: counted
    /// from `now` rounded down, what was left after `PEXPIREAT now + 20 s` read 20,001.
    #[test]
    fn an_absolute_deadline_is_never_early_and_its_ttl_never_overshoots() {
        let epoch = Instant::now();
        let clock = Clock::with_unix_ns_at_epoch(epoch, 1_000_000_500_000); // 1,000,000.5 ms
        let at = 1_020_001;
        let deadline_ms = clock.ms_from_unix(at);
        // The instant is 20,000.5 ms after the epoch: the deadline is the millisecond after.
        assert_eq!(deadline_ms, 20_001);
        assert_eq!(
            clock.unix_ms(20_001),
            1_020_001,
            "shown as the instant asked for"
        );
        // 0.7 ms after the epoch the wall clock reads 1,000,001.2: 20,000 ms are left, not 20,001.
        let now = clock.at(epoch + Duration::from_micros(700));
        assert_eq!(now.ms_left(20_001), 20_000);
        assert_eq!(clock.unix_ms(now.ms), 1_000_000, "now is never shown late");
        // Due at 20,001 ms after the epoch, when the wall clock reads 1,020,001.5.
        assert_eq!(clock.now_ms(epoch + Duration::from_millis(20_001)), 20_001);
        // Before the epoch, by less than a millisecond: rounded up to the epoch itself.
        assert_eq!(clock.ms_from_unix(1_000_000), 0);
        assert_eq!(clock.ms_from_unix(999_999), -1);
    }

    #[test]
    fn the_anchor_is_never_ahead_of_the_wall_clock_and_close_to_it() {
        let epoch = Instant::now();
        let clock = Clock::new(epoch);
        let (before, wall, after) = (Instant::now(), SystemTime::now(), Instant::now());
        let wall_ns = wall.duration_since(UNIX_EPOCH).unwrap().as_nanos() as i128;
        // The truth lies between these two: the wall clock was read between `before` and `after`.
        let latest = wall_ns - (before - epoch).as_nanos() as i128;
        let earliest = wall_ns - (after - epoch).as_nanos() as i128;
        assert!(clock.unix_ns_at_epoch <= latest, "never ahead of the truth");
        assert!(
            clock.unix_ns_at_epoch >= earliest - NS_PER_MS,
            "within a millisecond of it: {} vs {earliest}",
            clock.unix_ns_at_epoch
        );
    }

    proptest::proptest! {
        /// For any anchor (to the nanosecond), instant asked for and moment read: a deadline from
        /// `ms_from_unix` comes due no earlier than the instant, and less than a millisecond
        /// after; it shows as the instant; and the time left read at any moment before it never
        /// exceeds the instant minus the wall clock's whole milliseconds.
        #[test]
        fn absolute_deadlines_are_never_early_and_never_overshoot(
            anchor_fraction_ns in 0i128..1_000_000,
            ahead_ms in 1i64..100_000,
            read_at_ns in 0u64..100_000_000_000,
        ) {
            let epoch = Instant::now();
            let anchor_ns = 1_700_000_000_000 * NS_PER_MS + anchor_fraction_ns;
            let clock = Clock::with_unix_ns_at_epoch(epoch, anchor_ns);
            let at = (anchor_ns / NS_PER_MS) as i64 + ahead_ms;
            let deadline_ms = clock.ms_from_unix(at);
            proptest::prop_assert!(deadline_ms >= 0);
            let due_ns = anchor_ns + i128::from(deadline_ms) * NS_PER_MS;
            proptest::prop_assert!(due_ns >= i128::from(at) * NS_PER_MS, "early");
            proptest::prop_assert!(due_ns - NS_PER_MS < i128::from(at) * NS_PER_MS, "late");
            proptest::prop_assert_eq!(clock.unix_ms(deadline_ms as u64), at as u64);
            let now = clock.at(epoch + Duration::from_nanos(read_at_ns));
            if now.ms < deadline_ms as u64 {
                let wall_ms = (anchor_ns + i128::from(read_at_ns)) / NS_PER_MS;
                let left = i128::from(now.ms_left(deadline_ms as u64));
                proptest::prop_assert!(left <= i128::from(at) - wall_ms, "{left} left");
                proptest::prop_assert!(
                    i128::from(clock.unix_ms(now.ms)) <= wall_ms,
                    "now shown late"
                );
            }
        }

        /// The conversions' additions give what dividing the nanoseconds gives, for anchors
        /// before and after 1970 and times before and after the epoch.
        #[test]
        fn the_conversions_add_what_a_division_gives(
            anchor_ns in -4_000_000_000_000_000_000i128..4_000_000_000_000_000_000,
            real_ms in -1_000_000_000_000i64..1_000_000_000_000,
            unix_ms in -1_000_000_000_000i64..5_000_000_000_000,
        ) {
            let clock = Clock::with_unix_ns_at_epoch(Instant::now(), anchor_ns);
            let clamp_u64 = |ms: i128| ms.clamp(0, i128::from(u64::MAX)) as u64;
            let by_division = clamp_u64(
                (anchor_ns + i128::from(real_ms) * NS_PER_MS).div_euclid(NS_PER_MS),
            );
            proptest::prop_assert_eq!(clock.unix_ms_of_real_signed(i128::from(real_ms)), by_division);
            let real_ns = i128::from(unix_ms) * NS_PER_MS - anchor_ns;
            let from_unix = i128::from(unix_ms) - clock.unix_ms_at_epoch_floor;
            proptest::prop_assert_eq!(from_unix, div_ceil(real_ns, NS_PER_MS));
            let since_unix = i128::from(unix_ms) - clock.unix_ms_at_epoch_ceil;
            proptest::prop_assert_eq!(since_unix, real_ns.div_euclid(NS_PER_MS));
        }

        /// Registry milliseconds survive a trip through Unix time and back.
        #[test]
        fn registry_milliseconds_round_trip_through_unix_time(
            anchor_fraction_ns in 0i128..1_000_000,
            ms in 0u64..1_000_000_000,
        ) {
            let anchor_ns = 1_700_000_000_000 * NS_PER_MS + anchor_fraction_ns;
            let clock = Clock::with_unix_ns_at_epoch(Instant::now(), anchor_ns);
            proptest::prop_assert_eq!(clock.ms_from_unix(clock.unix_ms(ms) as i64), ms as i64);
        }
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
