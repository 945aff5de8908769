//! A reinforcement-learning run's TOML (`trident rl --config run.toml`): `[run]`, `[env]`,
//! `[agent]` (its `kind` and settings) and `[train]` (epochs, checkpoints, the monitored
//! metric). Every key is checked; a misspelt one is refused with its line.

use crate::agent::dqn::DqnConfig;
use crate::agent::ppo::PpoConfig;
use crate::agent::reinforce::ReinforceConfig;
use crate::agent::tabular::{Method, TabularConfig};
use crate::agent::EpsilonSchedule;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use trident_train::trainer::Monitor;

/// A run's configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RlConfig {
    /// Where the run writes and its seed.
    pub run: RunSection,
    /// The environment.
    pub env: EnvSection,
    /// The agent.
    pub agent: AgentConfig,
    /// The loop's settings.
    #[serde(default)]
    pub train: RlTrain,
}

/// `[run]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSection {
    /// The run directory.
    pub dir: PathBuf,
    /// Seeds the environment's first reset and the agent's exploration.
    #[serde(default)]
    pub seed: u64,
}

/// `[env]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvSection {
    /// A built-in environment's id (`CartPole-v1`, `FrozenLake-v1`, `Taxi-v4`, …).
    pub id: String,
    /// FrozenLake: slippery ice (gymnasium's `is_slippery`, default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_slippery: Option<bool>,
    /// FrozenLake: the probability of moving as intended on slippery ice (default 1/3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_rate: Option<f64>,
    /// FrozenLake: a map of its own, rows of `S`, `F`, `H`, `G` (gymnasium's `desc`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub map: Option<Vec<String>>,
}

impl EnvSection {
    /// The environment with these options and its registered time limit.
    pub fn make(&self) -> Result<Box<dyn crate::Env>, String> {
        if !matches!(self.id.as_str(), "FrozenLake-v1" | "FrozenLake8x8-v1") {
            return crate::make(&self.id).map_err(|e| e.to_string());
        }
        let map: Option<Vec<&str>> = self
            .map
            .as_ref()
            .map(|rows| rows.iter().map(String::as_str).collect());
        Ok(crate::lake(
            &self.id,
            map.as_deref(),
            self.is_slippery.unwrap_or(true),
            self.success_rate.unwrap_or(1.0 / 3.0),
        ))
    }

    fn validate(&self) -> Result<(), String> {
        let lake = matches!(self.id.as_str(), "FrozenLake-v1" | "FrozenLake8x8-v1");
        if !lake && (self.is_slippery.is_some() || self.success_rate.is_some() || self.map.is_some()) {
            return Err(format!(
                "env.is_slippery, env.success_rate and env.map are FrozenLake's options, not {}'s",
                self.id
            ));
        }
        if let Some(p) = self.success_rate {
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("env.success_rate = {p}: must be in [0, 1]"));
            }
        }
        if let Some(rows) = &self.map {
            let width = rows.first().map_or(0, String::len);
            let cells: String = rows.concat();
            if width == 0
                || rows.iter().any(|r| r.len() != width)
                || cells.chars().any(|c| !"SFHG".contains(c))
            {
                return Err("env.map: equal rows of S, F, H and G".into());
            }
            if cells.matches('S').count() == 0 || !cells.contains('G') {
                return Err("env.map: at least one start (S) and a goal (G)".into());
            }
        }
        Ok(())
    }
}

/// `[agent]`: the algorithm, by `kind`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum AgentConfig {
    /// Tabular Q-learning.
    QLearning(TabularSettings),
    /// Tabular SARSA.
    Sarsa(TabularSettings),
    /// Deep Q-learning.
    Dqn(DqnSettings),
    /// REINFORCE with a learned baseline.
    Reinforce(ReinforceSettings),
    /// Proximal policy optimisation (CleanRL's `ppo.py`).
    Ppo(PpoSettings),
}

