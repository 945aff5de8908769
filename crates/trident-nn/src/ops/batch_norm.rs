//! Batch normalisation in training mode, its fusions with an activation and with ReLU +
//! max pooling, and the per-channel affine map it folds into in evaluation.

use super::activation;
use super::pool::ReluMaxPool;
use crate::kernel::with_f32;
use crate::kernel::{self, f32_slice, for_rows, LayerTag};
use candle_core::{bail, CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Training-mode batch normalisation of `[b, c, h, w]` over (b, h, w) per channel, with
/// scale `gamma` and shift `beta` (`[c]`). Returns the output and the batch mean and biased
/// variance per channel (for the running statistics). One pass per channel forward and
/// backward, instead of candle's strided reductions over non-last dimensions.
pub fn batch_norm_train(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f32,
) -> Result<(Tensor, Vec<f32>, Vec<f32>)> {
    let x = x.contiguous()?;
    let op = BatchNorm::of_batch(&x, eps)?;
    let (mean, var) = (op.mean.clone(), op.var.clone());
    let y = x.apply_op3(gamma, beta, op)?;
    Ok((y, mean, var))
}

/// `(Σ g, Σ f(g, x))` over the pairs of `g` and `x` in f64, in eight independent partial
/// sums (one chain of f64 additions is latency-bound; eight vectorise).
#[inline]
fn lane_sums(g: &[f32], x: &[f32], f: impl Fn(f32, f32) -> f64) -> (f64, f64) {
    let (mut s, mut t) = ([0f64; 8], [0f64; 8]);
    let (gc, xc) = (g.chunks_exact(8), x.chunks_exact(8));
    let rest = gc.remainder().iter().zip(xc.remainder());
    for (gc, xc) in gc.zip(xc) {
        for j in 0..8 {
            s[j] += gc[j] as f64;
            t[j] += f(gc[j], xc[j]);
        }
    }
    let (mut a, mut b) = (s.iter().sum::<f64>(), t.iter().sum::<f64>());
    for (&g, &x) in rest {
        a += g as f64;
        b += f(g, x);
    }
    (a, b)
}

fn channel_stats(x: &[f32], b: usize, c: usize, hw: usize) -> (Vec<f32>, Vec<f32>) {
    let n = (b * hw) as f64;
    (0..c)
        .into_par_iter()
        .map(|ch| {
            let (mut s, mut s2) = (0f64, 0f64);
            for i in 0..b {
                let plane = &x[(i * c + ch) * hw..(i * c + ch + 1) * hw];
                let (a, a2) = lane_sums(plane, plane, |v, _| (v as f64) * (v as f64));
                s += a;
                s2 += a2;
            }
            let mean = s / n;
            (mean as f32, (s2 / n - mean * mean).max(0.0) as f32)
        })
        .unzip()
}

/// `x · scale[ch] + shift[ch]` of `[b, c, hw]` values, each plane on its own task.
fn affine_planes(x: &[f32], c: usize, hw: usize, scale: &[f32], shift: &[f32]) -> Vec<f32> {
    let write = |out: &mut [MaybeUninit<f32>]| {
        out.par_chunks_mut(hw.max(1)).enumerate().for_each(|(plane, o)| {
            let (a, b) = (scale[plane % c], shift[plane % c]);
            let xs = &x[plane * hw..][..o.len()];
            for (o, &v) in o.iter_mut().zip(xs) {
                o.write(v * a + b);
            }
        })
    };
    // SAFETY: the planes cover the output and every value of each is written (`xs` is as
    // long as the plane; a short `x` panics in the slicing instead).
    unsafe { crate::scratch::written(x.len(), write) }
}

/// Per channel of `[b, c, hw]` gradients `g` and inputs `x`: `(Σ g, Σ f(g, x))`, with
/// `f = term(channel)`, summed in f64.
pub(super) fn channel_sums<F: Fn(f32, f32) -> f32>(
    g: &[f32],
    x: &[f32],
    (b, c, hw): (usize, usize, usize),
    term: impl Fn(usize) -> F + Sync,
) -> Vec<(f32, f32)> {
    (0..c)
        .into_par_iter()
        .map(|ch| {
            let f = term(ch);
            let (mut sg, mut sf) = (0f64, 0f64);
            for i in 0..b {
                let r = (i * c + ch) * hw..(i * c + ch + 1) * hw;
                let (a, b) = lane_sums(&g[r.clone()], &x[r], |g, v| f(g, v) as f64);
                sg += a;
                sf += b;
            }
            (sg as f32, sf as f32)
        })
        .collect()
}

struct BatchNorm {
    eps: f32,
    /// Batch mean and biased variance per channel of the op's input.
    mean: Vec<f32>,
    var: Vec<f32>,
    /// The model layer this kernel ran for (profiling), kept for its backward pass.
    layer: LayerTag,
}

impl CustomOp3 for BatchNorm {
    fn name(&self) -> &'static str {
        "trident-batch-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let _span = kernel::forward(self.name());
        let (x, g, bt, [_, c, h, w]) = self.inputs((s1, l1), (s2, l2), (s3, l3))?;
        let out = self.normalize(x, g, bt, c, h * w);
        kernel::output(out, l1.shape().clone())
    }

    fn bwd(
        &self,
        x: &Tensor,
        gamma: &Tensor,
        _beta: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let _span = self.layer.backward(self.name(), 0);
        let (b, c, h, w) = x.dims4()?;
        // Borrowed from their storage: no copies of the two largest tensors.
        let (x, grad) = (x.contiguous()?, grad.contiguous()?);
        let (x_guard, g_guard);
        let xs = view!(x, x_guard, "batch_norm backward");
        let gs = view!(grad, g_guard, "batch_norm backward");
        let grads = self.gradients(xs, gs, &gamma.to_vec1::<f32>()?, (b, c, h * w));
        gradient_tensors(&x, grads)
    }
}

