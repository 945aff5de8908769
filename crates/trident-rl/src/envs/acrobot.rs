//! Acrobot-v1 (gymnasium 1.4.0 `classic_control/acrobot.py`, the "book" dynamics): two
//! links, torque −1, 0 or +1 on the joint between them; reward −1 per step until the free
//! end swings above the bar (−cos θ₁ − cos(θ₁ + θ₂) > 1). One 0.2 s step is one fourth-order
//! Runge–Kutta step, in gymnasium's order of operations.

use crate::env::{Env, Info, Obs, Seeding, Space, Step};
use std::f64::consts::PI;

const DT: f64 = 0.2;
const LINK_LENGTH_1: f64 = 1.0;
const LINK_MASS_1: f64 = 1.0;
const LINK_MASS_2: f64 = 1.0;
const LINK_COM_POS_1: f64 = 0.5;
const LINK_COM_POS_2: f64 = 0.5;
const LINK_MOI: f64 = 1.0;
const MAX_VEL_1: f64 = 4.0 * PI;
const MAX_VEL_2: f64 = 9.0 * PI;
const AVAIL_TORQUE: [f64; 3] = [-1.0, 0.0, 1.0];

/// The Acrobot environment (without its time limit: [`crate::make`] adds it).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Acrobot {
    seeding: Seeding,
    /// θ₁, θ₂, θ̇₁, θ̇₂.
    #[serde(with = "crate::exact::opt_f64s")]
    state: Option<[f64; 4]>,
}

impl Acrobot {
    /// A new environment; reset it before stepping.
    pub fn new() -> Self {
        Self::default()
    }

    /// The f64 state (θ₁, θ₂, θ̇₁, θ̇₂), for drawing and tests.
    pub fn state(&self) -> Option<[f64; 4]> {
        self.state
    }

    fn obs(&self) -> Obs {
        let s = self.state.expect("reset");
        Obs::Values(
            [s[0].cos(), s[0].sin(), s[1].cos(), s[1].sin(), s[2], s[3]]
                .map(|v| v as f32)
                .to_vec(),
        )
    }

    /// The observation of a reset state, which gymnasium holds in f32: its angles' cosines
    /// and sines computed in f32.
    fn reset_obs(&self) -> Obs {
        let s = self.state.expect("reset").map(|v| v as f32);
        Obs::Values(vec![s[0].cos(), s[0].sin(), s[1].cos(), s[1].sin(), s[2], s[3]])
    }
}

/// The time derivative of (θ₁, θ₂, θ̇₁, θ̇₂, torque), the torque held.
fn dsdt(s: [f64; 5]) -> [f64; 5] {
    let (m1, m2, l1, lc1, lc2) = (
        LINK_MASS_1,
        LINK_MASS_2,
        LINK_LENGTH_1,
        LINK_COM_POS_1,
        LINK_COM_POS_2,
    );
    let (i1, i2, g) = (LINK_MOI, LINK_MOI, 9.8);
    let [theta1, theta2, dtheta1, dtheta2, a] = s;
    let d1 = m1 * (lc1 * lc1) + m2 * (l1 * l1 + lc2 * lc2 + 2.0 * l1 * lc2 * theta2.cos()) + i1 + i2;
    let d2 = m2 * (lc2 * lc2 + l1 * lc2 * theta2.cos()) + i2;
    let phi2 = m2 * lc2 * g * (theta1 + theta2 - PI / 2.0).cos();
    let phi1 = -m2 * l1 * lc2 * (dtheta2 * dtheta2) * theta2.sin()
        - 2.0 * m2 * l1 * lc2 * dtheta2 * dtheta1 * theta2.sin()
        + (m1 * lc1 + m2 * l1) * g * (theta1 - PI / 2.0).cos()
        + phi2;
    let ddtheta2 = (a + d2 / d1 * phi1 - m2 * l1 * lc2 * (dtheta1 * dtheta1) * theta2.sin() - phi2)
        / (m2 * (lc2 * lc2) + i2 - (d2 * d2) / d1);
    let ddtheta1 = -(d2 * ddtheta2 + phi1) / d1;
    [dtheta1, dtheta2, ddtheta1, ddtheta2, 0.0]
}

/// One Runge–Kutta step of `DT` from `y0`, as gymnasium's `rk4` over `[0, dt]`.
fn rk4(y0: [f64; 5]) -> [f64; 5] {
    let dt = DT - 0.0;
    let dt2 = dt / 2.0;
    let add = |y: [f64; 5], h: f64, k: [f64; 5]| std::array::from_fn(|j| y[j] + h * k[j]);
    let k1 = dsdt(y0);
    let k2 = dsdt(add(y0, dt2, k1));
    let k3 = dsdt(add(y0, dt2, k2));
    let k4 = dsdt(add(y0, dt, k3));
    let h = dt / 6.0;
    std::array::from_fn(|j| y0[j] + h * (k1[j] + 2.0 * k2[j] + 2.0 * k3[j] + k4[j]))
}

/// `x` brought into `[m, M]` by whole turns (gymnasium's `wrap`).
fn wrap(mut x: f64, m: f64, big_m: f64) -> f64 {
    let diff = big_m - m;
    while x > big_m {
        x -= diff;
    }
    while x < m {
        x += diff;
    }
    x
}

impl Env for Acrobot {
    crate::serde_snapshot!(seeding, state);

    fn observation_space(&self) -> Space {
        let high = [1.0, 1.0, 1.0, 1.0, MAX_VEL_1 as f32, MAX_VEL_2 as f32];
        Space::Box {
            low: high.map(|v| -v).to_vec(),
            high: high.to_vec(),
        }
    }

    fn action_space(&self) -> Space {
        Space::Discrete(3)
    }

    fn reset(&mut self, seed: Option<u64>) -> (Obs, Info) {
        let rng = self.seeding.reset(seed);
        // gymnasium keeps the reset state in f32.
        self.state = Some([0; 4].map(|_| f64::from(rng.uniform(-0.1, 0.1) as f32)));
        (self.reset_obs(), Info::default())
    }

    fn step(&mut self, action: usize) -> Step {
        assert!(action < 3, "Acrobot-v1: action {action} is not 0, 1 or 2");
        let s = self.state.expect("reset before step");
        let ns = rk4([s[0], s[1], s[2], s[3], AVAIL_TORQUE[action]]);
        let state = [
            wrap(ns[0], -PI, PI),
            wrap(ns[1], -PI, PI),
            ns[2].clamp(-MAX_VEL_1, MAX_VEL_1),
            ns[3].clamp(-MAX_VEL_2, MAX_VEL_2),
        ];
        self.state = Some(state);
        let terminated = -state[0].cos() - (state[1] + state[0]).cos() > 1.0;
        Step {
            obs: self.obs(),
            reward: if terminated { 0.0 } else { -1.0 },
            terminated,
            truncated: false,
            info: Info::default(),
        }
    }
}