/// The settings of a PPO agent (defaults: CleanRL's `ppo.py`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PpoSettings {
    /// Hidden widths of the actor and the critic (tanh).
    #[serde(default = "reinforce_hidden")]
    pub hidden: Vec<usize>,
    /// Adam's learning rate (annealed linearly to 0 with `anneal_lr`).
    #[serde(default = "ppo_lr")]
    pub lr: f64,
    /// Anneal the learning rate linearly to 0 over the run's iterations.
    #[serde(default = "yes")]
    pub anneal_lr: bool,
    /// Adam's ε.
    #[serde(default = "ppo_eps")]
    pub adam_eps: f64,
    /// Global gradient-norm clipping.
    #[serde(default = "half")]
    pub max_grad_norm: f64,
    /// Environment copies.
    #[serde(default = "four_usize")]
    pub num_envs: usize,
    /// Steps of each copy per iteration.
    #[serde(default = "one_two_eight_usize")]
    pub num_steps: usize,
    /// Discount γ.
    #[serde(default = "gamma")]
    pub gamma: f64,
    /// GAE's λ.
    #[serde(default = "gae_lambda")]
    pub gae_lambda: f64,
    /// Minibatches per pass.
    #[serde(default = "four_usize")]
    pub num_minibatches: usize,
    /// Passes over each iteration's samples.
    #[serde(default = "four_usize")]
    pub update_epochs: usize,
    /// The surrogate's clipping range.
    #[serde(default = "clip")]
    pub clip_coef: f64,
    /// Clip the value loss too.
    #[serde(default = "yes")]
    pub clip_vloss: bool,
    /// Normalise advantages per minibatch.
    #[serde(default = "yes")]
    pub norm_adv: bool,
    /// Entropy bonus weight.
    #[serde(default = "ent")]
    pub ent_coef: f64,
    /// Value loss weight.
    #[serde(default = "half")]
    pub vf_coef: f64,
    /// Environment steps per epoch (a multiple of num_envs × num_steps).
    pub steps_per_epoch: u64,
    /// Greedy episodes evaluated at each epoch's end.
    #[serde(default = "ten")]
    pub eval_episodes: u64,
    /// The first evaluation episode's seed.
    #[serde(default = "eval_seed")]
    pub eval_seed: u64,
}

/// The settings of a REINFORCE agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReinforceSettings {
    /// Hidden widths of the policy and value networks (tanh).
    #[serde(default = "reinforce_hidden")]
    pub hidden: Vec<usize>,
    /// Adam's learning rate.
    #[serde(default = "reinforce_lr")]
    pub lr: f64,
    /// Adam's ε.
    #[serde(default = "adam_eps")]
    pub adam_eps: f64,
    /// Global gradient-norm clipping.
    #[serde(default = "half")]
    pub max_grad_norm: f64,
    /// Discount γ.
    #[serde(default = "gamma")]
    pub gamma: f64,
    /// Weight of the value loss.
    #[serde(default = "half")]
    pub value_coef: f64,
    /// Scale advantages to zero mean and unit deviation within each update.
    #[serde(default = "yes")]
    pub normalize_advantages: bool,
    /// Complete episodes per epoch.
    pub episodes_per_epoch: u64,
    /// Complete episodes per update (the loop's iteration).
    #[serde(default = "four")]
    pub episodes_per_iteration: u64,
    /// Greedy episodes evaluated at each epoch's end.
    #[serde(default = "ten")]
    pub eval_episodes: u64,
    /// The first evaluation episode's seed.
    #[serde(default = "eval_seed")]
    pub eval_seed: u64,
}

