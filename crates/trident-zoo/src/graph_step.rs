//! An exported graph (`trident export`'s ONNX file) evaluated exactly like its checkpoint:
//! [`ExportedStep`] is a [`TrainStep`] whose forward pass hands the same batches to a
//! [`GraphRunner`] — one instance of the server's ONNX engine in `trident eval --onnx` —
//! and reads its `logits` (or `reconstruction_error`) output into the same figures; an
//! exported forecaster's `forecast` output is read for one window at a time.

use crate::error::{Result, ZooError};
use crate::Batch;
use trident_core::Tensor as T;
use trident_nn::{Ctx, Params};
use trident_train::{Prediction, StepOutput, TrainStep};

/// What runs an exported graph: named inputs in, named outputs out.
pub trait GraphRunner: Send + Sync {
    /// The graph's input names.
    fn inputs(&self) -> &[String];
    /// One execution; the error says what went wrong.
    fn run(&self, inputs: Vec<(String, T)>) -> Result<Vec<(String, T)>, String>;
}

/// An exported graph as a step: evaluation only (it has no parameters to train).
pub struct ExportedStep {
    runner: Box<dyn GraphRunner>,
    params: Params,
}

impl ExportedStep {
    /// The graph `runner` runs.
    pub fn new(runner: Box<dyn GraphRunner>) -> Self {
        ExportedStep {
            runner,
            params: Params::new(),
        }
    }
}

impl ExportedStep {
    /// An exported forecaster's `forecast` for one raw window, the first forecast value at
    /// row `position` of the series (its `position` input, where it reads calendar
    /// features).
    pub fn forecast(&self, window: &[f64], position: usize) -> Result<Vec<f64>> {
        let err = |e: trident_core::TensorError| ZooError::Graph(e.to_string());
        let v: Vec<f32> = window.iter().map(|&x| x as f32).collect();
        let mut inputs = vec![(
            "values".to_string(),
            T::from_f32(vec![1, v.len() as i64], &v).map_err(err)?,
        )];
        if self.runner.inputs().iter().any(|i| i == "position") {
            inputs.push((
                "position".to_string(),
                T::from_i64(vec![1, 1], &[position as i64]).map_err(err)?,
            ));
        }
        let outputs = self.runner.run(inputs).map_err(ZooError::Graph)?;
        let (_, y) = outputs.iter().find(|(n, _)| n == "forecast").ok_or_else(|| {
            ZooError::Graph("the ONNX model has no `forecast` output (not an exported forecaster?)".into())
        })?;
        Ok(y.to_f32()
            .ok_or_else(|| ZooError::Graph("`forecast` is not FP32".into()))?
            .into_iter()
            .map(f64::from)
            .collect())
    }
}

impl TrainStep for ExportedStep {
    type Batch = Batch;

    fn forward(&self, batch: &Batch, _ctx: &Ctx) -> candle_core::Result<StepOutput> {
        let err = |e: String| candle_core::Error::Msg(e);
        let ints = |t: &candle_core::Tensor| -> candle_core::Result<T> {
            let (b, s) = t.dims2()?;
            let v: Vec<i64> = t
                .flatten_all()?
                .to_vec1::<u32>()?
                .into_iter()
                .map(i64::from)
                .collect();
            T::from_i64(vec![b as i64, s as i64], &v).map_err(|e| err(e.to_string()))
        };
        let (mut given, labels) = match batch {
            Batch::Text(b, l) => (
                vec![
                    ("input_ids".to_string(), ints(&b.ids)?),
                    ("attention_mask".to_string(), ints(&b.mask)?),
                    ("token_type_ids".to_string(), ints(&b.type_ids)?),
                ],
                l,
            ),
            Batch::Series(..) => {
                return Err(err(
                    "an exported forecaster is scored by its backtest, not per batch".into(),
                ))
            }
            Batch::Image(x, l) | Batch::Features(x, l) => {
                let shape = x.dims().iter().map(|&d| d as i64).collect();
                let v = x.flatten_all()?.to_vec1::<f32>()?;
                // The graph's input name (trident_export): images, or encoded table rows.
                let name = match batch {
                    Batch::Image(..) => "pixel_values",
                    _ => "features",
                };
                (
                    vec![(
                        name.to_string(),
                        T::from_f32(shape, &v).map_err(|e| err(e.to_string()))?,
                    )],
                    l,
                )
            }
        };
        given.retain(|(n, _)| self.runner.inputs().contains(n));
        let outputs = self.runner.run(given).map_err(err)?;
        let rows = labels.len();
        if let Some((_, e)) = outputs.iter().find(|(n, _)| n == "reconstruction_error") {
            // An autoencoder: its per-example error is the score, their mean the loss.
            let values = e
                .to_f32()
                .ok_or_else(|| err("`reconstruction_error` is not FP32".into()))?;
            let errors = candle_core::Tensor::from_vec(values, rows, &candle_core::Device::Cpu)?;
            return Ok(StepOutput {
                loss: errors.mean_all()?,
                prediction: Prediction::Scores(errors),
                labels: labels.clone(),
            });
        }
        let (_, logits) = outputs.iter().find(|(n, _)| n == "logits").ok_or_else(|| {
            err("the ONNX model has no `logits` output (not a `trident export` file?)".into())
        })?;
        let values = logits
            .to_f32()
            .ok_or_else(|| err("`logits` is not FP32".into()))?;
        let logits = candle_core::Tensor::from_vec(
            values,
            (rows, logits.len() / rows.max(1)),
            &candle_core::Device::Cpu,
        )?;
        let y = candle_core::Tensor::from_iter(labels.iter().map(|&l| l as u32), &candle_core::Device::Cpu)?;
        Ok(StepOutput::classified(
            trident_nn::ops::cross_entropy(&logits, &y)?,
            logits,
            labels.clone(),
        ))
    }

    fn params(&self) -> &Params {
        &self.params
    }
}
