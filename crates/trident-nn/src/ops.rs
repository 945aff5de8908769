//! Fused CPU kernels with hand-written backward passes, as candle custom ops.
//!
//! candle's own `layer_norm`, `softmax_last_dim` and `sdpa` have no backward pass: a graph
//! built from them trains nothing, silently. These replace them. Each forward is one pass
//! over contiguous rows (rayon-parallel); each backward is one pass that recomputes what it
//! needs from the saved input or output instead of keeping intermediates alive. All are
//! checked against PyTorch (values and gradients) in `tests/vs_torch.rs`.

use crate::blas::{self, Mat};
use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use std::borrow::Cow;
use std::mem::MaybeUninit;
use std::sync::OnceLock;

use crate::kernel::{self, LayerTag};
pub(crate) use crate::kernel::{cpu_slice, f32_slice, for_rows, last_dim};
pub use crate::kernel::{update_f32, with_f32};

// ---------------------------------------------------------------- layer norm

/// Layer normalisation over the last dimension: `(x - mean) / sqrt(var + eps) * gamma + beta`.
pub fn layer_norm(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f32) -> Result<Tensor> {
    x.contiguous()?.apply_op3(
        gamma,
        beta,
        LayerNorm {
            eps,
            layer: LayerTag::capture(),
        },
    )
}

struct LayerNorm {
    eps: f32,
    /// The model layer this kernel ran for (profiling), kept for its backward pass.
    layer: LayerTag,
}

fn row_stats(x: &[f32], eps: f32) -> (f32, f32) {
    let n = x.len() as f32;
    let mean = x.iter().sum::<f32>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
    (mean, 1.0 / (var + eps).sqrt())
}

/// `o = (o - mean) / sqrt(var + eps) * g + b` in place, over one row.
pub(crate) fn normalize_row(o: &mut [f32], g: &[f32], b: &[f32], eps: f32) {
    let (mean, rstd) = row_stats(o, eps);
    for ((v, g), b) in o.iter_mut().zip(g).zip(b) {
        *v = (*v - mean) * rstd * g + b;
    }
}

impl CustomOp3 for LayerNorm {
    fn name(&self) -> &'static str {
        "trident-layer-norm"
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
        let x = f32_slice(s1, l1, "layer_norm")?;
        let g = f32_slice(s2, l2, "layer_norm gamma")?;
        let b = f32_slice(s3, l3, "layer_norm beta")?;
        let d = last_dim(l1, "layer_norm")?;
        if g.len() != d || b.len() != d {
            bail!(
                "layer_norm: gamma/beta have {}/{} elements, the last dimension is {d}",
                g.len(),
                b.len()
            )
        }
        let mut out = vec![0f32; x.len()];
        for_rows(&mut out, d, |i, o| {
            o.copy_from_slice(&x[i * d..(i + 1) * d]);
            normalize_row(o, g, b, self.eps);
        });
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
        let d = x.dim(candle_core::D::Minus1)?;
        let grad = grad.contiguous()?;
        let (sx, lx) = x.storage_and_layout();
        let (sg, lg) = grad.storage_and_layout();
        let (sgm, lgm) = gamma.storage_and_layout();
        let xs = cpu_slice(&sx, lx, "layer_norm backward")?;
        let gs = cpu_slice(&sg, lg, "layer_norm backward")?;
        let gamma_v = cpu_slice(&sgm, lgm, "layer_norm backward")?;
        let (dx, dg, db) = layer_norm_grads(xs, gs, gamma_v, d, self.eps);
        let dev = x.device();
        Ok((
            Some(Tensor::from_vec(dx, x.shape(), dev)?),
            Some(Tensor::from_vec(dg, gamma.shape(), dev)?),
            Some(Tensor::from_vec(db, gamma.shape(), dev)?),
        ))
    }
}

/// Layer-norm gradients over rows of width `d`: (dx, dgamma, dbeta) from the input `xs`,
/// the output gradient `gs` and the scale.
pub(crate) fn layer_norm_grads(
    xs: &[f32],
    gs: &[f32],
    gamma_v: &[f32],
    d: usize,
    eps: f32,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let rows = xs.len() / d;
    let mut dx = vec![0f32; xs.len()];
    // Per-row dx, and per-chunk partial sums of dgamma/dbeta reduced afterwards.
    let chunk_rows = rows.div_ceil(rayon::current_num_threads().max(1) * 4).max(1);
    let partials: Vec<(Vec<f32>, Vec<f32>)> = dx
        .par_chunks_mut(chunk_rows * d)
        .enumerate()
        .map(|(c, dxc)| {
            let mut dg = vec![0f32; d];
            let mut db = vec![0f32; d];
            for (r, dxr) in dxc.chunks_mut(d).enumerate() {
                let i = c * chunk_rows + r;
                let row = &xs[i * d..(i + 1) * d];
                let gr = &gs[i * d..(i + 1) * d];
                let (mean, rstd) = row_stats(row, eps);
                let (mut sum_gg, mut sum_ggx) = (0f32, 0f32);
                for j in 0..d {
                    let xhat = (row[j] - mean) * rstd;
                    let gg = gr[j] * gamma_v[j];
                    sum_gg += gg;
                    sum_ggx += gg * xhat;
                    dg[j] += gr[j] * xhat;
                    db[j] += gr[j];
                }
                let (m1, m2) = (sum_gg / d as f32, sum_ggx / d as f32);
                for j in 0..d {
                    let xhat = (row[j] - mean) * rstd;
                    dxr[j] = rstd * (gr[j] * gamma_v[j] - m1 - xhat * m2);
                }
            }
            (dg, db)
        })
        .collect();
    let mut dg = vec![0f32; d];
    let mut db = vec![0f32; d];
    for (pg, pb) in partials {
        for j in 0..d {
            dg[j] += pg[j];
            db[j] += pb[j];
        }
    }
    (dx, dg, db)
}

/// `layer_norm(x + residual)`, fused: one pass forward (the sum is never stored), and the
/// backward pass recomputes the sum and gives `x` and `residual` the same gradient. Saves
/// the residual add's output tensor and, in candle's backward pass, a zero-filled gradient
/// and an add for it.
pub fn add_layer_norm(
    x: &Tensor,
    residual: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f32,
) -> Result<Tensor> {
    add_dropout_layer_norm(x, residual, gamma, beta, eps, None)
}

/// `layer_norm(dropout(x) + residual)` with `dropout` = (p, seed) dropping exactly what
/// [`dropout`] would on `x`, fused like [`add_layer_norm`]: the mask is drawn in the kernel
/// and drawn again in the backward pass, never stored.
pub fn add_dropout_layer_norm(
    x: &Tensor,
    residual: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f32,
    dropout: Option<(f32, u64)>,
) -> Result<Tensor> {
    if x.dims() != residual.dims() {
        bail!(
            "add_layer_norm: input {:?} and residual {:?} differ",
            x.dims(),
            residual.dims()
        )
    }
    let dropout = DropMask::from_option("add_layer_norm", dropout)?;
    let gb = Tensor::cat(&[gamma, beta], 0)?;
    x.contiguous()?.apply_op3(
        &residual.contiguous()?,
        &gb,
        AddLayerNorm {
            eps,
            dropout,
            layer: LayerTag::capture(),
        },
    )
}

struct AddLayerNorm {
    eps: f32,
    dropout: Option<DropMask>,
    /// The model layer this kernel ran for (profiling), kept for its backward pass.
    layer: LayerTag,
}

impl AddLayerNorm {
    /// Row `i` of `dropout(x) + r` into `o`.
    fn sum_row(&self, i: usize, x: &[f32], r: &[f32], o: &mut [f32]) {
        let base = i * o.len();
        let pairs = o.iter_mut().zip(x.iter().zip(r));
        match &self.dropout {
            None => pairs.for_each(|(o, (a, b))| *o = a + b),
            Some(m) => {
                for (j, (o, (a, b))) in pairs.enumerate() {
                    *o = a * m.scale(base + j) + b;
                }
            }
        }
    }
}

impl CustomOp3 for AddLayerNorm {
    fn name(&self) -> &'static str {
        "trident-add-layer-norm"
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
        let x = f32_slice(s1, l1, "add_layer_norm")?;
        let r = f32_slice(s2, l2, "add_layer_norm residual")?;
        let gb = f32_slice(s3, l3, "add_layer_norm gamma/beta")?;
        let d = last_dim(l1, "add_layer_norm")?;
        if gb.len() != 2 * d {
            bail!(
                "add_layer_norm: gamma and beta have {} elements together, expected 2·{d}",
                gb.len()
            )
        }
        let (g, b) = gb.split_at(d);
        let mut out = vec![0f32; x.len()];
        for_rows(&mut out, d, |i, o| {
            self.sum_row(i, &x[i * d..(i + 1) * d], &r[i * d..(i + 1) * d], o);
            normalize_row(o, g, b, self.eps);
        });
        kernel::output(out, l1.shape().clone())
    }

    fn bwd(
        &self,
        x: &Tensor,
        residual: &Tensor,
        gb: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let _span = self.layer.backward(self.name(), 0);
        let d = x.dim(candle_core::D::Minus1)?;
        let grad = grad.contiguous()?;
        let (dx, dg, db) = {
            let (sx, lx) = x.storage_and_layout();
            let (sr, lr) = residual.storage_and_layout();
            let (sg, lg) = grad.storage_and_layout();
            let (sgb, lgb) = gb.storage_and_layout();
            let xs = cpu_slice(&sx, lx, "add_layer_norm backward")?;
            let rs = cpu_slice(&sr, lr, "add_layer_norm backward")?;
            let gs = cpu_slice(&sg, lg, "add_layer_norm backward")?;
            let gamma_v = &cpu_slice(&sgb, lgb, "add_layer_norm backward")?[..d];
            let mut sum = vec![0f32; xs.len()];
            for_rows(&mut sum, d, |i, o| {
                self.sum_row(i, &xs[i * d..(i + 1) * d], &rs[i * d..(i + 1) * d], o)
            });
            layer_norm_grads(&sum, gs, gamma_v, d, self.eps)
        };
        let dev = x.device();
        let dgb = Tensor::from_vec([dg, db].concat(), 2 * d, dev)?;
        // The residual gets the sum's gradient; x gets it through the dropout mask.
        let dx_in = match &self.dropout {
            None => None,
            Some(m) => {
                let v: Vec<f32> = dx.iter().enumerate().map(|(j, g)| g * m.scale(j)).collect();
                Some(Tensor::from_vec(v, x.shape(), dev)?)
            }
        };
        let dr = Tensor::from_vec(dx, x.shape(), dev)?;
        Ok((Some(dx_in.unwrap_or_else(|| dr.clone())), Some(dr), Some(dgb)))
    }
}

// ---------------------------------------------------------------- softmax

/// Softmax over the last dimension.
pub fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op1(Softmax {
        layer: LayerTag::capture(),
    })
}

struct Softmax {
    /// The model layer this kernel ran for (profiling), kept for its backward pass.
    layer: LayerTag,
}

fn softmax_row(x: &[f32], o: &mut [f32]) {
    o.copy_from_slice(x);
    softmax_in_place(o);
}

/// Softmax of one row, in place.
pub(crate) fn softmax_in_place(o: &mut [f32]) {
    let max = o.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let inv = 1.0 / crate::math::exp_shifted_sum(o, max);
    o.iter_mut().for_each(|v| *v *= inv);
}

impl CustomOp1 for Softmax {
    fn name(&self) -> &'static str {
        "trident-softmax"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let _span = kernel::forward(self.name());
        let x = f32_slice(s, l, "softmax")?;
        let d = last_dim(l, "softmax")?;
        let mut out = vec![0f32; x.len()];
        for_rows(&mut out, d, |i, o| softmax_row(&x[i * d..(i + 1) * d], o));
        kernel::output(out, l.shape().clone())
    }

    fn bwd(&self, _arg: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let _span = self.layer.backward(self.name(), 0);
        Ok(Some(res.apply_op2_no_bwd(&grad.contiguous()?, &SoftmaxGrad)?))
    }
}

/// `dx = y * (g - sum(g * y))` per row, from the softmax output `y` and its gradient `g`.
struct SoftmaxGrad;

impl CustomOp2 for SoftmaxGrad {
    fn name(&self) -> &'static str {
        "trident-softmax-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let _span = kernel::forward(self.name());
        let y = f32_slice(s1, l1, "softmax backward")?;
        let g = f32_slice(s2, l2, "softmax backward")?;
        let d = last_dim(l1, "softmax backward")?;
        let mut out = vec![0f32; y.len()];
        for_rows(&mut out, d, |i, o| {
            let (yr, gr) = (&y[i * d..(i + 1) * d], &g[i * d..(i + 1) * d]);
            let dot: f32 = yr.iter().zip(gr).map(|(a, b)| a * b).sum();
            for j in 0..d {
                o[j] = yr[j] * (gr[j] - dot);
            }
        });
        kernel::output(out, l1.shape().clone())
    }
}

// ---------------------------------------------------------------- cross-entropy

/// Mean cross-entropy of `logits` (`[n, classes]`, f32) against `labels` (`[n]`, u32),
/// as PyTorch's `F.cross_entropy` with `reduction="mean"`. A label outside the class range
/// is an error naming it.
pub fn cross_entropy(logits: &Tensor, labels: &Tensor) -> Result<Tensor> {
    let labels = labels.to_dtype(candle_core::DType::U32)?.contiguous()?;
    logits.contiguous()?.apply_op2(
        &labels,
        CrossEntropy {
            layer: LayerTag::capture(),
        },
    )
}

struct CrossEntropy {
    /// The model layer this kernel ran for (profiling), kept for its backward pass.
    layer: LayerTag,
}

fn labels_of<'a>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [u32]> {
    let CpuStorage::U32(v) = s else {
        bail!("cross_entropy: labels must be u32")
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => bail!("cross_entropy: labels must be contiguous"),
    }
}

impl CustomOp2 for CrossEntropy {
    fn name(&self) -> &'static str {
        "trident-cross-entropy"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let _span = kernel::forward(self.name());
        let x = f32_slice(s1, l1, "cross_entropy")?;
        let labels = labels_of(s2, l2)?;
        let c = last_dim(l1, "cross_entropy")?;
        let n = x.len() / c;
        if labels.len() != n {
            bail!("cross_entropy: {n} rows of logits but {} labels", labels.len())
        }
        let mut total = 0f64;
        for (i, &y) in labels.iter().enumerate() {
            if y as usize >= c {
                bail!("cross_entropy: label {y} at row {i} is out of range for {c} classes")
            }
            let row = &x[i * c..(i + 1) * c];
            total += (log_sum_exp(row, 1.0) - row[y as usize]) as f64;
        }
        kernel::output(vec![(total / n as f64) as f32], ())
    }

    fn bwd(
        &self,
        logits: &Tensor,
        labels: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let _span = self.layer.backward(self.name(), 0);
        let g = grad.to_scalar::<f32>()?;
        let c = logits.dim(candle_core::D::Minus1)?;
        let x = logits.flatten_all()?.to_vec1::<f32>()?;
        let y = labels.to_vec1::<u32>()?;
        let n = y.len();
        let scale = g / n as f32;
        let mut dx = vec![0f32; x.len()];
        for_rows(&mut dx, c, |i, o| {
            softmax_row(&x[i * c..(i + 1) * c], o);
            o[y[i] as usize] -= 1.0;
            o.iter_mut().for_each(|v| *v *= scale);
        });
        Ok((Some(Tensor::from_vec(dx, logits.shape(), logits.device())?), None))
    }
}

// ---------------------------------------------------------------- distillation

/// Hinton's soft-target loss: `KL(softmax(teacher / T) ‖ softmax(student / T))` summed over
/// classes and averaged over rows (PyTorch's `kl_div(log_softmax(s / T), softmax(t / T),
/// reduction="batchmean")`), without the `T²` factor. `[n, c]` logits both. The teacher's
/// logits are constants: the backward pass gives a gradient to the student only.
pub fn distill_kl(student: &Tensor, teacher: &Tensor, temperature: f32) -> Result<Tensor> {
    if !(temperature > 0.0 && temperature.is_finite()) {
        bail!("distill_kl: the temperature must be positive, got {temperature}")
    }
    if student.dims() != teacher.dims() {
        bail!(
            "distill_kl: student logits {:?} and teacher logits {:?} differ in shape",
            student.dims(),
            teacher.dims()
        )
    }
    let teacher = teacher.detach().contiguous()?;
    student.contiguous()?.apply_op2(
        &teacher,
        DistillKl {
            t: temperature,
            layer: LayerTag::capture(),
        },
    )
}

struct DistillKl {
    t: f32,
    /// The model layer this kernel ran for (profiling), kept for its backward pass.
    layer: LayerTag,
}

/// `log Σ exp(x / t)` of one row, computed stably (shifted by the row's maximum).
fn log_sum_exp(row: &[f32], t: f32) -> f32 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) / t;
    row.iter().map(|v| (v / t - max).exp()).sum::<f32>().ln() + max
}

/// `softmax(x / t)` of one row into `o`.
fn tempered_softmax(x: &[f32], t: f32, o: &mut [f32]) {
    o.iter_mut().zip(x).for_each(|(o, v)| *o = v / t);
    softmax_in_place(o);
}

impl CustomOp2 for DistillKl {
    fn name(&self) -> &'static str {
        "trident-distill-kl"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let _span = kernel::forward(self.name());
        let s = f32_slice(s1, l1, "distill_kl")?;
        let t = f32_slice(s2, l2, "distill_kl")?;
        let c = last_dim(l1, "distill_kl")?;
        let n = s.len() / c;
        let mut p = vec![0f32; c];
        let mut total = 0f64;
        for i in 0..n {
            tempered_softmax(&t[i * c..(i + 1) * c], self.t, &mut p);
            let row = &s[i * c..(i + 1) * c];
            let lse = log_sum_exp(row, self.t);
            // Σ p (log p − log q), with log q = s/T − logsumexp(s/T).
            total += p
                .iter()
                .zip(row)
                .filter(|(p, _)| **p > 0.0)
                .map(|(p, v)| (*p as f64) * ((*p as f64).ln() - (v / self.t - lse) as f64))
                .sum::<f64>();
        }
        kernel::output(vec![(total / n.max(1) as f64) as f32], ())
    }

    fn bwd(
        &self,
        student: &Tensor,
        teacher: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let _span = self.layer.backward(self.name(), 0);
        // d/ds KL = (softmax(s/T) − softmax(t/T)) / T, averaged over the n rows.
        let g = grad.to_scalar::<f32>()?;
        let c = student.dim(candle_core::D::Minus1)?;
        let s = student.flatten_all()?.to_vec1::<f32>()?;
        let t = teacher.flatten_all()?.to_vec1::<f32>()?;
        let n = s.len() / c;
        let scale = g / (n.max(1) as f32 * self.t);
        let mut ds = vec![0f32; s.len()];
        for_rows(&mut ds, c, |i, o| {
            let mut p = vec![0f32; c];
            tempered_softmax(&t[i * c..(i + 1) * c], self.t, &mut p);
            tempered_softmax(&s[i * c..(i + 1) * c], self.t, o);
            o.iter_mut().zip(&p).for_each(|(o, p)| *o = (*o - p) * scale);
        });
        Ok((
            Some(Tensor::from_vec(ds, student.shape(), student.device())?),
            None,
        ))
    }
}

