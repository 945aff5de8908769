//! Element-wise activations as one graph node each: ReLU, GELU, the sigmoid, ReLU6 and
//! LeakyReLU by slice kernels over blocks, and [`elementwise`], a node of any f64 function
//! with a hand-written derivative. (Re-exported by [`crate::dense`] and [`crate::custom`].)

use crate::kernel::{self, f32_slice, for_rows, LayerTag, BLOCK};
use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};
use std::mem::MaybeUninit;

/// GELU in its exact form, `x · Φ(x) = 0.5 · x · (1 + erf(x / √2))`, as BERT and
/// `torch.nn.GELU()` use; the backward pass is one element-wise pass over the saved input.
pub fn gelu(x: &Tensor) -> Result<Tensor> {
    pointwise(
        x,
        ["trident-gelu", "trident-gelu-grad"],
        crate::math::gelu,
        crate::math::gelu_grad,
    )
}

/// ReLU, `max(x, 0)`, one parallel pass each way; NaN stays NaN and the gradient passes
/// where `x > 0` (and at NaN), as PyTorch's. Other dtypes than f32 (the f64 gradient
/// checks) take candle's `relu`. (candle's own f32 rule is a unary map on one thread
/// forward and `ge(zeros) → to_dtype → mul` backward: three passes, two buffers.)
pub fn relu(x: &Tensor) -> Result<Tensor> {
    if x.dtype() != candle_core::DType::F32 {
        return x.relu();
    }
    pointwise(
        x,
        ["trident-relu", "trident-relu-grad"],
        crate::math::relu,
        crate::math::relu_grad,
    )
}

/// The logistic function σ(x) = 1 / (1 + e^−x), one parallel vectorised pass each way,
/// exact at both ends: composed from primitives (`recip(1 + exp(−x))`) its backward pass is
/// NaN below x ≈ −88 in f32, where `exp(−x)` overflows and the chain multiplies 0 by ∞ (a
/// sigmoid decoder pushing black pixels towards 0 got there: a conv autoencoder's loss
/// became NaN in its fifth epoch). Other dtypes than f32 go through
/// [`crate::custom::elementwise`] in f64.
pub fn sigmoid(x: &Tensor) -> Result<Tensor> {
    if x.dtype() != candle_core::DType::F32 {
        return elementwise("sigmoid", logistic_f64, |v| {
            let s = logistic_f64(v);
            s * (1.0 - s)
        })(x);
    }
    pointwise(
        x,
        ["trident-sigmoid", "trident-sigmoid-grad"],
        crate::math::sigmoid,
        crate::math::sigmoid_grad,
    )
}

