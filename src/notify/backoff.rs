//! When to try a failed delivery again.
//!
//! The wait after the n-th failed attempt is the n-th entry of the schedule (the last entry
//! repeats), scaled by a random factor in [0.8, 1.2] so that receivers recovering from an outage
//! are not hit by every retry at once. A 429 or 503 answer with a `Retry-After` header sets the
//! wait instead, capped at [`MAX_RETRY_AFTER`] so a wrong header cannot park an event for days.
//! Pure functions: the random factor and the current wall time come in as arguments.

use std::time::{Duration, SystemTime};

/// The default schedule: 1 s, 5 s, 30 s, 2 min, 10 min, 30 min, then 1 h between attempts.
pub const DEFAULT_SCHEDULE: &str = "1s,5s,30s,2m,10m,30m,1h";

/// Longest wait a `Retry-After` header can ask for.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// Relative spread of the jitter: the wait is scaled by a factor in `[1 - JITTER, 1 + JITTER]`.
pub const JITTER: f64 = 0.2;

/// The wait after `failed_attempts` (1 for the first failure) failed attempts; `unit_random` is
/// uniform in [0, 1) and sets the jitter.
pub fn delay(schedule: &[Duration], failed_attempts: u32, unit_random: f64) -> Duration {
    let index = (failed_attempts.max(1) as usize - 1).min(schedule.len().saturating_sub(1));
    let base = schedule
        .get(index)
        .copied()
        .unwrap_or(Duration::from_secs(1));
    base.mul_f64(1.0 - JITTER + 2.0 * JITTER * unit_random.clamp(0.0, 1.0))
}

/// The wait a `Retry-After` header value asks for: delta-seconds or an HTTP date (RFC 9110).
/// `None` when it is neither; a date in the past means "now".
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    let wait = match value.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => {
            let at = httpdate::parse_http_date(value).ok()?;
            at.duration_since(now).unwrap_or(Duration::ZERO)
        }
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule() -> Vec<Duration> {
        DEFAULT_SCHEDULE
            .split(',')
            .map(|text| humantime::parse_duration(text).unwrap())
            .collect()
    }

    #[test]
    fn follows_the_schedule_and_repeats_its_last_step() {
        let schedule = schedule();
        let middle = 0.5; // no jitter
        assert_eq!(delay(&schedule, 1, middle), Duration::from_secs(1));
        assert_eq!(delay(&schedule, 2, middle), Duration::from_secs(5));
        assert_eq!(delay(&schedule, 4, middle), Duration::from_secs(120));
        assert_eq!(delay(&schedule, 7, middle), Duration::from_secs(3600));
        assert_eq!(delay(&schedule, 30, middle), Duration::from_secs(3600));
    }

    #[test]
    fn jitter_stays_within_twenty_percent() {
        let schedule = schedule();
        assert_eq!(delay(&schedule, 3, 0.0), Duration::from_secs(24));
        assert_eq!(delay(&schedule, 3, 1.0), Duration::from_secs(36));
        for step in 0..100 {
            let wait = delay(&schedule, 2, f64::from(step) / 100.0);
            assert!((Duration::from_secs(4)..=Duration::from_secs(6)).contains(&wait));
        }
    }

    #[test]
    fn reads_retry_after_as_seconds_or_http_date() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:50:07 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("86400", now), Some(MAX_RETRY_AFTER));
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-5", now), None);
    }
}