// ---------------------------------------------------------------- batch norm

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
fn channel_sums<F: Fn(f32, f32) -> f32>(
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

/// [`batch_norm_train`] followed by [`relu_max_pool2d`] with window `k`, as one op: the
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
            Act::Relu => crate::dense::relu(y),
            Act::Relu6 => crate::dense::relu6(y),
            Act::LeakyRelu => crate::dense::leaky_relu(y),
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

// ---------------------------------------------------------------- convolution

/// 2-D convolution as im2col + GEMM: `x` `[b, c, h, w]`, `weight` `[o, c, k, k]`.
///
/// candle's own conv2d backward goes through `conv_transpose2d`, which on CPU is a direct
/// loop about 30x slower than the forward here; unfolding patches turns both passes into
/// matrix products. One op ([`Conv`]) does it image by image: each task unfolds one
/// image's patches into a buffer that stays in cache, multiplies the weight by them into
/// the output already in `[o, h, w]` order, and the backward pass unfolds them again for
/// the weight gradient and folds the input gradient back in the same pass. Nothing of
/// `[b, h·w, c·k·k]` is kept between the passes or copied into another layout (the
/// earlier form materialised the patches of the whole batch, multiplied them as one
/// linear layer and transposed the result: 14 MB per pass for the Fashion CNN's second
/// convolution). Under bf16 autocast, on a CPU with bf16 arithmetic ([`conv_bf16`]), the
/// products at least 64 deep and 32 wide run in bf16 with f32 sums (the weight rounded and
/// packed once per pass, each group's patches as they are multiplied): with `vdpbf16ps`
/// (AVX512-BF16 without AMX) in the direct kernels ([`crate::direct_conv::Arith`]) where
/// they suit the shape, else (AMX tiles, or a shape the direct kernels do not take) on this
/// unfolded path. (An earlier form, which
/// packed the weight for every image and rounded the 9-deep products of a first layer too,
/// made the CNN step slower: 39 against 24 ms on AVX512-BF16.)
pub fn conv2d(x: &Tensor, weight: &Tensor, stride: usize, padding: usize) -> Result<Tensor> {
    let op = Conv::checked(x, weight, stride, padding)?;
    x.contiguous()?.apply_op2(&weight.contiguous()?, op)
}

/// [`conv2d`] plus `bias[o]` on each output channel, in the same op ([`Biased`]).
pub fn conv2d_bias(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    stride: usize,
    padding: usize,
) -> Result<Tensor> {
    let op = Conv::checked(x, weight, stride, padding)?;
    biased(x, weight, bias, weight.dim(0)?, op)
}

/// `op` (a convolution of `weight` over `x` with `channels` outputs) with `bias` added
/// inside it ([`Biased`]), the bias's shape checked.
fn biased<T: CustomOp2 + Send + Sync + 'static>(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    channels: usize,
    op: T,
) -> Result<Tensor> {
    if bias.dims() != [channels] {
        bail!(
            "{}: bias {:?} does not fit {channels} output channels",
            op.name(),
            bias.dims()
        )
    }
    x.contiguous()?
        .apply_op3(&weight.contiguous()?, &bias.contiguous()?, Biased(op))
}

impl Conv {
    /// The convolution of `weight` `[o, c, k, k]` over `x` `[b, c, h, w]`, its shapes checked.
    fn checked(x: &Tensor, weight: &Tensor, stride: usize, padding: usize) -> Result<Self> {
        let (_, c, h, w) = x.dims4()?;
        let (_, wc, k, k2) = weight.dims4()?;
        if wc != c || k != k2 {
            bail!(
                "conv2d: weight {:?} does not fit input channels {c}",
                weight.dims()
            )
        }
        if h + 2 * padding < k || w + 2 * padding < k || stride == 0 {
            bail!("conv2d: kernel {k} does not fit input {h}x{w} with padding {padding}")
        }
        Ok(Conv {
            k,
            stride,
            padding,
            bf16: crate::bf16::autocast_enabled(),
            layer: LayerTag::capture(),
            plan: OnceLock::new(),
        })
    }
}

/// The convolution of [`conv2d`], image by image (see there): a square `k × k` kernel,
/// `stride`, zero `padding` on each side.
struct Conv {
    k: usize,
    stride: usize,
    padding: usize,
    /// Created under bf16 autocast ([`crate::bf16::autocast`]): the unfolded products run
    /// in bf16 where that pays ([`Conv::in_bf16`]), in both passes.
    bf16: bool,
    /// The model layer this kernel ran for (profiling), kept for its backward pass.
    layer: LayerTag,
    /// The runs of [`Conv::runs`] for the geometry this op met first, worked out once: they
    /// are the same for every image of the batch and in both passes, and working them out
    /// (divisions, the phase of each tap) for each image cost as much as the copies they
    /// drive in a convolution of small planes.
    plan: OnceLock<Plan>,
}

/// [`Conv::runs`] collected for one geometry `(c, h, w, oh, ow)`, with where each patch
/// row's runs start (`starts[row]..starts[row + 1]`; a row's runs are consecutive).
#[derive(Clone)]
struct Plan {
    dims: (usize, usize, usize, usize, usize),
    runs: Vec<Run>,
    starts: Vec<usize>,
}

impl Plan {
    fn new(conv: &Conv, dims: (usize, usize, usize, usize, usize)) -> Plan {
        let (c, h, w, oh, ow) = dims;
        let mut runs = Vec::new();
        conv.runs(c, h, w, oh, ow, |run| runs.push(run));
        let rows = c * conv.k * conv.k;
        let mut starts = Vec::with_capacity(rows + 1);
        let mut at = 0;
        for row in 0..=rows {
            while at < runs.len() && runs[at].row < row {
                at += 1;
            }
            starts.push(at);
        }
        Plan { dims, runs, starts }
    }

    /// The runs of patch row `row`.
    fn row(&self, row: usize) -> &[Run] {
        &self.runs[self.starts[row]..self.starts[row + 1]]
    }
}

/// One run of [`Conv::runs`]: output positions `at..at + len` of patch row `row` read
/// the input's phase layout at `from..from + len`, except the run's gaps: in every
/// `period` positions from `at` the first `keep` are inside the image and the rest (up to
/// the run's end) padding.
#[derive(Clone, Copy)]
struct Run {
    row: usize,
    at: usize,
    from: usize,
    len: usize,
    keep: usize,
    period: usize,
}

/// Zeroes `s`, a padding gap of one or two values written as stores: `fill` on a span of
/// unknown length is a call to `memset`, whose set-up costs more than the value or two a
/// gap holds — and a stride-1 convolution has a gap per output row of each of its
/// left- and right-column taps (memset was 11 % of a conv autoencoder's samples).
#[inline(always)]
fn zero_short<T: Copy + Default>(s: &mut [T]) {
    match s {
        [a] => *a = T::default(),
        [a, b] => (*a, *b) = (T::default(), T::default()),
        _ => s.fill(T::default()),
    }
}

/// `dst.copy_from_slice(src)` for the runs of a convolution's patches: up to 64 values (a
/// plane's row, or a 7 × 7 plane) inline in blocks of 16 values rather than a call to
/// `memmove` per run (with the unfolding around them, 13 % of a bf16 GAN critic
/// convolution's samples).
#[inline(always)]
fn copy_short<T: Copy>(dst: &mut [T], src: &[T]) {
    let src = &src[..dst.len()];
    if dst.len() > 64 {
        // Longer runs (a 28 × 28 plane's taps) copy faster through `memmove`'s wider loop.
        return dst.copy_from_slice(src);
    }
    let (blocks, tail) = dst.as_chunks_mut::<16>();
    let (from, rest) = src.as_chunks::<16>();
    for (d, s) in blocks.iter_mut().zip(from) {
        *d = *s; // a block of 16 as one value: vector moves
    }
    for (d, s) in tail.iter_mut().zip(rest) {
        *d = *s;
    }
}

impl Run {
    /// The gaps, as ranges of positions from the run's start.
    fn gaps(self) -> impl Iterator<Item = std::ops::Range<usize>> {
        let gap = self.period - self.keep;
        (0..if gap == 0 { 0 } else { self.len / self.period })
            .map(move |t| t * self.period + self.keep..(t + 1) * self.period)
    }
}

impl Conv {
    /// `(b, c, h, w, oh, ow)` of an input `[b, c, h, w]`.
    fn geometry(&self, dims: &[usize]) -> Result<(usize, usize, usize, usize, usize, usize)> {
        let &[b, c, h, w] = dims else {
            bail!("conv2d: expected [b, c, h, w], got {dims:?}")
        };
        let oh = (h + 2 * self.padding - self.k) / self.stride + 1;
        let ow = (w + 2 * self.padding - self.k) / self.stride + 1;
        Ok((b, c, h, w, oh, ow))
    }

    /// The size `(rows, columns)` of the phase planes an `h × w` input is split into at this
    /// stride (see [`Self::runs`]): `⌈h/s⌉ × ⌈w/s⌉`.
    fn phase_plane(&self, h: usize, w: usize) -> (usize, usize) {
        (h.div_ceil(self.stride), w.div_ceil(self.stride))
    }

    /// Calls `f(run)` for every [`Run`] of one tap `(ch, dy, dx)` (row `(ch·k + dy)·k + dx`
    /// of the transposed patches `[c·k·k, oh·ow]`): output positions `at..at + len` of that
    /// row read the input's phase layout at `from..from + len`, but for the run's gaps.
    /// Positions in no run, and in a run's gaps, are zero padding.
    ///
    /// The phase layout of an input `[c, h, w]` at stride `s` splits each channel into `s ×
    /// s` phase planes of [`Self::phase_plane`]'s size, `[c, s, s, ⌈h/s⌉, ⌈w/s⌉]`: input
    /// `(iy, ix)` lies in plane `(iy mod s, ix mod s)` at `(iy / s, ix / s)`, so the inputs a
    /// tap reads along an output row (every `s`-th) lie next to each other; at stride 1 it
    /// is the image itself. Where output rows are as long as phase rows (`ow` equal to the
    /// phase plane's width) one run spans all the output rows a tap reads inside the image,
    /// its gaps the columns that fall in the padding (a 1 × 1 convolution's patches are
    /// one run per channel); otherwise each output row is a run of its own.
    #[inline]
    fn runs(&self, c: usize, h: usize, w: usize, oh: usize, ow: usize, mut f: impl FnMut(Run)) {
        let (k, s, p) = (self.k, self.stride, self.padding);
        let (hp, wp) = self.phase_plane(h, w);
        // Output positions whose input i = o·s + d − p lies in 0..n:
        // o ∈ [ceil((p − d)/s), ceil((n + p − d)/s)), at most `outs`.
        let inside = |d: usize, n: usize, outs: usize| {
            let lo = p.saturating_sub(d).div_ceil(s).min(outs);
            let hi = (n + p).saturating_sub(d).div_ceil(s).min(outs).max(lo);
            lo..hi
        };
        // Tap d reads phase r at offset q: o·s + d − p = (o + q)·s + r.
        let phase = |d: usize| {
            let e = d as isize - p as isize;
            (e.rem_euclid(s as isize) as usize, e.div_euclid(s as isize))
        };
        for ch in 0..c {
            for dy in 0..k {
                let ys = inside(dy, h, oh);
                if ys.is_empty() {
                    continue;
                }
                let (ry, qy) = phase(dy);
                for dx in 0..k {
                    let xs = inside(dx, w, ow);
                    if xs.is_empty() {
                        continue;
                    }
                    let (rx, qx) = phase(dx);
                    let row = (ch * k + dy) * k + dx;
                    let plane = ((ch * s + ry) * s + rx) * hp * wp;
                    // Inside the image, y + qy ≥ 0 and xs.start + qx ≥ 0.
                    let input = |y: usize| {
                        plane + (y as isize + qy) as usize * wp + (xs.start as isize + qx) as usize
                    };
                    if ow == wp {
                        f(Run {
                            row,
                            at: ys.start * ow + xs.start,
                            from: input(ys.start),
                            len: (ys.len() - 1) * ow + xs.len(),
                            keep: xs.len(),
                            period: ow,
                        });
                    } else {
                        for y in ys.clone() {
                            f(Run {
                                row,
                                at: y * ow + xs.start,
                                from: input(y),
                                len: xs.len(),
                                keep: xs.len(),
                                period: ow,
                            });
                        }
                    }
                }
            }
        }
    }

    /// The [`Plan`] of the geometry `(c, h, w, oh, ow)`: [`Self::plan`] when that is its
    /// geometry (the first one asked for), else one worked out for this call.
    fn plan_for(&self, dims: (usize, usize, usize, usize, usize)) -> Cow<'_, Plan> {
        match self.plan.get_or_init(|| Plan::new(self, dims)) {
            plan if plan.dims == dims => Cow::Borrowed(plan),
            _ => Cow::Owned(Plan::new(self, dims)),
        }
    }

    /// Values of the phase layout of a `[c, h, w]` input ([`Self::runs`]).
    fn phase_len(&self, c: usize, h: usize, w: usize) -> usize {
        let (hp, wp) = self.phase_plane(h, w);
        c * self.stride * self.stride * hp * wp
    }

    /// Image `img` (`[c, h, w]`) into its phase layout `ph` ([`Self::runs`]); positions
    /// past the image's edge are left as they were (no run reads them).
    fn to_phases<T: Copy>(&self, img: &[T], (c, h, w): (usize, usize, usize), ph: &mut [T]) {
        let s = self.stride;
        let (hp, wp) = self.phase_plane(h, w);
        for (r, src) in img[..c * h * w].chunks(w).enumerate() {
            let (ch, iy) = (r / h, r % h);
            let at = ((ch * s + iy % s) * s) * hp * wp + (iy / s) * wp;
            if s == 2 {
                // The even and odd columns, as pairs: a loop the compiler vectorises (the
                // strided one below was 12 % of a bf16 GAN critic convolution's forward
                // pass).
                let (even, odd) = ph[at..].split_at_mut(hp * wp);
                let (even, odd) = (&mut even[..w / 2], &mut odd[..w / 2]);
                for ((e, o), two) in even.iter_mut().zip(odd).zip(src.chunks_exact(2)) {
                    (*e, *o) = (two[0], two[1]);
                }
                if w % 2 == 1 {
                    ph[at + w / 2] = src[w - 1];
                }
                continue;
            }
            for rx in 0..s {
                let dst = &mut ph[at + rx * hp * wp..][..wp];
                dst.iter_mut()
                    .zip(src[rx..].iter().step_by(s))
                    .for_each(|(d, v)| *d = *v);
            }
        }
    }

    /// Writes the image `d` (`[c, h, w]`, every value) from its phase layout `ph`
    /// ([`Self::runs`]): the inverse of [`Self::to_phases`].
    fn phases_to_image(&self, ph: &[f32], (c, h, w): (usize, usize, usize), d: &mut [MaybeUninit<f32>]) {
        let s = self.stride;
        let (hp, wp) = self.phase_plane(h, w);
        for (r, dst) in d[..c * h * w].chunks_mut(w).enumerate() {
            let (ch, iy) = (r / h, r % h);
            let at = ((ch * s + iy % s) * s) * hp * wp + (iy / s) * wp;
            if s == 2 {
                // As in `to_phases`: pairs, not a strided loop.
                let (even, odd) = (&ph[at..][..w / 2], &ph[at + hp * wp..][..w / 2]);
                for ((two, &e), &o) in dst.chunks_exact_mut(2).zip(even).zip(odd) {
                    (two[0], two[1]) = (MaybeUninit::new(e), MaybeUninit::new(o));
                }
                if w % 2 == 1 {
                    dst[w - 1] = MaybeUninit::new(ph[at + w / 2]);
                }
                continue;
            }
            for rx in 0..s {
                let src = &ph[at + rx * hp * wp..][..wp];
                dst[rx..]
                    .iter_mut()
                    .step_by(s)
                    .zip(src)
                    .for_each(|(d, v)| *d = MaybeUninit::new(*v));
            }
        }
    }

    /// The patches of the `imgs` images `x` (`[imgs, c, h, w]`) of geometry `dims`, made a
    /// patch row at a time ([`Unfold`]); with `bits`, for a bf16 product, from the images
    /// rounded to bf16 once here (the unfolded rows, up to `k·k` times as many values, are
    /// then copied as bf16, not each rounded).
    fn unfold<'a>(
        &'a self,
        x: &'a [f32],
        imgs: usize,
        dims: (usize, usize, usize, usize, usize),
        bits: bool,
    ) -> Unfold<'a> {
        let (c, h, w, _, _) = dims;
        let chw = c * h * w;
        let x = &x[..imgs * chw];
        let per = if self.stride == 1 {
            chw
        } else {
            self.phase_len(c, h, w)
        };
        let src = match (bits, self.stride) {
            (false, 1) => Src::Images(x),
            (false, _) => {
                let mut ph = crate::scratch::take(imgs * per);
                for (img, p) in x.chunks(chw).zip(ph.chunks_mut(per)) {
                    self.to_phases(img, (c, h, w), p);
                }
                Src::Phases(ph)
            }
            (true, s) => {
                let mut rounded = Bits::new(imgs * chw);
                crate::bf16::round_bits(x, rounded.as_mut());
                if s == 1 {
                    Src::Bits(rounded)
                } else {
                    let mut ph = Bits::new(imgs * per);
                    for (img, p) in rounded.as_ref().chunks(chw).zip(ph.as_mut().chunks_mut(per)) {
                        self.to_phases(img, (c, h, w), p);
                    }
                    Src::Bits(ph)
                }
            }
        };
        Unfold {
            src,
            plan: self.plan_for(dims),
            imgs,
            per,
            ohw: dims.3 * dims.4,
        }
    }

    /// Writes the image gradient `d` (`[c, h, w]`, every value written; it need not be
    /// initialised) from the transposed patch gradients in columns `col0..col0 + oh·ow` of
    /// `dcols_t` (`[c·k·k, ld]`): the adjoint of [`Self::unfold`]. The gradients of
    /// padding positions inside runs are zeroed on the way (they belong to no input). At
    /// stride 1 the runs are added onto `d` zeroed here; above it onto the phase layout
    /// (zeroed here, about as large), which is then copied out to `d`. (The whole `dx` was
    /// zero-filled by one thread before the groups' folds added into it, and at a stride
    /// above 1 added onto once more: 3 % of a bf16 WGAN epoch's samples were that
    /// `memset`, AMD EPYC Zen 4.)
    fn fold(
        &self,
        dcols_t: &mut [f32],
        dims: (usize, usize, usize, usize, usize),
        (ld, col0): (usize, usize),
        d: &mut [MaybeUninit<f32>],
    ) {
        let (c, h, w, _, _) = dims;
        let mut add = |dst: &mut [f32]| {
            for &run in &self.plan_for(dims).runs {
                let g = &mut dcols_t[run.row * ld + col0 + run.at..][..run.len];
                for gap in run.gaps() {
                    zero_short(&mut g[gap]);
                }
                dst[run.from..run.from + run.len]
                    .iter_mut()
                    .zip(&*g)
                    .for_each(|(d, g)| *d += g);
            }
        };
        let d = &mut d[..c * h * w];
        if self.stride == 1 {
            d.fill(MaybeUninit::new(0.0));
            // SAFETY: every value was just written.
            add(unsafe { &mut *(d as *mut [MaybeUninit<f32>] as *mut [f32]) });
        } else {
            let mut phases = crate::scratch::take(self.phase_len(c, h, w));
            phases.fill(0.0);
            add(&mut phases);
            self.phases_to_image(&phases, (c, h, w), d);
            crate::scratch::give(phases);
        }
    }

    /// Images per matrix product: one for planes of 128 or more outputs; for smaller ones
    /// enough for about 256 columns (a product only a few dozen columns wide spends much of
    /// its time packing the weight, once per image), with
    /// their patches within 1 MiB (so they stay in cache between unfolding and the product)
    /// and at most an equal share of the batch per thread. Down to half that size, a size
    /// that makes the number of groups a multiple of the threads is preferred, so every
    /// thread gets as many (a WGAN critic's batch of 64 in groups of 5 gave one thread 7
    /// groups and the other 6; in groups of 4, 8 each).
    fn group(b: usize, ckk: usize, ohw: usize) -> usize {
        if ohw >= 128 {
            return 1;
        }
        let threads = rayon::current_num_threads().max(1);
        let columns = 256usize.div_ceil(ohw);
        let in_cache = (1 << 18) / (ckk * ohw).max(1);
        let share = b.div_ceil(threads);
        let g = columns.min(in_cache).min(share).max(1);
        (g.div_ceil(2).max(1)..=g)
            .rev()
            .find(|&g| b.div_ceil(g).is_multiple_of(threads))
            .unwrap_or(g)
    }

    /// This convolution of `(b, c, h, w, oh, ow)` ([`Self::geometry`]) to `o` channels in
    /// [`crate::direct_conv`]'s terms.
    fn direct(
        &self,
        (b, c, h, w, oh, ow): (usize, usize, usize, usize, usize, usize),
        o: usize,
    ) -> crate::direct_conv::Geometry {
        crate::direct_conv::Geometry {
            b,
            c,
            h,
            w,
            o,
            k: self.k,
            stride: self.stride,
            padding: self.padding,
            oh,
            ow,
        }
    }

    fn flops(&self, b: usize, o: usize, ckk: usize, ohw: usize) -> u64 {
        2 * (b * o * ckk * ohw) as u64
    }

    /// The arithmetic the weight gradient of the convolution `geometry` runs in directly
    /// ([`crate::direct_conv::weight_gradient`]), where it does rather than as the
    /// unfolded product of `m × k` by `k × n`: that product's ([`Self::direct_arith`])
    /// where the kernel suits the shape. (This op's weight gradient, and a transposed
    /// convolution's: that of the convolution it is the input gradient of.)
    fn direct_weight_gradient(
        &self,
        geometry: &crate::direct_conv::Geometry,
        (m, n, k): (usize, usize, usize),
    ) -> Option<crate::direct_conv::Arith> {
        self.direct_arith((m, n, k))
            .filter(|_| crate::direct_conv::suits_weight_gradient(geometry))
    }

    /// The arithmetic of a direct pass ([`crate::direct_conv`]) standing for an unfolded
    /// product of `m × k` by `k × n`: bf16 where that product would run in bf16
    /// ([`Self::in_bf16`]) and the CPU multiplies bf16 with `vdpbf16ps`
    /// ([`crate::direct_conv::bf16_available`]), f32 where it would stay f32; `None` where
    /// direct convolutions do not run, or the product would run in bf16 on AMX tiles (the
    /// unfolded product then).
    fn direct_arith(&self, (m, n, k): (usize, usize, usize)) -> Option<crate::direct_conv::Arith> {
        use crate::direct_conv::{available, bf16_available, Arith};
        if !available() {
            None
        } else if self.in_bf16(m, n, k) {
            bf16_available().then_some(Arith::Bf16)
        } else {
            Some(Arith::F32)
        }
    }

    /// Whether an unfolded product of `m × k` by `k × n` runs in bf16: under autocast, on
    /// bf16 hardware ([`crate::bf16::accelerated`]), and deep and wide enough that the
    /// faster products outweigh rounding and packing both operands.
    fn in_bf16(&self, m: usize, n: usize, k: usize) -> bool {
        self.bf16 && conv_bf16_pays(m, n, k)
    }

    /// `c = a · b + beta · c` for one group's unfolded product, on the calling thread, in
    /// bf16 where [`Self::in_bf16`], else in f32.
    #[allow(clippy::too_many_arguments)]
    fn product(&self, m: usize, n: usize, k: usize, a: Mat, b: Mat, beta: f32, c: &mut [f32]) {
        if self.in_bf16(m, n, k) {
            use crate::bf16::Operand;
            crate::bf16::gemm_serial(m, n, k, Operand::F32(a), Operand::F32(b), beta, c)
        } else {
            blas::gemm_serial(m, n, k, 1.0, a, b, beta, c)
        }
    }

    /// `c = a · colsᵀ + beta · c` (`a` `m × wide`, the patches `cols` `[c·k·k, wide]`, `c`
    /// `m × c·k·k`: a weight gradient) on the calling thread: in bf16 where
    /// [`Self::in_bf16`], the patch rows unfolded straight into the packed operand
    /// ([`crate::bf16::gemm_serial_rows_t`]); else unfolded into a matrix for an f32
    /// product.
    fn product_by_patches(&self, m: usize, a: Mat, cols: &Unfold, beta: f32, c: &mut [f32]) {
        let (n, k) = (cols.len(), cols.imgs * cols.ohw);
        if cols.in_bf16() {
            let a = crate::bf16::Operand::F32(a);
            return cols.rows(|rows| crate::bf16::gemm_serial_rows_t(m, a, rows, beta, c));
        }
        let mut stored = crate::scratch::take(n * k);
        cols.write_matrix(&mut stored);
        blas::gemm_serial(m, n, k, 1.0, a, Mat::new(&stored, k).t(), beta, c);
        crate::scratch::give(stored);
    }

    /// `a` (`m × k`) as the left operand of a pass whose groups multiply it by `k × n`
    /// patches: packed once in bf16 where those products run in bf16 ([`Self::in_bf16`]).
    fn weight<'a>(&self, a: Mat<'a>, (m, n, k): (usize, usize, usize)) -> Weight<'a> {
        if self.in_bf16(m, n, k) {
            if let Some(packed) = crate::bf16::Lhs::pack(m, k, crate::bf16::Operand::F32(a)) {
                return Weight::Bf16(packed);
            }
        }
        Weight::F32 { a, m, k }
    }
}

