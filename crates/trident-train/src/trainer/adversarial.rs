//! Adversarial training (GANs): two parameter groups, a generator and a discriminator (a
//! critic), each with its own [`Updater`] and optimizer state, updated in turn — the
//! critic after every batch of real examples, the generator after every
//! [`AdversarialStep::critic_steps`]-th. The loop composes the same parts as
//! [`Trainer::fit`]: [`Checkpoints`] (both optimizers' states in one checkpoint, written
//! atomically, resumed bit for bit), [`RunLog`], [`StepProfiler`] (a profiled step is one
//! critic update and, when it falls there, the generator's), [`StopRequest`] and [`EarlyStopping`] on
//! the figure an [`EpochJudge`] gives each epoch (lower is better, e.g. a Fréchet distance).
//!
//! Step `t` (the batch count of the run) draws the critic's random numbers from seed
//! `(seed, 2t)` and the generator's from `(seed, 2t + 1)`: a resumed run draws what an
//! uninterrupted one would.

use super::{
    io_err, Checkpoints, EarlyStopping, EpochRecord, FitSummary, Monitor, RunLog, StepProfiler, StopRequest,
    TrainError, Trainer, Updater,
};
use crate::profile::Phase;
use candle_core::Tensor;
use std::collections::BTreeMap;
use std::time::Instant;
use trident_data::{DataLoader, Dataset};
use trident_nn::{Ctx, Param, Params};

/// The critic's loss on one batch of real examples and as many generated ones.
pub struct CriticLoss {
    /// The scalar loss (the generator's output detached: only the critic learns from it).
    pub loss: Tensor,
    /// Mean score of the real examples.
    pub real: f64,
    /// Mean score of the generated examples.
    pub fake: f64,
    /// Real examples in the batch.
    pub examples: usize,
}

/// A generator and a critic with their losses: what [`Trainer::fit_adversarial`] drives.
pub trait AdversarialStep {
    /// The batch of real examples the data loader builds.
    type Batch: Send + 'static;
    /// Every parameter of both networks (checkpoints save them all).
    fn params(&self) -> &Params;
    /// The generator's trainable parameters.
    fn generator_params(&self) -> Vec<Param>;
    /// The critic's trainable parameters.
    fn critic_params(&self) -> Vec<Param>;
    /// The critic's loss on `batch` and as many generated examples.
    fn critic_loss(&self, batch: &Self::Batch, ctx: &Ctx) -> candle_core::Result<CriticLoss>;
    /// The generator's loss on `n` generated examples.
    fn generator_loss(&self, n: usize, ctx: &Ctx) -> candle_core::Result<Tensor>;
    /// Runs after every critic update (WGAN clips the critic's weights here).
    fn after_critic_update(&self) -> candle_core::Result<()> {
        Ok(())
    }
    /// Critic updates per generator update (WGAN: 5).
    fn critic_steps(&self) -> u64 {
        1
    }
}

/// What judges an epoch's generator (sample grids, sample quality): figures for the epoch's
/// record, and the one (lower is better) that picks the `best` checkpoint and drives early
/// stopping; without one, the latest epoch is the best.
pub type EpochJudge<'a> =
    dyn FnMut(u64) -> Result<(BTreeMap<String, f64>, Option<f64>), TrainError> + Send + 'a;

/// The running sums of an epoch beyond `TrainerState::epoch_sums` (the critic's loss, its
/// batches and the real examples live there).
const GENERATOR_LOSS: usize = 0;
const GENERATOR_STEPS: usize = 1;
const REAL_SCORE: usize = 2;
const FAKE_SCORE: usize = 3;
const SUMS: usize = 4;

fn finite(what: &str, v: f64, epoch: u64, batch: u64) -> Result<(), TrainError> {
    if v.is_finite() {
        return Ok(());
    }
    Err(TrainError::Invalid(format!(
        "the {what} loss became {v} at epoch {epoch}, batch {batch}: lower the learning rate"
    )))
}

