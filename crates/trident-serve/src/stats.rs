//! Per model-version statistics: one set of counters that feeds both Triton's
//! statistics API (`v2/models/{m}/stats`) and the Prometheus metrics, so the two can
//! never disagree.

use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A count and a cumulative duration.
#[derive(Debug, Default)]
pub struct DurationStat {
    count: AtomicU64,
    ns: AtomicU64,
}

impl DurationStat {
    /// Adds one observation.
    pub fn record(&self, d: Duration) {
        self.record_n(1, d);
    }

    /// Adds `n` observations taking `d` in total.
    pub fn record_n(&self, n: u64, d: Duration) {
        self.count.fetch_add(n, Relaxed);
        self.ns.fetch_add(d.as_nanos() as u64, Relaxed);
    }

    /// Current values.
    pub fn snapshot(&self) -> DurationSnapshot {
        DurationSnapshot {
            count: self.count.load(Relaxed),
            ns: self.ns.load(Relaxed),
        }
    }
}

/// `{count, ns}` as Triton reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DurationSnapshot {
    /// Observations.
    pub count: u64,
    /// Cumulative nanoseconds.
    pub ns: u64,
}

/// Upper bounds (µs) of the latency histogram buckets: 10 µs steps where server
/// overhead lives, coarser above.
pub const LATENCY_BUCKETS_US: [u64; 32] = [
    10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 125, 150, 175, 200, 250, 300, 400, 500, 750, 1_000, 1_500,
    2_000, 3_000, 5_000, 7_500, 10_000, 20_000, 50_000, 100_000, 250_000, 500_000, 1_000_000,
];

/// A fixed-bucket latency histogram (Prometheus style: per-bucket counts, sum, count),
/// so percentiles of a time window can be computed from two scrapes.
#[derive(Debug)]
pub struct Histogram {
    /// One count per bucket of [`LATENCY_BUCKETS_US`] plus the overflow bucket.
    buckets: [AtomicU64; LATENCY_BUCKETS_US.len() + 1],
    sum_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    /// Adds one observation.
    pub fn record(&self, d: Duration) {
        let us = d.as_micros() as u64;
        let i = LATENCY_BUCKETS_US.partition_point(|&b| b < us);
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(d.as_nanos() as u64, Relaxed);
    }

    /// Current values.
    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            buckets: self.buckets.iter().map(|b| b.load(Relaxed)).collect(),
            sum_ns: self.sum_ns.load(Relaxed),
        }
    }
}

/// Per-bucket (not cumulative) counts, the last one for values above every bound.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HistogramSnapshot {
    /// Counts per bucket of [`LATENCY_BUCKETS_US`], then the overflow bucket.
    pub buckets: Vec<u64>,
    /// Sum of observations in nanoseconds.
    pub sum_ns: u64,
}

impl HistogramSnapshot {
    /// Number of observations (all buckets).
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

/// Request-level durations.
#[derive(Debug, Default)]
pub struct InferenceStats {
    /// Successful requests, end to end inside the server.
    pub success: DurationStat,
    /// Failed requests.
    pub fail: DurationStat,
    /// Time in the scheduler queue.
    pub queue: DurationStat,
    /// Preparing inputs (batch assembly, conversion to the engine's tensors).
    pub compute_input: DurationStat,
    /// Running the model.
    pub compute_infer: DurationStat,
    /// Extracting and splitting outputs.
    pub compute_output: DurationStat,
    /// Requests answered from the response cache (lookup time).
    pub cache_hit: DurationStat,
    /// Requests the response cache did not hold (lookup + insertion time).
    pub cache_miss: DurationStat,
}

#[derive(Debug, Default)]
struct BatchStat {
    compute_input: DurationStat,
    compute_infer: DurationStat,
    compute_output: DurationStat,
}

/// All statistics of one model version.
#[derive(Debug, Default)]
pub struct ModelStats {
    /// Request-level durations.
    pub inference: InferenceStats,
    inference_count: AtomicU64,
    execution_count: AtomicU64,
    last_inference_ms: AtomicU64,
    pending: AtomicI64,
    batches: Mutex<BTreeMap<usize, BatchStat>>,
    /// Successful requests' durations inside the server.
    pub request_latency: Histogram,
    /// Successful requests' duration minus the model time of their execution.
    pub overhead_latency: Histogram,
}

/// Durations of one execution.
#[derive(Debug, Clone, Copy)]
pub struct ExecutionTimes {
    /// Input preparation.
    pub input: Duration,
    /// Model run.
    pub infer: Duration,
    /// Output extraction.
    pub output: Duration,
}

impl ModelStats {
    /// Records one execution of `rows` rows that served `requests` requests.
    pub fn record_execution(&self, rows: usize, requests: usize, t: ExecutionTimes) {
        self.execution_count.fetch_add(1, Relaxed);
        self.inference_count.fetch_add(rows as u64, Relaxed);
        let n = requests as u64;
        // Triton attributes the whole batch's compute time to each request in it.
        self.inference
            .compute_input
            .record_n(n, t.input * requests as u32);
        self.inference
            .compute_infer
            .record_n(n, t.infer * requests as u32);
        self.inference
            .compute_output
            .record_n(n, t.output * requests as u32);
        let mut batches = self.batches.lock().expect("stats lock");
        let b = batches.entry(rows).or_default();
        b.compute_input.record(t.input);
        b.compute_infer.record(t.infer);
        b.compute_output.record(t.output);
    }

    /// Records a successful request that took `d` in the server, of which
    /// `compute_infer` was the model time of the execution that served it.
    pub fn record_success(&self, d: Duration, compute_infer: Duration) {
        self.inference.success.record(d);
        self.request_latency.record(d);
        self.overhead_latency.record(d.saturating_sub(compute_infer));
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        self.last_inference_ms.store(now.as_millis() as u64, Relaxed);
    }

