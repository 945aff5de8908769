//! Latency histograms, measurement windows and the stability criterion.

use hdrhistogram::Histogram;
use std::time::Duration;

/// Latencies are recorded in microseconds, from 1 µs to 10 minutes, with 3 significant
/// digits (0.1 % relative error at any magnitude).
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

/// Client-side figures of a measured interval.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Latency {
    /// Successful requests.
    pub count: u64,
    /// Failed requests (HTTP errors, timeouts, refused connections).
    pub errors: u64,
    /// Successful requests per second.
    pub throughput: f64,
    /// Mean, µs.
    pub mean_us: f64,
    /// Percentiles, µs.
    pub p50_us: u64,
    /// 90th percentile, µs.
    pub p90_us: u64,
    /// 95th percentile, µs.
    pub p95_us: u64,
    /// 99th percentile, µs.
    pub p99_us: u64,
    /// 99.9th percentile, µs.
    pub p999_us: u64,
    /// Largest, µs.
    pub max_us: u64,
    /// (quantile, µs) at quantiles 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 0.9999 and 1: the
    /// latency-by-percentile curve.
    pub curve: Vec<(f64, u64)>,
}

/// The quantiles of [`Latency::curve`].
pub const CURVE_QUANTILES: [f64; 8] = [0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 0.9999, 1.0];

impl Latency {
    /// Summarises `h` (µs) over `elapsed`, with `errors` failures.
    pub fn of(h: &Histogram<u64>, errors: u64, elapsed: Duration) -> Self {
        let secs = elapsed.as_secs_f64();
        let count = h.len();
        let q = |p: f64| if count == 0 { 0 } else { h.value_at_quantile(p) };
        Latency {
            count,
            errors,
            throughput: if secs > 0.0 { count as f64 / secs } else { 0.0 },
            mean_us: if count == 0 { 0.0 } else { h.mean() },
            p50_us: q(0.50),
            p90_us: q(0.90),
            p95_us: q(0.95),
            p99_us: q(0.99),
            p999_us: q(0.999),
            max_us: if count == 0 { 0 } else { h.max() },
            curve: match count {
                0 => Vec::new(),
                _ => CURVE_QUANTILES
                    .iter()
                    .map(|&p| (p, h.value_at_quantile(p)))
                    .collect(),
            },
        }
    }

    /// The latency a percentile names (50, 90, 95, 99, 99.9), or the mean for 0.
    pub fn at(&self, percentile: f64) -> f64 {
        match percentile {
            0.0 => self.mean_us,
            p if p <= 50.0 => self.p50_us as f64,
            p if p <= 90.0 => self.p90_us as f64,
            p if p <= 95.0 => self.p95_us as f64,
            p if p <= 99.0 => self.p99_us as f64,
            p if p <= 99.9 => self.p999_us as f64,
            _ => self.max_us as f64,
        }
    }
}

/// Checks a percentile flag: one of the reported ones, or 0 for the mean.
pub fn check_percentile(flag: &str, p: f64) -> anyhow::Result<f64> {
    const KNOWN: [f64; 6] = [0.0, 50.0, 90.0, 95.0, 99.0, 99.9];
    if KNOWN.contains(&p) {
        Ok(p)
    } else {
        anyhow::bail!("{flag} {p}: use 50, 90, 95, 99 or 99.9 (or 0 for the mean)")
    }
}

/// perf_analyzer's stability criterion: the last `n` windows' throughputs, and their
/// latencies at `percentile` (0: mean), each lie within ±`tolerance` (0.1 = 10 %) of
/// their means over those windows. Windows without a successful request are never stable.
pub fn stable(windows: &[Latency], n: usize, tolerance: f64, percentile: f64) -> bool {
    if n == 0 || windows.len() < n {
        return false;
    }
    let last = &windows[windows.len() - n..];
    if last.iter().any(|w| w.count == 0) {
        return false;
    }
    let within = |values: Vec<f64>| {
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        values.iter().all(|v| (v - mean).abs() <= tolerance * mean)
    };
    within(last.iter().map(|w| w.throughput).collect())
        && within(last.iter().map(|w| w.at(percentile)).collect())
}