/// What the patch rows of a group of images are read from: the images themselves (stride
/// 1), their phase layouts ([`Conv::runs`]) in a scratch buffer, or either rounded to bf16
/// (for a bf16 product).
enum Src<'a> {
    Images(&'a [f32]),
    Phases(Vec<f32>),
    Bits(Bits),
}

/// bf16 values (their bits) in a recycled f32 buffer ([`crate::scratch`]), contents
/// unspecified until written.
struct Bits {
    buf: Vec<f32>,
    len: usize,
}

impl Bits {
    fn new(len: usize) -> Self {
        Bits {
            buf: crate::scratch::take(len.div_ceil(2)),
            len,
        }
    }
}

impl AsRef<[u16]> for Bits {
    fn as_ref(&self) -> &[u16] {
        // SAFETY: `buf` holds ⌈len/2⌉ f32, so `len` u16 (alignment 2 ≤ 4) from its start;
        // any bits are a valid u16.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr().cast(), self.len) }
    }
}

impl AsMut<[u16]> for Bits {
    fn as_mut(&mut self) -> &mut [u16] {
        // SAFETY: as in `as_ref`, and `&mut self` makes the view unique.
        unsafe { std::slice::from_raw_parts_mut(self.buf.as_mut_ptr().cast(), self.len) }
    }
}

impl Drop for Bits {
    fn drop(&mut self) {
        crate::scratch::give(std::mem::take(&mut self.buf));
    }
}

/// The transposed patches of a group of images, `[c·k·k, imgs·oh·ow]` (one row per tap,
/// each image's `oh·ow` positions side by side), made a row at a time: into an f32 matrix
/// for f32 products ([`Self::write_matrix`]), or, from images rounded to bf16
/// ([`Conv::unfold`]'s `bits`), straight into a packed bf16 operand ([`Self::rows`],
/// [`crate::bf16::Rows`]).
struct Unfold<'a> {
    src: Src<'a>,
    /// The op's own plan, or one made for another geometry.
    plan: Cow<'a, Plan>,
    imgs: usize,
    /// Values of `src` per image.
    per: usize,
    ohw: usize,
}

impl Unfold<'_> {
    /// Patch row `r` of every image into `dst` (`imgs · oh · ow` values, each written once)
    /// from `src` (`per` values an image): its runs copied as slices, zero where the tap
    /// falls in the padding.
    fn row_of<T: Copy + Default>(&self, src: &[T], r: usize, dst: &mut [T]) {
        let runs = self.plan.row(r);
        for (j, out) in dst[..self.imgs * self.ohw].chunks_exact_mut(self.ohw).enumerate() {
            let src = &src[j * self.per..];
            // Taps' runs come in position order; what lies between them is padding.
            let mut next = 0;
            for &run in runs {
                if run.at > next {
                    zero_short(&mut out[next..run.at]);
                }
                let o = &mut out[run.at..run.at + run.len];
                copy_short(o, &src[run.from..run.from + run.len]);
                for gap in run.gaps() {
                    zero_short(&mut o[gap]);
                }
                next = run.at + run.len;
            }
            zero_short(&mut out[next..]);
        }
    }

    /// The number of patch rows, `c·k·k`.
    fn len(&self) -> usize {
        self.plan.starts.len() - 1
    }

    /// Whether the rows are made in bf16 ([`Self::rows`]), not f32.
    fn in_bf16(&self) -> bool {
        matches!(self.src, Src::Bits(_))
    }

    /// The whole matrix `[c·k·k, imgs·oh·ow]` into `cols` (every value written), from f32
    /// images.
    fn write_matrix(&self, cols: &mut [f32]) {
        let src = match &self.src {
            Src::Images(x) => *x,
            Src::Phases(ph) => &ph[..],
            Src::Bits(_) => unreachable!("an f32 matrix is unfolded from f32 images"),
        };
        let wide = self.imgs * self.ohw;
        if wide == 0 {
            return;
        }
        for (r, row) in cols[..self.len() * wide].chunks_mut(wide).enumerate() {
            self.row_of(src, r, row);
        }
    }

    /// The patch rows as a [`crate::bf16::Rows`] source, for `f` to use; from images
    /// rounded to bf16.
    fn rows<R>(&self, f: impl FnOnce(crate::bf16::Rows) -> R) -> R {
        let Src::Bits(bits) = &self.src else {
            unreachable!("bf16 rows are unfolded from images rounded to bf16")
        };
        let fill = |r: usize, dst: &mut [u16]| self.row_of(bits.as_ref(), r, dst);
        f(crate::bf16::Rows {
            rows: self.len(),
            cols: self.imgs * self.ohw,
            fill: &fill,
        })
    }
}

impl Drop for Unfold<'_> {
    fn drop(&mut self) {
        if let Src::Phases(ph) = &mut self.src {
            crate::scratch::give(std::mem::take(ph));
        }
    }
}

/// The left operand every group of one convolution pass multiplies by (the weight or its
/// transpose, `m × k`): as it is for f32 products, rounded and packed once for bf16 ones
/// (packed for each group of images, the GAN critic's second convolution would round and
/// pack its 128 × 1024 weight values beside every group's 1024 × 245 patch values: a third
/// of the values packed, by count).
enum Weight<'a> {
    F32 { a: Mat<'a>, m: usize, k: usize },
    Bf16(crate::bf16::Lhs),
}

impl Weight<'_> {
    /// Whether this pass multiplies in bf16.
    fn is_bf16(&self) -> bool {
        matches!(self, Weight::Bf16(_))
    }

    /// `c = a · b + beta · c` for `b` `k × n`, on the calling thread.
    fn times(&self, n: usize, b: Mat, beta: f32, c: &mut [f32]) {
        match self {
            Weight::F32 { a, m, k } => blas::gemm_serial(*m, n, *k, 1.0, *a, b, beta, c),
            Weight::Bf16(p) => p.times(n, crate::bf16::Operand::F32(b), beta, c),
        }
    }

    /// `a [m, k] · cols [k, imgs·n]`, each image's `n` columns written to its place in
    /// `out` (`[imgs, m, n]`, every value written; it need not be initialised).
    fn apart(&self, cols: &[f32], dims: (usize, usize, usize), out: &mut [MaybeUninit<f32>]) {
        let wide = dims.2 * dims.1;
        self.apart_with(dims, out, |c| match self {
            Weight::F32 { a, m, k } => blas::gemm_serial_into(*m, wide, *k, 1.0, *a, Mat::new(cols, wide), c),
            Weight::Bf16(p) => p.times_into(wide, crate::bf16::Operand::F32(Mat::new(cols, wide)), c),
        })
    }

    /// [`Self::apart`] of the patches of `imgs` images: in bf16 their rows unfolded
    /// straight into the packed operand, in f32 into a matrix first.
    fn apart_patches(&self, cols: &Unfold, dims: (usize, usize, usize), out: &mut [MaybeUninit<f32>]) {
        let wide = dims.2 * dims.1;
        self.apart_with(dims, out, |c| match self {
            Weight::F32 { a, m, k } => {
                let mut stored = crate::scratch::take(k * wide);
                cols.write_matrix(&mut stored);
                blas::gemm_serial_into(*m, wide, *k, 1.0, *a, Mat::new(&stored, wide), c);
                crate::scratch::give(stored);
            }
            Weight::Bf16(p) => cols.rows(|rows| p.times_rows_into(rows, c)),
        })
    }

    /// `product(c)` writes the `[m, imgs·n]` product into `c`: straight into `out` for
    /// one image, else into a scratch product whose images' columns are then moved apart.
    fn apart_with(
        &self,
        (m, n, imgs): (usize, usize, usize),
        out: &mut [MaybeUninit<f32>],
        product: impl FnOnce(&mut [MaybeUninit<f32>]),
    ) {
        if imgs == 1 {
            return product(out);
        }
        let mut prod = crate::scratch::take(m * imgs * n);
        // SAFETY: viewing initialised f32 as MaybeUninit; `product` writes only f32 values.
        product(unsafe { std::slice::from_raw_parts_mut(prod.as_mut_ptr().cast(), prod.len()) });
        apart(&prod, (imgs, m, n), out);
        crate::scratch::give(prod);
    }
}

/// Whether convolutions created under bf16 autocast run their products in bf16 on this CPU
/// (those deep and wide enough, [`CONV_BF16_DEPTH`], [`CONV_BF16_EDGE`]): where it has bf16
/// arithmetic ([`crate::bf16::accelerated`]), unless `TRIDENT_CONV_BF16=off` (for
/// comparisons).
pub fn conv_bf16() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        crate::bf16::accelerated()
            && !std::env::var("TRIDENT_CONV_BF16").is_ok_and(|v| v.eq_ignore_ascii_case("off"))
    })
}

/// Whether a convolution's unfolded product of `m × k` by `k × n` pays in bf16 here (see
/// [`Conv::in_bf16`]).
fn conv_bf16_pays(m: usize, n: usize, k: usize) -> bool {
    conv_bf16() && deep_and_wide(m, n, k)
}

/// Whether a convolution's product of `m × k` by `k × n` is deep and wide enough for bf16.
fn deep_and_wide(m: usize, n: usize, k: usize) -> bool {
    k >= CONV_BF16_DEPTH && m >= CONV_BF16_EDGE && n >= CONV_BF16_EDGE
}

/// Counts `flops` of a convolution's products of `m × k` by `k × n` for the profiler's
/// bf16 advice ([`crate::trace::count_bf16_ready`]) where they are deep and wide enough to
/// run in bf16 under autocast, whatever this run's precision and CPU.
fn count_bf16_ready(m: usize, n: usize, k: usize, flops: u64) {
    if deep_and_wide(m, n, k) {
        crate::trace::count_bf16_ready(flops);
    }
}

/// The shortest inner dimension of a convolution's product run in bf16. Unlike a dense
/// layer's ([`crate::bf16::MIN_BF16_DEPTH`]), the weight is rounded and packed once per
/// pass, not per product, so shallower products pay: the backward passes of the Fashion
/// CNN's second convolution (its input gradient 64 deep) and of the GAN critic's (128 deep)
/// ran 1.25–1.5x faster in bf16 (`conv_bench`, AMD EPYC Zen 4), their input gradient
/// alone level with the direct f32 kernel.
const CONV_BF16_DEPTH: usize = 64;

/// The fewest rows and columns of a convolution's product run in bf16: one block of the
/// bf16 kernels ([`crate::bf16`]), 32.
const CONV_BF16_EDGE: usize = 32;

