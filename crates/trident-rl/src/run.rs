//! `trident rl`: a run of an agent on Trident's training loop, from its TOML.

use crate::agent::dqn::Dqn;
use crate::agent::ppo::Ppo;
use crate::agent::reinforce::Reinforce;
use crate::agent::tabular::Tabular;
use crate::agent::{EpisodeGifs, Episodes, Iterations};
use crate::config::{AgentConfig, RlConfig};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use trident_train::optim::{Decay, OptimizerConfig};
use trident_train::trainer::{FitSummary, TrainConfig, TrainError, Trainer};

/// How a run is driven from outside (the command line's flags and signals).
#[derive(Debug, Default)]
pub struct RunOptions {
    /// Continue from the run directory's `last` checkpoint.
    pub resume: bool,
    /// Show progress.
    pub progress: bool,
    /// Set by a signal handler: stop after the current iteration, checkpointing.
    pub stop: Option<Arc<AtomicBool>>,
    /// Stop after this many iterations in this process (tests simulate an interruption).
    pub stop_after_steps: Option<u64>,
}

/// What a finished (or interrupted) run gives.
pub struct RlOutcome {
    /// The loop's summary.
    pub summary: FitSummary,
    /// The final greedy evaluation of the trained agent (the last epoch's table).
    pub evaluation: Episodes,
}

/// The loop's settings for an agent's run (a DQN's Adam among them).
fn train_config(c: &RlConfig) -> TrainConfig {
    let (lr, optimizer, max_grad_norm) = match &c.agent {
        AgentConfig::Dqn(d) => (
            d.lr,
            OptimizerConfig::Adamw {
                beta1: 0.9,
                beta2: 0.999,
                eps: d.adam_eps,
                weight_decay: 0.0,
                fused: true,
            },
            Some(d.max_grad_norm),
        ),
        AgentConfig::Reinforce(r) => (
            r.lr,
            OptimizerConfig::Adamw {
                beta1: 0.9,
                beta2: 0.999,
                eps: r.adam_eps,
                weight_decay: 0.0,
                fused: true,
            },
            Some(r.max_grad_norm),
        ),
        AgentConfig::Ppo(p) => (
            p.lr,
            OptimizerConfig::Adamw {
                beta1: 0.9,
                beta2: 0.999,
                eps: p.adam_eps,
                weight_decay: 0.0,
                fused: true,
            },
            Some(p.max_grad_norm),
        ),
        _ => (0.0, OptimizerConfig::default(), None),
    };
    let decay = match &c.agent {
        AgentConfig::Ppo(p) if p.anneal_lr => Decay::Linear,
        _ => Decay::Constant,
    };
    TrainConfig {
        epochs: c.train.epochs,
        lr,
        warmup_steps: 0,
        decay,
        optimizer,
        max_grad_norm,
        grad_accum: 1,
        early_stopping_patience: c.train.early_stopping_patience,
        monitor: c.train.monitor.clone(),
        checkpoint_every: c.train.checkpoint_every,
        log_every: c.train.log_every,
        seed: c.run.seed,
        precision: Default::default(),
    }
}