/// Whether throughput has stopped growing: the last `n` windows' mean throughput is less
/// than `gain` (0.05 = 5 %) above the mean of the `n` windows before them.
pub fn plateaued(windows: &[Latency], n: usize, gain: f64) -> bool {
    if n == 0 || windows.len() < 2 * n {
        return false;
    }
    let mean = |w: &[Latency]| w.iter().map(|w| w.throughput).sum::<f64>() / w.len() as f64;
    let k = windows.len();
    let (before, last) = (mean(&windows[k - 2 * n..k - n]), mean(&windows[k - n..]));
    before > 0.0 && last < before * (1.0 + gain)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Percentiles of known distributions: a uniform 1..=10000 µs (the q-th percentile is
    /// q·100 µs) and an exponential one (the median is ln 2 · mean), within the
    /// histogram's 0.1 % precision.
    #[test]
    fn percentiles_of_known_distributions() {
        let mut h = new_histogram();
        for v in 1..=10_000u64 {
            h.record(v).unwrap();
        }
        let l = Latency::of(&h, 0, Duration::from_secs(2));
        assert_eq!(l.count, 10_000);
        assert_eq!(l.throughput, 5000.0);
        let near = |got: u64, want: f64| (got as f64 - want).abs() <= want * 0.001 + 1.0;
        assert!(near(l.p50_us, 5000.0), "{l:?}");
        assert!(near(l.p90_us, 9000.0), "{l:?}");
        assert!(near(l.p99_us, 9900.0), "{l:?}");
        assert!(near(l.p999_us, 9990.0), "{l:?}");
        assert!(near(l.max_us, 10_000.0), "{l:?}");
        assert!((l.mean_us - 5000.5).abs() < 5.0);

        // Exponential with mean 2000 µs by inverse transform on an even grid of quantiles.
        let mut h = new_histogram();
        let n = 100_000;
        for i in 0..n {
            let u = (i as f64 + 0.5) / n as f64;
            h.record((-(1.0 - u).ln() * 2000.0).round().max(1.0) as u64)
                .unwrap();
        }
        let l = Latency::of(&h, 0, Duration::from_secs(1));
        let want_p50 = 2f64.ln() * 2000.0;
        let want_p99 = -(0.01f64).ln() * 2000.0;
        assert!(
            (l.p50_us as f64 - want_p50).abs() < want_p50 * 0.002 + 1.0,
            "{l:?}"
        );
        assert!(
            (l.p99_us as f64 - want_p99).abs() < want_p99 * 0.002 + 1.0,
            "{l:?}"
        );
        assert!((l.mean_us - 2000.0).abs() < 5.0, "{l:?}");
    }

    fn window(throughput: f64, p99: u64) -> Latency {
        Latency {
            count: 100,
            throughput,
            p99_us: p99,
            mean_us: p99 as f64 / 2.0,
            ..Default::default()
        }
    }

    #[test]
    fn stability_needs_three_windows_within_ten_percent() {
        let w = |t: &[(f64, u64)]| t.iter().map(|&(a, b)| window(a, b)).collect::<Vec<_>>();
        assert!(
            !stable(&w(&[(100.0, 1000), (101.0, 1000)]), 3, 0.1, 99.0),
            "too few"
        );
        assert!(stable(
            &w(&[(10.0, 9), (100.0, 1000), (105.0, 1040), (96.0, 990)]),
            3,
            0.1,
            99.0
        ));
        assert!(
            !stable(&w(&[(100.0, 1000), (125.0, 1000), (100.0, 1000)]), 3, 0.1, 99.0),
            "throughput"
        );
        assert!(
            !stable(&w(&[(100.0, 1000), (100.0, 1300), (100.0, 1000)]), 3, 0.1, 99.0),
            "latency"
        );
        let mut empty = w(&[(100.0, 1000), (100.0, 1000), (100.0, 1000)]);
        empty[2].count = 0;
        assert!(!stable(&empty, 3, 0.1, 99.0), "a window without successes");
    }

    #[test]
    fn plateau_is_growth_below_the_threshold() {
        let w = |t: &[f64]| t.iter().map(|&a| window(a, 1000)).collect::<Vec<_>>();
        assert!(!plateaued(&w(&[100.0, 100.0, 100.0]), 2, 0.05), "too few");
        assert!(!plateaued(&w(&[100.0, 100.0, 120.0, 130.0]), 2, 0.05), "growing");
        assert!(plateaued(&w(&[100.0, 110.0, 108.0, 107.0]), 2, 0.05));
        assert!(check_percentile("--percentile", 99.0).is_ok());
        assert!(check_percentile("--percentile", 98.0).is_err());
    }
}
