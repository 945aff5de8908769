//! Supervised training (and distillation, whose step is a [`TrainStep`] too) as a
//! [`Task`]: each batch a forward and backward pass whose gradients are gathered; every
//! `grad_accum` batches (and at an epoch's end) the gradients are exchanged among
//! data-parallel ranks and one update is taken; each epoch ends with validation.

use super::task::{BatchContext, EpochContext, Goal, MetricDef, Metrics, Plan, StepDone, Task};
use super::{evaluate, evaluate_data_parallel, Evaluation, Prediction, TrainError, TrainStep, Updater};
use crate::ddp::DataParallel;
use crate::profile::Phase;
use trident_data::{DataLoader, Dataset};
use trident_nn::{Ctx, Params};

/// The validation figures a supervised run may monitor.
pub const SUPERVISED_METRICS: [MetricDef; 3] = [
    MetricDef {
        name: "val_accuracy",
        goal: Goal::Maximize,
    },
    MetricDef {
        name: "val_macro_f1",
        goal: Goal::Maximize,
    },
    MetricDef {
        name: "val_loss",
        goal: Goal::Minimize,
    },
];

/// The sum of correct predictions (a classifier's training accuracy).
const CORRECT: &str = "correct";

/// A [`TrainStep`] trained on labelled batches and validated on `val` after each epoch.
pub struct Supervised<'a, S: TrainStep, V: Dataset + 'static> {
    step: &'a S,
    val: Option<&'a DataLoader<V, S::Batch>>,
    classes: usize,
    /// Validation runs on this twin whose forward passes keep no graph, when the step has
    /// one; made at the first validation, over the weights the run trains.
    twin: Option<Option<Box<dyn TrainStep<Batch = S::Batch>>>>,
    sums: StepSums,
    /// The model predicts classes (training accuracy is counted); false once a step gave
    /// scores instead.
    classified: bool,
}

/// The figures of one optimizer step, summed over its micro-batches and then over the
/// data-parallel ranks, with the stop flag riding along (any rank's stop stops all).
#[derive(Debug, Default)]
struct StepSums {
    loss: f32,
    micro_batches: f32,
    hits: f32,
    examples: f32,
    stop: f32,
}

impl StepSums {
    fn exchange(&mut self, d: &DataParallel) -> Result<(), TrainError> {
        let mut v = [self.loss, self.micro_batches, self.hits, self.examples, self.stop];
        d.sum(&mut v)?;
        [self.loss, self.micro_batches, self.hits, self.examples, self.stop] = v;
        Ok(())
    }
}

