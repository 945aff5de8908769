//! ReLU + max pooling as one op.

use crate::kernel::{self, f32_slice, LayerTag};
use candle_core::{bail, CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use std::mem::MaybeUninit;

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

pub(super) struct ReluMaxPool {
    pub(super) k: usize,
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
    pub(super) fn new(x: &Tensor, k: usize) -> Result<Self> {
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
    pub(super) fn forward_slices(&self, x: &[f32], (b, c, h, w): (usize, usize, usize, usize)) -> Vec<f32> {
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
    pub(super) fn backward_slices(
        &self,
        x: &[f32],
        g: &[f32],
        (b, c, h, w): (usize, usize, usize, usize),
    ) -> Vec<f32> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::{close, numeric_grad};
    use candle_core::{Device, Var};

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
}
