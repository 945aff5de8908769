//! The run report, `<run>/report.json`: what the trained model costs and what it reaches,
//! written at the end of `trident train` and `trident distill` (with the teacher beside
//! the student, and how much of the teacher's accuracy the student kept).
//!
//! How each figure is measured:
//! - `params`: elements of every parameter tensor; `size_bytes`: `best/model.safetensors`.
//! - `peak_rss_bytes`: the process's peak resident memory (`VmHWM`) when training ends,
//!   so it covers the teacher, the data and the optimizer state of the whole run.
//! - `latency`: single-example forward passes (batch 1, evaluation mode, padding trimmed
//!   for text) over the first test examples after a warm-up; percentiles in milliseconds.
//! - `test_examples_per_second`: the batched test-set evaluation (`eval_batch_size`).
//! - `epoch_seconds`: the training part of each epoch, as the trainer recorded it.

use crate::data::{Batch, Model};
use serde::Serialize;
use std::path::Path;
use std::time::Instant;
use trident_nn::Ctx;
use trident_train::trainer::Evaluation;
use trident_train::TrainStep;

/// Batch-1 forward latency.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub samples: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
}

/// One model's figures.
#[derive(Debug, Clone, Serialize)]
pub struct ModelFacts {
    pub params: usize,
    pub size_bytes: Option<u64>,
    /// A classifier's test accuracy and macro-F1 (absent for an autoencoder).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_accuracy: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_macro_f1: Option<f64>,
    /// The test loss (an autoencoder's: the mean squared error per value).
    pub test_loss: f64,
    pub test_examples_per_second: f64,
    pub latency: Latency,
}

/// Times `n` single-example forwards over the rows of `batch` (cycling), after 5 warm-up
/// passes.
pub fn latency(model: &Model, batch: &Batch, n: usize) -> anyhow::Result<Latency> {
    anyhow::ensure!(!batch.is_empty(), "no test example to time");
    let rows = batch.len();
    let ctx = Ctx::eval();
    let singles = (0..rows.min(n))
        .map(|i| batch.row(i))
        .collect::<candle_core::Result<Vec<_>>>()?;
    for s in singles.iter().cycle().take(5) {
        model.forward(s, &ctx)?;
    }
    let mut ms = Vec::with_capacity(n);
    for s in singles.iter().cycle().take(n) {
        let t = Instant::now();
        model.forward(s, &ctx)?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    let q = |p: f64| ms[((p * ms.len() as f64).ceil() as usize).clamp(1, ms.len()) - 1];
    Ok(Latency {
        samples: ms.len(),
        p50_ms: q(0.50),
        p90_ms: q(0.90),
        p99_ms: q(0.99),
    })
}

/// Figures of `model` from its test evaluation (and the seconds it took).
pub fn facts(
    model: &Model,
    ev: &Evaluation,
    eval_seconds: f64,
    first_test_batch: &Batch,
    weights: Option<&Path>,
) -> anyhow::Result<ModelFacts> {
    Ok(ModelFacts {
        params: model.param_count(),
        size_bytes: weights.and_then(|f| std::fs::metadata(f).ok()).map(|m| m.len()),
        test_accuracy: ev.report.as_ref().map(|r| r.accuracy),
        test_macro_f1: ev.report.as_ref().map(|r| r.macro_f1),
        test_loss: ev.loss,
        test_examples_per_second: ev.labels.len() as f64 / eval_seconds.max(1e-9),
        latency: latency(model, first_test_batch, 200)?,
    })
}

/// The whole report.
#[derive(Debug, Serialize)]
pub struct RunReport {
    pub student: ModelFacts,
    pub epoch_seconds: Vec<f64>,
    pub median_epoch_seconds: f64,
    pub peak_rss_bytes: Option<u64>,
    /// Distillation only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub distill: Option<DistillFacts>,
}

/// The teacher side of a distillation report.
#[derive(Debug, Serialize)]
pub struct DistillFacts {
    pub teacher: ModelFacts,
    pub mode: String,
    pub loss: String,
    /// Student parameters over teacher parameters.
    pub param_ratio: f64,
    /// Student accuracy over teacher accuracy, in %.
    pub accuracy_retained_pct: f64,
    pub macro_f1_retained_pct: f64,
    /// Teacher batch-1 p50 latency over the student's.
    pub latency_speedup: f64,
}

impl RunReport {
    /// A few lines for the terminal.
    pub fn summary(&self) -> String {
        let line = |name: &str, m: &ModelFacts| {
            let quality = match (m.test_accuracy, m.test_macro_f1) {
                (Some(a), Some(f)) => format!("accuracy {a:.4}  macro-F1 {f:.4}"),
                _ => format!("test loss {:.5}", m.test_loss),
            };
            format!(
                "  {name:<8} {:>10} params  {:>9}  {quality}  batch-1 p50 {:.3} ms  {:.0} ex/s batched\n",
                m.params,
                m.size_bytes
                    .map_or("-".into(), |b| format!("{:.1} KiB", b as f64 / 1024.0)),
                m.latency.p50_ms,
                m.test_examples_per_second
            )
        };
        let mut s = String::new();
        if let Some(d) = &self.distill {
            s += &line("teacher", &d.teacher);
        }
        s += &line(
            if self.distill.is_some() {
                "student"
            } else {
                "model"
            },
            &self.student,
        );
        if let Some(d) = &self.distill {
            s += &format!(
                "  student/teacher: {:.1} % of the parameters, {:.1} % of the accuracy, {:.1} % of the macro-F1, {:.1}x faster at batch 1\n",
                100.0 * d.param_ratio,
                d.accuracy_retained_pct,
                d.macro_f1_retained_pct,
                d.latency_speedup
            );
        }
        s += &format!(
            "  median epoch {:.1} s; peak memory {}",
            self.median_epoch_seconds,
            self.peak_rss_bytes.map_or("unknown".into(), |b| format!(
                "{:.0} MiB",
                b as f64 / (1 << 20) as f64
            ))
        );
        s
    }
}
