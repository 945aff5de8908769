//! FrozenLake-v1 (gymnasium 1.4.0 `toy_text/frozen_lake.py`): walk from S to G on a frozen
//! lake without falling into a hole (H); on slippery ice the agent moves in the intended
//! direction with probability `success_rate` (1/3) and to either side otherwise. Actions:
//! 0 left, 1 down, 2 right, 3 up. Reward 1 at G.

use crate::env::{Env, Info, Obs, Seeding, Space, Step};

/// The 4x4 map (`map_name="4x4"`).
pub const MAP_4X4: [&str; 4] = ["SFFF", "FHFH", "FFFH", "HFFG"];
/// The 8x8 map (`map_name="8x8"`, FrozenLake8x8-v1).
pub const MAP_8X8: [&str; 8] = [
    "SFFFFFFF", "FFFFFFFF", "FFFHFFFF", "FFFFFHFF", "FFFHFFFF", "FHHFFFHF", "FHFFHFHF", "FFFHFFFG",
];

/// A transition: probability, next state, reward, terminated.
type Transition = (f64, usize, f64, bool);

/// The FrozenLake environment (without its time limit: [`crate::make`] adds it).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct FrozenLake {
    seeding: Seeding,
    /// Per state and action, the possible transitions in gymnasium's order.
    #[serde(skip)]
    p: Vec<[Vec<Transition>; 4]>,
    #[serde(skip)]
    initial: Vec<f64>,
    state: Option<usize>,
}

impl FrozenLake {
    /// The lake of `map` (rows of S, F, H, G), slippery or not, with the probability of
    /// moving as intended on slippery ice (gymnasium's default 1/3) and the rewards for
    /// reaching G, H and F (gymnasium's default `(1, 0, 0)`).
    pub fn new(map: &[&str], slippery: bool, success_rate: f64, reward_schedule: [f64; 3]) -> Self {
        let desc: Vec<&[u8]> = map.iter().map(|r| r.as_bytes()).collect();
        let (nrow, ncol) = (desc.len(), desc[0].len());
        let cells = nrow * ncol;
        let starts = desc
            .iter()
            .flat_map(|r| r.iter())
            .filter(|&&c| c == b'S')
            .count()
            .max(1);
        let initial = desc
            .iter()
            .flat_map(|r| r.iter())
            .map(|&c| if c == b'S' { 1.0 / starts as f64 } else { 0.0 })
            .collect();
        let fail_rate = (1.0 - success_rate) / 2.0;
        let inc = |row: usize, col: usize, a: usize| match a {
            0 => (row, col.saturating_sub(1)),
            1 => ((row + 1).min(nrow - 1), col),
            2 => (row, (col + 1).min(ncol - 1)),
            _ => (row.saturating_sub(1), col),
        };
        let outcome = |row: usize, col: usize, a: usize| {
            let (r, c) = inc(row, col, a);
            let letter = desc[r][c];
            let reward = match letter {
                b'G' => reward_schedule[0],
                b'H' => reward_schedule[1],
                _ => reward_schedule[2],
            };
            (r * ncol + c, reward, matches!(letter, b'G' | b'H'))
        };
        let mut p = Vec::with_capacity(cells);
        for (row, letters) in desc.iter().enumerate() {
            for (col, &letter) in letters.iter().enumerate() {
                let s = row * ncol + col;
                p.push(std::array::from_fn(|a| {
                    if matches!(letter, b'G' | b'H') {
                        vec![(1.0, s, 0.0, true)]
                    } else if slippery {
                        [(a + 3) % 4, a, (a + 1) % 4]
                            .into_iter()
                            .map(|b| {
                                let (next, reward, done) = outcome(row, col, b);
                                (if b == a { success_rate } else { fail_rate }, next, reward, done)
                            })
                            .collect()
                    } else {
                        let (next, reward, done) = outcome(row, col, a);
                        vec![(1.0, next, reward, done)]
                    }
                }));
            }
        }
        FrozenLake {
            seeding: Seeding::default(),
            p,
            initial,
            state: None,
        }
    }

    /// The transitions from `state` under `action`: (probability, next state, reward,
    /// terminated), gymnasium's `env.P[state][action]`.
    pub fn transitions(&self, state: usize, action: usize) -> &[(f64, usize, f64, bool)] {
        &self.p[state][action]
    }
}

impl Env for FrozenLake {
    crate::serde_snapshot!(seeding, state);

    fn observation_space(&self) -> Space {
        Space::Discrete(self.p.len())
    }

    fn action_space(&self) -> Space {
        Space::Discrete(4)
    }

    fn reset(&mut self, seed: Option<u64>) -> (Obs, Info) {
        let s = self.seeding.reset(seed).categorical(&self.initial);
        self.state = Some(s);
        let info = Info {
            prob: Some(1.0),
            ..Info::default()
        };
        (Obs::Index(s), info)
    }

    fn step(&mut self, action: usize) -> Step {
        assert!(action < 4, "FrozenLake-v1: action {action} is not 0..4");
        let transitions = &self.p[self.state.expect("reset before step")][action];
        let probs: Vec<f64> = transitions.iter().map(|t| t.0).collect();
        let i = self.seeding.rng().categorical(&probs);
        let (prob, next, reward, terminated) = transitions[i];
        self.state = Some(next);
        Step {
            obs: Obs::Index(next),
            reward,
            terminated,
            truncated: false,
            info: Info {
                prob: Some(prob),
                ..Info::default()
            },
        }
    }
}