/// The settings of a DQN agent (defaults: rl-baselines3-zoo's tuned CartPole-v1 values).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DqnSettings {
    /// Hidden widths of the Q-network.
    #[serde(default = "hidden")]
    pub hidden: Vec<usize>,
    /// Adam's learning rate.
    #[serde(default = "dqn_lr")]
    pub lr: f64,
    /// Adam's ε.
    #[serde(default = "adam_eps")]
    pub adam_eps: f64,
    /// Global gradient-norm clipping (none when absent).
    #[serde(default = "ten_f")]
    pub max_grad_norm: f64,
    /// Discount γ.
    #[serde(default = "gamma")]
    pub gamma: f64,
    /// Transitions per gradient step.
    #[serde(default = "sixty_four")]
    pub batch_size: usize,
    /// Transitions the replay buffer keeps.
    #[serde(default = "buffer")]
    pub buffer_size: usize,
    /// Environment steps before learning starts.
    #[serde(default = "thousand")]
    pub learning_starts: u64,
    /// Gradient steps every this many environment steps…
    #[serde(default = "two_five_six")]
    pub train_frequency: u64,
    /// …this many at a time.
    #[serde(default = "one_two_eight")]
    pub gradient_steps: u64,
    /// The target network is copied every this many environment steps.
    #[serde(default = "ten")]
    pub target_update_interval: u64,
    /// Double DQN.
    #[serde(default)]
    pub double: bool,
    /// `huber` (default) or `mse`.
    #[serde(default = "huber")]
    pub loss: String,
    /// ε at the start.
    #[serde(default = "one")]
    pub epsilon_start: f64,
    /// ε after its decay.
    #[serde(default = "dqn_epsilon_end")]
    pub epsilon_end: f64,
    /// The share of the run's steps over which ε decays linearly.
    #[serde(default = "dqn_epsilon_fraction")]
    pub epsilon_fraction: f64,
    /// Environment steps per epoch.
    pub steps_per_epoch: u64,
    /// Environment steps per iteration: the loop's batch, its progress and checkpoint unit.
    #[serde(default = "thousand")]
    pub steps_per_iteration: u64,
    /// Greedy episodes evaluated at each epoch's end.
    #[serde(default = "ten")]
    pub eval_episodes: u64,
    /// The first evaluation episode's seed.
    #[serde(default = "eval_seed")]
    pub eval_seed: u64,
}

/// The settings of a tabular agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TabularSettings {
    /// Step size α.
    pub alpha: f64,
    /// Discount γ.
    #[serde(default = "gamma")]
    pub gamma: f64,
    /// ε at the start.
    #[serde(default = "one")]
    pub epsilon_start: f64,
    /// ε after its decay.
    #[serde(default = "epsilon_end")]
    pub epsilon_end: f64,
    /// The share of the run's environment steps over which ε decays linearly.
    #[serde(default = "half")]
    pub epsilon_fraction: f64,
    /// Environment steps per epoch.
    pub steps_per_epoch: u64,
    /// Environment steps per iteration (the loop's batch: progress and checkpoints).
    #[serde(default = "thousand")]
    pub steps_per_iteration: u64,
    /// Greedy episodes evaluated at each epoch's end (seeded `eval_seed`, `eval_seed + 1`, …).
    #[serde(default = "hundred")]
    pub eval_episodes: u64,
    /// The first evaluation episode's seed.
    #[serde(default = "eval_seed")]
    pub eval_seed: u64,
}

/// `[train]`: what the training loop reads for an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RlTrain {
    /// Epochs (each `steps_per_epoch` environment steps, then an evaluation).
    #[serde(default = "ten")]
    pub epochs: u64,
    /// Also write `last` every this many iterations (0: each epoch only).
    #[serde(default)]
    pub checkpoint_every: u64,
    /// Log the iteration's figures to TensorBoard every this many iterations.
    #[serde(default = "one_u")]
    pub log_every: u64,
    /// Stop after this many epochs without improvement of `monitor`.
    #[serde(default)]
    pub early_stopping_patience: Option<u64>,
    /// The metric that picks `best`: `eval_return` (default) or `episodic_return`.
    #[serde(default = "eval_return")]
    pub monitor: Monitor,
}

impl Default for RlTrain {
    fn default() -> Self {
        RlTrain {
            epochs: ten(),
            checkpoint_every: 0,
            log_every: 1,
            early_stopping_patience: None,
            monitor: eval_return(),
        }
    }
}

