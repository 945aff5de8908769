//! What a run tells: the progress bar (or, when the output is not a terminal, a line per
//! tenth of an epoch, at most one every [`LINE_EVERY`]), `metrics.jsonl` (one record per epoch, rewritten atomically),
//! TensorBoard scalars per logged step and per epoch, the epoch's summary line and the
//! training-curve plots. Only rank 0 of a data-parallel group writes files.

use super::{io_err, EpochRecord, TrainError};
use crate::plot;
use crate::tensorboard::EventWriter;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Without a terminal, the shortest time between two progress lines: a log file of a run
/// whose epochs take milliseconds (small tables) gets its epoch summaries, not a line per
/// batch.
pub const LINE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The shortest time between two redraws of the training-curve plots during a run; they
/// are drawn again when it ends. Drawing them after every epoch cost more than training
/// an epoch of a small table.
pub const PLOT_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// A run's log.
pub struct RunLog {
    run_dir: PathBuf,
    metrics_path: PathBuf,
    tb: Option<EventWriter>,
    /// Every epoch's record, those before a resume included.
    pub records: Vec<EpochRecord>,
    progress: bool,
    epochs: u64,
    /// When the last progress line was printed (or the log opened).
    last_line: std::cell::Cell<std::time::Instant>,
    /// When the plots were last drawn, and how many records they showed.
    last_plot: std::cell::Cell<Option<(std::time::Instant, usize)>>,
}

impl RunLog {
    /// Opens the log of `run_dir` for a run of `epochs` epochs: the records of the epochs
    /// before `done_epochs` are kept (those of a resumed run's checkpoint), later ones
    /// dropped. `write` is false on the ranks that do not write the run directory.
    pub fn open(
        run_dir: &Path,
        done_epochs: u64,
        epochs: u64,
        write: bool,
        progress: bool,
    ) -> Result<Self, TrainError> {
        let metrics_path = run_dir.join("metrics.jsonl");
        let records = if done_epochs > 0 {
            read_records(&metrics_path)?
                .into_iter()
                .filter(|r| r.epoch < done_epochs)
                .collect()
        } else {
            Vec::new()
        };
        let tb = if write {
            rewrite_records(&metrics_path, &records)?;
            Some(EventWriter::create(&run_dir.join("tensorboard")).map_err(io_err(run_dir))?)
        } else {
            None
        };
        Ok(RunLog {
            run_dir: run_dir.into(),
            metrics_path,
            tb,
            records,
            progress,
            epochs,
            last_line: std::cell::Cell::new(std::time::Instant::now()),
            last_plot: std::cell::Cell::new(None),
        })
    }

    fn writes(&self) -> bool {
        self.tb.is_some()
    }

    /// The progress bar of epoch `epoch` (0-based) over `len` batches; hidden without
    /// progress output.
    pub fn progress_bar(&self, len: u64, epoch: u64) -> indicatif::ProgressBar {
        if !self.progress {
            return indicatif::ProgressBar::hidden();
        }
        let bar = indicatif::ProgressBar::new(len);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "epoch {prefix} [{bar:30}] {pos}/{len} batches  {msg}  eta {eta}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        bar.set_prefix(format!("{}/{}", epoch + 1, self.epochs));
        bar
    }

    /// After an optimizer step that ended with batch `batch` of `per_epoch` (having
    /// advanced `advanced` batches): the bar's message (`loss`, the epoch's mean so far,
    /// and the rate in the task's `unit`s per second), and when the bar is hidden a line
    /// per tenth of the epoch, at most one every [`LINE_EVERY`].
    pub fn step_message(
        &self,
        bar: &indicatif::ProgressBar,
        (epoch, batch, per_epoch, advanced): (u64, u64, u64, u64),
        mean_loss: f64,
        (rate, unit): (f64, &str),
    ) {
        let msg = format!("loss {mean_loss:.4}  {rate:.1} {unit}/s");
        if self.progress
            && bar.is_hidden()
            && batch % (per_epoch / 10).max(1) < advanced
            && self.last_line.get().elapsed() >= LINE_EVERY
        {
            // Not a terminal (a log file): a line per tenth of the epoch instead.
            self.last_line.set(std::time::Instant::now());
            eprintln!(
                "epoch {}/{} batch {batch}/{per_epoch}  {msg}",
                epoch + 1,
                self.epochs
            );
        }
        bar.set_message(msg);
    }

