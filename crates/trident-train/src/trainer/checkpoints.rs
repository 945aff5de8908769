//! A run directory's `last` and `best` checkpoints: repaired after a kill, opened for a
//! resume (or refused when a run is already there), and written atomically. With data
//! parallelism rank 0 writes them, every rank adds its ZeRO-1 shard of the optimizer state,
//! and no rank runs ahead of a checkpoint still being written.

use super::updater::Updater;
use super::TrainError;
use crate::checkpoint::{self, TrainerState};
use crate::ddp::DataParallel;
use std::path::{Path, PathBuf};
use trident_nn::Params;

/// Where a run's checkpoints live and who writes them.
pub struct Checkpoints<'a> {
    /// The latest state (written every epoch, on a stop, and every `checkpoint_every` steps).
    pub last: PathBuf,
    /// The state at the best monitored metric.
    pub best: PathBuf,
    run_dir: &'a Path,
    files: &'a [(String, Vec<u8>)],
    dp: Option<&'a DataParallel>,
}

/// The state of a run that has not taken a step.
pub fn fresh_state(config_hash: &str) -> TrainerState {
    TrainerState {
        epoch: 0,
        batch_in_epoch: 0,
        micro_step: 0,
        optimizer_step: 0,
        best_metric: None,
        best_epoch: None,
        epochs_without_improvement: 0,
        finished: false,
        sums: Default::default(),
        config_hash: config_hash.into(),
    }
}

impl<'a> Checkpoints<'a> {
    /// The checkpoints of `run_dir`, each also holding `files` (name → bytes).
    pub fn new(run_dir: &'a Path, files: &'a [(String, Vec<u8>)], dp: Option<&'a DataParallel>) -> Self {
        Checkpoints {
            last: run_dir.join("last"),
            best: run_dir.join("best"),
            run_dir,
            files,
            dp,
        }
    }

    fn lead(&self) -> bool {
        self.dp.is_none_or(|d| d.rank() == 0)
    }

    /// Repairs the run directory, then returns the state to start from: `last`'s with
    /// `resume` (weights and optimizer state loaded into `params` and `updaters`, one per
    /// parameter group), a fresh one otherwise. Refuses to resume a checkpoint of another configuration (`hash`), to
    /// resume where there is none, and to start over a run that is there.
    pub fn open(
        &self,
        resume: bool,
        params: &Params,
        updaters: &mut [&mut Updater],
        hash: &str,
        progress: bool,
    ) -> Result<TrainerState, TrainError> {
        self.recover(progress)?;
        let last = &self.last;
        if !resume {
            if last.exists() {
                return Err(TrainError::Invalid(format!(
                    "{} already holds a run: pass --resume to continue it, or choose another run directory",
                    self.run_dir.display()
                )));
            }
            return Ok(fresh_state(hash));
        }
        if !last.join("state.json").exists() {
            return Err(TrainError::Invalid(format!(
                "--resume: {} holds no checkpoint to resume from",
                last.display()
            )));
        }
        let state = match updaters {
            [one] if one.zero().is_some() => {
                checkpoint::verify(last, &[])?;
                let s = checkpoint::read_state(last)?;
                checkpoint::load_weights(last, params)?;
                one.zero_mut().expect("ZeRO-1 on").load(last)?;
                s
            }
            _ => {
                let groups: Vec<Vec<trident_nn::Param>> =
                    updaters.iter().map(|u| u.params().to_vec()).collect();
                let mut pairs: Vec<_> = updaters
                    .iter_mut()
                    .zip(&groups)
                    .map(|(u, g)| (u.optimizer_mut(), &g[..]))
                    .collect();
                checkpoint::load_groups(last, params, &mut pairs)?
            }
        };
        if state.config_hash != hash {
            return Err(TrainError::Invalid(format!(
                "--resume: {} was written with another configuration (hash {} vs {hash}); \
                 resume with the run's own config.toml",
                last.display(),
                state.config_hash
            )));
        }
        Ok(state)
    }

