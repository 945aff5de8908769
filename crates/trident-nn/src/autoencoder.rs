//! Autoencoders: an encoder to a narrow code and a decoder back, trained to reconstruct
//! their input; optionally denoising (Gaussian noise on the input, the clean input as the
//! target). The reconstruction error of an example is its anomaly score.
//!
//! Two shapes: `dense` (fully connected, mirrored widths; any flat input, images
//! flattened) and `conv` (images: stride-2 convolutions down, a linear code, nearest
//! upsampling and convolutions back up).

use crate::layers::{sigmoid, Activation, Conv2d, Ctx, Linear, Mlp};
use crate::params::ParamBuilder;
use crate::trace::layer;
use candle_core::{bail, Result, Tensor};

/// How the decoder's last layer maps to the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Values in (0, 1): pixels scaled to [0, 1].
    Sigmoid,
    /// Any value: standardised features.
    Linear,
}

#[derive(Debug, Clone)]
enum Body {
    Dense {
        encoder: Mlp,
        decoder: Mlp,
    },
    Conv {
        down: Vec<Conv2d>,
        to_code: Linear,
        from_code: Linear,
        up: Vec<Conv2d>,
        /// `[channels, h, w]` of the last downsampled map.
        inner: (usize, usize, usize),
    },
}

/// An autoencoder (see the module).
#[derive(Debug, Clone)]
pub struct Autoencoder {
    body: Body,
    activation: Activation,
    output: Output,
    /// Standard deviation of the training inputs' Gaussian noise (0: plain autoencoder).
    noise: f32,
}

impl Autoencoder {
    /// A dense autoencoder on `input` values: `input → hidden… → code`, mirrored back.
    pub fn dense(
        pb: &ParamBuilder,
        input: usize,
        hidden: &[usize],
        code: usize,
        activation: Activation,
        output: Output,
        noise: f32,
    ) -> Result<Self> {
        if input == 0 || code == 0 || hidden.contains(&0) {
            bail!(
                "autoencoder: every width must be at least 1 (input {input}, hidden {hidden:?}, code {code})"
            )
        }
        let down: Vec<usize> = std::iter::once(input)
            .chain(hidden.iter().copied())
            .chain(std::iter::once(code))
            .collect();
        let up: Vec<usize> = down.iter().rev().copied().collect();
        Ok(Autoencoder {
            body: Body::Dense {
                encoder: Mlp::new(&pb.pp("encoder"), &down, activation.clone(), 0.0)?,
                decoder: Mlp::new(&pb.pp("decoder"), &up, activation.clone(), 0.0)?,
            },
            activation,
            output,
            noise,
        })
    }

    /// A convolutional autoencoder on `[channels, h, w]` images: one 3×3 stride-2
    /// convolution per entry of `widths` (each halving the size), a linear code of `code`
    /// values, then per level a nearest 2× upsampling and a 3×3 convolution back.
    pub fn conv(
        pb: &ParamBuilder,
        (c, h, w): (usize, usize, usize),
        widths: &[usize],
        code: usize,
        activation: Activation,
        output: Output,
        noise: f32,
    ) -> Result<Self> {
        let scale = 1usize << widths.len();
        if widths.is_empty() || widths.contains(&0) || code == 0 {
            bail!("conv autoencoder: channels {widths:?} must be one or more positive widths, code {code} at least 1")
        }
        if !h.is_multiple_of(scale) || !w.is_multiple_of(scale) {
            bail!(
                "conv autoencoder: {h}x{w} images are not divisible by {scale} ({} stride-2 levels)",
                widths.len()
            )
        }
        let chans: Vec<usize> = std::iter::once(c).chain(widths.iter().copied()).collect();
        let down = chans
            .windows(2)
            .enumerate()
            .map(|(i, p)| Conv2d::new(&pb.pp(format!("down.{i}")), p[0], p[1], 3, 2, 1, true))
            .collect::<Result<Vec<_>>>()?;
        let inner = (*chans.last().expect("non-empty"), h / scale, w / scale);
        let flat = inner.0 * inner.1 * inner.2;
        let up = chans
            .windows(2)
            .rev()
            .enumerate()
            .map(|(i, p)| Conv2d::new(&pb.pp(format!("up.{i}")), p[1], p[0], 3, 1, 1, true))
            .collect::<Result<Vec<_>>>()?;
        Ok(Autoencoder {
            body: Body::Conv {
                down,
                to_code: Linear::new(&pb.pp("to_code"), flat, code)?,
                from_code: Linear::new(&pb.pp("from_code"), code, flat)?,
                up,
                inner,
            },
            activation,
            output,
            noise,
        })
    }

    /// The code of each example: `[batch, code]`.
    pub fn encode(&self, x: &Tensor) -> Result<Tensor> {
        let _layer = layer(|| "encoder".into());
        match &self.body {
            Body::Dense { encoder, .. } => encoder.forward(&x.flatten_from(1)?, &Ctx::eval()),
            Body::Conv { down, to_code, .. } => {
                let mut h = x.clone();
                for conv in down {
                    h = self.activation.forward(&conv.forward(&h)?)?;
                }
                to_code.forward(&h.flatten_from(1)?)
            }
        }
    }

