//! Generative adversarial networks on images: DCGAN's generator and discriminator (Radford
//! et al. 2016, arXiv:1511.06434) for `c × h × w` images with `h` and `w` divisible by 4,
//! and the two losses Trident trains them with — the non-saturating GAN loss of the DCGAN
//! paper and the Wasserstein critic loss with weight clipping (Arjovsky et al. 2017,
//! arXiv:1701.07875).
//!
//! The generator maps `z ~ N(0, I)` through a linear layer to `2·width` maps of a quarter
//! of the image's size, then two fractionally-strided (transposed) 4×4 convolutions of
//! stride 2, with batch norm and ReLU between, and `tanh` out: pixels in [−1, 1]. The
//! discriminator mirrors it: two 4×4 stride-2 convolutions with LeakyReLU(0.2) (batch norm
//! on the second, as in the paper; none in a critic trained with `batch_norm = false`) and
//! a linear layer to one logit. Weights start from N(0, 0.02), the paper's initialisation.
//!
//! WGAN-GP is not offered: its penalty differentiates the critic's input gradient again
//! (a second-order gradient), which candle's autograd does not provide.

use crate::layers::{BatchNorm2d, Ctx};
use crate::ops;
use crate::params::{Init, ParamBuilder};
use candle_core::{Device, Result, Tensor};

/// The size of the networks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GanShape {
    /// Image channels, height and width (height and width divisible by 4).
    pub image: (usize, usize, usize),
    /// Width of the latent vector `z`.
    pub z: usize,
    /// Channels of the layer next to the image (the other has twice as many).
    pub width: usize,
    /// Batch norm in the discriminator's second layer.
    pub critic_batch_norm: bool,
}

/// DCGAN's generator.
pub struct Generator {
    fc_w: Tensor,
    fc_b: Tensor,
    bn0: BatchNorm2d,
    up1: Tensor,
    bn1: BatchNorm2d,
    up2: Tensor,
    up2_b: Tensor,
    shape: GanShape,
}

const INIT: Init = Init::Normal(0.02);

impl Generator {
    /// A generator of `shape`, its parameters under `pb`.
    pub fn new(pb: &ParamBuilder, shape: GanShape) -> Result<Self> {
        let (c, h, w) = shape.image;
        if h % 4 != 0 || w % 4 != 0 || h == 0 || w == 0 {
            candle_core::bail!("gan: image {h}x{w}: height and width must be multiples of 4")
        }
        let (w1, w2) = (shape.width, 2 * shape.width);
        let cells = w2 * (h / 4) * (w / 4);
        Ok(Generator {
            fc_w: pb.pp("fc").get((cells, shape.z), "weight", INIT)?,
            fc_b: pb.pp("fc").get(cells, "bias", Init::Zeros)?,
            bn0: BatchNorm2d::new(&pb.pp("bn0"), w2)?,
            up1: pb.pp("up1").get((w2, w1, 4, 4), "weight", INIT)?,
            bn1: BatchNorm2d::new(&pb.pp("bn1"), w1)?,
            up2: pb.pp("up2").get((w1, c, 4, 4), "weight", INIT)?,
            up2_b: pb.pp("up2").get(c, "bias", Init::Zeros)?,
            shape,
        })
    }

    /// Images `[n, c, h, w]` in [−1, 1] from latent vectors `z` `[n, z]`.
    pub fn forward(&self, z: &Tensor, ctx: &Ctx) -> Result<Tensor> {
        use crate::trace::layer;
        let (_, h, w) = self.shape.image;
        let n = z.dim(0)?;
        let x = {
            let _layer = layer(|| "generator.fc".into());
            let x = z.matmul(&self.fc_w.t()?)?.broadcast_add(&self.fc_b)?;
            let x = x.reshape((n, 2 * self.shape.width, h / 4, w / 4))?;
            self.bn0.forward(&x, ctx)?.relu()?
        };
        let x = {
            let _layer = layer(|| "generator.up1".into());
            self.bn1
                .forward(&ops::conv_transpose2d(&x, &self.up1, 2, 1)?, ctx)?
                .relu()?
        };
        let _layer = layer(|| "generator.up2".into());
        ops::channel_bias(&ops::conv_transpose2d(&x, &self.up2, 2, 1)?, &self.up2_b)?.tanh()
    }
}

/// DCGAN's discriminator (a WGAN's critic): one logit (score) per image.
pub struct Discriminator {
    conv1_w: Tensor,
    conv1_b: Tensor,
    conv2_w: Tensor,
    /// Batch norm after the second convolution, or its bias when there is none.
    bn2: SecondNorm,
    fc_w: Tensor,
    fc_b: Tensor,
}

/// The second layer's normalisation: batch norm, or a plain bias.
enum SecondNorm {
    BatchNorm(BatchNorm2d),
    Bias(Tensor),
}