    /// TensorBoard scalars of optimizer step `step` (1-based): the last micro-batch's loss,
    /// the step's learning rate and, when the run clips, the gradients' global norm before
    /// clipping (`train/grad_norm`: spikes show instability before the loss does).
    pub fn step_scalars(
        &mut self,
        step: u64,
        loss: f64,
        lr: f64,
        grad_norm: Option<f64>,
    ) -> Result<(), TrainError> {
        if let Some(tb) = self.tb.as_mut() {
            tb.scalar("train/loss", step as i64, loss as f32)
                .map_err(io_err(tb.path()))?;
            tb.scalar("train/lr", step as i64, lr as f32)
                .map_err(io_err(tb.path()))?;
            if let Some(norm) = grad_norm {
                tb.scalar("train/grad_norm", step as i64, norm as f32)
                    .map_err(io_err(tb.path()))?;
            }
        }
        Ok(())
    }

    /// An epoch's end: its TensorBoard scalars, its `metrics.jsonl` line and its summary.
    pub fn epoch(&mut self, r: EpochRecord) -> Result<(), TrainError> {
        if let Some(tb) = self.tb.as_mut() {
            for (tag, v) in r.tagged() {
                tb.scalar(&tag, r.step as i64, v as f32)
                    .map_err(io_err(tb.path()))?;
            }
        }
        if self.progress {
            eprintln!("{}", describe(&r));
        }
        self.records.push(r);
        if self.writes() {
            rewrite_records(&self.metrics_path, &self.records)?;
        }
        Ok(())
    }

    /// Draws the training curves of every record so far.
    pub fn plots(&self) -> Result<(), TrainError> {
        if self.writes() {
            plot::training_curves(&self.run_dir, &self.records)?;
            self.last_plot
                .set(Some((std::time::Instant::now(), self.records.len())));
        }
        Ok(())
    }

    /// [`plots`](Self::plots) when they were never drawn or [`PLOT_EVERY`] has passed.
    pub fn plots_periodically(&self) -> Result<(), TrainError> {
        match self.last_plot.get() {
            Some((at, _)) if at.elapsed() < PLOT_EVERY => Ok(()),
            _ => self.plots(),
        }
    }

    /// [`plots`](Self::plots) when records were added since they were last drawn (a run's
    /// end).
    pub fn plots_if_behind(&self) -> Result<(), TrainError> {
        match self.last_plot.get() {
            Some((_, shown)) if shown == self.records.len() => Ok(()),
            _ => self.plots(),
        }
    }
}

fn describe(r: &EpochRecord) -> String {
    let mut s = format!("epoch {}  train loss {:.4}", r.epoch + 1, r.train_loss());
    if let Some(a) = r.metric("train_accuracy") {
        s += &format!("  acc {a:.4}");
    }
    if let Some(l) = r.metric("val_loss") {
        s += &format!("  |  val loss {l:.4}");
    }
    if let (Some(a), Some(f)) = (r.metric("val_accuracy"), r.metric("val_macro_f1")) {
        s += &format!("  acc {a:.4}  macro-F1 {f:.4}");
    }
    for (name, v) in r.figures() {
        s += &format!("  {name} {v:.4}");
    }
    s + &format!("  |  {:.1}s, {:.1} ex/s", r.epoch_seconds, r.examples_per_second)
}

fn read_records(path: &Path) -> Result<Vec<EpochRecord>, TrainError> {
    match std::fs::read_to_string(path) {
        Ok(text) => text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .enumerate()
            .map(|(i, l)| {
                serde_json::from_str(l)
                    .map_err(|e| TrainError::Invalid(format!("{}:{}: {e}", path.display(), i + 1)))
            })
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(TrainError::Io {
            path: path.into(),
            source: e,
        }),
    }
}

/// Writes all records to `metrics.jsonl` atomically (temporary file, then rename).
fn rewrite_records(path: &Path, records: &[EpochRecord]) -> Result<(), TrainError> {
    let tmp = path.with_extension("jsonl.tmp");
    let mut f = std::fs::File::create(&tmp).map_err(io_err(&tmp))?;
    for r in records {
        writeln!(f, "{}", serde_json::to_string(r).expect("record serialises")).map_err(io_err(&tmp))?;
    }
    f.sync_all().map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err(path))
}
