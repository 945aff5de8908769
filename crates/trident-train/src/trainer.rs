//! The training loop: a [`TrainStep`] (batch → loss and logits) driven by a [`Trainer`]
//! over epochs, with gradient accumulation, clipping, a learning-rate schedule, evaluation
//! every epoch, early stopping, best/last checkpoints, `metrics.jsonl`, TensorBoard scalars,
//! plots and a progress bar.
//!
//! Everything random is derived from the run seed (data order per epoch, augmentation per
//! (epoch, index), dropout per micro-step), and the checkpoint records the data position,
//! so a run interrupted after any optimizer step and resumed reaches bit-identical weights.

use crate::checkpoint::{self, TrainerState};
use crate::metrics::ClassificationReport;
use crate::optim::{clip_grad_norm, Decay, Optimizer, OptimizerConfig, Schedule};
use crate::plot;
use crate::tensorboard::EventWriter;
use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use trident_data::{DataLoader, Dataset};
use trident_nn::{Ctx, Params};

/// What one forward pass returns.
#[derive(Debug, Clone)]
pub struct StepOutput {
    /// Scalar loss to minimise (mean over the batch).
    pub loss: Tensor,
    /// `[batch, classes]` logits.
    pub logits: Tensor,
    /// True class per example.
    pub labels: Vec<usize>,
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
}

impl Monitor {
    fn better(self, new: f64, old: f64) -> bool {
        match self {
            Monitor::ValLoss => new < old,
            _ => new > old,
        }
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
    /// Training accuracy (dropout on).
    pub train_accuracy: f64,
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

/// Evaluation of a model on a loader.
#[derive(Debug, Clone)]
pub struct Evaluation {
    /// Mean loss over batches.
    pub loss: f64,
    /// Metrics.
    pub report: ClassificationReport,
    /// Softmax probabilities, row-major.
    pub probs: Vec<f32>,
    /// Labels.
    pub labels: Vec<usize>,
}

/// Loss sum, examples, probabilities and labels of `step` over `loader`'s epoch 0.
fn eval_pass<S: TrainStep, D: Dataset + 'static>(
    step: &S,
    loader: &DataLoader<D, S::Batch>,
) -> Result<(f64, usize, Vec<f32>, Vec<usize>), TrainError> {
    let ctx = Ctx::eval();
    let (mut loss, mut n) = (0f64, 0usize);
    let mut probs = Vec::new();
    let mut labels = Vec::new();
    for batch in loader.epoch(0) {
        let out = step.forward(&batch?, &ctx)?;
        let b = out.labels.len();
        loss += out.loss.to_scalar::<f32>()? as f64 * b as f64;
        n += b;
        let p = trident_nn::ops::softmax_last_dim(&out.logits.detach())?;
        probs.extend(p.flatten_all()?.to_vec1::<f32>()?);
        labels.extend(out.labels);
    }
    Ok((loss, n, probs, labels))
}

/// [`evaluate`] shared among data-parallel ranks: each runs every world-th batch of
/// `loader`, then the probabilities, labels and losses are gathered, so every rank gets
/// the evaluation of the whole set (rows grouped by rank, which no metric depends on).
pub fn evaluate_data_parallel<S: TrainStep, D: Dataset + 'static>(
    step: &S,
    loader: &DataLoader<D, S::Batch>,
    classes: usize,
    d: &crate::ddp::DataParallel,
) -> Result<Evaluation, TrainError> {
    let (world, row) = (d.world(), classes + 1);
    let (loss, n, probs, labels) = eval_pass(step, &loader.strided(d.rank(), world))?;
    let counts = d.comm.all_gather_u64(n as u64)?;
    let max = counts.iter().copied().max().unwrap_or(0) as usize;
    // Equal, padded parts: each row its probabilities and its label.
    let mut mine = vec![0f32; max * row];
    for i in 0..n {
        mine[i * row..i * row + classes].copy_from_slice(&probs[i * classes..(i + 1) * classes]);
        mine[i * row + classes] = labels[i] as f32;
    }
    let mut all = vec![0f32; world * max * row];
    d.comm.all_gather((&mine[..]).into(), (&mut all[..]).into())?;
    let (mut probs, mut labels) = (Vec::new(), Vec::new());
    for (r, &c) in counts.iter().enumerate() {
        for i in 0..c as usize {
            let at = (r * max + i) * row;
            probs.extend_from_slice(&all[at..at + classes]);
            labels.push(all[at + classes] as usize);
        }
    }
    // The loss sum as an f64 through f32: high and low parts.
    let hi = loss as f32;
    let mut sum = [hi, (loss - hi as f64) as f32];
    d.sum(&mut sum)?;
    let total = labels.len();
    if total == 0 {
        return Err(TrainError::Invalid("evaluation set is empty".into()));
    }
    let report = ClassificationReport::new(&probs, &labels, classes);
    Ok(Evaluation {
        loss: (sum[0] as f64 + sum[1] as f64) / total as f64,
        report,
        probs,
        labels,
    })
}

