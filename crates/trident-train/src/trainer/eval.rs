//! Evaluation: a model run in evaluation mode over a loader, alone or shared among
//! data-parallel ranks, giving the loss, the classification report and the probabilities;
//! and the gradients of one batch, for the tests that check every parameter learns.

use super::{Prediction, TrainError, TrainStep};
use crate::metrics::ClassificationReport;
use trident_data::{DataLoader, Dataset};
use trident_nn::Ctx;

/// Evaluation of a model on a loader.
#[derive(Debug, Clone)]
pub struct Evaluation {
    /// Mean loss over examples.
    pub loss: f64,
    /// A classifier's metrics (`None` for a model that scores examples instead).
    pub report: Option<ClassificationReport>,
    /// A classifier's softmax probabilities, row-major (empty for a scoring model).
    pub probs: Vec<f32>,
    /// A scoring model's score of each example (empty for a classifier).
    pub scores: Vec<f32>,
    /// Labels.
    pub labels: Vec<usize>,
}

impl Evaluation {
    /// The classification report; an error naming the task for a model without classes.
    pub fn classification(&self) -> Result<&ClassificationReport, TrainError> {
        self.report.as_ref().ok_or_else(|| {
            TrainError::Invalid(
                "this model scores examples (reconstruction); it has no class accuracy".into(),
            )
        })
    }

    /// From the pass's figures: the report of a classifier (`classes` wide rows), or the
    /// scores of a scoring model (one value per row).
    fn new(loss_sum: f64, pass: Pass, classes: usize) -> Result<Self, TrainError> {
        let n = pass.labels.len();
        if n == 0 {
            return Err(TrainError::Invalid("evaluation set is empty".into()));
        }
        let loss = loss_sum / n as f64;
        Ok(if pass.scored {
            Evaluation {
                loss,
                report: None,
                probs: Vec::new(),
                scores: pass.values,
                labels: pass.labels,
            }
        } else {
            Evaluation {
                loss,
                report: Some(ClassificationReport::new(&pass.values, &pass.labels, classes)),
                probs: pass.values,
                scores: Vec::new(),
                labels: pass.labels,
            }
        })
    }
}

/// What one evaluation pass gathered: per example its probabilities (a classifier) or its
/// score, and its label.
struct Pass {
    scored: bool,
    values: Vec<f32>,
    labels: Vec<usize>,
}

/// Loss sum and the per-example figures of `step` over `loader`'s epoch 0.
fn eval_pass<S: TrainStep + ?Sized, D: Dataset + 'static>(
    step: &S,
    loader: &DataLoader<D, S::Batch>,
) -> Result<(f64, Pass), TrainError> {
    let ctx = Ctx::eval();
    let mut loss = 0f64;
    let mut pass = Pass {
        scored: false,
        values: Vec::new(),
        labels: Vec::new(),
    };
    for batch in loader.epoch(0) {
        let out = step.forward(&batch?, &ctx)?;
        let b = out.labels.len();
        loss += out.loss.to_scalar::<f32>()? as f64 * b as f64;
        let values = match &out.prediction {
            Prediction::Logits(l) => trident_nn::ops::softmax_last_dim(&l.detach())?,
            Prediction::Scores(s) => {
                pass.scored = true;
                s.detach()
            }
        };
        pass.values.extend(values.flatten_all()?.to_vec1::<f32>()?);
        pass.labels.extend(out.labels);
    }
    Ok((loss, pass))
}

/// [`evaluate`] shared among data-parallel ranks: each runs every world-th batch of
/// `loader`, then the per-example figures, labels and losses are gathered, so every rank
/// gets the evaluation of the whole set (rows grouped by rank, which no metric depends on).
pub fn evaluate_data_parallel<S: TrainStep + ?Sized, D: Dataset + 'static>(
    step: &S,
    loader: &DataLoader<D, S::Batch>,
    classes: usize,
    d: &crate::ddp::DataParallel,
) -> Result<Evaluation, TrainError> {
    let world = d.world();
    let (loss, mine) = eval_pass(step, &loader.strided(d.rank(), world))?;
    let n = mine.labels.len();
    // A rank without a batch cannot tell the kind; any rank that scored decides.
    let mut scored = [f32::from(u8::from(mine.scored))];
    d.sum(&mut scored)?;
    let scored = scored[0] > 0.0;
    let width = if scored { 1 } else { classes };
    let (values, labels) = (&mine.values, &mine.labels);
    let counts = d.comm.all_gather_u64(n as u64)?;
    let max = counts.iter().copied().max().unwrap_or(0) as usize;
    let row = width + 1;
    // Equal, padded parts: each row its values and its label.
    let mut part = vec![0f32; max * row];
    for i in 0..n {
        part[i * row..i * row + width].copy_from_slice(&values[i * width..(i + 1) * width]);
        part[i * row + width] = labels[i] as f32;
    }
    let mut all = vec![0f32; world * max * row];
    d.comm.all_gather((&part[..]).into(), (&mut all[..]).into())?;
    let mut pass = Pass {
        scored,
        values: Vec::new(),
        labels: Vec::new(),
    };
    for (r, &c) in counts.iter().enumerate() {
        for i in 0..c as usize {
            let at = (r * max + i) * row;
            pass.values.extend_from_slice(&all[at..at + width]);
            pass.labels.push(all[at + width] as usize);
        }
    }
    // The loss sum as an f64 through f32: high and low parts.
    let hi = loss as f32;
    let mut sum = [hi, (loss - hi as f64) as f32];
    d.sum(&mut sum)?;
    Evaluation::new(sum[0] as f64 + sum[1] as f64, pass, classes)
}

/// Runs `step` in evaluation mode over every batch of `loader` (epoch 0 order).
pub fn evaluate<S: TrainStep + ?Sized, D: Dataset + 'static>(
    step: &S,
    loader: &DataLoader<D, S::Batch>,
    classes: usize,
) -> Result<Evaluation, TrainError> {
    let (loss, pass) = eval_pass(step, loader)?;
    Evaluation::new(loss, pass, classes)
}

/// Gradients of every trainable parameter for one batch (`None` where the graph gave
/// none): what the "every parameter learns" tests check.
pub fn gradients<S: TrainStep>(
    step: &S,
    batch: &S::Batch,
    ctx: &Ctx,
) -> candle_core::Result<Vec<(String, Option<Vec<f32>>)>> {
    let store = step.params();
    store.begin_step();
    let out = step.forward(batch, ctx)?;
    let grads = out.loss.backward()?;
    store
        .trainable()
        .into_iter()
        .map(|p| {
            let mut g = vec![0f32; p.var.elem_count()];
            let got = store.gradient_into(&grads, &p, &mut g, false)?;
            Ok((p.name, got.then_some(g)))
        })
        .collect()
}
