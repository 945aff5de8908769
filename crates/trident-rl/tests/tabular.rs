//! Tabular agents through `trident rl`'s run: they learn FrozenLake and Taxi to the
//! reference figures, and a run interrupted mid-epoch resumes to the same table.

use trident_rl::config::RlConfig;
use trident_rl::run::{run, RunOptions};

fn config(dir: &std::path::Path, body: &str) -> (RlConfig, String) {
    let text = format!("[run]\ndir = {:?}\nseed = 0\n{body}", dir.display().to_string());
    (RlConfig::parse(&text).expect("a valid config"), text)
}

const FROZEN_LAKE: &str = r#"
[env]
id = "FrozenLake-v1"
[agent]
kind = "q_learning"
alpha = 0.05
gamma = 0.99
steps_per_epoch = 60000
steps_per_iteration = 2000
eval_episodes = 1000
[train]
epochs = 10
"#;

#[test]
fn q_learning_solves_frozen_lake() {
    let dir = tempfile::tempdir().unwrap();
    let (c, text) = config(&dir.path().join("run"), FROZEN_LAKE);
    let out = run(&c, &text, RunOptions::default()).expect("trains");
    let (success, _) = out.evaluation.return_stats();
    let best = out
        .summary
        .records
        .iter()
        .filter_map(|r| r.metric("eval_return"))
        .fold(f64::NAN, f64::max);
    eprintln!("FrozenLake-v1 greedy success: final {success:.3}, best epoch {best:.3}");
    assert!(
        success >= 0.70,
        "greedy success {success} after 600k steps (optimum 0.744)"
    );
    // `trident eval` of the best checkpoint: the same episodes give the best epoch's figure.
    let (_, again) = trident_rl::run::evaluate_checkpoint(&dir.path().join("run/best"), None, None).unwrap();
    assert_eq!(
        again.return_stats().0,
        best,
        "the best checkpoint's greedy policy"
    );
    for f in [
        "metrics.jsonl",
        "returns.png",
        "loss.png",
        "episodes/epoch-001.gif",
        "episodes/epoch-010.gif",
        "best/agent.json",
        "best/env.json",
        "last/model.safetensors",
        "best/rl.toml",
    ] {
        assert!(dir.path().join("run").join(f).exists(), "{f}");
    }
}

const TAXI_SHORT: &str = r#"
[env]
id = "Taxi-v4"
[agent]
kind = "sarsa"
alpha = 0.1
steps_per_epoch = 20000
steps_per_iteration = 1000
eval_episodes = 20
[train]
epochs = 3
"#;

/// The table and the evaluation figures of a finished run.
fn outcome(dir: &std::path::Path) -> (Vec<u8>, Vec<f64>) {
    let table = std::fs::read(dir.join("last/model.safetensors")).unwrap();
    let returns = std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|v| v["figures"]["eval_return"].as_f64().unwrap())
        .collect();
    (table, returns)
}

/// Runs `body` whole, and again stopped after `stop` iterations and resumed: both end with
/// the same weights and the same evaluation figures, epoch by epoch.
fn assert_resumes_exactly(body: &str, stop: u64) {
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("whole");
    let (c, text) = config(&whole, body);
    run(&c, &text, RunOptions::default()).unwrap();
    let cut = dir.path().join("cut");
    let (c, text) = config(&cut, body);
    let first = RunOptions {
        stop_after_steps: Some(stop),
        ..Default::default()
    };
    assert!(
        run(&c, &text, first).unwrap().summary.interrupted,
        "stopped mid-run"
    );
    let again = RunOptions {
        resume: true,
        ..Default::default()
    };
    run(&c, &text, again).unwrap();
    assert_eq!(outcome(&whole), outcome(&cut), "resumed run ≠ uninterrupted run");
}

#[test]
fn an_interrupted_run_resumes_to_the_same_table() {
    assert_resumes_exactly(TAXI_SHORT, 27);
}