/// One batch of [`Trainer::fit_adversarial`]: the critic's update on `batch`, then, every
/// `critic_steps`-th batch of the run, the generator's; the epoch's sums in `state`.
/// Returns the critic's loss and learning rate. `at` (epoch, batch) names where a loss
/// that is not finite appeared.
fn adversarial_batch<S: AdversarialStep>(
    step: &S,
    batch: &S::Batch,
    state: &mut crate::checkpoint::TrainerState,
    [critic, generator]: [&mut Updater; 2],
    profiler: &mut StepProfiler<'_>,
    seed: u64,
    (epoch, i): (u64, u64),
) -> Result<(f64, f64), TrainError> {
    let (params, n_critic, t) = (step.params(), step.critic_steps().max(1), state.micro_step);
    // The critic.
    params.begin_step();
    let out = step.critic_loss(batch, &Ctx::train(seed, 2 * t))?;
    let d_loss = out.loss.to_scalar::<f32>()? as f64;
    finite("critic's", d_loss, epoch, i)?;
    profiler.mark(Phase::Forward);
    let grads = out.loss.backward()?;
    critic.gather(params, &grads)?;
    drop(grads);
    profiler.mark(Phase::Backward);
    let lr = critic.update(None, state.optimizer_step)?;
    step.after_critic_update()?;
    profiler.mark(Phase::Optimizer);
    state.optimizer_step += 1;
    let sums = &mut state.epoch_sums;
    sums.0 += d_loss;
    sums.1 += 1;
    sums.3 += out.examples as u64;
    state.extra_sums[REAL_SCORE] += out.real;
    state.extra_sums[FAKE_SCORE] += out.fake;
    // The generator, every `n_critic` batches of the run.
    if (t + 1).is_multiple_of(n_critic) {
        params.begin_step();
        let loss = step.generator_loss(out.examples, &Ctx::train(seed, 2 * t + 1))?;
        let g_loss = loss.to_scalar::<f32>()? as f64;
        finite("generator's", g_loss, epoch, i)?;
        profiler.mark(Phase::Forward);
        let grads = loss.backward()?;
        generator.gather(params, &grads)?;
        drop(grads);
        profiler.mark(Phase::Backward);
        generator.update(None, (t + 1) / n_critic - 1)?;
        profiler.mark(Phase::Optimizer);
        state.extra_sums[GENERATOR_LOSS] += g_loss;
        state.extra_sums[GENERATOR_STEPS] += 1.0;
    }
    Ok((d_loss, lr))
}

/// What an adversarial run's loop works on: both updaters, the checkpoints, the resumable
/// state, the run's log, and whether its batches run in bf16 mixed precision.
struct GanRun<'a> {
    bf16: bool,
    critic: Updater,
    generator: Updater,
    checkpoints: Checkpoints<'a>,
    state: crate::checkpoint::TrainerState,
    log: RunLog,
}

impl Trainer {
    /// Trains `step`'s generator and critic on the real examples of `train`; after each
    /// epoch `judge` reports on the generator. With `resume`, continues from
    /// `run_dir/last`. `data_hash` joins the configuration hash as in [`Trainer::fit`]; the
    /// loop runs on a worker of the current rayon pool, as there.
    pub fn fit_adversarial<S, D>(
        &self,
        step: &S,
        train: &DataLoader<D, S::Batch>,
        resume: bool,
        data_hash: &str,
        judge: &mut EpochJudge<'_>,
    ) -> Result<FitSummary, TrainError>
    where
        S: AdversarialStep + Sync,
        D: Dataset + 'static,
    {
        trident_nn::runtime::on_pool(|| self.fit_adversarial_here(step, train, resume, data_hash, judge))
    }

