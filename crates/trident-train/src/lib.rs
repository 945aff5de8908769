//! Trident's training library. Today: classification metrics (EV-1). The trainer,
//! optimizers, checkpoints and TensorBoard writer of issue 3 build on this crate.
#![warn(missing_docs)]

pub mod metrics;
pub mod tensorboard;
