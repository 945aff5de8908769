//! Deep Q-learning (Mnih et al. 2015, as Stable-Baselines3 and CleanRL run it): an MLP of
//! action values trained on minibatches from a replay buffer against a target network's
//! bootstrapped values, the target copied from the online network every
//! `target_update_interval` environment steps; ε-greedy exploration on a linear schedule,
//! Huber (or squared) loss, optional double DQN, Adam through the loop's updater (global
//! gradient clipping at `train.max_grad_norm`).

use super::{
    argmax, encode, epoch_figures, evaluate_with, evaluated, read_progress, restore_env, return_metrics,
    state_files, Episodes, EpsilonSchedule,
};
use crate::env::{Env, Obs, Space};
use crate::rng::NpRandom;
use serde::{Deserialize, Serialize};
use std::path::Path;
use trident_nn::layers::Mlp;
use trident_nn::{Ctx, Device, Params, Tensor};
use trident_train::trainer::{
    BatchContext, EpochContext, MetricDef, Metrics, Plan, StepDone, Task, TrainError, Updater,
};

/// A DQN agent's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DqnConfig {
    /// Hidden widths of the Q-network (ReLU between layers).
    pub hidden: Vec<usize>,
    /// Discount γ.
    pub gamma: f64,
    /// Transitions sampled per gradient step.
    pub batch_size: usize,
    /// Transitions the replay buffer keeps (the oldest overwritten).
    pub buffer_size: usize,
    /// Environment steps before the first gradient step (actions uniformly random until then
    /// follow ε's schedule as usual).
    pub learning_starts: u64,
    /// Gradient steps happen every this many environment steps…
    pub train_frequency: u64,
    /// …this many at a time.
    pub gradient_steps: u64,
    /// The target network is copied from the online one every this many environment steps.
    pub target_update_interval: u64,
    /// Double DQN: the online network picks the next action, the target network values it.
    pub double: bool,
    /// Huber loss (δ = 1, SB3's smooth L1); squared error otherwise (CleanRL's).
    pub huber: bool,
    /// The exploration schedule over the run's environment steps.
    pub epsilon: EpsilonSchedule,
    /// Environment steps per iteration (the loop's batch).
    pub steps_per_iteration: u64,
    /// Greedy episodes evaluated at each epoch's end.
    pub eval_episodes: u64,
    /// Their first seed.
    pub eval_seed: u64,
}

/// The replay buffer: observations as f32 rows.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Replay {
    width: usize,
    capacity: usize,
    /// Next slot to write.
    at: usize,
    len: usize,
    #[serde(with = "crate::exact::vec_f32")]
    obs: Vec<f32>,
    #[serde(with = "crate::exact::vec_f32")]
    next_obs: Vec<f32>,
    actions: Vec<u32>,
    #[serde(with = "crate::exact::vec_f32")]
    rewards: Vec<f32>,
    /// 1 where the transition ended in a terminal state (no bootstrap).
    #[serde(with = "crate::exact::vec_f32")]
    terminal: Vec<f32>,
}

impl Replay {
    fn new(width: usize, capacity: usize) -> Self {
        Replay {
            width,
            capacity,
            ..Default::default()
        }
    }

    fn push(&mut self, obs: &[f32], action: usize, reward: f64, next: &[f32], terminal: bool) {
        let w = self.width;
        if self.obs.len() < self.capacity * w {
            self.obs.extend_from_slice(obs);
            self.next_obs.extend_from_slice(next);
            self.actions.push(action as u32);
            self.rewards.push(reward as f32);
            self.terminal.push(f32::from(u8::from(terminal)));
        } else {
            let i = self.at;
            self.obs[i * w..(i + 1) * w].copy_from_slice(obs);
            self.next_obs[i * w..(i + 1) * w].copy_from_slice(next);
            self.actions[i] = action as u32;
            self.rewards[i] = reward as f32;
            self.terminal[i] = f32::from(u8::from(terminal));
        }
        self.at = (self.at + 1) % self.capacity;
        self.len = (self.len + 1).min(self.capacity);
    }
}

