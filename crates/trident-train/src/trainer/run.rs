//! The one training loop: epochs of a [`Task`]'s batches from a [`Source`], composed of
//! the named parts — [`Checkpoints`] (recovery, resume, atomic `last`/`best`), [`RunLog`]
//! (progress, `metrics.jsonl`, TensorBoard, plots), [`StepProfiler`], [`StopRequest`] and
//! [`EarlyStopping`]. Every task trains here; what differs between them is the task's.

use super::task::{BatchContext, EpochContext, Source, StepDone, Task};
use super::{
    io_err, Checkpoints, EarlyStopping, EpochRecord, FitSummary, RunLog, StepProfiler, StopRequest,
    TrainError, Trainer, Updater,
};
use crate::checkpoint::TrainerState;
use crate::ddp::DataParallel;
use crate::profile::Phase;
use std::time::Instant;

/// One run in progress: its state and the parts the loop composes.
struct Run<'a> {
    trainer: &'a Trainer,
    dp: Option<&'a DataParallel>,
    per_epoch: u64,
    state: TrainerState,
    updaters: Vec<Updater>,
    checkpoints: Checkpoints<'a>,
    log: RunLog,
    profiler: StepProfiler<'a>,
    stop: StopRequest<'a>,
    rule: EarlyStopping,
    /// The learning rate of the latest optimizer step (the epoch's record shows it).
    lr: f64,
    _precision: trident_nn::bf16::Autocast,
}

/// A run directory opened for training.
enum Opened<'a> {
    /// Training goes on (or starts).
    Run(Box<Run<'a>>),
    /// The resumed run had already finished: its final state.
    Finished(TrainerState),
}

/// What an epoch's training part gave besides the running sums in the state.
struct TrainedEpoch {
    /// Units of progress (examples) this process trained in the epoch.
    units_now: u64,
    seconds: f64,
}

impl Trainer {
    /// Trains `task` on `source`'s batches: the loop every task shares. With `resume`,
    /// continues from `run_dir/last`; `data_hash` identifies data and model settings
    /// outside [`TrainConfig`](super::TrainConfig) (it joins the configuration hash). It
    /// runs on a worker of the current rayon pool ([`trident_nn::runtime::on_pool`]), where
    /// the kernels' parallel loops share their work without waking the pool from outside.
    pub fn run<T, S>(
        &self,
        task: &mut T,
        source: &S,
        resume: bool,
        data_hash: &str,
    ) -> Result<FitSummary, TrainError>
    where
        T: Task + Send,
        S: Source<Batch = T::Batch> + Sync,
    {
        trident_nn::runtime::on_pool(|| self.run_here(task, source, resume, data_hash))
    }

    /// [`run`](Self::run) on the calling thread.
    pub(super) fn run_here<T, S>(
        &self,
        task: &mut T,
        source: &S,
        resume: bool,
        data_hash: &str,
    ) -> Result<FitSummary, TrainError>
    where
        T: Task,
        S: Source<Batch = T::Batch>,
    {
        let mut run = match self.open(task, source, resume, data_hash)? {
            Opened::Run(run) => run,
            Opened::Finished(state) => return self.finished(state),
        };
        let (mut interrupted, mut early_stopped) = (false, false);
        while run.state.epoch < self.config.epochs {
            let Some(trained) = run.train_epoch(task, source)? else {
                interrupted = true;
                break;
            };
            if run.end_epoch(task, trained)? {
                early_stopped = true;
                if self.progress {
                    eprintln!("{}", run.rule.stop_message(&run.state));
                }
                break;
            }
            if run.stop_between_epochs()? {
                interrupted = true;
                break;
            }
        }
        // The curves as the run ends (during it, they are redrawn at most every PLOT_EVERY).
        run.log.plots_if_behind()?;
        Ok(FitSummary {
            profile: run.profiler.finish(self.progress)?,
            records: run.log.records,
            interrupted,
            early_stopped,
            state: run.state,
        })
    }

    /// A resumed run that had finished (killed while drawing the final plots): the plots
    /// drawn again.
    fn finished(&self, state: TrainerState) -> Result<FitSummary, TrainError> {
        let log = RunLog::open(
            &self.run_dir,
            state.epoch,
            self.config.epochs,
            self.lead(),
            self.progress,
        )?;
        log.plots()?;
        Ok(FitSummary {
            records: log.records,
            interrupted: false,
            early_stopped: false,
            state,
            profile: None,
        })
    }

    /// Rank 0 of a data-parallel group, or a lone trainer: the one that writes files.
    pub(super) fn lead(&self) -> bool {
        self.data_parallel.as_ref().is_none_or(|d| d.rank() == 0)
    }

