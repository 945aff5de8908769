//! `trident rl`: a run of an agent on Trident's training loop, from its TOML.

use crate::agent::dqn::Dqn;
use crate::agent::ppo::Ppo;
use crate::agent::reinforce::Reinforce;
use crate::agent::tabular::Tabular;
use crate::agent::{Episodes, Iterations};
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
    let env = crate::make(&config.env.id).map_err(|e| TrainError::Invalid(e.to_string()))?;
    let eval_env = crate::make(&config.env.id).map_err(|e| TrainError::Invalid(e.to_string()))?;
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
    if let Some(t) = config.tabular() {
        let mut agent = Tabular::new(t, env, eval_env, seed)?;
        let summary = trainer.run(&mut agent, &source, options.resume, &hash)?;
        let evaluation = agent.evaluate(None);
        return Ok(RlOutcome { summary, evaluation });
    }
    if let Some(p) = config.ppo() {
        let mut envs = Vec::with_capacity(p.num_envs);
        for _ in 0..p.num_envs {
            envs.push(crate::make(&config.env.id).map_err(|e| TrainError::Invalid(e.to_string()))?);
        }
        drop(env);
        let mut agent = Ppo::new(p, envs, eval_env, seed)?;
        let summary = trainer.run(&mut agent, &source, options.resume, &hash)?;
        let evaluation = agent.evaluate(None)?;
        return Ok(RlOutcome { summary, evaluation });
    }
    if let Some(r) = config.reinforce() {
        let mut agent = Reinforce::new(r, env, eval_env, seed)?;
        let summary = trainer.run(&mut agent, &source, options.resume, &hash)?;
        let evaluation = agent.evaluate(None)?;
        return Ok(RlOutcome { summary, evaluation });
    }
    let d = config
        .dqn()
        .expect("the agent kinds are tabular, reinforce or dqn");
    let mut agent = Dqn::new(d, env, eval_env, seed)?;
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