/// What an interrupted run must get back to continue exactly.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Progress {
    steps: u64,
    updates: u64,
    #[serde(with = "crate::exact::vec_f32")]
    obs: Vec<f32>,
    #[serde(with = "crate::exact::f64_bits")]
    episode_return: f64,
    episode_length: u64,
    episodes: Episodes,
    explore: NpRandom,
    replay: Replay,
}

/// A DQN agent on the training loop.
pub struct Dqn {
    /// Draws each epoch's first greedy episode, when set.
    pub gifs: Option<super::EpisodeGifs>,
    config: DqnConfig,
    env: Box<dyn Env>,
    /// The evaluation copy (taken out while it runs).
    eval_env: Option<Box<dyn Env>>,
    /// Observations: a box's values, or a discrete state one-hot.
    width: usize,
    discrete_obs: Option<usize>,
    actions: usize,
    params: Params,
    online: Mlp,
    target: Mlp,
    progress: Progress,
    total_steps: std::cell::Cell<u64>,
    /// Seeds the training passes' context (the networks have no dropout: kept for any
    /// randomness a layer draws).
    seed: u64,
}

/// The file of the environment's snapshot in a checkpoint.
const ENV: &str = "env.json";

impl Dqn {
    /// An agent for `env` (discrete actions), evaluated on `eval_env`, initialised and
    /// exploring from `seed`.
    pub fn new(
        config: DqnConfig,
        mut env: Box<dyn Env>,
        eval_env: Box<dyn Env>,
        seed: u64,
    ) -> Result<Self, TrainError> {
        let Space::Discrete(actions) = env.action_space() else {
            return Err(TrainError::Invalid("DQN needs discrete actions".into()));
        };
        let (width, discrete_obs) = match env.observation_space() {
            Space::Discrete(n) => (n, Some(n)),
            Space::Box { low, .. } => (low.len(), None),
        };
        if config.batch_size == 0 || config.buffer_size < config.batch_size {
            return Err(TrainError::Invalid(format!(
                "agent.buffer_size = {} must hold at least agent.batch_size = {} (at least 1) transitions",
                config.buffer_size, config.batch_size
            )));
        }
        if config.train_frequency == 0
            || config.target_update_interval == 0
            || config.steps_per_iteration == 0
        {
            return Err(TrainError::Invalid(
                "agent.train_frequency, agent.target_update_interval and agent.steps_per_iteration must be at least 1".into(),
            ));
        }
        let params = Params::new();
        let sizes: Vec<usize> = std::iter::once(width)
            .chain(config.hidden.iter().copied())
            .chain(std::iter::once(actions))
            .collect();
        let relu = trident_nn::custom::activation_by_name("relu").map_err(TrainError::Invalid)?;
        let online = Mlp::new(&params.builder(seed, None).pp("q"), &sizes, relu.clone(), 0.0)?;
        let target = Mlp::new(&params.builder(seed, None).pp("target"), &sizes, relu, 0.0)?;
        params.set_trainable("target.", false);
        let (obs, _) = env.reset(Some(seed));
        let mut agent = Dqn {
            gifs: None,
            progress: Progress {
                steps: 0,
                updates: 0,
                obs: Vec::new(),
                episode_return: 0.0,
                episode_length: 0,
                episodes: Episodes::default(),
                explore: NpRandom::from_seed(seed ^ 0x0d09_0a11),
                replay: Replay::new(width, config.buffer_size),
            },
            config,
            env,
            eval_env: Some(eval_env),
            width,
            discrete_obs,
            actions,
            params,
            online,
            target,
            total_steps: std::cell::Cell::new(0),
            seed,
        };
        agent.progress.obs = agent.encode(&obs);
        agent.sync_target()?;
        Ok(agent)
    }

    fn encode(&self, obs: &Obs) -> Vec<f32> {
        encode(obs, self.discrete_obs)
    }

    /// The target network becomes a copy of the online one.
    fn sync_target(&self) -> Result<(), TrainError> {
        for p in self.params.all() {
            if let Some(rest) = p.name.strip_prefix("q.") {
                let t = self.params.get(&format!("target.{rest}")).expect("same layout");
                t.var.set(&p.var.as_tensor().copy()?)?;
            }
        }
        Ok(())
    }

