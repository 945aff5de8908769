//! The transposed convolution, as a convolution's input gradient.

use super::bf16::{count_bf16_ready, Weight};
use super::{biased, input_and_weight_grads, per_group_backward, side_by_side, Conv};
use crate::blas::Mat;
use crate::kernel::{self, f32_slice, LayerTag};
use candle_core::{bail, CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use std::mem::MaybeUninit;
use std::sync::OnceLock;

/// Transposed 2-D convolution (PyTorch's `conv_transpose2d` without output padding,
/// groups or dilation): `x` `[b, i, ih, iw]`, `weight` `[i, o, k, k]` (PyTorch's layout),
/// output `[b, o, (ih − 1)·stride + k − 2·padding, …]`.
///
/// It is the input gradient of the convolution [`conv2d`](super::conv2d) with the same kernel, stride and
/// padding, so it runs on the same two pieces: per image, `Wᵀ · x` gives the patch
/// gradients, folded onto the output ([`Conv`]'s `fold`); the backward pass unfolds the
/// output gradient into patches ([`Conv`]'s `unfold`) and multiplies twice, for the input
/// (`W · patches`, a convolution) and for the weight (`x · patchesᵀ`). candle's own
/// `conv_transpose2d` is a direct loop on CPU.
pub fn conv_transpose2d(x: &Tensor, weight: &Tensor, stride: usize, padding: usize) -> Result<Tensor> {
    let op = ConvTranspose::checked(x, weight, stride, padding)?;
    x.contiguous()?.apply_op2(&weight.contiguous()?, op)
}

/// [`conv_transpose2d`] plus `bias[o]` on each output channel, in the same op ([`Biased`](super::Biased)).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{close, numeric_grad};
    use candle_core::{Device, Var};

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
}