/// A batch norm's input, scale and shift gradients as the tensors candle expects.
#[allow(clippy::type_complexity)]
fn gradient_tensors(
    x: &Tensor,
    (dx, dgamma, dbeta): (Vec<f32>, Vec<f32>, Vec<f32>),
) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
    let (dev, c) = (x.device(), dgamma.len());
    Ok((
        Some(Tensor::from_vec(dx, x.shape(), dev)?),
        Some(Tensor::from_vec(dgamma, c, dev)?),
        Some(Tensor::from_vec(dbeta, c, dev)?),
    ))
}

impl BatchNorm {
    /// The op for a batch `x` (`[b, c, h, w]`, contiguous): its mean and biased variance
    /// per channel, reused forward and backward (x does not change in between).
    fn of_batch(x: &Tensor, eps: f32) -> Result<Self> {
        let (b, c, h, w) = x.dims4()?;
        let (mean, var) = with_f32(x, |v| channel_stats(v, b, c, h * w))?;
        Ok(BatchNorm {
            eps,
            mean,
            var,
            layer: LayerTag::capture(),
        })
    }

    /// The input `[b, c, h, w]`, scale and shift of the op, checked against the
    /// statistics.
    #[allow(clippy::type_complexity)]
    fn inputs<'a>(
        &self,
        (s1, l1): (&'a CpuStorage, &Layout),
        (s2, l2): (&'a CpuStorage, &Layout),
        (s3, l3): (&'a CpuStorage, &Layout),
    ) -> Result<(&'a [f32], &'a [f32], &'a [f32], [usize; 4])> {
        let x = f32_slice(s1, l1, "batch_norm")?;
        let g = f32_slice(s2, l2, "batch_norm gamma")?;
        let bt = f32_slice(s3, l3, "batch_norm beta")?;
        let &[b, c, h, w] = l1.dims() else {
            bail!("batch_norm: expected [b, c, h, w], got {:?}", l1.dims())
        };
        if self.mean.len() != c || g.len() != c || bt.len() != c || x.len() != b * c * h * w {
            bail!(
                "batch_norm: statistics for {} channels, input has {c}",
                self.mean.len()
            )
        }
        Ok((x, g, bt, [b, c, h, w]))
    }

    /// The normalised `[b, c, hw]` input `x`, scaled by `g` and shifted by `bt` per channel.
    fn normalize(&self, x: &[f32], g: &[f32], bt: &[f32], c: usize, hw: usize) -> Vec<f32> {
        let (mean, var) = (&self.mean, &self.var);
        let (scale, shift): (Vec<f32>, Vec<f32>) = (0..c)
            .map(|ch| {
                let rstd = 1.0 / (var[ch] + self.eps).sqrt();
                (g[ch] * rstd, bt[ch] - mean[ch] * g[ch] * rstd)
            })
            .unzip();
        affine_planes(x, c, hw, &scale, &shift)
    }

    /// The gradients of the input, scale and shift from the output's `gs`.
    fn gradients(
        &self,
        xs: &[f32],
        gs: &[f32],
        gamma_v: &[f32],
        (b, c, hw): (usize, usize, usize),
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let (mean, var) = (&self.mean, &self.var);
        let n = (b * hw) as f32;
        // Per channel: sum(g) and sum(g * xhat).
        let sums = channel_sums(gs, xs, (b, c, hw), |ch| {
            let (m, rstd) = (mean[ch], 1.0 / (var[ch] + self.eps).sqrt());
            move |g, v| g * (v - m) * rstd
        });
        let write = |dx: &mut [MaybeUninit<f32>]| {
            dx.par_chunks_mut(hw.max(1)).enumerate().for_each(|(plane, d)| {
                let ch = plane % c;
                let rstd = 1.0 / (var[ch] + self.eps).sqrt();
                let (sg, sgx) = sums[ch];
                let k = gamma_v[ch] * rstd / n;
                let (g, x) = (&gs[plane * hw..][..d.len()], &xs[plane * hw..][..d.len()]);
                for ((d, &g), &v) in d.iter_mut().zip(g).zip(x) {
                    let xhat = (v - mean[ch]) * rstd;
                    d.write(k * (n * g - sg - xhat * sgx));
                }
            })
        };
        // SAFETY: the planes cover dx and each is written whole (`g` and `x` are as long
        // as the plane, or the slicing panics).
        let dx = unsafe { crate::scratch::written(xs.len(), write) };
        let dgamma: Vec<f32> = sums.iter().map(|s| s.1).collect();
        let dbeta: Vec<f32> = sums.iter().map(|s| s.0).collect();
        (dx, dgamma, dbeta)
    }
}

/// [`batch_norm_train`] followed by [`relu_max_pool2d`](crate::ops::relu_max_pool2d) with window `k`, as one op: the
/// normalised tensor (as large as the input) lives inside it, so candle's backward pass
/// neither keeps it nor zero-fills and adds a gradient of its size. The backward pass
/// normalises `x` again (one pass) to find each window's maximum.
pub fn batch_norm_relu_pool_train(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f32,
    k: usize,
) -> Result<(Tensor, Vec<f32>, Vec<f32>)> {
    let x = x.contiguous()?;
    let after = After::ReluPool(ReluMaxPool::new(&x, k)?);
    batch_norm_then(&x, gamma, beta, eps, after)
}

/// [`batch_norm_train`] followed by the activation `act` as one op, in the same way: the
/// normalised tensor is activated where it is made, and the backward pass recomputes it
/// from `x` to take the activation's gradient (as [`crate::dense::relu6`],
/// [`crate::dense::leaky_relu`] and PyTorch's ReLU, which passes it where `y > 0`) before
/// batch norm's own backward. Returns the output and the batch's mean and biased variance
/// per channel.
pub fn batch_norm_act_train(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f32,
    act: Act,
) -> Result<(Tensor, Vec<f32>, Vec<f32>)> {
    batch_norm_then(&x.contiguous()?, gamma, beta, eps, After::Act(act))
}

/// An activation a batch norm runs as part of its op ([`batch_norm_act_train`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// `max(y, 0)` (DCGAN's generator).
    Relu,
    /// `min(max(y, 0), 6)` (EfficientNet-Lite).
    Relu6,
    /// `y` above zero, `0.2 · y` elsewhere (DCGAN's discriminator).
    LeakyRelu,
}

impl Act {
    #[inline(always)]
    fn at(self, v: f32) -> f32 {
        match self {
            Act::Relu => v.max(0.0),
            Act::Relu6 => v.clamp(0.0, 6.0),
            Act::LeakyRelu => {
                if v > 0.0 {
                    v
                } else {
                    crate::math::LEAKY_SLOPE * v
                }
            }
        }
    }

