//! REINFORCE with a learned baseline (Williams 1992; Sutton & Barto 2018, §13.4): a softmax
//! policy MLP and a state-value MLP, trained after every `episodes_per_iteration` complete
//! episodes on the discounted returns — the policy on `−log π(a|s) · (G − V(s))`, the value
//! on `½ (V(s) − G)²` — in one Adam step with global gradient clipping.

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

/// A REINFORCE agent's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReinforceConfig {
    /// Hidden widths of the policy and value networks (tanh between layers).
    pub hidden: Vec<usize>,
    /// Discount γ.
    pub gamma: f64,
    /// Complete episodes per update.
    pub episodes_per_iteration: u64,
    /// Weight of the value loss.
    pub value_coef: f64,
    /// Advantages scaled to zero mean and unit deviation within each update.
    pub normalize_advantages: bool,
    /// Greedy episodes evaluated at each epoch's end.
    pub eval_episodes: u64,
    /// Their first seed.
    pub eval_seed: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Progress {
    steps: u64,
    updates: u64,
    #[serde(with = "crate::exact::vec_f32")]
    obs: Vec<f32>,
    episodes: Episodes,
    explore: NpRandom,
}

/// A REINFORCE agent on the training loop.
pub struct Reinforce {
    /// Draws each epoch's first greedy episode, when set.
    pub gifs: Option<super::EpisodeGifs>,
    config: ReinforceConfig,
    env: Box<dyn Env>,
    eval_env: Option<Box<dyn Env>>,
    width: usize,
    discrete_obs: Option<usize>,
    actions: usize,
    params: Params,
    policy: Mlp,
    value: Mlp,
    progress: Progress,
    seed: u64,
}

/// The file of the environment's snapshot in a checkpoint.
const ENV: &str = "env.json";

impl Reinforce {
    /// An agent for `env` (discrete actions), evaluated on `eval_env`, from `seed`.
    pub fn new(
        config: ReinforceConfig,
        mut env: Box<dyn Env>,
        eval_env: Box<dyn Env>,
        seed: u64,
    ) -> Result<Self, TrainError> {
        let Space::Discrete(actions) = env.action_space() else {
            return Err(TrainError::Invalid(
                "REINFORCE here needs discrete actions".into(),
            ));
        };
        let (width, discrete_obs) = match env.observation_space() {
            Space::Discrete(n) => (n, Some(n)),
            Space::Box { low, .. } => (low.len(), None),
        };
        if config.episodes_per_iteration == 0 {
            return Err(TrainError::Invalid(
                "agent.episodes_per_iteration must be at least 1".into(),
            ));
        }
        let params = Params::new();
        let tanh = trident_nn::custom::activation_by_name("tanh").map_err(TrainError::Invalid)?;
        let sizes = |out: usize| -> Vec<usize> {
            std::iter::once(width)
                .chain(config.hidden.iter().copied())
                .chain(std::iter::once(out))
                .collect()
        };
        let policy = Mlp::new(
            &params.builder(seed, None).pp("policy"),
            &sizes(actions),
            tanh.clone(),
            0.0,
        )?;
        let value = Mlp::new(
            &params.builder(seed ^ 0x7a1e, None).pp("value"),
            &sizes(1),
            tanh,
            0.0,
        )?;
        let (obs, _) = env.reset(Some(seed));
        let mut agent = Reinforce {
            gifs: None,
            progress: Progress {
                steps: 0,
                updates: 0,
                obs: Vec::new(),
                episodes: Episodes::default(),
                explore: NpRandom::from_seed(seed ^ 0x9e1f_0ace),
            },
            config,
            env,
            eval_env: Some(eval_env),
            width,
            discrete_obs,
            actions,
            params,
            policy,
            value,
            seed,
        };
        agent.progress.obs = agent.encode(&obs);
        Ok(agent)
    }

    fn encode(&self, obs: &Obs) -> Vec<f32> {
        encode(obs, self.discrete_obs)
    }

    /// The policy's action probabilities for one encoded observation.
    fn probabilities(&self, obs: &[f32]) -> Result<Vec<f32>, TrainError> {
        let x = Tensor::from_slice(obs, (1, self.width), &Device::Cpu)?;
        let logits = self
            .policy
            .forward(&x, &Ctx::eval())?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = logits.iter().map(|l| (l - m).exp()).collect();
        let s: f32 = e.iter().sum();
        Ok(e.into_iter().map(|v| v / s).collect())
    }

    /// Greedy episodes on the evaluation copy (the most probable action).
    pub fn evaluate(&mut self, frames: Option<&mut Vec<Obs>>) -> Result<Episodes, TrainError> {
        let (episodes, seed) = (self.config.eval_episodes, self.config.eval_seed);
        let mut env = self.eval_env.take().expect("the evaluation copy");
        let out = evaluate_with(
            env.as_mut(),
            episodes,
            seed,
            |o| Ok(argmax(&self.probabilities(&self.encode(o))?)),
            frames,
        );
        self.eval_env = Some(env);
        out
    }

