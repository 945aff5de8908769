//! Trident's training library: the [`TrainStep`](trainer::TrainStep) trait and the
//! [`Trainer`](trainer::Trainer) loop, optimizers and schedules, atomic checkpoints with
//! exact resume, classification metrics (EV-1), TensorBoard scalars and PNG plots.
#![warn(missing_docs)]

pub mod checkpoint;
pub mod ddp;
pub mod distill;
pub mod error;
pub mod metrics;
pub mod monitor;
pub mod optim;
pub mod plot;
pub mod profile;
pub mod quality;
pub mod record;
pub mod replicas;
pub mod sampler;
pub mod tensorboard;
pub mod trainer;

/// Writes `bytes` to `path` through `.<name>.tmp` beside it, synced, then renamed into
/// place: a reader sees the old file or the new one, never half of one.
pub fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

pub use trainer::{evaluate, Prediction, StepOutput, TrainConfig, TrainError, TrainStep, Trainer};
