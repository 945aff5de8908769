//! MountainCar-v0 (gymnasium 1.4.0 `classic_control/mountain_car.py`): an underpowered car
//! in a valley must rock to the flag at x ≥ 0.5; actions push left (0), not at all (1) or
//! right (2); reward −1 per step.

use crate::env::{Env, Info, Obs, Seeding, Space, Step};

const MIN_POSITION: f64 = -1.2;
const MAX_POSITION: f64 = 0.6;
const MAX_SPEED: f64 = 0.07;
const GOAL_POSITION: f64 = 0.5;
const GOAL_VELOCITY: f64 = 0.0;
const FORCE: f64 = 0.001;
const GRAVITY: f64 = 0.0025;

/// The MountainCar environment (without its time limit: [`crate::make`] adds it).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct MountainCar {
    seeding: Seeding,
    /// Position and velocity.
    #[serde(with = "crate::exact::opt_f64s")]
    state: Option<[f64; 2]>,
}

impl MountainCar {
    /// A new environment; reset it before stepping.
    pub fn new() -> Self {
        Self::default()
    }

    fn obs(&self) -> Obs {
        Obs::Values(self.state.expect("reset").map(|v| v as f32).to_vec())
    }
}

impl Env for MountainCar {
    crate::serde_snapshot!(seeding, state);

    fn observation_space(&self) -> Space {
        Space::Box {
            low: vec![MIN_POSITION as f32, -MAX_SPEED as f32],
            high: vec![MAX_POSITION as f32, MAX_SPEED as f32],
        }
    }

    fn action_space(&self) -> Space {
        Space::Discrete(3)
    }

    fn reset(&mut self, seed: Option<u64>) -> (Obs, Info) {
        let rng = self.seeding.reset(seed);
        self.state = Some([rng.uniform(-0.6, -0.4), 0.0]);
        (self.obs(), Info::default())
    }

    fn step(&mut self, action: usize) -> Step {
        assert!(action < 3, "MountainCar-v0: action {action} is not 0, 1 or 2");
        let [mut position, mut velocity] = self.state.expect("reset before step");
        velocity += (action as f64 - 1.0) * FORCE + (3.0 * position).cos() * (-GRAVITY);
        velocity = velocity.clamp(-MAX_SPEED, MAX_SPEED);
        position += velocity;
        position = position.clamp(MIN_POSITION, MAX_POSITION);
        if position == MIN_POSITION && velocity < 0.0 {
            velocity = 0.0;
        }
        let terminated = position >= GOAL_POSITION && velocity >= GOAL_VELOCITY;
        self.state = Some([position, velocity]);
        Step {
            obs: self.obs(),
            reward: -1.0,
            terminated,
            truncated: false,
            info: Info::default(),
        }
    }
}
