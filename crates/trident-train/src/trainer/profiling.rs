//! `trident train --profile` inside the loop: the phase timer, the operator trace, the
//! memory/CPU monitor and the sampling profiler, started and stopped around the profiled
//! optimizer steps, and the report written at the end. Without profile options every call
//! does nothing.

use super::{io_err, TrainError};
use crate::monitor::Monitor;
use crate::profile::{Phase, PhaseTimer, ProfileOptions, ProfileReport, Sampled};
use crate::sampler::{SampleRow, Sampler};
use std::sync::Arc;
use std::time::Duration;
use trident_nn::trace::{self, Recorder};

/// Stops the process-wide trace recorder however the run ends.
struct TraceGuard;

impl Drop for TraceGuard {
    fn drop(&mut self) {
        trace::stop();
    }
}

/// The profilers of one run.
pub struct StepProfiler<'a> {
    opts: Option<&'a ProfileOptions>,
    recorder: Option<Arc<Recorder>>,
    _guard: Option<TraceGuard>,
    timer: PhaseTimer,
    monitor: Option<Monitor>,
    /// Runs from the first profiled step to the last.
    sampler: Option<Result<Sampler, String>>,
    sampled: Option<Result<Vec<SampleRow>, String>>,
}

impl<'a> StepProfiler<'a> {
    /// Profilers for `opts`; all off when `None`.
    pub fn new(opts: Option<&'a ProfileOptions>) -> Self {
        let (recorder, guard) = match opts {
            Some(_) => {
                let r = trace::start();
                trace::set_recording(false);
                (Some(r), Some(TraceGuard))
            }
            None => (None, None),
        };
        StepProfiler {
            opts,
            timer: PhaseTimer::new(recorder.clone()),
            recorder,
            _guard: guard,
            monitor: opts.map(|_| Monitor::start(Duration::from_millis(100))),
            sampler: None,
            sampled: None,
        }
    }

    /// Starts optimizer step `step` (1-based): timed and traced if it is profiled.
    pub fn begin_step(&mut self, step: u64) {
        let covered = self.opts.is_some_and(|p| p.covers(step));
        self.timer.begin_step(covered);
        if covered && self.sampler.is_none() && self.sampled.is_none() {
            self.sampler = Some(Sampler::start());
        }
    }

    /// Gives the time since the previous mark to `phase`.
    #[inline]
    pub fn mark(&mut self, phase: Phase) {
        self.timer.mark(phase);
    }

    /// Ends optimizer step `step`; the sampler stops after the last profiled step.
    pub fn end_step(&mut self, step: u64) {
        self.timer.end_step(step);
        let last = self.opts.and_then(|p| p.steps).map(|(_, b)| b);
        if last == Some(step) {
            if let Some(s) = self.sampler.take() {
                self.sampled = Some(self.finish_sampler(s));
            }
        }
    }

    /// The monitor pauses while the sampler resolves its stacks: that memory is the
    /// profiler's, not the run's.
    fn finish_sampler(&self, s: Result<Sampler, String>) -> Result<Vec<SampleRow>, String> {
        self.monitor.as_ref().inspect(|m| m.pause(true));
        let rows = s.and_then(|s| s.finish());
        self.monitor.as_ref().inspect(|m| m.pause(false));
        rows
    }

    /// Analyses what was recorded and writes the profile's files; `None` when off.
    pub fn finish(mut self, progress: bool) -> Result<Option<ProfileReport>, TrainError> {
        let (Some(opts), Some(rec)) = (self.opts, self.recorder.take()) else {
            return Ok(None);
        };
        trace::stop();
        let events = rec.take();
        let sampled = match self.sampled.take() {
            Some(s) => Some(s),
            None => self.sampler.take().map(|s| self.finish_sampler(s)),
        };
        let samples = self.monitor.take().map(|m| m.finish()).unwrap_or_default();
        let rows = &self.timer.rows;
        let mut report = crate::profile::analyse(rows, &events, &samples, opts, Some(rec.bf16_ready_flops()));
        match sampled {
            Some(Ok(rows)) => report.sampled = Some(Sampled { rows }),
            Some(Err(e)) if progress => eprintln!("sampling profiler: {e}; no samples.csv"),
            _ => {}
        }
        crate::profile::write(&opts.dir, rows, &events, &report).map_err(io_err(&opts.dir))?;
        crate::monitor::write(&opts.dir, &samples).map_err(io_err(&opts.dir))?;
        if progress {
            eprintln!(
                "{}  wrote {}/{{trace.json,steps.csv,ops.csv,layers.csv,samples.csv,monitor.csv,cpu_heatmap.png,summary.txt,report.json}}",
                report.text(8),
                opts.dir.display()
            );
        }
        Ok(Some(report))
    }
}
