//! The training loop: a [`TrainStep`] (batch → loss and logits) driven by a [`Trainer`]
//! over epochs, with gradient accumulation, clipping, a learning-rate schedule, evaluation
//! every epoch, early stopping, best/last checkpoints, `metrics.jsonl`, TensorBoard scalars,
//! plots and a progress bar.
//!
//! Everything random is derived from the run seed (data order per epoch, augmentation per
//! (epoch, index), dropout per micro-step), and the checkpoint records the data position,
//! so a run interrupted after any optimizer step and resumed reaches bit-identical weights.
//!
//! [`Trainer::fit`] is a short loop over named parts that other tasks compose as well:
//! [`Updater`] (gradients gathered, exchanged, averaged, clipped, applied), [`Checkpoints`]
//! (recovery, resume, atomic `last`/`best`), [`RunLog`] (progress, `metrics.jsonl`,
//! TensorBoard, plots), [`StepProfiler`], [`StopRequest`] and [`EarlyStopping`], with
//! [`evaluate`] for validation.

mod adversarial;
mod checkpoints;
mod eval;
mod log;
mod profiling;
mod stopping;
mod updater;

pub use adversarial::{AdversarialStep, CriticLoss, EpochJudge};
pub use checkpoints::{fresh_state, Checkpoints};
pub use eval::{evaluate, evaluate_data_parallel, gradients, Evaluation};
pub use log::RunLog;
pub use profiling::StepProfiler;
pub use stopping::{EarlyStopping, StopRequest, Verdict};
pub use updater::Updater;

use crate::checkpoint::{self, TrainerState};
use crate::optim::{Decay, OptimizerConfig};
use crate::profile::Phase;
use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;
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

/// Early stopping and best-checkpoint selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Monitor {
    /// Validation accuracy (higher is better).
    #[default]
    ValAccuracy,
    /// Validation macro-F1 (higher is better).
    ValMacroF1,
    /// Validation loss (lower is better).
    ValLoss,
    /// A GAN's Fréchet distance of generated to validation images in a judge's feature
    /// space (lower is better).
    ValFd,
}

impl Monitor {
    fn better(self, new: f64, old: f64) -> bool {
        match self {
            Monitor::ValLoss | Monitor::ValFd => new < old,
            _ => new > old,
        }
    }
}

