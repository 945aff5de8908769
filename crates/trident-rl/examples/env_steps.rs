//! Environment steps per second of the built-in environments, one copy, uniformly random
//! actions (drawn from a fixed generator), resets included; the peer is
//! `benches/peers/gymnasium_steps.py` on the same ids.
//!
//!     cargo run --release -p trident-rl --example env_steps [STEPS]

use std::time::Instant;
use trident_rl::rng::NpRandom;
use trident_rl::{make, Space, VectorEnv};

fn main() {
    let steps: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    for id in [
        "CartPole-v1",
        "Acrobot-v1",
        "MountainCar-v0",
        "FrozenLake-v1",
        "Taxi-v4",
    ] {
        let mut env = make(id).expect("built in");
        let Space::Discrete(n) = env.action_space() else {
            unreachable!()
        };
        let mut actions = NpRandom::from_seed(1);
        env.reset(Some(0));
        let t = Instant::now();
        let mut episodes = 0u64;
        for _ in 0..steps {
            let a = ((actions.random() * n as f64) as usize).min(n - 1);
            let s = env.step(a);
            if s.terminated || s.truncated {
                env.reset(None);
                episodes += 1;
            }
        }
        let secs = t.elapsed().as_secs_f64();
        println!(
            "{id:<16} {:>12.0} steps/s  ({steps} steps, {episodes} episodes, {secs:.3} s)",
            steps as f64 / secs
        );
    }
    // N copies stepped together with next-step autoreset (gymnasium's vector rules).
    for n in [8usize, 64] {
        let mut envs = VectorEnv::new((0..n).map(|_| make("CartPole-v1").expect("built in")).collect());
        envs.reset(Some(0));
        let mut rng = NpRandom::from_seed(1);
        let iters = (steps / n as u64).max(1);
        let t = Instant::now();
        let mut actions = vec![0; n];
        for _ in 0..iters {
            actions
                .iter_mut()
                .for_each(|a| *a = usize::from(rng.random() < 0.5));
            envs.step(&actions);
        }
        let secs = t.elapsed().as_secs_f64();
        println!(
            "CartPole-v1 x{n:<3} (VectorEnv)         {:>10.0} steps/s",
            (iters * n as u64) as f64 / secs
        );
    }
}
