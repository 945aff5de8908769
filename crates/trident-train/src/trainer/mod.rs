//! The training loop and what plugs into it. [`Trainer::run`] is the one loop: epochs of
//! a [`Task`]'s batches from a [`Source`], composed of named parts — [`Updater`]
//! (gradients gathered, exchanged, averaged, clipped, applied), [`Checkpoints`]
//! (recovery, resume, atomic `last`/`best`), [`RunLog`] (progress, `metrics.jsonl`,
//! TensorBoard, plots), [`StepProfiler`], [`StopRequest`] and [`EarlyStopping`] — with
//! [`evaluate`] for validation. A task owns what a batch does and what an epoch reports:
//! [`Supervised`] (a [`TrainStep`]: batch → loss and logits, with gradient accumulation and
//! data parallelism; distillation is one) and [`Adversarial`] (a GAN's two groups) are
//! built in, and an agent or a pipeline stage is a task of its own.
//!
//! Everything random is derived from the run seed (data order per epoch, augmentation per
//! (epoch, index), dropout per batch of the run), and the checkpoint records the data
//! position and the epoch's running sums, so a run interrupted after any optimizer step and
//! resumed reaches bit-identical weights and figures.

mod adversarial;
mod checkpoints;
mod eval;
mod log;
mod profiling;
mod run;
mod stopping;
mod supervised;
pub mod task;
mod updater;

pub use crate::error::TrainError;
pub use crate::record::EpochRecord;
pub use adversarial::{Adversarial, AdversarialStep, CriticLoss, EpochJudge};
pub use checkpoints::{fresh_state, Checkpoints};
pub use eval::{evaluate, evaluate_data_parallel, gradients, Evaluation};
pub use log::RunLog;
pub use profiling::StepProfiler;
pub use stopping::{EarlyStopping, StopRequest, Verdict};
pub use supervised::{Supervised, SUPERVISED_METRICS};
pub use task::{
    BatchContext, EpochBatches, EpochContext, Goal, MetricDef, Metrics, Monitor, Plan, Source, StepDone, Task,
};
pub use updater::Updater;

use crate::checkpoint::TrainerState;
use crate::optim::{Decay, OptimizerConfig};
use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use trident_data::{DataLoader, Dataset};
use trident_nn::{Ctx, Params};

/// What one forward pass returns.
#[derive(Debug, Clone)]
pub struct StepOutput {
    /// Scalar loss to minimise (mean over the batch).
    pub loss: Tensor,
    /// What the model made of each example: class logits, or per-example scores.
    pub prediction: Prediction,
    /// The class of each example (for a task without classes, the data's label, kept for
    /// per-class figures such as anomaly detection's; zeros where the data has none).
    pub labels: Vec<usize>,
}

/// A batch's predictions.
#[derive(Debug, Clone)]
pub enum Prediction {
    /// `[batch, classes]` logits of a classifier.
    Logits(Tensor),
    /// `[batch]` per-example scores of a task without classes, larger meaning worse: an
    /// autoencoder's reconstruction error per value, which is also its anomaly score.
    Scores(Tensor),
}

impl StepOutput {
    /// A classifier's output.
    pub fn classified(loss: Tensor, logits: Tensor, labels: Vec<usize>) -> Self {
        StepOutput {
            loss,
            prediction: Prediction::Logits(logits),
            labels,
        }
    }

    /// The class logits; an error for a model without classes.
    pub fn logits(&self) -> candle_core::Result<&Tensor> {
        match &self.prediction {
            Prediction::Logits(l) => Ok(l),
            Prediction::Scores(_) => {
                candle_core::bail!("this model scores examples; it has no class logits")
            }
        }
    }
}

/// Hidden states of a sequence model, for hidden-state distillation.
#[derive(Debug, Clone)]
pub struct HiddenStates {
    /// `[batch, seq, hidden]` after the embeddings (index 0) and after each layer.
    pub states: Vec<Tensor>,
    /// `[batch, seq]`, 1 for real tokens and 0 for padding (f32).
    pub mask: Tensor,
}

/// A model and its loss: what the trainer drives. Distillation, data parallelism and
/// custom models implement this; the trainer owns only the loop.
pub trait TrainStep {
    /// The batch type the data loader's collate function builds.
    type Batch: Send + 'static;
    /// Forward pass (training when `ctx.train`).
    fn forward(&self, batch: &Self::Batch, ctx: &Ctx) -> candle_core::Result<StepOutput>;
    /// The parameters the optimizer updates (trainable ones) and checkpoints save (all).
    fn params(&self) -> &Params;
    /// [`TrainStep::forward`] that also returns the hidden states, for models that have
    /// them (transformer encoders); `None` otherwise.
    fn forward_hidden(
        &self,
        batch: &Self::Batch,
        ctx: &Ctx,
    ) -> candle_core::Result<Option<(StepOutput, HiddenStates)>> {
        let _ = (batch, ctx);
        Ok(None)
    }
    /// What the evaluation passes run instead of this step: the same model over the same
    /// parameter values with parameters that record no graph (a forward pass then frees
    /// each activation once read); `None` where the step has none, and evaluation runs on
    /// the step itself.
    fn evaluator(&self) -> candle_core::Result<Option<Box<dyn TrainStep<Batch = Self::Batch>>>> {
        Ok(None)
    }
}

/// The precision of the forward and backward passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// Everything in f32.
    #[default]
    F32,
    /// Mixed precision ([`trident_nn::bf16::autocast`]): matrix products in bf16 with f32
    /// accumulation, saved activations of transformer sublayers in bf16; f32 master weights,
    /// gradients, optimizer state, norms, softmax and losses.
    Bf16,
}