    /// The reconstruction of codes, in the input's shape `shape`.
    pub fn decode(&self, code: &Tensor, shape: &[usize]) -> Result<Tensor> {
        let _layer = layer(|| "decoder".into());
        let y = match &self.body {
            Body::Dense { decoder, .. } => decoder.forward(code, &Ctx::eval())?,
            Body::Conv {
                from_code,
                up,
                inner: (c, h, w),
                ..
            } => {
                let b = code.dim(0)?;
                let mut y = self
                    .activation
                    .forward(&from_code.forward(code)?)?
                    .reshape((b, *c, *h, *w))?;
                let last = up.len() - 1;
                for (i, conv) in up.iter().enumerate() {
                    y = conv.forward(&upsample2(&y)?)?;
                    if i < last {
                        y = self.activation.forward(&y)?;
                    }
                }
                y
            }
        };
        let y = match self.output {
            Output::Sigmoid => sigmoid(&y)?,
            Output::Linear => y,
        };
        y.reshape(shape)
    }

    /// The input a training step sees: `x` with Gaussian noise when denoising (clipped to
    /// [0, 1] for a sigmoid output, whose targets lie there), drawn from the step's seed.
    pub fn corrupt(&self, x: &Tensor, ctx: &Ctx) -> Result<Tensor> {
        if !ctx.train || self.noise == 0.0 {
            return Ok(x.clone());
        }
        let n = x.elem_count();
        let mut v = Vec::with_capacity(n + 1);
        let mut state = crate::ops::splitmix(ctx.seed ^ 0x006e_6f69_7365);
        // Box–Muller on a splitmix stream: two normals per pair of uniforms.
        while v.len() < n {
            state = crate::ops::splitmix(state);
            let u1 = ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            state = crate::ops::splitmix(state);
            let u2 = (state >> 11) as f64 / (1u64 << 53) as f64;
            let r = (-2.0 * u1.ln()).sqrt() * self.noise as f64;
            let t = std::f64::consts::TAU * u2;
            v.push((r * t.cos()) as f32);
            v.push((r * t.sin()) as f32);
        }
        v.truncate(n);
        let noisy = (x + Tensor::from_vec(v, x.shape(), x.device())?)?;
        match self.output {
            Output::Sigmoid => noisy.clamp(0f32, 1f32),
            Output::Linear => Ok(noisy),
        }
    }

    /// The reconstruction of `x` (of a corrupted `x` when training a denoising model).
    pub fn forward(&self, x: &Tensor, ctx: &Ctx) -> Result<Tensor> {
        let input = self.corrupt(x, ctx)?;
        self.decode(&self.encode(&input)?, x.dims())
    }
}

/// Nearest-neighbour 2× upsampling of `[b, c, h, w]`: each value repeated over a 2×2
/// block; the backward pass sums each block. One op with its own backward: written as a
/// broadcast, candle's backward reduced over two strided axes, which took about half of the
/// convolutional autoencoder's step (`docs/PERFORMANCE.md`).
pub fn upsample2(x: &Tensor) -> Result<Tensor> {
    x.dims4()?;
    if x.dtype() != candle_core::DType::F32 {
        let (b, c, h, w) = x.dims4()?;
        return x
            .reshape((b, c, h, 1, w, 1))?
            .broadcast_as((b, c, h, 2, w, 2))?
            .contiguous()?
            .reshape((b, c, 2 * h, 2 * w));
    }
    x.contiguous()?.apply_op1(Upsample2)
}

struct Upsample2;

