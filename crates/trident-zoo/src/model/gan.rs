//! A GAN's generator and discriminator for image input.

use super::{Batch, Building, Built, Gan, Net, Network};
use crate::card::{InputSpec, ModelCard, ModelConfig};
use crate::error::{invalid, Result};
use trident_nn::{Ctx, Params};
use trident_train::StepOutput;

/// `[model] kind = "gan"`.
pub(super) fn build(b: &Building) -> Result<Built> {
    let ModelConfig::Gan(g) = &b.card.model else {
        invalid!("not a gan")
    };
    Ok((Net::new(gan(g, &b.card.input, b.params, b.seed)?), None))
}

impl Network for Gan {
    /// A GAN has no single loss: it trains through its adversarial step
    /// ([`crate::gan_step::GanStep`]).
    fn step(&self, _batch: &Batch, _card: &ModelCard, _ctx: &Ctx) -> candle_core::Result<StepOutput> {
        candle_core::bail!("a gan trains through its adversarial step, not a supervised one")
    }
}

/// The GAN of `[model] kind = "gan"` for image input.
fn gan(g: &crate::card::GanModel, input: &InputSpec, params: &Params, seed: u64) -> Result<Gan> {
    let InputSpec::Image {
        channels,
        height,
        width,
        ..
    } = *input
    else {
        invalid!("a gan generates images: it needs image data")
    };
    if height % 4 != 0 || width % 4 != 0 {
        invalid!("gan: images of {height}x{width}: height and width must be multiples of 4");
    }
    if g.z == 0 || g.width == 0 || g.critic_steps() == 0 || g.clip() <= 0.0 {
        invalid!("gan: model.z, model.width, model.critic_steps and model.clip must be positive");
    }
    let shape = trident_nn::gan::GanShape {
        image: (channels, height, width),
        z: g.z,
        width: g.width,
        critic_batch_norm: g.critic_batch_norm,
    };
    Ok(Gan {
        generator: trident_nn::gan::Generator::new(&params.builder(seed, None).pp("generator"), shape)?,
        discriminator: trident_nn::gan::Discriminator::new(
            &params.builder(seed ^ 0xd15c, None).pp("discriminator"),
            shape,
        )?,
        loss: g.objective(),
        shape,
        critic_steps: g.critic_steps(),
    })
}
