//! Classification losses on logits: cross-entropy and the distillation KL, and the
//! predicted class of each row.

use super::softmax::{softmax_in_place, softmax_row};
use crate::kernel::{self, f32_slice, for_rows, last_dim, LayerTag};
use candle_core::{bail, CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::softmax_last_dim;
    use crate::ops::testing::{close, numeric_grad};
    use candle_core::{Device, Var};

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
    fn cross_entropy_names_a_bad_label() {
        let x = Tensor::zeros((2, 3), candle_core::DType::F32, &Device::Cpu).unwrap();
        let err = cross_entropy(&x, &Tensor::new(&[0u32, 7], &Device::Cpu).unwrap()).unwrap_err();
        assert!(err.to_string().contains("label 7 at row 1"), "{err}");
    }
}