    /// Action values of `rows` observations (`[rows, width]`) by the online network.
    fn values(&self, obs: &[f32], rows: usize, ctx: &Ctx) -> Result<Tensor, TrainError> {
        let x = Tensor::from_slice(obs, (rows, self.width), &Device::Cpu)?;
        Ok(self.online.forward(&x, ctx)?)
    }

    /// The greedy action for one encoded observation.
    fn greedy(&self, obs: &[f32]) -> Result<usize, TrainError> {
        let q = self
            .values(obs, 1, &Ctx::eval())?
            .flatten_all()?
            .to_vec1::<f32>()?;
        Ok(argmax(&q))
    }

    /// One gradient step on a sampled minibatch; returns its loss.
    fn learn(&mut self, cx: &mut BatchContext<'_, '_>) -> Result<f64, TrainError> {
        let c = &self.config;
        let (b, w) = (c.batch_size, self.width);
        let r = &self.progress.replay;
        let mut obs = Vec::with_capacity(b * w);
        let mut next = Vec::with_capacity(b * w);
        let (mut acts, mut rew, mut term) = (
            Vec::with_capacity(b),
            Vec::with_capacity(b),
            Vec::with_capacity(b),
        );
        for _ in 0..b {
            let i = ((self.progress.explore.random() * r.len as f64) as usize).min(r.len - 1);
            obs.extend_from_slice(&r.obs[i * w..(i + 1) * w]);
            next.extend_from_slice(&r.next_obs[i * w..(i + 1) * w]);
            acts.push(r.actions[i]);
            rew.push(r.rewards[i]);
            term.push(r.terminal[i]);
        }
        let dev = &Device::Cpu;
        let next_x = Tensor::from_slice(&next, (b, w), dev)?;
        let eval = Ctx::eval();
        let next_target = self.target.forward(&next_x, &eval)?.detach();
        let next_value = if c.double {
            let pick = self.online.forward(&next_x, &eval)?.detach().argmax_keepdim(1)?;
            next_target.gather(&pick, 1)?.squeeze(1)?
        } else {
            next_target.max(1)?
        };
        let rew = Tensor::from_slice(&rew, b, dev)?;
        let not_done = Tensor::from_slice(&term, b, dev)?.affine(-1.0, 1.0)?;
        let target = (rew + (next_value * not_done)?.affine(c.gamma, 0.0)?)?.detach();
        let ctx = Ctx::train(self.seed, self.progress.updates);
        self.params.begin_step();
        let q = self.values(&obs, b, &ctx)?;
        let acts = Tensor::from_slice(&acts, (b, 1), dev)?;
        let chosen = q.gather(&acts, 1)?.squeeze(1)?;
        let diff = (chosen - target)?;
        let loss = if c.huber {
            let a = diff.abs()?;
            let quad = a.clamp(0.0, 1.0)?;
            ((quad.sqr()? * 0.5)? + (a - quad)?)?.mean_all()?
        } else {
            diff.sqr()?.mean_all()?
        };
        let value = f64::from(loss.to_scalar::<f32>()?);
        let grads = loss.backward()?;
        cx.updaters[0].gather(&self.params, &grads)?;
        drop(grads);
        cx.updaters[0].update(None, self.progress.updates)?;
        self.progress.updates += 1;
        Ok(value)
    }

    /// Greedy episodes on the evaluation copy.
    pub fn evaluate(&mut self, frames: Option<&mut Vec<Obs>>) -> Result<Episodes, TrainError> {
        let (episodes, seed) = (self.config.eval_episodes, self.config.eval_seed);
        let mut env = self.eval_env.take().expect("the evaluation copy");
        let out = evaluate_with(
            env.as_mut(),
            episodes,
            seed,
            |o| self.greedy(&self.encode(o)),
            frames,
        );
        self.eval_env = Some(env);
        out
    }
}

impl Task for Dqn {
    type Batch = u64;

    fn params(&self) -> &Params {
        &self.params
    }

    fn metrics(&self) -> Vec<MetricDef> {
        return_metrics()
    }