    /// [`fit_adversarial`](Self::fit_adversarial) on the calling thread.
    fn fit_adversarial_here<S, D>(
        &self,
        step: &S,
        train: &DataLoader<D, S::Batch>,
        resume: bool,
        data_hash: &str,
        judge: &mut EpochJudge<'_>,
    ) -> Result<FitSummary, TrainError>
    where
        S: AdversarialStep,
        D: Dataset + 'static,
    {
        self.refuse_for_gan()?;
        std::fs::create_dir_all(&self.run_dir).map_err(io_err(&self.run_dir))?;
        trident_nn::runtime::keep_freed_memory();
        let per_epoch = train.batches_per_epoch() as u64;
        if per_epoch == 0 {
            return Err(TrainError::Invalid("the training set gives no batch".into()));
        }
        let mut run = self.open_adversarial(step, per_epoch, resume, data_hash)?;
        if run.state.finished {
            // Killed while drawing the final plots: draw them again.
            run.log.plots()?;
            return Ok(FitSummary {
                records: run.log.records,
                interrupted: false,
                early_stopped: false,
                state: run.state,
                profile: None,
            });
        }
        let mut stop = StopRequest::new(&self.stop, self.stop_after_steps);
        let rule = EarlyStopping {
            monitor: Monitor::ValFd,
            patience: self.config.early_stopping_patience,
        };
        let (mut interrupted, mut early_stopped) = (false, false);
        let mut profiler = StepProfiler::new(self.profile.as_ref());
        while run.state.epoch < self.config.epochs {
            let (epoch, started) = (run.state.epoch, Instant::now());
            let seen_before = run.state.epoch_sums.3;
            let since = (started, seen_before);
            if self.adversarial_epoch(
                step,
                train,
                &mut run,
                (&mut stop, &mut profiler),
                per_epoch,
                since,
            )? {
                interrupted = true;
                break;
            }
            let seconds = started.elapsed().as_secs_f64();
            let (figures, metric) = judge(epoch)?;
            let lr = run.critic.lr(run.state.optimizer_step.saturating_sub(1));
            run.log
                .epoch(epoch_record(&run.state, figures, lr, seconds, seen_before))?;
            run.state.extra_sums = vec![0.0; SUMS];
            let verdict = rule.end_epoch(&mut run.state, epoch, metric, self.config.epochs);
            run.checkpoints.save_epoch(
                step.params(),
                &run.state,
                &[&run.generator, &run.critic],
                verdict.improved,
            )?;
            run.log.plots_periodically()?;
            if verdict.early {
                early_stopped = true;
                if self.progress {
                    eprintln!("{}", rule.stop_message(&run.state));
                }
                break;
            }
            if stop.asked(0) && !run.state.finished {
                interrupted = true;
                break;
            }
        }
        run.log.plots_if_behind()?;
        Ok(FitSummary {
            records: run.log.records,
            interrupted,
            early_stopped,
            state: run.state,
            profile: profiler.finish(self.progress)?,
        })
    }

