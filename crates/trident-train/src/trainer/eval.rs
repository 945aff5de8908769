//! Evaluation: a model run in evaluation mode over a loader, alone or shared among
//! data-parallel ranks, giving the loss, the classification report and the probabilities;
//! and the gradients of one batch, for the tests that check every parameter learns.

use super::{TrainError, TrainStep};
use crate::metrics::ClassificationReport;
use trident_data::{DataLoader, Dataset};
use trident_nn::Ctx;

/// Evaluation of a model on a loader.
#[derive(Debug, Clone)]
pub struct Evaluation {
    /// Mean loss over batches.
    pub loss: f64,
    /// Metrics.
    pub report: ClassificationReport,
    /// Softmax probabilities, row-major.
    pub probs: Vec<f32>,
    /// Labels.
    pub labels: Vec<usize>,
}

/// Loss sum, examples, probabilities and labels of `step` over `loader`'s epoch 0.
fn eval_pass<S: TrainStep, D: Dataset + 'static>(
    step: &S,
    loader: &DataLoader<D, S::Batch>,
) -> Result<(f64, usize, Vec<f32>, Vec<usize>), TrainError> {
    let ctx = Ctx::eval();
    let (mut loss, mut n) = (0f64, 0usize);
    let mut probs = Vec::new();
    let mut labels = Vec::new();
    for batch in loader.epoch(0) {
        let out = step.forward(&batch?, &ctx)?;
        let b = out.labels.len();
        loss += out.loss.to_scalar::<f32>()? as f64 * b as f64;
        n += b;
        let p = trident_nn::ops::softmax_last_dim(&out.logits.detach())?;
        probs.extend(p.flatten_all()?.to_vec1::<f32>()?);
        labels.extend(out.labels);
    }
    Ok((loss, n, probs, labels))
}

/// [`evaluate`] shared among data-parallel ranks: each runs every world-th batch of
/// `loader`, then the probabilities, labels and losses are gathered, so every rank gets
/// the evaluation of the whole set (rows grouped by rank, which no metric depends on).
pub fn evaluate_data_parallel<S: TrainStep, D: Dataset + 'static>(
    step: &S,
    loader: &DataLoader<D, S::Batch>,
    classes: usize,
    d: &crate::ddp::DataParallel,
) -> Result<Evaluation, TrainError> {
    let (world, row) = (d.world(), classes + 1);
    let (loss, n, probs, labels) = eval_pass(step, &loader.strided(d.rank(), world))?;
    let counts = d.comm.all_gather_u64(n as u64)?;
    let max = counts.iter().copied().max().unwrap_or(0) as usize;
    // Equal, padded parts: each row its probabilities and its label.
    let mut mine = vec![0f32; max * row];
    for i in 0..n {
        mine[i * row..i * row + classes].copy_from_slice(&probs[i * classes..(i + 1) * classes]);
        mine[i * row + classes] = labels[i] as f32;
    }
    let mut all = vec![0f32; world * max * row];
    d.comm.all_gather((&mine[..]).into(), (&mut all[..]).into())?;
    let (mut probs, mut labels) = (Vec::new(), Vec::new());
    for (r, &c) in counts.iter().enumerate() {
        for i in 0..c as usize {
            let at = (r * max + i) * row;
            probs.extend_from_slice(&all[at..at + classes]);
            labels.push(all[at + classes] as usize);
        }
    }
    // The loss sum as an f64 through f32: high and low parts.
    let hi = loss as f32;
    let mut sum = [hi, (loss - hi as f64) as f32];
    d.sum(&mut sum)?;
    let total = labels.len();
    if total == 0 {
        return Err(TrainError::Invalid("evaluation set is empty".into()));
    }
    let report = ClassificationReport::new(&probs, &labels, classes);
    Ok(Evaluation {
        loss: (sum[0] as f64 + sum[1] as f64) / total as f64,
        report,
        probs,
        labels,
    })
}

/// Runs `step` in evaluation mode over every batch of `loader` (epoch 0 order).
pub fn evaluate<S: TrainStep, D: Dataset + 'static>(
    step: &S,
    loader: &DataLoader<D, S::Batch>,
    classes: usize,
) -> Result<Evaluation, TrainError> {
    let (loss, n, probs, labels) = eval_pass(step, loader)?;
    if n == 0 {
        return Err(TrainError::Invalid("evaluation set is empty".into()));
    }
    let report = ClassificationReport::new(&probs, &labels, classes);
    Ok(Evaluation {
        loss: loss / n as f64,
        report,
        probs,
        labels,
    })
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
