//! The environment interface: gymnasium's, in Rust. A user's own environment implements
//! [`Env`] and plugs in beside the built-in ones.

use crate::rng::NpRandom;
use serde::{Deserialize, Serialize};

/// What an environment observes or accepts.
#[derive(Debug, Clone, PartialEq)]
pub enum Space {
    /// The integers `0..n`.
    Discrete(usize),
    /// Vectors of `low.len()` f32 values, each within `[low[i], high[i]]` (infinite bounds
    /// allowed).
    Box {
        /// Lower bounds.
        low: Vec<f32>,
        /// Upper bounds.
        high: Vec<f32>,
    },
}

impl Space {
    /// The number of choices (`Discrete`) or values (`Box`).
    pub fn size(&self) -> usize {
        match self {
            Space::Discrete(n) => *n,
            Space::Box { low, .. } => low.len(),
        }
    }
}

/// An observation: a state's index (discrete spaces) or its values (box spaces, in f32 as
/// gymnasium returns them).
#[derive(Debug, Clone, PartialEq)]
pub enum Obs {
    /// A discrete state.
    Index(usize),
    /// A box observation.
    Values(Vec<f32>),
}

impl Obs {
    /// The discrete state, if it is one.
    pub fn index(&self) -> Option<usize> {
        match self {
            Obs::Index(i) => Some(*i),
            Obs::Values(_) => None,
        }
    }

    /// The values, if they are a vector.
    pub fn values(&self) -> Option<&[f32]> {
        match self {
            Obs::Values(v) => Some(v),
            Obs::Index(_) => None,
        }
    }
}

/// What a step or a reset says besides the observation (gymnasium's `info` entries that
/// the built-in environments fill).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Info {
    /// The probability of the transition taken (toy-text environments).
    pub prob: Option<f64>,
    /// The actions that change the state (Taxi's `action_mask`).
    pub action_mask: Option<Vec<bool>>,
}

/// One transition.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The next observation.
    pub obs: Obs,
    /// The reward of the transition.
    pub reward: f64,
    /// The episode reached a terminal state (the agent should not bootstrap past it).
    pub terminated: bool,
    /// The episode was cut short (a time limit): the state is not terminal.
    pub truncated: bool,
    /// Extra information.
    pub info: Info,
}

/// An environment with gymnasium's semantics: `reset` starts an episode (reseeding the
/// environment's generator when given a seed, as gymnasium does; otherwise continuing its
/// stream, or seeding it from entropy the first time), `step` takes a discrete action.
pub trait Env: Send {
    /// The observations' space.
    fn observation_space(&self) -> Space;
    /// The actions' space (`Discrete(n)`).
    fn action_space(&self) -> Space;
    /// Starts an episode.
    fn reset(&mut self, seed: Option<u64>) -> (Obs, Info);
    /// Takes `action` (below the action space's `n`; the built-in environments panic on
    /// another, as gymnasium asserts).
    fn step(&mut self, action: usize) -> Step;
    /// Everything the environment is (its state and its generator's), for a checkpoint
    /// that resumes exactly; `None` when it cannot say (a resumed run then starts new
    /// episodes).
    fn snapshot(&self) -> Option<Vec<u8>> {
        None
    }
    /// Becomes what [`Env::snapshot`] wrote; an error names what did not fit.
    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        let _ = snapshot;
        Err("this environment cannot be restored from a snapshot".into())
    }
}

/// [`Env::snapshot`] and [`Env::restore`] of an environment that is serde data: the
/// snapshot is the serialised environment (its constant tables skipped), a restore takes
/// the named fields back from it.
#[macro_export]
macro_rules! serde_snapshot {
    ($($field:ident),+) => {
        fn snapshot(&self) -> Option<Vec<u8>> {
            serde_json::to_vec(self).ok()
        }
        fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
            let saved: Self = serde_json::from_slice(snapshot).map_err(|e| e.to_string())?;
            $(self.$field = saved.$field;)+
            Ok(())
        }
    };
}

/// The generator behind `reset(seed)`, shared by the built-in environments
/// (gymnasium's `Env.reset(seed=…)`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Seeding {
    rng: Option<NpRandom>,
}

impl Seeding {
    /// Reseeds with `seed`, or seeds from entropy the first time when there is none.
    pub fn reset(&mut self, seed: Option<u64>) -> &mut NpRandom {
        match seed {
            Some(s) => self.rng = Some(NpRandom::from_seed(s)),
            None if self.rng.is_none() => self.rng = Some(NpRandom::from_entropy()),
            None => {}
        }
        self.rng.as_mut().expect("seeded above")
    }

    /// The generator (after a reset).
    pub fn rng(&mut self) -> &mut NpRandom {
        self.rng.as_mut().expect("reset before step")
    }
}

/// gymnasium's `TimeLimit`: truncates an episode after `max_steps` steps.
#[derive(Debug, Clone)]
pub struct TimeLimit<E> {
    env: E,
    max_steps: u64,
    elapsed: u64,
}

impl<E: Env> TimeLimit<E> {
    /// `env` with at most `max_steps` steps per episode.
    pub fn new(env: E, max_steps: u64) -> Self {
        TimeLimit {
            env,
            max_steps,
            elapsed: 0,
        }
    }

    /// The wrapped environment.
    pub fn inner(&self) -> &E {
        &self.env
    }
}

/// A [`TimeLimit`]'s snapshot: its step count and the wrapped environment's.
#[derive(Serialize, Deserialize)]
struct LimitSnapshot {
    elapsed: u64,
    env: Vec<u8>,
}

impl<E: Env> Env for TimeLimit<E> {
    fn snapshot(&self) -> Option<Vec<u8>> {
        let env = self.env.snapshot()?;
        serde_json::to_vec(&LimitSnapshot {
            elapsed: self.elapsed,
            env,
        })
        .ok()
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        let s: LimitSnapshot = serde_json::from_slice(snapshot).map_err(|e| e.to_string())?;
        self.env.restore(&s.env)?;
        self.elapsed = s.elapsed;
        Ok(())
    }

    fn observation_space(&self) -> Space {
        self.env.observation_space()
    }

    fn action_space(&self) -> Space {
        self.env.action_space()
    }

    fn reset(&mut self, seed: Option<u64>) -> (Obs, Info) {
        self.elapsed = 0;
        self.env.reset(seed)
    }

    fn step(&mut self, action: usize) -> Step {
        let mut step = self.env.step(action);
        self.elapsed += 1;
        if self.elapsed >= self.max_steps {
            step.truncated = true;
        }
        step
    }
}
