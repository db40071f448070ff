//! The timing rules, pure: how often a key heartbeats, how its interval is jittered, how long
//! to wait before a retry, and what `Retry-After` asks for.
//!
//! Nothing here reads a clock or a random source: callers pass `unit`, a number in `[0, 1)`
//! (from `fastrand::f64()` in the client), and the time, so every rule is tested exactly.
//!
//! The rules, and why:
//! - a key heartbeats every TTL/3 by default, and never less often than every TTL/2: two
//!   heartbeats may then be lost (or one retried several times) before the key expires, as
//!   etcd's lease keep-alive renews at a third of the TTL;
//! - each wait is shortened by up to [`INTERVAL_JITTER`] (never lengthened, so the TTL/2 bound
//!   holds): a fleet restarted at once drifts apart instead of heartbeating in lockstep;
//! - a retry waits `base * 2^(failures-1)`, capped, of which the second half is random ("equal
//!   jitter": at least half the delay, so a failing server is not hammered, and spread, so
//!   retries of many clients do not arrive together).

use std::time::{Duration, SystemTime};

/// The share of an interval a heartbeat may come early by: 20%.
pub const INTERVAL_JITTER: f64 = 0.2;

/// The shortest interval the client heartbeats at, unless the TTL itself is shorter than twice
/// it: a heartbeat is a round trip, and sub-millisecond intervals only load the server.
pub const MIN_INTERVAL: Duration = Duration::from_millis(1);

/// The interval a key with `ttl` heartbeats at: `wanted`, or TTL/3 by default, never more than
/// TTL/2 and not less than [`MIN_INTERVAL`] (unless TTL/2 is).
pub fn heartbeat_interval(ttl: Duration, wanted: Option<Duration>) -> Duration {
    let cap = ttl / 2;
    wanted
        .unwrap_or(ttl / 3)
        .min(cap)
        .max(MIN_INTERVAL.min(cap))
}

/// `interval` shortened by up to [`INTERVAL_JITTER`] of itself: `unit` in `[0, 1)` picks how
/// much (0: the full interval).
pub fn jittered(interval: Duration, unit: f64) -> Duration {
    interval.mul_f64(1.0 - INTERVAL_JITTER * unit.clamp(0.0, 1.0))
}

/// The wait before retry number `failures` (1 after the first failure): `base * 2^(failures-1)`
/// capped at `cap`, of which the upper half is random (`unit` in `[0, 1)`).
pub fn retry_delay(failures: u32, base: Duration, cap: Duration, unit: f64) -> Duration {
    let doublings = failures.saturating_sub(1).min(30);
    let delay = base.saturating_mul(1 << doublings).min(cap);
    delay / 2 + (delay / 2).mul_f64(unit.clamp(0.0, 1.0))
}

/// The wait a `Retry-After` value asks for: delay-seconds, or an HTTP date (none when it has
/// passed); `None` when unreadable.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);
    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_interval_is_a_third_of_the_ttl_and_never_above_half() {
        fn check(ttl: Duration, wanted: Option<Duration>, expected: Duration) {
            assert_eq!(
                heartbeat_interval(ttl, wanted),
                expected,
                "ttl {ttl:?}, wanted {wanted:?}"
            );
        }
        check(30 * S, None, 10 * S);
        check(3 * S, None, S);
        check(30 * S, Some(5 * S), 5 * S);
        check(30 * S, Some(15 * S), 15 * S);
        check(30 * S, Some(20 * S), 15 * S);
        check(30 * S, Some(Duration::ZERO), MS);
        check(
            10 * MS,
            None,
            Duration::from_micros(3333) + Duration::from_nanos(333),
        );
        // TTL/3 would be under the 1 ms floor: the floor, capped at TTL/2.
        check(MS, None, Duration::from_micros(500));
        check(2 * MS, None, MS);
        check(MS, Some(S), Duration::from_micros(500));
    }

    #[test]
    fn jitter_only_ever_shortens_an_interval_by_at_most_a_fifth() {
        let interval = 10 * S;
        assert_eq!(jittered(interval, 0.0), interval);
        assert_eq!(jittered(interval, 0.5), 9 * S);
        let shortest = jittered(interval, 0.999_999);
        assert!(
            shortest > 8 * S - MS && shortest <= interval,
            "{shortest:?}"
        );
        for step in 0..1000 {
            let unit = f64::from(step) / 1000.0;
            let waited = jittered(interval, unit);
            assert!(waited <= interval && waited >= 8 * S, "{unit}: {waited:?}");
        }
        // Out-of-range units are clamped, never lengthen.
        assert_eq!(jittered(interval, -1.0), interval);
        assert_eq!(jittered(interval, 7.0), 8 * S);
    }

    #[test]
    fn retries_double_up_to_the_cap_with_the_upper_half_random() {
        fn check(failures: u32, unit: f64, expected: Duration) {
            let got = retry_delay(failures, 100 * MS, 2 * S, unit);
            assert_eq!(got, expected, "failures {failures}, unit {unit}");
        }
        check(1, 0.0, 50 * MS);
        check(1, 0.5, 75 * MS);
        check(2, 0.0, 100 * MS);
        check(3, 0.0, 200 * MS);
        check(5, 0.0, 800 * MS);
        check(6, 0.0, S);
        check(6, 0.5, 1500 * MS);
        check(7, 0.0, S);
        check(u32::MAX, 0.0, S);
        check(0, 0.0, 50 * MS);
    }

    #[test]
    fn retry_after_is_read_as_seconds_or_as_a_date() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(parse_retry_after("3", now), Some(3 * S));
        assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
        let later = httpdate::fmt_http_date(now + 5 * S);
        assert_eq!(parse_retry_after(&later, now), Some(5 * S));
        let earlier = httpdate::fmt_http_date(now - 5 * S);
        assert_eq!(parse_retry_after(&earlier, now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-1", now), None);
    }
}
