//! Convolution by unfolding patches (im2col) into products, image group by image group.

use crate::blas::Mat;
use crate::kernel::with_f32;
use crate::kernel::{self, f32_slice, for_rows, LayerTag};
use crate::ops::batch_norm::channel_sums;
use bf16::count_bf16_ready;
use candle_core::{bail, CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};
use plan::Plan;
use rayon::prelude::*;
use std::mem::MaybeUninit;
use std::sync::OnceLock;

mod bf16;
mod depthwise;
mod plan;
mod transpose;
mod unfold;

pub use bf16::conv_bf16;
pub use depthwise::{depthwise_conv2d, same_padding};
pub use transpose::{conv_transpose2d, conv_transpose2d_bias};

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
pub(super) fn biased<T: CustomOp2 + Send + Sync + 'static>(
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
pub(super) fn side_by_side(src: &[f32], (imgs, rows, cols): (usize, usize, usize)) -> Option<Vec<f32>> {
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
pub(super) fn apart(wide: &[f32], (imgs, rows, cols): (usize, usize, usize), dst: &mut [MaybeUninit<f32>]) {
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
pub(super) fn input_and_weight_grads(
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
pub(super) fn per_group_backward<T: Send>(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::close;
    use candle_core::{Device, Var};

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
}