impl Discriminator {
    /// A discriminator of `shape`, its parameters under `pb`.
    pub fn new(pb: &ParamBuilder, shape: GanShape) -> Result<Self> {
        let (c, h, w) = shape.image;
        let (w1, w2) = (shape.width, 2 * shape.width);
        Ok(Discriminator {
            conv1_w: pb.pp("conv1").get((w1, c, 4, 4), "weight", INIT)?,
            conv1_b: pb.pp("conv1").get(w1, "bias", Init::Zeros)?,
            conv2_w: pb.pp("conv2").get((w2, w1, 4, 4), "weight", INIT)?,
            bn2: if shape.critic_batch_norm {
                SecondNorm::BatchNorm(BatchNorm2d::new(&pb.pp("bn2"), w2)?)
            } else {
                SecondNorm::Bias(pb.pp("conv2").get(w2, "bias", Init::Zeros)?)
            },
            fc_w: pb.pp("fc").get((1, w2 * (h / 4) * (w / 4)), "weight", INIT)?,
            fc_b: pb.pp("fc").get(1, "bias", Init::Zeros)?,
        })
    }

    /// One logit per image `[n]` of images `[n, c, h, w]` in [−1, 1].
    pub fn forward(&self, x: &Tensor, ctx: &Ctx) -> Result<Tensor> {
        use crate::trace::layer;
        let h = {
            let _layer = layer(|| "discriminator.conv1".into());
            let h = ops::conv2d(x, &self.conv1_w, 2, 1)?;
            leaky_relu(&ops::channel_bias(&h, &self.conv1_b)?)?
        };
        let h = {
            let _layer = layer(|| "discriminator.conv2".into());
            let h = ops::conv2d(&h, &self.conv2_w, 2, 1)?;
            let h = match &self.bn2 {
                SecondNorm::BatchNorm(bn) => bn.forward(&h, ctx)?,
                SecondNorm::Bias(b) => ops::channel_bias(&h, b)?,
            };
            leaky_relu(&h)?
        };
        let _layer = layer(|| "discriminator.fc".into());
        h.flatten_from(1)?
            .matmul(&self.fc_w.t()?)?
            .broadcast_add(&self.fc_b)?
            .squeeze(1)
    }
}

/// LeakyReLU with slope 0.2 below zero, one graph node.
pub fn leaky_relu(x: &Tensor) -> Result<Tensor> {
    fn f(x: f64) -> f64 {
        if x > 0.0 {
            x
        } else {
            0.2 * x
        }
    }
    fn df(x: f64) -> f64 {
        if x > 0.0 {
            1.0
        } else {
            0.2
        }
    }
    crate::custom::elementwise("leaky_relu", f, df)(x)
}

/// `ln(1 + eˣ)` without overflow, one graph node (its derivative is the logistic).
pub fn softplus(x: &Tensor) -> Result<Tensor> {
    fn f(x: f64) -> f64 {
        x.max(0.0) + (-x.abs()).exp().ln_1p()
    }
    fn df(x: f64) -> f64 {
        if x >= 0.0 {
            1.0 / (1.0 + (-x).exp())
        } else {
            let e = x.exp();
            e / (1.0 + e)
        }
    }
    crate::custom::elementwise("softplus", f, df)(x)
}

/// The adversarial objective.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GanLoss {
    /// Non-saturating GAN (DCGAN): the discriminator minimises the binary cross-entropy of
    /// real (1) against generated (0), the generator `−log D(G(z))`.
    Standard,
    /// WGAN: the critic minimises `mean D(G(z)) − mean D(x)` and its weights are clipped to
    /// `[−clip, clip]` after every update; the generator minimises `−mean D(G(z))`.
    Wasserstein {
        /// The clipping bound.
        clip: f32,
    },
}

impl GanLoss {
    /// The discriminator's (critic's) loss from its scores of real and generated images.
    pub fn critic(&self, real: &Tensor, fake: &Tensor) -> Result<Tensor> {
        match self {
            // BCE(σ(r), 1) + BCE(σ(f), 0) = softplus(−r) + softplus(f)
            GanLoss::Standard => softplus(&real.neg()?)?.mean_all()? + softplus(fake)?.mean_all()?,
            GanLoss::Wasserstein { .. } => fake.mean_all()? - real.mean_all()?,
        }
    }

    /// The generator's loss from the discriminator's scores of its images.
    pub fn generator(&self, fake: &Tensor) -> Result<Tensor> {
        match self {
            GanLoss::Standard => softplus(&fake.neg()?)?.mean_all(),
            GanLoss::Wasserstein { .. } => fake.mean_all()?.neg(),
        }
    }
}