fn ppo_lr() -> f64 {
    2.5e-4
}
fn ppo_eps() -> f64 {
    1e-5
}
fn four_usize() -> usize {
    4
}
fn one_two_eight_usize() -> usize {
    128
}
fn gae_lambda() -> f64 {
    0.95
}
fn clip() -> f64 {
    0.2
}
fn ent() -> f64 {
    0.01
}
fn reinforce_hidden() -> Vec<usize> {
    vec![64, 64]
}
fn reinforce_lr() -> f64 {
    1e-3
}
fn yes() -> bool {
    true
}
fn four() -> u64 {
    4
}
fn hidden() -> Vec<usize> {
    vec![256, 256]
}
fn dqn_lr() -> f64 {
    2.3e-3
}
fn adam_eps() -> f64 {
    1e-8
}
fn ten_f() -> f64 {
    10.0
}
fn sixty_four() -> usize {
    64
}
fn buffer() -> usize {
    100_000
}
fn two_five_six() -> u64 {
    256
}
fn one_two_eight() -> u64 {
    128
}
fn huber() -> String {
    "huber".into()
}
fn dqn_epsilon_end() -> f64 {
    0.04
}
fn dqn_epsilon_fraction() -> f64 {
    0.16
}
fn gamma() -> f64 {
    0.99
}
fn one() -> f64 {
    1.0
}
fn one_u() -> u64 {
    1
}
fn epsilon_end() -> f64 {
    0.01
}
fn half() -> f64 {
    0.5
}
fn thousand() -> u64 {
    1000
}
fn hundred() -> u64 {
    100
}
fn ten() -> u64 {
    10
}
fn eval_seed() -> u64 {
    1_000_000
}
fn eval_return() -> Monitor {
    Monitor::named("eval_return")
}

impl RlConfig {
    /// Parses `file`; errors name the file, the line and the key.
    pub fn read(file: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", file.display()))
    }

    /// Parses TOML text and checks the settings.
    pub fn parse(text: &str) -> Result<Self, String> {
        let c: RlConfig = toml::from_str(text).map_err(|e| {
            let at = e.span().map(|s| key_line(text, s.start, e.message()));
            let at = at.map(|l| format!("line {l}: ")).unwrap_or_default();
            format!("{at}{}", e.message())
        })?;
        c.validate()?;
        Ok(c)
    }

    fn validate(&self) -> Result<(), String> {
        if !crate::ENV_IDS.contains(&self.env.id.as_str()) {
            return Err(format!(
                "env.id = {:?}: one of {}",
                self.env.id,
                crate::ENV_IDS.join(", ")
            ));
        }
        self.env.validate()?;
        if self.train.epochs == 0 {
            return Err("train.epochs must be at least 1".into());
        }
        let (per_epoch, per_iteration) = self.steps();
        let unit = match self.agent {
            AgentConfig::Reinforce(_) => "episodes",
            _ => "steps",
        };
        let per_iteration_key = match self.agent {
            AgentConfig::Ppo(_) => "num_envs × agent.num_steps".to_string(),
            _ => format!("{unit}_per_iteration"),
        };
        if per_iteration == 0 || per_epoch < per_iteration {
            return Err(format!(
                "agent.{unit}_per_epoch = {per_epoch} must be at least agent.{per_iteration_key} = {per_iteration} (at least 1)"
            ));
        }
        if per_epoch % per_iteration != 0 {
            return Err(format!(
                "agent.{unit}_per_epoch = {per_epoch} is not a multiple of agent.{per_iteration_key} = {per_iteration}"
            ));
        }
        let (gamma, epsilon) = match &self.agent {
            AgentConfig::QLearning(t) | AgentConfig::Sarsa(t) => {
                if !(t.alpha > 0.0 && t.alpha <= 1.0) {
                    return Err(format!("agent.alpha = {}: must be in (0, 1]", t.alpha));
                }
                (
                    t.gamma,
                    Some([t.epsilon_start, t.epsilon_end, t.epsilon_fraction]),
                )
            }
            AgentConfig::Ppo(p) => {
                let positive = |v: f64| v > 0.0 && v.is_finite();
                if !(positive(p.lr)
                    && positive(p.adam_eps)
                    && positive(p.max_grad_norm)
                    && positive(p.clip_coef))
                {
                    return Err(
                        "agent.lr, agent.adam_eps, agent.max_grad_norm and agent.clip_coef must be positive"
                            .into(),
                    );
                }
                if p.num_envs == 0 || p.num_steps == 0 || p.hidden.contains(&0) {
                    return Err(
                        "agent.num_envs, agent.num_steps and every agent.hidden width must be at least 1"
                            .into(),
                    );
                }
                if !(0.0..=1.0).contains(&p.gae_lambda) {
                    return Err(format!("agent.gae_lambda = {}: must be in [0, 1]", p.gae_lambda));
                }
                (p.gamma, None)
            }
            AgentConfig::Reinforce(r) => {
                let positive = |v: f64| v > 0.0 && v.is_finite();
                if !(positive(r.lr) && positive(r.adam_eps) && positive(r.max_grad_norm))
                    || r.value_coef < 0.0
                {
                    return Err(
                        "agent.lr, agent.adam_eps and agent.max_grad_norm must be positive, agent.value_coef at least 0".into(),
                    );
                }
                if r.hidden.contains(&0) {
                    return Err(format!(
                        "agent.hidden = {:?}: every width must be at least 1",
                        r.hidden
                    ));
                }
                (r.gamma, None)
            }
            AgentConfig::Dqn(d) => {
                let positive = |v: f64| v > 0.0 && v.is_finite();
                if !(positive(d.lr) && positive(d.adam_eps) && positive(d.max_grad_norm)) {
                    return Err("agent.lr, agent.adam_eps and agent.max_grad_norm must be positive".into());
                }
                if !["huber", "mse"].contains(&d.loss.as_str()) {
                    return Err(format!("agent.loss = {:?}: \"huber\" or \"mse\"", d.loss));
                }
                if d.hidden.contains(&0) {
                    return Err(format!(
                        "agent.hidden = {:?}: every width must be at least 1",
                        d.hidden
                    ));
                }
                (
                    d.gamma,
                    Some([d.epsilon_start, d.epsilon_end, d.epsilon_fraction]),
                )
            }
        };
        if !(0.0..=1.0).contains(&gamma) {
            return Err(format!("agent.gamma = {gamma}: must be in [0, 1]"));
        }
        // The ε-greedy kinds' schedule; the policy-gradient kinds have none.
        if let Some([start, end, fraction]) = epsilon {
            for (key, v) in [("agent.epsilon_start", start), ("agent.epsilon_end", end)] {
                if !(0.0..=1.0).contains(&v) {
                    return Err(format!("{key} = {v}: must be in [0, 1]"));
                }
            }
            if !(fraction > 0.0 && fraction <= 1.0) {
                return Err(format!("agent.epsilon_fraction = {fraction}: must be in (0, 1]"));
            }
        }
        if !["eval_return", "episodic_return"].contains(&self.train.monitor.name()) {
            return Err(format!(
                "train.monitor = {:?}: \"eval_return\" or \"episodic_return\"",
                self.train.monitor.name()
            ));
        }
        Ok(())
    }