    /// One update on the collected steps; returns its loss.
    fn learn(
        &mut self,
        obs: &[f32],
        actions: &[u32],
        returns: &[f32],
        cx: &mut BatchContext<'_, '_>,
    ) -> Result<f64, TrainError> {
        let n = actions.len();
        let dev = &Device::Cpu;
        let ctx = Ctx::train(self.seed, self.progress.updates);
        self.params.begin_step();
        let x = Tensor::from_slice(obs, (n, self.width), dev)?;
        let g = Tensor::from_slice(returns, n, dev)?;
        let v = self.value.forward(&x, &ctx)?.squeeze(1)?;
        let mut adv: Vec<f32> = returns
            .iter()
            .zip(v.to_vec1::<f32>()?)
            .map(|(g, v)| g - v)
            .collect();
        if self.config.normalize_advantages && n > 1 {
            let mean = adv.iter().sum::<f32>() / n as f32;
            let var = adv.iter().map(|a| (a - mean) * (a - mean)).sum::<f32>() / n as f32;
            let std = var.sqrt() + 1e-8;
            adv.iter_mut().for_each(|a| *a = (*a - mean) / std);
        }
        let adv = Tensor::from_slice(&adv, n, dev)?;
        let logits = self.policy.forward(&x, &ctx)?;
        let max = logits.max_keepdim(1)?.detach();
        let shifted = logits.broadcast_sub(&max)?;
        let lse = shifted.exp()?.sum_keepdim(1)?.log()?;
        let logp = shifted.broadcast_sub(&lse)?;
        let a = Tensor::from_slice(actions, (n, 1), dev)?;
        let chosen = logp.gather(&a, 1)?.squeeze(1)?;
        let policy_loss = (chosen * adv)?.mean_all()?.neg()?;
        let value_loss = ((v - g)?.sqr()?.mean_all()? * (0.5 * self.config.value_coef))?;
        let loss = (policy_loss + value_loss)?;
        let out = f64::from(loss.to_scalar::<f32>()?);
        let grads = loss.backward()?;
        cx.updaters[0].gather(&self.params, &grads)?;
        drop(grads);
        cx.updaters[0].update(None, self.progress.updates)?;
        self.progress.updates += 1;
        Ok(out)
    }
}

impl Task for Reinforce {
    type Batch = u64;

    fn params(&self) -> &Params {
        &self.params
    }

    fn metrics(&self) -> Vec<MetricDef> {
        return_metrics()
    }

    fn updaters(&self, plan: &Plan<'_>) -> Result<Vec<Updater>, TrainError> {
        if plan.dp.is_some() {
            return Err(TrainError::Invalid("REINFORCE trains in one process".into()));
        }
        Ok(vec![Updater::new(
            &self.params,
            plan.config,
            plan.batches().max(1),
            None,
            plan.progress,
        )?])
    }

    /// Adam resumes from the agent's own count of updates.
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
        let (mut obs, mut actions, mut returns) = (Vec::new(), Vec::new(), Vec::new());
        let mut steps = 0u64;
        for _ in 0..self.config.episodes_per_iteration {
            let mut rewards = Vec::new();
            let (mut ret, mut len) = (0.0, 0u64);
            loop {
                let p = self.probabilities(&self.progress.obs)?;
                let a = sample(p, self.progress.explore.random() as f32, self.actions);
                let step = self.env.step(a);
                obs.extend_from_slice(&self.progress.obs);
                actions.push(a as u32);
                rewards.push(step.reward);
                ret += step.reward;
                len += 1;
                steps += 1;
                if step.terminated || step.truncated {
                    let (o, _) = self.env.reset(None);
                    self.progress.obs = self.encode(&o);
                    break;
                }
                self.progress.obs = self.encode(&step.obs);
            }
            let mut g = 0.0;
            let mut episode_returns = vec![0.0f32; rewards.len()];
            for (t, r) in rewards.iter().enumerate().rev() {
                g = r + self.config.gamma * g;
                episode_returns[t] = g as f32;
            }
            returns.extend(episode_returns);
            self.progress.episodes.returns.push(ret);
            self.progress.episodes.lengths.push(len);
        }
        self.progress.steps += steps;
        let loss = self.learn(&obs, &actions, &returns, &mut cx)?;
        cx.sums.loss += loss;
        cx.sums.batches += 1;
        cx.sums.units += steps;
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
        Ok(epoch_figures(&done, &eval))
    }

    fn save_state(&mut self) -> Result<Vec<(String, Vec<u8>)>, TrainError> {
        state_files(&self.progress, &[(ENV.into(), self.env.as_ref())])
    }

    fn load_state(&mut self, dir: &Path) -> Result<(), TrainError> {
        self.progress = read_progress(dir)?;
        restore_env(self.env.as_mut(), dir, ENV)
    }
}
