//! `trident rl`: trains an agent from a TOML file (`[run]`, `[env]`, `[agent]`, `[train]`).

use anyhow::Context;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

#[derive(Debug, clap::Args)]
pub struct RlArgs {
    /// The run's TOML configuration.
    #[arg(long)]
    config: PathBuf,
    /// Continue the run in `run.dir` from its `last` checkpoint.
    #[arg(long)]
    resume: bool,
    /// Stop (checkpointing, as on Ctrl-C) after this many iterations.
    #[arg(long, hide = true)]
    stop_after_steps: Option<u64>,
}

/// `trident eval` of an agent: its greedy policy on seeded episodes.
pub fn evaluate(dir: &std::path::Path, episodes: Option<u64>, seed: Option<u64>) -> anyhow::Result<()> {
    let (config, out) =
        trident_rl::run::evaluate_checkpoint(dir, episodes, seed).map_err(anyhow::Error::msg)?;
    let (mean, std) = out.return_stats();
    let best = out.returns.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let worst = out.returns.iter().copied().fold(f64::INFINITY, f64::min);
    println!(
        "{} ({}): greedy return {mean:.4} ± {std:.4} over {} seeded episodes (min {worst}, max {best}, mean length {:.1})",
        config.env.id,
        dir.display(),
        out.returns.len(),
        out.mean_length()
    );
    Ok(())
}

pub fn run(args: RlArgs) -> anyhow::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handler")?;
    }
    let text = std::fs::read_to_string(&args.config).with_context(|| args.config.display().to_string())?;
    let config = trident_rl::config::RlConfig::parse(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.config.display()))?;
    let options = trident_rl::run::RunOptions {
        resume: args.resume,
        progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        stop: Some(stop),
        stop_after_steps: args.stop_after_steps,
    };
    let out = trident_rl::run::run(&config, &text, options)?;
    let dir = config.run.dir.display();
    if out.summary.interrupted {
        println!("interrupted: {dir}/last holds the run; continue with --resume");
        return Ok(());
    }
    for r in &out.summary.records {
        let f = |k: &str| r.metric(k).unwrap_or(f64::NAN);
        let epsilon = r
            .metric("epsilon")
            .map(|e| format!("  ε {e:.3}"))
            .unwrap_or_default();
        println!(
            "epoch {:>3}  episodic return {:>9.3}  greedy return {:>9.3} ± {:.3}{epsilon}",
            r.epoch + 1,
            f("episodic_return"),
            f("eval_return"),
            f("eval_return_std"),
        );
    }
    let (mean, std) = out.evaluation.return_stats();
    println!(
        "{}: greedy return {mean:.4} ± {std:.4} over {} seeded episodes (mean length {:.1}); checkpoints in {dir}/best and {dir}/last",
        config.env.id,
        out.evaluation.returns.len(),
        out.evaluation.mean_length()
    );
    Ok(())
}
