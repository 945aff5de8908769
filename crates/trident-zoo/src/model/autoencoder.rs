//! Autoencoders on images or a table's encoded rows.

use super::{scored, Batch, Building, Built, Net, Network};
use crate::card::{AeOutput, AeShape, AutoencoderModel, InputSpec, ModelCard, ModelConfig};
use crate::error::{invalid, Result, ZooError};
use trident_nn::autoencoder::Autoencoder;
use trident_nn::{Ctx, Params};
use trident_train::StepOutput;

/// `[model] kind = "autoencoder"`.
pub(super) fn build(b: &Building) -> Result<Built> {
    let ModelConfig::Autoencoder(a) = &b.card.model else {
        invalid!("not an autoencoder")
    };
    Ok((Net::new(autoencoder(a, &b.card.input, b.params, b.seed)?), None))
}

impl Network for Autoencoder {
    /// The reconstruction error of each example (its anomaly score).
    fn step(&self, batch: &Batch, _card: &ModelCard, ctx: &Ctx) -> candle_core::Result<StepOutput> {
        let (x, labels) = match batch {
            Batch::Image(x, l) | Batch::Features(x, l) => (x, l.clone()),
            // A series' windows: reconstructed, their next values unused.
            Batch::Series(x, _) => (x, vec![0; x.dim(0)?]),
            Batch::Text(..) => {
                candle_core::bail!("an autoencoder takes images, table rows or series windows, not text")
            }
        };
        let errors = trident_nn::layers::mse_per_example(x, &self.forward(x, ctx)?)?;
        scored(errors, labels)
    }
}

/// The autoencoder of `a` on `input` (images, or a table's encoded rows).
fn autoencoder(a: &AutoencoderModel, input: &InputSpec, params: &Params, seed: u64) -> Result<Autoencoder> {
    use trident_nn::autoencoder::Output;
    let act = trident_nn::custom::activation_by_name(&a.activation)
        .map_err(|m| ZooError::Config(format!("model.activation: {m}")))?;
    if !(a.noise >= 0.0 && a.noise.is_finite()) {
        invalid!("model.noise = {}: must be >= 0", a.noise);
    }
    let output = match (a.output, input) {
        (Some(AeOutput::Sigmoid), _) => Output::Sigmoid,
        (Some(AeOutput::Linear), _) => Output::Linear,
        (None, InputSpec::Image { mean, std, .. }) if *mean == 0.0 && *std == 1.0 => Output::Sigmoid,
        (None, _) => Output::Linear,
    };
    let pb = params.builder(seed, None);
    Ok(match (a.shape, input) {
        (AeShape::Dense, InputSpec::Table { encoder, .. }) => {
            Autoencoder::dense(&pb, encoder.width(), &a.hidden(), a.code, act, output, a.noise)?
        }
        (
            AeShape::Dense,
            InputSpec::Image {
                channels,
                height,
                width,
                ..
            },
        ) => Autoencoder::dense(
            &pb,
            channels * height * width,
            &a.hidden(),
            a.code,
            act,
            output,
            a.noise,
        )?,
        (
            AeShape::Conv,
            &InputSpec::Image {
                channels,
                height,
                width,
                ..
            },
        ) => Autoencoder::conv(
            &pb,
            (channels, height, width),
            &a.channels(),
            a.code,
            act,
            output,
            a.noise,
        )?,
        (AeShape::Conv, _) => {
            invalid!("model.shape = \"conv\" takes images; use \"dense\" for table rows and series")
        }
        (AeShape::Dense, InputSpec::Series(s)) => {
            Autoencoder::dense(&pb, s.window, &a.hidden(), a.code, act, output, a.noise)?
        }
        (_, InputSpec::Text { .. }) => {
            invalid!("an autoencoder takes images, table rows or series windows, not text")
        }
    })
}