    /// The two updaters (the critic's stepping every batch, the generator's every
    /// `critic_steps`-th), the checkpoints (resumed from `last` with `resume`) and the log of
    /// an adversarial run of `per_epoch` batches an epoch.
    fn open_adversarial<S: AdversarialStep>(
        &self,
        step: &S,
        per_epoch: u64,
        resume: bool,
        data_hash: &str,
    ) -> Result<GanRun<'_>, TrainError> {
        let c = &self.config;
        let bf16 = self.mixed_precision();
        let n_critic = step.critic_steps().max(1);
        let batches = per_epoch * c.epochs;
        let mut critic = Updater::of(step.critic_params(), c, batches, None, self.progress)?;
        let generator_steps = (batches / n_critic).max(1);
        let mut generator = Updater::of(step.generator_params(), c, generator_steps, None, self.progress)?;
        let checkpoints = Checkpoints::new(&self.run_dir, &self.checkpoint_files, None);
        let hash = self.config_hash(data_hash);
        let updaters: &mut [&mut Updater] = &mut [&mut generator, &mut critic];
        let state = checkpoints.open(resume, step.params(), updaters, &hash, self.progress)?;
        // The critic updates once per batch, the generator once per `n_critic`.
        generator.optimizer_mut().steps = state.micro_step / n_critic;
        let log = RunLog::open(&self.run_dir, state.epoch, c.epochs, true, self.progress)?;
        Ok(GanRun {
            bf16,
            critic,
            generator,
            checkpoints,
            state,
            log,
        })
    }

    /// The rest of `run`'s current epoch, batch by batch (from where a resumed run
    /// stopped), with a checkpoint every `checkpoint_every` optimizer steps and on a stop
    /// request; returns whether the run was stopped mid-epoch (its checkpoint written).
    /// `since`: when this process began the epoch, and the examples seen before (the
    /// progress line's rate).
    fn adversarial_epoch<S, D>(
        &self,
        step: &S,
        train: &DataLoader<D, S::Batch>,
        run: &mut GanRun<'_>,
        (stop, profiler): (&mut StopRequest<'_>, &mut StepProfiler<'_>),
        per_epoch: u64,
        (started, seen_before): (Instant, u64),
    ) -> Result<bool, TrainError>
    where
        S: AdversarialStep,
        D: Dataset + 'static,
    {
        let c = &self.config;
        let GanRun {
            bf16,
            critic,
            generator,
            checkpoints,
            state,
            log,
        } = run;
        let epoch = state.epoch;
        let bar = log.progress_bar(per_epoch, epoch);
        bar.set_position(state.batch_in_epoch);
        if state.extra_sums.len() != SUMS {
            state.extra_sums = vec![0.0; SUMS];
        }
        let mut loader = train.epoch_from(epoch, state.batch_in_epoch as usize);
        while state.batch_in_epoch < per_epoch {
            let i = state.batch_in_epoch;
            profiler.begin_step(state.optimizer_step + 1);
            let batch = loader
                .next()
                .ok_or_else(|| TrainError::Invalid("loader ended early".into()))??;
            profiler.mark(Phase::Data);
            // The batch's ops in the configured precision (they keep it for their
            // backward passes); the judge's sampling and scoring stay f32.
            let _precision = trident_nn::bf16::autocast(*bf16);
            let updaters = [&mut *critic, &mut *generator];
            let (d_loss, lr) =
                adversarial_batch(step, &batch, state, updaters, profiler, c.seed, (epoch, i))?;
            state.micro_step += 1;
            state.batch_in_epoch = i + 1;
            bar.inc(1);
            stop.steps_this_process += 1;
            let n = state.optimizer_step;
            if n.is_multiple_of(c.log_every.max(1)) {
                log.step_scalars(n, d_loss, lr, critic.grad_norm())?;
            }
            let (loss_sum, loss_n, _, seen) = state.epoch_sums;
            let rate = (seen - seen_before) as f64 / started.elapsed().as_secs_f64().max(1e-9);
            let mean = loss_sum / loss_n.max(1) as f64;
            log.step_message(&bar, epoch, i + 1, per_epoch, 1, mean, rate);
            let stop_now = stop.asked(0);
            let periodic = c.checkpoint_every > 0 && n.is_multiple_of(c.checkpoint_every);
            let mid_epoch = state.batch_in_epoch < per_epoch;
            if (stop_now || periodic) && mid_epoch {
                checkpoints.save_last(step.params(), state, &[&*generator, &*critic])?;
            }
            profiler.mark(Phase::Other);
            profiler.end_step(n);
            if stop_now && mid_epoch {
                bar.abandon_with_message("interrupted: checkpoint written");
                return Ok(true);
            }
        }
        bar.finish_and_clear();
        Ok(false)
    }

    /// What a GAN's loop does not offer, refused by name before anything is written.
    fn refuse_for_gan(&self) -> Result<(), TrainError> {
        let c = &self.config;
        let refusals = [
            (
                self.data_parallel.is_some(),
                "a GAN trains in one process: data parallelism is not offered for it",
            ),
            (
                c.grad_accum != 1,
                "train.grad_accum: a GAN updates after every batch; leave it at 1",
            ),
            (c.epochs == 0, "epochs must be at least 1"),
            (
                c.monitor != Monitor::ValFd,
                "train.monitor: a GAN's best epoch has the lowest Fréchet distance (\"val_fd\")",
            ),
        ];
        match refusals.into_iter().find(|(refused, _)| *refused) {
            Some((_, why)) => Err(TrainError::Invalid(why.into())),
            None => Ok(()),
        }
    }
}

/// A GAN epoch's record from its sums: the judge's `figures` plus the critic's mean scores
/// on real and generated batches and the generator's mean loss.
fn epoch_record(
    state: &crate::checkpoint::TrainerState,
    mut figures: BTreeMap<String, f64>,
    lr: f64,
    seconds: f64,
    seen_before: u64,
) -> EpochRecord {
    let (loss_sum, loss_n, _, seen) = state.epoch_sums;
    let x = &state.extra_sums;
    let per_batch = |v: f64| v / loss_n.max(1) as f64;
    figures.insert("d_real".into(), per_batch(x[REAL_SCORE]));
    figures.insert("d_fake".into(), per_batch(x[FAKE_SCORE]));
    if x[GENERATOR_STEPS] > 0.0 {
        figures.insert("generator_loss".into(), x[GENERATOR_LOSS] / x[GENERATOR_STEPS]);
    }
    EpochRecord {
        epoch: state.epoch,
        step: state.optimizer_step,
        train_loss: per_batch(loss_sum),
        train_accuracy: None,
        val_loss: None,
        val_accuracy: None,
        val_macro_f1: None,
        lr,
        epoch_seconds: seconds,
        examples_per_second: (seen - seen_before) as f64 / seconds.max(1e-9),
        figures,
    }
}
