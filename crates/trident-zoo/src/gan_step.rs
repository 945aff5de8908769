//! A GAN as an [`AdversarialStep`]: the generator and the critic of a `kind = "gan"`
//! model with their losses, the critic's weight clipping (WGAN) and gradient penalty
//! (WGAN-GP), and the generator's samples (grids, and the images its quality is judged on).

use crate::error::{Result, ZooError};
use std::path::Path;
use trident_nn::{Ctx, Param, Params, Tensor};
use trident_train::trainer::{AdversarialStep, CriticLoss};

use crate::model::Gan;
use crate::{Batch, InputSpec, Model};

/// The seed of the latent vectors of the per-epoch sample grid (the same every epoch, so
/// the grids show one set of vectors as training moves them).
pub const GRID_SEED: u64 = 0x6772_6964;
/// The seed of the latent vectors scored after each epoch.
pub const EPOCH_SEED: u64 = 0x6570_6f63;
/// The seed of the latent vectors of the final report.
pub const REPORT_SEED: u64 = 0x7265_706f;
/// Images per forward pass when generating or judging.
pub const CHUNK: usize = 500;

/// A GAN of a model, with the data's pixel scaling: what the trainer drives.
pub struct GanStep<'a> {
    model: &'a Model,
    gan: &'a Gan,
    /// The same networks over detached views of the same parameters
    /// ([`Model::inference_twin`]): each half of a step runs the network it does not train
    /// here — the generator making the critic's fakes, the critic scoring the generator's
    /// — so no graph is recorded for the first, and no gradient computed for the critic's
    /// weights in the generator's update (PyTorch's DCGAN example computes those and
    /// throws them away). Batch norm's running statistics are the same variables, updated
    /// as before; samples are drawn from it too.
    frozen: Box<Gan>,
    /// The data's normalisation (pixel = x·std + mean).
    mean: f32,
    std: f32,
}

impl<'a> GanStep<'a> {
    /// The GAN of `model` (a `kind = "gan"` model on images).
    pub fn new(model: &'a Model) -> Result<Self> {
        let Some(gan) = model.net.get::<Gan>() else {
            return Err(ZooError::Kind("not a gan"));
        };
        let InputSpec::Image { mean, std, .. } = model.card.input else {
            return Err(ZooError::Kind("a gan takes image input"));
        };
        let Ok(frozen) = model.inference_twin()?.net.into_kind::<Gan>() else {
            return Err(ZooError::Kind("the twin of a gan is a gan"));
        };
        Ok(GanStep {
            model,
            gan,
            frozen,
            mean,
            std,
        })
    }

    /// The shape (channels, height, width) of the images it makes.
    pub fn image_shape(&self) -> (usize, usize, usize) {
        self.gan.shape.image
    }

    /// The data's normalisation (mean, std): pixel = x·std + mean.
    pub fn pixel_scale(&self) -> (f32, f32) {
        (self.mean, self.std)
    }

    /// Real images in the generator's range [−1, 1] from normalised ones.
    fn to_tanh(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        x.affine(2.0 * self.std as f64, 2.0 * self.mean as f64 - 1.0)
    }

    fn group(&self, prefix: &str) -> Vec<Param> {
        self.model
            .params
            .trainable()
            .into_iter()
            .filter(|p| p.name.starts_with(prefix))
            .collect()
    }

    /// `n` generated images as pixels in [0, 1], `[n, c·h·w]` row-major, from the latent
    /// vectors of `seed` (drawn per chunk), the generator in evaluation mode.
    pub fn generate(&self, n: usize, seed: u64) -> Result<Vec<f32>> {
        let mut out = Vec::new();
        for (k, start) in (0..n).step_by(CHUNK).enumerate() {
            let m = CHUNK.min(n - start);
            let z = trident_nn::gan::latent(m, self.gan.shape.z, trident_nn::ops::splitmix(seed ^ k as u64))?;
            let x = self.frozen.generator.forward(&z, &Ctx::eval())?;
            out.extend(x.affine(0.5, 0.5)?.flatten_all()?.to_vec1::<f32>()?);
        }
        Ok(out)
    }

    /// The sample grid: 64 images of the fixed grid vectors, 8 by 8.
    pub fn grid(&self, path: &Path) -> Result<()> {
        let (c, h, w) = self.gan.shape.image;
        let pixels = self.generate(64, GRID_SEED)?;
        let images: Vec<Vec<f32>> = pixels.chunks(c * h * w).map(<[f32]>::to_vec).collect();
        let rows: Vec<Vec<Vec<f32>>> = images.chunks(8).map(<[Vec<f32>]>::to_vec).collect();
        trident_train::plot::image_grid(path, &rows, (c, h, w), 2)?;
        Ok(())
    }
}

impl AdversarialStep for GanStep<'_> {
    type Batch = Batch;

    fn params(&self) -> &Params {
        &self.model.params
    }

    fn generator_params(&self) -> Vec<Param> {
        self.group("generator.")
    }

    fn critic_params(&self) -> Vec<Param> {
        self.group("discriminator.")
    }

    fn critic_loss(&self, batch: &Batch, ctx: &Ctx) -> candle_core::Result<CriticLoss> {
        let Batch::Image(x, _) = batch else {
            candle_core::bail!("a gan trains on images")
        };
        let n = x.dim(0)?;
        let real = self.to_tanh(x)?;
        let z = trident_nn::gan::latent(n, self.gan.shape.z, ctx.seed)?;
        // Only the critic learns from this loss: the generated images are constants here.
        let fake = self.frozen.generator.forward(&z, ctx)?;
        let d = &self.gan.discriminator;
        let (sr, sf) = (d.forward(&real, ctx)?, d.forward(&fake, ctx)?);
        let mut loss = self.gan.loss.critic(&sr, &sf)?;
        if let trident_nn::gan::GanLoss::WassersteinGp { lambda } = self.gan.loss {
            loss = (loss + trident_nn::gan::gradient_penalty(d, &real, &fake, lambda, ctx.seed)?)?;
        }
        Ok(CriticLoss {
            loss,
            real: sr.mean_all()?.to_scalar::<f32>()? as f64,
            fake: sf.mean_all()?.to_scalar::<f32>()? as f64,
            examples: n,
        })
    }

    fn generator_loss(&self, n: usize, ctx: &Ctx) -> candle_core::Result<Tensor> {
        let z = trident_nn::gan::latent(n, self.gan.shape.z, ctx.seed)?;
        let fake = self.gan.generator.forward(&z, ctx)?;
        // Only the generator learns from this loss.
        self.gan
            .loss
            .generator(&self.frozen.discriminator.forward(&fake, ctx)?)
    }

    fn after_critic_update(&self) -> candle_core::Result<()> {
        if let trident_nn::gan::GanLoss::Wasserstein { clip } = self.gan.loss {
            for p in self.critic_params() {
                p.var.set(&p.var.as_tensor().clamp(-clip, clip)?)?;
            }
        }
        Ok(())
    }

    fn critic_steps(&self) -> u64 {
        self.gan.critic_steps
    }
}