/// 1 / (1 + e^−x) in f64 without overflow on either side (also softplus's derivative).
pub(crate) fn logistic_f64(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// ReLU6, `min(max(x, 0), 6)` (MobileNet's and EfficientNet-Lite's activation), one
/// parallel pass each way; the gradient passes where `0 < x < 6`, as PyTorch's
/// `hardtanh` backward; NaN stays NaN. (Written through [`crate::custom::elementwise`]
/// it went element by element through an f64 function pointer on one thread: 32 % of an
/// EfficientNet-Lite0 training step's samples.)
pub fn relu6(x: &Tensor) -> Result<Tensor> {
    pointwise(
        x,
        ["trident-relu6", "trident-relu6-grad"],
        crate::math::relu6,
        crate::math::relu6_grad,
    )
}

/// LeakyReLU with slope 0.2 below zero ([`crate::math::LEAKY_SLOPE`], DCGAN's
/// discriminator), one parallel pass each way; the gradient is `g` above zero and `0.2 · g`
/// elsewhere, as PyTorch's. (Through [`crate::custom::elementwise`] it took 9 % of a DCGAN
/// step's samples in f64 function-pointer calls.)
pub fn leaky_relu(x: &Tensor) -> Result<Tensor> {
    pointwise(
        x,
        ["trident-leaky-relu", "trident-leaky-relu-grad"],
        crate::math::leaky_relu,
        crate::math::leaky_relu_grad,
    )
}

/// An activation computed by slice kernels over blocks of [`BLOCK`] values (in parallel
/// when large): `f(x, out)` forward, `df(x, g, out)` (`g` times the derivative at `x`)
/// backward from the saved input; `names` are the forward and backward ops' names.
fn pointwise(
    x: &Tensor,
    names: [&'static str; 2],
    f: fn(&[f32], &mut [MaybeUninit<f32>]),
    df: fn(&[f32], &[f32], &mut [MaybeUninit<f32>]),
) -> Result<Tensor> {
    x.contiguous()?.apply_op1(Pointwise {
        names,
        f,
        df,
        layer: LayerTag::capture(),
    })
}

struct Pointwise {
    names: [&'static str; 2],
    f: fn(&[f32], &mut [MaybeUninit<f32>]),
    df: fn(&[f32], &[f32], &mut [MaybeUninit<f32>]),
    /// The model layer this kernel ran for (profiling), kept for its backward pass.
    layer: LayerTag,
}

impl CustomOp1 for Pointwise {
    fn name(&self) -> &'static str {
        self.names[0]
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let _span = kernel::forward(self.name());
        let x = f32_slice(s, l, self.name())?;
        let write = |out: &mut [MaybeUninit<f32>]| {
            for_rows(out, BLOCK, |c, o| {
                let start = c * BLOCK;
                (self.f)(&x[start..start + o.len()], o)
            })
        };
        // SAFETY: the kernel writes each block whole: its input slice is as long.
        let out = unsafe { crate::scratch::written(x.len(), write) };
        kernel::output(out, l.shape().clone())
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let _span = self.layer.backward(self.name(), 0);
        let grad = PointwiseGrad {
            name: self.names[1],
            df: self.df,
        };
        Ok(Some(x.apply_op2_no_bwd(&g.contiguous()?, &grad)?))
    }
}

/// `dx = df(x, g)`: [`Pointwise`]'s backward pass.
struct PointwiseGrad {
    name: &'static str,
    df: fn(&[f32], &[f32], &mut [MaybeUninit<f32>]),
}

impl CustomOp2 for PointwiseGrad {
    fn name(&self) -> &'static str {
        self.name
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let _span = kernel::forward(self.name());
        let x = f32_slice(s1, l1, self.name)?;
        let g = f32_slice(s2, l2, self.name)?;
        if x.len() != g.len() {
            bail!("{}: {} inputs but {} gradients", self.name, x.len(), g.len())
        }
        let write = |out: &mut [MaybeUninit<f32>]| {
            for_rows(out, BLOCK, |c, o| {
                let start = c * BLOCK;
                let end = start + o.len();
                (self.df)(&x[start..end], &g[start..end], o)
            })
        };
        // SAFETY: the kernel writes each block whole: both input slices are as long (equal
        // lengths checked above).
        let out = unsafe { crate::scratch::written(x.len(), write) };
        kernel::output(out, l1.shape().clone())
    }
}

/// One graph node computing `f` element by element, whose backward pass multiplies the
/// incoming gradient by `df` (the derivative of `f`, hand-written): an activation without
/// the intermediate tensors of a composed one. Runs on f32 and f64 tensors.
pub fn elementwise(
    name: &'static str,
    f: fn(f64) -> f64,
    df: fn(f64) -> f64,
) -> impl Fn(&Tensor) -> Result<Tensor> + Send + Sync + Clone + 'static {
    move |x: &Tensor| x.contiguous()?.apply_op1(Elementwise { name, f, df })
}

struct Elementwise {
    name: &'static str,
    f: fn(f64) -> f64,
    df: fn(f64) -> f64,
}

/// `g` of every element, in parallel blocks.
fn map(s: &CpuStorage, l: &Layout, g: fn(f64) -> f64, name: &str) -> Result<(CpuStorage, Shape)> {
    use rayon::prelude::*;
    const BLOCK: usize = 4096;
    let (start, end) = l
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg(format!("{name}: the input is not contiguous")))?;
    let out = match s {
        CpuStorage::F32(v) => {
            let mut out = vec![0f32; end - start];
            out.par_chunks_mut(BLOCK)
                .zip(v[start..end].par_chunks(BLOCK))
                .for_each(|(o, x)| o.iter_mut().zip(x).for_each(|(o, &x)| *o = g(x as f64) as f32));
            CpuStorage::F32(out)
        }
        CpuStorage::F64(v) => {
            let mut out = vec![0f64; end - start];
            out.par_chunks_mut(BLOCK)
                .zip(v[start..end].par_chunks(BLOCK))
                .for_each(|(o, x)| o.iter_mut().zip(x).for_each(|(o, &x)| *o = g(x)));
            CpuStorage::F64(out)
        }
        _ => candle_core::bail!("{name}: f32 or f64 tensors only"),
    };
    Ok((out, l.shape().clone()))
}

impl CustomOp1 for Elementwise {
    fn name(&self) -> &'static str {
        self.name
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        map(s, l, self.f, self.name)
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
        let d = x.apply_op1_no_bwd(&Derivative {
            name: self.name,
            df: self.df,
        })?;
        Ok(Some(d.mul(g)?))
    }
}

struct Derivative {
    name: &'static str,
    df: fn(f64) -> f64,
}

