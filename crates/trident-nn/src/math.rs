//! Element-wise kernels that the compiler can vectorise: `exp` and `erf` written without
//! branches or library calls, and the loops that use them compiled a second time with
//! AVX2+FMA enabled, picked at run time when the CPU has it.
//!
//! Why: `libm`'s scalar `erff`/`expf` made GELU and its gradient 17 % of a MiniLM training
//! step (perf, `docs/PERFORMANCE.md`); PyTorch uses vectorised approximations of the same
//! accuracy class. Accuracy, checked against `libm` in the tests below: `exp` relative
//! error < 3e-7 (Cephes' polynomial), `erf` absolute error < 1e-6 (Abramowitz & Stegun
//! 7.1.26: 1.5e-7 in exact arithmetic, 6.4e-7 measured in f32).
//!
//! The activation kernels (`out` from `x`, or from `x` and `g`) write their outputs as
//! `MaybeUninit` values, so an op's new output need not be zero-filled first
//! ([`crate::scratch::written`]): each writes every value of `out` when its inputs are as
//! long.

use std::mem::MaybeUninit;

const LOG2E: f32 = std::f32::consts::LOG2_E;
// ln 2 split in two so that n·ln2 is exact for the first part (Cephes).
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
// Adding and subtracting 1.5·2^23 rounds an f32 below 2^22 in magnitude to an integer.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// Below this e^x is smaller than the smallest normal f32; [`exp`] returns 0 there.
const EXP_LOW: f32 = -87.3;

/// The largest `|a[i] - b[i]|`, infinite where either side holds NaN: what tests and
/// numerical checks compare against a tolerance. (`fold(0.0, f32::max)` alone skips NaN,
/// so an output left NaN would pass any tolerance.)
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "max_abs_diff: lengths differ");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .map(|d| if d.is_nan() { f32::INFINITY } else { d })
        .fold(0.0, f32::max)
}

/// e^x for finite x: exactly 0 below -87.3 (where e^x is no longer a normal f32), and
/// saturating at ≈ 2.1e38 above 88.3.
///
/// The flush to zero matters for speed, not only accuracy: softmax over padding (scores of
/// -1e9) would otherwise produce probabilities near 1e-38, which become subnormal when
/// normalised, and every GEMM that reads subnormals takes a microcode assist per value
/// (measured: a MiniLM step on padded batches went from ≈1 s to 12 s).
#[inline(always)]
pub fn exp(x_in: f32) -> f32 {
    let x = x_in.clamp(EXP_LOW, 88.3);
    let t = x * LOG2E + ROUND_MAGIC;
    let n = t - ROUND_MAGIC;
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let er = p * r * r + r + 1.0;
    // 2^n by building the exponent field: the clamp keeps n within [-126, 127], so the
    // biased exponent is a normal one. n as an integer is read from t's low mantissa bits
    // (t = 1.5·2^23 + n has an ulp of 1), not by a float-to-int cast: Rust's saturating cast
    // is lowered lane by lane and would keep the loop scalar.
    let n_bits = t.to_bits().wrapping_sub(ROUND_MAGIC.to_bits());
    let scale = f32::from_bits(n_bits.wrapping_add(127).wrapping_shl(23));
    // A select, not a branch: stays vectorised.
    if x_in < EXP_LOW {
        0.0
    } else {
        er * scale
    }
}

/// The error function (Abramowitz & Stegun 7.1.26).
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    erf_given_exp(x, exp(-x * x))
}

/// [`erf`] with `e = e^(-x²)` computed by the caller (GELU's gradient needs it too).
#[inline(always)]
fn erf_given_exp(x: f32, e: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let mut p = 1.061_405_4f32;
    p = p * t - 1.453_152_1;
    p = p * t + 1.421_413_7;
    p = p * t - 0.284_496_74;
    p = p * t + 0.254_829_6;
    let y = 1.0 - p * t * e;
    y.copysign(x)
}

const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
// 1 / √(2π)
const INV_SQRT_2PI: f32 = 0.398_942_3;

/// Φ(v) and e^(-v²/2), from which GELU, Φ and φ follow.
#[inline(always)]
fn normal_cdf_and_exp(v: f32) -> (f32, f32) {
    let e = exp(-0.5 * v * v);
    (0.5 * (1.0 + erf_given_exp(v * FRAC_1_SQRT_2, e)), e)
}

#[inline(always)]
fn gelu_loop(x: &[f32], out: &mut [MaybeUninit<f32>]) {
    for (o, &v) in out.iter_mut().zip(x) {
        o.write(v * normal_cdf_and_exp(v).0);
    }
}

