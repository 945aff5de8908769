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
    let mut agent = Agent::build(config)?;
    // A lake of the user's own map is not drawn (the drawings know the registered maps).
    let gifs = config.env.map.is_none().then(|| EpisodeGifs {
        dir: config.run.dir.join("episodes"),
        env_id: config.env.id.clone(),
    });
    let r = options.resume;
    let summary = match &mut agent {
        Agent::Tabular(a) => {
            a.gifs = gifs;
            trainer.run(a.as_mut(), &source, r, &hash)?
        }
        Agent::Dqn(a) => {
            a.gifs = gifs;
            trainer.run(a.as_mut(), &source, r, &hash)?
        }
        Agent::Reinforce(a) => {
            a.gifs = gifs;
            trainer.run(a.as_mut(), &source, r, &hash)?
        }
        Agent::Ppo(a) => {
            a.gifs = gifs;
            trainer.run(a.as_mut(), &source, r, &hash)?
        }
    };
    let evaluation = agent.evaluate()?;
    Ok(RlOutcome { summary, evaluation })
}

/// The agent of a run's TOML, of any kind.
pub enum Agent {
    /// Tabular Q-learning or SARSA.
    Tabular(Box<Tabular>),
    /// DQN.
    Dqn(Box<Dqn>),
    /// REINFORCE.
    Reinforce(Box<Reinforce>),
    /// PPO.
    Ppo(Box<Ppo>),
}

impl Agent {
    /// The new agent `config` describes, on its environments, seeded by `run.seed`.
    pub fn build(config: &RlConfig) -> Result<Self, TrainError> {
        let make = || config.env.make().map_err(TrainError::Invalid);
        let seed = config.run.seed;
        Ok(match &config.agent {
            AgentConfig::QLearning(_) | AgentConfig::Sarsa(_) => {
                let t = config.tabular().expect("a tabular kind");
                Agent::Tabular(Box::new(Tabular::new(t, make()?, make()?, seed)?))
            }
            AgentConfig::Dqn(_) => {
                let d = config.dqn().expect("dqn");
                Agent::Dqn(Box::new(Dqn::new(d, make()?, make()?, seed)?))
            }
            AgentConfig::Reinforce(_) => {
                let r = config.reinforce().expect("reinforce");
                Agent::Reinforce(Box::new(Reinforce::new(r, make()?, make()?, seed)?))
            }
            AgentConfig::Ppo(_) => {
                let p = config.ppo().expect("ppo");
                let envs = (0..p.num_envs).map(|_| make()).collect::<Result<Vec<_>, _>>()?;
                Agent::Ppo(Box::new(Ppo::new(p, envs, make()?, seed)?))
            }
        })
    }

    /// Greedy episodes on the agent's evaluation settings.
    pub fn evaluate(&mut self) -> Result<Episodes, TrainError> {
        match self {
            Agent::Tabular(a) => Ok(a.evaluate(None)),
            Agent::Dqn(a) => a.evaluate(None),
            Agent::Reinforce(a) => a.evaluate(None),
            Agent::Ppo(a) => a.evaluate(None),
        }
    }

    /// The agent's parameters.
    pub fn params(&self) -> &trident_nn::Params {
        use trident_train::trainer::Task;
        match self {
            Agent::Tabular(a) => a.params(),
            Agent::Dqn(a) => a.params(),
            Agent::Reinforce(a) => a.params(),
            Agent::Ppo(a) => a.params(),
        }
    }
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

/// Rebuilds the agent of checkpoint `dir` (its `rl.toml` and weights), its evaluation set to
/// `episodes` episodes from `seed` (the run's own when `None`).
pub fn load_checkpoint(
    dir: &Path,
    episodes: Option<u64>,
    seed: Option<u64>,
) -> Result<(RlConfig, Agent), String> {
    let err = |e: TrainError| format!("{}: {e}", dir.display());
    trident_train::checkpoint::verify(dir, &["rl.toml", "model.safetensors"]).map_err(|e| err(e.into()))?;
    let mut config = RlConfig::read(&dir.join("rl.toml"))?;
    config.set_evaluation(episodes, seed);
    let mut agent = Agent::build(&config).map_err(err)?;
    trident_train::checkpoint::load_weights(dir, agent.params()).map_err(|e| err(e.into()))?;
    if let Agent::Tabular(a) = &mut agent {
        a.reload().map_err(err)?;
    }
    Ok((config, agent))
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