impl CustomOp2 for Conv {
    fn name(&self) -> &'static str {
        "trident-conv2d"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = f32_slice(s1, l1, "conv2d")?;
        let wt = f32_slice(s2, l2, "conv2d weight")?;
        let (b, c, h, w, oh, ow) = self.geometry(l1.dims())?;
        let o = l2.dims()[0];
        let (ckk, ohw) = (c * self.k * self.k, oh * ow);
        let _span = kernel::forward_flops(self.name(), self.flops(b, o, ckk, ohw));
        let geometry = self.direct((b, c, h, w, oh, ow), o);
        let (g, chw) = (Self::group(b, ckk, ohw), c * h * w);
        count_bf16_ready(o, g * ohw, ckk, self.flops(b, o, ckk, ohw));
        if let Some(arith) = self.direct_arith((o, g * ohw, ckk)) {
            if crate::direct_conv::suits(&geometry) {
                let out = crate::direct_conv::forward(x, wt, geometry, arith);
                return kernel::output(out, (b, o, oh, ow));
            }
        }
        // W [o, ckk], the left operand of every group's product.
        let weight = self.weight(Mat::new(wt, ckk), (o, g * ohw, ckk));
        let write = |out: &mut [MaybeUninit<f32>]| {
            out.par_chunks_mut((g * o * ohw).max(1))
                .enumerate()
                .for_each(|(t, y)| {
                    // Images t·g.. side by side: cols_t [ckk, imgs·ohw].
                    let imgs = y.len() / (o * ohw);
                    let dims = (c, h, w, oh, ow);
                    let cols = self.unfold(&x[t * g * chw..], imgs, dims, weight.is_bf16());
                    // y [imgs, o, ohw] = W [o, ckk] · cols_t [ckk, imgs·ohw], image by image
                    weight.apart_patches(&cols, (o, ohw, imgs), y);
                })
        };
        // SAFETY: the chunks cover the output in whole images (b·o·ohw values, chunks of
        // g images), and `apart` writes every value of each.
        let out = unsafe { crate::scratch::written(b * o * ohw, write) };
        kernel::output(out, (b, o, oh, ow))
    }

    fn bwd(
        &self,
        x: &Tensor,
        weight: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (b, c, h, w, oh, ow) = self.geometry(x.dims())?;
        let o = weight.dim(0)?;
        let (ckk, ohw) = (c * self.k * self.k, oh * ow);
        let _span = self.layer.backward(self.name(), 2 * self.flops(b, o, ckk, ohw));
        let (x, weight, grad) = (x.contiguous()?, weight.contiguous()?, grad.contiguous()?);
        let (x_guard, w_guard, g_guard);
        let xv = view!(x, x_guard, "conv2d backward");
        let wv = view!(weight, w_guard, "conv2d backward");
        let gv = view!(grad, g_guard, "conv2d backward");
        // The input's gradient only where something upstream needs it (not for the images
        // a first convolution reads), the weight's only when it is trained (not for a
        // frozen critic scoring a generator's images).
        let (need_dx, need_dw) = (x.track_op(), weight.track_op());
        let chw = c * h * w;
        // The input gradient directly where that runs faster: alone (a frozen weight, as a
        // critic's while its generator trains) 1.07–1.37x on `conv_bench`'s shapes (critic
        // conv2 9.5–9.9 against 12.0–12.3 ms). With an unfolded weight gradient, the
        // groups below share the output gradients between both products, and the direct
        // input gradient beside them measured level or slower; with the direct weight
        // gradient nothing is unfolded.
        let geometry = self.direct((b, c, h, w, oh, ow), o);
        let g = Self::group(b, ckk, ohw);
        if need_dw {
            count_bf16_ready(o, ckk, g * ohw, self.flops(b, o, ckk, ohw));
        }
        if need_dx {
            count_bf16_ready(ckk, g * ohw, o, self.flops(b, o, ckk, ohw));
        }
        // The weight gradient directly where it can: then nothing is unfolded, and the
        // input gradient too goes direct where it suits.
        let dw_arith = self
            .direct_weight_gradient(&geometry, (o, ckk, g * ohw))
            .filter(|_| need_dw);
        let dw_in_groups = need_dw && dw_arith.is_none();
        // The input gradient's arithmetic where it runs directly.
        let dx_arith = self
            .direct_arith((ckk, g * ohw, o))
            .filter(|_| need_dx && !dw_in_groups && crate::direct_conv::suits_input_gradient(&geometry));
        let direct_dx = dx_arith.is_some();
        // Wᵀ [ckk, o], the left operand of every group's input-gradient product.
        let wt_weight =
            (need_dx && !direct_dx).then(|| self.weight(Mat::new(wv, ckk).t(), (ckk, g * ohw, o)));
        // A group of images n0.. (as in the forward pass): adds their weight gradient into
        // `dw` (`beta` 0: writes it) and, with `d` (their slice of dx), writes their input
        // gradients there.
        let group =
            |n0: usize, imgs: usize, d: Option<&mut [MaybeUninit<f32>]>, (dw, beta): (&mut [f32], f32)| {
                let wide = imgs * ohw;
                // The output gradients side by side: gw [o, imgs·ohw].
                let gn = &gv[n0 * o * ohw..(n0 + imgs) * o * ohw];
                let side = side_by_side(gn, (imgs, o, ohw));
                let gw = side.as_deref().unwrap_or(gn);
                if dw_in_groups {
                    // dW [o, ckk] = gw [o, wide] · cols_tᵀ + beta · dW
                    let bits = self.in_bf16(o, ckk, wide);
                    let cols = self.unfold(&xv[n0 * chw..], imgs, (c, h, w, oh, ow), bits);
                    self.product_by_patches(o, Mat::new(gw, wide), &cols, beta, dw);
                }
                if let Some(d) = d {
                    // dcols_t [ckk, wide] = Wᵀ · gw, each image's columns folded into its dx
                    let wt = wt_weight.as_ref().expect("made where the input needs a gradient");
                    let mut dcols = crate::scratch::take(ckk * wide);
                    wt.times(wide, Mat::new(gw, wide), 0.0, &mut dcols);
                    for (j, dj) in d.chunks_mut(chw).enumerate() {
                        self.fold(&mut dcols, (c, h, w, oh, ow), (wide, j * ohw), dj);
                    }
                    crate::scratch::give(dcols);
                }
                crate::scratch::give(side.unwrap_or_default());
            };
        // Each group with its slice of `dx` (none when the input needs no gradient or the
        // direct kernel gives it); per task, the weight gradient of its groups, summed at
        // the end.
        let dw_len = if dw_in_groups { o * ckk } else { 0 };
        let no_dx = None::<(&mut [MaybeUninit<f32>], usize)>;
        let mut dw = Vec::new();
        let dx = if need_dx && !direct_dx {
            let write = |dx: &mut [MaybeUninit<f32>]| {
                dw = per_group_backward(Some((dx, chw)), b, g, dw_len, group);
            };
            // SAFETY: the groups' slices cover dx in whole images, and `fold` writes every
            // value of each.
            Some(unsafe { crate::scratch::written(b * chw, write) })
        } else {
            if dw_in_groups {
                dw = per_group_backward(no_dx, b, g, dw_len, group);
            }
            // Written whole by the direct kernel.
            dx_arith.map(|arith| crate::direct_conv::backward_input(gv, wv, geometry, arith))
        };
        if let Some(arith) = dw_arith {
            dw = crate::direct_conv::weight_gradient(xv, gv, geometry, arith);
        }
        input_and_weight_grads(&x, dx, &weight, need_dw.then_some(dw))
    }
}

/// `[imgs, rows, cols]` images side by side as one `[rows, imgs·cols]` matrix (a scratch
/// buffer), or `None` for one image (already that matrix).
fn side_by_side(src: &[f32], (imgs, rows, cols): (usize, usize, usize)) -> Option<Vec<f32>> {
    if imgs == 1 {
        return None;
    }
    let wide = imgs * cols;
    let mut out = crate::scratch::take(rows * wide);
    for (j, img) in src[..imgs * rows * cols].chunks(rows * cols).enumerate() {
        for (o, r) in out.chunks_mut(wide).zip(img.chunks(cols)) {
            o[j * cols..(j + 1) * cols].copy_from_slice(r);
        }
    }
    Some(out)
}

/// The inverse of [`side_by_side`]: each image's columns of `wide` (`[rows, imgs·cols]`)
/// to its place in `dst` (`[imgs, rows, cols]`, all of it written).
fn apart(wide: &[f32], (imgs, rows, cols): (usize, usize, usize), dst: &mut [MaybeUninit<f32>]) {
    assert!(dst.len() >= imgs * rows * cols && wide.len() >= rows * imgs * cols);
    for (j, img) in dst[..imgs * rows * cols].chunks_mut(rows * cols).enumerate() {
        for (r, w) in img.chunks_mut(cols).zip(wide.chunks(imgs * cols)) {
            for (d, &v) in r.iter_mut().zip(&w[j * cols..(j + 1) * cols]) {
                d.write(v);
            }
        }
    }
}

/// A convolution's input and weight gradients (`dx`, `dw`: their values where wanted) as
/// the tensors candle expects, in the shapes of `x` and `weight`.
fn input_and_weight_grads(
    x: &Tensor,
    dx: Option<Vec<f32>>,
    weight: &Tensor,
    dw: Option<Vec<f32>>,
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let dev = x.device();
    Ok((
        dx.map(|dx| Tensor::from_vec(dx, x.shape(), dev)).transpose()?,
        dw.map(|dw| Tensor::from_vec(dw, weight.shape(), dev))
            .transpose()?,
    ))
}

/// The backward pass the convolutions share: `group(n0, imgs, their slice of dx (when
/// `dx` is given as the buffer and each image's length), (a weight gradient, beta))` for
/// the groups of `g` consecutive images (the last may be smaller) of the `b`, in parallel;
/// returns the weight gradient (`dw_len` values) summed over the groups. A group adds its
/// weight gradient onto the one given (`beta` 1) or, the first of a run, writes it
/// (`beta` 0: the buffer's values are unspecified, a recycled one's; zero-filling each
/// run's buffer first, 512 KiB for a GAN critic's second convolution, was a `memset` per
/// run per step).
///
/// The groups are dealt out as runs of consecutive groups, as many runs as there are
/// threads and at least 8 (fewer only with fewer groups), each run summing its groups in
/// order into its own buffer, and the runs' buffers are added in run order: the same
/// bits every time for a given thread count, whichever thread takes which run. (rayon's
/// `fold` splits the work where threads steal it, so the order of the sums, and their
/// rounding, changed from run to run: no training run with convolutions was reproducible
/// to the bit.)
fn per_group_backward<T: Send>(
    dx: Option<(&mut [T], usize)>,
    b: usize,
    g: usize,
    dw_len: usize,
    group: impl Fn(usize, usize, Option<&mut [T]>, (&mut [f32], f32)) + Sync + Send,
) -> Vec<f32> {
    let mut groups: Vec<(usize, Option<&mut [T]>)> = match dx {
        Some((dx, per_image)) => dx
            .chunks_mut(g * per_image)
            .enumerate()
            .map(|(t, d)| (t * g, Some(d)))
            .collect(),
        None => (0..b).step_by(g).map(|n0| (n0, None)).collect(),
    };
    // Runs of as equal a number of groups as can be (26 groups in 8 runs: 3 or 4 each, not
    // six runs of 4 and one of 2), so that the threads share them evenly.
    let runs = groups.len().min(rayon::current_num_threads().max(8)).max(1);
    let mut rest = &mut groups[..];
    let mut parts = Vec::with_capacity(runs);
    for r in 0..runs {
        let len = rest.len() / (runs - r);
        let (part, tail) = rest.split_at_mut(len);
        parts.push(part);
        rest = tail;
    }
    let sums: Vec<Vec<f32>> = parts
        .into_par_iter()
        .map(|run| {
            let mut dw = crate::scratch::take(dw_len);
            if run.is_empty() {
                dw.fill(0.0);
            }
            for (i, (n0, d)) in run.iter_mut().enumerate() {
                let beta = if i == 0 { 0.0 } else { 1.0 };
                group(*n0, g.min(b - *n0), d.as_deref_mut(), (&mut dw, beta));
            }
            dw
        })
        .collect();
    let mut sums = sums.into_iter();
    let mut total = sums.next().unwrap_or_else(|| vec![0f32; dw_len]);
    for s in sums {
        total.iter_mut().zip(&s).for_each(|(a, b)| *a += b);
        crate::scratch::give(s);
    }
    total
}

/// A convolution (`T`: [`Conv`] or [`ConvTranspose`]) with a bias per output channel added
/// in the same op: the biased output is written once, and the backward pass sums the
/// output gradient per channel for the bias beside the convolution's own gradients. (A
/// separate bias op keeps one more tensor of the output's size, and candle zero-fills and
/// adds the gradient of each.)
struct Biased<T>(T);

impl<T: CustomOp2> CustomOp3 for Biased<T> {
    fn name(&self) -> &'static str {
        self.0.name()
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
        let (out, shape) = self.0.cpu_fwd(s1, l1, s2, l2)?;
        let (CpuStorage::F32(mut y), &[_, c, h, w]) = (out, shape.dims()) else {
            bail!("{}: expected an f32 [b, c, h, w] output", self.name())
        };
        let bias = f32_slice(s3, l3, "convolution bias")?;
        if bias.len() != c {
            bail!(
                "{}: a bias of {} for {c} output channels",
                self.name(),
                bias.len()
            )
        }
        for_rows(&mut y, (h * w).max(1), |plane, r| {
            let v = bias[plane % c];
            r.iter_mut().for_each(|y| *y += v)
        });
        kernel::output(y, shape)
    }

    fn bwd(
        &self,
        x: &Tensor,
        weight: &Tensor,
        bias: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dx, dw) = self.0.bwd(x, weight, res, grad)?;
        let db = if bias.track_op() {
            let (b, c, h, w) = grad.dims4()?;
            let sums = with_f32(&grad.contiguous()?, |g| {
                channel_sums(g, g, (b, c, h * w), |_| |_, _| 0.0)
            })?;
            let db: Vec<f32> = sums.iter().map(|s| s.0).collect();
            Some(Tensor::from_vec(db, c, grad.device())?)
        } else {
            None
        };
        Ok((dx, dw, db))
    }
}

// ---------------------------------------------------------------- transposed convolution

/// Transposed 2-D convolution (PyTorch's `conv_transpose2d` without output padding,
/// groups or dilation): `x` `[b, i, ih, iw]`, `weight` `[i, o, k, k]` (PyTorch's layout),
/// output `[b, o, (ih − 1)·stride + k − 2·padding, …]`.
///
/// It is the input gradient of the convolution [`conv2d`] with the same kernel, stride and
/// padding, so it runs on the same two pieces: per image, `Wᵀ · x` gives the patch
/// gradients, folded onto the output ([`Conv`]'s `fold`); the backward pass unfolds the
/// output gradient into patches ([`Conv`]'s `unfold`) and multiplies twice, for the input
/// (`W · patches`, a convolution) and for the weight (`x · patchesᵀ`). candle's own
/// `conv_transpose2d` is a direct loop on CPU.
pub fn conv_transpose2d(x: &Tensor, weight: &Tensor, stride: usize, padding: usize) -> Result<Tensor> {
    let op = ConvTranspose::checked(x, weight, stride, padding)?;
    x.contiguous()?.apply_op2(&weight.contiguous()?, op)
}

/// [`conv_transpose2d`] plus `bias[o]` on each output channel, in the same op ([`Biased`]).
pub fn conv_transpose2d_bias(
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    stride: usize,
    padding: usize,
) -> Result<Tensor> {
    let op = ConvTranspose::checked(x, weight, stride, padding)?;
    biased(x, weight, bias, weight.dim(1)?, op)
}

impl ConvTranspose {
    /// The transposed convolution of `weight` `[i, o, k, k]` over `x` `[b, i, ih, iw]`, its
    /// shapes checked.
    fn checked(x: &Tensor, weight: &Tensor, stride: usize, padding: usize) -> Result<Self> {
        let (_, i, ih, iw) = x.dims4()?;
        let (wi, _, k, k2) = weight.dims4()?;
        if wi != i || k != k2 {
            bail!(
                "conv_transpose2d: weight {:?} does not fit input channels {i}",
                weight.dims()
            )
        }
        if stride == 0 || ih == 0 || iw == 0 || (ih.min(iw) - 1) * stride + k <= 2 * padding {
            bail!("conv_transpose2d: kernel {k}, stride {stride} and padding {padding} leave no output of {ih}x{iw}")
        }
        Ok(ConvTranspose(Conv {
            k,
            stride,
            padding,
            bf16: crate::bf16::autocast_enabled(),
            layer: LayerTag::capture(),
            plan: OnceLock::new(),
        }))
    }
}

/// [`conv_transpose2d`]: the [`Conv`] whose input gradient it is.
struct ConvTranspose(Conv);

impl ConvTranspose {
    /// `(b, i, ih, iw, o, h, w)`: input `[b, i, ih, iw]`, weight `[i, o, k, k]`, output
    /// `[b, o, h, w]`.
    fn geometry(&self, x: &[usize], wt: &[usize]) -> (usize, usize, usize, usize, usize, usize, usize) {
        let c = &self.0;
        let (b, i, ih, iw, o) = (x[0], x[1], x[2], x[3], wt[1]);
        let h = (ih - 1) * c.stride + c.k - 2 * c.padding;
        let w = (iw - 1) * c.stride + c.k - 2 * c.padding;
        (b, i, ih, iw, o, h, w)
    }
}

impl CustomOp2 for ConvTranspose {
    fn name(&self) -> &'static str {
        "trident-conv-transpose2d"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = f32_slice(s1, l1, "conv_transpose2d")?;
        let wt = f32_slice(s2, l2, "conv_transpose2d weight")?;
        let (b, i, ih, iw, o, h, w) = self.geometry(l1.dims(), l2.dims());
        let conv = &self.0;
        let (okk, ihw) = (o * conv.k * conv.k, ih * iw);
        let _span = kernel::forward_flops(self.name(), conv.flops(b, i, okk, ihw));
        // The input gradient of the convolution from [b, o, h, w] to x's [b, i, ih, iw].
        let geometry = conv.direct((b, o, h, w, ih, iw), i);
        // Images in groups as the convolution's (its patch rows `okk`, its output plane the
        // input's `ihw`).
        let g = Conv::group(b, okk, ihw);
        count_bf16_ready(okk, g * ihw, i, conv.flops(b, i, okk, ihw));
        if let Some(arith) = conv.direct_arith((okk, g * ihw, i)) {
            if crate::direct_conv::suits_input_gradient(&geometry) {
                let out = crate::direct_conv::backward_input(x, wt, geometry, arith);
                return kernel::output(out, (b, o, h, w));
            }
        }
        // Wᵀ [okk, i], the left operand of every group's product.
        let weight = conv.weight(Mat::new(wt, okk).t(), (okk, g * ihw, i));
        let write = |out: &mut [MaybeUninit<f32>]| {
            out.par_chunks_mut(g * o * h * w).enumerate().for_each(|(t, y)| {
                let imgs = y.len() / (o * h * w);
                let wide = imgs * ihw;
                let xn = &x[t * g * i * ihw..][..imgs * i * ihw];
                let side = side_by_side(xn, (imgs, i, ihw));
                let mut cols = crate::scratch::take(okk * wide);
                // cols [okk, wide] = Wᵀ [okk, i] · x [i, wide], each image's columns folded onto
                // its output.
                weight.times(
                    wide,
                    Mat::new(side.as_deref().unwrap_or(xn), wide),
                    0.0,
                    &mut cols,
                );
                for (j, yj) in y.chunks_mut(o * h * w).enumerate() {
                    conv.fold(&mut cols, (o, h, w, ih, iw), (wide, j * ihw), yj);
                }
                crate::scratch::give(side.unwrap_or_default());
                crate::scratch::give(cols);
            })
        };
        // SAFETY: the chunks cover the output in whole images, and `fold` writes every
        // value of each.
        let out = unsafe { crate::scratch::written(b * o * h * w, write) };
        kernel::output(out, (b, o, h, w))
    }

    fn bwd(
        &self,
        x: &Tensor,
        weight: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (b, i, ih, iw, o, h, w) = self.geometry(x.dims(), weight.dims());
        let conv = &self.0;
        let (okk, ihw, ohw) = (o * conv.k * conv.k, ih * iw, o * h * w);
        let _span = conv.layer.backward(self.name(), 2 * conv.flops(b, i, okk, ihw));
        let (x, weight, grad) = (x.contiguous()?, weight.contiguous()?, grad.contiguous()?);
        let (x_guard, w_guard, g_guard);
        let xv = view!(x, x_guard, "conv_transpose2d backward");
        let wv = view!(weight, w_guard, "conv_transpose2d backward");
        let gv = view!(grad, g_guard, "conv_transpose2d backward");
        let (need_dx, need_dw) = (x.track_op(), weight.track_op());
        let g = Conv::group(b, okk, ihw);
        if need_dw {
            count_bf16_ready(i, okk, g * ihw, conv.flops(b, i, okk, ihw));
        }
        if need_dx {
            count_bf16_ready(i, g * ihw, okk, conv.flops(b, i, okk, ihw));
        }
        // The convolution from [b, o, h, w] to x's [b, i, ih, iw]: this op's input gradient
        // is its forward pass over the output gradients, this op's weight gradient its
        // weight gradient (x as its output gradient). Each directly where the kernels suit
        // the shape; what is left shares the unfolded output gradients below.
        let geometry = conv.direct((b, o, h, w, ih, iw), i);
        let dw_arith = conv
            .direct_weight_gradient(&geometry, (i, okk, g * ihw))
            .filter(|_| need_dw);
        let dx_arith = conv
            .direct_arith((i, g * ihw, okk))
            .filter(|_| need_dx && crate::direct_conv::suits(&geometry));
        let direct_dx = dx_arith.is_some();
        // W [i, okk], the left operand of every group's input-gradient product.
        let w_weight = (need_dx && !direct_dx).then(|| conv.weight(Mat::new(wv, okk), (i, g * ihw, okk)));
        let (dw_in_groups, dx_in_groups) = (need_dw && dw_arith.is_none(), need_dx && !direct_dx);
        let group =
            |n0: usize, imgs: usize, d: Option<&mut [MaybeUninit<f32>]>, (dw, beta): (&mut [f32], f32)| {
                let wide = imgs * ihw;
                // The output gradients' patches side by side: cols [okk, wide]. Where every
                // wanted product runs in bf16, unfolded from the rounded gradients into each
                // packed operand (no f32 matrix); else made once as an f32 matrix for both.
                let in_bf16 = (!dw_in_groups || conv.in_bf16(i, okk, wide))
                    && w_weight.as_ref().is_none_or(Weight::is_bf16);
                let cols = conv.unfold(&gv[n0 * ohw..], imgs, (o, h, w, ih, iw), in_bf16);
                let mut stored = Vec::new();
                if !in_bf16 {
                    stored = crate::scratch::take(okk * wide);
                    cols.write_matrix(&mut stored);
                }
                if dw_in_groups {
                    // dW [i, okk] = x [i, wide] · colsᵀ [wide, okk] + beta · dW
                    let xn = &xv[n0 * i * ihw..(n0 + imgs) * i * ihw];
                    let side = side_by_side(xn, (imgs, i, ihw));
                    let x = Mat::new(side.as_deref().unwrap_or(xn), wide);
                    if in_bf16 {
                        conv.product_by_patches(i, x, &cols, beta, dw);
                    } else {
                        conv.product(i, okk, wide, x, Mat::new(&stored, wide).t(), beta, dw);
                    }
                    crate::scratch::give(side.unwrap_or_default());
                }
                if let Some(d) = d {
                    // dx [imgs, i, ihw] = W [i, okk] · cols [okk, imgs·ihw], image by image
                    let w = w_weight.as_ref().expect("made where the input needs a gradient");
                    if in_bf16 {
                        w.apart_patches(&cols, (i, ihw, imgs), d);
                    } else {
                        w.apart(&stored, (i, ihw, imgs), d);
                    }
                }
                crate::scratch::give(stored);
            };
        let dw_len = if dw_in_groups { i * okk } else { 0 };
        let mut dw = Vec::new();
        let mut dx = Vec::new();
        if dw_in_groups || dx_in_groups {
            let write = |dx: &mut [MaybeUninit<f32>]| {
                dw = per_group_backward(dx_in_groups.then_some((dx, i * ihw)), b, g, dw_len, group);
            };
            // SAFETY: with dx_in_groups the groups' slices cover dx in whole images and
            // `apart` writes every value of each; without it dx is empty.
            dx = unsafe { crate::scratch::written(if dx_in_groups { b * i * ihw } else { 0 }, write) };
        }
        if let Some(arith) = dx_arith {
            dx = crate::direct_conv::forward(gv, wv, geometry, arith);
        }
        if let Some(arith) = dw_arith {
            dw = crate::direct_conv::weight_gradient(gv, xv, geometry, arith);
        }
        input_and_weight_grads(&x, need_dx.then_some(dx), &weight, need_dw.then_some(dw))
    }
}

