//! Agents: tasks on Trident's one training loop (`trident_train::Trainer::run`) whose
//! batches are iterations that collect their own experience. The loop checkpoints, resumes,
//! logs, plots and stops them as it does every task; an agent says what an iteration does
//! and what an epoch reports.

pub mod dqn;
pub mod ppo;
pub mod reinforce;
pub mod tabular;

use crate::env::{Env, Obs};
use std::path::Path;
use trident_train::trainer::{EpochBatches, Goal, MetricDef, Metrics, Source, TrainError};

/// The metrics every agent reports that `train.monitor` may name.
pub(crate) fn return_metrics() -> Vec<MetricDef> {
    vec![
        MetricDef {
            name: "eval_return",
            goal: Goal::Maximize,
        },
        MetricDef {
            name: "episodic_return",
            goal: Goal::Maximize,
        },
    ]
}

/// The index of the largest value (the first of equal ones).
pub(crate) fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// A network's input for `obs`: a box's values, or a discrete state one-hot over `discrete`.
pub(crate) fn encode(obs: &Obs, discrete: Option<usize>) -> Vec<f32> {
    match (obs, discrete) {
        (Obs::Index(i), Some(n)) => {
            let mut v = vec![0.0; n];
            v[*i] = 1.0;
            v
        }
        (Obs::Values(v), _) => v.clone(),
        (Obs::Index(i), None) => vec![*i as f32],
    }
}

/// An action drawn from probabilities with the uniform draw `u` (the last action when
/// rounding leaves `u` above their sum).
pub(crate) fn sample(probabilities: impl IntoIterator<Item = f32>, u: f32, actions: usize) -> usize {
    let mut acc = 0.0;
    for (i, p) in probabilities.into_iter().enumerate() {
        acc += p;
        if u < acc {
            return i;
        }
    }
    actions - 1
}

/// [`evaluate`] with a policy that can fail: the first error is returned.
pub(crate) fn evaluate_with(
    env: &mut dyn Env,
    episodes: u64,
    seed: u64,
    mut policy: impl FnMut(&Obs) -> Result<usize, TrainError>,
    frames: Option<&mut Vec<Obs>>,
) -> Result<Episodes, TrainError> {
    let mut failed = None;
    let out = evaluate(
        env,
        episodes,
        seed,
        |o| {
            policy(o).unwrap_or_else(|e| {
                failed.get_or_insert(e);
                0
            })
        },
        frames,
    );
    failed.map_or(Ok(out), Err)
}

/// An epoch's evaluation by `run` (given a frame buffer when `gifs` draws it), its episode
/// drawn.
pub(crate) fn evaluated(
    gifs: &Option<EpisodeGifs>,
    epoch: u64,
    run: impl FnOnce(Option<&mut Vec<Obs>>) -> Result<Episodes, TrainError>,
) -> Result<Episodes, TrainError> {
    let mut frames = Vec::new();
    let eval = run(gifs.is_some().then_some(&mut frames))?;
    if let Some(g) = gifs {
        g.write(epoch, &frames)?;
    }
    Ok(eval)
}

/// The figures every agent's epoch reports: its finished training episodes and the greedy
/// evaluation.
pub(crate) fn epoch_figures(done: &Episodes, eval: &Episodes) -> Metrics {
    let mut m = Metrics::new();
    m.insert("episodic_return".into(), done.return_stats().0);
    m.insert("episodic_length".into(), done.mean_length());
    m.insert("episodes".into(), done.returns.len() as f64);
    let (mean, std) = eval.return_stats();
    m.insert("eval_return".into(), mean);
    m.insert("eval_return_std".into(), std);
    m.insert("eval_length".into(), eval.mean_length());
    m
}

/// The file of an agent's progress in a checkpoint.
const PROGRESS: &str = "agent.json";

/// An agent's checkpoint files: its progress (`agent.json`) and each environment's snapshot
/// under its name.
pub(crate) fn state_files(
    progress: &impl serde::Serialize,
    envs: &[(String, &dyn Env)],
) -> Result<Vec<(String, Vec<u8>)>, TrainError> {
    let bytes = serde_json::to_vec(progress).map_err(|e| TrainError::Invalid(e.to_string()))?;
    let mut files = vec![(PROGRESS.to_string(), bytes)];
    files.extend(
        envs.iter()
            .filter_map(|(name, e)| Some((name.clone(), e.snapshot()?))),
    );
    Ok(files)
}

/// A checkpoint file, checked against its manifest.
fn read_state(dir: &Path, name: &str) -> Result<Vec<u8>, TrainError> {
    trident_train::checkpoint::verify(dir, &[name])?;
    std::fs::read(dir.join(name))
        .map_err(|e| TrainError::Invalid(format!("{}: {e}", dir.join(name).display())))
}

/// The progress [`state_files`] wrote into checkpoint `dir`.
pub(crate) fn read_progress<T: serde::de::DeserializeOwned>(dir: &Path) -> Result<T, TrainError> {
    serde_json::from_slice(&read_state(dir, PROGRESS)?)
        .map_err(|e| TrainError::Invalid(format!("{}: {e}", dir.join(PROGRESS).display())))
}

/// `env` restored from its snapshot `name` in checkpoint `dir`, when the checkpoint has one.
pub(crate) fn restore_env(env: &mut dyn Env, dir: &Path, name: &str) -> Result<(), TrainError> {
    if !dir.join(name).exists() {
        return Ok(());
    }
    env.restore(&read_state(dir, name)?)
        .map_err(|e| TrainError::Invalid(format!("{}: {e}", dir.join(name).display())))
}

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