    /// The gradient at `v` from the output's `g`.
    #[inline(always)]
    fn grad_at(self, v: f32, g: f32) -> f32 {
        match self {
            Act::Relu => {
                if v > 0.0 {
                    g
                } else {
                    0.0
                }
            }
            Act::Relu6 => crate::math::relu6_grad_at(v, g),
            Act::LeakyRelu => {
                if v > 0.0 {
                    g
                } else {
                    crate::math::LEAKY_SLOPE * g
                }
            }
        }
    }

    /// The activation as its own op (evaluation mode, where batch norm is an affine map).
    pub fn apply(self, y: &Tensor) -> Result<Tensor> {
        match self {
            Act::Relu => activation::relu(y),
            Act::Relu6 => activation::relu6(y),
            Act::LeakyRelu => activation::leaky_relu(y),
        }
    }
}

/// The batch norm of the contiguous `x`, then `after`, as one op; with the batch's mean and
/// biased variance per channel.
fn batch_norm_then(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f32,
    after: After,
) -> Result<(Tensor, Vec<f32>, Vec<f32>)> {
    let op = BatchNormThen {
        norm: BatchNorm::of_batch(x, eps)?,
        after,
    };
    let (mean, var) = (op.norm.mean.clone(), op.norm.var.clone());
    let y = x.apply_op3(gamma, beta, op)?;
    Ok((y, mean, var))
}

/// What follows the batch norm inside [`BatchNormThen`].
enum After {
    /// ReLU and max pooling.
    ReluPool(ReluMaxPool),
    /// An activation.
    Act(Act),
}

impl After {
    /// The output from the normalised values `y` (`[b, c, h, w]`), which it may reuse.
    fn forward(&self, mut y: Vec<f32>, dims: (usize, usize, usize, usize)) -> Vec<f32> {
        match self {
            After::ReluPool(pool) => pool.forward_slices(&y, dims),
            &After::Act(act) => {
                for_rows(&mut y, crate::kernel::BLOCK, |_, r| {
                    r.iter_mut().for_each(|v| *v = act.at(*v))
                });
                y
            }
        }
    }

