//! What plugs into the training loop. [`Trainer::run`](super::Trainer::run) owns the
//! epochs, the progress, the checkpoints and exact resume, the stop requests, early
//! stopping, the log, the plots and the profiler; a [`Task`] owns what one batch does
//! (forward and backward passes, the updates of its optimizer groups, its running sums)
//! and what an epoch reports. A [`Source`] gives the batches: a data loader, or the
//! iterations of an agent that collects its own experience.
//!
//! Supervised training and distillation ([`Supervised`](super::Supervised)) and
//! adversarial training ([`Adversarial`](super::Adversarial)) are the two tasks built in.

use super::{StepProfiler, StopRequest, TrainConfig, TrainError, Trainer, Updater};
use crate::checkpoint::{EpochSums, TrainerState};
use crate::ddp::DataParallel;
use serde::{Deserialize, Serialize};
use trident_data::{DataLoader, Dataset};
use trident_nn::Params;

pub use crate::record::Metrics;

/// Which way a metric improves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Goal {
    /// Lower is better (losses, distances).
    Minimize,
    /// Higher is better (accuracy, F1, returns).
    Maximize,
}

impl Goal {
    /// Whether `new` improves on `old` (a tie does not).
    pub fn better(self, new: f64, old: f64) -> bool {
        match self {
            Goal::Minimize => new < old,
            Goal::Maximize => new > old,
        }
    }
}

/// A figure a task reports at an epoch's end that `train.monitor` may name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricDef {
    /// Its name in the epoch's record.
    pub name: &'static str,
    /// Which way it improves.
    pub goal: Goal,
}

/// The metric that picks the `best` checkpoint and drives early stopping
/// (`train.monitor`): the name of one of the task's [`MetricDef`]s.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Monitor(String);

impl Monitor {
    /// The monitor of the metric named `name`.
    pub fn named(name: &str) -> Self {
        Monitor(name.into())
    }

    /// The metric's name.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// Whether it names `name`.
    pub fn is(&self, name: &str) -> bool {
        self.0 == name
    }
}

impl Default for Monitor {
    /// Validation accuracy, a classifier's usual measure.
    fn default() -> Self {
        Monitor::named("val_accuracy")
    }
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl std::fmt::Display for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// How a run is laid out, for a task building its optimizer groups.
pub struct Plan<'a> {
    /// The run's configuration.
    pub config: &'a TrainConfig,
    /// Batches in an epoch.
    pub per_epoch: u64,
    /// This rank of a data-parallel group, if any.
    pub dp: Option<&'a DataParallel>,
    /// Whether the run prints progress.
    pub progress: bool,
}

impl Plan<'_> {
    /// Batches over the whole run.
    pub fn batches(&self) -> u64 {
        self.per_epoch * self.config.epochs
    }
}

/// Where a batch falls and what it may touch: the task's view of the loop.
pub struct BatchContext<'r, 'p> {
    /// The epoch (0-based).
    pub epoch: u64,
    /// The batch's index in the epoch.
    pub index: u64,
    /// The epoch's last batch: a step that gathers several batches must end here.
    pub last_of_epoch: bool,
    /// This rank's share of the global batch (1 alone).
    pub weight: f32,
    /// Batches consumed over the whole run before this one (seeds randomness).
    pub micro_step: u64,
    /// Optimizer steps taken before this batch (the learning rate's schedule position).
    pub optimizer_step: u64,
    /// The epoch's running sums, which the task adds its batch's figures to.
    pub sums: &'r mut EpochSums,
    /// The task's optimizer groups, as [`Task::updaters`] built them.
    pub updaters: &'r mut [Updater],
    /// Marks the step's phases (data, forward, backward, communication, optimizer).
    pub profiler: &'r mut StepProfiler<'p>,
    /// This rank of a data-parallel group, if any.
    pub dp: Option<&'r DataParallel>,
    /// The run's configuration.
    pub config: &'r TrainConfig,
    pub(super) stop: &'r StopRequest<'p>,
}

impl BatchContext<'_, '_> {
    /// Whether a stop is asked at the step this batch ends: a task whose ranks run together
    /// agrees on it with the others (any rank's stop stops all) and reports it in
    /// [`StepDone::stop`].
    pub fn stop_asked(&self) -> bool {
        self.stop.asked(1)
    }
}

/// An optimizer step a batch completed: a point where the run can be checkpointed.
#[derive(Debug, Clone, Copy)]
pub struct StepDone {
    /// The loss logged for the step (its last batch's).
    pub loss: f64,
    /// The step's learning rate.
    pub lr: f64,
    /// The global gradient norm before clipping, when the step clipped.
    pub grad_norm: Option<f64>,
    /// Stop after this step ([`BatchContext::stop_asked`], agreed among ranks).
    pub stop: bool,
}

