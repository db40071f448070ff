//! Latency and lateness distributions (HdrHistogram: fixed memory, exact to 3 significant
//! digits, mergeable across connections) and how they are printed.

use std::fmt;
use std::time::Duration;

use hdrhistogram::Histogram;

/// A distribution of durations, recorded in microseconds from 1 µs to 10 minutes.
#[derive(Clone)]
pub struct Durations(Histogram<u64>);

impl Default for Durations {
    fn default() -> Self {
        Self(Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds"))
    }
}

impl Durations {
    pub fn record(&mut self, duration: Duration) {
        let micros = u64::try_from(duration.as_micros()).unwrap_or(u64::MAX);
        self.0.saturating_record(micros.max(1));
    }

    pub fn merge(&mut self, other: &Self) {
        // Same bounds on both sides, so adding cannot fail.
        self.0.add(&other.0).expect("histograms with equal bounds");
    }

    pub fn count(&self) -> u64 {
        self.0.len()
    }

    /// The duration at quantile `q` (0..=1); zero when nothing was recorded.
    pub fn quantile(&self, q: f64) -> Duration {
        if self.0.is_empty() {
            return Duration::ZERO;
        }
        Duration::from_micros(self.0.value_at_quantile(q))
    }

    pub fn max(&self) -> Duration {
        Duration::from_micros(self.0.max())
    }

    pub fn summary(&self) -> Summary {
        Summary {
            count: self.count(),
            p50: self.quantile(0.50),
            p99: self.quantile(0.99),
            p999: self.quantile(0.999),
            max: self.max(),
        }
    }
}

/// The percentiles the tool reports.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Summary {
    pub count: u64,
    #[serde(serialize_with = "as_ms")]
    pub p50: Duration,
    #[serde(serialize_with = "as_ms")]
    pub p99: Duration,
    #[serde(serialize_with = "as_ms")]
    pub p999: Duration,
    #[serde(serialize_with = "as_ms")]
    pub max: Duration,
}

fn as_ms<S: serde::Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64(ms(*duration))
}

/// Milliseconds with microsecond precision.
pub fn ms(duration: Duration) -> f64 {
    duration.as_micros() as f64 / 1000.0
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "n={} p50={:.3}ms p99={:.3}ms p999={:.3}ms max={:.3}ms",
            self.count,
            ms(self.p50),
            ms(self.p99),
            ms(self.p999),
            ms(self.max)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_of_a_known_distribution() {
        let mut durations = Durations::default();
        for micros in 1..=1000 {
            durations.record(Duration::from_micros(micros));
        }
        let summary = durations.summary();
        assert_eq!(summary.count, 1000);
        assert_eq!(summary.p50, Duration::from_micros(500));
        assert_eq!(summary.p99, Duration::from_micros(990));
        assert_eq!(summary.max, Duration::from_micros(1000));
    }

    #[test]
    fn merging_adds_counts_and_an_empty_one_reads_zero() {
        let mut a = Durations::default();
        let mut b = Durations::default();
        assert_eq!(a.quantile(0.99), Duration::ZERO);
        a.record(Duration::from_millis(1));
        b.record(Duration::from_millis(3));
        a.merge(&b);
        assert_eq!(a.count(), 2);
        assert_eq!(a.max().as_millis(), 3);
    }
}
