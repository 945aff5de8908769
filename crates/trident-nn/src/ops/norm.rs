//! Layer normalisation, and residual add (+ dropout) + layer norm as one kernel.

use super::dropout::DropMask;
use crate::kernel::{self, cpu_slice, f32_slice, for_rows, last_dim, LayerTag};
use candle_core::{bail, CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

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
/// [`dropout`](crate::ops::dropout) would on `x`, fused like [`add_layer_norm`]: the mask is drawn in the kernel
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::dropout;
    use crate::ops::testing::{close, numeric_grad};
    use candle_core::{Device, Var};

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
