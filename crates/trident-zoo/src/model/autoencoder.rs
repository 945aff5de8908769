//! Autoencoders on images or a table's encoded rows.

use super::*;

/// The autoencoder of `a` on `input` (images, or a table's encoded rows).
pub(super) fn autoencoder(
    a: &AutoencoderModel,
    input: &InputSpec,
    params: &Params,
    seed: u64,
) -> anyhow::Result<Autoencoder> {
    use trident_nn::autoencoder::Output;
    let act = trident_nn::custom::activation_by_name(&a.activation)
        .map_err(|m| anyhow::anyhow!("model.activation: {m}"))?;
    if !(a.noise >= 0.0 && a.noise.is_finite()) {
        bail!("model.noise = {}: must be >= 0", a.noise);
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
            bail!("model.shape = \"conv\" takes images; use \"dense\" for table rows and series")
        }
        (AeShape::Dense, InputSpec::Series(s)) => {
            Autoencoder::dense(&pb, s.window, &a.hidden(), a.code, act, output, a.noise)?
        }
        (_, InputSpec::Text { .. }) => {
            bail!("an autoencoder takes images, table rows or series windows, not text")
        }
    })
}
