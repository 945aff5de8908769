//! Reinforcement learning in Trident: environments that replay gymnasium 1.4.0's exactly
//! (dynamics, rewards, time limits and seeded resets, numpy's generator included), behind a
//! small [`Env`] trait a user's own environment implements too, and a vectorised runner
//! with gymnasium's autoreset rule.

pub mod agent;
pub mod config;
pub mod env;
pub mod envs;
mod exact;
pub mod render;
pub mod rng;
pub mod run;
pub mod vector;

pub use env::{Env, Info, Obs, Space, Step, TimeLimit};
pub use vector::VectorEnv;

/// Why an environment could not be made.
#[derive(Debug, thiserror::Error)]
pub enum RlError {
    /// An id no built-in environment has.
    #[error("unknown environment `{id}`: one of {}", ENV_IDS.join(", "), id = .0)]
    UnknownEnv(String),
}

/// The built-in environments' ids, as gymnasium registers them.
pub const ENV_IDS: [&str; 6] = [
    "CartPole-v1",
    "MountainCar-v0",
    "Acrobot-v1",
    "FrozenLake-v1",
    "FrozenLake8x8-v1",
    "Taxi-v4",
];

/// FrozenLake-v1 or FrozenLake8x8-v1 (`id`) on `map` (the id's own when `None`), slippery
/// or not, moving as intended with probability `success_rate` on slippery ice; with the id's
/// time limit (100 or 200 steps).
pub fn lake(id: &str, map: Option<&[&str]>, slippery: bool, success_rate: f64) -> Box<dyn Env> {
    use envs::{frozen_lake, FrozenLake};
    let (own, limit): (&[&str], u64) = match id {
        "FrozenLake-v1" => (&frozen_lake::MAP_4X4, 100),
        _ => (&frozen_lake::MAP_8X8, 200),
    };
    let env = FrozenLake::new(map.unwrap_or(own), slippery, success_rate, [1.0, 0.0, 0.0]);
    Box::new(TimeLimit::new(env, limit))
}

/// gymnasium's `make(id)`: the environment with its registered time limit (CartPole 500,
/// MountainCar 200, Acrobot 500, FrozenLake 100, FrozenLake8x8 200, Taxi 200 steps).
pub fn make(id: &str) -> Result<Box<dyn Env>, RlError> {
    use envs::*;
    Ok(match id {
        "CartPole-v1" => Box::new(TimeLimit::new(CartPole::new(), 500)),
        "MountainCar-v0" => Box::new(TimeLimit::new(MountainCar::new(), 200)),
        "Acrobot-v1" => Box::new(TimeLimit::new(Acrobot::new(), 500)),
        "FrozenLake-v1" | "FrozenLake8x8-v1" => lake(id, None, true, 1.0 / 3.0),
        "Taxi-v4" => Box::new(TimeLimit::new(Taxi::new(), 200)),
        _ => return Err(RlError::UnknownEnv(id.to_string())),
    })
}
