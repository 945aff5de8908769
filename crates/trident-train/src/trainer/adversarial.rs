//! Adversarial training (GANs) as a [`Task`]: two parameter groups, a generator and a
//! discriminator (a critic), each with its own [`Updater`] and optimizer state, updated in
//! turn — the critic after every batch of real examples, the generator after every
//! [`AdversarialStep::critic_steps`]-th. On the one loop, both optimizers' states are in
//! one checkpoint, resumed bit for bit; a profiled step is one critic update and, when it
//! falls there, the generator's; the `best` epoch and early stopping follow the figure an
//! [`EpochJudge`] gives each epoch (`val_fd`, a Fréchet distance: lower is better).
//!
//! Step `t` (the batch count of the run) draws the critic's random numbers from seed
//! `(seed, 2t)` and the generator's from `(seed, 2t + 1)`: a resumed run draws what an
//! uninterrupted one would.

use super::task::{BatchContext, EpochContext, Goal, MetricDef, Metrics, Plan, StepDone, Task};
use super::{FitSummary, TrainError, Trainer, Updater};
use crate::checkpoint::TrainerState;
use crate::profile::Phase;
use candle_core::Tensor;
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

/// A generator and a critic with their losses: what [`Adversarial`] trains.
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
/// record by name; `val_fd` among them (lower is better) picks the `best` checkpoint and
/// drives early stopping, and without it the latest epoch is the best. It runs in f32.
pub type EpochJudge<'a> = dyn FnMut(u64) -> Result<Metrics, TrainError> + Send + 'a;

/// The optimizer groups, in the order checkpoints store them.
const GENERATOR: usize = 0;
const CRITIC: usize = 1;

/// The epoch's sums beyond the critic's loss, batches and real examples.
const GENERATOR_LOSS: &str = "generator_loss";
const GENERATOR_STEPS: &str = "generator_steps";
const REAL_SCORE: &str = "d_real";
const FAKE_SCORE: &str = "d_fake";

fn finite(what: &str, v: f64, epoch: u64, batch: u64) -> Result<(), TrainError> {
    if v.is_finite() {
        return Ok(());
    }
    Err(TrainError::Invalid(format!(
        "the {what} loss became {v} at epoch {epoch}, batch {batch}: lower the learning rate"
    )))
}

/// An [`AdversarialStep`] trained on batches of real examples, judged after each epoch.
pub struct Adversarial<'a, 'j, S: AdversarialStep> {
    step: &'a S,
    judge: &'a mut EpochJudge<'j>,
}

impl<'a, 'j, S: AdversarialStep> Adversarial<'a, 'j, S> {
    /// `step`'s generator and critic, `judge` reporting on the generator every epoch.
    pub fn new(step: &'a S, judge: &'a mut EpochJudge<'j>) -> Self {
        Adversarial { step, judge }
    }

    /// The generator's update on as many generated examples as the critic saw real ones.
    fn generator_update(
        &self,
        cx: &mut BatchContext<'_, '_>,
        examples: usize,
        (t, n_critic): (u64, u64),
    ) -> Result<(), TrainError> {
        let params = self.step.params();
        params.begin_step();
        let loss = self
            .step
            .generator_loss(examples, &Ctx::train(cx.config.seed, 2 * t + 1))?;
        let g_loss = loss.to_scalar::<f32>()? as f64;
        finite("generator's", g_loss, cx.epoch, cx.index)?;
        cx.profiler.mark(Phase::Forward);
        let grads = loss.backward()?;
        let generator = &mut cx.updaters[GENERATOR];
        generator.gather(params, &grads)?;
        drop(grads);
        cx.profiler.mark(Phase::Backward);
        generator.update(None, (t + 1) / n_critic - 1)?;
        cx.profiler.mark(Phase::Optimizer);
        cx.sums.add(GENERATOR_LOSS, g_loss);
        cx.sums.add(GENERATOR_STEPS, 1.0);
        Ok(())
    }
}

impl<S: AdversarialStep> Task for Adversarial<'_, '_, S> {
    type Batch = S::Batch;

    fn params(&self) -> &Params {
        self.step.params()
    }

    fn metrics(&self) -> Vec<MetricDef> {
        vec![MetricDef {
            name: "val_fd",
            goal: Goal::Minimize,
        }]
    }