/// The error of a class metric monitored on a model without classes.
fn monitor_needs_classes(rule: &EarlyStopping) -> TrainError {
    TrainError::Invalid(format!(
        "train.monitor = {:?} needs class predictions, and this model scores examples \
         (reconstruction) instead: use train.monitor = \"val_loss\"",
        rule.monitor
    ))
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
    /// The metric for early stopping and the best checkpoint.
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

/// Why training stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A tensor operation failed.
    #[error("{0}")]
    Tensor(#[from] candle_core::Error),
    /// Data could not be loaded.
    #[error("{0}")]
    Data(#[from] trident_data::DataError),
    /// A checkpoint could not be written or read.
    #[error("{0}")]
    Checkpoint(#[from] checkpoint::CheckpointError),
    /// Any other I/O failure, naming the path.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The run cannot go on as asked.
    #[error("{0}")]
    Invalid(String),
    /// A data-parallel collective failed (this rank's, or another rank's failure).
    #[error("{0}")]
    Dist(#[from] trident_dist::DistError),
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

/// One epoch's line in `metrics.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EpochRecord {
    /// Epoch (0-based).
    pub epoch: u64,
    /// Optimizer steps so far.
    pub step: u64,
    /// Mean training loss of the epoch's micro-batches.
    pub train_loss: f64,
    /// Training accuracy (dropout on); `None` for a model without classes.
    #[serde(default)]
    pub train_accuracy: Option<f64>,
    /// Validation loss.
    pub val_loss: Option<f64>,
    /// Validation accuracy.
    pub val_accuracy: Option<f64>,
    /// Validation macro-F1.
    pub val_macro_f1: Option<f64>,
    /// Learning rate at the end of the epoch.
    pub lr: f64,
    /// Wall time of the epoch's training part, seconds.
    pub epoch_seconds: f64,
    /// Training examples per second.
    pub examples_per_second: f64,
    /// More figures of the epoch, by name, for tasks that have them (a GAN's generator
    /// loss, discriminator scores and sample quality).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub figures: std::collections::BTreeMap<String, f64>,
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
    /// progress stream with what it does on this CPU: both training loops start so.
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

    /// Trains `step` on `train`, evaluating on `val` after each epoch. With `resume`, continues
    /// from `run_dir/last`. `data_hash` identifies data and model settings outside
    /// [`TrainConfig`] (it joins the config hash).
    ///
    /// The loop composes the parts: [`Updater`] (gradients to update), [`Checkpoints`],
    /// [`RunLog`], [`StepProfiler`], [`StopRequest`] and [`EarlyStopping`]. It runs on a
    /// worker of the current rayon pool ([`trident_nn::runtime::on_pool`]), where the
    /// kernels' parallel loops share their work without waking the pool from outside.
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
        trident_nn::runtime::on_pool(|| self.fit_here(step, train, val, resume, data_hash))
    }

    /// [`fit`](Self::fit) on the calling thread.
    fn fit_here<S, D, V>(
        &self,
        step: &S,
        train: &DataLoader<D, S::Batch>,
        val: Option<&DataLoader<V, S::Batch>>,
        resume: bool,
        data_hash: &str,
    ) -> Result<FitSummary, TrainError>
    where
        S: TrainStep,
        D: Dataset + 'static,
        V: Dataset + 'static,
    {
        let c = &self.config;
        let mut run = match self.open(step, train, resume, data_hash)? {
            Opened::Run(run) => run,
            Opened::Finished(state) => {
                // Killed while drawing the final plots: draw them again.
                let log = RunLog::open(&self.run_dir, state.epoch, c.epochs, self.lead(), self.progress)?;
                log.plots()?;
                return Ok(FitSummary {
                    records: log.records,
                    interrupted: false,
                    early_stopped: false,
                    state,
                    profile: None,
                });
            }
        };
        let (mut interrupted, mut early_stopped) = (false, false);
        let rule = EarlyStopping {
            monitor: c.monitor,
            patience: c.early_stopping_patience,
        };
        // Validation on a twin whose forward passes keep no graph (when the step has one).
        let twin = step.evaluator()?;
        let evaluated: &dyn TrainStep<Batch = S::Batch> = match &twin {
            Some(t) => t.as_ref(),
            None => step,
        };
        while run.state.epoch < c.epochs {
            let Some(trained) = run.train_epoch(step, train)? else {
                interrupted = true;
                break;
            };
            if let Some(d) = run.dp {
                d.broadcast_buffers(step.params())?;
            }
            let val_eval = match (val, run.dp) {
                (Some(v), Some(d)) => Some(evaluate_data_parallel(evaluated, v, self.classes.len(), d)?),
                (Some(v), None) => Some(evaluate(evaluated, v, self.classes.len())?),
                (None, _) => None,
            };
            let verdict = run.end_epoch(step.params(), trained, val_eval.as_ref(), &rule)?;
            if verdict.early {
                early_stopped = true;
                if self.progress {
                    eprintln!("{}", rule.stop_message(&run.state));
                }
                break;
            }
            // A stop asked between epochs, of any rank, stops them all.
            let mut stop = [f32::from(u8::from(run.stop.asked(0)))];
            if let Some(d) = run.dp {
                d.sum(&mut stop)?;
            }
            if stop[0] > 0.0 && !run.state.finished {
                interrupted = true;
                break;
            }
        }
        // The curves as the run ends (during it, they are redrawn at most every PLOT_EVERY).
        run.log.plots_if_behind()?;
        Ok(FitSummary {
            profile: run.profiler.finish(self.progress)?,
            records: run.log.records,
            interrupted,
            early_stopped,
            state: run.state,
        })
    }

    /// Rank 0 of a data-parallel group, or a lone trainer: the one that writes files.
    fn lead(&self) -> bool {
        self.data_parallel.as_ref().is_none_or(|d| d.rank() == 0)
    }

    /// Checks the run can start, sets up its parts and opens (or resumes) the run
    /// directory.
    fn open<'a, S, D>(
        &'a self,
        step: &S,
        train: &DataLoader<D, S::Batch>,
        resume: bool,
        data_hash: &str,
    ) -> Result<Opened<'a>, TrainError>
    where
        S: TrainStep,
        D: Dataset + 'static,
    {
        let c = &self.config;
        if c.grad_accum == 0 || c.epochs == 0 {
            return Err(TrainError::Invalid(
                "epochs and grad_accum must be at least 1".into(),
            ));
        }
        let dp = self.data_parallel.as_ref();
        if let Some(d) = dp {
            if train.shard() != Some((d.rank(), d.world())) {
                return Err(TrainError::Invalid(format!(
                    "rank {} of {}: the training loader is not sharded for this rank (DataLoader::sharded)",
                    d.rank(),
                    d.world()
                )));
            }
        }
        std::fs::create_dir_all(&self.run_dir).map_err(io_err(&self.run_dir))?;
        trident_nn::runtime::keep_freed_memory();
        let per_epoch = train.batches_per_epoch() as u64;
        if per_epoch == 0 {
            return Err(TrainError::Invalid("the training set gives no batch".into()));
        }
        let total_steps = per_epoch.div_ceil(c.grad_accum) * c.epochs;
        let mut updater = Updater::new(step.params(), c, total_steps, dp, self.progress)?;
        let hash = self.config_hash(data_hash);
        if let Some(d) = dp {
            // Every rank must run the same configuration on the same model.
            d.check_same("the configuration (hash)", trident_nn::params::name_hash(&hash))?;
            d.check_same(
                "the model's parameters (names and shapes)",
                crate::ddp::shapes_hash(step.params()),
            )?;
        }
        let checkpoints = Checkpoints::new(&self.run_dir, &self.checkpoint_files, dp);
        let state = checkpoints.open(resume, step.params(), &mut [&mut updater], &hash, self.progress)?;
        if let Some(d) = dp {
            // Every rank has looked at the run directory before rank 0 writes to it; then
            // all start from rank 0's weights.
            d.comm.barrier()?;
            d.broadcast_params(step.params())?;
        }
        if state.finished {
            return Ok(Opened::Finished(state));
        }
        let log = RunLog::open(&self.run_dir, state.epoch, c.epochs, self.lead(), self.progress)?;
        // Ops record the mode when they are created: every forward pass, training and
        // evaluation, runs in the configured precision.
        let bf16 = self.mixed_precision();
        Ok(Opened::Run(Box::new(Run {
            config: c,
            dp,
            _precision: trident_nn::bf16::autocast(bf16),
            per_epoch,
            state,
            updater,
            checkpoints,
            log,
            profiler: StepProfiler::new(self.profile.as_ref()),
            stop: StopRequest::new(&self.stop, self.stop_after_steps),
            sums: StepSums::default(),
            classified: true,
        })))
    }
}

/// A run directory opened for training.
enum Opened<'a> {
    /// Training goes on (or starts).
    Run(Box<Run<'a>>),
    /// The resumed run had already finished: its final state.
    Finished(TrainerState),
}

/// The figures of one optimizer step, summed over its micro-batches and then over the
/// data-parallel ranks, with the stop flag riding along (any rank's stop stops all).
#[derive(Debug, Default)]
struct StepSums {
    loss: f32,
    micro_batches: f32,
    hits: f32,
    examples: f32,
    stop: f32,
}

impl StepSums {
    fn exchange(&mut self, d: &crate::ddp::DataParallel) -> Result<(), TrainError> {
        let mut v = [self.loss, self.micro_batches, self.hits, self.examples, self.stop];
        d.sum(&mut v)?;
        [self.loss, self.micro_batches, self.hits, self.examples, self.stop] = v;
        Ok(())
    }
}

/// What an epoch's training part gave besides the running sums in the state.
struct TrainedEpoch {
    /// Examples trained since this process started the epoch.
    seen_now: u64,
    seconds: f64,
}

/// One fit in progress: its state and the parts the loop composes.
struct Run<'a> {
    config: &'a TrainConfig,
    dp: Option<&'a crate::ddp::DataParallel>,
    _precision: trident_nn::bf16::Autocast,
    per_epoch: u64,
    state: TrainerState,
    updater: Updater,
    checkpoints: Checkpoints<'a>,
    log: RunLog,
    profiler: StepProfiler<'a>,
    stop: StopRequest<'a>,
    sums: StepSums,
    /// The model predicts classes (training accuracy is counted); false once a step gave
    /// scores instead.
    classified: bool,
}

impl Run<'_> {
    /// The training part of the current epoch, from where the state stands; `None` when a
    /// stop was asked (the `last` checkpoint is then written).
    fn train_epoch<S, D>(
        &mut self,
        step: &S,
        train: &DataLoader<D, S::Batch>,
    ) -> Result<Option<TrainedEpoch>, TrainError>
    where
        S: TrainStep,
        D: Dataset + 'static,
    {
        let (epoch, per_epoch, group) = (self.state.epoch, self.per_epoch, self.config.grad_accum);
        let bar = self.log.progress_bar(per_epoch, epoch);
        bar.set_position(self.state.batch_in_epoch);
        let started = Instant::now();
        let seen_before = self.state.epoch_sums.3;
        let mut batches = train.epoch_from(epoch, self.state.batch_in_epoch as usize);
        let mut i = self.state.batch_in_epoch;
        while i < per_epoch {
            if self.updater.gathered() == 0 {
                self.profiler.begin_step(self.state.optimizer_step + 1);
            }
            let weight = batches.weight(i as usize);
            let batch = batches
                .next()
                .ok_or_else(|| TrainError::Invalid("loader ended early".into()))??;
            self.profiler.mark(Phase::Data);
            let loss = self.micro_step(step, &batch, weight, i)?;
            i += 1;
            bar.inc(1);
            self.profiler.mark(Phase::Other);
            if self.updater.gathered() == group || i == per_epoch {
                let stopped = self.optimizer_step(step.params(), i, loss)?;
                let (loss_sum, loss_n, _, seen) = self.state.epoch_sums;
                let rate = (seen - seen_before) as f64 / started.elapsed().as_secs_f64().max(1e-9);
                self.log.step_message(
                    &bar,
                    epoch,
                    i,
                    per_epoch,
                    group,
                    loss_sum / loss_n.max(1) as f64,
                    rate,
                );
                if stopped {
                    bar.abandon_with_message("interrupted: checkpoint written");
                    return Ok(None);
                }
            }
        }
        bar.finish_and_clear();
        Ok(Some(TrainedEpoch {
            seen_now: self.state.epoch_sums.3 - seen_before,
            seconds: started.elapsed().as_secs_f64(),
        }))
    }

    /// An epoch's end: its record logged, the best epoch and early stopping judged on the
    /// monitored metric, `best` (when improved) and `last` written, the curves drawn.
    fn end_epoch(
        &mut self,
        params: &Params,
        trained: TrainedEpoch,
        val: Option<&Evaluation>,
        rule: &EarlyStopping,
    ) -> Result<Verdict, TrainError> {
        let epoch = self.state.epoch;
        let (loss_sum, loss_n, correct, seen) = self.state.epoch_sums;
        self.log.epoch(EpochRecord {
            epoch,
            step: self.state.optimizer_step,
            train_loss: loss_sum / loss_n.max(1) as f64,
            train_accuracy: self.classified.then(|| correct as f64 / seen.max(1) as f64),
            val_loss: val.map(|e| e.loss),
            val_accuracy: val.and_then(|e| e.report.as_ref()).map(|r| r.accuracy),
            val_macro_f1: val.and_then(|e| e.report.as_ref()).map(|r| r.macro_f1),
            lr: self.updater.lr(self.state.optimizer_step.saturating_sub(1)),
            epoch_seconds: trained.seconds,
            examples_per_second: trained.seen_now as f64 / trained.seconds.max(1e-9),
            figures: Default::default(),
        })?;
        let metric = match val {
            Some(e) => Some(match rule.monitor {
                Monitor::ValAccuracy => {
                    e.classification()
                        .map_err(|_| monitor_needs_classes(rule))?
                        .accuracy
                }
                Monitor::ValMacroF1 => {
                    e.classification()
                        .map_err(|_| monitor_needs_classes(rule))?
                        .macro_f1
                }
                Monitor::ValLoss => e.loss,
                Monitor::ValFd => {
                    return Err(TrainError::Invalid(
                        "train.monitor = \"val_fd\" judges a GAN's samples; this model is not a GAN".into(),
                    ))
                }
            }),
            None => None,
        };
        let verdict = rule.end_epoch(&mut self.state, epoch, metric, self.config.epochs);
        self.checkpoints
            .save_epoch(params, &self.state, &[&self.updater], verdict.improved)?;
        self.log.plots_periodically()?;
        Ok(verdict)
    }

    /// Forward and backward pass of micro-batch `i` of the epoch, its gradients gathered
    /// (scaled by `weight`, this rank's share of the global batch); returns its loss.
    fn micro_step<S: TrainStep>(
        &mut self,
        step: &S,
        batch: &S::Batch,
        weight: f32,
        i: u64,
    ) -> Result<f64, TrainError> {
        // Replicas draw different dropout masks (rank 0 the same as a lone run).
        let rank = self.dp.map_or(0, |d| d.rank() as u64);
        let ctx = Ctx::train(
            self.config
                .seed
                .wrapping_add(rank.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            self.state.micro_step,
        );
        let store = step.params();
        store.begin_step();
        let out = step.forward(batch, &ctx)?;
        let loss = out.loss.to_scalar::<f32>()? as f64;
        self.profiler.mark(Phase::Forward);
        // Summed across ranks, the weighted gradients are those of the global batch's mean loss.
        let grads = if weight == 1.0 {
            out.loss.backward()?
        } else {
            out.loss.affine(weight as f64, 0.0)?.backward()?
        };
        self.updater.gather(store, &grads)?;
        drop(grads);
        self.profiler.mark(Phase::Backward);
        if !loss.is_finite() {
            let e = format!(
                "loss became {loss} at epoch {}, batch {i}: lower the learning rate or clip gradients",
                self.state.epoch
            );
            if let Some(d) = self.dp {
                d.comm.abort(&e);
            }
            return Err(TrainError::Invalid(e));
        }
        let hits = match &out.prediction {
            Prediction::Logits(logits) => {
                let preds = trident_nn::ops::argmax_rows(logits)?;
                preds.iter().zip(&out.labels).filter(|(p, l)| p == l).count()
            }
            Prediction::Scores(_) => {
                self.classified = false;
                0
            }
        };
        self.sums.loss += loss as f32;
        self.sums.micro_batches += 1.0;
        self.sums.hits += hits as f32;
        self.sums.examples += out.labels.len() as f32;
        self.state.micro_step += 1;
        Ok(loss)
    }

    /// Ends a group of micro-batches (the epoch's first `batches`): gradients and figures
    /// summed over the ranks, the update, the step's log and periodic checkpoint. Returns
    /// whether a stop was asked, in which case `last` holds this step.
    fn optimizer_step(
        &mut self,
        params: &trident_nn::Params,
        batches: u64,
        last_loss: f64,
    ) -> Result<bool, TrainError> {
        let c = self.config;
        self.sums.stop = f32::from(u8::from(self.stop.asked(1)));
        if let Some(d) = self.dp {
            self.updater.exchange(d)?;
            self.sums.exchange(d)?;
            self.profiler.mark(Phase::Comm);
        }
        let s = std::mem::take(&mut self.sums);
        let sums = &mut self.state.epoch_sums;
        sums.0 += s.loss as f64;
        sums.1 += s.micro_batches as u64;
        sums.2 += s.hits as u64;
        sums.3 += s.examples as u64;
        let lr = self.updater.update(self.dp, self.state.optimizer_step)?;
        self.profiler.mark(Phase::Optimizer);
        self.state.optimizer_step += 1;
        self.state.batch_in_epoch = batches;
        self.stop.steps_this_process += 1;
        let n = self.state.optimizer_step;
        if n.is_multiple_of(c.log_every.max(1)) {
            self.log
                .step_scalars(n, last_loss, lr, self.updater.grad_norm())?;
        }
        let stop_now = s.stop > 0.0;
        let periodic = c.checkpoint_every > 0 && n.is_multiple_of(c.checkpoint_every);
        let mid_epoch = batches < self.per_epoch;
        if (stop_now || periodic) && mid_epoch {
            self.checkpoints
                .save_last(params, &self.state, &[&self.updater])?;
        }
        self.profiler.mark(Phase::Other);
        self.profiler.end_step(n);
        Ok(stop_now && mid_epoch)
    }
}