    /// The gradient at the normalised values `y` from the output's `g` (an activation
    /// writes it over `y`'s own buffer).
    fn backward(&self, mut y: Vec<f32>, g: &[f32], dims: (usize, usize, usize, usize)) -> Vec<f32> {
        match self {
            After::ReluPool(pool) => pool.backward_slices(&y, g, dims),
            &After::Act(act) => {
                for_rows(&mut y, crate::kernel::BLOCK, |i, r| {
                    let g = &g[i * crate::kernel::BLOCK..];
                    r.iter_mut().zip(g).for_each(|(v, &g)| *v = act.grad_at(*v, g));
                });
                y
            }
        }
    }

    /// The output's shape for an input of `dims`.
    fn shape(&self, (b, c, h, w): (usize, usize, usize, usize)) -> Shape {
        match self {
            After::ReluPool(pool) => Shape::from((b, c, h / pool.k, w / pool.k)),
            After::Act(_) => Shape::from((b, c, h, w)),
        }
    }
}

/// Batch norm in training mode followed by [`After`], one op.
struct BatchNormThen {
    norm: BatchNorm,
    after: After,
}

impl CustomOp3 for BatchNormThen {
    fn name(&self) -> &'static str {
        match self.after {
            After::ReluPool(_) => "trident-batch-norm-relu-pool",
            After::Act(Act::Relu) => "trident-batch-norm-relu",
            After::Act(Act::Relu6) => "trident-batch-norm-relu6",
            After::Act(Act::LeakyRelu) => "trident-batch-norm-leaky-relu",
        }
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let _span = kernel::forward(self.name());
        let (x, g, bt, [b, c, h, w]) = self.norm.inputs((s1, l1), (s2, l2), (s3, l3))?;
        let y = self.norm.normalize(x, g, bt, c, h * w);
        let out = self.after.forward(y, (b, c, h, w));
        kernel::output(out, self.after.shape((b, c, h, w)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        gamma: &Tensor,
        beta: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let _span = self.norm.layer.backward(self.name(), 0);
        let (b, c, h, w) = x.dims4()?;
        let grad = grad.contiguous()?;
        let (x_guard, g_guard);
        let xs = view!(x, x_guard, "batch_norm backward");
        let gs = view!(grad, g_guard, "batch_norm backward");
        let gamma_v = gamma.to_vec1::<f32>()?;
        let y = self
            .norm
            .normalize(xs, &gamma_v, &beta.to_vec1::<f32>()?, c, h * w);
        let dy = self.after.backward(y, gs, (b, c, h, w));
        gradient_tensors(x, self.norm.gradients(xs, &dy, &gamma_v, (b, c, h * w)))
    }
}

/// `x · scale[c] + shift[c]` over `[b, c, h, w]` in one pass (`scale`, `shift`: `[c]`): an
/// evaluation-mode batch norm once its statistics are folded into a scale and a shift.
/// candle's four broadcast ops (subtract, divide, multiply, add) took most of
/// EfficientNet-Lite0's evaluation time. The backward pass gives `g · scale[c]` to `x` and
/// the per-channel sums `Σ g·x` and `Σ g` to `scale` and `shift`.
pub fn channel_affine(x: &Tensor, scale: &Tensor, shift: &Tensor) -> Result<Tensor> {
    let c = x.dims4()?.1;
    if scale.dims() != [c] || shift.dims() != [c] {
        bail!(
            "channel_affine: scale {:?} and shift {:?} do not fit {c} channels",
            scale.dims(),
            shift.dims()
        )
    }
    x.contiguous()?.apply_op3(
        &scale.contiguous()?,
        &shift.contiguous()?,
        ChannelAffine {
            layer: LayerTag::capture(),
        },
    )
}

struct ChannelAffine {
    layer: LayerTag,
}

impl CustomOp3 for ChannelAffine {
    fn name(&self) -> &'static str {
        "trident-channel-affine"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let _span = kernel::forward(self.name());
        let x = f32_slice(s1, l1, "channel_affine")?;
        let scale = f32_slice(s2, l2, "channel_affine scale")?;
        let shift = f32_slice(s3, l3, "channel_affine shift")?;
        let &[_, c, h, w] = l1.dims() else {
            bail!("channel_affine: expected [b, c, h, w], got {:?}", l1.dims())
        };
        let out = affine_planes(x, c, h * w, scale, shift);
        kernel::output(out, l1.shape().clone())
    }