/// GELU'(v) = Φ(v) + v·φ(v), with one exponential for both Φ (through erf) and φ.
#[inline(always)]
fn gelu_derivative(v: f32) -> f32 {
    let (cdf, e) = normal_cdf_and_exp(v);
    cdf + v * INV_SQRT_2PI * e
}

#[inline(always)]
fn gelu_grad_loop(x: &[f32], g: &[f32], out: &mut [MaybeUninit<f32>]) {
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(g) {
        o.write(g * gelu_derivative(v));
    }
}

#[inline(always)]
fn gelu_with_derivative_loop(x: &mut [f32], out: &mut [f32]) {
    for (o, d) in out.iter_mut().zip(x.iter_mut()) {
        let v = *d;
        let (cdf, e) = normal_cdf_and_exp(v);
        *o = v * cdf;
        *d = cdf + v * INV_SQRT_2PI * e;
    }
}

#[inline(always)]
fn exp_loop(x: &mut [f32], shift: f32) -> f32 {
    for v in x.iter_mut() {
        *v = exp(*v - shift);
    }
    // Eight partial sums: a single running sum is a serial chain the compiler may not
    // reorder, which would keep the whole loop scalar.
    let mut acc = [0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}

/// Defines `$name` that runs `$body` (an `#[inline(always)]` loop) compiled for AVX2+FMA
/// when the CPU has them, and for the baseline target otherwise.
macro_rules! dispatch {
    ($(#[$doc:meta])* $name:ident, $avx:ident, ($($arg:ident: $ty:ty),*) -> $ret:ty, $body:ident) => {
        $(#[$doc])*
        pub fn $name($($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                    // SAFETY: the CPU supports the features the function is compiled for.
                    return unsafe { $avx($($arg),*) };
                }
            }
            $body($($arg),*)
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn $avx($($arg: $ty),*) -> $ret {
            $body($($arg),*)
        }
    };
}
pub(crate) use dispatch;

dispatch!(
    /// `out = GELU(x)` (exact form), element-wise.
    gelu, gelu_avx2, (x: &[f32], out: &mut [MaybeUninit<f32>]) -> (), gelu_loop
);
dispatch!(
    /// `out = g · GELU'(x)`, element-wise.
    gelu_grad, gelu_grad_avx2, (x: &[f32], g: &[f32], out: &mut [MaybeUninit<f32>]) -> (), gelu_grad_loop
);
dispatch!(
    /// `out = GELU(x)`, and `x` overwritten by `GELU'(x)`, in one pass (one exponential per
    /// value): a training forward pass keeps the derivative, and its backward pass is a
    /// product.
    gelu_with_derivative, gelu_with_derivative_avx2, (x: &mut [f32], out: &mut [f32]) -> (), gelu_with_derivative_loop
);
/// `out = max(x, 0)` (ReLU), element-wise; NaN stays NaN, as in PyTorch (candle's
/// `relu` turns it into 0).
pub fn relu(x: &[f32], out: &mut [MaybeUninit<f32>]) {
    for (o, &v) in out.iter_mut().zip(x) {
        o.write(if v <= 0.0 { 0.0 } else { v });
    }
}

/// `out = 0` where `x ≤ 0`, else `g`: ReLU's gradient as PyTorch's `threshold_backward`
/// (nothing passes at 0, where candle's rule passes all of `g`).
pub fn relu_grad(x: &[f32], g: &[f32], out: &mut [MaybeUninit<f32>]) {
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(g) {
        o.write(if v <= 0.0 { 0.0 } else { g });
    }
}

/// σ(v) = 1 / (1 + e^−v) without overflow on either side: from e = e^−|v| (never above
/// 1), σ = 1 / (1 + e) for v ≥ 0 and e / (1 + e) below; exactly 0 or 1 beyond |v| ≈ 87,
/// where [`exp`] flushes to zero; NaN stays NaN.
#[inline(always)]
fn logistic(v: f32) -> f32 {
    let (e, s) = logistic_parts(v);
    if v >= 0.0 {
        s
    } else {
        e * s
    }
}

/// `(e, σ(|v|))` with e = e^−|v|: the logistic function and its derivative are built from
/// these on either side.
#[inline(always)]
fn logistic_parts(v: f32) -> (f32, f32) {
    let e = exp(-v.abs());
    (e, 1.0 / (1.0 + e))
}

#[inline(always)]
fn sigmoid_loop(x: &[f32], out: &mut [MaybeUninit<f32>]) {
    for (o, &v) in out.iter_mut().zip(x) {
        o.write(logistic(v));
    }
}

#[inline(always)]
fn sigmoid_grad_loop(x: &[f32], g: &[f32], out: &mut [MaybeUninit<f32>]) {
    // σ(1 − σ) = e / (1 + e)² with e = e^−|v|, on either side: no 1 − σ cancelling
    // where σ is near 1. NaN stays NaN.
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(g) {
        let (e, s) = logistic_parts(v);
        o.write(g * e * s * s);
    }
}

dispatch!(
    /// `out = σ(x)`, the logistic function, element-wise.
    sigmoid, sigmoid_avx2, (x: &[f32], out: &mut [MaybeUninit<f32>]) -> (), sigmoid_loop
);
dispatch!(
    /// `out = g · σ(x)(1 − σ(x))`, element-wise.
    sigmoid_grad, sigmoid_grad_avx2, (x: &[f32], g: &[f32], out: &mut [MaybeUninit<f32>]) -> (), sigmoid_grad_loop
);

/// `out = min(max(x, 0), 6)` (ReLU6), element-wise; NaN stays NaN.
pub fn relu6(x: &[f32], out: &mut [MaybeUninit<f32>]) {
    for (o, &v) in out.iter_mut().zip(x) {
        o.write(v.clamp(0.0, 6.0));
    }
}

/// `out = g` where `0 < x < 6`, else 0: ReLU6's gradient, as PyTorch's `hardtanh` backward.
pub fn relu6_grad(x: &[f32], g: &[f32], out: &mut [MaybeUninit<f32>]) {
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(g) {
        o.write(relu6_grad_at(v, g));
    }
}

/// ReLU6's gradient at one input `v` given the output's gradient `g`.
#[inline(always)]
pub fn relu6_grad_at(v: f32, g: f32) -> f32 {
    if v > 0.0 && v < 6.0 {
        g
    } else {
        0.0
    }
}

/// The slope of [`leaky_relu`] below zero (DCGAN's discriminator).
pub const LEAKY_SLOPE: f32 = 0.2;

/// `out = x` where `x > 0`, else `0.2 · x` (LeakyReLU with [`LEAKY_SLOPE`]), element-wise;
/// NaN stays NaN.
pub fn leaky_relu(x: &[f32], out: &mut [MaybeUninit<f32>]) {
    for (o, &v) in out.iter_mut().zip(x) {
        o.write(if v > 0.0 { v } else { LEAKY_SLOPE * v });
    }
}

/// `out = g` where `x > 0`, else `0.2 · g`: [`leaky_relu`]'s gradient, as PyTorch's.
pub fn leaky_relu_grad(x: &[f32], g: &[f32], out: &mut [MaybeUninit<f32>]) {
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(g) {
        o.write(if v > 0.0 { g } else { LEAKY_SLOPE * g });
    }
}

dispatch!(
    /// `x = e^(x - shift)` in place; returns the sum (softmax's denominator).
    exp_shifted_sum, exp_shifted_sum_avx2, (x: &mut [f32], shift: f32) -> f32, exp_loop
);

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` values written by `kernel` (NaN before it runs in test builds: a value it
    /// skips shows).
    fn fresh(n: usize, kernel: impl FnOnce(&mut [MaybeUninit<f32>])) -> Vec<f32> {
        // SAFETY: every kernel called here writes all of an output as long as its input.
        unsafe { crate::scratch::written(n, kernel) }
    }

    #[test]
    fn max_abs_diff_counts_nan_as_infinite() {
        assert_eq!(max_abs_diff(&[1.0, -2.0, 3.0], &[1.5, -2.0, 0.0]), 3.0);
        assert_eq!(max_abs_diff(&[], &[]), 0.0);
        assert_eq!(max_abs_diff(&[1.0, f32::NAN], &[1.0, 1.0]), f32::INFINITY);
        assert_eq!(max_abs_diff(&[1.0, 2.0], &[f32::NAN, 2.0]), f32::INFINITY);
        assert!(std::panic::catch_unwind(|| max_abs_diff(&[1.0], &[1.0, 2.0])).is_err());
    }

    #[test]
    fn sigmoid_matches_f64_and_saturates_without_overflow() {
        // Both the dispatched (AVX2 where present) and the baseline loops; values within
        // about twice the smallest normal f32 of zero may be flushed to zero (exp does).
        let x: Vec<f32> = (-100_000..=100_000).map(|i| i as f32 * 1e-3).collect(); // [-100, 100]
        let g: Vec<f32> = x.iter().map(|v| 0.5 + (v * 7.0).sin().abs()).collect();
        let n = x.len();
        let (s, s0) = (fresh(n, |o| sigmoid(&x, o)), fresh(n, |o| sigmoid_loop(&x, o)));
        let d = fresh(n, |o| sigmoid_grad(&x, &g, o));
        let d0 = fresh(n, |o| sigmoid_grad_loop(&x, &g, o));
        for i in 0..x.len() {
            let want = 1.0 / (1.0 + (-(x[i] as f64)).exp());
            let want_d = g[i] as f64 * want * (1.0 - want);
            for (got, got_d) in [(s[i], d[i]), (s0[i], d0[i])] {
                assert!(
                    ((got as f64) - want).abs() <= 1e-6 * want + 2.0 * f32::MIN_POSITIVE as f64,
                    "σ({}) = {got}, want {want}",
                    x[i]
                );
                assert!(
                    ((got_d as f64) - want_d).abs() <= 1e-6 * want_d.abs() + 1e-7,
                    "σ'({}) = {got_d}, want {want_d}",
                    x[i]
                );
            }
        }
        let out = fresh(4, |o| sigmoid(&[f32::NAN, -1e30, 1e30, 0.0], o));
        assert!(out[0].is_nan());
        assert_eq!(out[1..], [0.0, 1.0, 0.5]);
        let out = fresh(4, |o| sigmoid_grad(&[-1e30, 1e30, 0.0, f32::NAN], &[1.0; 4], o));
        assert_eq!(out[..3], [0.0, 0.0, 0.25]);
        assert!(out[3].is_nan());
    }

    #[test]
    fn relu_keeps_nan_and_passes_no_gradient_at_zero() {
        let x = [-1.0, 0.0, 2.0, f32::NAN, -0.0];
        let out = fresh(5, |o| relu(&x, o));
        assert_eq!(out[..3], [0.0, 0.0, 2.0]);
        assert!(out[3].is_nan());
        assert_eq!(out[4], 0.0);
        let out = fresh(5, |o| relu_grad(&x, &[5.0; 5], o));
        // PyTorch's threshold_backward: `x <= 0 ? 0 : g`, so NaN inputs pass the gradient.
        assert_eq!(out, [0.0, 0.0, 5.0, 5.0, 0.0]);
    }

    #[test]
    fn exp_and_erf_match_libm() {
        let mut worst_exp = 0f32;
        let mut worst_erf = 0f32;
        for i in -200_000..=200_000 {
            let x = i as f32 * 4e-4; // [-80, 80]
            let want = candle_core::cpu::erf::erf_f64(x as f64 / 8.0) as f32;
            worst_erf = worst_erf.max((erf(x / 8.0) - want).abs());
            let want = (x as f64).exp();
            worst_exp = worst_exp.max(((exp(x) as f64 - want) / want).abs() as f32);
        }
        assert!(worst_exp < 3e-7, "exp relative error {worst_exp}");
        assert!(worst_erf < 1e-6, "erf absolute error {worst_erf}");
        // Below the normal range: exactly zero, never a subnormal.
        assert_eq!(exp(-1e9), 0.0);
        assert_eq!(exp(-87.31), 0.0);
        assert!(exp(-87.3) >= f32::MIN_POSITIVE);
        let mut row = vec![0.0, -1e9, -1e9, 3.0];
        exp_shifted_sum(&mut row, 3.0);
        assert!(row.iter().all(|v| *v == 0.0 || v.is_normal()), "{row:?}");
        assert!(exp(1e4).is_finite());
    }

    #[test]
    fn dispatched_kernels_equal_the_scalar_definitions() {
        let x: Vec<f32> = (0..1001).map(|i| (i as f32 - 500.0) / 60.0).collect();
        let g: Vec<f32> = x.iter().map(|v| v.sin()).collect();
        let n = x.len();
        let (a, b) = (fresh(n, |o| gelu(&x, o)), fresh(n, |o| gelu_loop(&x, o)));
        for (p, q) in a.iter().zip(&b) {
            assert!((p - q).abs() <= 1e-6 * q.abs().max(1.0));
        }
        let a = fresh(n, |o| gelu_grad(&x, &g, o));
        let b = fresh(n, |o| gelu_grad_loop(&x, &g, o));
        for (p, q) in a.iter().zip(&b) {
            assert!((p - q).abs() <= 1e-6 * q.abs().max(1.0));
        }
        // The one-pass form equals GELU and its gradient (with g = 1).
        let (mut d, mut a) = (x.clone(), vec![0f32; n]);
        gelu_with_derivative(&mut d, &mut a);
        assert_eq!(a, fresh(n, |o| gelu_loop(&x, o)));
        assert_eq!(d, fresh(n, |o| gelu_grad_loop(&x, &vec![1.0; n], o)));
        let mut e = x.clone();
        let s = exp_shifted_sum(&mut e, 2.0);
        let want: f64 = x.iter().map(|v| ((v - 2.0) as f64).exp()).sum();
        assert!(((s as f64 - want) / want).abs() < 1e-5);
    }
}