/// Trains the agent `config` describes (its TOML text `text`, copied into checkpoints).
pub fn run(config: &RlConfig, text: &str, options: RunOptions) -> Result<RlOutcome, TrainError> {
    let env = config.env.make().map_err(TrainError::Invalid)?;
    let eval_env = config.env.make().map_err(TrainError::Invalid)?;
    let mut trainer = Trainer::new(train_config(config), Vec::new(), &config.run.dir);
    trainer.progress = options.progress;
    trainer.stop_after_steps = options.stop_after_steps;
    if let Some(stop) = options.stop {
        trainer.stop = stop;
    }
    trainer.checkpoint_files = vec![("rl.toml".into(), text.as_bytes().to_vec())];
    let source = Iterations {
        per_epoch: config.iterations_per_epoch(),
    };
    let hash = serde_json::to_string(config).map_err(|e| TrainError::Invalid(e.to_string()))?;
    let seed = config.run.seed;
    // A lake of the user's own map is not drawn (the drawings know the registered maps).
    let gifs = config.env.map.is_none().then(|| EpisodeGifs {
        dir: config.run.dir.join("episodes"),
        env_id: config.env.id.clone(),
    });
    if let Some(t) = config.tabular() {
        let mut agent = Tabular::new(t, env, eval_env, seed)?;
        agent.gifs = gifs.clone();
        let summary = trainer.run(&mut agent, &source, options.resume, &hash)?;
        let evaluation = agent.evaluate(None);
        return Ok(RlOutcome { summary, evaluation });
    }
    if let Some(p) = config.ppo() {
        let mut envs = Vec::with_capacity(p.num_envs);
        for _ in 0..p.num_envs {
            envs.push(config.env.make().map_err(TrainError::Invalid)?);
        }
        drop(env);
        let mut agent = Ppo::new(p, envs, eval_env, seed)?;
        agent.gifs = gifs.clone();
        let summary = trainer.run(&mut agent, &source, options.resume, &hash)?;
        let evaluation = agent.evaluate(None)?;
        return Ok(RlOutcome { summary, evaluation });
    }
    if let Some(r) = config.reinforce() {
        let mut agent = Reinforce::new(r, env, eval_env, seed)?;
        agent.gifs = gifs.clone();
        let summary = trainer.run(&mut agent, &source, options.resume, &hash)?;
        let evaluation = agent.evaluate(None)?;
        return Ok(RlOutcome { summary, evaluation });
    }
    let d = config
        .dqn()
        .expect("the agent kinds are tabular, reinforce or dqn");
    let mut agent = Dqn::new(d, env, eval_env, seed)?;
    agent.gifs = gifs;
    let summary = trainer.run(&mut agent, &source, options.resume, &hash)?;
    let evaluation = agent.evaluate(None)?;
    Ok(RlOutcome { summary, evaluation })
}

/// [`run`] of the TOML file `file`.
pub fn run_file(file: &Path, options: RunOptions) -> Result<RlOutcome, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let config = RlConfig::parse(&text).map_err(|e| format!("{}: {e}", file.display()))?;
    run(&config, &text, options).map_err(|e| e.to_string())
}

/// An agent rebuilt from a checkpoint of `trident rl`.
pub enum Loaded {
    /// Tabular Q-learning or SARSA.
    Tabular(Box<Tabular>),
    /// DQN.
    Dqn(Box<Dqn>),
    /// REINFORCE.
    Reinforce(Box<Reinforce>),
    /// PPO.
    Ppo(Box<Ppo>),
}

/// What an agent's policy is, for its export.
pub enum PolicyShape {
    /// A Q-table: the tensor `q_table`, states × actions.
    Table {
        /// Actions.
        actions: usize,
    },
    /// An MLP: its prefix, linear layers, activation, observation width, scores' name.
    Net {
        /// The network's parameter prefix.
        prefix: &'static str,
        /// Its linear layers.
        layers: usize,
        /// Its activation.
        activation: &'static str,
        /// The observation's width.
        width: usize,
        /// `logits` or `q_values`.
        scores: &'static str,
        /// Actions.
        actions: usize,
    },
}

impl Loaded {
    /// Greedy episodes on the agent's evaluation settings.
    pub fn evaluate(&mut self) -> Result<Episodes, TrainError> {
        match self {
            Loaded::Tabular(a) => Ok(a.evaluate(None)),
            Loaded::Dqn(a) => a.evaluate(None),
            Loaded::Reinforce(a) => a.evaluate(None),
            Loaded::Ppo(a) => a.evaluate(None),
        }
    }

    /// The agent's parameters.
    pub fn params(&self) -> &trident_nn::Params {
        use trident_train::trainer::Task;
        match self {
            Loaded::Tabular(a) => a.params(),
            Loaded::Dqn(a) => a.params(),
            Loaded::Reinforce(a) => a.params(),
            Loaded::Ppo(a) => a.params(),
        }
    }
}