/// Runs `step` in evaluation mode over every batch of `loader` (epoch 0 order).
pub fn evaluate<S: TrainStep, D: Dataset + 'static>(
    step: &S,
    loader: &DataLoader<D, S::Batch>,
    classes: usize,
) -> Result<Evaluation, TrainError> {
    let (loss, n, probs, labels) = eval_pass(step, loader)?;
    if n == 0 {
        return Err(TrainError::Invalid("evaluation set is empty".into()));
    }
    let report = ClassificationReport::new(&probs, &labels, classes);
    Ok(Evaluation {
        loss: loss / n as f64,
        report,
        probs,
        labels,
    })
}

/// Gradients of every trainable parameter for one batch (`None` where the graph gave
/// none): what the "every parameter learns" tests check.
pub fn gradients<S: TrainStep>(
    step: &S,
    batch: &S::Batch,
    ctx: &Ctx,
) -> candle_core::Result<Vec<(String, Option<Vec<f32>>)>> {
    let store = step.params();
    store.begin_step();
    let out = step.forward(batch, ctx)?;
    let grads = out.loss.backward()?;
    store
        .trainable()
        .into_iter()
        .map(|p| {
            let mut g = vec![0f32; p.var.elem_count()];
            let got = store.gradient_into(&grads, &p, &mut g, false)?;
            Ok((p.name, got.then_some(g)))
        })
        .collect()
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

/// Stops the process-wide trace recorder however `fit` ends.
struct TraceGuard;

impl Drop for TraceGuard {
    fn drop(&mut self) {
        trident_nn::trace::stop();
    }
}

impl Trainer {
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
    pub fn fit<S, D, V>(
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
        if c.grad_accum == 0 || c.epochs == 0 {
            return Err(TrainError::Invalid(
                "epochs and grad_accum must be at least 1".into(),
            ));
        }
        let dp = self.data_parallel.as_ref();
        // Rank 0 alone writes the run directory.
        let lead = dp.is_none_or(|d| d.rank() == 0);
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
        // Ops record the mode when they are created: every forward pass below, training and
        // evaluation, runs in the configured precision.
        let bf16 = c.precision == Precision::Bf16;
        let _precision = trident_nn::bf16::autocast(bf16);
        if bf16 && self.progress {
            eprintln!("bf16 mixed precision: {}", trident_nn::bf16::mixed_precision());
        }
        let params = step.params().trainable();
        if params.is_empty() {
            return Err(TrainError::Invalid(
                "the model has no trainable parameters".into(),
            ));
        }
        let per_epoch = train.batches_per_epoch() as u64;
        if per_epoch == 0 {
            return Err(TrainError::Invalid("the training set gives no batch".into()));
        }
        let steps_per_epoch = per_epoch.div_ceil(c.grad_accum);
        let schedule = Schedule {
            lr: c.lr,
            warmup: c.warmup_steps,
            total: steps_per_epoch * c.epochs,
            decay: c.decay,
        };
        let mut optimizer = Optimizer::new(c.optimizer.clone());
        // ZeRO-1: this rank keeps only its shard of the optimizer state.
        let mut zero = match dp {
            Some(d) if d.zero => {
                let z = crate::ddp::Zero1::new(&params, d, &c.optimizer)?;
                if self.progress {
                    let full = z.unsharded_state_bytes();
                    eprintln!(
                        "ZeRO-1: rank {} updates {} of {} parameter values; optimizer state {} on this rank, {} unsharded ({:.1} %)",
                        d.rank(),
                        z.shard_len(),
                        z.total_len(),
                        human_bytes(z.state_bytes()),
                        human_bytes(full),
                        100.0 * z.state_bytes() as f64 / full.max(1) as f64
                    );
                }
                Some(z)
            }
            _ => None,
        };
        let hash = self.config_hash(data_hash);
        if let Some(d) = dp {
            // Every rank must run the same configuration on the same model.
            d.check_same("the configuration (hash)", trident_nn::params::name_hash(&hash))?;
            d.check_same(
                "the model's parameters (names and shapes)",
                crate::ddp::shapes_hash(step.params()),
            )?;
        }
        let last = self.run_dir.join("last");
        let best = self.run_dir.join("best");
        let metrics_path = self.run_dir.join("metrics.jsonl");

        let mut state = TrainerState {
            epoch: 0,
            batch_in_epoch: 0,
            micro_step: 0,
            optimizer_step: 0,
            best_metric: None,
            best_epoch: None,
            epochs_without_improvement: 0,
            finished: false,
            epoch_sums: (0.0, 0, 0, 0),
            config_hash: hash.clone(),
        };
        let mut records: Vec<EpochRecord> = Vec::new();
        if lead {
            // A process killed while swapping a checkpoint in leaves it moved aside: put it
            // back, and clear the temporary directories of killed writes, before looking.
            let recovered = checkpoint::recover(&last).and_then(|l| Ok([l, checkpoint::recover(&best)?]));
            match recovered {
                Ok(notes) => {
                    for note in notes.into_iter().flatten() {
                        if self.progress {
                            eprintln!("{note}");
                        }
                    }
                }
                Err(e) => {
                    if let Some(d) = dp {
                        d.comm.abort(&e.to_string());
                    }
                    return Err(e.into());
                }
            }
        }
        if let Some(d) = dp {
            // No rank looks at `last` before rank 0 has repaired it.
            d.comm.barrier()?;
        }
        if resume {
            if !last.join("state.json").exists() {
                return Err(TrainError::Invalid(format!(
                    "--resume: {} holds no checkpoint to resume from",
                    last.display()
                )));
            }
            state = match zero.as_mut() {
                Some(z) => {
                    checkpoint::verify(&last, &[])?;
                    let s = checkpoint::read_state(&last)?;
                    checkpoint::load_weights(&last, step.params())?;
                    z.load(&last)?;
                    s
                }
                None => checkpoint::load(&last, step.params(), &mut optimizer)?,
            };
            if state.config_hash != hash {
                return Err(TrainError::Invalid(format!(
                    "--resume: {} was written with another configuration (hash {} vs {hash}); \
                     resume with the run's own config.toml",
                    last.display(),
                    state.config_hash
                )));
            }
            // Keep only the epochs the checkpoint has completed.
            records = read_records(&metrics_path)?
                .into_iter()
                .filter(|r| r.epoch < state.epoch)
                .collect();
        } else if last.exists() {
            return Err(TrainError::Invalid(format!(
                "{} already holds a run: pass --resume to continue it, or choose another run directory",
                self.run_dir.display()
            )));
        }
        if let Some(d) = dp {
            // Every rank has looked at the run directory before rank 0 writes to it; then
            // all start from rank 0's weights.
            d.comm.barrier()?;
            d.broadcast_params(step.params())?;
        }
        if lead {
            rewrite_records(&metrics_path, &records)?;
        }
        let mut tb = if lead {
            Some(EventWriter::create(&self.run_dir.join("tensorboard")).map_err(io_err(&self.run_dir))?)
        } else {
            None
        };
        let mut summary = FitSummary {
            records: Vec::new(),
            interrupted: false,
            early_stopped: false,
            state: state.clone(),
            profile: None,
        };
        if state.finished {
            if lead {
                // Killed while drawing the final plots: draw them again.
                plot::training_curves(&self.run_dir, &records)?;
            }
            summary.records = records;
            return Ok(summary);
        }
        let mut steps_this_process = 0u64;
        let save = |dir: &Path,
                    state: &TrainerState,
                    optimizer: &Optimizer,
                    zero: Option<&crate::ddp::Zero1>|
         -> Result<(), TrainError> {
            let files = &self.checkpoint_files;
            let Some(d) = dp else {
                return Ok(checkpoint::save(dir, step.params(), optimizer, state, files)?);
            };
            d.broadcast_buffers(step.params())?;
            d.check_replicas(step.params())?;
            let barrier = || -> Result<(), TrainError> { Ok(d.comm.barrier()?) };
            match zero {
                None if lead => checkpoint::save(dir, step.params(), optimizer, state, files)?,
                None => {}
                Some(z) => {
                    // Rank 0 makes the temporary directory, every rank writes its shard of
                    // the optimizer state into it, rank 0 adds the rest and renames it.
                    const TAG: &str = "tmp-ranks";
                    if lead {
                        checkpoint::begin(dir, TAG)?;
                    }
                    barrier()?;
                    let tmp = checkpoint::tmp_path(dir, TAG);
                    z.save_shard(&tmp, d.rank(), d.world())?;
                    barrier()?;
                    if lead {
                        checkpoint::finish(&tmp, dir, step.params(), None, state, files)?;
                    }
                }
            }
            // Nobody runs ahead of a checkpoint that is still being written.
            barrier()
        };
        let save_last = |state: &TrainerState, optimizer: &Optimizer, zero: Option<&crate::ddp::Zero1>| {
            save(&last, state, optimizer, zero)
        };
        let mut flat = Vec::new();
        use crate::profile::{Phase, PhaseTimer};
        let (recorder, _trace_guard) = match &self.profile {
            Some(_) => {
                let r = trident_nn::trace::start();
                trident_nn::trace::set_recording(false);
                (Some(r), Some(TraceGuard))
            }
            None => (None, None),
        };
        let mut timer = PhaseTimer::new(recorder.clone());
        let monitor = self
            .profile
            .as_ref()
            .map(|_| crate::monitor::Monitor::start(std::time::Duration::from_millis(100)));
        // The sampling profiler runs from the first profiled step to the last.
        let mut sampler: Option<Result<crate::sampler::Sampler, String>> = None;
        let mut sampled: Option<Result<Vec<crate::sampler::SampleRow>, String>> = None;
        // The monitor pauses while the sampler resolves its stacks: that memory is the
        // profiler's, not the run's.
        let finish_sampler = |s: Result<crate::sampler::Sampler, String>| {
            monitor.as_ref().inspect(|m| m.pause(true));
            let rows = s.and_then(|s| s.finish());
            monitor.as_ref().inspect(|m| m.pause(false));
            rows
        };

        'epochs: while state.epoch < c.epochs {
            let epoch = state.epoch;
            let bar = self.progress_bar(per_epoch, epoch);
            bar.set_position(state.batch_in_epoch);
            let started = Instant::now();
            let (mut loss_sum, mut loss_n, mut correct, mut seen) = state.epoch_sums;
            let seen_before = seen;
            let mut acc: Vec<Vec<f32>> = params.iter().map(|p| vec![0f32; p.var.elem_count()]).collect();
            let mut step_sums = [0f32; 5];
            let mut in_group = 0u64;
            let mut batches = train.epoch_from(epoch, state.batch_in_epoch as usize);
            let mut i = state.batch_in_epoch;
            while i < per_epoch {
                if in_group == 0 {
                    let next = state.optimizer_step + 1;
                    let covered = self.profile.as_ref().is_some_and(|p| p.covers(next));
                    timer.begin_step(covered);
                    if covered && sampler.is_none() && sampled.is_none() {
                        sampler = Some(crate::sampler::Sampler::start());
                    }
                }
                let weight = batches.weight(i as usize);
                let batch = batches
                    .next()
                    .ok_or_else(|| TrainError::Invalid("loader ended early".into()))??;
                timer.mark(Phase::Data);
                // Replicas draw different dropout masks (rank 0 the same as a lone run).
                let rank = dp.map_or(0, |d| d.rank() as u64);
                let ctx = Ctx::train(
                    c.seed.wrapping_add(rank.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                    state.micro_step,
                );
                let store = step.params();
                store.begin_step();
                let out = step.forward(&batch, &ctx)?;
                let loss = out.loss.to_scalar::<f32>()? as f64;
                timer.mark(Phase::Forward);
                // A data-parallel rank's share of the global batch: summed across ranks, the
                // gradients are those of the global batch's mean loss.
                let grads = if weight == 1.0 {
                    out.loss.backward()?
                } else {
                    out.loss.affine(weight as f64, 0.0)?.backward()?
                };
                // The first micro-batch of a group overwrites the sums, later ones add.
                for (a, p) in acc.iter_mut().zip(&params) {
                    store.gradient_into(&grads, p, a, in_group > 0)?;
                }
                drop(grads);
                timer.mark(Phase::Backward);
                if !loss.is_finite() {
                    let e = format!(
                        "loss became {loss} at epoch {epoch}, batch {i}: lower the learning rate or clip gradients"
                    );
                    if let Some(d) = dp {
                        d.comm.abort(&e);
                    }
                    return Err(TrainError::Invalid(e));
                }
                let preds = trident_nn::ops::argmax_rows(&out.logits)?;
                let hits = preds.iter().zip(&out.labels).filter(|(p, l)| p == l).count() as u64;
                // Across ranks these are summed once per optimizer step (below).
                step_sums[0] += loss as f32;
                step_sums[1] += 1.0;
                step_sums[2] += hits as f32;
                step_sums[3] += out.labels.len() as f32;
                state.micro_step += 1;
                in_group += 1;
                i += 1;
                bar.inc(1);
                timer.mark(Phase::Other);
                if in_group == c.grad_accum || i == per_epoch {
                    // Gradients and the step's figures, summed over the ranks; a stop asked of
                    // any rank (a signal, --stop-after-steps) stops them all at this step.
                    step_sums[4] = f32::from(u8::from(self.should_stop(steps_this_process + 1)));
                    if let Some(d) = dp {
                        match zero.as_mut() {
                            Some(z) => z.reduce_scatter(d, &mut acc)?,
                            None => d.all_reduce_grads(&mut acc, &mut flat)?,
                        }
                        d.sum(&mut step_sums)?;
                        timer.mark(Phase::Comm);
                    }
                    loss_sum += step_sums[0] as f64;
                    loss_n += step_sums[1] as u64;
                    correct += step_sums[2] as u64;
                    seen += step_sums[3] as u64;
                    let stop_now = step_sums[4] > 0.0;
                    step_sums = [0.0; 5];
                    let lr = schedule.lr(state.optimizer_step);
                    match (zero.as_mut(), dp) {
                        (Some(z), Some(d)) => {
                            if in_group > 1 {
                                z.scale(&mut acc, 1.0 / in_group as f32);
                            }
                            if let Some(max) = c.max_grad_norm {
                                z.clip(d, &mut acc, max)?;
                            }
                            z.step(d, &params, &acc, lr, state.optimizer_step + 1)?;
                        }
                        _ => {
                            if in_group > 1 {
                                let scale = 1.0 / in_group as f32;
                                acc.iter_mut()
                                    .for_each(|a| a.iter_mut().for_each(|v| *v *= scale));
                            }
                            if let Some(max) = c.max_grad_norm {
                                clip_grad_norm(&mut acc, max);
                            }
                            optimizer.step(&params, &acc, lr)?;
                        }
                    }
                    timer.mark(Phase::Optimizer);
                    in_group = 0;
                    state.optimizer_step += 1;
                    state.batch_in_epoch = i;
                    state.epoch_sums = (loss_sum, loss_n, correct, seen);
                    steps_this_process += 1;
                    let rate = (seen - seen_before) as f64 / started.elapsed().as_secs_f64().max(1e-9);
                    let msg = format!("loss {:.4}  {rate:.1} ex/s", loss_sum / (loss_n.max(1)) as f64);
                    if self.progress && bar.is_hidden() && i % (per_epoch / 10).max(1) < c.grad_accum {
                        // Not a terminal (a log file): a line per tenth of the epoch instead.
                        eprintln!("epoch {}/{} batch {i}/{per_epoch}  {msg}", epoch + 1, c.epochs);
                    }
                    bar.set_message(msg);
                    if let Some(tb) = tb
                        .as_mut()
                        .filter(|_| state.optimizer_step.is_multiple_of(c.log_every.max(1)))
                    {
                        tb.scalar("train/loss", state.optimizer_step as i64, loss as f32)
                            .map_err(io_err(tb.path()))?;
                        tb.scalar("train/lr", state.optimizer_step as i64, lr as f32)
                            .map_err(io_err(tb.path()))?;
                    }
                    let periodic =
                        c.checkpoint_every > 0 && state.optimizer_step.is_multiple_of(c.checkpoint_every);
                    if (stop_now || periodic) && i < per_epoch {
                        save_last(&state, &optimizer, zero.as_ref())?;
                    }
                    timer.mark(Phase::Other);
                    timer.end_step(state.optimizer_step);
                    let last = self.profile.as_ref().and_then(|p| p.steps).map(|(_, b)| b);
                    if last == Some(state.optimizer_step) {
                        sampled = sampler.take().map(finish_sampler);
                    }
                    if stop_now && i < per_epoch {
                        bar.abandon_with_message("interrupted: checkpoint written");
                        summary.interrupted = true;
                        break 'epochs;
                    }
                }
            }
            bar.finish_and_clear();
            let seconds = started.elapsed().as_secs_f64();
            if let Some(d) = dp {
                d.broadcast_buffers(step.params())?;
            }
            let val_eval = match (val, dp) {
                (Some(v), Some(d)) => Some(evaluate_data_parallel(step, v, self.classes.len(), d)?),
                (Some(v), None) => Some(evaluate(step, v, self.classes.len())?),
                (None, _) => None,
            };
            let record = EpochRecord {
                epoch,
                step: state.optimizer_step,
                train_loss: loss_sum / loss_n.max(1) as f64,
                train_accuracy: correct as f64 / seen.max(1) as f64,
                val_loss: val_eval.as_ref().map(|e| e.loss),
                val_accuracy: val_eval.as_ref().map(|e| e.report.accuracy),
                val_macro_f1: val_eval.as_ref().map(|e| e.report.macro_f1),
                lr: schedule.lr(state.optimizer_step.saturating_sub(1)),
                epoch_seconds: seconds,
                examples_per_second: (seen - seen_before) as f64 / seconds.max(1e-9),
            };
            if let Some(tb) = tb.as_mut() {
                self.log_epoch(tb, &record)?;
            }
            records.push(record.clone());
            if lead {
                rewrite_records(&metrics_path, &records)?;
            }
            if self.progress {
                eprintln!("{}", describe(&record));
            }
            // Best checkpoint and early stopping on the monitored metric.
            let metric = match (c.monitor, &val_eval) {
                (Monitor::ValAccuracy, Some(e)) => Some(e.report.accuracy),
                (Monitor::ValMacroF1, Some(e)) => Some(e.report.macro_f1),
                (Monitor::ValLoss, Some(e)) => Some(e.loss),
                (_, None) => None,
            };
            state.epoch += 1;
            state.batch_in_epoch = 0;
            state.epoch_sums = (0.0, 0, 0, 0);
            let improved = match (metric, state.best_metric) {
                (Some(m), Some(b)) => c.monitor.better(m, b),
                (Some(_), None) => true,
                (None, _) => true, // no validation: the latest is the best
            };
            if improved {
                state.best_metric = metric;
                state.best_epoch = Some(epoch);
                state.epochs_without_improvement = 0;
            } else {
                state.epochs_without_improvement += 1;
            }
            let early = c
                .early_stopping_patience
                .is_some_and(|p| state.epochs_without_improvement >= p);
            state.finished = state.epoch >= c.epochs || early;
            if improved {
                save(&best, &state, &optimizer, zero.as_ref())?;
            }
            save_last(&state, &optimizer, zero.as_ref())?;
            if lead {
                plot::training_curves(&self.run_dir, &records)?;
            }
            if early {
                summary.early_stopped = true;
                if self.progress {
                    eprintln!(
                        "early stop: {:?} has not improved for {} epochs (best {:.4} at epoch {})",
                        c.monitor,
                        state.epochs_without_improvement,
                        state.best_metric.unwrap_or(f64::NAN),
                        state.best_epoch.unwrap_or(0)
                    );
                }
                break;
            }
            let mut stop = [f32::from(u8::from(self.should_stop(steps_this_process)))];
            if let Some(d) = dp {
                d.sum(&mut stop)?;
            }
            if stop[0] > 0.0 && !state.finished {
                summary.interrupted = true;
                break;
            }
        }
        summary.records = records;
        summary.state = state;
        if let (Some(opts), Some(rec)) = (&self.profile, &recorder) {
            trident_nn::trace::stop();
            let events = rec.take();
            let sampled = sampled.or_else(|| sampler.take().map(finish_sampler));
            let samples = monitor.map(|m| m.finish()).unwrap_or_default();
            let mut report = crate::profile::analyse(&timer.rows, &events, &samples, opts);
            match sampled {
                Some(Ok(rows)) => report.sampled = Some(crate::profile::Sampled { rows }),
                Some(Err(e)) if self.progress => eprintln!("sampling profiler: {e}; no samples.csv"),
                _ => {}
            }
            crate::profile::write(&opts.dir, &timer.rows, &events, &report).map_err(io_err(&opts.dir))?;
            crate::monitor::write(&opts.dir, &samples).map_err(io_err(&opts.dir))?;
            if self.progress {
                eprintln!(
                    "{}  wrote {}/{{trace.json,steps.csv,ops.csv,layers.csv,samples.csv,monitor.csv,cpu_heatmap.png,summary.txt,report.json}}",
                    report.text(8),
                    opts.dir.display()
                );
            }
            summary.profile = Some(report);
        }
        Ok(summary)
    }

    /// A signal arrived, or this process has taken its allotted optimizer steps.
    fn should_stop(&self, steps_this_process: u64) -> bool {
        self.stop.load(Ordering::SeqCst) || self.stop_after_steps.is_some_and(|n| steps_this_process >= n)
    }

    fn progress_bar(&self, len: u64, epoch: u64) -> indicatif::ProgressBar {
        if !self.progress {
            return indicatif::ProgressBar::hidden();
        }
        let bar = indicatif::ProgressBar::new(len);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "epoch {prefix} [{bar:30}] {pos}/{len} batches  {msg}  eta {eta}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        bar.set_prefix(format!("{}/{}", epoch + 1, self.config.epochs));
        bar
    }

    fn log_epoch(&self, tb: &mut EventWriter, r: &EpochRecord) -> Result<(), TrainError> {
        let step = r.step as i64;
        let mut scalars = vec![
            ("epoch/train_loss", r.train_loss),
            ("epoch/train_accuracy", r.train_accuracy),
        ];
        if let (Some(l), Some(a), Some(f)) = (r.val_loss, r.val_accuracy, r.val_macro_f1) {
            scalars.extend([("val/loss", l), ("val/accuracy", a), ("val/macro_f1", f)]);
        }
        for (tag, v) in scalars {
            tb.scalar(tag, step, v as f32).map_err(io_err(tb.path()))?;
        }
        Ok(())
    }
}

fn describe(r: &EpochRecord) -> String {
    let mut s = format!(
        "epoch {}  train loss {:.4}  acc {:.4}",
        r.epoch + 1,
        r.train_loss,
        r.train_accuracy
    );
    if let (Some(l), Some(a), Some(f)) = (r.val_loss, r.val_accuracy, r.val_macro_f1) {
        s += &format!("  |  val loss {l:.4}  acc {a:.4}  macro-F1 {f:.4}");
    }
    s + &format!("  |  {:.1}s, {:.1} ex/s", r.epoch_seconds, r.examples_per_second)
}

fn read_records(path: &Path) -> Result<Vec<EpochRecord>, TrainError> {
    match std::fs::read_to_string(path) {
        Ok(text) => text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .enumerate()
            .map(|(i, l)| {
                serde_json::from_str(l)
                    .map_err(|e| TrainError::Invalid(format!("{}:{}: {e}", path.display(), i + 1)))
            })
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(TrainError::Io {
            path: path.into(),
            source: e,
        }),
    }
}

/// Writes all records to `metrics.jsonl` atomically (temporary file, then rename).
fn rewrite_records(path: &Path, records: &[EpochRecord]) -> Result<(), TrainError> {
    let tmp = path.with_extension("jsonl.tmp");
    let mut f = std::fs::File::create(&tmp).map_err(io_err(&tmp))?;
    for r in records {
        writeln!(f, "{}", serde_json::to_string(r).expect("record serialises")).map_err(io_err(&tmp))?;
    }
    f.sync_all().map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err(path))
}