    /// What no task can run with, refused before anything is written.
    fn check<S: Source>(&self, source: &S) -> Result<(), TrainError> {
        let c = &self.config;
        if c.grad_accum == 0 || c.epochs == 0 {
            return Err(TrainError::Invalid(
                "epochs and grad_accum must be at least 1".into(),
            ));
        }
        if let Some(d) = &self.data_parallel {
            if source.shard() != Some((d.rank(), d.world())) {
                return Err(TrainError::Invalid(format!(
                    "rank {} of {}: the training loader is not sharded for this rank (DataLoader::sharded)",
                    d.rank(),
                    d.world()
                )));
            }
        }
        Ok(())
    }

    /// The early-stopping rule on `task`'s metric that `train.monitor` names; an error
    /// listing the task's metrics when it names none of them.
    fn rule<T: Task>(&self, task: &T) -> Result<EarlyStopping, TrainError> {
        let monitor = &self.config.monitor;
        let metrics = task.metrics();
        let Some(def) = metrics.iter().find(|m| monitor.is(m.name)) else {
            let names: Vec<String> = metrics.iter().map(|m| format!("{:?}", m.name)).collect();
            return Err(TrainError::Invalid(format!(
                "train.monitor = {monitor:?}: this task reports {}",
                names.join(", ")
            )));
        };
        Ok(EarlyStopping {
            monitor: monitor.clone(),
            goal: def.goal,
            patience: self.config.early_stopping_patience,
        })
    }

    /// Checks the run can start, sets up its parts and opens (or resumes) the run
    /// directory.
    fn open<'a, T, S>(
        &'a self,
        task: &mut T,
        source: &S,
        resume: bool,
        data_hash: &str,
    ) -> Result<Opened<'a>, TrainError>
    where
        T: Task,
        S: Source<Batch = T::Batch>,
    {
        task.check(self)?;
        self.check(source)?;
        let rule = self.rule(task)?;
        let dp = self.data_parallel.as_ref();
        std::fs::create_dir_all(&self.run_dir).map_err(io_err(&self.run_dir))?;
        trident_nn::runtime::keep_freed_memory();
        let per_epoch = source.per_epoch();
        if per_epoch == 0 {
            return Err(TrainError::Invalid("the training set gives no batch".into()));
        }
        let plan = super::task::Plan {
            config: &self.config,
            per_epoch,
            dp,
            progress: self.progress,
        };
        let mut updaters = task.updaters(&plan)?;
        let hash = self.config_hash(data_hash);
        if let Some(d) = dp {
            // Every rank must run the same configuration on the same model.
            d.check_same("the configuration (hash)", trident_nn::params::name_hash(&hash))?;
            d.check_same(
                "the model's parameters (names and shapes)",
                crate::ddp::shapes_hash(task.params()),
            )?;
        }
        let checkpoints = Checkpoints::new(&self.run_dir, &self.checkpoint_files, dp);
        let mut groups: Vec<&mut Updater> = updaters.iter_mut().collect();
        let state = checkpoints.open(resume, task.params(), &mut groups, &hash, self.progress)?;
        if resume {
            task.load_state(&checkpoints.last)?;
        }
        task.opened(&state, &mut updaters);
        if let Some(d) = dp {
            // Every rank has looked at the run directory before rank 0 writes to it; then
            // all start from rank 0's weights.
            d.comm.barrier()?;
            d.broadcast_params(task.params())?;
        }
        if state.finished {
            return Ok(Opened::Finished(state));
        }
        let log = RunLog::open(
            &self.run_dir,
            state.epoch,
            self.config.epochs,
            self.lead(),
            self.progress,
        )?;
        // Ops record the mode when they are created: every forward pass, training and
        // evaluation, runs in the configured precision (a task that wants f32 somewhere
        // says so there).
        let bf16 = self.mixed_precision();
        Ok(Opened::Run(Box::new(Run {
            trainer: self,
            dp,
            per_epoch,
            state,
            updaters,
            checkpoints,
            log,
            profiler: StepProfiler::new(self.profile.as_ref()),
            stop: StopRequest::new(&self.stop, self.stop_after_steps),
            rule,
            lr: 0.0,
            _precision: trident_nn::bf16::autocast(bf16),
        })))
    }
}