#[test]
fn bad_settings_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[run]\ndir = {:?}\n[env]\nid = \"FrozenLake-v1\"\n[agent]\nkind = \"q_learning\"\nalpha = 0.1\nsteps_per_epoch = 100\nstep_per_iteration = 10\n",
        dir.path().display().to_string()
    );
    let e = RlConfig::parse(&text).unwrap_err();
    assert!(e.contains("line 9") && e.contains("step_per_iteration"), "{e}");
    let e = RlConfig::parse(
        &text
            .replace("FrozenLake-v1", "FrozenLake-v9")
            .replace("step_per", "steps_per"),
    )
    .unwrap_err();
    assert!(e.contains("env.id") && e.contains("FrozenLake-v9"), "{e}");
}

#[test]
fn every_shipped_rl_configuration_is_accepted() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/rl");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            RlConfig::read(&path).unwrap_or_else(|e| panic!("{e}"));
            checked += 1;
        }
    }
    assert!(checked >= 2, "{checked} configurations under examples/rl");
}

const DQN_SHORT: &str = r#"
[env]
id = "CartPole-v1"
[agent]
kind = "dqn"
hidden = [32, 32]
learning_starts = 200
train_frequency = 50
gradient_steps = 4
target_update_interval = 100
buffer_size = 1000
batch_size = 16
steps_per_epoch = 600
steps_per_iteration = 100
eval_episodes = 2
[train]
epochs = 2
"#;

#[test]
fn an_interrupted_dqn_run_resumes_to_the_same_network() {
    assert_resumes_exactly(DQN_SHORT, 4);
}

const REINFORCE_SHORT: &str = r#"
[env]
id = "CartPole-v1"
[agent]
kind = "reinforce"
hidden = [16]
episodes_per_epoch = 12
episodes_per_iteration = 2
eval_episodes = 2
[train]
epochs = 2
"#;

#[test]
fn an_interrupted_reinforce_run_resumes_to_the_same_networks() {
    assert_resumes_exactly(REINFORCE_SHORT, 3);
}

const PPO_SHORT: &str = r#"
[env]
id = "CartPole-v1"
[agent]
kind = "ppo"
hidden = [16]
num_envs = 2
num_steps = 32
num_minibatches = 2
update_epochs = 2
steps_per_epoch = 256
eval_episodes = 2
[train]
epochs = 2
"#;

#[test]
fn an_interrupted_ppo_run_resumes_to_the_same_networks() {
    assert_resumes_exactly(PPO_SHORT, 3);
}

#[test]
fn environment_options_reach_the_lake() {
    let dir = tempfile::tempdir().unwrap();
    let body = r#"
[env]
id = "FrozenLake-v1"
is_slippery = false
map = ["SFF", "FHF", "FFG"]
[agent]
kind = "q_learning"
alpha = 0.5
steps_per_epoch = 2000
steps_per_iteration = 500
eval_episodes = 5
[train]
epochs = 2
"#;
    let (c, text) = config(&dir.path().join("run"), body);
    let out = run(&c, &text, RunOptions::default()).unwrap();
    // Ice that does not slip on a 3x3 map: the greedy path always arrives.
    assert_eq!(out.evaluation.return_stats().0, 1.0);
    assert_eq!(out.evaluation.mean_length(), 4.0);
    let bad = |extra: &str| {
        let text = format!("[run]\ndir = \"x\"\n[env]\n{extra}\n[agent]\nkind = \"q_learning\"\nalpha = 0.5\nsteps_per_epoch = 10\nsteps_per_iteration = 10\n");
        RlConfig::parse(&text).unwrap_err()
    };
    assert!(bad("id = \"Taxi-v4\"\nis_slippery = false").contains("FrozenLake"));
    assert!(bad("id = \"FrozenLake-v1\"\nmap = [\"SFX\"]").contains("env.map"));
    assert!(bad("id = \"FrozenLake-v1\"\nsuccess_rate = 2.0").contains("env.success_rate"));
}