    fn bwd(
        &self,
        x: &Tensor,
        scale: &Tensor,
        _shift: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let _span = self.layer.backward(self.name(), 0);
        let (b, c, h, w) = x.dims4()?;
        let hw = h * w;
        let (x, grad) = (x.contiguous()?, grad.contiguous()?);
        let (x_guard, g_guard);
        let xs = view!(x, x_guard, "channel_affine backward");
        let gs = view!(grad, g_guard, "channel_affine backward");
        let a = scale.to_vec1::<f32>()?;
        let sums = channel_sums(gs, xs, (b, c, hw), |_| |g: f32, v: f32| g * v);
        let dx = x.track_op().then(|| {
            let mut dx = vec![0f32; gs.len()];
            dx.par_chunks_mut(hw.max(1)).enumerate().for_each(|(plane, d)| {
                let k = a[plane % c];
                for (d, &g) in d.iter_mut().zip(&gs[plane * hw..(plane + 1) * hw]) {
                    *d = g * k;
                }
            });
            dx
        });
        let dev = x.device();
        Ok((
            dx.map(|dx| Tensor::from_vec(dx, x.shape(), dev)).transpose()?,
            Some(Tensor::from_vec(
                sums.iter().map(|s| s.1).collect::<Vec<_>>(),
                c,
                dev,
            )?),
            Some(Tensor::from_vec(
                sums.iter().map(|s| s.0).collect::<Vec<_>>(),
                c,
                dev,
            )?),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::relu_max_pool2d;
    use crate::ops::testing::{close, numeric_grad};
    use candle_core::{Device, Var};

    #[test]
    fn batch_norm_gradient_matches_finite_differences() {
        let xs: Vec<f32> = (0..24)
            .map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.3 + (i as f32 * 0.21).sin())
            .collect();
        let g = Tensor::new(&[0.7f32, -1.3], &Device::Cpu).unwrap();
        let b = Tensor::new(&[0.2f32, 0.1], &Device::Cpu).unwrap();
        let probe = Tensor::from_vec(
            (0..24).map(|i| (i as f32 * 0.37).cos()).collect::<Vec<_>>(),
            (2, 2, 2, 3),
            &Device::Cpu,
        )
        .unwrap();
        let f = |x: &Tensor| batch_norm_train(x, &g, &b, 1e-5)?.0.mul(&probe)?.sum_all();
        let x = Var::from_tensor(&Tensor::from_vec(xs.clone(), (2, 2, 2, 3), &Device::Cpu).unwrap()).unwrap();
        let grads = f(x.as_tensor()).unwrap().backward().unwrap();
        let got = grads
            .get(x.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        close(&got, &numeric_grad(f, &xs, &[2, 2, 2, 3]), 2e-2);
    }

    /// The evaluation-mode batch norm's one-pass op: values equal to candle's broadcast
    /// form, gradients for the input, the scale and the shift equal to finite differences.
    #[test]
    fn channel_affine_matches_broadcasts_and_finite_differences() {
        let dev = &Device::Cpu;
        let xs: Vec<f32> = (0..2 * 3 * 2 * 5).map(|i| (i as f32 * 0.41).sin()).collect();
        let (a, b) = (vec![0.7f32, -1.3, 2.1], vec![0.2f32, -0.4, 0.05]);
        let x = Tensor::from_vec(xs.clone(), (2, 3, 2, 5), dev).unwrap();
        let (at, bt) = (
            Tensor::new(a.as_slice(), dev).unwrap(),
            Tensor::new(b.as_slice(), dev).unwrap(),
        );
        let ours = channel_affine(&x, &at, &bt).unwrap();
        let theirs = x
            .broadcast_mul(&at.reshape((1, 3, 1, 1)).unwrap())
            .unwrap()
            .broadcast_add(&bt.reshape((1, 3, 1, 1)).unwrap())
            .unwrap();
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        close(&flat(&ours), &flat(&theirs), 1e-6);
        let probe = Tensor::from_vec(
            (0..60).map(|i| (i as f32 * 0.13).cos()).collect::<Vec<_>>(),
            (2, 3, 2, 5),
            dev,
        )
        .unwrap();
        let loss = |x: &Tensor, a: &Tensor, b: &Tensor| (channel_affine(x, a, b)? * &probe)?.sum_all();
        let (xv, av, bv) = (
            Var::from_tensor(&x).unwrap(),
            Var::from_tensor(&at).unwrap(),
            Var::from_tensor(&bt).unwrap(),
        );
        let grads = loss(xv.as_tensor(), av.as_tensor(), bv.as_tensor())
            .unwrap()
            .backward()
            .unwrap();
        close(
            &flat(grads.get(xv.as_tensor()).unwrap()),
            &numeric_grad(|x| loss(x, &at, &bt), &xs, &[2, 3, 2, 5]),
            1e-2,
        );
        close(
            &flat(grads.get(av.as_tensor()).unwrap()),
            &numeric_grad(|a| loss(&x, a, &bt), &a, &[3]),
            1e-2,
        );
        close(
            &flat(grads.get(bv.as_tensor()).unwrap()),
            &numeric_grad(|b| loss(&x, &at, b), &b, &[3]),
            1e-2,
        );
        assert!(channel_affine(&x, &bt.narrow(0, 0, 2).unwrap(), &bt).is_err());
    }

    /// Batch norm and ReLU + max pooling as one op give the two ops' values and the
    /// gradients of the input, scale and shift, and the same batch statistics; 2 × 2 and
    /// 3 × 3 windows, odd sides.
    #[test]
    fn batch_norm_relu_pool_equals_the_two_ops() {
        let dev = Device::Cpu;
        for (dims, k) in [([3, 4, 7, 9], 2), ([2, 5, 8, 6], 3)] {
            let x = Var::randn(0.3f32, 1.0, &dims, &dev).unwrap();
            let g = Var::randn(1f32, 0.3, dims[1], &dev).unwrap();
            let b = Var::randn(0f32, 0.3, dims[1], &dev).unwrap();
            let two = batch_norm_train(&x, &g, &b, 1e-5).unwrap();
            let two = (relu_max_pool2d(&two.0, k).unwrap(), two.1, two.2);
            let one = batch_norm_relu_pool_train(&x, &g, &b, 1e-5, k).unwrap();
            fused_equals_two_ops(&format!("{dims:?} k = {k}"), one, two, [&x, &g, &b]);
        }
    }

    /// A fused batch norm's `(output, mean, variance)` equals the two ops' exactly, and the
    /// gradients of the input, scale and shift (`vars`) through both within 1e-5, each
    /// reaching its variable; the outputs' values returned.
    fn fused_equals_two_ops(
        what: &str,
        (one, m1, v1): (Tensor, Vec<f32>, Vec<f32>),
        (two, m2, v2): (Tensor, Vec<f32>, Vec<f32>),
        vars: [&Var; 3],
    ) -> Vec<f32> {
        assert_eq!((m1, v1), (m2, v2), "{what}");
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let values = flat(&one);
        assert_eq!(values, flat(&two), "{what}");
        let probe = Tensor::randn(0f32, 1.0, one.shape(), one.device()).unwrap();
        let g1 = one.mul(&probe).unwrap().sum_all().unwrap().backward().unwrap();
        let g2 = two.mul(&probe).unwrap().sum_all().unwrap().backward().unwrap();
        for (name, v) in ["x", "gamma", "beta"].into_iter().zip(vars) {
            let (a, b) = (flat(g1.get(v).unwrap()), flat(g2.get(v).unwrap()));
            close(&a, &b, 1e-5);
            assert!(
                a.iter().any(|&v| v != 0.0),
                "{what} {name}: a gradient reaches it"
            );
        }
        values
    }

    /// Batch norm and an activation as one op give the two ops' values, the same batch
    /// statistics and the gradients of the input, scale and shift; values pushed across
    /// ReLU6's edges and below zero.
    #[test]
    fn batch_norm_and_activation_equal_the_two_ops() {
        let dev = Device::Cpu;
        for act in [Act::Relu6, Act::Relu, Act::LeakyRelu] {
            for dims in [[3, 4, 7, 9], [2, 5, 130, 131]] {
                // Fixed values, not candle's (unseeded) randn, whose draws could leave an edge
                // unreached in the small case: each channel spread evenly over about ±1.7
                // standard deviations, scales of 3.5 and more and shifts near 1, so part of
                // every channel lands above 6 and part below 0.
                let n: usize = dims.iter().product();
                let xs: Vec<f32> = (0..n)
                    .map(|i| ((i * 7919) % 1009) as f32 / 1009.0 * 5.0 - 2.2)
                    .collect();
                let x = Var::from_vec(xs, &dims, &dev).unwrap();
                let c = dims[1];
                let g = Var::from_vec((0..c).map(|i| 3.5 + 0.25 * i as f32).collect(), c, &dev).unwrap();
                let b = Var::from_vec((0..c).map(|i| 1.0 - 0.1 * i as f32).collect(), c, &dev).unwrap();
                let two = batch_norm_train(&x, &g, &b, 1e-3).unwrap();
                let two = (act.apply(&two.0).unwrap(), two.1, two.2);
                let one = batch_norm_act_train(&x, &g, &b, 1e-3, act).unwrap();
                let what = format!("{act:?} {dims:?}");
                let a = fused_equals_two_ops(&what, one, two, [&x, &g, &b]);
                match act {
                    Act::Relu6 => assert!(a.contains(&6.0) && a.contains(&0.0), "both edges are reached"),
                    Act::Relu => assert!(a.contains(&0.0) && a.iter().any(|&v| v > 6.0)),
                    Act::LeakyRelu => assert!(a.iter().any(|&v| v < 0.0)),
                }
            }
        }
    }
}
