//! `trident rl`, `trident eval` and `trident export` on agents: a short run writes its
//! checkpoints, plots and episode GIFs; the exported policy plays the same greedy episodes
//! as the checkpoint on both ONNX engines.

mod common;

use common::{failed, ok, trident};

/// The summary line's figures after "greedy return".
fn greedy(line: &str) -> String {
    let at = line
        .find("greedy return")
        .unwrap_or_else(|| panic!("a summary: {line}"));
    line[at..].to_string()
}

#[test]
fn exported_policies_play_like_their_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let configs = [
        (
            "taxi",
            "[env]\nid = \"Taxi-v4\"\n[agent]\nkind = \"q_learning\"\nalpha = 0.1\nsteps_per_epoch = 40000\nsteps_per_iteration = 10000\neval_episodes = 20\n[train]\nepochs = 2\n",
        ),
        (
            "ppo",
            "[env]\nid = \"CartPole-v1\"\n[agent]\nkind = \"ppo\"\nhidden = [16]\nnum_envs = 2\nnum_steps = 64\nsteps_per_epoch = 512\neval_episodes = 3\n[train]\nepochs = 2\n",
        ),
    ];
    for (name, body) in configs {
        let file = d.join(format!("{name}.toml"));
        std::fs::write(&file, format!("[run]\ndir = \"{name}\"\nseed = 1\n{body}")).unwrap();
        let out = ok(&trident(&["rl", "--config", file.to_str().unwrap()], d));
        assert!(out.contains("greedy return"), "{out}");
        for f in ["best/rl.toml", "returns.png", "episodes/epoch-002.gif"] {
            assert!(d.join(name).join(f).exists(), "{name}/{f}");
        }
        let best = format!("{name}/best");
        let checkpoint = greedy(&ok(&trident(&["eval", "--model", &best, "--episodes", "5"], d)));
        let onnx = format!("{name}.onnx");
        ok(&trident(&["export", "--model", &best, "--out", &onnx], d));
        for engine in ["tract", "ort"] {
            if engine == "ort" && !cfg!(feature = "ort") {
                continue;
            }
            let exported = greedy(&ok(&trident(
                &[
                    "eval",
                    "--model",
                    &best,
                    "--episodes",
                    "5",
                    "--onnx",
                    &onnx,
                    "--engine",
                    engine,
                ],
                d,
            )));
            assert_eq!(exported, checkpoint, "{name} on {engine}");
        }
    }
    let e = failed(&trident(&["eval", "--model", "taxi/best", "--data", "x.csv"], d));
    assert!(e.contains("seeded episodes"), "{e}");
}