/// `n` latent vectors `[n, width]` from N(0, 1), drawn from `seed` (Box–Muller on a
/// splitmix stream): the same seed gives the same vectors, so a resumed run draws what an
/// uninterrupted one would.
pub fn latent(n: usize, width: usize, seed: u64) -> Result<Tensor> {
    let len = n * width;
    let mut v = Vec::with_capacity(len + 1);
    let mut state = ops::splitmix(seed ^ 0x6c61_7465_6e74);
    while v.len() < len {
        state = ops::splitmix(state);
        let u1 = ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        state = ops::splitmix(state);
        let u2 = (state >> 11) as f64 / (1u64 << 53) as f64;
        let r = (-2.0 * u1.ln()).sqrt();
        let t = std::f64::consts::TAU * u2;
        v.push((r * t.cos()) as f32);
        v.push((r * t.sin()) as f32);
    }
    v.truncate(len);
    Tensor::from_vec(v, (n, width), &Device::Cpu)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Params;

    fn shape(bn: bool) -> GanShape {
        GanShape {
            image: (1, 8, 12),
            z: 5,
            width: 4,
            critic_batch_norm: bn,
        }
    }

    #[test]
    fn the_generator_makes_images_the_discriminator_scores() {
        for bn in [true, false] {
            let p = Params::new();
            let g = Generator::new(&p.builder(1, None).pp("generator"), shape(bn)).unwrap();
            let d = Discriminator::new(&p.builder(2, None).pp("discriminator"), shape(bn)).unwrap();
            let z = latent(3, 5, 7).unwrap();
            let x = g.forward(&z, &Ctx::train(0, 0)).unwrap();
            assert_eq!(x.dims(), [3, 1, 8, 12]);
            let v: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
            assert!(v.iter().all(|p| (-1.0..=1.0).contains(p)));
            let s = d.forward(&x, &Ctx::train(0, 0)).unwrap();
            assert_eq!(s.dims(), [3]);
            // The critic without batch norm has a bias on its second layer instead.
            assert_eq!(p.get("discriminator.bn2.weight").is_some(), bn);
            assert_eq!(p.get("discriminator.conv2.bias").is_some(), !bn);
        }
        let p = Params::new();
        let bad = GanShape {
            image: (1, 10, 12),
            ..shape(true)
        };
        assert!(Generator::new(&p.builder(0, None), bad).is_err());
    }

    #[test]
    fn the_losses_are_the_papers() {
        let dev = &Device::Cpu;
        let real = Tensor::new(&[2.0f32, -1.0], dev).unwrap();
        let fake = Tensor::new(&[0.5f32, -3.0], dev).unwrap();
        let sp = |x: f64| (1.0 + x.exp()).ln();
        let bce = (sp(-2.0) + sp(1.0)) / 2.0 + (sp(0.5) + sp(-3.0)) / 2.0;
        let got = GanLoss::Standard
            .critic(&real, &fake)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!((got as f64 - bce).abs() < 1e-6, "{got} vs {bce}");
        let got = GanLoss::Standard
            .generator(&fake)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!((got as f64 - (sp(-0.5) + sp(3.0)) / 2.0).abs() < 1e-6);
        let w = GanLoss::Wasserstein { clip: 0.01 };
        let got = w.critic(&real, &fake).unwrap().to_scalar::<f32>().unwrap();
        assert!((got - (-1.25 - 0.5)).abs() < 1e-6);
        let got = w.generator(&fake).unwrap().to_scalar::<f32>().unwrap();
        assert!((got - 1.25).abs() < 1e-6);
        // Softplus does not overflow, and its gradient is the logistic.
        let x = candle_core::Var::new(&[-200.0f32, 0.0, 200.0], dev).unwrap();
        let y = softplus(x.as_tensor()).unwrap();
        assert_eq!(y.to_vec1::<f32>().unwrap(), [0.0, 2f32.ln(), 200.0]);
        let g = y.sum_all().unwrap().backward().unwrap();
        assert_eq!(
            g.get(x.as_tensor()).unwrap().to_vec1::<f32>().unwrap(),
            [0.0, 0.5, 1.0]
        );
    }

    #[test]
    fn latent_vectors_are_standard_normal_and_seeded() {
        let a = latent(400, 50, 3).unwrap();
        assert_eq!(
            a.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            latent(400, 50, 3)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        );
        let v: Vec<f32> = a.flatten_all().unwrap().to_vec1().unwrap();
        let mean = v.iter().sum::<f32>() / v.len() as f32;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / v.len() as f32;
        assert!(
            mean.abs() < 0.02 && (var - 1.0).abs() < 0.03,
            "mean {mean} var {var}"
        );
        assert_ne!(
            v[..10],
            latent(1, 10, 4)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()[..]
        );
    }
}