impl<'a, S: TrainStep, V: Dataset + 'static> Supervised<'a, S, V> {
    /// `step` trained, validated on `val` (if any) as a `classes`-way classifier.
    pub fn new(step: &'a S, val: Option<&'a DataLoader<V, S::Batch>>, classes: usize) -> Self {
        Supervised {
            step,
            val,
            classes,
            twin: None,
            sums: StepSums::default(),
            classified: true,
        }
    }

    /// Forward and backward pass of one micro-batch, its gradients gathered (scaled by
    /// `cx.weight`, this rank's share of the global batch); returns its loss.
    fn micro_step(&mut self, batch: &S::Batch, cx: &mut BatchContext<'_, '_>) -> Result<f64, TrainError> {
        // Replicas draw different dropout masks (rank 0 the same as a lone run).
        let rank = cx.dp.map_or(0, |d| d.rank() as u64);
        let seed = cx
            .config
            .seed
            .wrapping_add(rank.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let ctx = Ctx::train(seed, cx.micro_step);
        let store = self.step.params();
        store.begin_step();
        let out = self.step.forward(batch, &ctx)?;
        let loss = out.loss.to_scalar::<f32>()? as f64;
        cx.profiler.mark(Phase::Forward);
        // Summed across ranks, the weighted gradients are those of the global batch's mean loss.
        let grads = if cx.weight == 1.0 {
            out.loss.backward()?
        } else {
            out.loss.affine(cx.weight as f64, 0.0)?.backward()?
        };
        cx.updaters[0].gather(store, &grads)?;
        drop(grads);
        cx.profiler.mark(Phase::Backward);
        if !loss.is_finite() {
            let e = format!(
                "loss became {loss} at epoch {}, batch {}: lower the learning rate or clip gradients",
                cx.epoch, cx.index
            );
            if let Some(d) = cx.dp {
                d.comm.abort(&e);
            }
            return Err(TrainError::Invalid(e));
        }
        let hits = match &out.prediction {
            Prediction::Logits(logits) => {
                let preds = trident_nn::ops::argmax_rows(logits)?;
                preds.iter().zip(&out.labels).filter(|(p, l)| p == l).count()
            }
            Prediction::Scores(_) => {
                self.classified = false;
                0
            }
        };
        self.sums.loss += loss as f32;
        self.sums.micro_batches += 1.0;
        self.sums.hits += hits as f32;
        self.sums.examples += out.labels.len() as f32;
        Ok(loss)
    }

    /// Ends a group of micro-batches: gradients and figures summed over the ranks (the
    /// stop flag with them), the epoch's sums, the update.
    fn optimizer_step(
        &mut self,
        cx: &mut BatchContext<'_, '_>,
        last_loss: f64,
    ) -> Result<StepDone, TrainError> {
        self.sums.stop = f32::from(u8::from(cx.stop_asked()));
        let updater = &mut cx.updaters[0];
        if let Some(d) = cx.dp {
            updater.exchange(d)?;
            self.sums.exchange(d)?;
            cx.profiler.mark(Phase::Comm);
        }
        let s = std::mem::take(&mut self.sums);
        cx.sums.loss += s.loss as f64;
        cx.sums.batches += s.micro_batches as u64;
        cx.sums.add(CORRECT, s.hits as u64 as f64);
        cx.sums.units += s.examples as u64;
        let lr = updater.update(cx.dp, cx.optimizer_step)?;
        cx.profiler.mark(Phase::Optimizer);
        Ok(StepDone {
            loss: last_loss,
            lr,
            grad_norm: updater.grad_norm(),
            stop: s.stop > 0.0,
        })
    }

    /// The validation pass, on every rank's share when data-parallel.
    fn validate(&mut self, dp: Option<&DataParallel>) -> Result<Option<Evaluation>, TrainError> {
        if self.val.is_some() && self.twin.is_none() {
            self.twin = Some(self.step.evaluator()?);
        }
        let evaluated: &dyn TrainStep<Batch = S::Batch> = match &self.twin {
            Some(Some(t)) => t.as_ref(),
            _ => self.step,
        };
        Ok(match (self.val, dp) {
            (Some(v), Some(d)) => Some(evaluate_data_parallel(evaluated, v, self.classes, d)?),
            (Some(v), None) => Some(evaluate(evaluated, v, self.classes)?),
            (None, _) => None,
        })
    }
}

/// The error of a class metric monitored on a model without classes.
fn monitor_needs_classes(monitor: &super::Monitor) -> TrainError {
    TrainError::Invalid(format!(
        "train.monitor = {monitor:?} needs class predictions, and this model scores examples \
         (reconstruction) instead: use train.monitor = \"val_loss\""
    ))
}

impl<S: TrainStep, V: Dataset + 'static> Task for Supervised<'_, S, V> {
    type Batch = S::Batch;

    fn params(&self) -> &Params {
        self.step.params()
    }

    fn metrics(&self) -> Vec<MetricDef> {
        SUPERVISED_METRICS.to_vec()
    }

    fn updaters(&self, plan: &Plan<'_>) -> Result<Vec<Updater>, TrainError> {
        let total_steps = plan.per_epoch.div_ceil(plan.config.grad_accum) * plan.config.epochs;
        let updater = Updater::new(
            self.step.params(),
            plan.config,
            total_steps,
            plan.dp,
            plan.progress,
        )?;
        Ok(vec![updater])
    }

    fn batch(
        &mut self,
        batch: &S::Batch,
        mut cx: BatchContext<'_, '_>,
    ) -> Result<Option<StepDone>, TrainError> {
        let loss = self.micro_step(batch, &mut cx)?;
        cx.profiler.mark(Phase::Other);
        if cx.updaters[0].gathered() < cx.config.grad_accum && !cx.last_of_epoch {
            return Ok(None);
        }
        self.optimizer_step(&mut cx, loss).map(Some)
    }

    fn end_epoch(&mut self, cx: EpochContext<'_>) -> Result<Metrics, TrainError> {
        if let Some(d) = cx.dp {
            d.broadcast_buffers(self.step.params())?;
        }
        let mut m = Metrics::new();
        let sums = &cx.state.sums;
        if self.classified {
            m.insert(
                "train_accuracy".into(),
                sums.get(CORRECT) / sums.units.max(1) as f64,
            );
        }
        let Some(val) = self.validate(cx.dp)? else {
            return Ok(m);
        };
        m.insert("val_loss".into(), val.loss);
        match &val.report {
            Some(r) => {
                m.insert("val_accuracy".into(), r.accuracy);
                m.insert("val_macro_f1".into(), r.macro_f1);
            }
            None if !cx.monitor.is("val_loss") => return Err(monitor_needs_classes(cx.monitor)),
            None => {}
        }
        Ok(m)
    }
}
