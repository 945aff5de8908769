//! Knowledge distillation (KD-1, KD-2): a frozen teacher's logits teach a student.
//!
//! [`Distill`] is a [`TrainStep`]: each batch runs the teacher in evaluation mode (no
//! dropout, batch norm on running statistics) with its logits detached from the graph, then
//! the student in training mode, and returns the student's logits with the distillation
//! loss. Only the student's parameters are handed to the optimizer, and the KL kernel
//! gives the teacher's logits no gradient, so the teacher cannot change.

use crate::trainer::{StepOutput, TrainStep};
use candle_core::{Result, Tensor};
use serde::{Deserialize, Serialize};
use trident_nn::{ops, Ctx, Params};

/// The distillation loss.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum KdLoss {
    /// Hinton et al. (2015): `alpha · T² · KL(softmax(z_t/T) ‖ softmax(z_s/T)) + (1 − alpha)
    /// · CE(y, z_s)`, the KL averaged over the batch.
    Soft {
        /// Temperature `T` (> 0).
        temperature: f64,
        /// Weight `alpha` of the soft term, in [0, 1].
        alpha: f64,
    },
    /// DeiT's hard distillation: `½ CE(y, z_s) + ½ CE(argmax z_t, z_s)`.
    Hard,
}

impl KdLoss {
    /// Checks the parameters; the message names the bad one.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if let KdLoss::Soft { temperature, alpha } = *self {
            if !(temperature > 0.0 && temperature.is_finite()) {
                return Err(format!("distill.temperature must be > 0, got {temperature}"));
            }
            if !(0.0..=1.0).contains(&alpha) {
                return Err(format!("distill.alpha must be in [0, 1], got {alpha}"));
            }
        }
        Ok(())
    }

    /// The loss of `student` logits against `teacher` logits and true `labels` (`[n]`, u32).
    pub fn compute(&self, student: &Tensor, teacher: &Tensor, labels: &Tensor) -> Result<Tensor> {
        match *self {
            KdLoss::Soft { temperature, alpha } => {
                let t = temperature as f32;
                let soft =
                    ops::distill_kl(student, teacher, t)?.affine(alpha * temperature * temperature, 0.0)?;
                if alpha >= 1.0 {
                    return Ok(soft);
                }
                let hard = ops::cross_entropy(student, labels)?.affine(1.0 - alpha, 0.0)?;
                soft + hard
            }
            KdLoss::Hard => {
                let argmax: Vec<u32> = ops::argmax_rows(teacher)?.into_iter().map(|i| i as u32).collect();
                let teacher_labels = Tensor::new(argmax, student.device())?;
                let a = ops::cross_entropy(student, labels)?;
                let b = ops::cross_entropy(student, &teacher_labels)?;
                (a + b)?.affine(0.5, 0.0)
            }
        }
    }
}

/// A student trained on a frozen teacher's logits.
pub struct Distill<S, T> {
    /// The model being trained.
    pub student: S,
    /// The frozen model whose logits are the targets.
    pub teacher: T,
    /// The loss.
    pub loss: KdLoss,
}

impl<S, T> TrainStep for Distill<S, T>
where
    S: TrainStep,
    T: TrainStep<Batch = S::Batch>,
{
    type Batch = S::Batch;

    fn forward(&self, batch: &Self::Batch, ctx: &Ctx) -> Result<StepOutput> {
        let out = self.student.forward(batch, ctx)?;
        if !ctx.train {
            // Evaluation reports the student's own loss on the true labels.
            return Ok(out);
        }
        let teacher = self.teacher.forward(batch, &Ctx::eval())?.logits.detach();
        let labels = Tensor::from_iter(out.labels.iter().map(|&l| l as u32), out.logits.device())?;
        Ok(StepOutput {
            loss: self.loss.compute(&out.logits, &teacher, &labels)?,
            logits: out.logits,
            labels: out.labels,
        })
    }

    fn params(&self) -> &Params {
        self.student.params()
    }
}