impl Run<'_> {
    /// The training part of the current epoch, from where the state stands; `None` when a
    /// stop was asked (the `last` checkpoint is then written).
    fn train_epoch<T, S>(&mut self, task: &mut T, source: &S) -> Result<Option<TrainedEpoch>, TrainError>
    where
        T: Task,
        S: Source<Batch = T::Batch>,
    {
        let (epoch, per_epoch) = (self.state.epoch, self.per_epoch);
        let bar = self.log.progress_bar(per_epoch, epoch);
        bar.set_position(self.state.batch_in_epoch);
        let started = Instant::now();
        let units_before = self.state.sums.units;
        let mut batches = source.epoch_from(epoch, self.state.batch_in_epoch);
        let (mut i, mut step_open, mut step_from) =
            (self.state.batch_in_epoch, false, self.state.batch_in_epoch);
        while i < per_epoch {
            if !step_open {
                self.profiler.begin_step(self.state.optimizer_step + 1);
                step_open = true;
            }
            let (batch, weight) = batches
                .next()
                .ok_or_else(|| TrainError::Invalid("loader ended early".into()))??;
            self.profiler.mark(Phase::Data);
            let done = self.batch(task, &batch, i, weight)?;
            i += 1;
            bar.inc(1);
            let Some(done) = done else { continue };
            step_open = false;
            let stopped = self.step_done(task, i, done)?;
            let rate =
                (self.state.sums.units - units_before) as f64 / started.elapsed().as_secs_f64().max(1e-9);
            let mean = self.state.sums.mean_loss();
            let at = (epoch, i, per_epoch, i - step_from);
            self.log.step_message(&bar, at, mean, (rate, task.unit()));
            step_from = i;
            if stopped {
                bar.abandon_with_message("interrupted: checkpoint written");
                return Ok(None);
            }
        }
        bar.finish_and_clear();
        Ok(Some(TrainedEpoch {
            units_now: self.state.sums.units - units_before,
            seconds: started.elapsed().as_secs_f64(),
        }))
    }

    /// Batch `i` of the epoch handed to the task; the run's batch count moves on.
    fn batch<T: Task>(
        &mut self,
        task: &mut T,
        batch: &T::Batch,
        i: u64,
        weight: f32,
    ) -> Result<Option<StepDone>, TrainError> {
        let cx = BatchContext {
            epoch: self.state.epoch,
            index: i,
            last_of_epoch: i + 1 == self.per_epoch,
            weight,
            micro_step: self.state.micro_step,
            optimizer_step: self.state.optimizer_step,
            sums: &mut self.state.sums,
            updaters: &mut self.updaters,
            profiler: &mut self.profiler,
            dp: self.dp,
            config: &self.trainer.config,
            stop: &self.stop,
        };
        let done = task.batch(batch, cx)?;
        self.state.micro_step += 1;
        Ok(done)
    }

    /// After an optimizer step that ended with the epoch's first `batches` batches: the
    /// counters, the step's log and the periodic checkpoint. Returns whether the run stops
    /// here mid-epoch, in which case `last` holds this step.
    fn step_done<T: Task>(&mut self, task: &mut T, batches: u64, done: StepDone) -> Result<bool, TrainError> {
        let c = &self.trainer.config;
        self.state.optimizer_step += 1;
        self.state.batch_in_epoch = batches;
        self.stop.steps_this_process += 1;
        self.lr = done.lr;
        let n = self.state.optimizer_step;
        if n.is_multiple_of(c.log_every.max(1)) {
            self.log.step_scalars(n, done.loss, done.lr, done.grad_norm)?;
        }
        let periodic = c.checkpoint_every > 0 && n.is_multiple_of(c.checkpoint_every);
        let mid_epoch = batches < self.per_epoch;
        if (done.stop || periodic) && mid_epoch {
            let extra = task.save_state()?;
            let updaters: Vec<&Updater> = self.updaters.iter().collect();
            self.checkpoints
                .save_last(task.params(), &self.state, &updaters, &extra)?;
        }
        self.profiler.mark(Phase::Other);
        self.profiler.end_step(n);
        Ok(done.stop && mid_epoch)
    }

    /// An epoch's end: the task's figures logged, the best epoch and early stopping judged
    /// on the monitored metric, `best` (when improved) and `last` written, the curves
    /// drawn. Returns whether the run stops early here.
    fn end_epoch<T: Task>(&mut self, task: &mut T, trained: TrainedEpoch) -> Result<bool, TrainError> {
        let epoch = self.state.epoch;
        let mut metrics = task.end_epoch(EpochContext {
            epoch,
            state: &self.state,
            monitor: &self.rule.monitor,
            dp: self.dp,
        })?;
        metrics.insert("train_loss".into(), self.state.sums.mean_loss());
        let monitored = metrics.get(self.rule.monitor.name()).copied();
        self.log.epoch(EpochRecord {
            epoch,
            step: self.state.optimizer_step,
            lr: self.lr,
            epoch_seconds: trained.seconds,
            examples_per_second: trained.units_now as f64 / trained.seconds.max(1e-9),
            metrics,
        })?;
        let verdict = self
            .rule
            .end_epoch(&mut self.state, epoch, monitored, self.trainer.config.epochs);
        let extra = task.save_state()?;
        let updaters: Vec<&Updater> = self.updaters.iter().collect();
        self.checkpoints
            .save_epoch(task.params(), &self.state, &updaters, verdict.improved, &extra)?;
        self.log.plots_periodically()?;
        Ok(verdict.early)
    }

    /// Whether a stop was asked between epochs, of any rank (it stops them all); a
    /// finished run has nothing left to stop.
    fn stop_between_epochs(&mut self) -> Result<bool, TrainError> {
        let mut stop = [f32::from(u8::from(self.stop.asked(0)))];
        if let Some(d) = self.dp {
            d.sum(&mut stop)?;
        }
        Ok(stop[0] > 0.0 && !self.state.finished)
    }
}
