//! Trident's tasks as libraries: what `trident train`, `distill`, `eval` and `predict` do
//! besides parsing their arguments. [`config`]: the run configuration (`run.toml`) and its
//! validation; [`data`]: each data kind's datasets, seeded splits and loaders; [`anomaly`]:
//! reconstruction reports and the ranking of a series' windows; [`forecast`]: the
//! rolling-origin backtest beside the naive baselines; [`gan`]: a GAN's judge, its review
//! after each epoch and its report; [`report`]: a run's `report.json`.

pub mod anomaly;
pub mod assess;
pub mod config;
pub mod data;
pub mod forecast;
pub mod gan;
pub mod predict;
pub mod report;
pub mod teacher;

use anyhow::Context;
use std::path::Path;

/// [`trident_train::write_atomic`], creating the parent directory first, with the path
/// in its error.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    trident_train::write_atomic(path, bytes).with_context(|| format!("writing {}", path.display()))
}