/// What an epoch's end may read.
pub struct EpochContext<'r> {
    /// The epoch (0-based).
    pub epoch: u64,
    /// The run's state, with the epoch's sums.
    pub state: &'r TrainerState,
    /// The monitored metric.
    pub monitor: &'r Monitor,
    /// This rank of a data-parallel group, if any.
    pub dp: Option<&'r DataParallel>,
}

/// One task on the training loop: its models' parameters, its optimizer groups, what a
/// batch does and what an epoch reports.
pub trait Task {
    /// What the [`Source`] gives it each time.
    type Batch;
    /// Every parameter of its models: checkpoints save them all, and data-parallel ranks
    /// start from rank 0's.
    fn params(&self) -> &Params;
    /// The figures its epochs report that `train.monitor` may name.
    fn metrics(&self) -> Vec<MetricDef>;
    /// What the task cannot do with `trainer`'s settings, refused before anything is
    /// written.
    fn check(&self, trainer: &Trainer) -> Result<(), TrainError> {
        let _ = trainer;
        Ok(())
    }
    /// Its optimizer groups, one [`Updater`] each, in the order checkpoints store them.
    fn updaters(&self, plan: &Plan<'_>) -> Result<Vec<Updater>, TrainError>;
    /// Once the run directory is open, its state fresh or restored from `last`: what the
    /// task derives from it (a group that steps less often than the run sets its step
    /// count here).
    fn opened(&mut self, state: &TrainerState, updaters: &mut [Updater]) {
        let _ = (state, updaters);
    }
    /// The unit of progress the progress line counts per second ("ex": examples).
    fn unit(&self) -> &'static str {
        "ex"
    }
    /// Runs one batch; `Some` when it completed an optimizer step (every batch, or the
    /// last of a group of micro-batches).
    fn batch(
        &mut self,
        batch: &Self::Batch,
        cx: BatchContext<'_, '_>,
    ) -> Result<Option<StepDone>, TrainError>;
    /// The epoch's figures: its training figures from the sums, its validation. The loop
    /// adds `train_loss` (the sums' mean loss).
    fn end_epoch(&mut self, cx: EpochContext<'_>) -> Result<Metrics, TrainError>;
    /// What exact resume needs besides the parameters and optimizer state (an agent's
    /// environments and generators, a replay buffer), as named files the loop writes into
    /// every checkpoint with the rest (atomically, in the manifest). Called just before
    /// each checkpoint is written.
    fn save_state(&mut self) -> Result<Vec<(String, Vec<u8>)>, TrainError> {
        Ok(Vec::new())
    }
    /// Restores what [`Task::save_state`] wrote, from the checkpoint `dir` a run resumes
    /// from (after its parameters are loaded, before [`Task::opened`]).
    fn load_state(&mut self, dir: &std::path::Path) -> Result<(), TrainError> {
        let _ = dir;
        Ok(())
    }
}

/// Batches, epoch by epoch, each with this rank's share of its global batch.
pub type EpochBatches<'a, B> = Box<dyn Iterator<Item = Result<(B, f32), TrainError>> + 'a>;

/// Where a task's batches come from: a data loader, or an agent's iterations.
pub trait Source {
    /// What it gives.
    type Batch;
    /// Batches in an epoch.
    fn per_epoch(&self) -> u64;
    /// This rank's shard (rank, world) of a data-parallel group's data, if sharded.
    fn shard(&self) -> Option<(usize, usize)> {
        None
    }
    /// The batches of `epoch` from batch `start` on.
    fn epoch_from(&self, epoch: u64, start: u64) -> EpochBatches<'_, Self::Batch>;
}

impl<D: Dataset + 'static, B: Send + 'static> Source for DataLoader<D, B> {
    type Batch = B;

    fn per_epoch(&self) -> u64 {
        self.batches_per_epoch() as u64
    }

    fn shard(&self) -> Option<(usize, usize)> {
        DataLoader::shard(self)
    }

    fn epoch_from(&self, epoch: u64, start: u64) -> EpochBatches<'_, B> {
        let mut batches = DataLoader::epoch_from(self, epoch, start as usize);
        let mut i = start as usize;
        Box::new(std::iter::from_fn(move || {
            let weight = batches.weight(i);
            i += 1;
            Some(batches.next()?.map(|b| (b, weight)).map_err(TrainError::from))
        }))
    }
}
