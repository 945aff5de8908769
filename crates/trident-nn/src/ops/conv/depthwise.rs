//! Depthwise convolution with asymmetric (SAME) padding.

use super::{input_and_weight_grads, per_group_backward};
use crate::kernel::{self, f32_slice, LayerTag};
use candle_core::{bail, CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{close, numeric_grad};
    use candle_core::{Device, Var};

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
}
