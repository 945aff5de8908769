//! N copies of an environment stepped together, with gymnasium's `SyncVectorEnv` rules:
//! `reset(seed)` seeds copy `i` with `seed + i`, and a copy whose episode ended is reset by
//! its next `step` (the action given for it is ignored, its reward is 0 and its flags are
//! false: gymnasium's default `AutoresetMode.NEXT_STEP`).

use crate::env::{Env, Info, Obs, Step};

/// Copies of one environment.
pub struct VectorEnv {
    envs: Vec<Box<dyn Env>>,
    autoreset: Vec<bool>,
}

impl VectorEnv {
    /// The environments `envs` (copies of one kind).
    pub fn new(envs: Vec<Box<dyn Env>>) -> Self {
        let autoreset = vec![false; envs.len()];
        VectorEnv { envs, autoreset }
    }

    /// The number of copies.
    pub fn len(&self) -> usize {
        self.envs.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.envs.is_empty()
    }

    /// The copies.
    pub fn envs(&self) -> &[Box<dyn Env>] {
        &self.envs
    }

    /// Resets every copy: copy `i` with `seed + i`, or each from its own stream.
    pub fn reset(&mut self, seed: Option<u64>) -> Vec<(Obs, Info)> {
        self.autoreset.iter_mut().for_each(|r| *r = false);
        self.envs
            .iter_mut()
            .enumerate()
            .map(|(i, e)| e.reset(seed.map(|s| s + i as u64)))
            .collect()
    }

    /// Steps every copy with its action; a copy whose last step ended its episode is reset
    /// instead.
    pub fn step(&mut self, actions: &[usize]) -> Vec<Step> {
        assert_eq!(actions.len(), self.envs.len(), "one action per environment");
        let steps: Vec<Step> = self
            .envs
            .iter_mut()
            .zip(actions)
            .zip(&self.autoreset)
            .map(|((env, &a), &reset)| {
                if reset {
                    let (obs, info) = env.reset(None);
                    Step {
                        obs,
                        reward: 0.0,
                        terminated: false,
                        truncated: false,
                        info,
                    }
                } else {
                    env.step(a)
                }
            })
            .collect();
        for (r, s) in self.autoreset.iter_mut().zip(&steps) {
            *r = s.terminated || s.truncated;
        }
        steps
    }
}