// ---------------------------------------------------------------- depthwise convolution

/// Depthwise 2-D convolution (PyTorch's `conv2d` with `groups = channels`): `x`
/// `[b, c, h, w]`, `weight` `[c, 1, k, k]`, `stride`, and zero padding `[top, left,
/// bottom, right]` — unequal sides give TensorFlow's "SAME" padding, which puts the odd
/// pixel at the bottom and right. Each channel plane is convolved directly (a `k × k`
/// kernel over one plane is too small for a matrix product); the backward pass gives the
/// input and the weight gradients in one pass per channel.
pub fn depthwise_conv2d(x: &Tensor, weight: &Tensor, stride: usize, pads: [usize; 4]) -> Result<Tensor> {
    let (_, c, h, w) = x.dims4()?;
    let (wc, one, k, k2) = weight.dims4()?;
    if wc != c || one != 1 || k != k2 {
        bail!(
            "depthwise_conv2d: weight {:?} does not fit {c} channels (expected [{c}, 1, k, k])",
            weight.dims()
        )
    }
    if stride == 0 || h + pads[0] + pads[2] < k || w + pads[1] + pads[3] < k {
        bail!("depthwise_conv2d: kernel {k} does not fit input {h}x{w} with padding {pads:?}")
    }
    depthwise_with(x, weight, stride, pads, None)
}

/// Output planes up to this many pixels (with 8 channels or more) run channels-last (see
/// [`Depthwise::forward_channels_last`]); larger ones plane by plane, whose long runs per
/// tap were faster there. Measured on EfficientNet-Lite0's blocks at 112 px (profiler,
/// AMD EPYC Zen 4): channels-last 2.5–4.5x faster on its 7 × 7 and 4 × 4 planes, 1.6–2.6x
/// slower on 56 × 56 to 14 × 14 ones.
const CHANNELS_LAST_MAX_PLANE: usize = 64;

/// [`depthwise_conv2d`] by whole planes or channels-last as `channels_last` says (`None`:
/// by the output plane's size and the channel count).
fn depthwise_with(
    x: &Tensor,
    weight: &Tensor,
    stride: usize,
    pads: [usize; 4],
    channels_last: Option<bool>,
) -> Result<Tensor> {
    let (_, c, h, w) = x.dims4()?;
    let mut op = Depthwise {
        k: weight.dim(2)?,
        stride,
        pads,
        channels_last: false,
        layer: LayerTag::capture(),
    };
    let (oh, ow) = op.out_size(h, w);
    op.channels_last = channels_last.unwrap_or(c >= 8 && oh * ow <= CHANNELS_LAST_MAX_PLANE);
    x.contiguous()?.apply_op2(&weight.contiguous()?, op)
}

struct Depthwise {
    k: usize,
    stride: usize,
    pads: [usize; 4],
    /// Image by image with the channels innermost ([`Depthwise::channels_last`]) rather
    /// than plane by plane.
    channels_last: bool,
    layer: LayerTag,
}

impl Depthwise {
    fn out_size(&self, h: usize, w: usize) -> (usize, usize) {
        let [t, l, b, r] = self.pads;
        (
            (h + t + b - self.k) / self.stride + 1,
            (w + l + r - self.k) / self.stride + 1,
        )
    }

    /// Calls `f(output index, input index, count, tap)` for each output row of a plane and
    /// each kernel tap: the `count` output pixels from `output index` on read the input
    /// pixels `input index`, `+ stride`, `+ 2 stride`, … of that tap (the ones that land
    /// inside the input; a row the tap misses entirely is skipped). Whole runs instead of
    /// one call per pixel let the loops in `f` vectorise: the per-pixel version spent 36 %
    /// of EfficientNet-Lite0's training step here.
    #[inline]
    fn runs(&self, h: usize, w: usize, mut f: impl FnMut(usize, usize, usize, usize)) {
        let (oh, ow) = self.out_size(h, w);
        let (k, s, [t, l, _, _]) = (self.k, self.stride, self.pads);
        // For each kx, the output columns whose input column ox·s + kx − l is inside [0, w).
        let cols: Vec<(usize, usize)> = (0..k)
            .map(|kx| {
                let lo = l.saturating_sub(kx).div_ceil(s);
                let hi = if kx > w - 1 + l {
                    0
                } else {
                    ((w - 1 + l - kx) / s + 1).min(ow)
                };
                (lo, hi.max(lo))
            })
            .collect();
        for oy in 0..oh {
            for ky in 0..k {
                let iy = (oy * s + ky) as isize - t as isize;
                if iy < 0 || iy as usize >= h {
                    continue;
                }
                for (kx, &(lo, hi)) in cols.iter().enumerate() {
                    if lo < hi {
                        let ix = lo * s + kx - l;
                        f(oy * ow + lo, iy as usize * w + ix, hi - lo, ky * k + kx);
                    }
                }
            }
        }
    }
}

impl Depthwise {
    /// Stride 1 in a wide frame: the plane `xp` (`h × w`) copied into a zero-padded one
    /// (`(h + t + b) × wp`, `wp = w + l + r`), and every output row computed `wp` wide
    /// (the last `k − 1` columns of each row are junk). Then each kernel tap is one long
    /// contiguous run over the whole plane — `out[q] += w_tap · xpad[q + ky·wp + kx]` — not
    /// one short run per output row: EfficientNet's 7×7 to 56×56 planes gave runs of 7–56
    /// pixels, too short for the per-call overhead (4–5 GFLOP/s).
    fn padded(&self, xp: &[f32], h: usize, w: usize) -> (Vec<f32>, usize) {
        let [t, l, b, r] = self.pads;
        let wp = w + l + r;
        let mut pad = vec![0f32; (h + t + b) * wp];
        for (iy, row) in xp.chunks_exact(w).enumerate() {
            pad[(iy + t) * wp + l..(iy + t) * wp + l + w].copy_from_slice(row);
        }
        (pad, wp)
    }

    /// The wide frame's run length and each tap's offset into the padded plane.
    fn wide_taps(
        &self,
        oh: usize,
        ow: usize,
        wp: usize,
    ) -> (usize, impl Iterator<Item = (usize, usize)> + '_) {
        let k = self.k;
        (
            (oh - 1) * wp + ow,
            (0..k * k).map(move |tap| (tap, (tap / k) * wp + tap % k)),
        )
    }

    /// The forward pass of one plane at stride 1 (see [`Self::padded`]).
    fn forward_wide(
        &self,
        xp: &[f32],
        wp_: &[f32],
        (h, w, oh, ow): (usize, usize, usize, usize),
        y: &mut [f32],
    ) {
        let (pad, wp) = self.padded(xp, h, w);
        let mut wide = vec![0f32; oh * wp];
        let (len, taps) = self.wide_taps(oh, ow, wp);
        for (tap, off) in taps {
            axpy_strided(&mut wide[..len], wp_[tap], &pad[off..off + len], 1);
        }
        for (row, out) in wide.chunks(wp).zip(y.chunks_exact_mut(ow)) {
            out.copy_from_slice(&row[..ow]);
        }
    }

    /// The backward pass of one plane at stride 1: its weight gradient added into `dw`
    /// and, with `d`, its input gradient written there.
    fn backward_wide(
        &self,
        (xp, wp_, g): (&[f32], &[f32], &[f32]),
        (h, w, oh, ow): (usize, usize, usize, usize),
        d: Option<&mut [f32]>,
        dw: &mut [f32],
    ) {
        let (pad, wp) = self.padded(xp, h, w);
        // The output gradient in the wide frame, its junk columns zero.
        let mut gw = vec![0f32; oh * wp];
        for (row, src) in gw.chunks_mut(wp).zip(g.chunks_exact(ow)) {
            row[..ow].copy_from_slice(src);
        }
        let (len, taps) = self.wide_taps(oh, ow, wp);
        let taps: Vec<(usize, usize)> = taps.collect();
        for &(tap, off) in &taps {
            dw[tap] += dot_strided(&gw[..len], &pad[off..off + len], 1);
        }
        if let Some(d) = d {
            let [t, l, _, _] = self.pads;
            let mut dpad = pad;
            dpad.fill(0.0);
            for &(tap, off) in &taps {
                scatter_strided(&mut dpad[off..off + len], wp_[tap], &gw[..len], 1);
            }
            for (iy, out) in d.chunks_exact_mut(w).enumerate() {
                out.copy_from_slice(&dpad[(iy + t) * wp + l..(iy + t) * wp + l + w]);
            }
        }
    }
}

impl Depthwise {
    /// Calls `f(output pixel, input pixel, tap)` for every tap of every output pixel that
    /// lands inside the `h × w` input (pixels as `y · width + x`).
    #[inline]
    fn taps_of_pixels(&self, h: usize, w: usize, mut f: impl FnMut(usize, usize, usize)) {
        let (oh, ow) = self.out_size(h, w);
        let (k, s, [t, l, _, _]) = (self.k, self.stride, self.pads);
        for oy in 0..oh {
            for ky in 0..k {
                let Some(iy) = (oy * s + ky).checked_sub(t).filter(|&iy| iy < h) else {
                    continue;
                };
                for ox in 0..ow {
                    for kx in 0..k {
                        if let Some(ix) = (ox * s + kx).checked_sub(l).filter(|&ix| ix < w) {
                            f(oy * ow + ox, iy * w + ix, ky * k + kx);
                        }
                    }
                }
            }
        }
    }

    /// The forward pass of image `x` (`[c, h, w]`) channels-last: the image transposed to
    /// `[h·w, c]`, each output pixel's `c` values accumulated tap by tap as one contiguous
    /// multiply-add over the channels with the weights as `[k·k, c]` (`wt`), and
    /// transposed back into `y` (`[c, oh·ow]`). Plane by plane, EfficientNet's 7 × 7 and
    /// 14 × 14 planes gave runs of a few dozen pixels per tap (3–4 GFLOP/s).
    fn forward_channels_last(&self, x: &[f32], wt: &[f32], (c, h, w): (usize, usize, usize), y: &mut [f32]) {
        let (oh, ow) = self.out_size(h, w);
        let mut xt = crate::scratch::take(h * w * c);
        transpose_into(x, c, h * w, &mut xt);
        let mut yt = crate::scratch::take(oh * ow * c);
        yt.fill(0.0);
        self.taps_of_pixels(h, w, |o, i, tap| {
            let (acc, xs, ws) = (
                &mut yt[o * c..(o + 1) * c],
                &xt[i * c..(i + 1) * c],
                &wt[tap * c..(tap + 1) * c],
            );
            for ((a, &x), &w) in acc.iter_mut().zip(xs).zip(ws) {
                *a += w * x;
            }
        });
        transpose_into(&yt, oh * ow, c, y);
        crate::scratch::give(xt);
        crate::scratch::give(yt);
    }

    /// The backward pass of image `x` with output gradient `g` (`[c, oh·ow]`) channels-last:
    /// its weight gradient added into `dwt` (`[k·k, c]`) and, with `d`, its input gradient
    /// (`[c, h, w]`) written there.
    fn backward_channels_last(
        &self,
        (x, wt, g): (&[f32], &[f32], &[f32]),
        (c, h, w): (usize, usize, usize),
        d: Option<&mut [f32]>,
        dwt: &mut [f32],
    ) {
        let (oh, ow) = self.out_size(h, w);
        let mut xt = crate::scratch::take(h * w * c);
        transpose_into(x, c, h * w, &mut xt);
        let mut gt = crate::scratch::take(oh * ow * c);
        transpose_into(g, c, oh * ow, &mut gt);
        let mut dxt = crate::scratch::take(if d.is_some() { h * w * c } else { 0 });
        dxt.fill(0.0);
        let want_dx = d.is_some();
        self.taps_of_pixels(h, w, |o, i, tap| {
            let gs = &gt[o * c..(o + 1) * c];
            let dws = &mut dwt[tap * c..(tap + 1) * c];
            for ((dw, &g), &x) in dws.iter_mut().zip(gs).zip(&xt[i * c..(i + 1) * c]) {
                *dw += g * x;
            }
            if want_dx {
                let ds = &mut dxt[i * c..(i + 1) * c];
                for ((dx, &g), &w) in ds.iter_mut().zip(gs).zip(&wt[tap * c..(tap + 1) * c]) {
                    *dx += g * w;
                }
            }
        });
        if let Some(d) = d {
            transpose_into(&dxt, h * w, c, d);
        }
        crate::scratch::give(xt);
        crate::scratch::give(gt);
        crate::scratch::give(dxt);
    }
}

/// `dst` (`[cols, rows]`) = `src` (`[rows, cols]`) transposed, in 32 × 32 blocks.
fn transpose_into(src: &[f32], rows: usize, cols: usize, dst: &mut [f32]) {
    const B: usize = 32;
    for i0 in (0..rows).step_by(B) {
        for j0 in (0..cols).step_by(B) {
            for i in i0..(i0 + B).min(rows) {
                for j in j0..(j0 + B).min(cols) {
                    dst[j * rows + i] = src[i * cols + j];
                }
            }
        }
    }
}

/// `y[j] += a · x[j · stride]` for `j < y.len()`, the stride-1 case as a plain zip.
#[inline]
fn axpy_strided(y: &mut [f32], a: f32, x: &[f32], stride: usize) {
    if stride == 1 {
        for (y, x) in y.iter_mut().zip(x) {
            *y += a * x;
        }
    } else {
        for (y, x) in y.iter_mut().zip(x.iter().step_by(stride)) {
            *y += a * x;
        }
    }
}

/// `Σ_j g[j] · x[j · stride]`. At stride 1 in sixteen independent partial sums: one
/// running sum is a chain of dependent adds the compiler may not reorder (4 cycles each),
/// sixteen vectorise.
#[inline]
fn dot_strided(g: &[f32], x: &[f32], stride: usize) -> f32 {
    if stride == 1 {
        let x = &x[..g.len()];
        let mut acc = [0f32; 16];
        let (gc, xc) = (g.chunks_exact(16), x.chunks_exact(16));
        let tail: f32 = gc
            .remainder()
            .iter()
            .zip(xc.remainder())
            .map(|(g, x)| g * x)
            .sum();
        for (g, x) in gc.zip(xc) {
            for j in 0..16 {
                acc[j] += g[j] * x[j];
            }
        }
        acc.iter().sum::<f32>() + tail
    } else {
        g.iter().zip(x.iter().step_by(stride)).map(|(g, x)| g * x).sum()
    }
}

/// `x[j · stride] += a · g[j]`.
#[inline]
fn scatter_strided(x: &mut [f32], a: f32, g: &[f32], stride: usize) {
    if stride == 1 {
        for (x, g) in x.iter_mut().zip(g) {
            *x += a * g;
        }
    } else {
        for (x, g) in x.iter_mut().step_by(stride).zip(g) {
            *x += a * g;
        }
    }
}