    /// The tabular agent's settings, for a tabular `kind`.
    pub fn tabular(&self) -> Option<TabularConfig> {
        let (method, t) = match &self.agent {
            AgentConfig::QLearning(t) => (Method::QLearning, t),
            AgentConfig::Sarsa(t) => (Method::Sarsa, t),
            AgentConfig::Dqn(_) | AgentConfig::Reinforce(_) | AgentConfig::Ppo(_) => return None,
        };
        Some(TabularConfig {
            method,
            alpha: t.alpha,
            gamma: t.gamma,
            epsilon: EpsilonSchedule {
                start: t.epsilon_start,
                end: t.epsilon_end,
                fraction: t.epsilon_fraction,
            },
            steps_per_iteration: t.steps_per_iteration,
            eval_episodes: t.eval_episodes,
            eval_seed: t.eval_seed,
        })
    }

    /// The DQN agent's settings, for `kind = "dqn"`.
    pub fn dqn(&self) -> Option<DqnConfig> {
        let AgentConfig::Dqn(d) = &self.agent else {
            return None;
        };
        Some(DqnConfig {
            hidden: d.hidden.clone(),
            gamma: d.gamma,
            batch_size: d.batch_size,
            buffer_size: d.buffer_size,
            learning_starts: d.learning_starts,
            train_frequency: d.train_frequency,
            gradient_steps: d.gradient_steps,
            target_update_interval: d.target_update_interval,
            double: d.double,
            huber: d.loss == "huber",
            epsilon: EpsilonSchedule {
                start: d.epsilon_start,
                end: d.epsilon_end,
                fraction: d.epsilon_fraction,
            },
            steps_per_iteration: d.steps_per_iteration,
            eval_episodes: d.eval_episodes,
            eval_seed: d.eval_seed,
        })
    }