    /// A process killed while swapping a checkpoint in leaves it moved aside: rank 0 puts
    /// it back and clears the temporary directories of killed writes; no rank looks at
    /// `last` before that is done.
    fn recover(&self, progress: bool) -> Result<(), TrainError> {
        if self.lead() {
            let recovered =
                checkpoint::recover(&self.last).and_then(|l| Ok([l, checkpoint::recover(&self.best)?]));
            match recovered {
                Ok(notes) => {
                    for note in notes.into_iter().flatten() {
                        if progress {
                            eprintln!("{note}");
                        }
                    }
                }
                Err(e) => {
                    if let Some(d) = self.dp {
                        d.comm.abort(&e.to_string());
                    }
                    return Err(e.into());
                }
            }
        }
        if let Some(d) = self.dp {
            d.comm.barrier()?;
        }
        Ok(())
    }

    /// Writes `last`.
    pub fn save_last(
        &self,
        params: &Params,
        state: &TrainerState,
        updaters: &[&Updater],
        extra: &[(String, Vec<u8>)],
    ) -> Result<(), TrainError> {
        self.save(&self.last, params, state, updaters, extra)
    }

    /// Writes `best`.
    pub fn save_best(
        &self,
        params: &Params,
        state: &TrainerState,
        updaters: &[&Updater],
        extra: &[(String, Vec<u8>)],
    ) -> Result<(), TrainError> {
        self.save(&self.best, params, state, updaters, extra)
    }

    /// An epoch's checkpoints: `best` then `last` as its copy when the epoch `improved`,
    /// `last` alone otherwise. `best` first: a run killed between the two resumes from the
    /// older `last` and redoes this epoch, as it would have before either was written.
    pub fn save_epoch(
        &self,
        params: &Params,
        state: &TrainerState,
        updaters: &[&Updater],
        improved: bool,
        extra: &[(String, Vec<u8>)],
    ) -> Result<(), TrainError> {
        if improved {
            self.save_best(params, state, updaters, extra)?;
            self.save_last_as_best()
        } else {
            self.save_last(params, state, updaters, extra)
        }
    }

    /// Writes `last` as a copy of `best`, just written at the same state (files shared
    /// by hard links where possible): what an epoch that is the best so far writes instead
    /// of the whole checkpoint a second time.
    pub fn save_last_as_best(&self) -> Result<(), TrainError> {
        if self.lead() {
            checkpoint::save_copy(&self.best, &self.last)?;
        }
        if let Some(d) = self.dp {
            // Nobody runs ahead of a checkpoint that is still being written.
            d.comm.barrier()?;
        }
        Ok(())
    }

    fn save(
        &self,
        dir: &Path,
        params: &Params,
        state: &TrainerState,
        updaters: &[&Updater],
        extra: &[(String, Vec<u8>)],
    ) -> Result<(), TrainError> {
        let joined: Vec<(String, Vec<u8>)>;
        let files: &[(String, Vec<u8>)] = if extra.is_empty() {
            self.files
        } else {
            joined = self.files.iter().chain(extra).cloned().collect();
            &joined
        };
        let Some(d) = self.dp else {
            let optimizers: Vec<_> = updaters.iter().map(|u| u.optimizer()).collect();
            return Ok(checkpoint::save_groups(dir, params, &optimizers, state, files)?);
        };
        let [updater] = updaters else {
            return Err(TrainError::Invalid(
                "data parallelism trains one parameter group with one optimizer".into(),
            ));
        };
        let lead = self.lead();
        d.broadcast_buffers(params)?;
        d.check_replicas(params)?;
        let barrier = || -> Result<(), TrainError> { Ok(d.comm.barrier()?) };
        match updater.zero() {
            None if lead => checkpoint::save(dir, params, updater.optimizer(), state, files)?,
            None => {}
            Some(z) => {
                // Rank 0 makes the temporary directory, every rank writes its shard of the
                // optimizer state into it, rank 0 adds the rest and renames it.
                const TAG: &str = "tmp-ranks";
                if lead {
                    checkpoint::begin(dir, TAG)?;
                }
                barrier()?;
                let tmp = checkpoint::tmp_path(dir, TAG);
                z.save_shard(&tmp, d.rank(), d.world())?;
                barrier()?;
                if lead {
                    checkpoint::finish(&tmp, dir, params, None, state, files)?;
                }
            }
        }
        // Nobody runs ahead of a checkpoint that is still being written.
        barrier()
    }
}
