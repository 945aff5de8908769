//! Prometheus text exposition of the per-model statistics, with Triton's metric names
//! (`nv_inference_*`, labelled by model and version). The numbers come from the same
//! counters as the statistics API. Written by hand: the format is a few lines of text,
//! and a metrics crate would keep a second copy of every counter.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::fmt::Write;
use std::sync::Arc;
use trident_serve::stats::{HistogramSnapshot, ModelStatSnapshot, LATENCY_BUCKETS_US};
use trident_serve::Repository;

pub(crate) fn router(repository: Arc<Repository>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .with_state(repository)
}

async fn metrics(State(repository): State<Arc<Repository>>) -> impl IntoResponse {
    let stats = repository.stats(None, None).unwrap_or_default();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        render(&stats),
    )
}

type Metric = (
    &'static str,
    &'static str,
    &'static str,
    fn(&ModelStatSnapshot) -> u64,
);

const METRICS: &[Metric] = &[
    (
        "nv_inference_request_success",
        "counter",
        "Number of successful inference requests, all batch sizes",
        |s| s.inference_stats.success.count,
    ),
    (
        "nv_inference_request_failure",
        "counter",
        "Number of failed inference requests, all batch sizes",
        |s| s.inference_stats.fail.count,
    ),
    (
        "nv_inference_count",
        "counter",
        "Number of inferences performed (a batch of n counts n)",
        |s| s.inference_count,
    ),
    (
        "nv_inference_exec_count",
        "counter",
        "Number of model executions performed",
        |s| s.execution_count,
    ),
    (
        "nv_inference_request_duration_us",
        "counter",
        "Cumulative inference request duration in microseconds",
        |s| s.inference_stats.success.ns / 1000,
    ),
    (
        "nv_inference_queue_duration_us",
        "counter",
        "Cumulative inference queuing duration in microseconds",
        |s| s.inference_stats.queue.ns / 1000,
    ),
    (
        "nv_inference_compute_input_duration_us",
        "counter",
        "Cumulative compute input duration in microseconds",
        |s| s.inference_stats.compute_input.ns / 1000,
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "counter",
        "Cumulative compute inference duration in microseconds",
        |s| s.inference_stats.compute_infer.ns / 1000,
    ),
    (
        "nv_inference_compute_output_duration_us",
        "counter",
        "Cumulative inference compute output duration in microseconds",
        |s| s.inference_stats.compute_output.ns / 1000,
    ),
    (
        "nv_cache_num_hits_per_model",
        "counter",
        "Number of cache hits per model",
        |s| s.inference_stats.cache_hit.count,
    ),
    (
        "nv_cache_num_misses_per_model",
        "counter",
        "Number of cache misses per model",
        |s| s.inference_stats.cache_miss.count,
    ),
    (
        "nv_cache_hit_duration_per_model",
        "counter",
        "Total cache hit duration per model, in microseconds",
        |s| s.inference_stats.cache_hit.ns / 1000,
    ),
    (
        "nv_cache_miss_duration_per_model",
        "counter",
        "Total cache miss (insert + lookup) duration per model, in microseconds",
        |s| s.inference_stats.cache_miss.ns / 1000,
    ),
    (
        "nv_inference_pending_request_count",
        "gauge",
        "Instantaneous number of pending requests awaiting execution per-model",
        |s| s.pending_request_count.max(0) as u64,
    ),
];

type HistogramMetric = (
    &'static str,
    &'static str,
    fn(&ModelStatSnapshot) -> &HistogramSnapshot,
);

/// Trident's own histograms (Triton has no per-request latency distribution with
/// buckets): percentiles of any time window come from two scrapes.
const HISTOGRAMS: &[HistogramMetric] = &[
    (
        "trident_request_duration_us",
        "Successful request duration inside the server, microseconds",
        |s| &s.request_latency,
    ),
    (
        "trident_request_overhead_us",
        "Successful request duration minus its execution's compute_infer, microseconds",
        |s| &s.overhead_latency,
    ),
];

/// Renders the exposition text for the given model versions.
pub(crate) fn render(stats: &[ModelStatSnapshot]) -> String {
    let mut out = String::new();
    for (name, help, histogram) in HISTOGRAMS {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for s in stats {
            let (labels, h) = (labels(s), histogram(s));
            let bounds = LATENCY_BUCKETS_US
                .iter()
                .map(u64::to_string)
                .chain(["+Inf".to_string()]);
            let mut cumulative = 0;
            for (bound, count) in bounds.zip(&h.buckets) {
                cumulative += count;
                let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
            }
            let _ = writeln!(out, "{name}_sum{{{labels}}} {}", h.sum_ns as f64 / 1000.0);
            let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
        }
    }
    for (name, kind, help, value) in METRICS {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for s in stats {
            let _ = writeln!(out, "{name}{{{}}} {}", labels(s), value(s));
        }
    }
    out
}

/// `model="…",version="…"`.
fn labels(s: &ModelStatSnapshot) -> String {
    format!("model=\"{}\",version=\"{}\"", escape_label(&s.name), s.version)
}

/// A label value as the text exposition format wants it: backslash, double quote and
/// line feed escaped, so no model name can end a line and forge a metric.
fn escape_label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_cannot_break_out_of_their_line() {
        let escaped = escape_label("a\"b\\c\nnv_inference_count{model=\"x\"} 999");
        assert!(!escaped.contains('\n'), "{escaped}");
        assert_eq!(escaped, "a\\\"b\\\\c\\nnv_inference_count{model=\\\"x\\\"} 999");
        assert_eq!(escape_label("plain"), "plain");
    }
}
