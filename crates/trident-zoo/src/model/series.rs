//! Forecasters on a series' windows.

use super::{mismatch, scored, Batch, Building, Built, Net, Network};
use crate::card::{ForecastNet, ForecasterModel, InputSpec, ModelCard, ModelConfig};
use crate::error::{invalid, Result, ZooError};
use trident_nn::forecast::Forecaster;
use trident_nn::rnn::CellKind;
use trident_nn::{Ctx, Params};
use trident_train::StepOutput;

/// `[model] kind = "forecaster"`.
pub(super) fn build(b: &Building) -> Result<Built> {
    let ModelConfig::Forecaster(f) = &b.card.model else {
        invalid!("not a forecaster")
    };
    Ok((Net::new(forecaster(f, &b.card.input, b.params, b.seed)?), None))
}

impl Network for Forecaster {
    /// The squared error of each window's forecast.
    fn step(&self, batch: &Batch, _card: &ModelCard, ctx: &Ctx) -> candle_core::Result<StepOutput> {
        let Batch::Series(x, y) = batch else {
            return Err(mismatch("series windows"));
        };
        let errors = trident_nn::layers::mse_per_example(y, &self.forward(x, ctx)?)?;
        scored(errors, vec![0; x.dim(0)?])
    }
}

/// The forecaster of `f` on `input`'s windows.
fn forecaster(f: &ForecasterModel, input: &InputSpec, params: &Params, seed: u64) -> Result<Forecaster> {
    let InputSpec::Series(s) = input else {
        invalid!("a forecaster takes a series (data.kind = \"series\")")
    };
    if !(0.0..1.0).contains(&f.dropout) {
        invalid!("model.dropout = {}: must be in [0, 1)", f.dropout);
    }
    let pb = params.builder(seed, None);
    Ok(match f.net {
        ForecastNet::Mlp => {
            let act = trident_nn::custom::activation_by_name(f.activation())
                .map_err(|m| ZooError::Config(format!("model.activation: {m}")))?;
            Forecaster::mlp(&pb, s.inputs(), &f.hidden, s.horizon, act, f.dropout)?
        }
        ForecastNet::Lstm | ForecastNet::Gru => {
            let width = *f.hidden.first().ok_or_else(|| {
                ZooError::Config("model.hidden: an lstm or gru needs a width per layer".into())
            })?;
            if f.hidden.iter().any(|&h| h != width) {
                invalid!(
                    "model.hidden = {:?}: an lstm or gru stack has one width for every layer",
                    f.hidden
                );
            }
            let kind = if f.net == ForecastNet::Lstm {
                CellKind::Lstm
            } else {
                CellKind::Gru
            };
            Forecaster::rnn(
                &pb,
                kind,
                width,
                f.hidden.len(),
                s.horizon,
                f.dropout,
                s.steps(),
                &s.calendar,
            )?
        }
    })
}