/// How to train.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// Passes over the training set.
    pub epochs: u64,
    /// Peak learning rate.
    pub lr: f64,
    /// Warm-up optimizer steps.
    #[serde(default)]
    pub warmup_steps: u64,
    /// Decay after warm-up.
    #[serde(default)]
    pub decay: Decay,
    /// The optimizer.
    #[serde(default)]
    pub optimizer: OptimizerConfig,
    /// Clip the global gradient norm to this.
    #[serde(default)]
    pub max_grad_norm: Option<f64>,
    /// Micro-batches per optimizer step.
    #[serde(default = "one")]
    pub grad_accum: u64,
    /// Stop after this many epochs without improvement of `monitor`.
    #[serde(default)]
    pub early_stopping_patience: Option<u64>,
    /// The metric for early stopping and the best checkpoint: a name among the task's
    /// metrics ([`Task::metrics`]).
    #[serde(default)]
    pub monitor: Monitor,
    /// Also write the `last` checkpoint every this many optimizer steps (0: per epoch only).
    #[serde(default)]
    pub checkpoint_every: u64,
    /// Log the training loss to TensorBoard every this many optimizer steps.
    #[serde(default = "ten")]
    pub log_every: u64,
    /// Seed of dropout (data order and augmentation have the loader's seed).
    #[serde(default)]
    pub seed: u64,
    /// `"f32"` (default) or `"bf16"` mixed precision, training and evaluation alike.
    #[serde(default)]
    pub precision: Precision,
}

fn one() -> u64 {
    1
}
fn ten() -> u64 {
    10
}

/// `12.3 MiB`, `4.0 KiB` or `12 B`.
fn human_bytes(b: usize) -> String {
    match b {
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.into(),
        source,
    }
}

/// How a fit ended.
#[derive(Debug, Clone)]
pub struct FitSummary {
    /// Per-epoch records (including those before a resume).
    pub records: Vec<EpochRecord>,
    /// Stopped by a signal before finishing; `last` holds where it stopped.
    pub interrupted: bool,
    /// Stopped early for lack of improvement.
    pub early_stopped: bool,
    /// Final trainer state.
    pub state: TrainerState,
    /// The profile, when profiling was on.
    pub profile: Option<crate::profile::ProfileReport>,
}

/// Drives training of one run directory.
#[derive(Clone)]
pub struct Trainer {
    /// The configuration.
    pub config: TrainConfig,
    /// Class names (for reports and plots).
    pub classes: Vec<String>,
    /// The run directory.
    pub run_dir: PathBuf,
    /// Files written into every checkpoint (e.g. the model description).
    pub checkpoint_files: Vec<(String, Vec<u8>)>,
    /// Set (by a signal handler) to stop after the current optimizer step, checkpointing.
    pub stop: Arc<AtomicBool>,
    /// Show a progress bar (on a terminal).
    pub progress: bool,
    /// Stop after this many optimizer steps in this process (tests simulate interruption).
    pub stop_after_steps: Option<u64>,
    /// Profile the steps (phases, operators, trace, diagnosis); off when `None`.
    pub profile: Option<crate::profile::ProfileOptions>,
    /// One rank of a data-parallel group; `None` trains alone. Rank 0 writes the run
    /// directory (metrics, logs, checkpoints, plots); every rank trains.
    pub data_parallel: Option<crate::ddp::DataParallel>,
}

impl Trainer {
    /// Whether this run trains in bf16 mixed precision (`train.precision`), said on the
    /// progress stream with what it does on this CPU.
    fn mixed_precision(&self) -> bool {
        let bf16 = self.config.precision == Precision::Bf16;
        if bf16 && self.progress {
            eprintln!("bf16 mixed precision: {}", trident_nn::bf16::mixed_precision());
        }
        bf16
    }

    /// A trainer writing into `run_dir`.
    pub fn new(config: TrainConfig, classes: Vec<String>, run_dir: &Path) -> Self {
        Trainer {
            config,
            classes,
            run_dir: run_dir.into(),
            checkpoint_files: Vec::new(),
            stop: Arc::new(AtomicBool::new(false)),
            progress: true,
            stop_after_steps: None,
            profile: None,
            data_parallel: None,
        }
    }

    /// Hash of the configuration: a resumed run must have the same.
    pub fn config_hash(&self, extra: &str) -> String {
        let text = format!(
            "{}|{extra}",
            serde_json::to_string(&self.config).expect("config serialises")
        );
        format!("{:016x}", trident_nn::params::name_hash(&text))
    }

    /// Trains `step` on `train`, evaluating on `val` after each epoch: [`Trainer::run`] of a
    /// [`Supervised`] task. With `resume`, continues from `run_dir/last`. `data_hash`
    /// identifies data and model settings outside [`TrainConfig`] (it joins the config
    /// hash).
    pub fn fit<S, D, V>(
        &self,
        step: &S,
        train: &DataLoader<D, S::Batch>,
        val: Option<&DataLoader<V, S::Batch>>,
        resume: bool,
        data_hash: &str,
    ) -> Result<FitSummary, TrainError>
    where
        S: TrainStep + Sync,
        D: Dataset + 'static,
        V: Dataset + 'static,
    {
        trident_nn::runtime::on_pool(|| {
            let mut task = Supervised::new(step, val, self.classes.len());
            self.run_here(&mut task, train, resume, data_hash)
        })
    }
}
