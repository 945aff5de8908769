//! An epoch's record: the loop's counters and the task's figures by name. In
//! `metrics.jsonl` a line keeps the columns every reader knows (`train_loss`,
//! `train_accuracy`, `val_loss`, `val_accuracy`, `val_macro_f1`, null where the task has
//! none) and puts a task's other figures under `figures`; TensorBoard shows the known ones
//! under their tags (`val/accuracy`) and the others as `epoch/<name>`.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// An epoch's figures by name (`train_loss`, `val_accuracy`, a GAN's `val_fd`, …).
pub type Metrics = BTreeMap<String, f64>;

/// The figures with a column of their own in `metrics.jsonl`, and their TensorBoard tags.
const COLUMNS: [(&str, &str); 5] = [
    ("train_loss", "epoch/train_loss"),
    ("train_accuracy", "epoch/train_accuracy"),
    ("val_loss", "val/loss"),
    ("val_accuracy", "val/accuracy"),
    ("val_macro_f1", "val/macro_f1"),
];

/// One epoch's line in `metrics.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(from = "Line", into = "Line")]
pub struct EpochRecord {
    /// Epoch (0-based).
    pub epoch: u64,
    /// Optimizer steps so far.
    pub step: u64,
    /// Learning rate of the epoch's last optimizer step.
    pub lr: f64,
    /// Wall time of the epoch's training part, seconds.
    pub epoch_seconds: f64,
    /// Units of progress (training examples) per second.
    pub examples_per_second: f64,
    /// The epoch's figures by name: `train_loss` always, then the task's.
    pub metrics: Metrics,
}

impl EpochRecord {
    /// The figure named `name`, if the epoch has it.
    pub fn metric(&self, name: &str) -> Option<f64> {
        self.metrics.get(name).copied()
    }

    /// The mean training loss of the epoch's batches.
    pub fn train_loss(&self) -> f64 {
        self.metric("train_loss").unwrap_or(f64::NAN)
    }

    /// Every figure with its TensorBoard tag.
    pub fn tagged(&self) -> impl Iterator<Item = (String, f64)> + '_ {
        self.metrics.iter().map(|(name, &v)| {
            let tag = COLUMNS
                .iter()
                .find(|(n, _)| n == name)
                .map_or_else(|| format!("epoch/{name}"), |(_, t)| t.to_string());
            (tag, v)
        })
    }

    /// The figures without a column of their own (a GAN's generator loss and scores).
    pub fn figures(&self) -> impl Iterator<Item = (&str, f64)> {
        self.metrics
            .iter()
            .filter(|(name, _)| !COLUMNS.iter().any(|(n, _)| n == name))
            .map(|(name, &v)| (name.as_str(), v))
    }
}

/// A line of `metrics.jsonl` as written.
#[derive(Serialize, Deserialize)]
struct Line {
    epoch: u64,
    step: u64,
    train_loss: f64,
    #[serde(default)]
    train_accuracy: Option<f64>,
    val_loss: Option<f64>,
    val_accuracy: Option<f64>,
    val_macro_f1: Option<f64>,
    lr: f64,
    epoch_seconds: f64,
    examples_per_second: f64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    figures: BTreeMap<String, f64>,
}

impl From<Line> for EpochRecord {
    fn from(l: Line) -> Self {
        let columns = [
            ("train_loss", Some(l.train_loss)),
            ("train_accuracy", l.train_accuracy),
            ("val_loss", l.val_loss),
            ("val_accuracy", l.val_accuracy),
            ("val_macro_f1", l.val_macro_f1),
        ];
        let mut metrics = l.figures;
        metrics.extend(columns.into_iter().filter_map(|(n, v)| Some((n.to_string(), v?))));
        EpochRecord {
            epoch: l.epoch,
            step: l.step,
            lr: l.lr,
            epoch_seconds: l.epoch_seconds,
            examples_per_second: l.examples_per_second,
            metrics,
        }
    }
}

impl From<EpochRecord> for Line {
    fn from(r: EpochRecord) -> Self {
        Line {
            epoch: r.epoch,
            step: r.step,
            train_loss: r.train_loss(),
            train_accuracy: r.metric("train_accuracy"),
            val_loss: r.metric("val_loss"),
            val_accuracy: r.metric("val_accuracy"),
            val_macro_f1: r.metric("val_macro_f1"),
            lr: r.lr,
            epoch_seconds: r.epoch_seconds,
            examples_per_second: r.examples_per_second,
            figures: r.figures().map(|(n, v)| (n.to_string(), v)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_keeps_its_columns_and_puts_other_figures_under_figures() {
        let line = r#"{"epoch":1,"step":8,"train_loss":0.5,"train_accuracy":null,"val_loss":null,"val_accuracy":null,"val_macro_f1":null,"lr":0.001,"epoch_seconds":2.0,"examples_per_second":64.0,"figures":{"d_fake":-0.25,"val_fd":12.5}}"#;
        let r: EpochRecord = serde_json::from_str(line).unwrap();
        assert_eq!((r.metric("val_fd"), r.metric("val_loss")), (Some(12.5), None));
        assert_eq!(serde_json::to_string(&r).unwrap(), line, "written back as read");
        let tags: Vec<(String, f64)> = r.tagged().collect();
        assert!(
            tags.contains(&("epoch/val_fd".into(), 12.5)) && tags.contains(&("epoch/train_loss".into(), 0.5))
        );
        let classifier = r#"{"epoch":0,"step":4,"train_loss":0.7,"train_accuracy":0.5,"val_loss":0.6,"val_accuracy":0.75,"val_macro_f1":0.7,"lr":0.01,"epoch_seconds":1.0,"examples_per_second":10.0}"#;
        let r: EpochRecord = serde_json::from_str(classifier).unwrap();
        assert_eq!(r.figures().count(), 0);
        assert!(r.tagged().any(|(t, v)| t == "val/accuracy" && v == 0.75));
        assert_eq!(serde_json::to_string(&r).unwrap(), classifier);
    }
}
