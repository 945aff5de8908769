//! Softmax over the last dimension, with its backward pass from the saved output.

use crate::kernel::{self, f32_slice, for_rows, last_dim, LayerTag};
use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};

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

pub(super) fn softmax_row(x: &[f32], o: &mut [f32]) {
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