impl CustomOp1 for Derivative {
    fn name(&self) -> &'static str {
        self.name
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        map(s, l, self.df, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::max_diff;
    use candle_core::{Device, Var};

    #[test]
    fn relu6_clamps_and_passes_the_gradient_strictly_inside() -> Result<()> {
        let dev = Device::Cpu;
        // Both edges, either side of them, NaN; then a long random tensor (parallel path).
        let edges = [-1.0f32, 0.0, 1e-7, 3.0, 6.0 - 1e-6, 6.0, 7.5, f32::NAN];
        let x = Var::from_tensor(&Tensor::new(&edges, &dev)?)?;
        let y = relu6(x.as_tensor())?.to_vec1::<f32>()?;
        assert_eq!(&y[..7], [0.0, 0.0, 1e-7, 3.0, 6.0 - 1e-6, 6.0, 6.0]);
        assert!(y[7].is_nan());
        let g = Tensor::new(&[1f32, 2., 3., 4., 5., 6., 7., 8.], &dev)?;
        let dx = (relu6(x.as_tensor())? * &g)?.sum_all()?.backward()?;
        let dx = dx.get(&x).unwrap().to_vec1::<f32>()?;
        assert_eq!(dx, [0.0, 0.0, 3.0, 4.0, 5.0, 0.0, 0.0, 0.0]);
        let x = Var::randn(0f32, 5.0, (3, 50_000), &dev)?;
        let r = Tensor::randn(0f32, 1.0, (3, 50_000), &dev)?;
        let want = x.as_tensor().clamp(0f32, 6f32)?;
        let got = relu6(x.as_tensor())?;
        assert_eq!(max_diff(&want, &got), 0.0);
        let inside = x
            .as_tensor()
            .gt(0f32)?
            .mul(&x.as_tensor().lt(6f32)?)?
            .to_dtype(candle_core::DType::F32)?;
        let gg = (got * &r)?.sum_all()?.backward()?;
        assert_eq!(max_diff(gg.get(&x).unwrap(), &(r * inside)?), 0.0);
        Ok(())
    }

    #[test]
    fn relu_and_sigmoid_ops_match_candle_and_their_gradients() -> Result<()> {
        let dev = Device::Cpu;
        // A long random tensor: the parallel path, blocks and their remainder.
        let x = Var::randn(0f32, 5.0, (3, 50_001), &dev)?;
        let r = Tensor::randn(0f32, 1.0, (3, 50_001), &dev)?;
        let got = relu(x.as_tensor())?;
        assert_eq!(max_diff(&x.as_tensor().relu()?, &got), 0.0);
        let gg = (got * &r)?.sum_all()?.backward()?;
        let pass = x.as_tensor().gt(0f32)?.to_dtype(candle_core::DType::F32)?;
        assert_eq!(max_diff(gg.get(&x).unwrap(), &(&r * pass)?), 0.0);
        // The sigmoid against candle's composition (fine where exp(-x) does not overflow).
        let s = sigmoid(x.as_tensor())?;
        let want = (x.as_tensor().neg()?.exp()? + 1.0)?.recip()?;
        assert!(max_diff(&want, &s) < 1e-6, "{}", max_diff(&want, &s));
        let gg = (&s * &r)?.sum_all()?.backward()?;
        let want = (&r * (&want * (1.0 - &want)?)?)?;
        assert!(max_diff(gg.get(&x).unwrap(), &want) < 1e-6);
        // f64 (the gradient checks' dtype) takes the other paths and agrees.
        let x64 = x.as_tensor().to_dtype(candle_core::DType::F64)?;
        let s64 = sigmoid(&x64)?.to_dtype(candle_core::DType::F32)?;
        assert!(max_diff(&s64, &s) < 1e-6);
        assert_eq!(
            max_diff(
                &relu(&x64)?.to_dtype(candle_core::DType::F32)?,
                &relu(x.as_tensor())?
            ),
            0.0
        );
        Ok(())
    }

    #[test]
    fn leaky_relu_scales_below_zero_as_pytorch_does() -> Result<()> {
        let dev = Device::Cpu;
        // Zero and either side of it, NaN; then a long random tensor (parallel path).
        let edges = [-5.0f32, -1e-7, 0.0, 1e-7, 3.0, f32::NAN];
        let x = Var::from_tensor(&Tensor::new(&edges, &dev)?)?;
        let y = leaky_relu(x.as_tensor())?.to_vec1::<f32>()?;
        assert_eq!(&y[..5], [-1.0, -2e-8, 0.0, 1e-7, 3.0]);
        assert!(y[5].is_nan());
        let g = Tensor::new(&[1f32, 2., 3., 4., 5., 6.], &dev)?;
        let dx = (leaky_relu(x.as_tensor())? * &g)?.sum_all()?.backward()?;
        let dx = dx.get(&x).unwrap().to_vec1::<f32>()?;
        // PyTorch: the gradient at 0 is the slope's (x > 0 passes it whole).
        assert_eq!(&dx[..5], [0.2, 0.4, 0.6, 4.0, 5.0]);
        let x = Var::randn(0f32, 5.0, (3, 50_000), &dev)?;
        let r = Tensor::randn(0f32, 1.0, (3, 50_000), &dev)?;
        let want = x.as_tensor().maximum(&(x.as_tensor() * 0.2)?)?;
        let got = leaky_relu(x.as_tensor())?;
        assert_eq!(max_diff(&want, &got), 0.0);
        let slope = x
            .as_tensor()
            .gt(0f32)?
            .to_dtype(candle_core::DType::F32)?
            .affine(0.8, 0.2)?;
        let gg = (got * &r)?.sum_all()?.backward()?;
        assert_eq!(max_diff(gg.get(&x).unwrap(), &(r * slope)?), 0.0);
        Ok(())
    }
}