    /// What a GAN's training does not offer, refused by name (epochs and the monitored
    /// metric are checked by the loop for every task).
    fn check(&self, trainer: &Trainer) -> Result<(), TrainError> {
        let refusals = [
            (
                trainer.data_parallel.is_some(),
                "a GAN trains in one process: data parallelism is not offered for it",
            ),
            (
                trainer.config.grad_accum != 1,
                "train.grad_accum: a GAN updates after every batch; leave it at 1",
            ),
        ];
        match refusals.into_iter().find(|(refused, _)| *refused) {
            Some((_, why)) => Err(TrainError::Invalid(why.into())),
            None => Ok(()),
        }
    }

    /// The critic's updater steps every batch, the generator's every `critic_steps`-th.
    fn updaters(&self, plan: &Plan<'_>) -> Result<Vec<Updater>, TrainError> {
        let (c, batches) = (plan.config, plan.batches());
        let n_critic = self.step.critic_steps().max(1);
        let critic = Updater::of(self.step.critic_params(), c, batches, None, plan.progress)?;
        let generator_steps = (batches / n_critic).max(1);
        let generator = Updater::of(
            self.step.generator_params(),
            c,
            generator_steps,
            None,
            plan.progress,
        )?;
        Ok(vec![generator, critic])
    }

    fn opened(&mut self, state: &TrainerState, updaters: &mut [Updater]) {
        // The critic updates once per batch, the generator once per `n_critic`.
        let n_critic = self.step.critic_steps().max(1);
        updaters[GENERATOR].optimizer_mut().steps = state.micro_step / n_critic;
    }

    /// The critic's update on `batch`, then, every `critic_steps`-th batch of the run, the
    /// generator's.
    fn batch(
        &mut self,
        batch: &S::Batch,
        mut cx: BatchContext<'_, '_>,
    ) -> Result<Option<StepDone>, TrainError> {
        let (params, n_critic, t) = (self.step.params(), self.step.critic_steps().max(1), cx.micro_step);
        params.begin_step();
        let out = self.step.critic_loss(batch, &Ctx::train(cx.config.seed, 2 * t))?;
        let d_loss = out.loss.to_scalar::<f32>()? as f64;
        finite("critic's", d_loss, cx.epoch, cx.index)?;
        cx.profiler.mark(Phase::Forward);
        let grads = out.loss.backward()?;
        let critic = &mut cx.updaters[CRITIC];
        critic.gather(params, &grads)?;
        drop(grads);
        cx.profiler.mark(Phase::Backward);
        let lr = critic.update(None, cx.optimizer_step)?;
        let grad_norm = critic.grad_norm();
        self.step.after_critic_update()?;
        cx.profiler.mark(Phase::Optimizer);
        cx.sums.loss += d_loss;
        cx.sums.batches += 1;
        cx.sums.units += out.examples as u64;
        cx.sums.add(REAL_SCORE, out.real);
        cx.sums.add(FAKE_SCORE, out.fake);
        if (t + 1).is_multiple_of(n_critic) {
            self.generator_update(&mut cx, out.examples, (t, n_critic))?;
        }
        Ok(Some(StepDone {
            loss: d_loss,
            lr,
            grad_norm,
            stop: cx.stop_asked(),
        }))
    }

    /// The judge's figures (sampling and scoring in f32), the critic's mean scores on real
    /// and generated batches, and the generator's mean loss.
    fn end_epoch(&mut self, cx: EpochContext<'_>) -> Result<Metrics, TrainError> {
        let mut figures = {
            let _f32 = trident_nn::bf16::autocast(false);
            (self.judge)(cx.epoch)?
        };
        let sums = &cx.state.sums;
        let per_batch = |v: f64| v / sums.batches.max(1) as f64;
        figures.insert(REAL_SCORE.into(), per_batch(sums.get(REAL_SCORE)));
        figures.insert(FAKE_SCORE.into(), per_batch(sums.get(FAKE_SCORE)));
        if sums.get(GENERATOR_STEPS) > 0.0 {
            figures.insert(
                GENERATOR_LOSS.into(),
                sums.get(GENERATOR_LOSS) / sums.get(GENERATOR_STEPS),
            );
        }
        Ok(figures)
    }
}

impl Trainer {
    /// Trains `step`'s generator and critic on the real examples of `train` on the one
    /// loop ([`Trainer::run`] of an [`Adversarial`] task); after each epoch `judge`
    /// reports on the generator. With `resume`, continues from `run_dir/last`.
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
        self.run(&mut Adversarial::new(step, judge), train, resume, data_hash)
    }
}
