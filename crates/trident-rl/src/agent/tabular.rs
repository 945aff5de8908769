//! Tabular Q-learning and SARSA on a discrete environment (FrozenLake, Taxi): a table of
//! action values updated after every step with an ε-greedy behaviour policy, the greedy
//! policy evaluated on seeded episodes at every epoch's end.

use super::{evaluate, Episodes, EpsilonSchedule};
use crate::env::{Env, Obs, Space};
use crate::rng::NpRandom;
use serde::{Deserialize, Serialize};
use std::path::Path;
use trident_nn::{Device, Init, Params, Tensor};
use trident_train::trainer::{
    BatchContext, EpochContext, Goal, MetricDef, Metrics, Plan, StepDone, Task, TrainError, Updater,
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

/// The file of an agent's progress in a checkpoint.
const PROGRESS: &str = "agent.json";
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
        let mut agent = Tabular {
            gifs: None,
            q: vec![0.0; states * actions],
            config,
            env,
            eval_env,
            states,
            actions,
            params,
            progress: Progress {
                steps: 0,
                state,
                action: None,
                episode_return: 0.0,
                episode_length: 0,
                episodes: Episodes::default(),
                explore: explore.clone(),
            },
            total_steps: std::cell::Cell::new(0),
        };
        if agent.config.method == Method::Sarsa {
            let a = agent.behave(state, agent.config.epsilon.start, &mut explore);
            agent.progress.action = Some(a);
        }
        agent.progress.explore = explore;
        Ok(agent)
    }

    /// The action values of `state`.
    pub fn values(&self, state: usize) -> &[f32] {
        &self.q[state * self.actions..(state + 1) * self.actions]
    }

    /// The greedy action in `state` (the first of equal values).
    pub fn greedy(&self, state: usize) -> usize {
        argmax(self.values(state))
    }

    /// ε-greedy: a uniformly random action with probability ε, else the greedy one.
    fn behave(&self, state: usize, epsilon: f64, rng: &mut NpRandom) -> usize {
        if rng.random() < epsilon {
            ((rng.random() * self.actions as f64) as usize).min(self.actions - 1)
        } else {
            self.greedy(state)
        }
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
        let q = &self.q;
        let actions = self.actions;
        evaluate(
            self.eval_env.as_mut(),
            episodes,
            seed,
            |o| argmax(&q[o.index().expect("discrete") * actions..][..actions]),
            frames,
        )
    }
}

fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

impl Task for Tabular {
    type Batch = u64;

    fn params(&self) -> &Params {
        &self.params
    }

    fn metrics(&self) -> Vec<MetricDef> {
        vec![
            MetricDef {
                name: "eval_return",
                goal: Goal::Maximize,
            },
            MetricDef {
                name: "episodic_return",
                goal: Goal::Maximize,
            },
        ]
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
        let c = self.config.clone();
        let mut p = std::mem::replace(
            &mut self.progress,
            Progress {
                steps: 0,
                state: 0,
                action: None,
                episode_return: 0.0,
                episode_length: 0,
                episodes: Episodes::default(),
                explore: NpRandom::from_seed(0),
            },
        );
        let mut td_sum = 0.0;
        for _ in 0..c.steps_per_iteration {
            let epsilon = c.epsilon.at(p.steps, total);
            let s = p.state;
            let a = match p.action {
                Some(a) => a,
                None => self.behave(s, epsilon, &mut p.explore),
            };
            let step = self.env.step(a);
            let next = step.obs.index().expect("discrete");
            p.steps += 1;
            p.episode_return += step.reward;
            p.episode_length += 1;
            let next_action = match c.method {
                Method::Sarsa => Some(self.behave(next, c.epsilon.at(p.steps, total), &mut p.explore)),
                Method::QLearning => None,
            };
            let bootstrap = if step.terminated {
                0.0
            } else {
                let v = self.values(next);
                match next_action {
                    Some(b) => f64::from(v[b]),
                    None => f64::from(v.iter().copied().fold(f32::NEG_INFINITY, f32::max)),
                }
            };
            let i = s * self.actions + a;
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
                    Method::Sarsa => Some(self.behave(p.state, c.epsilon.at(p.steps, total), &mut p.explore)),
                    Method::QLearning => None,
                };
            } else {
                p.state = next;
                p.action = next_action;
            }
        }
        self.progress = p;
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
        let mut m = Metrics::new();
        let done = std::mem::take(&mut self.progress.episodes);
        let (mean, _) = done.return_stats();
        m.insert("episodic_return".into(), mean);
        m.insert("episodic_length".into(), done.mean_length());
        m.insert("episodes".into(), done.returns.len() as f64);
        m.insert(
            "epsilon".into(),
            self.config
                .epsilon
                .at(self.progress.steps, self.total_steps.get().max(1)),
        );
        let mut frames = Vec::new();
        let eval = self.evaluate(self.gifs.is_some().then_some(&mut frames));
        if let Some(g) = &self.gifs {
            g.write(cx.epoch, &frames)?;
        }
        let (mean, std) = eval.return_stats();
        m.insert("eval_return".into(), mean);
        m.insert("eval_return_std".into(), std);
        m.insert("eval_length".into(), eval.mean_length());
        Ok(m)
    }

    fn save_state(&mut self) -> Result<Vec<(String, Vec<u8>)>, TrainError> {
        self.store()?;
        let progress = serde_json::to_vec(&self.progress).map_err(|e| TrainError::Invalid(e.to_string()))?;
        let mut files = vec![(PROGRESS.to_string(), progress)];
        if let Some(env) = self.env.snapshot() {
            files.push((ENV.to_string(), env));
        }
        Ok(files)
    }

    fn load_state(&mut self, dir: &Path) -> Result<(), TrainError> {
        self.reload()?;
        let read = |name: &str| -> Result<Vec<u8>, TrainError> {
            trident_train::checkpoint::verify(dir, &[name])?;
            std::fs::read(dir.join(name))
                .map_err(|e| TrainError::Invalid(format!("{}: {e}", dir.join(name).display())))
        };
        self.progress = serde_json::from_slice(&read(PROGRESS)?)
            .map_err(|e| TrainError::Invalid(format!("{}: {e}", dir.join(PROGRESS).display())))?;
        if dir.join(ENV).exists() {
            self.env
                .restore(&read(ENV)?)
                .map_err(|e| TrainError::Invalid(format!("{}: {e}", dir.join(ENV).display())))?;
        }
        Ok(())
    }
}
