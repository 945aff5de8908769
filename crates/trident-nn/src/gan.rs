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
//! WGAN-GP (Gulrajani et al. 2017, arXiv:1704.00028) penalises the critic's gradient with
//! respect to its input, so its loss is differentiated twice. candle's autograd gives a
//! gradient as numbers, not as a graph; [`Discriminator::input_gradient`] therefore builds
//! the critic's input gradient as a graph of its own from the kernels the critic is made
//! of — the linear layer's weight broadcast back, LeakyReLU's slope (constant almost
//! everywhere, so its own derivative is zero), and a transposed convolution with the same
//! kernel for each convolution — and candle differentiates that graph with respect to the
//! critic's weights. It needs the critic without batch norm (as the paper's).

use crate::dense::leaky_relu;
use crate::layers::{BatchNorm2d, Ctx};
use crate::ops::{self, Act};
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
            let x = crate::dense::linear(z, &self.fc_w, Some(&self.fc_b))?;
            let x = x.reshape((n, 2 * self.shape.width, h / 4, w / 4))?;
            self.bn0.forward_act(&x, ctx, Act::Relu)?
        };
        let x = {
            let _layer = layer(|| "generator.up1".into());
            self.bn1
                .forward_act(&ops::conv_transpose2d(&x, &self.up1, 2, 1)?, ctx, Act::Relu)?
        };
        let _layer = layer(|| "generator.up2".into());
        ops::conv_transpose2d_bias(&x, &self.up2, &self.up2_b, 2, 1)?.tanh()
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
            leaky_relu(&ops::conv2d_bias(x, &self.conv1_w, &self.conv1_b, 2, 1)?)?
        };
        let h = {
            let _layer = layer(|| "discriminator.conv2".into());
            match &self.bn2 {
                SecondNorm::BatchNorm(bn) => {
                    bn.forward_act(&ops::conv2d(&h, &self.conv2_w, 2, 1)?, ctx, Act::LeakyRelu)?
                }
                SecondNorm::Bias(b) => leaky_relu(&ops::conv2d_bias(&h, &self.conv2_w, b, 2, 1)?)?,
            }
        };
        let _layer = layer(|| "discriminator.fc".into());
        crate::dense::linear(&h.flatten_from(1)?, &self.fc_w, Some(&self.fc_b))?.squeeze(1)
    }

    /// The gradient of the summed scores with respect to the images `x` `[n, c, h, w]`, as a
    /// graph of the critic's weights (so that a loss on it trains them: WGAN-GP's
    /// penalty). By the chain rule backwards through [`Self::forward`]: the linear layer's
    /// weight as a map, times LeakyReLU's slope at the second layer's pre-activation, through
    /// the second convolution's transpose, times the slope at the first, through the first's.
    /// The slopes (1 or 0.2) are constants: LeakyReLU's second derivative is zero except at
    /// 0. Only for a critic without batch norm (its gradient couples the batch's images).
    pub fn input_gradient(&self, x: &Tensor) -> Result<Tensor> {
        let SecondNorm::Bias(b2) = &self.bn2 else {
            candle_core::bail!(
                "gan: the gradient penalty needs a critic without batch norm (critic_batch_norm = false)"
            )
        };
        let _layer = crate::trace::layer(|| "discriminator.input_gradient".into());
        // The pre-activations, only for the slopes: nothing is differentiated through them.
        let (x, w1, w2) = (x.detach(), self.conv1_w.detach(), self.conv2_w.detach());
        let a1 = ops::conv2d_bias(&x, &w1, &self.conv1_b.detach(), 2, 1)?;
        let a2 = ops::conv2d_bias(&leaky_relu(&a1)?, &w2, &b2.detach(), 2, 1)?;
        let slope = |a: &Tensor| a.gt(0f32)?.to_dtype(a.dtype())?.affine(0.8, 0.2);
        let g = self.fc_w.reshape(a2.shape().dims()[1..].to_vec())?.unsqueeze(0)?;
        let g = g.broadcast_mul(&slope(&a2)?)?;
        let g = ops::conv_transpose2d(&g, &self.conv2_w, 2, 1)?.mul(&slope(&a1)?)?;
        ops::conv_transpose2d(&g, &self.conv1_w, 2, 1)
    }
}

/// WGAN-GP's penalty: `lambda · mean((‖∇ₓ D(x̂)‖₂ − 1)²)` at `x̂ = ε·real + (1 − ε)·fake`,
/// one `ε ~ U[0, 1]` per image drawn from `seed`. Differentiable with respect to the
/// critic's weights ([`Discriminator::input_gradient`]); `real` and `fake` are constants.
pub fn gradient_penalty(
    critic: &Discriminator,
    real: &Tensor,
    fake: &Tensor,
    lambda: f32,
    seed: u64,
) -> Result<Tensor> {
    let n = real.dim(0)?;
    let mut state = ops::splitmix(seed ^ 0x6770_656e);
    let eps: Vec<f32> = (0..n)
        .map(|_| {
            state = ops::splitmix(state);
            (state >> 40) as f32 / (1u64 << 24) as f32
        })
        .collect();
    let eps = Tensor::from_vec(eps, (n, 1, 1, 1), real.device())?;
    let (real, fake) = (real.detach(), fake.detach());
    let mixed = (real.broadcast_mul(&eps)? + fake.broadcast_mul(&eps.affine(-1.0, 1.0)?)?)?;
    let g = critic.input_gradient(&mixed)?;
    // A tiny floor under the root: its derivative is infinite at zero.
    let norm = (g.sqr()?.flatten_from(1)?.sum(1)? + 1e-12)?.sqrt()?;
    (norm - 1.0)?.sqr()?.mean_all()? * lambda as f64
}