impl CustomOp2 for Depthwise {
    fn name(&self) -> &'static str {
        "trident-depthwise-conv2d"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = f32_slice(s1, l1, "depthwise_conv2d")?;
        let wt = f32_slice(s2, l2, "depthwise_conv2d weight")?;
        let &[b, c, h, w] = l1.dims() else {
            bail!("depthwise_conv2d: expected [b, c, h, w]")
        };
        let (oh, ow) = self.out_size(h, w);
        let kk = self.k * self.k;
        let _span = kernel::forward_flops(self.name(), 2 * (b * c * oh * ow * kk) as u64);
        let mut out = vec![0f32; b * c * oh * ow];
        if self.channels_last {
            let mut wtt = vec![0f32; kk * c];
            transpose_into(wt, c, kk, &mut wtt);
            out.par_chunks_mut(c * oh * ow).enumerate().for_each(|(n, y)| {
                self.forward_channels_last(&x[n * c * h * w..(n + 1) * c * h * w], &wtt, (c, h, w), y)
            });
            return kernel::output(out, (b, c, oh, ow));
        }
        out.par_chunks_mut(oh * ow).enumerate().for_each(|(plane, y)| {
            let ch = plane % c;
            let (xp, wp) = (
                &x[plane * h * w..(plane + 1) * h * w],
                &wt[ch * kk..(ch + 1) * kk],
            );
            let st = self.stride;
            if st == 1 {
                return self.forward_wide(xp, wp, (h, w, oh, ow), y);
            }
            self.runs(h, w, |o, i, n, tap| {
                axpy_strided(&mut y[o..o + n], wp[tap], &xp[i..], st)
            });
        });
        kernel::output(out, (b, c, oh, ow))
    }

    fn bwd(
        &self,
        x: &Tensor,
        weight: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (b, c, h, w) = x.dims4()?;
        let (oh, ow) = self.out_size(h, w);
        let kk = self.k * self.k;
        let _span = self
            .layer
            .backward(self.name(), 4 * (b * c * oh * ow * kk) as u64);
        let (x, weight, grad) = (x.contiguous()?, weight.contiguous()?, grad.contiguous()?);
        let (x_guard, w_guard, g_guard);
        let xv = view!(x, x_guard, "depthwise_conv2d backward");
        let wv = view!(weight, w_guard, "depthwise_conv2d backward");
        let gv = view!(grad, g_guard, "depthwise_conv2d backward");
        let need_dx = x.track_op();
        let mut dx = vec![0f32; if need_dx { b * c * h * w } else { 0 }];
        let dw = if self.channels_last {
            // One task per image, its weight gradient as [k·k, c], summed over the tasks.
            let mut wtt = vec![0f32; kk * c];
            transpose_into(wv, c, kk, &mut wtt);
            let (chw, cohw) = (c * h * w, c * oh * ow);
            let image = |n0: usize, _one: usize, d: Option<&mut [f32]>, (dwt, beta): (&mut [f32], f32)| {
                if beta == 0.0 {
                    dwt.fill(0.0); // added onto below
                }
                let (xn, gn) = (&xv[n0 * chw..(n0 + 1) * chw], &gv[n0 * cohw..(n0 + 1) * cohw]);
                self.backward_channels_last((xn, &wtt, gn), (c, h, w), d, dwt)
            };
            let dwt = per_group_backward(need_dx.then_some((&mut dx[..], chw)), b, 1, kk * c, image);
            let mut dw = vec![0f32; c * kk];
            transpose_into(&dwt, kk, c, &mut dw);
            dw
        } else {
            // One task per plane (image n, channel ch): its input gradient, written in
            // place (planes are disjoint slices of dx), and its part of the channel's
            // weight gradient, summed over the images afterwards in a fixed order.
            let st = self.stride;
            let plane = |p: usize, d: Option<&mut [f32]>, dw: &mut [f32]| {
                let ch = p % c;
                let wp = &wv[ch * kk..(ch + 1) * kk];
                let xp = &xv[p * h * w..(p + 1) * h * w];
                let g = &gv[p * oh * ow..(p + 1) * oh * ow];
                if st == 1 {
                    return self.backward_wide((xp, wp, g), (h, w, oh, ow), d, dw);
                }
                match d {
                    Some(d) => self.runs(h, w, |o, i, m, tap| {
                        dw[tap] += dot_strided(&g[o..o + m], &xp[i..], st);
                        scatter_strided(&mut d[i..], wp[tap], &g[o..o + m], st);
                    }),
                    None => self.runs(h, w, |o, i, m, tap| {
                        dw[tap] += dot_strided(&g[o..o + m], &xp[i..], st)
                    }),
                }
            };
            let mut parts = vec![0f32; b * c * kk];
            if need_dx {
                dx.par_chunks_mut(h * w)
                    .zip(parts.par_chunks_mut(kk))
                    .enumerate()
                    .for_each(|(p, (d, dw))| plane(p, Some(d), dw));
            } else {
                parts
                    .par_chunks_mut(kk)
                    .enumerate()
                    .for_each(|(p, dw)| plane(p, None, dw));
            }
            let mut dw = vec![0f32; c * kk];
            for part in parts.chunks_exact(c * kk) {
                dw.iter_mut().zip(part).for_each(|(a, b)| *a += b);
            }
            dw
        };
        input_and_weight_grads(&x, need_dx.then_some(dx), &weight, Some(dw))
    }
}

/// TensorFlow's "SAME" padding of one axis of `size` for a kernel `k` and `stride`:
/// (before, after), the odd pixel after. The output has `ceil(size / stride)` values.
pub fn same_padding(size: usize, k: usize, stride: usize) -> (usize, usize) {
    let out = size.div_ceil(stride);
    let total = ((out - 1) * stride + k).saturating_sub(size);
    (total / 2, total - total / 2)
}

// ---------------------------------------------------------------- ReLU + max pooling

/// `max_pool2d(relu(x), k)` in one op: `x` `[b, c, h, w]`, windows of `k × k` with stride
/// `k` (an edge that does not fill a window is dropped, as candle's `max_pool2d` does).
/// The two commute, so the op takes each window's maximum and clamps it at 0. The
/// backward pass sends each output gradient to its window's first maximum where that
/// maximum is positive, and nothing elsewhere: PyTorch's `max_pool2d(relu(x))` gradient.
/// candle's own pair costs a comparison, an upsampling, two products and a zero-filled
/// gradient with an add per op in the backward pass, which dominated the CNN's step, and
/// its max-pool gradient is wrong (see the test below).
pub fn relu_max_pool2d(x: &Tensor, k: usize) -> Result<Tensor> {
    let op = ReluMaxPool::new(x, k)?;
    x.contiguous()?.apply_op1(op)
}

struct ReluMaxPool {
    k: usize,
    /// The model layer this kernel ran for (profiling), kept for its backward pass.
    layer: LayerTag,
}

/// The first maximum of four values in window order (NaN counts as a maximum): its index
/// and value.
#[inline(always)]
fn first_max4(v: [f32; 4]) -> (usize, f32) {
    let (mut at, mut m) = (0, v[0]);
    for (i, &x) in v.iter().enumerate().skip(1) {
        if x > m || (x.is_nan() && !m.is_nan()) {
            (at, m) = (i, x);
        }
    }
    (at, m)
}

impl ReluMaxPool {
    /// The op for windows of `k` over `x` (`[b, c, h, w]`), which must fit.
    fn new(x: &Tensor, k: usize) -> Result<Self> {
        let (_, _, h, w) = x.dims4()?;
        if k == 0 || h < k || w < k {
            bail!("relu_max_pool2d: window {k} does not fit input {h}x{w}")
        }
        Ok(ReluMaxPool {
            k,
            layer: LayerTag::capture(),
        })
    }

    /// Calls `f(oy, ox, offset, max)` for every window of a `h × w` plane, with the offset
    /// of the window's first maximum in the plane. 2 × 2 windows (every pooling layer of
    /// the models here) take a path over row pairs without bounds checks per element.
    #[inline]
    fn windows(&self, plane: &[f32], h: usize, w: usize, mut f: impl FnMut(usize, usize, usize, f32)) {
        let (oh, ow) = (h / self.k, w / self.k);
        if self.k != 2 {
            for oy in 0..oh {
                for ox in 0..ow {
                    let (at, m) = self.window_max(plane, w, oy, ox);
                    f(oy, ox, at, m);
                }
            }
            return;
        }
        for oy in 0..oh {
            let (top, bottom) = (2 * oy * w, (2 * oy + 1) * w);
            let r0 = plane[top..top + 2 * ow].chunks_exact(2);
            let r1 = plane[bottom..bottom + 2 * ow].chunks_exact(2);
            for (ox, (a, b)) in r0.zip(r1).enumerate() {
                let (i, m) = first_max4([a[0], a[1], b[0], b[1]]);
                let at = if i < 2 { top } else { bottom } + 2 * ox + (i & 1);
                f(oy, ox, at, m);
            }
        }
    }

    /// For window (oy, ox) of a `h × w` plane: the offset of its first maximum (NaN
    /// counts as a maximum) and that value.
    #[inline]
    fn window_max(&self, plane: &[f32], w: usize, oy: usize, ox: usize) -> (usize, f32) {
        let k = self.k;
        let mut at = oy * k * w + ox * k;
        let mut m = plane[at];
        for dy in 0..k {
            let row = (oy * k + dy) * w + ox * k;
            for (dx, &v) in plane[row..row + k].iter().enumerate() {
                if v > m || (v.is_nan() && !m.is_nan()) {
                    (m, at) = (v, row + dx);
                }
            }
        }
        (at, m)
    }
}

/// Whether `v` holds a NaN (one pass the compiler vectorises; no early exit).
fn has_nan(v: &[f32]) -> bool {
    v.iter().fold(false, |acc, x| acc | x.is_nan())
}

/// `relu(max)` of every 2 × 2 window of a `h × w` plane without NaN, into `out`
/// (`[h / 2, w / 2]`): branch-free over each row pair, so the compiler vectorises it.
fn relu_pool2_plane(plane: &[f32], h: usize, w: usize, out: &mut [MaybeUninit<f32>]) {
    let ow = w / 2;
    for (oy, o) in out.chunks_exact_mut(ow.max(1)).take(h / 2).enumerate() {
        let top = plane[2 * oy * w..][..2 * ow].chunks_exact(2);
        let bottom = plane[(2 * oy + 1) * w..][..2 * ow].chunks_exact(2);
        for (o, (a, b)) in o.iter_mut().zip(top.zip(bottom)) {
            let m = a[0].max(a[1]).max(b[0].max(b[1]));
            o.write(if m > 0.0 { m } else { 0.0 });
        }
    }
}

/// Whether [`relu_pool2_grad_avx`] can run here.
fn avx_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The ReLU + 2 × 2 max pooling gradient of one `h × w` plane by [`relu_pool2_grad_avx`]
/// where it applies (AVX present, the plane at least 8 wide and free of NaN): false, and
/// `d` untouched, where it does not.
fn relu_pool2_grad_fast(plane: &[f32], g: &[f32], h: usize, w: usize, d: &mut [MaybeUninit<f32>]) -> bool {
    if w < 8 || !avx_available() || has_nan(plane) {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: avx_available checked the CPU; w ≥ 8; the slices are one plane, its
    // output gradient and its gradient.
    unsafe {
        relu_pool2_grad_avx(plane, g, h, w, d)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (g, h, d);
    true
}

/// The gradient of ReLU + 2 × 2 max pooling for one `h × w` plane without NaN, with AVX:
/// each output gradient goes to its window's first maximum (window order) where that
/// maximum is positive. Every element of `d` is written (odd last rows and columns with
/// 0). Four windows at a time, computed in the rows' own interleaved layout (no
/// shuffles but a swap of neighbouring lanes); the last group of a row pair overlaps the
/// one before it rather than falling back to scalar code (each window's values are a
/// function of its own inputs, so writing it twice is harmless). `w` must be at least 8.
///
/// # Safety
/// The CPU must have AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn relu_pool2_grad_avx(plane: &[f32], g: &[f32], h: usize, w: usize, d: &mut [MaybeUninit<f32>]) {
    use std::arch::x86_64::*;
    let ow = w / 2;
    assert!(ow >= 4 && plane.len() >= h * w && d.len() >= h * w && g.len() >= (h / 2) * ow);
    // 1 in the even lanes (a window's first column), 0 in the odd ones, as masks.
    let even = _mm256_castsi256_ps(_mm256_setr_epi32(-1, 0, -1, 0, -1, 0, -1, 0));
    let zero = _mm256_setzero_ps();
    for oy in 0..h / 2 {
        let (top, bottom) = (2 * oy * w, (2 * oy + 1) * w);
        let mut ox = 0;
        loop {
            let ox0 = ox.min(ow - 4);
            // SAFETY: columns 2·ox0 .. 2·ox0 + 8 ≤ 2·ow ≤ w of rows 2·oy and 2·oy + 1 < h,
            // and windows ox0 .. ox0 + 4 ≤ ow of output row oy (asserted sizes above).
            let t = _mm256_loadu_ps(plane.as_ptr().add(top + 2 * ox0));
            let b = _mm256_loadu_ps(plane.as_ptr().add(bottom + 2 * ox0));
            let gq = _mm_loadu_ps(g.as_ptr().add(oy * ow + ox0));
            // Each window's gradient in both lanes of its pair.
            let gv = _mm256_set_m128(_mm_unpackhi_ps(gq, gq), _mm_unpacklo_ps(gq, gq));
            // The window maximum in both lanes: the column maxima, then the pair's.
            let v = _mm256_max_ps(t, b);
            let m = _mm256_max_ps(v, _mm256_permute_ps::<0b10_11_00_01>(v));
            let gv = _mm256_and_ps(gv, _mm256_cmp_ps::<_CMP_GT_OQ>(m, zero));
            let et = _mm256_cmp_ps::<_CMP_EQ_OQ>(t, m);
            let eb = _mm256_cmp_ps::<_CMP_EQ_OQ>(b, m);
            // The partner lane's equality: the even lane's in the odd one and back.
            let et_pair = _mm256_permute_ps::<0b10_11_00_01>(et);
            let eb_pair = _mm256_permute_ps::<0b10_11_00_01>(eb);
            // Top: the even lane if equal; the odd one if equal and the even one is not.
            let top_sel = _mm256_or_ps(
                _mm256_and_ps(et, even),
                _mm256_andnot_ps(even, _mm256_andnot_ps(et_pair, et)),
            );
            // Bottom: only when no top lane is equal, then as for the top row.
            let any_top = _mm256_or_ps(et, et_pair);
            let bottom_sel = _mm256_or_ps(
                _mm256_and_ps(eb, even),
                _mm256_andnot_ps(even, _mm256_andnot_ps(eb_pair, eb)),
            );
            let bottom_sel = _mm256_andnot_ps(any_top, bottom_sel);
            let dp = d.as_mut_ptr().cast::<f32>();
            _mm256_storeu_ps(dp.add(top + 2 * ox0), _mm256_and_ps(top_sel, gv));
            _mm256_storeu_ps(dp.add(bottom + 2 * ox0), _mm256_and_ps(bottom_sel, gv));
            if ox0 + 4 >= ow {
                break;
            }
            ox += 4;
        }
        if w % 2 == 1 {
            d[top + w - 1].write(0.0);
            d[bottom + w - 1].write(0.0);
        }
    }
    if h % 2 == 1 {
        d[(h - 1) * w..h * w].fill(MaybeUninit::new(0.0));
    }
}

impl CustomOp1 for ReluMaxPool {
    fn name(&self) -> &'static str {
        "trident-relu-max-pool"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let _span = kernel::forward(self.name());
        let x = f32_slice(s, l, "relu_max_pool2d")?;
        let &[b, c, h, w] = l.dims() else {
            bail!("relu_max_pool2d: expected [b, c, h, w], got {:?}", l.dims())
        };
        let out = self.forward_slices(x, (b, c, h, w));
        kernel::output(out, (b, c, h / self.k, w / self.k))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let _span = self.layer.backward(self.name(), 0);
        let dims = arg.dims4()?;
        let (arg, grad) = (arg.contiguous()?, grad.contiguous()?);
        let (x_guard, g_guard);
        let x = view!(arg, x_guard, "relu_max_pool2d backward");
        let g = view!(grad, g_guard, "relu_max_pool2d backward");
        let dx = self.backward_slices(x, g, dims);
        Ok(Some(Tensor::from_vec(dx, arg.shape(), arg.device())?))
    }
}

impl ReluMaxPool {
    /// The pooled `[b, c, h / k, w / k]` values of `x` (`[b, c, h, w]`).
    fn forward_slices(&self, x: &[f32], (b, c, h, w): (usize, usize, usize, usize)) -> Vec<f32> {
        let (oh, ow) = (h / self.k, w / self.k);
        assert!(
            x.len() >= b * c * h * w,
            "relu_max_pool2d: input shorter than its shape"
        );
        let write = |out: &mut [MaybeUninit<f32>]| {
            out.par_chunks_mut((oh * ow).max(1))
                .zip(x.par_chunks((h * w).max(1)))
                .for_each(|(o, plane)| {
                    if self.k == 2 && !has_nan(plane) {
                        return relu_pool2_plane(plane, h, w, o);
                    }
                    self.windows(plane, h, w, |oy, ox, _, m| {
                        o[oy * ow + ox].write(if m > 0.0 || m.is_nan() { m } else { 0.0 });
                    })
                })
        };
        // SAFETY: one input plane per output plane (asserted), and both ways of pooling a
        // plane visit each of its `oh × ow` windows.
        unsafe { crate::scratch::written(b * c * oh * ow, write) }
    }

    /// The input gradient (`[b, c, h, w]`) from the output gradient `g`.
    fn backward_slices(&self, x: &[f32], g: &[f32], (b, c, h, w): (usize, usize, usize, usize)) -> Vec<f32> {
        let (oh, ow) = (h / self.k, w / self.k);
        if oh * ow == 0 {
            // Planes smaller than the window: no output, no gradient, dx all zeros.
            return vec![0f32; b * c * h * w];
        }
        assert!(
            x.len() >= b * c * h * w && g.len() >= b * c * oh * ow,
            "relu_max_pool2d backward: input or gradient shorter than its shape"
        );
        let write = |dx: &mut [MaybeUninit<f32>]| {
            dx.par_chunks_mut(h * w)
                .zip(x.par_chunks(h * w).zip(g.par_chunks(oh * ow)))
                .for_each(|(d, (plane, g))| {
                    if self.k == 2 && relu_pool2_grad_fast(plane, g, h, w, d) {
                        return;
                    }
                    d.fill(MaybeUninit::new(0.0));
                    self.windows(plane, h, w, |oy, ox, at, m| {
                        if m > 0.0 || m.is_nan() {
                            d[at].write(g[oy * ow + ox]);
                        }
                    })
                })
        };
        // SAFETY: one input plane and one gradient plane per dx plane (asserted; neither
        // plane is empty here), and each dx plane is written whole: by the fast kernel, or
        // zero-filled before the maxima are written.
        unsafe { crate::scratch::written(b * c * h * w, write) }
    }
}

// ---------------------------------------------------------------- dropout

/// Inverted dropout with a mask drawn from `seed` (one draw per element): the same seed
/// gives the same mask, so a resumed run drops exactly what an uninterrupted one would.
pub fn dropout(x: &Tensor, p: f32, seed: u64) -> Result<Tensor> {
    if p <= 0.0 {
        return Ok(x.clone());
    }
    if p >= 1.0 {
        return x.zeros_like();
    }
    let Some(m) = DropMask::new("dropout", p, seed)? else {
        return Ok(x.clone());
    };
    let mut mask = vec![0f32; x.elem_count()];
    for_rows(&mut mask, 4096, |c, block| {
        block
            .iter_mut()
            .enumerate()
            .for_each(|(j, v)| *v = m.scale(c * 4096 + j))
    });
    let mask = Tensor::from_vec(mask, x.shape(), x.device())?;
    x * mask
}