    /// Records a failed request.
    pub fn record_failure(&self, d: Duration) {
        self.inference.fail.record(d);
    }

    /// Counts a request in unless `limit` requests are already pending; on refusal
    /// returns how many were. One atomic step, so concurrent arrivals cannot overshoot.
    pub fn try_add_pending(&self, limit: usize) -> Result<(), i64> {
        let before = self.pending.fetch_add(1, Relaxed);
        if before >= limit as i64 {
            self.pending.fetch_sub(1, Relaxed);
            return Err(before);
        }
        Ok(())
    }

    /// A request left the model's queue or execution.
    pub fn remove_pending(&self) {
        self.pending.fetch_sub(1, Relaxed);
    }

    /// Requests queued or executing now.
    pub fn pending(&self) -> i64 {
        self.pending.load(Relaxed)
    }

    /// A consistent-enough copy for reporting.
    pub fn snapshot(&self, name: &str, version: i64) -> ModelStatSnapshot {
        let i = &self.inference;
        let batch_stats = self
            .batches
            .lock()
            .expect("stats lock")
            .iter()
            .map(|(&batch_size, b)| BatchSnapshot {
                batch_size,
                compute_input: b.compute_input.snapshot(),
                compute_infer: b.compute_infer.snapshot(),
                compute_output: b.compute_output.snapshot(),
            })
            .collect();
        ModelStatSnapshot {
            name: name.to_string(),
            version: version.to_string(),
            last_inference: self.last_inference_ms.load(Relaxed),
            inference_count: self.inference_count.load(Relaxed),
            execution_count: self.execution_count.load(Relaxed),
            inference_stats: InferenceSnapshot {
                success: i.success.snapshot(),
                fail: i.fail.snapshot(),
                queue: i.queue.snapshot(),
                compute_input: i.compute_input.snapshot(),
                compute_infer: i.compute_infer.snapshot(),
                compute_output: i.compute_output.snapshot(),
                cache_hit: i.cache_hit.snapshot(),
                cache_miss: i.cache_miss.snapshot(),
            },
            response_stats: BTreeMap::new(),
            batch_stats,
            memory_usage: Vec::new(),
            pending_request_count: self.pending(),
            request_latency: self.request_latency.snapshot(),
            overhead_latency: self.overhead_latency.snapshot(),
        }
    }
}

/// One entry of Triton's `model_stats` array.
#[derive(Debug, Clone, Serialize)]
pub struct ModelStatSnapshot {
    /// Model name.
    pub name: String,
    /// Version as a string.
    pub version: String,
    /// Milliseconds since the epoch of the last successful request (0 = never).
    pub last_inference: u64,
    /// Rows inferred.
    pub inference_count: u64,
    /// Executions.
    pub execution_count: u64,
    /// Request-level durations.
    pub inference_stats: InferenceSnapshot,
    /// Decoupled-model statistics per response index (not kept yet: reported empty).
    pub response_stats: BTreeMap<String, serde_json::Value>,
    /// Per batch size.
    pub batch_stats: Vec<BatchSnapshot>,
    /// Memory usage (not measured yet, reported empty as Triton does on CPU).
    pub memory_usage: Vec<serde_json::Value>,
    /// Queued or executing requests (not in Triton's JSON; used for the gauge).
    #[serde(skip)]
    pub pending_request_count: i64,
    /// Request duration histogram (metrics only, not in Triton's JSON).
    #[serde(skip)]
    pub request_latency: HistogramSnapshot,
    /// Overhead histogram (metrics only, not in Triton's JSON).
    #[serde(skip)]
    pub overhead_latency: HistogramSnapshot,
}

/// Triton's `$inference_stats`.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct InferenceSnapshot {
    pub success: DurationSnapshot,
    pub fail: DurationSnapshot,
    pub queue: DurationSnapshot,
    pub compute_input: DurationSnapshot,
    pub compute_infer: DurationSnapshot,
    pub compute_output: DurationSnapshot,
    /// Requests answered from the response cache.
    pub cache_hit: DurationSnapshot,
    /// Requests the response cache did not hold.
    pub cache_miss: DurationSnapshot,
}

/// Triton's `$batch_stats`.
#[derive(Debug, Clone, Serialize)]
#[allow(missing_docs)]
pub struct BatchSnapshot {
    pub batch_size: usize,
    pub compute_input: DurationSnapshot,
    pub compute_infer: DurationSnapshot,
    pub compute_output: DurationSnapshot,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_by_upper_bound() {
        let h = Histogram::default();
        for us in [0, 10, 11, 95, 2_000_000] {
            h.record(Duration::from_micros(us));
        }
        let s = h.snapshot();
        assert_eq!(s.count(), 5);
        assert_eq!(s.buckets[0], 2, "0 and 10 µs are <= 10");
        assert_eq!(s.buckets[1], 1, "11 µs is in (10, 20]");
        assert_eq!(s.buckets[9], 1, "95 µs is in (90, 100]");
        assert_eq!(s.buckets[LATENCY_BUCKETS_US.len()], 1, "2 s overflows");
        assert_eq!(s.sum_ns, 2_000_116_000);
    }

    #[test]
    fn pending_never_exceeds_the_limit_under_contention() {
        let stats = std::sync::Arc::new(ModelStats::default());
        let admitted: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| (0..1000).filter(|_| stats.try_add_pending(5).is_ok()).count()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(
            admitted, 5,
            "nothing is removed, so exactly the limit is admitted"
        );
        assert_eq!(stats.pending(), 5);
        assert_eq!(stats.try_add_pending(5), Err(5));
        stats.remove_pending();
        assert!(stats.try_add_pending(5).is_ok());
    }
}
