//! Taxi-v4 (gymnasium 1.4.0 `toy_text/taxi.py`, its default dry road and patient
//! passenger): a taxi on a 5x5 grid with walls picks a passenger up at one of four
//! landmarks and drops them at another. State `((row·5 + col)·5 + passenger)·4 + destination`
//! (passenger 4: in the taxi); actions 0 south, 1 north, 2 east, 3 west, 4 pickup, 5
//! dropoff; reward −1 per step, +20 for the right dropoff (which ends the episode), −10 for
//! an illegal pickup or dropoff.

use crate::env::{Env, Info, Obs, Seeding, Space, Step};

/// The road map: `:` open, `|` a wall between two cells.
pub const MAP: [&str; 7] = [
    "+---------+",
    "|R: | : :G|",
    "| : | : : |",
    "| : : : : |",
    "| | : | : |",
    "|Y| : |B: |",
    "+---------+",
];
const LOCS: [(usize, usize); 4] = [(0, 0), (0, 4), (4, 0), (4, 3)];
const STATES: usize = 500;

/// The Taxi environment (without its time limit: [`crate::make`] adds it).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Taxi {
    seeding: Seeding,
    /// Per state and action: next state, reward, terminated.
    #[serde(skip)]
    p: Vec<[(usize, f64, bool); 6]>,
    #[serde(skip)]
    initial: Vec<f64>,
    state: Option<usize>,
}

/// The state of a taxi position, passenger place and destination.
pub fn encode(row: usize, col: usize, passenger: usize, destination: usize) -> usize {
    ((row * 5 + col) * 5 + passenger) * 4 + destination
}

/// (row, col, passenger, destination) of a state.
pub fn decode(s: usize) -> (usize, usize, usize, usize) {
    (s / 100, s / 20 % 5, s / 4 % 5, s % 4)
}

/// Whether the map's character at `(1 + row, column)` is open (`:`).
fn open(row: usize, column: usize) -> bool {
    MAP[1 + row].as_bytes()[column] == b':'
}

impl Default for Taxi {
    fn default() -> Self {
        Self::new()
    }
}

impl Taxi {
    /// A new environment; reset it before stepping.
    pub fn new() -> Self {
        let mut initial = vec![0.0; STATES];
        let mut p = vec![[(0, 0.0, false); 6]; STATES];
        for row in 0..5 {
            for col in 0..5 {
                for pass in 0..5 {
                    for dest in 0..4 {
                        let s = encode(row, col, pass, dest);
                        if pass < 4 && pass != dest {
                            initial[s] += 1.0;
                        }
                        for (a, slot) in p[s].iter_mut().enumerate() {
                            *slot = dry_transition(row, col, pass, dest, a);
                        }
                    }
                }
            }
        }
        let total: f64 = initial.iter().sum();
        initial.iter_mut().for_each(|v| *v /= total);
        Taxi {
            seeding: Seeding::default(),
            p,
            initial,
            state: None,
        }
    }

    /// The actions that change the state in `s` (gymnasium's `action_mask`).
    pub fn action_mask(s: usize) -> Vec<bool> {
        let (row, col, pass, dest) = decode(s);
        let here = (row, col);
        vec![
            row < 4,
            row > 0,
            col < 4 && open(row, 2 * col + 2),
            col > 0 && open(row, 2 * col),
            pass < 4 && here == LOCS[pass],
            pass == 4 && (here == LOCS[dest] || LOCS.contains(&here)),
        ]
    }

    fn info(s: usize) -> Info {
        Info {
            prob: Some(1.0),
            action_mask: Some(Self::action_mask(s)),
        }
    }
}

/// gymnasium's `_build_dry_transitions` for one state and action.
fn dry_transition(row: usize, col: usize, pass: usize, dest: usize, action: usize) -> (usize, f64, bool) {
    let here = (row, col);
    let (mut new_row, mut new_col, mut new_pass) = (row, col, pass);
    let (mut reward, mut terminated) = (-1.0, false);
    match action {
        0 => new_row = (row + 1).min(4),
        1 => new_row = row.saturating_sub(1),
        _ => {}
    }
    if action == 2 && open(row, 2 * col + 2) {
        new_col = (col + 1).min(4);
    } else if action == 3 && open(row, 2 * col) {
        new_col = col.saturating_sub(1);
    } else if action == 4 {
        if pass < 4 && here == LOCS[pass] {
            new_pass = 4;
        } else {
            reward = -10.0;
        }
    } else if action == 5 {
        if here == LOCS[dest] && pass == 4 {
            new_pass = dest;
            terminated = true;
            reward = 20.0;
        } else if let (Some(at), 4) = (LOCS.iter().position(|&l| l == here), pass) {
            new_pass = at;
        } else {
            reward = -10.0;
        }
    }
    (encode(new_row, new_col, new_pass, dest), reward, terminated)
}

impl Env for Taxi {
    crate::serde_snapshot!(seeding, state);

    fn observation_space(&self) -> Space {
        Space::Discrete(STATES)
    }

    fn action_space(&self) -> Space {
        Space::Discrete(6)
    }

    fn reset(&mut self, seed: Option<u64>) -> (Obs, Info) {
        let s = self.seeding.reset(seed).categorical(&self.initial);
        self.state = Some(s);
        (Obs::Index(s), Self::info(s))
    }

    fn step(&mut self, action: usize) -> Step {
        assert!(action < 6, "Taxi-v4: action {action} is not 0..6");
        let (next, reward, terminated) = self.p[self.state.expect("reset before step")][action];
        // One transition of probability 1: gymnasium still draws for it.
        self.seeding.rng().categorical(&[1.0]);
        self.state = Some(next);
        Step {
            obs: Obs::Index(next),
            reward,
            terminated,
            truncated: false,
            info: Self::info(next),
        }
    }
}
