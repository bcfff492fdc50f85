//! Latency recording: an HDR histogram of microseconds (1 µs to 1 h, 3 significant digits) and
//! the percentile summary the report prints.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Largest latency recorded exactly, in microseconds (one hour); longer ones saturate.
const MAX_US: u64 = 3_600_000_000;

/// A latency histogram in microseconds, mergeable across threads.
#[derive(Debug, Clone)]
pub struct LatencyHist {
    hist: Histogram<u64>,
}

impl Default for LatencyHist {
    fn default() -> Self {
        LatencyHist::new()
    }
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Number of recorded latencies.
    pub count: u64,
    /// Smallest.
    pub min: f64,
    /// Mean.
    pub mean: f64,
    /// Standard deviation.
    pub stdev: f64,
    /// Median.
    pub p50: f64,
    /// 75th percentile.
    pub p75: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// 99.99th percentile.
    pub p9999: f64,
    /// Largest.
    pub max: f64,
}

impl LatencyHist {
    /// An empty histogram.
    pub fn new() -> LatencyHist {
        // Bounds are constants that `new_with_bounds` accepts (1 <= low, high >= 2 * low,
        // sigfig <= 5), so this cannot fail.
        let hist = Histogram::new_with_bounds(1, MAX_US, 3)
            .unwrap_or_else(|_| unreachable!("constant histogram bounds are valid"));
        LatencyHist { hist }
    }

    /// Records one latency.
    pub fn record(&mut self, latency: Duration) {
        self.record_us(u64::try_from(latency.as_micros()).unwrap_or(u64::MAX));
    }

    /// Records one latency given in microseconds (saturating at one hour).
    pub fn record_us(&mut self, us: u64) {
        self.hist.saturating_record(us.min(MAX_US));
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &LatencyHist) {
        // Same bounds on both sides, so `add` cannot fail.
        let _ = self.hist.add(&other.hist);
    }

    /// Number of recorded values.
    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    /// The value at quantile `q` (0..=1), in microseconds.
    pub fn quantile_us(&self, q: f64) -> u64 {
        self.hist.value_at_quantile(q)
    }

    /// The percentile summary, in milliseconds (all zero when empty).
    pub fn summary(&self) -> LatencySummary {
        if self.hist.is_empty() {
            return LatencySummary::default();
        }
        let ms = |us: u64| us as f64 / 1000.0;
        LatencySummary {
            count: self.hist.len(),
            min: ms(self.hist.min()),
            mean: self.hist.mean() / 1000.0,
            stdev: self.hist.stdev() / 1000.0,
            p50: ms(self.quantile_us(0.50)),
            p75: ms(self.quantile_us(0.75)),
            p90: ms(self.quantile_us(0.90)),
            p99: ms(self.quantile_us(0.99)),
            p999: ms(self.quantile_us(0.999)),
            p9999: ms(self.quantile_us(0.9999)),
            max: ms(self.hist.max()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn within(value: u64, expect: u64) -> bool {
        // Three significant digits: relative error at most 0.1%.
        value.abs_diff(expect) as f64 <= expect as f64 * 0.001 + 1.0
    }

    #[test]
    fn uniform_1_to_1000() {
        let mut h = LatencyHist::new();
        for v in 1..=1000 {
            h.record_us(v);
        }
        assert_eq!(h.count(), 1000);
        // Below 2048 the buckets are exact.
        assert_eq!(h.quantile_us(0.5), 500);
        assert_eq!(h.quantile_us(0.75), 750);
        assert_eq!(h.quantile_us(0.9), 900);
        assert_eq!(h.quantile_us(0.99), 990);
        assert_eq!(h.quantile_us(0.999), 999);
        assert_eq!(h.quantile_us(1.0), 1000);
        let s = h.summary();
        assert_eq!((s.min, s.max), (0.001, 1.0));
        assert!((s.mean - 0.5005).abs() < 1e-9);
        assert!((s.stdev - 0.288_674).abs() < 1e-5, "stdev {}", s.stdev);
    }

    #[test]
    fn large_values_within_precision_and_merge() {
        // 1..=100_000 ms in µs, split over two histograms as two threads would.
        let mut a = LatencyHist::new();
        let mut b = LatencyHist::new();
        for v in 1..=100_000u64 {
            let target = if v % 2 == 0 { &mut a } else { &mut b };
            target.record(Duration::from_millis(v));
        }
        a.merge(&b);
        assert_eq!(a.count(), 100_000);
        for (q, expect_ms) in [
            (0.5, 50_000u64),
            (0.9, 90_000),
            (0.99, 99_000),
            (0.999, 99_900),
        ] {
            let got = a.quantile_us(q);
            assert!(within(got, expect_ms * 1000), "q{q}: {got}");
        }
        let s = a.summary();
        assert!(within((s.max * 1000.0) as u64, 100_000_000));
    }

    #[test]
    fn bimodal_distribution_tail() {
        // 99% fast (1 ms), 1% stalled (1 s): p99 is still fast, p99.9 sees the stall.
        let mut h = LatencyHist::new();
        for i in 0..10_000 {
            h.record(Duration::from_millis(if i % 100 == 0 { 1000 } else { 1 }));
        }
        let s = h.summary();
        assert_eq!(s.p50, 1.0);
        assert_eq!(s.p99, 1.0);
        assert!(within((s.p999 * 1000.0) as u64, 1_000_000));
        assert!((s.mean - 10.99).abs() < 0.05, "mean {}", s.mean);
    }

    #[test]
    fn empty_and_saturating() {
        assert_eq!(LatencyHist::new().summary(), LatencySummary::default());
        let mut h = LatencyHist::new();
        h.record(Duration::from_secs(10_000));
        assert!(within(h.quantile_us(1.0), MAX_US));
    }
}