/// Rebuilds the agent of checkpoint `dir` (its `rl.toml` and weights), its evaluation set to
/// `episodes` episodes from `seed` (the run's own when `None`).
pub fn load_checkpoint(
    dir: &Path,
    episodes: Option<u64>,
    seed: Option<u64>,
) -> Result<(RlConfig, Loaded), String> {
    let err = |e: TrainError| format!("{}: {e}", dir.display());
    trident_train::checkpoint::verify(dir, &["rl.toml", "model.safetensors"]).map_err(|e| err(e.into()))?;
    let mut config = RlConfig::read(&dir.join("rl.toml"))?;
    match &mut config.agent {
        AgentConfig::QLearning(t) | AgentConfig::Sarsa(t) => {
            t.eval_episodes = episodes.unwrap_or(t.eval_episodes);
            t.eval_seed = seed.unwrap_or(t.eval_seed);
        }
        AgentConfig::Dqn(d) => {
            d.eval_episodes = episodes.unwrap_or(d.eval_episodes);
            d.eval_seed = seed.unwrap_or(d.eval_seed);
        }
        AgentConfig::Reinforce(r) => {
            r.eval_episodes = episodes.unwrap_or(r.eval_episodes);
            r.eval_seed = seed.unwrap_or(r.eval_seed);
        }
        AgentConfig::Ppo(p) => {
            p.eval_episodes = episodes.unwrap_or(p.eval_episodes);
            p.eval_seed = seed.unwrap_or(p.eval_seed);
        }
    }
    let make = || config.env.make();
    let load = |params: &trident_nn::Params| {
        trident_train::checkpoint::load_weights(dir, params).map_err(|e| err(e.into()))
    };
    let s = config.run.seed;
    let loaded = if let Some(t) = config.tabular() {
        let mut a = Tabular::new(t, make()?, make()?, s).map_err(err)?;
        load(trident_train::trainer::Task::params(&a))?;
        a.reload().map_err(err)?;
        Loaded::Tabular(Box::new(a))
    } else if let Some(d) = config.dqn() {
        let a = Dqn::new(d, make()?, make()?, s).map_err(err)?;
        load(trident_train::trainer::Task::params(&a))?;
        Loaded::Dqn(Box::new(a))
    } else if let Some(r) = config.reinforce() {
        let a = Reinforce::new(r, make()?, make()?, s).map_err(err)?;
        load(trident_train::trainer::Task::params(&a))?;
        Loaded::Reinforce(Box::new(a))
    } else {
        let p = config.ppo().expect("the agent kinds");
        let envs = (0..p.num_envs).map(|_| make()).collect::<Result<Vec<_>, _>>()?;
        let a = Ppo::new(p, envs, make()?, s).map_err(err)?;
        load(trident_train::trainer::Task::params(&a))?;
        Loaded::Ppo(Box::new(a))
    };
    Ok((config, loaded))
}

/// The shape of the policy of `config`'s agent (for its export).
pub fn policy_shape(config: &RlConfig) -> Result<PolicyShape, String> {
    let env = config.env.make()?;
    let crate::Space::Discrete(actions) = env.action_space() else {
        return Err("an agent with continuous actions has no policy export yet".into());
    };
    let width = env.observation_space().size();
    Ok(match &config.agent {
        AgentConfig::QLearning(_) | AgentConfig::Sarsa(_) => PolicyShape::Table { actions },
        AgentConfig::Dqn(d) => PolicyShape::Net {
            prefix: "q",
            layers: d.hidden.len() + 1,
            activation: "relu",
            width,
            scores: "q_values",
            actions,
        },
        AgentConfig::Reinforce(r) => PolicyShape::Net {
            prefix: "policy",
            layers: r.hidden.len() + 1,
            activation: "tanh",
            width,
            scores: "logits",
            actions,
        },
        AgentConfig::Ppo(p) => PolicyShape::Net {
            prefix: "actor",
            layers: p.hidden.len() + 1,
            activation: "tanh",
            width,
            scores: "logits",
            actions,
        },
    })
}

/// The greedy evaluation of a checkpoint of `trident rl` (`<run>/best` or `<run>/last`):
/// `episodes` episodes (the run's own count when `None`) from `seed` on (the run's
/// evaluation seed when `None`), the agent rebuilt from the checkpoint's `rl.toml` and its
/// weights.
pub fn evaluate_checkpoint(
    dir: &Path,
    episodes: Option<u64>,
    seed: Option<u64>,
) -> Result<(RlConfig, Episodes), String> {
    let (config, mut agent) = load_checkpoint(dir, episodes, seed)?;
    let out = agent.evaluate().map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok((config, out))
}