    fn updaters(&self, plan: &Plan<'_>) -> Result<Vec<Updater>, TrainError> {
        if plan.dp.is_some() {
            return Err(TrainError::Invalid("DQN trains in one process".into()));
        }
        let steps = plan.batches() * self.config.steps_per_iteration;
        self.total_steps.set(steps);
        let c = &self.config;
        let updates = steps.saturating_sub(c.learning_starts) / c.train_frequency * c.gradient_steps;
        Ok(vec![Updater::new(
            &self.params,
            plan.config,
            updates.max(1),
            None,
            plan.progress,
        )?])
    }

    /// Adam counts gradient steps, not the loop's iterations: its bias correction resumes
    /// from the agent's count.
    fn opened(&mut self, _state: &trident_train::checkpoint::TrainerState, updaters: &mut [Updater]) {
        updaters[0].optimizer_mut().steps = self.progress.updates;
    }

    fn unit(&self) -> &'static str {
        "env steps"
    }

    fn batch(
        &mut self,
        _iteration: &u64,
        mut cx: BatchContext<'_, '_>,
    ) -> Result<Option<StepDone>, TrainError> {
        let total = self.total_steps.get().max(1);
        let (mut loss_sum, mut losses) = (0.0, 0u64);
        for _ in 0..self.config.steps_per_iteration {
            let epsilon = self.config.epsilon.at(self.progress.steps, total);
            let action = if self.progress.explore.random() < epsilon {
                ((self.progress.explore.random() * self.actions as f64) as usize).min(self.actions - 1)
            } else {
                self.greedy(&self.progress.obs)?
            };
            let step = self.env.step(action);
            let next = self.encode(&step.obs);
            let obs = std::mem::take(&mut self.progress.obs);
            self.progress
                .replay
                .push(&obs, action, step.reward, &next, step.terminated);
            self.progress.steps += 1;
            self.progress.episode_return += step.reward;
            self.progress.episode_length += 1;
            if step.terminated || step.truncated {
                let p = &mut self.progress;
                p.episodes.returns.push(p.episode_return);
                p.episodes.lengths.push(p.episode_length);
                p.episode_return = 0.0;
                p.episode_length = 0;
                let (o, _) = self.env.reset(None);
                self.progress.obs = self.encode(&o);
            } else {
                self.progress.obs = next;
            }
            let s = self.progress.steps;
            if s > self.config.learning_starts && s.is_multiple_of(self.config.train_frequency) {
                for _ in 0..self.config.gradient_steps {
                    loss_sum += self.learn(&mut cx)?;
                    losses += 1;
                }
            }
            if s.is_multiple_of(self.config.target_update_interval) {
                self.sync_target()?;
            }
        }
        let loss = if losses > 0 { loss_sum / losses as f64 } else { 0.0 };
        cx.sums.loss += loss;
        cx.sums.batches += 1;
        cx.sums.units += self.config.steps_per_iteration;
        let lr = cx.updaters[0].lr(self.progress.updates);
        Ok(Some(StepDone {
            loss,
            lr,
            grad_norm: cx.updaters[0].grad_norm(),
            stop: cx.stop_asked(),
        }))
    }

    fn end_epoch(&mut self, cx: EpochContext<'_>) -> Result<Metrics, TrainError> {
        let done = std::mem::take(&mut self.progress.episodes);
        let gifs = self.gifs.clone();
        let eval = evaluated(&gifs, cx.epoch, |frames| self.evaluate(frames))?;
        let mut m = epoch_figures(&done, &eval);
        let epsilon = self
            .config
            .epsilon
            .at(self.progress.steps, self.total_steps.get().max(1));
        m.insert("epsilon".into(), epsilon);
        Ok(m)
    }

    fn save_state(&mut self) -> Result<Vec<(String, Vec<u8>)>, TrainError> {
        state_files(&self.progress, &[(ENV.into(), self.env.as_ref())])
    }

    fn load_state(&mut self, dir: &Path) -> Result<(), TrainError> {
        self.progress = read_progress(dir)?;
        restore_env(self.env.as_mut(), dir, ENV)
    }
}
