//! Tabular Q-learning and SARSA on a discrete environment (FrozenLake, Taxi): a table of
//! action values updated after every step with an ε-greedy behaviour policy, the greedy
//! policy evaluated on seeded episodes at every epoch's end.

use super::{
    argmax, epoch_figures, evaluate, evaluated, read_progress, restore_env, return_metrics, state_files,
    Episodes, EpsilonSchedule,
};
use crate::env::{Env, Obs, Space};
use crate::rng::NpRandom;
use serde::{Deserialize, Serialize};
use std::path::Path;
use trident_nn::{Device, Init, Params, Tensor};
use trident_train::trainer::{
    BatchContext, EpochContext, MetricDef, Metrics, Plan, StepDone, Task, TrainError, Updater,
};

/// Which update the table learns by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// Off-policy: the target bootstraps from the best next action.
    QLearning,
    /// On-policy: the target bootstraps from the next action the policy takes.
    Sarsa,
}

/// A tabular agent's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TabularConfig {
    /// The update rule.
    pub method: Method,
    /// The step size α.
    pub alpha: f64,
    /// The discount γ.
    pub gamma: f64,
    /// The exploration schedule.
    pub epsilon: EpsilonSchedule,
    /// Environment steps per iteration (a batch of the loop: its progress and checkpoint
    /// unit).
    pub steps_per_iteration: u64,
    /// Greedy episodes evaluated at each epoch's end.
    pub eval_episodes: u64,
    /// The evaluation episodes' first seed (episode k resets with `eval_seed + k`).
    pub eval_seed: u64,
}

/// What an interrupted run must get back to continue exactly.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Progress {
    /// Environment steps taken.
    steps: u64,
    /// The current state, and for SARSA the action already chosen in it.
    state: usize,
    action: Option<usize>,
    #[serde(with = "crate::exact::f64_bits")]
    episode_return: f64,
    episode_length: u64,
    /// Episodes finished in the current epoch.
    episodes: Episodes,
    explore: NpRandom,
}

/// A tabular agent on the training loop.
pub struct Tabular {
    /// Draws each epoch's first greedy episode, when set.
    pub gifs: Option<super::EpisodeGifs>,
    config: TabularConfig,
    env: Box<dyn Env>,
    eval_env: Box<dyn Env>,
    states: usize,
    actions: usize,
    /// The action values, row per state (the `q_table` buffer holds them in checkpoints).
    q: Vec<f32>,
    params: Params,
    progress: Progress,
    /// The run's environment steps (its epochs × iterations × steps per iteration), which
    /// ε's schedule spans; known once the loop plans the run.
    total_steps: std::cell::Cell<u64>,
}

/// The file of its environment's snapshot.
const ENV: &str = "env.json";

impl Tabular {
    /// An agent for `env` (discrete observations and actions), its evaluation on
    /// `eval_env` (another copy), its exploration seeded by `seed`.
    pub fn new(
        config: TabularConfig,
        mut env: Box<dyn Env>,
        eval_env: Box<dyn Env>,
        seed: u64,
    ) -> Result<Self, TrainError> {
        let (Space::Discrete(states), Space::Discrete(actions)) =
            (env.observation_space(), env.action_space())
        else {
            return Err(TrainError::Invalid(
                "a tabular agent needs discrete observations and actions (FrozenLake, Taxi)".into(),
            ));
        };
        if !(config.alpha > 0.0 && config.alpha <= 1.0 && (0.0..=1.0).contains(&config.gamma)) {
            return Err(TrainError::Invalid(format!(
                "agent.alpha = {} must be in (0, 1] and agent.gamma = {} in [0, 1]",
                config.alpha, config.gamma
            )));
        }
        if config.steps_per_iteration == 0 {
            return Err(TrainError::Invalid(
                "agent.steps_per_iteration must be at least 1".into(),
            ));
        }
        let params = Params::new();
        params
            .builder(seed, None)
            .buffer((states, actions), "q_table", Init::Zeros)?;
        let (obs, _) = env.reset(Some(seed));
        let state = obs.index().expect("discrete");
        let mut explore = NpRandom::from_seed(seed ^ 0x5eed_ab1e);
        let q = vec![0.0; states * actions];
        // SARSA chooses its first action before its first step.
        let action = (config.method == Method::Sarsa).then(|| {
            behave(
                &q[state * actions..(state + 1) * actions],
                config.epsilon.start,
                &mut explore,
            )
        });
        Ok(Tabular {
            gifs: None,
            q,
            config,
            env,
            eval_env,
            states,
            actions,
            params,
            progress: Progress {
                steps: 0,
                state,
                action,
                episode_return: 0.0,
                episode_length: 0,
                episodes: Episodes::default(),
                explore,
            },
            total_steps: std::cell::Cell::new(0),
        })
    }

    /// The action values of `state`.
    pub fn values(&self, state: usize) -> &[f32] {
        &self.q[state * self.actions..(state + 1) * self.actions]
    }

    /// The greedy action in `state` (the first of equal values).
    pub fn greedy(&self, state: usize) -> usize {
        argmax(self.values(state))
    }

    /// The table from its `q_table` buffer (after a checkpoint's weights are loaded).
    pub fn reload(&mut self) -> Result<(), TrainError> {
        let q = self.params.get("q_table").expect("registered");
        self.q = q.var.as_tensor().flatten_all()?.to_vec1::<f32>()?;
        Ok(())
    }

