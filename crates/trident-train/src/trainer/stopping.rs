//! When a run stops: asked to (a signal, or the step budget tests use to simulate a kill),
//! in which case it checkpoints and can be resumed; or early, when the monitored metric
//! has not improved for `patience` epochs. The best epoch is judged here too.

use super::task::{Goal, Monitor};
use crate::checkpoint::TrainerState;
use std::sync::atomic::{AtomicBool, Ordering};

/// A stop asked from outside the loop.
pub struct StopRequest<'a> {
    signal: &'a AtomicBool,
    after_steps: Option<u64>,
    /// Optimizer steps taken by this process (a resumed run counts from its resume).
    pub steps_this_process: u64,
}

impl<'a> StopRequest<'a> {
    /// Stops when `signal` is set, or after `after_steps` optimizer steps of this process.
    pub fn new(signal: &'a AtomicBool, after_steps: Option<u64>) -> Self {
        StopRequest {
            signal,
            after_steps,
            steps_this_process: 0,
        }
    }

    /// Whether to stop once this process has taken `ahead` more steps.
    pub fn asked(&self, ahead: u64) -> bool {
        self.signal.load(Ordering::SeqCst)
            || self
                .after_steps
                .is_some_and(|n| self.steps_this_process + ahead >= n)
    }
}

/// The best-checkpoint and early-stopping rule.
#[derive(Debug, Clone)]
pub struct EarlyStopping {
    /// The metric judged.
    pub monitor: Monitor,
    /// Which way it improves.
    pub goal: Goal,
    /// Epochs without improvement that end the run; never when `None`.
    pub patience: Option<u64>,
}

/// What an epoch's metric decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The epoch is the best so far (without validation, the latest always is).
    pub improved: bool,
    /// The run stops here for lack of improvement.
    pub early: bool,
}

impl EarlyStopping {
    /// Records epoch `epoch`'s `metric` in `state` (best metric and epoch, epochs without
    /// improvement) and decides.
    pub fn judge(&self, state: &mut TrainerState, epoch: u64, metric: Option<f64>) -> Verdict {
        let improved = match (metric, state.best_metric) {
            (Some(m), Some(b)) => self.goal.better(m, b),
            (Some(_), None) => true,
            (None, _) => true,
        };
        if improved {
            state.best_metric = metric;
            state.best_epoch = Some(epoch);
            state.epochs_without_improvement = 0;
        } else {
            state.epochs_without_improvement += 1;
        }
        let early = self
            .patience
            .is_some_and(|p| state.epochs_without_improvement >= p);
        Verdict { improved, early }
    }

    /// Ends epoch `epoch` in `state`: the counters move to the next epoch, `metric` is
    /// judged ([`Self::judge`]), and the run is finished after the last of `epochs` or an
    /// early stop. Both training loops end their epochs here.
    pub fn end_epoch(
        &self,
        state: &mut TrainerState,
        epoch: u64,
        metric: Option<f64>,
        epochs: u64,
    ) -> Verdict {
        state.epoch += 1;
        state.batch_in_epoch = 0;
        state.sums = Default::default();
        let verdict = self.judge(state, epoch, metric);
        state.finished = state.epoch >= epochs || verdict.early;
        verdict
    }

    /// What an early stop says (epochs counted from 1, as the progress bar does).
    pub fn stop_message(&self, state: &TrainerState) -> String {
        format!(
            "early stop: {} has not improved for {} epochs (best {:.4} at epoch {})",
            self.monitor,
            state.epochs_without_improvement,
            state.best_metric.unwrap_or(f64::NAN),
            state.best_epoch.map_or(0, |e| e + 1)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ending_an_epoch_moves_the_counters_and_finishes_on_the_last_or_an_early_stop() {
        let mut s = super::super::checkpoints::fresh_state("h");
        let rule = EarlyStopping {
            monitor: Monitor::named("val_loss"),
            goal: Goal::Minimize,
            patience: Some(1),
        };
        s.batch_in_epoch = 7;
        (s.sums.loss, s.sums.batches, s.sums.units) = (1.5, 3, 96);
        s.sums.add("correct", 2.0);
        let v = rule.end_epoch(&mut s, 0, Some(0.5), 3);
        assert_eq!((s.epoch, s.batch_in_epoch, &s.sums), (1, 0, &Default::default()));
        assert!(v.improved && !v.early && !s.finished);
        let v = rule.end_epoch(&mut s, 1, Some(0.6), 3);
        assert!(
            !v.improved && v.early && s.finished,
            "patience 1: the first worse epoch stops"
        );
        assert_eq!(
            rule.stop_message(&s),
            "early stop: val_loss has not improved for 1 epochs (best 0.5000 at epoch 1)"
        );
        let mut s = super::super::checkpoints::fresh_state("h");
        let patient = EarlyStopping {
            patience: None,
            ..rule.clone()
        };
        patient.end_epoch(&mut s, 0, Some(0.5), 2);
        assert!(!s.finished);
        patient.end_epoch(&mut s, 1, Some(0.6), 2);
        assert!(s.finished, "the last epoch finishes the run");
    }

    #[test]
    fn patience_counts_epochs_without_improvement_of_the_monitored_metric() {
        let mut s = super::super::checkpoints::fresh_state("h");
        let rule = EarlyStopping {
            monitor: Monitor::named("val_loss"),
            goal: Goal::Minimize,
            patience: Some(2),
        };
        let v = [1.0, 0.8, 0.9, 0.8, 0.7, 0.75, 0.71];
        let got: Vec<(bool, bool)> = v
            .iter()
            .enumerate()
            .map(|(e, &m)| {
                let r = rule.judge(&mut s, e as u64, Some(m));
                (r.improved, r.early)
            })
            .collect();
        // 0.8 ties do not improve a loss; the second epoch after 0.7 without a lower one stops.
        assert_eq!(
            got,
            [
                (true, false),
                (true, false),
                (false, false),
                (false, true),
                (true, false),
                (false, false),
                (false, true)
            ]
        );
        assert_eq!((s.best_metric, s.best_epoch), (Some(0.7), Some(4)));
        let acc = EarlyStopping {
            monitor: Monitor::named("val_accuracy"),
            goal: Goal::Maximize,
            patience: None,
        };
        let mut s = super::super::checkpoints::fresh_state("h");
        assert!(acc.judge(&mut s, 0, Some(0.5)).improved);
        assert!(acc.judge(&mut s, 1, Some(0.6)).improved);
        let r = acc.judge(&mut s, 2, Some(0.4));
        assert!(!r.improved && !r.early);
        // Without validation the latest epoch is the best.
        assert!(acc.judge(&mut s, 3, None).improved);
    }

    #[test]
    fn a_step_budget_stops_after_that_many_steps_of_this_process() {
        let flag = AtomicBool::new(false);
        let mut r = StopRequest::new(&flag, Some(3));
        r.steps_this_process = 2;
        assert!(!r.asked(0));
        assert!(r.asked(1));
        flag.store(true, Ordering::SeqCst);
        assert!(StopRequest::new(&flag, None).asked(0));
    }
}
