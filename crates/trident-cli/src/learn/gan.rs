//! `[model] kind = "gan"`: a generator and a discriminator trained against each other on
//! images ([`trident_train::trainer::Trainer::fit_adversarial`]), a grid of samples drawn
//! after every epoch (`samples/epoch-NNN.png` and `samples.png`), and, with `[gan] judge`,
//! the samples scored in the feature space of a trained classifier of the same images:
//! after every epoch the Fréchet distance to the validation images (it picks `best`),
//! after training (and in `trident eval`) the full report against the test images — the
//! Fréchet distance, the kernel MMD², the 1-NN two-sample accuracy and the judge's class
//! histogram of the samples — beside the same figures for real training images (the floor
//! a perfect generator would reach).

use super::config::{GanSection, RunConfig};
use anyhow::{bail, Context};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use trident_data::{DataLoader, Dataset};
use trident_nn::{Ctx, Param, Params, Tensor};
use trident_train::quality::{frechet_distance, kernel_mmd2, one_nn_accuracy, Features};
use trident_train::trainer::{AdversarialStep, CriticLoss};
use trident_zoo::model::Gan;
use trident_zoo::{Batch, InputSpec, Model, Net};

/// The seed of the latent vectors of the per-epoch sample grid (the same every epoch, so
/// the grids show one set of vectors as training moves them).
const GRID_SEED: u64 = 0x6772_6964;
/// The seed of the latent vectors scored after each epoch.
const EPOCH_SEED: u64 = 0x6570_6f63;
/// The seed of the latent vectors of the final report.
const REPORT_SEED: u64 = 0x7265_706f;
/// Images per forward pass when generating or judging.
const CHUNK: usize = 500;

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
    pub fn new(model: &'a Model) -> anyhow::Result<Self> {
        let Net::Gan(gan) = &model.net else {
            bail!("not a gan")
        };
        let InputSpec::Image { mean, std, .. } = model.card.input else {
            bail!("a gan takes image input")
        };
        let Net::Gan(frozen) = model.inference_twin()?.net else {
            bail!("the twin of a gan is a gan")
        };
        Ok(GanStep {
            model,
            gan,
            frozen,
            mean,
            std,
        })
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
    pub fn generate(&self, n: usize, seed: u64) -> anyhow::Result<Vec<f32>> {
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
    pub fn grid(&self, path: &Path) -> anyhow::Result<()> {
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

/// A trained classifier of the same images whose penultimate layer is the feature space
/// samples are scored in.
pub struct Judge {
    model: Model,
    dir: PathBuf,
    mean: f32,
    std: f32,
}

impl Judge {
    /// The `cnn` checkpoint `dir`, for images of `shape`.
    pub fn load(dir: &Path, shape: (usize, usize, usize)) -> anyhow::Result<Self> {
        let model = Model::load_checkpoint(dir).with_context(|| format!("gan.judge = {}", dir.display()))?;
        let InputSpec::Image {
            channels,
            height,
            width,
            mean,
            std,
        } = model.card.input
        else {
            bail!("gan.judge = {}: not an image classifier", dir.display())
        };
        if !matches!(model.net, Net::Cnn(_)) {
            bail!(
                "gan.judge = {}: the judge must be a `cnn` checkpoint (its 128-wide penultimate layer is the feature space)",
                dir.display()
            );
        }
        if (channels, height, width) != shape {
            bail!(
                "gan.judge = {}: it reads {channels}x{height}x{width} images, the gan makes {}x{}x{}",
                dir.display(),
                shape.0,
                shape.1,
                shape.2
            );
        }
        Ok(Judge {
            model,
            dir: dir.into(),
            mean,
            std,
        })
    }

    /// The classes the judge tells apart.
    pub fn classes(&self) -> &[String] {
        &self.model.card.classes
    }

    /// Features and predicted classes of images given as pixels in [0, 1].
    pub fn judge(&self, pixels: &[f32]) -> anyhow::Result<(Features, Vec<usize>)> {
        let Net::Cnn(cnn) = &self.model.net else {
            unreachable!("checked when loaded")
        };
        let InputSpec::Image {
            channels,
            height,
            width,
            ..
        } = self.model.card.input
        else {
            unreachable!("checked when loaded")
        };
        let size = channels * height * width;
        let (mut values, mut classes, mut dim) = (Vec::new(), Vec::new(), 0);
        for chunk in pixels.chunks(CHUNK * size) {
            let n = chunk.len() / size;
            let x = Tensor::from_slice(chunk, (n, channels, height, width), &trident_nn::Device::Cpu)?
                .affine(1.0 / self.std as f64, -(self.mean / self.std) as f64)?;
            let (f, logits) = cnn.features_and_logits(&x)?;
            dim = f.dim(1)?;
            values.extend(f.flatten_all()?.to_vec1::<f32>()?);
            classes.extend(trident_nn::ops::argmax_rows(&logits)?);
        }
        Ok((Features::new(values, dim.max(1))?, classes))
    }
}

/// Up to `n` real images of a loader's first epoch as pixels in [0, 1].
pub fn real_pixels<D: Dataset + 'static>(
    loader: &DataLoader<D, Batch>,
    n: usize,
    (mean, std): (f32, f32),
) -> anyhow::Result<Vec<f32>> {
    let mut out = Vec::new();
    let mut taken = 0;
    for batch in loader.epoch(0) {
        let Batch::Image(x, _) = batch? else {
            bail!("not image data")
        };
        let m = x.dim(0)?.min(n - taken);
        out.extend(
            x.narrow(0, 0, m)?
                .affine(std as f64, mean as f64)?
                .flatten_all()?
                .to_vec1::<f32>()?,
        );
        taken += m;
        if taken == n {
            break;
        }
    }
    Ok(out)
}

/// Sample quality of one set of images against the reference images.
#[derive(Debug, Clone, Serialize)]
pub struct Quality {
    /// Images compared on each side.
    pub images: usize,
    /// Fréchet distance of the judge's features.
    pub frechet: f64,
    /// Unbiased squared kernel MMD (KID's cubic kernel).
    pub kernel_mmd2: f64,
    /// Leave-one-out 1-NN two-sample accuracy (0.5: indistinguishable).
    pub one_nn_accuracy: f64,
    /// The judge's class histogram of the set (fractions, in the judge's class order).
    pub class_shares: Vec<f64>,
    /// Entropy of that histogram, in bits (log2 of the class count when uniform).
    pub class_entropy_bits: f64,
}

impl Quality {
    fn of(set: &(Features, Vec<usize>), reference: &Features, classes: usize) -> anyhow::Result<Self> {
        let mut counts = vec![0usize; classes];
        set.1.iter().for_each(|&c| counts[c] += 1);
        let n = set.1.len().max(1) as f64;
        let class_shares: Vec<f64> = counts.iter().map(|&c| c as f64 / n).collect();
        let class_entropy_bits = -class_shares
            .iter()
            .filter(|&&p| p > 0.0)
            .map(|p| p * p.log2())
            .sum::<f64>();
        Ok(Quality {
            images: set.0.len(),
            frechet: frechet_distance(&set.0, reference)?,
            kernel_mmd2: kernel_mmd2(&set.0, reference)?,
            one_nn_accuracy: one_nn_accuracy(&set.0, reference)?,
            class_shares,
            class_entropy_bits,
        })
    }
}

/// The report of a trained GAN.
#[derive(Debug, Clone, Serialize)]
pub struct GanReport {
    /// The judge's checkpoint.
    pub judge: PathBuf,
    /// The judge's classes.
    pub classes: Vec<String>,
    /// Generated images against the test images.
    pub generated: Quality,
    /// Real training images against the test images: what a perfect generator reaches.
    pub floor: Quality,
}

impl GanReport {
    /// The lines printed for the report.
    pub fn lines(&self) -> Vec<String> {
        let row = |name: &str, q: &Quality| {
            format!(
                "{name:<10} FD {:>8.3}  MMD² {:>8.4}  1-NN acc {:.4}  class entropy {:.3} bits",
                q.frechet, q.kernel_mmd2, q.one_nn_accuracy, q.class_entropy_bits
            )
        };
        let mut out = vec![
            format!(
                "sample quality in the feature space of {} ({} generated and {} real training images against {} test images):",
                self.judge.display(),
                self.generated.images,
                self.floor.images,
                self.generated.images.max(self.floor.images)
            ),
            row("generated", &self.generated),
            row("real", &self.floor),
            "judged classes of the generated images:".into(),
        ];
        out.extend(
            self.classes
                .iter()
                .zip(&self.generated.class_shares)
                .map(|(c, s)| format!("  {c:>12} {:5.1} %", 100.0 * s)),
        );
        out
    }
}

/// Scores a trained GAN: `gan.samples` generated images and as many real training images
/// against the test images; writes `report.json`, `samples.png` and `classes.png` into
/// `out` and returns the report.
pub fn report<D: Dataset + 'static, T: Dataset + 'static>(
    step: &GanStep<'_>,
    section: &GanSection,
    train: &DataLoader<D, Batch>,
    test: &DataLoader<T, Batch>,
    out: &Path,
) -> anyhow::Result<GanReport> {
    std::fs::create_dir_all(out).with_context(|| out.display().to_string())?;
    let judge = Judge::load(&section.judge, step.gan.shape.image)?;
    let scale = (step.mean, step.std);
    let n = section.samples;
    let test_px = real_pixels(test, n, scale)?;
    let (reference, _) = judge.judge(&test_px)?;
    let n = reference.len();
    let generated = judge.judge(&step.generate(n, REPORT_SEED)?)?;
    let real = judge.judge(&real_pixels(train, n, scale)?)?;
    let classes = judge.classes().to_vec();
    let report = GanReport {
        judge: judge.dir.clone(),
        generated: Quality::of(&generated, &reference, classes.len())?,
        floor: Quality::of(&real, &reference, classes.len())?,
        classes,
    };
    super::write_atomic(&out.join("report.json"), &serde_json::to_vec_pretty(&report)?)?;
    step.grid(&out.join("samples.png"))?;
    class_chart(&out.join("classes.png"), &report)?;
    Ok(report)
}

/// The judge's class shares of generated and real images, as two lines over the classes.
fn class_chart(path: &Path, r: &GanReport) -> anyhow::Result<()> {
    let pts = |q: &Quality| -> Vec<(f64, f64)> {
        q.class_shares
            .iter()
            .enumerate()
            .map(|(i, s)| (i as f64, 100.0 * s))
            .collect()
    };
    trident_train::plot::xy_chart(
        path,
        "judged class of generated and real images (x: class index)",
        "class",
        "% of images",
        &[("generated", pts(&r.generated)), ("real (train)", pts(&r.floor))],
    )?;
    Ok(())
}

/// What runs after every epoch: the sample grid, and with a judge the Fréchet distance of
/// `epoch_samples` generated images to as many validation images (the figure that picks
/// `best`).
pub struct EpochReview<'a> {
    step: &'a GanStep<'a>,
    dir: PathBuf,
    judge: Option<(Judge, Features)>,
    samples: usize,
}

impl<'a> EpochReview<'a> {
    /// The review of a run in `dir`; the judge's features of the validation images are
    /// computed once here.
    pub fn new<V: Dataset + 'static>(
        step: &'a GanStep<'a>,
        c: &RunConfig,
        val: Option<&DataLoader<V, Batch>>,
    ) -> anyhow::Result<Self> {
        let judge = match (&c.gan, val) {
            (Some(g), Some(val)) => {
                let judge = Judge::load(&g.judge, step.gan.shape.image)?;
                let px = real_pixels(val, g.epoch_samples, (step.mean, step.std))?;
                let (features, _) = judge.judge(&px)?;
                Some((judge, features))
            }
            (Some(_), None) => bail!(
                "[gan] judge scores each epoch against validation images: set data.val_fraction above 0"
            ),
            (None, _) => None,
        };
        let samples = match (&c.gan, &judge) {
            (Some(_), Some((_, f))) => f.len(),
            _ => 0,
        };
        Ok(EpochReview {
            step,
            dir: c.run.dir.clone(),
            judge,
            samples,
        })
    }

    /// Epoch `epoch`'s figures; `val_fd` among them, when there is a judge, picks `best`.
    pub fn review(&self, epoch: u64) -> anyhow::Result<BTreeMap<String, f64>> {
        let grids = self.dir.join("samples");
        std::fs::create_dir_all(&grids).with_context(|| grids.display().to_string())?;
        let grid = grids.join(format!("epoch-{:03}.png", epoch + 1));
        self.step.grid(&grid)?;
        std::fs::copy(&grid, self.dir.join("samples.png")).context("samples.png")?;
        let mut figures = BTreeMap::new();
        let Some((judge, reference)) = &self.judge else {
            return Ok(figures);
        };
        let (features, _) = judge.judge(&self.step.generate(self.samples, EPOCH_SEED)?)?;
        let fd = frechet_distance(&features, reference)?;
        figures.insert("val_fd".into(), fd);
        Ok(figures)
    }
}