/// `ln(1 + eˣ)` without overflow, one graph node (its derivative is the logistic).
pub fn softplus(x: &Tensor) -> Result<Tensor> {
    fn f(x: f64) -> f64 {
        x.max(0.0) + (-x.abs()).exp().ln_1p()
    }
    crate::custom::elementwise("softplus", f, crate::dense::logistic_f64)(x)
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
    /// WGAN-GP: WGAN's losses, the critic's plus [`gradient_penalty`] instead of clipping.
    WassersteinGp {
        /// The penalty's weight λ (the paper's 10).
        lambda: f32,
    },
}

impl GanLoss {
    /// The discriminator's (critic's) loss from its scores of real and generated images
    /// (WGAN-GP's [`gradient_penalty`] is added to it by the caller, who has the images).
    pub fn critic(&self, real: &Tensor, fake: &Tensor) -> Result<Tensor> {
        match self {
            // BCE(σ(r), 1) + BCE(σ(f), 0) = softplus(−r) + softplus(f)
            GanLoss::Standard => softplus(&real.neg()?)?.mean_all()? + softplus(fake)?.mean_all()?,
            GanLoss::Wasserstein { .. } | GanLoss::WassersteinGp { .. } => {
                fake.mean_all()? - real.mean_all()?
            }
        }
    }

    /// The generator's loss from the discriminator's scores of its images.
    pub fn generator(&self, fake: &Tensor) -> Result<Tensor> {
        match self {
            GanLoss::Standard => softplus(&fake.neg()?)?.mean_all(),
            GanLoss::Wasserstein { .. } | GanLoss::WassersteinGp { .. } => fake.mean_all()?.neg(),
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

    /// A critic without batch norm, its weights scaled from N(0, 0.02) to N(0, 0.3) so that
    /// its input gradient's norm is near 1 and the penalty's gradient is not negligible.
    fn critic(image: (usize, usize, usize)) -> (Params, Discriminator) {
        let p = Params::new();
        let shape = GanShape {
            image,
            z: 5,
            width: 2,
            critic_batch_norm: false,
        };
        let d = Discriminator::new(&p.builder(5, None).pp("discriminator"), shape).unwrap();
        for name in [
            "conv1.weight",
            "conv2.weight",
            "fc.weight",
            "conv1.bias",
            "conv2.bias",
        ] {
            let v = &p.get(&format!("discriminator.{name}")).unwrap().var;
            let scaled = if name.ends_with("bias") {
                latent(1, v.elem_count(), 9).unwrap().reshape(v.shape()).unwrap() * 0.1
            } else {
                v.as_tensor() * 15.0
            };
            v.set(&scaled.unwrap()).unwrap();
        }
        (p, d)
    }

    fn images(n: usize, (c, h, w): (usize, usize, usize), seed: u64) -> Tensor {
        latent(n, c * h * w, seed)
            .unwrap()
            .tanh()
            .unwrap()
            .reshape((n, c, h, w))
            .unwrap()
    }

    #[test]
    fn the_critics_input_gradient_graph_is_autograds_gradient() {
        let image = (2, 8, 12);
        let (_p, d) = critic(image);
        let x = candle_core::Var::from_tensor(&images(3, image, 1)).unwrap();
        let scores = d.forward(x.as_tensor(), &Ctx::train(0, 0)).unwrap();
        let grads = scores.sum_all().unwrap().backward().unwrap();
        let want: Vec<f32> = grads
            .get(x.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let got: Vec<f32> = d
            .input_gradient(x.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(got.len(), want.len());
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(scale > 1e-3, "a gradient to compare: {scale}");
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-5 * scale, "{g} vs {w}");
        }
        // A critic with batch norm is refused by name.
        let p = Params::new();
        let bn = Discriminator::new(
            &p.builder(5, None),
            GanShape {
                image,
                z: 5,
                width: 2,
                critic_batch_norm: true,
            },
        )
        .unwrap();
        let e = bn.input_gradient(x.as_tensor()).unwrap_err().to_string();
        assert!(e.contains("critic_batch_norm = false"), "{e}");
    }

    #[test]
    fn the_gradient_penalty_trains_the_critics_weights_by_its_true_gradient() {
        let image = (1, 8, 8);
        let (p, d) = critic(image);
        let (real, fake) = (images(3, image, 2), images(3, image, 3));
        let f = || gradient_penalty(&d, &real, &fake, 10.0, 7);
        let penalty = f().unwrap().to_scalar::<f32>().unwrap();
        assert!(penalty > 0.1, "a penalty to differentiate: {penalty}");
        // The same seed mixes the same way; another does not.
        assert_eq!(penalty, f().unwrap().to_scalar::<f32>().unwrap());
        let other = gradient_penalty(&d, &real, &fake, 10.0, 8).unwrap();
        assert_ne!(penalty, other.to_scalar::<f32>().unwrap());
        // Second-order: the penalty's gradient with respect to every weight it depends on,
        // against finite differences of the penalty itself.
        let vars: Vec<(String, candle_core::Var)> = ["conv1.weight", "conv2.weight", "fc.weight"]
            .iter()
            .map(|n| {
                (
                    n.to_string(),
                    p.get(&format!("discriminator.{n}")).unwrap().var.clone(),
                )
            })
            .collect();
        let vars: Vec<(&str, &candle_core::Var)> = vars.iter().map(|(n, v)| (n.as_str(), v)).collect();
        let r = crate::gradcheck(f, &vars, 1e-3, 1e-3, 1e-2).unwrap();
        assert!(r.passed() && r.checked == 32 + 128 + 16, "{r}");
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