impl candle_core::CustomOp1 for Upsample2 {
    fn name(&self) -> &'static str {
        "trident-upsample2"
    }

    fn cpu_fwd(
        &self,
        s: &candle_core::CpuStorage,
        l: &candle_core::Layout,
    ) -> Result<(candle_core::CpuStorage, candle_core::Shape)> {
        let x = crate::kernel::f32_slice(s, l, "upsample2")?;
        let &[b, c, h, w] = l.dims() else {
            bail!("upsample2: expected [b, c, h, w], got {:?}", l.dims())
        };
        let mut out = vec![0f32; b * c * 4 * h * w];
        for (plane, o) in x.chunks(h * w).zip(out.chunks_mut(4 * h * w)) {
            for y in 0..h {
                let row = &plane[y * w..(y + 1) * w];
                let (top, bottom) = o[2 * y * 2 * w..(2 * y + 2) * 2 * w].split_at_mut(2 * w);
                for (k, &v) in row.iter().enumerate() {
                    top[2 * k] = v;
                    top[2 * k + 1] = v;
                }
                bottom.copy_from_slice(top);
            }
        }
        crate::kernel::output(out, (b, c, 2 * h, 2 * w))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let (b, c, h, w) = arg.dims4()?;
        let grad = grad.contiguous()?;
        let g = crate::kernel::with_f32(&grad, |g| {
            let mut dx = vec![0f32; b * c * h * w];
            for (d, plane) in dx.chunks_mut(h * w).zip(g.chunks(4 * h * w)) {
                for y in 0..h {
                    let (top, bottom) = (&plane[2 * y * 2 * w..], &plane[(2 * y + 1) * 2 * w..]);
                    for x in 0..w {
                        d[y * w + x] = top[2 * x] + top[2 * x + 1] + bottom[2 * x] + bottom[2 * x + 1];
                    }
                }
            }
            dx
        })?;
        Ok(Some(Tensor::from_vec(g, (b, c, h, w), arg.device())?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Params;
    use candle_core::Device;

    #[test]
    fn upsampling_repeats_each_value_in_a_two_by_two_block_and_sums_them_back() {
        let x = candle_core::Var::new(&[[[[1f32, 2.0], [3.0, 4.0]]]], &Device::Cpu).unwrap();
        let y = upsample2(x.as_tensor()).unwrap();
        assert_eq!(
            y.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            [1., 1., 2., 2., 1., 1., 2., 2., 3., 3., 4., 4., 3., 3., 4., 4.]
        );
        let w = Tensor::arange(0f32, 16.0, &Device::Cpu)
            .unwrap()
            .reshape((1, 1, 4, 4))
            .unwrap();
        let g = (y * w).unwrap().sum_all().unwrap().backward().unwrap();
        let g = g
            .get(x.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        // Block sums of 0..16 laid out 4×4: (0+1+4+5), (2+3+6+7), (8+9+12+13), (10+11+14+15).
        assert_eq!(g, [10., 18., 42., 50.]);
    }

    #[test]
    fn both_shapes_reconstruct_in_the_input_shape_and_noise_only_trains() {
        let p = Params::new();
        let x = Tensor::rand(0f32, 1.0, (3, 1, 8, 8), &Device::Cpu).unwrap();
        let dense = Autoencoder::dense(
            &p.builder(1, None).pp("d"),
            64,
            &[16],
            4,
            Activation::Relu,
            Output::Sigmoid,
            0.3,
        )
        .unwrap();
        let conv = Autoencoder::conv(
            &p.builder(1, None).pp("c"),
            (1, 8, 8),
            &[4, 8],
            4,
            Activation::Relu,
            Output::Sigmoid,
            0.0,
        )
        .unwrap();
        for m in [&dense, &conv] {
            let y = m.forward(&x, &Ctx::eval()).unwrap();
            assert_eq!(y.dims(), x.dims());
            assert_eq!(crate::layers::mse_per_example(&x, &y).unwrap().dims(), [3]);
        }
        assert_eq!(
            dense.corrupt(&x, &Ctx::eval()).unwrap().to_vec3::<f32>().ok(),
            x.to_vec3::<f32>().ok()
        );
        let a = dense.corrupt(&x, &Ctx::train(5, 1)).unwrap();
        let b = dense.corrupt(&x, &Ctx::train(5, 1)).unwrap();
        let c = dense.corrupt(&x, &Ctx::train(5, 2)).unwrap();
        let diff = |u: &Tensor, v: &Tensor| {
            (u - v)
                .unwrap()
                .abs()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
        };
        assert_eq!(diff(&a, &b), 0.0, "the same step draws the same noise");
        assert!(diff(&a, &c) > 0.0 && diff(&a, &x) > 0.0);
        let (lo, hi) = (
            a.min_all().unwrap().to_scalar::<f32>().unwrap(),
            a.max_all().unwrap().to_scalar::<f32>().unwrap(),
        );
        assert!(lo >= 0.0 && hi <= 1.0, "clipped to the sigmoid's range");
        assert!(Autoencoder::conv(
            &p.builder(1, None).pp("e"),
            (1, 6, 6),
            &[4, 8],
            4,
            Activation::Relu,
            Output::Linear,
            0.0
        )
        .is_err());
    }

    #[test]
    fn conv_autoencoder_gradients_match_finite_differences() {
        let p = Params::new();
        let m = Autoencoder::conv(
            &p.builder(3, None),
            (1, 4, 4),
            &[2],
            3,
            Activation::Tanh,
            Output::Sigmoid,
            0.0,
        )
        .unwrap();
        let x = Tensor::rand(0f32, 1.0, (2, 1, 4, 4), &Device::Cpu).unwrap();
        let own = p.all();
        let vars: Vec<(&str, &candle_core::Var)> = own.iter().map(|p| (p.name.as_str(), &p.var)).collect();
        // Every weight of the convolutions, the code layers and the upsampling path, in f32
        // (step and tolerance as the crate's other f32 checks).
        let r = crate::gradcheck(
            || {
                let y = m.forward(&x, &Ctx::eval())?;
                crate::layers::mse_per_example(&x, &y)
            },
            &vars,
            1e-2,
            1e-3,
            1e-2,
        )
        .unwrap();
        assert!(r.passed() && r.checked > 50, "{r}");
    }
}
