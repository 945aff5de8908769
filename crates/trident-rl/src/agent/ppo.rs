//! Proximal policy optimisation with CleanRL's details (`ppo.py`): `num_envs` copies
//! stepped `num_steps` times per iteration (a copy whose episode ends is reset at once),
//! generalised advantage estimation, `update_epochs` passes of shuffled minibatches with the
//! clipped surrogate objective, clipped value loss and an entropy bonus, advantages
//! normalised per minibatch, separate actor and critic MLPs (tanh) with orthogonal
//! initialisation (gains √2, 0.01 for the policy head, 1 for the value head), Adam with
//! ε = 1e-5, global gradient clipping and a learning rate annealed linearly to 0.

use super::{
    argmax, encode, epoch_figures, evaluate_with, evaluated, read_progress, restore_env, return_metrics,
    sample, state_files, Episodes,
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

/// A PPO agent's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PpoConfig {
    /// Hidden widths of the actor and the critic.
    pub hidden: Vec<usize>,
    /// Environment copies.
    pub num_envs: usize,
    /// Steps of each copy per iteration.
    pub num_steps: usize,
    /// Discount γ.
    pub gamma: f64,
    /// GAE's λ.
    pub gae_lambda: f64,
    /// Minibatches per pass.
    pub num_minibatches: usize,
    /// Passes over each iteration's samples.
    pub update_epochs: usize,
    /// The surrogate's (and the value's) clipping range.
    pub clip_coef: f64,
    /// Clip the value loss as the policy's.
    pub clip_vloss: bool,
    /// Normalise advantages per minibatch.
    pub norm_adv: bool,
    /// Entropy bonus weight.
    pub ent_coef: f64,
    /// Value loss weight.
    pub vf_coef: f64,
    /// Greedy episodes evaluated at each epoch's end.
    pub eval_episodes: u64,
    /// Their first seed.
    pub eval_seed: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Progress {
    steps: u64,
    updates: u64,
    iterations: u64,
    /// Each copy's current observation, and whether its last step ended an episode.
    #[serde(with = "crate::exact::vec_f32")]
    obs: Vec<f32>,
    done: Vec<bool>,
    #[serde(with = "crate::exact::vec_f64")]
    running_return: Vec<f64>,
    running_length: Vec<u64>,
    episodes: Episodes,
    rng: NpRandom,
}

/// A PPO agent on the training loop.
pub struct Ppo {
    /// Draws each epoch's first greedy episode, when set.
    pub gifs: Option<super::EpisodeGifs>,
    config: PpoConfig,
    envs: Vec<Box<dyn Env>>,
    eval_env: Option<Box<dyn Env>>,
    width: usize,
    discrete_obs: Option<usize>,
    actions: usize,
    params: Params,
    actor: Mlp,
    critic: Mlp,
    progress: Progress,
    seed: u64,
}

/// What each iteration's update reports, averaged over the epoch.
const DIAGNOSTICS: [&str; 6] = [
    "policy_loss",
    "value_loss",
    "entropy",
    "approx_kl",
    "clip_fraction",
    "explained_variance",
];

/// The file of copy `i`'s snapshot in a checkpoint.
fn env_file(i: usize) -> String {
    format!("env-{i}.json")
}

/// An orthogonal `[rows, cols]` matrix times `gain` (the first `min(rows, cols)` orthonormal
/// rows or columns of a Gaussian matrix, by Gram–Schmidt), PyTorch's `orthogonal_`.
fn orthogonal(rows: usize, cols: usize, gain: f64, rng: &mut NpRandom) -> Vec<f32> {
    let (n, m) = if rows >= cols { (rows, cols) } else { (cols, rows) };
    // m orthonormal vectors of length n.
    let mut q: Vec<Vec<f64>> = Vec::with_capacity(m);
    while q.len() < m {
        let mut v: Vec<f64> = (0..n)
            .map(|_| {
                let (u1, u2) = (rng.random().max(1e-300), rng.random());
                (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
            })
            .collect();
        for b in &q {
            let dot: f64 = v.iter().zip(b).map(|(x, y)| x * y).sum();
            v.iter_mut().zip(b).for_each(|(x, y)| *x -= dot * y);
        }
        let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        if norm > 1e-8 {
            q.push(v.into_iter().map(|x| x / norm).collect());
        }
    }
    let mut out = vec![0f32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            let v = if rows >= cols { q[c][r] } else { q[r][c] };
            out[r * cols + c] = (gain * v) as f32;
        }
    }
    out
}

impl Ppo {
    /// An agent on `envs` (copies of one environment with discrete actions), evaluated on
    /// `eval_env`, from `seed` (copy `i` first reset with `seed + i`).
    pub fn new(
        config: PpoConfig,
        mut envs: Vec<Box<dyn Env>>,
        eval_env: Box<dyn Env>,
        seed: u64,
    ) -> Result<Self, TrainError> {
        let Space::Discrete(actions) = envs[0].action_space() else {
            return Err(TrainError::Invalid("PPO here needs discrete actions".into()));
        };
        let (width, discrete_obs) = match envs[0].observation_space() {
            Space::Discrete(n) => (n, Some(n)),
            Space::Box { low, .. } => (low.len(), None),
        };
        let batch = config.num_envs * config.num_steps;
        if config.num_minibatches == 0
            || !batch.is_multiple_of(config.num_minibatches)
            || config.update_epochs == 0
        {
            return Err(TrainError::Invalid(format!(
                "agent.num_envs × agent.num_steps = {batch} must split into agent.num_minibatches = {} equal minibatches, and agent.update_epochs be at least 1",
                config.num_minibatches
            )));
        }
        let params = Params::new();
        let tanh = trident_nn::custom::activation_by_name("tanh").map_err(TrainError::Invalid)?;
        let sizes = |out: usize| -> Vec<usize> {
            std::iter::once(width)
                .chain(config.hidden.iter().copied())
                .chain(std::iter::once(out))
                .collect()
        };
        let actor = Mlp::new(
            &params.builder(seed, None).pp("actor"),
            &sizes(actions),
            tanh.clone(),
            0.0,
        )?;
        let critic = Mlp::new(&params.builder(seed, None).pp("critic"), &sizes(1), tanh, 0.0)?;
        let mut rng = NpRandom::from_seed(seed ^ 0x0bb0_1234);
        // Orthogonal weights, zero biases (CleanRL's layer_init).
        let layers = config.hidden.len() + 1;
        for (net, head_gain) in [("actor", 0.01), ("critic", 1.0)] {
            for i in 0..layers {
                let gain = if i + 1 == layers { head_gain } else { 2f64.sqrt() };
                let w = params.get(&format!("{net}.layers.{i}.weight")).expect("built");
                let (rows, cols) = w.var.as_tensor().dims2()?;
                let v = orthogonal(rows, cols, gain, &mut rng);
                w.var.set(&Tensor::from_vec(v, (rows, cols), &Device::Cpu)?)?;
                let b = params.get(&format!("{net}.layers.{i}.bias")).expect("built");
                b.var.set(&b.var.as_tensor().zeros_like()?)?;
            }
        }
        let mut obs = Vec::with_capacity(config.num_envs * width);
        let encode = |o: &Obs| encode(o, discrete_obs);
        for (i, e) in envs.iter_mut().enumerate() {
            obs.extend(encode(&e.reset(Some(seed + i as u64)).0));
        }
        let n = config.num_envs;
        Ok(Ppo {
            gifs: None,
            progress: Progress {
                steps: 0,
                updates: 0,
                iterations: 0,
                obs,
                done: vec![false; n],
                running_return: vec![0.0; n],
                running_length: vec![0; n],
                episodes: Episodes::default(),
                rng,
            },
            config,
            envs,
            eval_env: Some(eval_env),
            width,
            discrete_obs,
            actions,
            params,
            actor,
            critic,
            seed,
        })
    }

    /// Greedy episodes on the evaluation copy (the most probable action).
    pub fn evaluate(&mut self, frames: Option<&mut Vec<Obs>>) -> Result<Episodes, TrainError> {
        let (episodes, seed) = (self.config.eval_episodes, self.config.eval_seed);
        let mut env = self.eval_env.take().expect("the evaluation copy");
        let out = evaluate_with(
            env.as_mut(),
            episodes,
            seed,
            |o| {
                let logits = self.logits(&encode(o, self.discrete_obs), 1)?;
                Ok(argmax(&logits.flatten_all()?.to_vec1::<f32>()?))
            },
            frames,
        );
        self.eval_env = Some(env);
        out
    }

    fn logits(&self, obs: &[f32], rows: usize) -> Result<Tensor, TrainError> {
        let x = Tensor::from_slice(obs, (rows, self.width), &Device::Cpu)?;
        Ok(self.actor.forward(&x, &Ctx::eval())?)
    }

    fn values(&self, obs: &[f32], rows: usize) -> Result<Vec<f32>, TrainError> {
        let x = Tensor::from_slice(obs, (rows, self.width), &Device::Cpu)?;
        Ok(self
            .critic
            .forward(&x, &Ctx::eval())?
            .flatten_all()?
            .to_vec1::<f32>()?)
    }
}

/// Log-probabilities `[rows, actions]` of logits.
fn log_softmax(logits: &Tensor) -> candle_core::Result<Tensor> {
    let max = logits.max_keepdim(1)?.detach();
    let shifted = logits.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(1)?.log()?;
    shifted.broadcast_sub(&lse)
}

/// One iteration's samples.
struct Rollout {
    obs: Vec<f32>,
    actions: Vec<u32>,
    logprobs: Vec<f32>,
    advantages: Vec<f32>,
    returns: Vec<f32>,
    values: Vec<f32>,
}

impl Ppo {
    /// `num_steps` steps of every copy, then GAE.
    fn collect(&mut self) -> Result<Rollout, TrainError> {
        let (n, t_max, w) = (self.config.num_envs, self.config.num_steps, self.width);
        let mut obs = Vec::with_capacity(n * t_max * w);
        let (mut actions, mut logprobs, mut values) = (vec![], vec![], vec![]);
        let (mut rewards, mut dones) = (vec![], vec![]);
        for _ in 0..t_max {
            let logits = self.logits(&self.progress.obs, n)?;
            let logp = log_softmax(&logits)?.to_vec2::<f32>()?;
            let v = self.values(&self.progress.obs, n)?;
            obs.extend_from_slice(&self.progress.obs);
            dones.extend(self.progress.done.iter().map(|&d| f32::from(u8::from(d))));
            values.extend_from_slice(&v);
            for (i, logp_i) in logp.iter().enumerate() {
                let u = self.progress.rng.random() as f32;
                let a = sample(logp_i.iter().map(|lp| lp.exp()), u, self.actions);
                let step = self.envs[i].step(a);
                actions.push(a as u32);
                logprobs.push(logp_i[a]);
                rewards.push(step.reward as f32);
                let p = &mut self.progress;
                p.running_return[i] += step.reward;
                p.running_length[i] += 1;
                let ended = step.terminated || step.truncated;
                let next = if ended {
                    p.episodes.returns.push(p.running_return[i]);
                    p.episodes.lengths.push(p.running_length[i]);
                    p.running_return[i] = 0.0;
                    p.running_length[i] = 0;
                    self.envs[i].reset(None).0
                } else {
                    step.obs
                };
                self.progress.obs[i * w..(i + 1) * w].copy_from_slice(&encode(&next, self.discrete_obs));
                self.progress.done[i] = ended;
            }
        }
        self.progress.steps += (n * t_max) as u64;
        // GAE over the rollout, bootstrapped from the value of the observation after it.
        let next_value = self.values(&self.progress.obs, n)?;
        let (gamma, lambda) = (self.config.gamma as f32, self.config.gae_lambda as f32);
        let mut advantages = vec![0f32; n * t_max];
        let mut last = vec![0f32; n];
        for t in (0..t_max).rev() {
            for i in 0..n {
                let k = t * n + i;
                let (next_non_terminal, next_v) = if t + 1 == t_max {
                    (1.0 - f32::from(u8::from(self.progress.done[i])), next_value[i])
                } else {
                    (1.0 - dones[k + n], values[k + n])
                };
                let delta = rewards[k] + gamma * next_v * next_non_terminal - values[k];
                last[i] = delta + gamma * lambda * next_non_terminal * last[i];
                advantages[k] = last[i];
            }
        }
        let returns = advantages.iter().zip(&values).map(|(a, v)| a + v).collect();
        Ok(Rollout {
            obs,
            actions,
            logprobs,
            advantages,
            returns,
            values,
        })
    }

    /// The clipped-objective updates of one rollout; returns (loss, policy loss, value loss,
    /// entropy, approximate KL, clipped fraction) of the last minibatch, KL and clip
    /// fraction averaged.
    fn update(&mut self, r: &Rollout, cx: &mut BatchContext<'_, '_>) -> Result<[f64; 6], TrainError> {
        let c = self.config.clone();
        let (b, w) = (r.actions.len(), self.width);
        let mb = b / c.num_minibatches;
        let dev = &Device::Cpu;
        let mut order: Vec<usize> = (0..b).collect();
        let (mut kl_sum, mut clip_sum, mut n) = (0f64, 0f64, 0f64);
        let mut out = [0.0; 6];
        for _ in 0..c.update_epochs {
            // Fisher–Yates with the agent's generator.
            for i in (1..b).rev() {
                let j = ((self.progress.rng.random() * (i + 1) as f64) as usize).min(i);
                order.swap(i, j);
            }
            for chunk in order.chunks(mb) {
                let pick = |v: &[f32]| chunk.iter().map(|&i| v[i]).collect::<Vec<f32>>();
                let mut x = Vec::with_capacity(mb * w);
                chunk
                    .iter()
                    .for_each(|&i| x.extend_from_slice(&r.obs[i * w..(i + 1) * w]));
                let x = Tensor::from_slice(&x, (mb, w), dev)?;
                let acts: Vec<u32> = chunk.iter().map(|&i| r.actions[i]).collect();
                let acts = Tensor::from_slice(&acts, (mb, 1), dev)?;
                let old_logp = Tensor::from_slice(&pick(&r.logprobs), mb, dev)?;
                let mut adv = pick(&r.advantages);
                if c.norm_adv && mb > 1 {
                    let mean = adv.iter().sum::<f32>() / mb as f32;
                    let var = adv.iter().map(|a| (a - mean) * (a - mean)).sum::<f32>() / (mb - 1) as f32;
                    let std = var.sqrt() + 1e-8;
                    adv.iter_mut().for_each(|a| *a = (*a - mean) / std);
                }
                let adv = Tensor::from_slice(&adv, mb, dev)?;
                let ret = Tensor::from_slice(&pick(&r.returns), mb, dev)?;
                let old_v = Tensor::from_slice(&pick(&r.values), mb, dev)?;
                let ctx = Ctx::train(self.seed, self.progress.updates);
                self.params.begin_step();
                let logp_all = log_softmax(&self.actor.forward(&x, &ctx)?)?;
                let new_logp = logp_all.gather(&acts, 1)?.squeeze(1)?;
                let entropy = (logp_all.exp()? * &logp_all)?.sum(1)?.neg()?.mean_all()?;
                let logratio = (new_logp - old_logp)?;
                let ratio = logratio.exp()?;
                {
                    let lr: Vec<f32> = logratio.to_vec1()?;
                    let rt: Vec<f32> = ratio.to_vec1()?;
                    let kl: f32 = lr.iter().zip(&rt).map(|(l, r)| (r - 1.0) - l).sum::<f32>() / mb as f32;
                    let clipped = rt
                        .iter()
                        .filter(|r| (**r - 1.0).abs() > c.clip_coef as f32)
                        .count();
                    kl_sum += f64::from(kl);
                    clip_sum += clipped as f64 / mb as f64;
                    n += 1.0;
                }
                let pg1 = (adv.neg()? * &ratio)?;
                let pg2 = (adv.neg()? * ratio.clamp(1.0 - c.clip_coef, 1.0 + c.clip_coef)?)?;
                let pg_loss = pg1.maximum(&pg2)?.mean_all()?;
                let new_v = self.critic.forward(&x, &ctx)?.squeeze(1)?;
                let v_loss = if c.clip_vloss {
                    let unclipped = (&new_v - &ret)?.sqr()?;
                    let clipped_v = (&old_v + (&new_v - &old_v)?.clamp(-c.clip_coef, c.clip_coef)?)?;
                    let clipped = (clipped_v - &ret)?.sqr()?;
                    (unclipped.maximum(&clipped)?.mean_all()? * 0.5)?
                } else {
                    ((new_v - ret)?.sqr()?.mean_all()? * 0.5)?
                };
                let loss = ((&pg_loss - (&entropy * c.ent_coef)?)? + (&v_loss * c.vf_coef)?)?;
                let grads = loss.backward()?;
                cx.updaters[0].gather(&self.params, &grads)?;
                drop(grads);
                // One learning rate per iteration, annealed over the run's iterations.
                cx.updaters[0].update(None, self.progress.iterations)?;
                self.progress.updates += 1;
                out = [
                    f64::from(loss.to_scalar::<f32>()?),
                    f64::from(pg_loss.to_scalar::<f32>()?),
                    f64::from(v_loss.to_scalar::<f32>()?),
                    f64::from(entropy.to_scalar::<f32>()?),
                    0.0,
                    0.0,
                ];
            }
        }
        out[4] = kl_sum / n.max(1.0);
        out[5] = clip_sum / n.max(1.0);
        Ok(out)
    }
}

impl Task for Ppo {
    type Batch = u64;

    fn params(&self) -> &Params {
        &self.params
    }

    fn metrics(&self) -> Vec<MetricDef> {
        return_metrics()
    }

    fn updaters(&self, plan: &Plan<'_>) -> Result<Vec<Updater>, TrainError> {
        if plan.dp.is_some() {
            return Err(TrainError::Invalid("PPO trains in one process".into()));
        }
        // The schedule's steps are iterations (the learning rate anneals per iteration).
        Ok(vec![Updater::new(
            &self.params,
            plan.config,
            plan.batches().max(1),
            None,
            plan.progress,
        )?])
    }

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
        let rollout = self.collect()?;
        let [loss, pg, vl, ent, kl, clip] = self.update(&rollout, &mut cx)?;
        let lr = cx.updaters[0].lr(self.progress.iterations);
        self.progress.iterations += 1;
        // Explained variance of the rollout's values for its returns.
        let n = rollout.returns.len() as f64;
        let mean = rollout.returns.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let var_y = rollout
            .returns
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / n;
        let resid: Vec<f64> = rollout
            .returns
            .iter()
            .zip(&rollout.values)
            .map(|(y, v)| f64::from(y - v))
            .collect();
        let rm = resid.iter().sum::<f64>() / n;
        let var_r = resid.iter().map(|x| (x - rm).powi(2)).sum::<f64>() / n;
        let explained = if var_y == 0.0 {
            f64::NAN
        } else {
            1.0 - var_r / var_y
        };

        cx.sums.loss += loss;
        cx.sums.batches += 1;
        cx.sums.units += rollout.actions.len() as u64;
        for (name, v) in DIAGNOSTICS.iter().zip([pg, vl, ent, kl, clip, explained]) {
            cx.sums.add(name, v);
        }
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
        let batches = cx.state.sums.batches.max(1) as f64;
        for name in DIAGNOSTICS {
            m.insert(name.into(), cx.state.sums.get(name) / batches);
        }
        Ok(m)
    }

    fn save_state(&mut self) -> Result<Vec<(String, Vec<u8>)>, TrainError> {
        let envs: Vec<(String, &dyn Env)> = self
            .envs
            .iter()
            .enumerate()
            .map(|(i, e)| (env_file(i), e.as_ref()))
            .collect();
        state_files(&self.progress, &envs)
    }

    fn load_state(&mut self, dir: &Path) -> Result<(), TrainError> {
        self.progress = read_progress(dir)?;
        for (i, e) in self.envs.iter_mut().enumerate() {
            restore_env(e.as_mut(), dir, &env_file(i))?;
        }
        Ok(())
    }
}
