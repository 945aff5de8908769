//! CartPole-v1 (gymnasium 1.4.0 `classic_control/cartpole.py`): a pole on a cart, pushed
//! left (action 0) or right (1) with 10 N; reward 1 per step, the episode ends when the
//! pole leans past 12° or the cart leaves ±2.4. The state is f64, integrated by Euler steps
//! in gymnasium's order of operations; the observation is its f32 cast.

use crate::env::{Env, Info, Obs, Seeding, Space, Step};

const GRAVITY: f64 = 9.8;
const MASS_CART: f64 = 1.0;
const MASS_POLE: f64 = 0.1;
const TOTAL_MASS: f64 = MASS_POLE + MASS_CART;
/// Half the pole's length.
const LENGTH: f64 = 0.5;
const POLE_MASS_LENGTH: f64 = MASS_POLE * LENGTH;
const FORCE_MAG: f64 = 10.0;
const TAU: f64 = 0.02;
const X_THRESHOLD: f64 = 2.4;
const THETA_THRESHOLD: f64 = 12.0 * 2.0 * std::f64::consts::PI / 360.0;

/// The CartPole environment (without its time limit: [`crate::make`] adds it).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct CartPole {
    seeding: Seeding,
    /// x, ẋ, θ, θ̇.
    #[serde(with = "crate::exact::opt_f64s")]
    state: Option<[f64; 4]>,
    /// Steps taken since the pole fell (gymnasium rewards 0 after the first).
    steps_beyond_terminated: Option<u64>,
}

impl CartPole {
    /// A new environment; reset it before stepping.
    pub fn new() -> Self {
        Self::default()
    }

    /// The f64 state (x, ẋ, θ, θ̇), for drawing and tests.
    pub fn state(&self) -> Option<[f64; 4]> {
        self.state
    }

    fn obs(&self) -> Obs {
        Obs::Values(self.state.expect("reset").map(|v| v as f32).to_vec())
    }
}

impl Env for CartPole {
    crate::serde_snapshot!(seeding, state, steps_beyond_terminated);

    fn observation_space(&self) -> Space {
        let high = [
            X_THRESHOLD * 2.0,
            f64::from(f32::MAX),
            THETA_THRESHOLD * 2.0,
            f64::from(f32::MAX),
        ]
        .map(|v| v as f32);
        Space::Box {
            low: high.map(|v| -v).to_vec(),
            high: high.to_vec(),
        }
    }

    fn action_space(&self) -> Space {
        Space::Discrete(2)
    }

    fn reset(&mut self, seed: Option<u64>) -> (Obs, Info) {
        let rng = self.seeding.reset(seed);
        self.state = Some([0; 4].map(|_| rng.uniform(-0.05, 0.05)));
        self.steps_beyond_terminated = None;
        (self.obs(), Info::default())
    }

    fn step(&mut self, action: usize) -> Step {
        assert!(action < 2, "CartPole-v1: action {action} is not 0 or 1");
        let [mut x, mut x_dot, mut theta, mut theta_dot] = self.state.expect("reset before step");
        let force = if action == 1 { FORCE_MAG } else { -FORCE_MAG };
        let (costheta, sintheta) = (theta.cos(), theta.sin());
        let temp = (force + POLE_MASS_LENGTH * (theta_dot * theta_dot) * sintheta) / TOTAL_MASS;
        let thetaacc = (GRAVITY * sintheta - costheta * temp)
            / (LENGTH * (4.0 / 3.0 - MASS_POLE * (costheta * costheta) / TOTAL_MASS));
        let xacc = temp - POLE_MASS_LENGTH * thetaacc * costheta / TOTAL_MASS;
        x += TAU * x_dot;
        x_dot += TAU * xacc;
        theta += TAU * theta_dot;
        theta_dot += TAU * thetaacc;
        self.state = Some([x, x_dot, theta, theta_dot]);
        let terminated = !(-X_THRESHOLD..=X_THRESHOLD).contains(&x)
            || !(-THETA_THRESHOLD..=THETA_THRESHOLD).contains(&theta);
        let reward = match (terminated, self.steps_beyond_terminated) {
            (false, _) => 1.0,
            (true, None) => {
                self.steps_beyond_terminated = Some(0);
                1.0
            }
            (true, Some(n)) => {
                self.steps_beyond_terminated = Some(n + 1);
                0.0
            }
        };
        Step {
            obs: self.obs(),
            reward,
            terminated,
            truncated: false,
            info: Info::default(),
        }
    }
}