    /// The table into its `q_table` buffer (before a checkpoint).
    fn store(&self) -> Result<(), TrainError> {
        let p = self.params.get("q_table").expect("registered");
        p.var.set(&Tensor::from_vec(
            self.q.clone(),
            (self.states, self.actions),
            &Device::Cpu,
        )?)?;
        Ok(())
    }

    /// Greedy episodes on the evaluation copy.
    pub fn evaluate(&mut self, frames: Option<&mut Vec<Obs>>) -> Episodes {
        let (episodes, seed) = (self.config.eval_episodes, self.config.eval_seed);
        let (q, actions) = (&self.q, self.actions);
        evaluate(
            self.eval_env.as_mut(),
            episodes,
            seed,
            |o| argmax(&q[o.index().expect("discrete") * actions..][..actions]),
            frames,
        )
    }
}

/// ε-greedy on one state's action values: a uniformly random action with probability ε,
/// else the greedy one.
fn behave(values: &[f32], epsilon: f64, rng: &mut NpRandom) -> usize {
    if rng.random() < epsilon {
        ((rng.random() * values.len() as f64) as usize).min(values.len() - 1)
    } else {
        argmax(values)
    }
}

impl Task for Tabular {
    type Batch = u64;

    fn params(&self) -> &Params {
        &self.params
    }

    fn metrics(&self) -> Vec<MetricDef> {
        return_metrics()
    }

    fn updaters(&self, plan: &Plan<'_>) -> Result<Vec<Updater>, TrainError> {
        if plan.dp.is_some() {
            return Err(TrainError::Invalid(
                "a tabular agent trains in one process".into(),
            ));
        }
        self.total_steps
            .set(plan.batches() * self.config.steps_per_iteration);
        Ok(Vec::new())
    }

    fn unit(&self) -> &'static str {
        "env steps"
    }

    fn batch(&mut self, _iteration: &u64, cx: BatchContext<'_, '_>) -> Result<Option<StepDone>, TrainError> {
        let total = self.total_steps.get().max(1);
        let (c, actions) = (self.config.clone(), self.actions);
        let row = |s: usize| s * actions..(s + 1) * actions;
        let p = &mut self.progress;
        let mut td_sum = 0.0;
        for _ in 0..c.steps_per_iteration {
            let s = p.state;
            let a = match p.action {
                Some(a) => a,
                None => behave(&self.q[row(s)], c.epsilon.at(p.steps, total), &mut p.explore),
            };
            let step = self.env.step(a);
            let next = step.obs.index().expect("discrete");
            p.steps += 1;
            p.episode_return += step.reward;
            p.episode_length += 1;
            let next_action = match c.method {
                Method::Sarsa => Some(behave(
                    &self.q[row(next)],
                    c.epsilon.at(p.steps, total),
                    &mut p.explore,
                )),
                Method::QLearning => None,
            };
            let bootstrap = if step.terminated {
                0.0
            } else {
                let v = &self.q[row(next)];
                match next_action {
                    Some(b) => f64::from(v[b]),
                    None => f64::from(v.iter().copied().fold(f32::NEG_INFINITY, f32::max)),
                }
            };
            let i = s * actions + a;
            let td = step.reward + c.gamma * bootstrap - f64::from(self.q[i]);
            self.q[i] = (f64::from(self.q[i]) + c.alpha * td) as f32;
            td_sum += td.abs();
            if step.terminated || step.truncated {
                p.episodes.returns.push(p.episode_return);
                p.episodes.lengths.push(p.episode_length);
                p.episode_return = 0.0;
                p.episode_length = 0;
                let (obs, _) = self.env.reset(None);
                p.state = obs.index().expect("discrete");
                p.action = match c.method {
                    Method::Sarsa => Some(behave(
                        &self.q[row(p.state)],
                        c.epsilon.at(p.steps, total),
                        &mut p.explore,
                    )),
                    Method::QLearning => None,
                };
            } else {
                p.state = next;
                p.action = next_action;
            }
        }
        let loss = td_sum / c.steps_per_iteration as f64;
        cx.sums.loss += loss;
        cx.sums.batches += 1;
        cx.sums.units += c.steps_per_iteration;
        Ok(Some(StepDone {
            loss,
            lr: c.alpha,
            grad_norm: None,
            stop: cx.stop_asked(),
        }))
    }

    fn end_epoch(&mut self, cx: EpochContext<'_>) -> Result<Metrics, TrainError> {
        let done = std::mem::take(&mut self.progress.episodes);
        let gifs = self.gifs.clone();
        let eval = evaluated(&gifs, cx.epoch, |frames| Ok(self.evaluate(frames)))?;
        let mut m = epoch_figures(&done, &eval);
        let epsilon = self
            .config
            .epsilon
            .at(self.progress.steps, self.total_steps.get().max(1));
        m.insert("epsilon".into(), epsilon);
        Ok(m)
    }

    fn save_state(&mut self) -> Result<Vec<(String, Vec<u8>)>, TrainError> {
        self.store()?;
        state_files(&self.progress, &[(ENV.into(), self.env.as_ref())])
    }

    fn load_state(&mut self, dir: &Path) -> Result<(), TrainError> {
        self.reload()?;
        self.progress = read_progress(dir)?;
        restore_env(self.env.as_mut(), dir, ENV)
    }
}