/// A dropout mask drawn per element from a seed (one SplitMix64 draw per element index),
/// so fused kernels (attention, add + layer norm) drop exactly what [`dropout`] drops on a
/// tensor of the same shape, and can draw the mask again in their backward pass instead
/// of storing it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DropMask {
    /// 1 / (1 - p): the scale of kept elements.
    keep: f32,
    /// Draws (upper 32 bits) below this are dropped.
    threshold: u64,
    seed: u64,
}

impl DropMask {
    /// The mask for probability `p` (None when `p` is 0); `p` outside [0, 1) is an error
    /// naming `what`.
    pub(crate) fn new(what: &str, p: f32, seed: u64) -> Result<Option<Self>> {
        if !(0.0..1.0).contains(&p) {
            bail!("{what}: dropout {p} is outside [0, 1)")
        }
        Ok((p > 0.0).then(|| DropMask {
            keep: 1.0 / (1.0 - p),
            threshold: (p as f64 * (1u64 << 32) as f64) as u64,
            seed,
        }))
    }

    /// [`new`](Self::new) for an optional (p, seed).
    pub(crate) fn from_option(what: &str, dropout: Option<(f32, u64)>) -> Result<Option<Self>> {
        match dropout {
            Some((p, seed)) => Self::new(what, p, seed),
            None => Ok(None),
        }
    }

    /// The multiplier of element `index`: 1 / (1 - p) if kept, else 0.
    #[inline]
    pub(crate) fn scale(&self, index: usize) -> f32 {
        let draw = splitmix(self.seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)) >> 32;
        if draw >= self.threshold {
            self.keep
        } else {
            0.0
        }
    }
}

/// The index of the largest value of each row of `[n, classes]` logits.
pub fn argmax_rows(logits: &Tensor) -> Result<Vec<usize>> {
    let c = logits.dim(candle_core::D::Minus1)?;
    let v = logits.detach().flatten_all()?.to_vec1::<f32>()?;
    Ok(v.chunks(c)
        .map(|r| {
            r.iter()
                .enumerate()
                .fold(0, |best, (i, &x)| if x > r[best] { i } else { best })
        })
        .collect())
}

