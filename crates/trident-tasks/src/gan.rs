//! `[model] kind = "gan"`: a generator and a discriminator trained against each other on
//! images ([`trident_train::trainer::Trainer::fit_adversarial`]), a grid of samples drawn
//! after every epoch (`samples/epoch-NNN.png` and `samples.png`), and, with `[gan] judge`,
//! the samples scored in the feature space of a trained classifier of the same images:
//! after every epoch the Fréchet distance to the validation images (it picks `best`),
//! after training (and in `trident eval`) the full report against the test images — the
//! Fréchet distance, the kernel MMD², the 1-NN two-sample accuracy and the judge's class
//! histogram of the samples — beside the same figures for real training images (the floor
//! a perfect generator would reach).

use crate::config::{GanSection, RunConfig};
use anyhow::{bail, Context};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use trident_data::{DataLoader, Dataset};
use trident_nn::vision::Cnn;
use trident_nn::Tensor;
use trident_train::quality::{frechet_distance, kernel_mmd2, one_nn_accuracy, Features};
use trident_zoo::gan_step::{GanStep, CHUNK, EPOCH_SEED, REPORT_SEED};
use trident_zoo::{Batch, InputSpec, Model};

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
        if !model.net.is::<Cnn>() {
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
        let Some(cnn) = self.model.net.get::<Cnn>() else {
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
    let judge = Judge::load(&section.judge, step.image_shape())?;
    let scale = step.pixel_scale();
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
    crate::write_atomic(&out.join("report.json"), &serde_json::to_vec_pretty(&report)?)?;
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
                let judge = Judge::load(&g.judge, step.image_shape())?;
                let px = real_pixels(val, g.epoch_samples, step.pixel_scale())?;
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
