//! Agents: tasks on Trident's one training loop (`trident_train::Trainer::run`) whose
//! batches are iterations that collect their own experience. The loop checkpoints, resumes,
//! logs, plots and stops them as it does every task; an agent says what an iteration does
//! and what an epoch reports.

pub mod dqn;
pub mod ppo;
pub mod reinforce;
pub mod tabular;

use crate::env::{Env, Obs};
use trident_train::trainer::{EpochBatches, Source};

/// The iterations of an agent: `per_epoch` of them each epoch, numbered through the run.
pub struct Iterations {
    /// Iterations in an epoch.
    pub per_epoch: u64,
}

impl Source for Iterations {
    type Batch = u64;

    fn per_epoch(&self) -> u64 {
        self.per_epoch
    }

    fn epoch_from(&self, epoch: u64, start: u64) -> EpochBatches<'_, u64> {
        let first = epoch * self.per_epoch;
        Box::new((start..self.per_epoch).map(move |i| Ok((first + i, 1.0))))
    }
}

/// ε of an ε-greedy policy: from `start` down to `end` in a straight line over the first
/// `fraction` of the run's environment steps, then `end` (CleanRL's and SB3's schedule).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EpsilonSchedule {
    /// ε at the first step.
    pub start: f64,
    /// ε from the end of the decay on.
    pub end: f64,
    /// The share of the run's steps over which ε decays.
    pub fraction: f64,
}

impl EpsilonSchedule {
    /// ε after `step` of `total` environment steps.
    pub fn at(&self, step: u64, total: u64) -> f64 {
        let span = (self.fraction * total as f64).max(1.0);
        let slope = (self.end - self.start) / span;
        (self.start + slope * step as f64).max(self.end.min(self.start))
    }
}

/// Returns and lengths of finished episodes.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Episodes {
    /// Each episode's return.
    #[serde(with = "crate::exact::vec_f64")]
    pub returns: Vec<f64>,
    /// Each episode's length in steps.
    pub lengths: Vec<u64>,
}

impl Episodes {
    /// The mean and population standard deviation of the returns (NaN without episodes).
    pub fn return_stats(&self) -> (f64, f64) {
        mean_std(&self.returns)
    }

    /// The mean length (NaN without episodes).
    pub fn mean_length(&self) -> f64 {
        let l: Vec<f64> = self.lengths.iter().map(|&l| l as f64).collect();
        mean_std(&l).0
    }
}

/// Mean and population standard deviation (NaN for no values).
pub fn mean_std(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    (mean, var.sqrt())
}

/// Where an agent draws the first greedy evaluation episode of every epoch:
/// `<dir>/epoch-NNN.gif`.
#[derive(Debug, Clone)]
pub struct EpisodeGifs {
    /// The folder (the run's `episodes/`).
    pub dir: std::path::PathBuf,
    /// The environment's id (what to draw).
    pub env_id: String,
}

impl EpisodeGifs {
    /// Writes epoch `epoch`'s (0-based) episode.
    pub fn write(&self, epoch: u64, frames: &[Obs]) -> Result<(), trident_train::trainer::TrainError> {
        let path = self.dir.join(format!("epoch-{:03}.gif", epoch + 1));
        crate::render::write_gif(&path, &self.env_id, frames, 40, 300)
            .map(|_| ())
            .map_err(trident_train::trainer::TrainError::Invalid)
    }
}

/// Runs `episodes` episodes of `policy` on `env`, episode `k` reset with seed `seed + k`;
/// `policy` sees the observation and returns the action. The frames of the first are
/// kept when `keep_first` is given.
pub fn evaluate(
    env: &mut dyn Env,
    episodes: u64,
    seed: u64,
    mut policy: impl FnMut(&Obs) -> usize,
    mut keep_first: Option<&mut Vec<Obs>>,
) -> Episodes {
    let mut out = Episodes::default();
    for k in 0..episodes {
        let (mut obs, _) = env.reset(Some(seed + k));
        let (mut ret, mut len) = (0.0, 0u64);
        loop {
            if k == 0 {
                if let Some(frames) = keep_first.as_deref_mut() {
                    frames.push(obs.clone());
                }
            }
            let step = env.step(policy(&obs));
            ret += step.reward;
            len += 1;
            obs = step.obs;
            if step.terminated || step.truncated {
                if k == 0 {
                    if let Some(frames) = keep_first.as_deref_mut() {
                        frames.push(obs.clone());
                    }
                }
                break;
            }
        }
        out.returns.push(ret);
        out.lengths.push(len);
    }
    out
}