/// A strong 64-bit mix of a counter: the first output of trident-data's SplitMix64
/// seeded with it (the generator the data order and augmentation use).
pub fn splitmix(z: u64) -> u64 {
    trident_data::rng::SplitMix64::new(z).next_u64()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn numeric_grad(f: impl Fn(&Tensor) -> Result<Tensor>, x: &[f32], shape: &[usize]) -> Vec<f32> {
        let eps = 1e-2f32;
        (0..x.len())
            .map(|i| {
                let mut p = x.to_vec();
                p[i] += eps;
                let mut m = x.to_vec();
                m[i] -= eps;
                let fp = f(&Tensor::from_vec(p, shape, &Device::Cpu).unwrap())
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap();
                let fm = f(&Tensor::from_vec(m, shape, &Device::Cpu).unwrap())
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap();
                (fp - fm) / (2.0 * eps)
            })
            .collect()
    }

    fn close(a: &[f32], b: &[f32], tol: f32) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= tol * (1.0 + y.abs()), "element {i}: {x} vs {y}");
        }
    }

    #[test]
    fn layer_norm_gradient_matches_finite_differences() {
        let xs: Vec<f32> = (0..12)
            .map(|i| ((i * 7 % 5) as f32 - 2.0) * 0.7 + i as f32 * 0.1)
            .collect();
        let w = Tensor::new(&[0.5f32, 1.5, -1.0, 2.0], &Device::Cpu).unwrap();
        let b = Tensor::new(&[0.1f32, 0.0, 0.3, -0.2], &Device::Cpu).unwrap();
        let probe = Tensor::new(&[1.0f32, -2.0, 0.5, 3.0], &Device::Cpu).unwrap();
        let f = |x: &Tensor| {
            layer_norm(x, &w, &b, 1e-5)?
                .broadcast_mul(&probe)?
                .sqr()?
                .sum_all()
        };
        let x = Var::from_tensor(&Tensor::from_vec(xs.clone(), (3, 4), &Device::Cpu).unwrap()).unwrap();
        let grads = f(x.as_tensor()).unwrap().backward().unwrap();
        let g = grads
            .get(x.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        close(&g, &numeric_grad(f, &xs, &[3, 4]), 2e-2);
    }

    #[test]
    fn softmax_and_cross_entropy_gradients_match_finite_differences() {
        let xs: Vec<f32> = (0..12).map(|i| (i as f32 * 0.37).sin() * 2.0).collect();
        let labels = Tensor::new(&[2u32, 0, 3], &Device::Cpu).unwrap();
        let probe = Tensor::new(&[1.0f32, -2.0, 0.5, 3.0], &Device::Cpu).unwrap();
        let f_sm = |x: &Tensor| softmax_last_dim(x)?.broadcast_mul(&probe)?.sum_all();
        let f_ce = |x: &Tensor| cross_entropy(x, &labels);
        for f in [&f_sm as &dyn Fn(&Tensor) -> Result<Tensor>, &f_ce] {
            let x = Var::from_tensor(&Tensor::from_vec(xs.clone(), (3, 4), &Device::Cpu).unwrap()).unwrap();
            let grads = f(x.as_tensor()).unwrap().backward().unwrap();
            let g = grads
                .get(x.as_tensor())
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            close(&g, &numeric_grad(f, &xs, &[3, 4]), 1e-2);
        }
    }

    #[test]
    fn conv2d_by_unfolding_matches_candle_values_and_gradients() {
        let dev = &Device::Cpu;
        // Batches of 7 over planes below 128 outputs run in groups of images (the last one
        // smaller); 12 × 12 planes one image at a time; a 1 × 1 kernel without padding
        // copies whole planes.
        // 3 → 4 channels unfold everywhere; 16 → 32 go direct on AVX-512 CPUs where the
        // kernel is larger than 1 × 1 (`direct_conv::suits`; the frozen-weight input
        // gradient below too, unless stride 3 leaves too few taps per phase); 32 → 48 has
        // enough tap rows for the direct weight gradient too (`suits_weight_gradient`).
        let shapes = [(2, 7, 7, 3), (7, 6, 6, 3), (7, 5, 5, 1), (3, 12, 12, 3)];
        let cases = [(1, 1), (2, 0), (1, 0), (2, 1), (3, 2)];
        let channels = [(3, 4), (16, 32), (32, 48)];
        for (((b, h, wd, k), (stride, padding)), (c, o)) in shapes
            .into_iter()
            .flat_map(|s| cases.map(|c| (s, c)))
            .flat_map(|sc| channels.map(|ch| (sc, ch)))
        {
            let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (b, c, h, wd), dev).unwrap()).unwrap();
            let w = Var::from_tensor(&Tensor::randn(0f32, 1.0, (o, c, k, k), dev).unwrap()).unwrap();
            let probe_shape = x
                .as_tensor()
                .conv2d(w.as_tensor(), padding, stride, 1, 1)
                .unwrap();
            let probe = Tensor::randn(0f32, 1.0, probe_shape.shape(), dev).unwrap();
            let ours = conv2d(x.as_tensor(), w.as_tensor(), stride, padding).unwrap();
            let theirs = x
                .as_tensor()
                .conv2d(w.as_tensor(), padding, stride, 1, 1)
                .unwrap();
            let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            close(&flat(&ours), &flat(&theirs), 1e-4);
            let g1 = (ours * &probe).unwrap().sum_all().unwrap().backward().unwrap();
            let g2 = (theirs * &probe).unwrap().sum_all().unwrap().backward().unwrap();
            for v in [&x, &w] {
                close(
                    &flat(g1.get(v.as_tensor()).unwrap()),
                    &flat(g2.get(v.as_tensor()).unwrap()),
                    1e-4,
                );
            }
            // Input data (no gradient wanted): the weight gradient alone, the same.
            let data = x.as_tensor().detach();
            let g3 = (conv2d(&data, w.as_tensor(), stride, padding).unwrap() * &probe)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            assert!(g3.get(&data).is_none());
            close(
                &flat(g3.get(w.as_tensor()).unwrap()),
                &flat(g2.get(w.as_tensor()).unwrap()),
                1e-4,
            );
            // A frozen weight (no gradient wanted): the input gradient alone, the same.
            let frozen = w.as_tensor().detach();
            let g4 = (conv2d(x.as_tensor(), &frozen, stride, padding).unwrap() * &probe)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap();
            assert!(g4.get(&frozen).is_none());
            close(
                &flat(g4.get(x.as_tensor()).unwrap()),
                &flat(g2.get(x.as_tensor()).unwrap()),
                1e-4,
            );
        }
    }

    #[test]
    fn convolution_weight_gradients_are_the_same_bits_every_run() {
        // Many groups of images summed across threads: the order of the sums must not
        // depend on which thread took which group (exact resume, reproducible runs).
        let dev = &Device::Cpu;
        let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (96, 8, 12, 12), dev).unwrap()).unwrap();
        let w = Var::from_tensor(&Tensor::randn(0f32, 1.0, (8, 8, 3, 3), dev).unwrap()).unwrap();
        let wt = Var::from_tensor(&Tensor::randn(0f32, 1.0, (8, 4, 4, 4), dev).unwrap()).unwrap();
        let wd = Var::from_tensor(&Tensor::randn(0f32, 1.0, (8, 1, 3, 3), dev).unwrap()).unwrap();
        let grads = || {
            let y = conv2d(x.as_tensor(), w.as_tensor(), 1, 1).unwrap();
            // Depthwise on 6 × 6 planes of 8 channels: its channels-last path.
            let d = depthwise_conv2d(&y, wd.as_tensor(), 2, [1, 1, 1, 1]).unwrap();
            let z = conv_transpose2d(&d, wt.as_tensor(), 2, 1).unwrap();
            let g = z.sqr().unwrap().sum_all().unwrap().backward().unwrap();
            [&w, &wd, &wt].map(|v| {
                g.get(v.as_tensor())
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
            })
        };
        let first = grads();
        for _ in 0..30 {
            assert!(grads() == first, "the weight gradients changed between runs");
        }
    }

    #[test]
    fn biased_convolutions_equal_the_convolution_then_the_bias() {
        // Values and the three gradients of conv2d_bias / conv_transpose2d_bias against the
        // convolution followed by candle's broadcast add of the bias; a frozen bias gets no
        // gradient.
        let dev = &Device::Cpu;
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for transposed in [false, true] {
            let x = Var::randn(0f32, 1.0, (5, 3, 6, 7), dev).unwrap();
            let (w, b) = if transposed {
                (
                    Var::randn(0f32, 1.0, (3, 4, 4, 4), dev).unwrap(),
                    Var::randn(0f32, 1.0, 4, dev).unwrap(),
                )
            } else {
                (
                    Var::randn(0f32, 1.0, (4, 3, 3, 3), dev).unwrap(),
                    Var::randn(0f32, 1.0, 4, dev).unwrap(),
                )
            };
            let (x, w, bt) = (x.as_tensor(), w.as_tensor(), b.as_tensor());
            let per_channel = bt.reshape((1, 4, 1, 1)).unwrap();
            let (one, two) = if transposed {
                (
                    conv_transpose2d_bias(x, w, bt, 2, 1).unwrap(),
                    conv_transpose2d(x, w, 2, 1)
                        .unwrap()
                        .broadcast_add(&per_channel)
                        .unwrap(),
                )
            } else {
                (
                    conv2d_bias(x, w, bt, 2, 1).unwrap(),
                    conv2d(x, w, 2, 1).unwrap().broadcast_add(&per_channel).unwrap(),
                )
            };
            close(&flat(&one), &flat(&two), 1e-6);
            let probe = Tensor::randn(0f32, 1.0, one.shape(), dev).unwrap();
            let g1 = (one * &probe).unwrap().sum_all().unwrap().backward().unwrap();
            let g2 = (two * &probe).unwrap().sum_all().unwrap().backward().unwrap();
            for v in [x, w, bt] {
                close(&flat(g1.get(v).unwrap()), &flat(g2.get(v).unwrap()), 1e-4);
            }
            let frozen = bt.detach();
            let y = if transposed {
                conv_transpose2d_bias(x, w, &frozen, 2, 1).unwrap()
            } else {
                conv2d_bias(x, w, &frozen, 2, 1).unwrap()
            };
            let g3 = y.sum_all().unwrap().backward().unwrap();
            assert!(g3.get(&frozen).is_none() && g3.get(w).is_some());
        }
        // A bias that does not fit the output channels is refused by name.
        let x = Tensor::zeros((1, 3, 5, 5), candle_core::DType::F32, dev).unwrap();
        let w = Tensor::zeros((4, 3, 3, 3), candle_core::DType::F32, dev).unwrap();
        let e = conv2d_bias(
            &x,
            &w,
            &Tensor::zeros(3, candle_core::DType::F32, dev).unwrap(),
            1,
            1,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("bias [3] does not fit 4 output channels"), "{e}");
    }

    #[test]
    fn convolutions_write_every_value_of_reused_buffers() {
        // Shapes whose patch buffers are pooled (16,384 values or more), filled with NaN
        // between a first pass and the compared one: a patch position left unwritten (a
        // padding gap) or a fold reading one shows as NaN.
        let dev = &Device::Cpu;
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for (stride, padding) in [(1, 1), (2, 1), (2, 0), (1, 0), (3, 2)] {
            let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (8, 16, 12, 12), dev).unwrap()).unwrap();
            let w = Var::from_tensor(&Tensor::randn(0f32, 1.0, (8, 16, 3, 3), dev).unwrap()).unwrap();
            let run = |ours: bool| {
                let y = if ours {
                    conv2d(x.as_tensor(), w.as_tensor(), stride, padding).unwrap()
                } else {
                    x.as_tensor()
                        .conv2d(w.as_tensor(), padding, stride, 1, 1)
                        .unwrap()
                };
                let g = y.sqr().unwrap().sum_all().unwrap().backward().unwrap();
                [flat(&y), flat(g.get(&x).unwrap()), flat(g.get(&w).unwrap())]
            };
            run(true);
            crate::scratch::poison();
            for (got, want) in run(true).iter().zip(run(false)) {
                close(got, &want, 1e-3);
            }
        }
        let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (8, 16, 6, 6), dev).unwrap()).unwrap();
        let w = Var::from_tensor(&Tensor::randn(0f32, 1.0, (16, 8, 4, 4), dev).unwrap()).unwrap();
        let run = |ours: bool| {
            let y = if ours {
                conv_transpose2d(x.as_tensor(), w.as_tensor(), 2, 1).unwrap()
            } else {
                x.as_tensor().conv_transpose2d(w.as_tensor(), 1, 0, 2, 1).unwrap()
            };
            let g = y.sqr().unwrap().sum_all().unwrap().backward().unwrap();
            [flat(&y), flat(g.get(&x).unwrap()), flat(g.get(&w).unwrap())]
        };
        run(true);
        crate::scratch::poison();
        for (got, want) in run(true).iter().zip(run(false)) {
            close(got, &want, 1e-3);
        }
    }

    #[test]
    fn a_convolution_met_with_a_second_geometry_unfolds_it_as_a_fresh_one_does() {
        // One op keeps the runs of the first geometry it meets; a second geometry must get
        // its own, not those.
        let conv = || Conv {
            k: 3,
            stride: 2,
            padding: 1,
            bf16: false,
            layer: LayerTag::default(),
            plan: OnceLock::new(),
        };
        let unfold = |conv: &Conv, (c, h, w): (usize, usize, usize)| {
            let (_, _, _, _, oh, ow) = conv.geometry(&[1, c, h, w]).unwrap();
            let img: Vec<f32> = (0..c * h * w).map(|i| i as f32 + 1.0).collect();
            let mut cols = vec![f32::NAN; c * 9 * oh * ow];
            conv.unfold(&img, 1, (c, h, w, oh, ow), false)
                .write_matrix(&mut cols);
            cols
        };
        let used = conv();
        unfold(&used, (2, 5, 5));
        let (second, fresh) = (unfold(&used, (3, 6, 4)), unfold(&conv(), (3, 6, 4)));
        assert!(second.iter().all(|v| v.is_finite()));
        assert_eq!(second, fresh);
        assert_ne!(
            second,
            unfold(&conv(), (3, 4, 6)),
            "the geometries give different patches"
        );
    }

    /// The transposed convolution on shapes wide enough for the direct kernel
    /// (`direct_conv::backward_input`, on AVX-512 CPUs; elsewhere unfolded) against
    /// candle's transposed convolution and against the input gradient of candle's
    /// convolution, which it is.
    #[test]
    fn wide_transposed_convolutions_match_candle() {
        let dev = &Device::Cpu;
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        // Sizes the stride divides (candle's own input gradient has the wrong shape where a
        // stride-2 convolution drops the last row or column with padding).
        for (k, stride, padding, (h, wd)) in [(3, 1, 1, (9, 10)), (4, 2, 1, (10, 8)), (3, 2, 0, (9, 11))] {
            // The convolution 16 → 32 channels whose input gradient the transposed one is.
            let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (3, 16, h, wd), dev).unwrap()).unwrap();
            let w = Tensor::randn(0f32, 0.3, (32, 16, k, k), dev).unwrap();
            let geometry = Conv::checked(x.as_tensor(), &w, stride, padding)
                .unwrap()
                .direct((3, 16, h, wd, 0, 0), 32);
            assert!(crate::direct_conv::suits_input_gradient(&geometry));
            let y = x.as_tensor().conv2d(&w, padding, stride, 1, 1).unwrap();
            let probe = Tensor::randn(0f32, 1.0, y.shape(), dev).unwrap();
            let grads = (y * &probe).unwrap().sum_all().unwrap().backward().unwrap();
            let up = conv_transpose2d(&probe, &w, stride, padding).unwrap();
            close(&flat(&up), &flat(grads.get(x.as_tensor()).unwrap()), 1e-4);
            let theirs = probe.conv_transpose2d(&w, padding, 0, stride, 1).unwrap();
            close(&flat(&up), &flat(&theirs), 1e-4);
        }
    }

    #[test]
    fn conv_transpose2d_matches_candle_values_and_finite_difference_gradients() {
        let dev = &Device::Cpu;
        for (k, stride, padding) in [(4, 2, 1), (3, 1, 1), (3, 2, 0), (2, 2, 0), (5, 3, 2)] {
            let xs: Vec<f32> = (0..2 * 3 * 4 * 5).map(|i| (i as f32 * 0.37).sin()).collect();
            let ws: Vec<f32> = (0..3 * 2 * k * k)
                .map(|i| (i as f32 * 0.53).cos() * 0.5)
                .collect();
            let x = Tensor::from_vec(xs.clone(), (2, 3, 4, 5), dev).unwrap();
            let w = Tensor::from_vec(ws.clone(), (3, 2, k, k), dev).unwrap();
            let ours = conv_transpose2d(&x, &w, stride, padding).unwrap();
            let theirs = x.conv_transpose2d(&w, padding, 0, stride, 1).unwrap();
            assert_eq!(
                ours.dims(),
                theirs.dims(),
                "k {k} stride {stride} padding {padding}"
            );
            let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            close(&flat(&ours), &flat(&theirs), 1e-4);
            // Gradients of a weighted sum, input and weight, against central differences.
            let probe = Tensor::from_vec(
                (0..ours.elem_count())
                    .map(|i| (i as f32 * 0.11).cos())
                    .collect::<Vec<_>>(),
                ours.shape(),
                dev,
            )
            .unwrap();
            let xv = Var::from_tensor(&x).unwrap();
            let wv = Var::from_tensor(&w).unwrap();
            let loss =
                |x: &Tensor, w: &Tensor| (conv_transpose2d(x, w, stride, padding)? * &probe)?.sum_all();
            let grads = loss(xv.as_tensor(), wv.as_tensor()).unwrap().backward().unwrap();
            let gx = flat(grads.get(xv.as_tensor()).unwrap());
            let gw = flat(grads.get(wv.as_tensor()).unwrap());
            close(&gx, &numeric_grad(|x| loss(x, &w), &xs, &[2, 3, 4, 5]), 1e-2);
            close(&gw, &numeric_grad(|w| loss(&x, w), &ws, &[3, 2, k, k]), 1e-2);
            // Input data (no gradient wanted): the weight gradient alone, the same.
            let g = loss(&x, wv.as_tensor()).unwrap().backward().unwrap();
            assert!(g.get(&x).is_none());
            close(&flat(g.get(wv.as_tensor()).unwrap()), &gw, 1e-5);
            // A frozen weight: the input gradient alone, the same.
            let g = loss(xv.as_tensor(), &w).unwrap().backward().unwrap();
            assert!(g.get(&w).is_none());
            close(&flat(g.get(xv.as_tensor()).unwrap()), &gx, 1e-5);
        }
    }

    /// With channels enough for the direct kernels (on AVX-512 CPUs: the input gradient as
    /// a convolution's forward pass, the weight gradient of a 4 × 4 kernel), both
    /// gradients and each alone against the definition, in f64.
    #[test]
    fn conv_transpose2d_gradients_match_the_definition_with_many_channels() {
        let dev = &Device::Cpu;
        let (b, i, o, h, w, k, s, p) = (2, 32, 24, 5, 6, 4, 2, 1);
        let (oh, ow) = ((h - 1) * s + k - 2 * p, (w - 1) * s + k - 2 * p);
        let wave = |n: usize, f: f32| (0..n).map(|j| (j as f32 * f).sin()).collect::<Vec<f32>>();
        let (xs, ws, ps) = (
            wave(b * i * h * w, 0.37),
            wave(i * o * k * k, 0.53),
            wave(b * o * oh * ow, 0.11),
        );
        let (mut dx, mut dw) = (vec![0f64; xs.len()], vec![0f64; ws.len()]);
        for n in 0..b {
            for ci in 0..i {
                for y in 0..h {
                    for xx in 0..w {
                        for co in 0..o {
                            for ky in 0..k {
                                for kx in 0..k {
                                    let (oy, ox) = (
                                        (y * s + ky) as isize - p as isize,
                                        (xx * s + kx) as isize - p as isize,
                                    );
                                    if oy < 0 || ox < 0 || oy >= oh as isize || ox >= ow as isize {
                                        continue;
                                    }
                                    let at = ((n * o + co) * oh + oy as usize) * ow + ox as usize;
                                    let (xi, wi) =
                                        (((n * i + ci) * h + y) * w + xx, ((ci * o + co) * k + ky) * k + kx);
                                    dx[xi] += f64::from(ws[wi]) * f64::from(ps[at]);
                                    dw[wi] += f64::from(xs[xi]) * f64::from(ps[at]);
                                }
                            }
                        }
                    }
                }
            }
        }
        let to32 = |v: Vec<f64>| v.into_iter().map(|v| v as f32).collect::<Vec<_>>();
        let (dx, dw) = (to32(dx), to32(dw));
        let x = Var::from_vec(xs, (b, i, h, w), dev).unwrap();
        let wt = Var::from_vec(ws, (i, o, k, k), dev).unwrap();
        let probe = Tensor::from_vec(ps, (b, o, oh, ow), dev).unwrap();
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let grads = |x: &Tensor, wt: &Tensor| {
            (conv_transpose2d(x, wt, s, p).unwrap() * &probe)
                .unwrap()
                .sum_all()
                .unwrap()
                .backward()
                .unwrap()
        };
        let both = grads(x.as_tensor(), wt.as_tensor());
        close(&flat(both.get(x.as_tensor()).unwrap()), &dx, 1e-4);
        close(&flat(both.get(wt.as_tensor()).unwrap()), &dw, 1e-4);
        let data = x.as_tensor().detach();
        let weight_alone = grads(&data, wt.as_tensor());
        assert!(weight_alone.get(&data).is_none());
        close(&flat(weight_alone.get(wt.as_tensor()).unwrap()), &dw, 1e-4);
        let frozen = wt.as_tensor().detach();
        let input_alone = grads(x.as_tensor(), &frozen);
        assert!(input_alone.get(&frozen).is_none());
        close(&flat(input_alone.get(x.as_tensor()).unwrap()), &dx, 1e-4);
    }

    #[test]
    fn depthwise_conv2d_matches_candle_grouped_values_and_finite_difference_gradients() {
        let dev = &Device::Cpu;
        for (k, stride, size) in [
            (3, 1, 6),
            (3, 2, 7),
            (5, 2, 8),
            (5, 1, 5),
            (5, 2, 3),
            (3, 2, 2),
            (5, 1, 2),
        ] {
            let (pt, pb) = same_padding(size, k, stride);
            let (pl, pr) = same_padding(size + 1, k, stride);
            let xs: Vec<f32> = (0..2 * 3 * size * (size + 1))
                .map(|i| (i as f32 * 0.37).sin())
                .collect();
            let ws: Vec<f32> = (0..3 * k * k).map(|i| (i as f32 * 0.53).cos() * 0.5).collect();
            let x = Tensor::from_vec(xs.clone(), (2, 3, size, size + 1), dev).unwrap();
            let w = Tensor::from_vec(ws.clone(), (3, 1, k, k), dev).unwrap();
            let pads = [pt, pl, pb, pr];
            let ours = depthwise_conv2d(&x, &w, stride, pads).unwrap();
            // candle: pad explicitly (asymmetric), then a grouped convolution.
            let padded = x
                .pad_with_zeros(2, pt, pb)
                .unwrap()
                .pad_with_zeros(3, pl, pr)
                .unwrap();
            let theirs = padded.conv2d(&w, 0, stride, 1, 3).unwrap();
            assert_eq!(ours.dims(), theirs.dims());
            assert_eq!(
                ours.dims()[2],
                size.div_ceil(stride),
                "SAME keeps ceil(size / stride)"
            );
            let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            close(&flat(&ours), &flat(&theirs), 1e-5);
            let probe = Tensor::from_vec(
                (0..ours.elem_count())
                    .map(|i| (i as f32 * 0.11).cos())
                    .collect::<Vec<_>>(),
                ours.shape(),
                dev,
            )
            .unwrap();
            let loss = |x: &Tensor, w: &Tensor| (depthwise_conv2d(x, w, stride, pads)? * &probe)?.sum_all();
            let (xv, wv) = (Var::from_tensor(&x).unwrap(), Var::from_tensor(&w).unwrap());
            let grads = loss(xv.as_tensor(), wv.as_tensor()).unwrap().backward().unwrap();
            close(
                &flat(grads.get(xv.as_tensor()).unwrap()),
                &numeric_grad(|x| loss(x, &w), &xs, &[2, 3, size, size + 1]),
                1e-2,
            );
            close(
                &flat(grads.get(wv.as_tensor()).unwrap()),
                &numeric_grad(|w| loss(&x, w), &ws, &[3, 1, k, k]),
                1e-2,
            );
        }
        assert_eq!(same_padding(224, 3, 2), (0, 1));
        assert_eq!(same_padding(112, 5, 2), (1, 2));
        assert_eq!(same_padding(14, 5, 1), (2, 2));
    }

    /// The channels-last path (small planes, 8 channels or more) against the plane path the test above
    /// checks against candle and finite differences: values, input and weight gradients.
    #[test]
    fn depthwise_channels_last_equals_the_plane_path() {
        let dev = &Device::Cpu;
        for (k, stride, size, c) in [
            (3, 1, 7, 16),
            (3, 2, 8, 9),
            (5, 2, 7, 24),
            (5, 1, 4, 8),
            (3, 2, 2, 12),
        ] {
            let (pt, pb) = same_padding(size, k, stride);
            let (pl, pr) = same_padding(size + 1, k, stride);
            let pads = [pt, pl, pb, pr];
            let x =
                Var::from_tensor(&Tensor::randn(0f32, 1.0, (3, c, size, size + 1), dev).unwrap()).unwrap();
            let w = Var::from_tensor(&Tensor::randn(0f32, 0.5, (c, 1, k, k), dev).unwrap()).unwrap();
            let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let run = |last: bool| {
                let y = depthwise_with(x.as_tensor(), w.as_tensor(), stride, pads, Some(last)).unwrap();
                let probe = Tensor::from_vec(
                    (0..y.elem_count())
                        .map(|i| (i as f32 * 0.11).cos())
                        .collect::<Vec<_>>(),
                    y.shape(),
                    dev,
                )
                .unwrap();
                let g = (&y * probe).unwrap().sum_all().unwrap().backward().unwrap();
                (flat(&y), flat(g.get(&x).unwrap()), flat(g.get(&w).unwrap()))
            };
            let (planes, last) = (run(false), run(true));
            close(&last.0, &planes.0, 1e-5);
            close(&last.1, &planes.1, 1e-5);
            close(&last.2, &planes.2, 1e-4);
            // Data input: the weight gradient alone.
            let data = x.as_tensor().detach();
            let y = depthwise_with(&data, w.as_tensor(), stride, pads, Some(true)).unwrap();
            let g = y.sum_all().unwrap().backward().unwrap();
            assert!(g.get(&data).is_none());
            let y2 = depthwise_with(&data, w.as_tensor(), stride, pads, Some(false)).unwrap();
            let g2 = y2.sum_all().unwrap().backward().unwrap();
            close(&flat(g.get(&w).unwrap()), &flat(g2.get(&w).unwrap()), 1e-4);
        }
    }

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

    /// The fused op: forward equal to candle's `relu` then `max_pool2d`, gradient equal to
    /// finite differences, on an odd-sized input (the last row and column fall outside
    /// every window) with positive, mixed and all-negative windows. The values are spaced
    /// 0.1 apart and at least 0.05 from 0, so no step of 1e-2 crosses a kink.
    ///
    /// candle's own pair gets the gradient wrong: its max-pool backward multiplies the
    /// gradient by (maxima in the window) / k² instead of dividing by the count (a quarter
    /// of the true value for 2 × 2 windows), and upsamples with the wrong scale when the
    /// input's side is odd.
    #[test]
    fn relu_max_pool_matches_candle_forward_and_finite_differences() {
        let dims = [2, 3, 7, 9];
        let xs: Vec<f32> = (0..2 * 3 * 7 * 9)
            .map(|i| ((i * 37 % 101) as f32 - 85.5) * 0.1)
            .collect();
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        // 2 × 2 windows take the row-pair path, 3 × 3 the general one.
        for k in [2, 3] {
            let (oh, ow) = (7 / k, 9 / k);
            let probe = Tensor::from_vec(
                (0..2 * 3 * oh * ow)
                    .map(|i| (i as f32 * 0.37).cos())
                    .collect::<Vec<_>>(),
                (2, 3, oh, ow),
                &Device::Cpu,
            )
            .unwrap();
            let x = Var::from_tensor(&Tensor::from_vec(xs.clone(), &dims, &Device::Cpu).unwrap()).unwrap();
            let y = relu_max_pool2d(x.as_tensor(), k).unwrap();
            let want = x.as_tensor().relu().unwrap().max_pool2d(k).unwrap();
            assert_eq!(flat(&y), flat(&want), "k = {k}");
            assert!(flat(&y).contains(&0.0) && flat(&y).iter().any(|&v| v > 0.0));
            let f = |x: &Tensor| relu_max_pool2d(x, k)?.mul(&probe)?.sum_all();
            let grads = f(x.as_tensor()).unwrap().backward().unwrap();
            let got = flat(grads.get(x.as_tensor()).unwrap());
            close(&got, &numeric_grad(f, &xs, &dims), 1e-3);
            assert!(
                got.iter().filter(|&&g| g != 0.0).count() > 5,
                "gradients reach the input"
            );
        }
        assert!(relu_max_pool2d(
            &Tensor::zeros((1, 1, 1, 3), candle_core::DType::F32, &Device::Cpu).unwrap(),
            2
        )
        .unwrap_err()
        .to_string()
        .contains("does not fit"));
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

    /// The AVX pooling gradient equals the general window-by-window one on planes full of
    /// ties (small integers, zeros and negatives), odd and even sides, widths from 8 (one
    /// group of four windows) up, and whose last group overlaps the one before.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn relu_pool_gradient_with_avx_equals_the_general_path() {
        if !avx_available() {
            return;
        }
        let pool = ReluMaxPool {
            k: 2,
            layer: LayerTag::default(),
        };
        for (h, w) in [(2, 8), (4, 9), (7, 14), (6, 28), (5, 11), (28, 28), (3, 30)] {
            // Five values from a linear congruential sequence: ties in every direction.
            let mut state = 12345u32 + (h * w) as u32;
            let plane: Vec<f32> = (0..h * w)
                .map(|_| {
                    state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    ((state >> 24) % 5) as f32 - 1.0
                })
                .collect();
            let g: Vec<f32> = (0..(h / 2) * (w / 2)).map(|i| 1.0 + i as f32).collect();
            let mut want = vec![0f32; h * w];
            pool.windows(&plane, h, w, |oy, ox, at, m| {
                if m > 0.0 {
                    want[at] = g[oy * (w / 2) + ox];
                }
            });
            // NaN before the kernel runs (test builds), so a value it skips shows.
            // SAFETY: avx_available above; the kernel writes every value of the plane.
            let got = unsafe { crate::scratch::written(h * w, |d| relu_pool2_grad_avx(&plane, &g, h, w, d)) };
            assert_eq!(got, want, "{h}x{w}");
            assert!(want.iter().filter(|&&v| v != 0.0).count() > (h / 2) * (w / 2) / 3);
        }
    }

    /// 2 × 2 windows of planes without NaN take a vectorised path; a plane holding a NaN
    /// takes the general one, and NaN wins its window (as in PyTorch). Ties and −0.
    #[test]
    fn relu_max_pool_propagates_nan_and_handles_ties() {
        let x = Tensor::from_vec(
            vec![
                3.0,
                3.0,
                -1.0,
                -2.0,
                1.0,
                3.0,
                -5.0,
                -0.0, // no NaN
                f32::NAN,
                1.0,
                2.0,
                0.5,
                0.0,
                0.0,
                4.0,
                f32::NAN, // NaN in both windows
            ],
            (1, 2, 2, 4),
            &Device::Cpu,
        )
        .unwrap();
        let y = relu_max_pool2d(&x, 2)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(&y[..2], &[3.0, 0.0]);
        assert!(y[2].is_nan() && y[3].is_nan(), "{y:?}");
        assert!(y[1].is_sign_positive(), "relu of -0 is +0");
        // Backward: a tie sends the gradient to the first maximum in window order; a
        // window whose maximum is not positive sends none; a NaN wins its window.
        let x = Var::from_tensor(&x).unwrap();
        let probe = Tensor::from_vec(vec![1f32, 2.0, 3.0, 4.0], (1, 2, 1, 2), &Device::Cpu).unwrap();
        let loss = relu_max_pool2d(x.as_tensor(), 2)
            .unwrap()
            .mul(&probe)
            .unwrap()
            .sum_all()
            .unwrap();
        let grads = loss.backward().unwrap();
        let got = grads
            .get(&x)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let want = [
            1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, //
            3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 4.0,
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn cross_entropy_names_a_bad_label() {
        let x = Tensor::zeros((2, 3), candle_core::DType::F32, &Device::Cpu).unwrap();
        let err = cross_entropy(&x, &Tensor::new(&[0u32, 7], &Device::Cpu).unwrap()).unwrap_err();
        assert!(err.to_string().contains("label 7 at row 1"), "{err}");
    }

    #[test]
    fn dropout_is_reproducible_and_scaled() {
        let x = Tensor::ones(10_000, candle_core::DType::F32, &Device::Cpu).unwrap();
        let a = dropout(&x, 0.25, 42).unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(a, dropout(&x, 0.25, 42).unwrap().to_vec1::<f32>().unwrap());
        assert_ne!(a, dropout(&x, 0.25, 43).unwrap().to_vec1::<f32>().unwrap());
        let dropped = a.iter().filter(|&&v| v == 0.0).count() as f32 / 10_000.0;
        assert!((dropped - 0.25).abs() < 0.02, "dropped {dropped}");
        assert!(a.iter().all(|&v| v == 0.0 || (v - 4.0 / 3.0).abs() < 1e-6));
    }

    #[test]
    fn add_layer_norm_equals_layer_norm_of_the_sum_with_gradients() {
        let dev = Device::Cpu;
        let x = Var::randn(0f32, 1.0, (3, 5, 16), &dev).unwrap();
        let r = Var::randn(0f32, 1.0, (3, 5, 16), &dev).unwrap();
        let g = Var::randn(1f32, 0.2, 16, &dev).unwrap();
        let b = Var::randn(0f32, 0.2, 16, &dev).unwrap();
        let probe = Tensor::randn(0f32, 1.0, (3, 5, 16), &dev).unwrap();
        let want = layer_norm(&(x.as_tensor() + r.as_tensor()).unwrap(), &g, &b, 1e-12).unwrap();
        let got = add_layer_norm(&x, &r, &g, &b, 1e-12).unwrap();
        let diff = |a: &Tensor, b: &Tensor| {
            (a - b)
                .unwrap()
                .abs()
                .unwrap()
                .flatten_all()
                .unwrap()
                .max(0)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
        };
        assert!(diff(&want, &got) < 1e-5);
        let gw = (want * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        let gg = (got * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        for (name, v) in [("x", &x), ("residual", &r), ("gamma", &g), ("beta", &b)] {
            let d = diff(gw.get(v).unwrap(), gg.get(v).unwrap());
            assert!(d < 1e-4, "d{name} differs by {d}");
        }
        assert!(add_layer_norm(&x, &r.as_tensor().narrow(1, 0, 2).unwrap(), &g, &b, 1e-12).is_err());
        // With dropout on x: the same mask as `dropout` draws.
        let want = layer_norm(
            &(dropout(&x, 0.3, 99).unwrap() + r.as_tensor()).unwrap(),
            &g,
            &b,
            1e-12,
        )
        .unwrap();
        let got = add_dropout_layer_norm(&x, &r, &g, &b, 1e-12, Some((0.3, 99))).unwrap();
        assert!(diff(&want, &got) < 1e-5);
        let gw = (want * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        let gg = (got * &probe).unwrap().sum_all().unwrap().backward().unwrap();
        for (name, v) in [("x", &x), ("residual", &r), ("gamma", &g), ("beta", &b)] {
            let d = diff(gw.get(v).unwrap(), gg.get(v).unwrap());
            assert!(d < 1e-4, "dropout: d{name} differs by {d}");
        }
    }
}
