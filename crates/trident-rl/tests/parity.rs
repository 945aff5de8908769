//! The built-in environments against gymnasium 1.4.0: trajectories recorded from
//! gymnasium (`fixtures/record_gymnasium.py`) replayed step by step, every observation,
//! reward, flag and info entry compared exactly.

use serde_json::Value;
use trident_rl::{make, Info, Obs, VectorEnv};

fn fixtures() -> Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/gymnasium.json"
    ))
    .expect("tests/fixtures/gymnasium.json");
    serde_json::from_str(&text).expect("valid JSON")
}

/// An observation as gymnasium recorded it: an int, or f32 values as their f64.
fn obs_of(v: &Value) -> Obs {
    match v {
        Value::Number(n) => Obs::Index(n.as_u64().expect("a state index") as usize),
        Value::Array(a) => Obs::Values(a.iter().map(|x| x.as_f64().expect("a float") as f32).collect()),
        _ => panic!("an observation: {v}"),
    }
}

fn info_of(v: &Value) -> Info {
    Info {
        prob: v.get("prob").and_then(Value::as_f64),
        action_mask: v
            .get("action_mask")
            .and_then(Value::as_array)
            .map(|m| m.iter().map(|x| x.as_u64() == Some(1)).collect()),
    }
}

#[test]
fn episodes_match_gymnasium_step_for_step() {
    let f = fixtures();
    let mut steps = 0;
    for run in f["episodes"].as_array().expect("episodes") {
        let id = run["env"].as_str().expect("env id");
        let mut env = make(id).expect("a built-in environment");
        for (e, episode) in run["episodes"].as_array().expect("episodes").iter().enumerate() {
            let at = format!("{id} ({} policy), episode {e}", run["policy"]);
            let (obs, info) = env.reset(episode["seed"].as_u64());
            assert_eq!(obs, obs_of(&episode["obs"]), "{at}: reset");
            assert_eq!(info, info_of(&episode["info"]), "{at}: reset info");
            for (t, s) in episode["steps"].as_array().expect("steps").iter().enumerate() {
                let step = env.step(s["action"].as_u64().expect("an action") as usize);
                let at = format!("{at}, step {t}");
                assert_eq!(step.obs, obs_of(&s["obs"]), "{at}: observation");
                assert_eq!(
                    step.reward,
                    s["reward"].as_f64().expect("a reward"),
                    "{at}: reward"
                );
                assert_eq!(step.terminated, s["terminated"] == true, "{at}: terminated");
                assert_eq!(step.truncated, s["truncated"] == true, "{at}: truncated");
                assert_eq!(step.info, info_of(&s["info"]), "{at}: info");
                steps += 1;
            }
        }
    }
    assert!(steps > 1000, "{steps} steps replayed");
}

#[test]
fn vector_environments_autoreset_as_gymnasium() {
    let f = fixtures();
    for run in f["vectors"].as_array().expect("vectors") {
        let id = run["env"].as_str().expect("env id");
        let n = run["n"].as_u64().expect("n") as usize;
        let mut envs = VectorEnv::new((0..n).map(|_| make(id).expect("built in")).collect());
        let flat = |obs: Vec<Obs>| -> Vec<f64> {
            obs.into_iter()
                .flat_map(|o| match o {
                    Obs::Index(i) => vec![i as f64],
                    Obs::Values(v) => v.into_iter().map(f64::from).collect(),
                })
                .collect()
        };
        // serde_json parses to within an ulp of f64: compared at the f32 they were recorded in.
        // serde_json parses to within an ulp of f64: values are compared at the f32
        // gymnasium recorded them in (rewards and indices are exact there too).
        let expect = |v: &Value| -> Vec<f64> {
            v.as_array()
                .expect("values")
                .iter()
                .map(|x| f64::from(x.as_f64().unwrap() as f32))
                .collect()
        };
        let reset = envs.reset(run["seed"].as_u64());
        assert_eq!(
            flat(reset.into_iter().map(|(o, _)| o).collect()),
            expect(&run["obs"]),
            "{id}: reset"
        );
        for (t, s) in run["steps"].as_array().expect("steps").iter().enumerate() {
            let actions: Vec<usize> = s["actions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_u64().unwrap() as usize)
                .collect();
            let steps = envs.step(&actions);
            let at = format!("{id} x{n}, step {t}");
            assert_eq!(
                flat(steps.iter().map(|s| s.obs.clone()).collect()),
                expect(&s["obs"]),
                "{at}: observations"
            );
            assert_eq!(
                steps.iter().map(|s| s.reward).collect::<Vec<_>>(),
                expect(&s["reward"]),
                "{at}: rewards"
            );
            let flags =
                |k: &str| -> Vec<bool> { s[k].as_array().unwrap().iter().map(|b| b == true).collect() };
            assert_eq!(
                steps.iter().map(|s| s.terminated).collect::<Vec<_>>(),
                flags("terminated"),
                "{at}"
            );
            assert_eq!(
                steps.iter().map(|s| s.truncated).collect::<Vec<_>>(),
                flags("truncated"),
                "{at}"
            );
        }
    }
}

#[test]
fn unknown_environments_are_named() {
    let e = make("CartPole-v0").err().expect("refused").to_string();
    assert!(e.contains("CartPole-v0") && e.contains("CartPole-v1"), "{e}");
}

#[test]
fn spaces_are_gymnasiums() {
    let e = make("Taxi-v4").unwrap();
    assert_eq!(e.observation_space(), trident_rl::Space::Discrete(500));
    assert_eq!(e.action_space(), trident_rl::Space::Discrete(6));
    let c = make("CartPole-v1").unwrap();
    assert_eq!(c.observation_space().size(), 4);
    assert_eq!(make("Acrobot-v1").unwrap().observation_space().size(), 6);
}
