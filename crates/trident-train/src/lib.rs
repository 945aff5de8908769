//! Trident's training library: the [`TrainStep`](trainer::TrainStep) trait and the
//! [`Trainer`](trainer::Trainer) loop, optimizers and schedules, atomic checkpoints with
//! exact resume, classification metrics (EV-1), TensorBoard scalars and PNG plots.
#![warn(missing_docs)]

pub mod checkpoint;
pub mod distill;
pub mod metrics;
pub mod monitor;
pub mod optim;
pub mod plot;
pub mod profile;
pub mod tensorboard;
pub mod trainer;

pub use trainer::{evaluate, StepOutput, TrainConfig, TrainError, TrainStep, Trainer};