    /// The PPO agent's settings, for `kind = "ppo"`.
    pub fn ppo(&self) -> Option<PpoConfig> {
        let AgentConfig::Ppo(p) = &self.agent else {
            return None;
        };
        Some(PpoConfig {
            hidden: p.hidden.clone(),
            num_envs: p.num_envs,
            num_steps: p.num_steps,
            gamma: p.gamma,
            gae_lambda: p.gae_lambda,
            num_minibatches: p.num_minibatches,
            update_epochs: p.update_epochs,
            clip_coef: p.clip_coef,
            clip_vloss: p.clip_vloss,
            norm_adv: p.norm_adv,
            ent_coef: p.ent_coef,
            vf_coef: p.vf_coef,
            eval_episodes: p.eval_episodes,
            eval_seed: p.eval_seed,
        })
    }

    /// The REINFORCE agent's settings, for `kind = "reinforce"`.
    pub fn reinforce(&self) -> Option<ReinforceConfig> {
        let AgentConfig::Reinforce(r) = &self.agent else {
            return None;
        };
        Some(ReinforceConfig {
            hidden: r.hidden.clone(),
            gamma: r.gamma,
            episodes_per_iteration: r.episodes_per_iteration,
            value_coef: r.value_coef,
            normalize_advantages: r.normalize_advantages,
            eval_episodes: r.eval_episodes,
            eval_seed: r.eval_seed,
        })
    }

    /// Units per epoch and per iteration: environment steps, or for REINFORCE episodes.
    pub fn steps(&self) -> (u64, u64) {
        match &self.agent {
            AgentConfig::QLearning(t) | AgentConfig::Sarsa(t) => (t.steps_per_epoch, t.steps_per_iteration),
            AgentConfig::Dqn(d) => (d.steps_per_epoch, d.steps_per_iteration),
            AgentConfig::Reinforce(r) => (r.episodes_per_epoch, r.episodes_per_iteration),
            AgentConfig::Ppo(p) => (p.steps_per_epoch, (p.num_envs * p.num_steps) as u64),
        }
    }

    /// The greedy evaluation's episodes and first seed.
    pub fn evaluation(&self) -> (u64, u64) {
        match &self.agent {
            AgentConfig::QLearning(t) | AgentConfig::Sarsa(t) => (t.eval_episodes, t.eval_seed),
            AgentConfig::Dqn(d) => (d.eval_episodes, d.eval_seed),
            AgentConfig::Reinforce(r) => (r.eval_episodes, r.eval_seed),
            AgentConfig::Ppo(p) => (p.eval_episodes, p.eval_seed),
        }
    }

    /// Sets the greedy evaluation's episodes and first seed (`None` keeps the configured).
    pub fn set_evaluation(&mut self, episodes: Option<u64>, seed: Option<u64>) {
        let (n, s) = self.evaluation_mut();
        *n = episodes.unwrap_or(*n);
        *s = seed.unwrap_or(*s);
    }

    fn evaluation_mut(&mut self) -> (&mut u64, &mut u64) {
        match &mut self.agent {
            AgentConfig::QLearning(t) | AgentConfig::Sarsa(t) => (&mut t.eval_episodes, &mut t.eval_seed),
            AgentConfig::Dqn(d) => (&mut d.eval_episodes, &mut d.eval_seed),
            AgentConfig::Reinforce(r) => (&mut r.eval_episodes, &mut r.eval_seed),
            AgentConfig::Ppo(p) => (&mut p.eval_episodes, &mut p.eval_seed),
        }
    }

    /// Iterations per epoch.
    pub fn iterations_per_epoch(&self) -> u64 {
        let (per_epoch, per_iteration) = self.steps();
        per_epoch / per_iteration
    }
}

/// The line of an error at byte `at`: for an unknown key, the line of that key at or after
/// `at` (a tagged table such as `[agent]` is reported at its start), else `at`'s own.
fn key_line(text: &str, at: usize, message: &str) -> usize {
    let line_of = |i: usize| text[..i].matches('\n').count() + 1;
    let key = message
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split('`').next());
    if let Some(key) = key {
        let mut offset = at;
        for line in text[at..].split_inclusive('\n') {
            let trimmed = line.trim_start();
            if trimmed
                .strip_prefix(key)
                .is_some_and(|r| r.trim_start().starts_with('='))
            {
                return line_of(offset);
            }
            offset += line.len();
        }
    }
    line_of(at)
}
