//! bf16 matrix products with f32 accumulation, for mixed-precision training.
//!
//! Both operands are rounded to bf16 (round to nearest even) and every product is summed in
//! f32, as PyTorch's autocast does on CPU. Two kernels compute the same thing:
//! - **AMX** (`tdpbf16ps`) where the CPU has AMX-TILE and AMX-BF16 and the kernel grants the
//!   tile state (`arch_prctl(ARCH_REQ_XCOMP_PERM)`, Linux 5.16+). One instruction multiplies
//!   a 16×32 by a 32×16 bf16 tile into a 16×16 f32 tile. Rust has no stable AMX intrinsics,
//!   so the four instructions used are written with `asm!`; no crate on crates.io offers an
//!   AMX GEMM, and Debian's OpenBLAS 0.3.21 is built without its `sbgemm`.
//! - **AVX512-BF16** (`vdpbf16ps`, e.g. AMD Zen 4/5) where AMX is absent: the same packed
//!   blocks, multiplied in zmm registers, one pair of bf16 products per f32 lane and
//!   instruction (`TRIDENT_BF16_DOT=off` refuses it).
//! - **Elsewhere** the rounded operands are widened back to f32 and multiplied by
//!   [`crate::blas::gemm`]: the same products (a product of two bf16 values is exact in f32),
//!   summed in another order, and no faster than f32.
//!
//! The layers call [`matmul`], which uses [`gemm`] only where it pays (AMX or AVX512-BF16):
//! on other CPUs mixed precision keeps f32 products and saves activations in bf16 (memory
//! only).
//! `TRIDENT_AMX=off` and `TRIDENT_BF16_DOT=off` refuse those kernels (for comparisons and tests).

use crate::blas::{self, Mat};
use half::bf16;
use rayon::prelude::*;
use std::cell::Cell;
use std::mem::MaybeUninit;
use std::sync::OnceLock;

thread_local! {
    static AUTOCAST: Cell<bool> = const { Cell::new(false) };
}

/// Mixed precision, like `torch.autocast(dtype=torch.bfloat16)`: while the returned guard
/// lives, the ops this thread creates run their matrix products in bf16 with f32
/// accumulation, and the fused transformer sublayers keep the activations they save for
/// the backward pass in bf16. Everything else stays f32: parameters and their gradients
/// (the master weights), layer norm, softmax, attention scores, losses, the optimizer. Each
/// op records the mode when it is created, so its backward pass (run later, outside the
/// guard) computes in the same precision. The policy per op is in `docs/ARCHITECTURE.md`
/// and tested in `tests/autocast.rs`.
pub fn autocast(on: bool) -> Autocast {
    Autocast {
        before: AUTOCAST.with(|a| a.replace(on)),
    }
}

/// Whether ops created on this thread now use bf16 (inside [`autocast`]`(true)`).
pub fn autocast_enabled() -> bool {
    AUTOCAST.with(Cell::get)
}

/// Restores the previous mode when dropped.
#[must_use = "autocast lasts only while the guard lives"]
pub struct Autocast {
    before: bool,
}

impl Drop for Autocast {
    fn drop(&mut self) {
        AUTOCAST.with(|a| a.set(self.before));
    }
}

/// Rounds to the nearest bf16, ties to even; NaN stays NaN.
#[inline]
pub fn round(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16;
    // Branch-free so that packing loops vectorise: NaN keeps its sign and becomes quiet.
    let nan = (b & 0x7fff_ffff) > 0x7f80_0000;
    (if nan { (b >> 16) | 0x40 } else { rounded }) as u16
}

/// Widens a bf16 bit pattern to f32 (exact).
#[inline]
pub fn widen(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// `src` rounded to bf16, in a new buffer written once (not zero-filled first: `vec![bf16::ZERO;
/// n]` is a `memset`, as bf16 is not a primitive the allocator can hand out zeroed).
pub fn rounded(src: &[f32]) -> Vec<bf16> {
    let mut out = Vec::<bf16>::with_capacity(src.len());
    let spare = &mut out.spare_capacity_mut()[..src.len()];
    // SAFETY: bf16 is a transparent u16, so MaybeUninit<bf16> is MaybeUninit<u16>.
    let dst = unsafe { std::slice::from_raw_parts_mut(spare.as_mut_ptr().cast(), spare.len()) };
    round_uninit(src, dst);
    // SAFETY: `round_uninit` wrote all `src.len()` elements.
    unsafe { out.set_len(src.len()) };
    out
}

/// `dst[i] = round(src[i])` for every `i` (same lengths), on rayon's threads.
fn round_uninit(src: &[f32], dst: &mut [MaybeUninit<u16>]) {
    dst.par_chunks_mut(1 << 14)
        .zip(src.par_chunks(1 << 14))
        .for_each(|(d, s)| simd::round_slice(s, d));
}

/// Vector forms of [`round`] on AVX512-BF16 (`vcvtneps2bf16`: the same rounding, except
/// that subnormal inputs, below 1.2e-38, become zero), scalar elsewhere.
mod simd {
    use super::round;
    use std::mem::MaybeUninit;

    #[cfg(target_arch = "x86_64")]
    pub(super) fn has_avx512_bf16() -> bool {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512bf16")
        })
    }

    /// `dst[i] = round(src[i])`, every element of `dst` written.
    pub(super) fn round_slice(src: &[f32], dst: &mut [MaybeUninit<u16>]) {
        assert_eq!(src.len(), dst.len());
        #[cfg(target_arch = "x86_64")]
        if has_avx512_bf16() {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { x86::round_slice(src, dst) };
        }
        round_vectorised(src, dst)
    }

    #[inline(always)]
    fn round_portable(src: &[f32], dst: &mut [MaybeUninit<u16>]) {
        dst.iter_mut().zip(src).for_each(|(d, &s)| {
            d.write(round(s));
        });
    }

    crate::math::dispatch!(
        /// The portable loop, compiled for AVX2 (8 lanes; the baseline build vectorises it
        /// 4 wide) where the CPU has it: where there is no AVX512-BF16 this rounding is all
        /// bf16 costs.
        round_vectorised, round_avx2, (src: &[f32], dst: &mut [MaybeUninit<u16>]) -> (), round_portable
    );

    /// `dst[i] = round(lo[i]) | round(hi[i]) << 16`: the pairs AMX's right operand holds.
    pub(super) fn pair_slices(lo: &[f32], hi: &[f32], dst: &mut [u32]) {
        assert!(lo.len() == dst.len() && hi.len() == dst.len());
        #[cfg(target_arch = "x86_64")]
        if has_avx512_bf16() {
            // SAFETY: as above.
            return unsafe { x86::pair_slices(lo, hi, dst) };
        }
        dst.iter_mut()
            .zip(lo.iter().zip(hi))
            .for_each(|(d, (&l, &h))| *d = round(l) as u32 | (round(h) as u32) << 16);
    }

    /// [`pair_slices`] for pair rows `0..pairs` of a whole 32-column panel (the rows of
    /// `data` `ld` apart, from column `c0`) into `dst`, the panel: strip `s` of pair row
    /// `i` at `(s · kp/2 + i) · 16`. Returns the pair rows written: all of them where the
    /// CPU has AVX512-BF16, else none.
    pub(super) fn pair_panel(
        data: &[f32],
        ld: usize,
        c0: usize,
        pairs: usize,
        kp: usize,
        dst: &mut [u32],
    ) -> usize {
        #[cfg(target_arch = "x86_64")]
        if has_avx512_bf16() && pairs > 0 {
            assert!(pairs <= kp / 2 && dst.len() >= kp * 16);
            assert!(data.len() >= (2 * pairs - 1) * ld + c0 + 32);
            // SAFETY: the features are there; every load and store lies inside the slices
            // (asserted above).
            unsafe { x86::pair_panel(data, ld, c0, pairs, kp, dst) };
            return pairs;
        }
        let _ = (data, ld, c0, pairs, kp, dst);
        0
    }

    #[cfg(target_arch = "x86_64")]
    pub(super) mod x86 {
        use std::arch::x86_64::*;
        use std::mem::MaybeUninit;

        /// Sixteen pairs of bf16 bits as words, `lo` in each word's low half: the pairs
        /// the packed right operand holds ([`super::super::amx`]).
        ///
        /// SAFETY: the CPU has AVX512F and AVX512BW.
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw")]
        pub(in crate::bf16) unsafe fn pair_words(lo: __m256i, hi: __m256i) -> __m512i {
            _mm512_or_si512(
                _mm512_cvtepu16_epi32(lo),
                _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(hi)),
            )
        }

        /// The first `n` (at most 16) of sixteen f32 from `lo` and from `hi`, rounded to
        /// bf16 and paired ([`pair_words`]) into `dst`; the lanes past `n` are neither read
        /// nor written.
        ///
        /// SAFETY: as `round_slice`; `n` values readable at `lo` and `hi`, writable at `dst`.
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
        unsafe fn pair16(lo: *const f32, hi: *const f32, dst: *mut u32, n: usize) {
            let mask = mask16(n);
            let l: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, lo)));
            let h: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, hi)));
            _mm512_mask_storeu_epi32(dst.cast(), mask, pair_words(l, h));
        }

        /// SAFETY: the CPU has AVX512F, AVX512BW and AVX512-BF16; equal lengths.
        #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
        pub(super) unsafe fn round_slice(src: &[f32], dst: &mut [MaybeUninit<u16>]) {
            assert_eq!(src.len(), dst.len());
            for i in (0..src.len()).step_by(32) {
                // The last 1–31 values through masks (short rows, as a convolution's
                // 14-wide ones, would otherwise be all tail).
                let left = (src.len() - i).min(32);
                let (lo_mask, hi_mask) = (mask16(left), mask16(left.saturating_sub(16)));
                let lo = _mm512_maskz_loadu_ps(lo_mask, src.as_ptr().add(i));
                let hi = _mm512_maskz_loadu_ps(hi_mask, src.as_ptr().add(i + 16));
                let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                let mask = (u32::from(hi_mask) << 16) | u32::from(lo_mask);
                _mm512_mask_storeu_epi16(dst.as_mut_ptr().add(i).cast(), mask, v);
            }
        }

        /// The first `n` of 16 lanes (`n` at most 16).
        #[inline]
        fn mask16(n: usize) -> __mmask16 {
            ((1u32 << n.min(16)) - 1) as __mmask16
        }

        /// SAFETY: as `round_slice`; the panel's rows and strips inside `data` and `dst`
        /// (checked by `super::pair_panel`).
        #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
        pub(super) unsafe fn pair_panel(
            data: &[f32],
            ld: usize,
            c0: usize,
            pairs: usize,
            kp: usize,
            dst: &mut [u32],
        ) {
            let src = data.as_ptr().add(c0);
            for i in 0..pairs {
                let (lo, hi) = (src.add(2 * i * ld), src.add((2 * i + 1) * ld));
                for s in 0..2 {
                    pair16(
                        lo.add(16 * s),
                        hi.add(16 * s),
                        dst.as_mut_ptr().add((s * (kp / 2) + i) * 16),
                        16,
                    );
                }
            }
        }

        /// SAFETY: as `round_slice`.
        #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
        pub(super) unsafe fn pair_slices(lo: &[f32], hi: &[f32], dst: &mut [u32]) {
            // The last 1–15 through the mask.
            for i in (0..dst.len()).step_by(16) {
                let n = (dst.len() - i).min(16);
                pair16(lo.as_ptr().add(i), hi.as_ptr().add(i), dst.as_mut_ptr().add(i), n);
            }
        }
    }
}

/// Widens `src` into `dst` (same length), on rayon's threads.
pub fn widen_into(src: &[bf16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "bf16::widen_into: lengths differ");
    dst.par_chunks_mut(1 << 14)
        .zip(src.par_chunks(1 << 14))
        .for_each(|(d, s)| d.iter_mut().zip(s).for_each(|(d, s)| *d = widen(s.to_bits())));
}

/// One operand of [`gemm`]: a row-major matrix of f32 (rounded to bf16 as it is read) or
/// of bf16, with leading dimension `ld`, used transposed when `trans`.
#[derive(Clone, Copy)]
pub enum Operand<'a> {
    /// f32 elements, rounded to bf16 when packed.
    F32(Mat<'a>),
    /// bf16 elements.
    Bf16 {
        /// The elements, row-major.
        data: &'a [bf16],
        /// Distance between the starts of consecutive stored rows.
        ld: usize,
        /// Use the stored matrix transposed.
        trans: bool,
    },
}

impl<'a> Operand<'a> {
    /// A contiguous bf16 `rows × cols` matrix, used as is.
    pub fn bf16(data: &'a [bf16], cols: usize) -> Self {
        Operand::Bf16 {
            data,
            ld: cols,
            trans: false,
        }
    }

    /// The same storage used transposed.
    pub fn t(self) -> Self {
        match self {
            Operand::F32(m) => Operand::F32(m.t()),
            Operand::Bf16 { data, ld, trans } => Operand::Bf16 {
                data,
                ld,
                trans: !trans,
            },
        }
    }

    fn trans(&self) -> bool {
        match self {
            Operand::F32(m) => m.trans,
            Operand::Bf16 { trans, .. } => *trans,
        }
    }

    /// Element (r, c) of op(self) as bf16 bits.
    #[inline]
    fn at(&self, r: usize, c: usize) -> u16 {
        match self {
            Operand::F32(m) => round(m.data[if m.trans { c * m.ld + r } else { r * m.ld + c }]),
            Operand::Bf16 { data, ld, trans } => data[if *trans { c * ld + r } else { r * ld + c }].to_bits(),
        }
    }

    /// Panics unless op(self) of `rows × cols` lies inside the storage.
    fn check(&self, rows: usize, cols: usize, what: &str) {
        let (len, ld, trans) = match self {
            Operand::F32(m) => (m.data.len(), m.ld, m.trans),
            Operand::Bf16 { data, ld, trans } => (data.len(), *ld, *trans),
        };
        let (r, c) = if trans { (cols, rows) } else { (rows, cols) };
        assert!(
            r == 0 || c == 0 || (c <= ld && len >= (r - 1) * ld + c),
            "bf16::gemm: {what} too short"
        );
    }
}

/// Which kernel [`gemm`] uses, for logs and reports.
pub fn backend() -> &'static str {
    match amx::kernel() {
        Some(amx::Kernel::Tiles) => "AMX bf16 tiles",
        Some(amx::Kernel::Dot) => "AVX512-BF16 dot products (vdpbf16ps)",
        None => "bf16 operands widened to f32 (no AMX, no AVX512-BF16)",
    }
}

/// What mixed precision ([`autocast`]) does on this CPU, for the start-up line of a run.
pub fn mixed_precision() -> &'static str {
    match amx::kernel() {
        Some(amx::Kernel::Tiles) => {
            "matrix products (linear layers, convolutions) in bf16 on AMX tiles with f32 sums; saved \
             transformer activations in bf16"
        }
        Some(amx::Kernel::Dot) => {
            "matrix products (linear layers, convolutions) in bf16 with AVX512-BF16 (vdpbf16ps) and \
             f32 sums; saved transformer activations in bf16"
        }
        None => {
            "no bf16 arithmetic (AMX, AVX512-BF16) on this CPU: matrix products stay f32, as fast as \
             f32 precision; saved transformer activations in bf16 (memory only)"
        }
    }
}

/// Whether bf16 products run on bf16 hardware here (AMX tiles, or AVX512-BF16's
/// `vdpbf16ps`), i.e. faster than f32: measured 2.1–2.5x on AMX and 1.7–1.8x with
/// `vdpbf16ps` on an AMD EPYC Zen 5, packing included (`examples/gemm_layouts.rs`).
pub fn accelerated() -> bool {
    amx::kernel().is_some()
}

/// Whether bf16 products run on AVX512-BF16's `vdpbf16ps` here (bf16 arithmetic without
/// AMX tiles, or with them turned off), which the direct convolutions
/// ([`crate::direct_conv`]) also use.
pub(crate) fn dot_products() -> bool {
    matches!(amx::kernel(), Some(amx::Kernel::Dot))
}

/// Whether this CPU has AVX512-BF16 (with AVX512F and BW), whichever kernel takes the bf16
/// products: what the direct convolutions' bf16 passes need.
pub(crate) fn avx512_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        simd::has_avx512_bf16()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `dst[i] = round(lo[i]) | round(hi[i]) << 16` (equal lengths): pairs of bf16 in words,
/// `lo`'s in the low half.
pub(crate) fn pair_into(lo: &[f32], hi: &[f32], dst: &mut [u32]) {
    simd::pair_slices(lo, hi, dst)
}

/// `c = op(a) · op(b) + beta · c` with both operands rounded to bf16 and f32 accumulation;
/// `c` is row-major `m × n`, `op(a)` is `m × k`, `op(b)` is `k × n`. `beta = 0` ignores what
/// `c` held.
#[allow(clippy::too_many_arguments)]
pub fn gemm(m: usize, n: usize, k: usize, a: Operand, b: Operand, beta: f32, c: &mut [f32]) {
    product(m, n, k, a, b, beta, c, false)
}

/// [`gemm`] on the calling thread alone (packing and products), for callers that already
/// run one product per task (a convolution's groups of images).
#[allow(clippy::too_many_arguments)]
pub fn gemm_serial(m: usize, n: usize, k: usize, a: Operand, b: Operand, beta: f32, c: &mut [f32]) {
    product(m, n, k, a, b, beta, c, true)
}

/// [`gemm`] and [`gemm_serial`]: on the calling thread alone with `serial`.
#[allow(clippy::too_many_arguments)]
fn product(m: usize, n: usize, k: usize, a: Operand, b: Operand, beta: f32, c: &mut [f32], serial: bool) {
    a.check(m, k, "lhs");
    b.check(k, n, "rhs");
    assert!(c.len() >= m * n, "bf16::gemm: output too short");
    // SAFETY: `c` holds m · n initialised values.
    if unsafe { nothing_to_multiply((m, n, k), beta, c.as_mut_ptr()) } {
        return;
    }
    // SAFETY: `c` holds m · n initialised values.
    unsafe { product_raw((m, n, k), a, b, beta, c.as_mut_ptr(), serial) }
}

/// [`product`] into `c` after its checks.
///
/// SAFETY: `c` points at `m · n` f32 no one else accesses, initialised unless `beta` is 0
/// (then nothing of it is read).
unsafe fn product_raw(
    (m, n, k): (usize, usize, usize),
    a: Operand,
    b: Operand,
    beta: f32,
    c: *mut f32,
    serial: bool,
) {
    match amx::kernel() {
        Some(kernel) => amx::gemm(kernel, m, n, k, a, b, beta, c, serial),
        None => widened((m, n, k), a, b, beta, c, serial),
    }
}

/// Whether a product of `m × k` by `k × n` has nothing to multiply (an extent of 0); for
/// `k = 0` it has written `c = beta · c` (the empty sums).
///
/// SAFETY: `c` points at `m · n` f32, initialised unless `beta` is 0.
unsafe fn nothing_to_multiply((m, n, k): (usize, usize, usize), beta: f32, c: *mut f32) -> bool {
    if m == 0 || n == 0 {
        return true;
    }
    if k == 0 {
        scale(c, m * n, beta);
        return true;
    }
    false
}

/// `c = beta · c` for an empty product: zeros with `beta = 0` (nothing read).
///
/// SAFETY: `c` points at `len` f32, initialised unless `beta` is 0.
unsafe fn scale(c: *mut f32, len: usize, beta: f32) {
    for i in 0..len {
        let v = c.add(i);
        v.write(if beta == 0.0 { 0.0 } else { v.read() * beta });
    }
}

/// A left operand packed once for several bf16 products ([`Lhs::times`]): a convolution's
/// weight, multiplied by each group of images' patches.
pub struct Lhs(amx::PackedLhs);

impl Lhs {
    /// op(a) `m × k` rounded and packed on the calling thread, or `None` on a CPU without
    /// bf16 kernels ([`accelerated`]), where there is nothing to pack for.
    pub fn pack(m: usize, k: usize, a: Operand) -> Option<Lhs> {
        a.check(m, k, "lhs");
        amx::kernel().map(|_| Lhs(amx::pack(a, m, k)))
    }

    /// `c = op(a) · op(b) + beta · c` on the calling thread, `c` row-major `m × n`.
    pub fn times(&self, n: usize, b: Operand, beta: f32, c: &mut [f32]) {
        assert!(c.len() >= self.0.m * n, "bf16::Lhs::times: output too short");
        // SAFETY: `c` holds m · n initialised values.
        unsafe { self.times_raw(n, b, beta, c.as_mut_ptr()) }
    }

    /// [`Self::times`] with `beta = 0` into memory not yet written: every one of the
    /// `m × n` values is written, none is read.
    pub fn times_into(&self, n: usize, b: Operand, c: &mut [MaybeUninit<f32>]) {
        assert!(c.len() >= self.0.m * n, "bf16::Lhs::times: output too short");
        // SAFETY: `c` has room for m · n values; with beta = 0 none is read.
        unsafe { self.times_raw(n, b, 0.0, c.as_mut_ptr().cast()) }
    }

    /// `c = op(a) · b` for `b` given by its `k` rows ([`Rows`]), on the calling thread,
    /// into memory not yet written (every one of the `m × n` values is written, none is
    /// read): `b`'s rows are packed as they are made.
    pub fn times_rows_into(&self, b: Rows, c: &mut [MaybeUninit<f32>]) {
        let (m, k, n) = (self.0.m, self.0.k, b.cols);
        assert!(c.len() >= m * n, "bf16::Lhs::times_rows_into: output too short");
        assert_eq!(
            b.rows, k,
            "bf16::Lhs::times_rows_into: {} rows for a product {k} deep",
            b.rows
        );
        let c = c.as_mut_ptr().cast();
        // SAFETY: `c` has room for m · n values; with beta = 0 none is read.
        unsafe {
            if nothing_to_multiply((m, n, k), 0.0, c) {
                return;
            }
            let kernel = amx::kernel().expect("packed only where a bf16 kernel runs");
            amx::gemm_packed_rows(kernel, &self.0, b, c)
        }
    }

    /// SAFETY: `c` points at `m · n` f32, initialised unless `beta` is 0.
    unsafe fn times_raw(&self, n: usize, b: Operand, beta: f32, c: *mut f32) {
        let (m, k) = (self.0.m, self.0.k);
        b.check(k, n, "rhs");
        if nothing_to_multiply((m, n, k), beta, c) {
            return;
        }
        let kernel = amx::kernel().expect("packed only where a bf16 kernel runs");
        amx::gemm_packed(kernel, &self.0, n, b, beta, c)
    }
}

/// A `rows × cols` matrix that is not stored but made a row at a time: `fill(i, row)`
/// writes the `cols` values of row `i`, rounded to bf16 (their bits, as [`round`] gives).
/// A convolution's patches (one row per tap of its kernel, [`crate::ops`]) are given so, and unfolded straight into the packed bf16
/// operand a few rows at a time: unfolding them into an f32 matrix and packing that were
/// two passes over the largest operand of the product (the unfolded matrix, 1 MiB for a
/// GAN critic's group of images, is larger than the packed one, and both did not stay in
/// cache between the passes).
#[derive(Clone, Copy)]
pub struct Rows<'a> {
    /// The number of rows.
    pub rows: usize,
    /// The number of values per row.
    pub cols: usize,
    /// Writes row `i` (`cols` values, bf16 bits) into the slice given.
    pub fill: &'a (dyn Fn(usize, &mut [u16]) + Sync),
}

impl Rows<'_> {
    /// The whole matrix, row-major, widened (exactly) to f32 in a scratch buffer (for
    /// products that take stored operands).
    fn stored(&self) -> Vec<f32> {
        let mut m = crate::scratch::take(self.rows * self.cols);
        let mut row = vec![0u16; self.cols];
        if self.cols > 0 {
            for (i, r) in m.chunks_mut(self.cols).enumerate() {
                (self.fill)(i, &mut row);
                r.iter_mut().zip(&row).for_each(|(v, &b)| *v = widen(b));
            }
        }
        m
    }
}

/// `dst[i] = round(src[i])` as bf16 bits, equal lengths (vectorised where the CPU has
/// AVX512-BF16, whose rounding turns subnormal values, below 1.2e-38, into zero).
pub fn round_bits(src: &[f32], dst: &mut [u16]) {
    // SAFETY: overwriting initialised u16 through `MaybeUninit<u16>`.
    let dst = unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast(), dst.len()) };
    simd::round_slice(src, dst)
}

/// `c = op(a) · bᵀ + beta · c` on the calling thread, for op(a) `m × k` and `b` given by
/// its `n` rows of `k` values ([`Rows`]); `c` row-major `m × n`. It is computed as
/// `cᵀ = b · op(a)ᵀ`, so that `b`'s rows are packed as the left operand's (contiguous)
/// rows, and the output blocks are stored transposed (a convolution's weight gradient:
/// the output gradients times the patches, transposed).
pub fn gemm_serial_rows_t(m: usize, a: Operand, b: Rows, beta: f32, c: &mut [f32]) {
    let (n, k) = (b.rows, b.cols);
    a.check(m, k, "lhs");
    assert!(c.len() >= m * n, "bf16::gemm: output too short");
    // SAFETY: `c` holds m · n initialised values.
    if unsafe { nothing_to_multiply((m, n, k), beta, c.as_mut_ptr()) } {
        return;
    }
    match amx::kernel() {
        Some(kernel) => amx::gemm_rows_t(kernel, m, a, b, beta, c),
        None => {
            let stored = b.stored();
            // SAFETY: `c` holds m · n initialised values.
            unsafe {
                widened(
                    (m, n, k),
                    a,
                    Operand::F32(Mat::new(&stored, k).t()),
                    beta,
                    c.as_mut_ptr(),
                    true,
                )
            };
            crate::scratch::give(stored);
        }
    }
}

/// `c = op(a) · op(b) + beta · c` in the layer's precision. With `bf16` on a CPU whose
/// bf16 products are faster than f32 ([`accelerated`]: AMX, AVX512-BF16) both operands are rounded and
/// multiplied by [`gemm`]. Everywhere else the products are f32 ([`blas::gemm`]): an
/// operand stored in bf16 (a saved activation) is widened, exactly, and the other is used
/// as it is. Rounding both operands there would cost a pass over each and buy nothing (the
/// f32 GEMM does the work either way), so mixed precision on such a CPU saves activation
/// memory and is as fast as f32, not slower.
#[allow(clippy::too_many_arguments)]
pub fn matmul(bf16: bool, m: usize, n: usize, k: usize, a: Operand, b: Operand, beta: f32, c: &mut [f32]) {
    assert!(c.len() >= m * n, "bf16::matmul: output too short");
    // SAFETY: `c` holds m · n initialised values.
    unsafe { matmul_raw(bf16, (m, n, k), a, b, beta, c.as_mut_ptr()) }
}

/// [`matmul`] with `beta = 0` into memory not yet written: every one of the `m × n`
/// values is written, none is read (a linear layer's new gradients, not zero-filled
/// first).
#[allow(clippy::too_many_arguments)]
pub fn matmul_into(
    bf16: bool,
    m: usize,
    n: usize,
    k: usize,
    a: Operand,
    b: Operand,
    c: &mut [MaybeUninit<f32>],
) {
    assert!(c.len() >= m * n, "bf16::matmul_into: output too short");
    // SAFETY: `c` has room for m · n values; with beta = 0 none is read.
    unsafe { matmul_raw(bf16, (m, n, k), a, b, 0.0, c.as_mut_ptr().cast()) }
}

/// [`matmul`] into `c`.
///
/// SAFETY: `c` points at `m · n` f32 no one else accesses, initialised unless `beta` is 0.
unsafe fn matmul_raw(
    bf16: bool,
    (m, n, k): (usize, usize, usize),
    a: Operand,
    b: Operand,
    beta: f32,
    c: *mut f32,
) {
    if k >= MIN_BF16_DEPTH {
        crate::trace::count_bf16_ready(2 * (m * n * k) as u64);
    }
    a.check(m, k, "lhs");
    b.check(k, n, "rhs");
    if bf16 && bf16_products(k) {
        if !nothing_to_multiply((m, n, k), beta, c) {
            product_raw((m, n, k), a, b, beta, c, false);
        }
        return;
    }
    let (a, b) = (AsF32::new(a), AsF32::new(b));
    blas::gemm_raw(m, n, k, 1.0, a.mat(), b.mat(), beta, c);
}

/// An operand as an f32 matrix: an f32 one as it is, a bf16 one widened (exactly) into a
/// scratch buffer that goes back to the pool when this is dropped.
struct AsF32<'a> {
    op: Operand<'a>,
    widened: Vec<f32>,
}

impl<'a> AsF32<'a> {
    fn new(op: Operand<'a>) -> Self {
        let widened = match op {
            Operand::F32(_) => Vec::new(),
            Operand::Bf16 { data, .. } => {
                let mut w = crate::scratch::take(data.len());
                widen_into(data, &mut w);
                w
            }
        };
        AsF32 { op, widened }
    }

    fn mat(&self) -> Mat<'_> {
        match self.op {
            Operand::F32(m) => m,
            Operand::Bf16 { ld, trans, .. } => Mat {
                data: &self.widened,
                ld,
                trans,
            },
        }
    }
}

impl Drop for AsF32<'_> {
    fn drop(&mut self) {
        if self.widened.capacity() > 0 {
            crate::scratch::give(std::mem::take(&mut self.widened));
        }
    }
}

/// The shortest inner dimension [`matmul`] multiplies in bf16. Short products are where
/// rounding and packing both operands weigh most against the faster products; the value
/// is a choice, not a measured optimum: the Fashion ViT (width 64, products of depth 64
/// and 128) was level with f32 either way (38 against 37 ms without the threshold, 40
/// against 39 with it, AMD EPYC Zen 5), and MiniLM's products (depth ≥ 384) are above it.
pub const MIN_BF16_DEPTH: usize = 256;

/// Whether [`matmul`] with `bf16` runs a product of inner dimension `k` in bf16 here
/// (else in f32): on bf16 hardware, from [`MIN_BF16_DEPTH`] on.
pub fn bf16_products(k: usize) -> bool {
    accelerated() && k >= MIN_BF16_DEPTH
}

/// The portable path: round both operands to bf16, widen them back and run the f32 GEMM
/// (on the calling thread alone with `serial`).
///
/// SAFETY: as [`product_raw`]'s.
unsafe fn widened(
    (m, n, k): (usize, usize, usize),
    a: Operand,
    b: Operand,
    beta: f32,
    c: *mut f32,
    serial: bool,
) {
    let mut wa = vec![0f32; m * k];
    let row_a = |(i, row): (usize, &mut [f32])| {
        row.iter_mut()
            .enumerate()
            .for_each(|(p, v)| *v = widen(a.at(i, p)))
    };
    let mut wb = vec![0f32; k * n];
    let row_b = |(p, row): (usize, &mut [f32])| {
        row.iter_mut()
            .enumerate()
            .for_each(|(j, v)| *v = widen(b.at(p, j)))
    };
    if serial {
        wa.chunks_mut(k).enumerate().for_each(row_a);
        wb.chunks_mut(n).enumerate().for_each(row_b);
    } else {
        wa.par_chunks_mut(k).enumerate().for_each(row_a);
        wb.par_chunks_mut(n).enumerate().for_each(row_b);
    }
    let (wa, wb) = (Mat::new(&wa, k), Mat::new(&wb, n));
    // SAFETY: the caller's promise on `c`; the widened operands hold m × k and k × n.
    unsafe {
        match serial {
            true => blas::gemm_serial_raw(m, n, k, 1.0, wa, wb, beta, c, n),
            false => blas::gemm_raw(m, n, k, 1.0, wa, wb, beta, c),
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod amx {
    //! The AMX kernel. Operands are packed into zero-padded bf16 buffers, tile by tile,
    //! so that every tile a kernel loads is 1 KiB of contiguous memory (64-byte rows, one
    //! cache line each): the left one in strips of 16 rows, each strip a run of `Kp/32`
    //! tiles of 16 rows × 32 values (`[Mp/16][Kp/32][16][32]`); the right one in strips of
    //! 16 columns laid out as AMX wants, each a run of `Kp/2` rows holding the pairs of
    //! consecutive k for 16 columns (`[Np/16][Kp/2][16][2]`). Each task computes 32×32
    //! blocks of the output (two strips by two strips) in four accumulator tiles. Against
    //! row-major operands (tile rows a whole operand row apart) the contiguous tiles ran
    //! the tile loop at 1,417–1,690 GFLOP/s on one core against 492–1,435 (Intel Xeon
    //! with AMX, six interleaved runs).
    use super::{OnceLock, Operand};
    use rayon::prelude::*;
    use std::arch::asm;

    /// Block edge: two 16-row tiles by two 16-column tiles.
    const B: usize = 32;

    static USABLE: OnceLock<bool> = OnceLock::new();

    fn usable() -> bool {
        *USABLE.get_or_init(|| {
            if std::env::var("TRIDENT_AMX").is_ok_and(|v| v.eq_ignore_ascii_case("off")) {
                return false;
            }
            // CPUID.(EAX=7,ECX=0):EDX bit 24 AMX-TILE, bit 22 AMX-BF16.
            // SAFETY: CPUID leaf 7 exists on every x86-64 CPU that runs this binary
            // (leaf 0 reports the highest leaf; checked first).
            #[allow(unused_unsafe)] // `__cpuid` is safe to call from Rust 1.87 on.
            let leaf7 = unsafe {
                if std::arch::x86_64::__cpuid(0).eax < 7 {
                    return false;
                }
                std::arch::x86_64::__cpuid_count(7, 0)
            };
            if leaf7.edx & (1 << 24) == 0 || leaf7.edx & (1 << 22) == 0 {
                return false;
            }
            request_tile_state()
        })
    }

    /// Asks Linux for permission to use the AMX tile data state (process-wide).
    fn request_tile_state() -> bool {
        #[cfg(target_os = "linux")]
        {
            const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
            const XFEATURE_XTILEDATA: libc::c_long = 18;
            // SAFETY: arch_prctl with these arguments only changes the process's permitted
            // extended state; it returns -1 where the kernel does not know the request.
            unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
        }
        #[cfg(not(target_os = "linux"))]
        {
            false
        }
    }

    /// The tile configuration: palette 1, eight tiles of 16 rows × 64 bytes.
    #[repr(C, align(64))]
    struct TileConfig {
        palette: u8,
        start_row: u8,
        reserved: [u8; 14],
        colsb: [u16; 16],
        rows: [u8; 16],
    }

    const CONFIG: TileConfig = {
        let mut c = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        let mut t = 0;
        while t < 8 {
            c.colsb[t] = 64;
            c.rows[t] = 16;
            t += 1;
        }
        c
    };

    fn round_up(x: usize) -> usize {
        x.div_ceil(B) * B
    }

    /// A packing buffer whose first value sits on a 64-byte boundary, so that every row a
    /// tile (or a zmm register) loads is one whole cache line. From the allocator a large
    /// buffer starts 16 bytes past a page, and each 64-byte row then straddles two lines:
    /// AMX's `tileloadd` ran 7x slower (22 against 3.2 ns) and the 2 × 2-tile loop 2.7x
    /// slower (543 against 1,454 GFLOP/s on one core, Intel Xeon with AMX) on such rows.
    /// The storage is a recycled f32 buffer ([`crate::scratch`]), so its contents are
    /// unspecified: the packing writes every value, padding included.
    struct Aligned<T> {
        buf: Vec<f32>,
        start: usize,
        len: usize,
        _of: std::marker::PhantomData<T>,
    }

    impl<T: Copy> Aligned<T> {
        /// `len` values of `T` (`u16` or `u32`), contents unspecified.
        fn unfilled(len: usize) -> Self {
            const { assert!(std::mem::align_of::<T>() <= 4 && std::mem::size_of::<T>() <= 4) };
            let floats = (len * std::mem::size_of::<T>()).div_ceil(4);
            let buf = crate::scratch::take(floats + 16);
            let start = buf.as_ptr().align_offset(64);
            Aligned {
                buf,
                start,
                len,
                _of: std::marker::PhantomData,
            }
        }
    }

    impl<T> std::ops::Deref for Aligned<T> {
        type Target = [T];
        fn deref(&self) -> &[T] {
            // SAFETY: `unfilled` sized `buf` to hold `len` values of T (at most 4 bytes,
            // alignment at most 4) from `start`; any bit pattern is a valid u16 or u32.
            unsafe { std::slice::from_raw_parts(self.buf.as_ptr().add(self.start).cast(), self.len) }
        }
    }

    impl<T> std::ops::DerefMut for Aligned<T> {
        fn deref_mut(&mut self) -> &mut [T] {
            // SAFETY: as in `deref`, and `&mut self` makes the view unique.
            unsafe { std::slice::from_raw_parts_mut(self.buf.as_mut_ptr().add(self.start).cast(), self.len) }
        }
    }

    impl<T> Drop for Aligned<T> {
        fn drop(&mut self) {
            crate::scratch::give(std::mem::take(&mut self.buf));
        }
    }

    /// Tile rows and strips: a strip is 16 rows (or 16 columns), a tile 16 × 32 values.
    const STRIP: usize = 16;

    /// A 32 × 32 f32 block on a 64-byte boundary (the tiles are stored into it).
    #[repr(C, align(64))]
    struct Block([f32; B * B]);

    /// An element type operands are packed from.
    trait Elem: Copy + Sync {
        fn bits(self) -> u16;
        /// `dst[i] = src[i].bits()`.
        fn bits_slice(src: &[Self], dst: &mut [u16]) {
            dst.iter_mut().zip(src).for_each(|(d, s)| *d = s.bits());
        }
        /// `dst[i] = lo[i].bits() | hi[i].bits() << 16`.
        fn pair_slices(lo: &[Self], hi: &[Self], dst: &mut [u32]) {
            dst.iter_mut()
                .zip(lo.iter().zip(hi))
                .for_each(|(d, (l, h))| *d = l.bits() as u32 | (h.bits() as u32) << 16);
        }
        /// Pair rows `0..pairs` of the 32-column panel at column `c0` of `data` (rows `ld`
        /// apart) into `dst` (the panel, [`pack_rhs`]'s layout), where a vector path does
        /// it: returns how many pair rows it wrote (0: none, the caller does them).
        fn pair_panel(_: &[Self], _: usize, _: usize, _: usize, _: usize, _: &mut [u32]) -> usize {
            0
        }
    }
    impl Elem for f32 {
        #[inline(always)]
        fn bits(self) -> u16 {
            super::round(self)
        }
        fn bits_slice(src: &[f32], dst: &mut [u16]) {
            super::round_bits(src, dst)
        }
        fn pair_slices(lo: &[f32], hi: &[f32], dst: &mut [u32]) {
            super::simd::pair_slices(lo, hi, dst)
        }
        fn pair_panel(data: &[f32], ld: usize, c0: usize, pairs: usize, kp: usize, dst: &mut [u32]) -> usize {
            super::simd::pair_panel(data, ld, c0, pairs, kp, dst)
        }
    }
    impl Elem for half::bf16 {
        #[inline(always)]
        fn bits(self) -> u16 {
            self.to_bits()
        }
    }

    /// op(a) `m × k` into strips of tiles, `[mp/16][kp/32][16][32]` bf16, zero-padded.
    fn pack_lhs(a: &Operand, m: usize, k: usize, mp: usize, kp: usize, serial: bool) -> Aligned<u16> {
        match *a {
            Operand::F32(x) => pack_lhs_from(x.data, x.ld, x.trans, m, k, mp, kp, serial),
            Operand::Bf16 { data, ld, trans } => pack_lhs_from(data, ld, trans, m, k, mp, kp, serial),
        }
    }

    /// `f(i, chunk i)` for the `size`-value chunks of `out`, in parallel unless `serial`.
    fn chunks<T: Send>(out: &mut [T], size: usize, serial: bool, f: impl Fn(usize, &mut [T]) + Sync + Send) {
        if serial {
            out.chunks_mut(size).enumerate().for_each(|(i, c)| f(i, c));
        } else {
            out.par_chunks_mut(size).enumerate().for_each(|(i, c)| f(i, c));
        }
    }

    /// Where value `p` of row `r` (of a 32-row block) lies in the block's two strips.
    #[inline(always)]
    fn lhs_at(r: usize, p: usize, kp: usize) -> usize {
        (r / STRIP) * STRIP * kp + (p / B) * STRIP * B + (r % STRIP) * B + p % B
    }

    #[allow(clippy::too_many_arguments)]
    fn pack_lhs_from<E: Elem>(
        data: &[E],
        ld: usize,
        trans: bool,
        m: usize,
        k: usize,
        mp: usize,
        kp: usize,
        serial: bool,
    ) -> Aligned<u16> {
        let mut out = Aligned::unfilled(mp * kp);
        chunks(&mut out, B * kp, serial, |bi, dst| {
            let r0 = bi * B;
            let rows = m.saturating_sub(r0).min(B);
            // The padding (the values are written below): rows past m, and each row's
            // values past k, which lie in its last 32 (kp − k < 32). Zeroing the whole
            // block was a second pass over it for every product not a multiple of 32 deep
            // (a convolution's weight gradient, 245 images' positions deep).
            for r in rows..B {
                (0..kp)
                    .step_by(B)
                    .for_each(|p| dst[lhs_at(r, p, kp)..][..B].fill(0));
            }
            if k < kp {
                (0..rows).for_each(|r| dst[lhs_at(r, k, kp)..][..kp - k].fill(0));
            }
            if trans {
                // op(a) row r is stored column r: transpose 32 × 32 squares through a
                // local block, reading and writing 32 contiguous values at a time.
                let mut sq = [[0u16; B]; B];
                for p0 in (0..k).step_by(B) {
                    let ps = (k - p0).min(B);
                    for (dp, line) in sq.iter_mut().enumerate().take(ps) {
                        let src = &data[(p0 + dp) * ld + r0..][..rows];
                        E::bits_slice(src, &mut line[..rows]);
                    }
                    for r in 0..rows {
                        let line = &mut dst[lhs_at(r, p0, kp)..][..ps];
                        line.iter_mut().enumerate().for_each(|(dp, d)| *d = sq[dp][r]);
                    }
                }
            } else {
                for r in 0..rows {
                    let src = &data[(r0 + r) * ld..][..k];
                    for (t, part) in src.chunks(B).enumerate() {
                        E::bits_slice(part, &mut dst[lhs_at(r, t * B, kp)..][..part.len()]);
                    }
                }
            }
        });
        out
    }

    /// op(b) `k × n` into panels of 32 columns, each two strips of 16 columns,
    /// `[np/16][kp/2][16]` pairs of bf16 (the values at k = 2i and 2i + 1 of one column in
    /// one 32-bit word, low half first).
    fn pack_rhs(b: &Operand, k: usize, n: usize, kp: usize, np: usize, serial: bool) -> Aligned<u32> {
        match *b {
            Operand::F32(x) => pack_rhs_from(x.data, x.ld, x.trans, k, n, kp, np, serial),
            Operand::Bf16 { data, ld, trans } => pack_rhs_from(data, ld, trans, k, n, kp, np, serial),
        }
    }

    /// Where pair row `i` of column `j` (of a 32-column panel) lies in the panel.
    #[inline(always)]
    fn rhs_at(i: usize, j: usize, kp: usize) -> usize {
        (j / STRIP) * (kp / 2) * STRIP + i * STRIP + j % STRIP
    }

    #[allow(clippy::too_many_arguments)]
    fn pack_rhs_from<E: Elem>(
        data: &[E],
        ld: usize,
        trans: bool,
        k: usize,
        n: usize,
        kp: usize,
        np: usize,
        serial: bool,
    ) -> Aligned<u32> {
        let panel = kp / 2 * B;
        let mut out = Aligned::unfilled(np / B * panel);
        let pair = |lo: u16, hi: u16| lo as u32 | (hi as u32) << 16;
        chunks(&mut out, panel, serial, |pi, dst| {
            let c0 = pi * B;
            let cols = n.saturating_sub(c0).min(B);
            if cols < B || k < kp {
                dst.fill(0); // the padding; the values are written below
            }
            if trans {
                // Stored transposed: column j of op(b) is contiguous. Rounded as a run, then
                // scattered a pair at a time.
                let mut line = vec![0u16; k.next_multiple_of(2)];
                for jj in 0..cols {
                    E::bits_slice(&data[(c0 + jj) * ld..][..k], &mut line[..k]);
                    for (i, two) in line.chunks_exact(2).enumerate() {
                        dst[rhs_at(i, jj, kp)] = pair(two[0], two[1]);
                    }
                }
            } else {
                // A whole panel's pairs of f32 rows in one vectorised pass where the CPU
                // has AVX512-BF16 (a call per 16 values was 5 % of a bf16 MiniLM step).
                let done = if cols == B {
                    E::pair_panel(data, ld, c0, k / 2, kp, dst)
                } else {
                    0
                };
                for i in done..k.div_ceil(2) {
                    for j0 in (0..cols).step_by(STRIP) {
                        let w = (cols - j0).min(STRIP);
                        let lo = &data[2 * i * ld + c0 + j0..][..w];
                        let line = &mut dst[rhs_at(i, j0, kp)..][..w];
                        if 2 * i + 1 < k {
                            E::pair_slices(lo, &data[(2 * i + 1) * ld + c0 + j0..][..w], line);
                        } else {
                            line.iter_mut().zip(lo).for_each(|(d, l)| *d = pair(l.bits(), 0));
                        }
                    }
                }
            }
        });
        out
    }

    use crate::blas::SharedOut as Out;

    /// Which instructions multiply the packed blocks.
    #[derive(Clone, Copy, PartialEq)]
    pub(super) enum Kernel {
        /// AMX tiles (`tdpbf16ps`).
        Tiles,
        /// AVX512-BF16 (`vdpbf16ps`) in zmm registers.
        Dot,
    }

    /// The kernel this CPU runs bf16 products on: AMX tiles where usable, else
    /// AVX512-BF16 (`TRIDENT_BF16_DOT=off` refuses it), else none.
    pub(super) fn kernel() -> Option<Kernel> {
        static KERNEL: OnceLock<Option<Kernel>> = OnceLock::new();
        *KERNEL.get_or_init(|| {
            if usable() {
                Some(Kernel::Tiles)
            } else if !std::env::var("TRIDENT_BF16_DOT").is_ok_and(|v| v.eq_ignore_ascii_case("off"))
                && super::simd::has_avx512_bf16()
            {
                Some(Kernel::Dot)
            } else {
                None
            }
        })
    }

    /// `c = op(a) · op(b) + beta · c` on `kernel`, on the calling thread alone with `serial`;
    /// the operands checked by the caller to hold op(a) `m × k` and op(b) `k × n`.
    ///
    /// SAFETY: `c` points at `m · n` f32 no one else accesses, initialised unless `beta`
    /// is 0 (then nothing of it is read).
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn gemm(
        kernel: Kernel,
        m: usize,
        n: usize,
        k: usize,
        a: Operand,
        b: Operand,
        beta: f32,
        c: *mut f32,
        serial: bool,
    ) {
        // A transposed operand packs slowly (a transpose on the left, a pair at a time on
        // the right). When one of the two is transposed, compute cᵀ = op(b)ᵀ · op(a)ᵀ
        // instead where that moves the transpose onto the smaller operand, and store the
        // blocks transposed: a transposed left operand larger than the right one (a weight
        // gradient's output gradient against its input), or a transposed right operand
        // larger than the left one by more pairs than the output has values, since the
        // transposed store writes them one at a time (a convolution's patches against its
        // output gradient, for its weight gradient; not a linear layer's weight against its
        // input, whose output is large).
        let transposed =
            (a.trans() && !b.trans() && n < m) || (!a.trans() && b.trans() && m < n && (n - m) * k > m * n);
        let (m, n, a, b) = if transposed {
            (n, m, b.t(), a.t())
        } else {
            (m, n, a, b)
        };
        let (mp, np, kp) = (round_up(m), round_up(n), round_up(k));
        let (pa, pb) = if serial {
            (pack_lhs(&a, m, k, mp, kp, true), pack_rhs(&b, k, n, kp, np, true))
        } else {
            rayon::join(
                || pack_lhs(&a, m, k, mp, kp, false),
                || pack_rhs(&b, k, n, kp, np, false),
            )
        };
        // SAFETY: the caller's promise on `c`.
        unsafe { multiply(kernel, (&pa, &pb), (m, n, k), beta, c, transposed, serial) }
    }

    /// op(a) `m × k` packed once for several products ([`gemm_packed`]).
    pub(super) struct PackedLhs {
        data: Aligned<u16>,
        pub(super) m: usize,
        pub(super) k: usize,
    }

    /// Packs op(a) `m × k` (checked by the caller) on the calling thread.
    pub(super) fn pack(a: Operand, m: usize, k: usize) -> PackedLhs {
        PackedLhs {
            data: pack_lhs(&a, m, k, round_up(m), round_up(k), true),
            m,
            k,
        }
    }

    /// [`gemm`] of a packed left operand, on the calling thread.
    ///
    /// SAFETY: as [`gemm`]'s, with op(b) `a.k × n` checked by the caller.
    pub(super) unsafe fn gemm_packed(
        kernel: Kernel,
        a: &PackedLhs,
        n: usize,
        b: Operand,
        beta: f32,
        c: *mut f32,
    ) {
        let (m, k) = (a.m, a.k);
        let (np, kp) = (round_up(n), round_up(k));
        let pb = pack_rhs(&b, k, n, kp, np, true);
        multiply(kernel, (&a.data, &pb), (m, n, k), beta, c, false, true)
    }

    /// [`gemm_packed`] with `beta = 0` and a right operand given by rows
    /// ([`super::Rows`]).
    ///
    /// SAFETY: `c` points at `a.m · n` f32 (written, not read), `b` `a.k × n` checked by
    /// the caller.
    pub(super) unsafe fn gemm_packed_rows(kernel: Kernel, a: &PackedLhs, b: super::Rows, c: *mut f32) {
        let (m, k, n) = (a.m, a.k, b.cols);
        let pb = pack_rhs_rows(&b, round_up(k), round_up(n));
        multiply(kernel, (&a.data, &pb), (m, n, k), 0.0, c, false, true)
    }

    /// `c = op(a) · bᵀ + beta · c` ([`super::gemm_serial_rows_t`]) on `kernel`, on the
    /// calling thread, as `cᵀ = b · op(a)ᵀ` stored transposed; checked by the caller.
    pub(super) fn gemm_rows_t(
        kernel: Kernel,
        m: usize,
        a: Operand,
        b: super::Rows,
        beta: f32,
        c: &mut [f32],
    ) {
        let (n, k) = (b.rows, b.cols);
        let (np, mp, kp) = (round_up(n), round_up(m), round_up(k));
        let pa = pack_lhs_rows(&b, np, kp);
        let pb = pack_rhs(&a.t(), k, m, kp, mp, true);
        // SAFETY: `c` holds the m · n initialised values (checked by the caller).
        unsafe { multiply(kernel, (&pa, &pb), (n, m, k), beta, c.as_mut_ptr(), true, true) }
    }

    /// The rows of `a` (`rows × cols`, the left operand `m × k`) packed as [`pack_lhs`]
    /// does, each row made into a scratch row and copied from there.
    fn pack_lhs_rows(a: &super::Rows, mp: usize, kp: usize) -> Aligned<u16> {
        let (m, k) = (a.rows, a.cols);
        let mut out = Aligned::unfilled(mp * kp);
        let mut row = vec![0u16; k];
        for (bi, dst) in out.chunks_mut(B * kp).enumerate() {
            let r0 = bi * B;
            let rows = m.saturating_sub(r0).min(B);
            for r in 0..rows {
                (a.fill)(r0 + r, &mut row);
                for (t, part) in row.chunks(B).enumerate() {
                    dst[lhs_at(r, t * B, kp)..][..part.len()].copy_from_slice(part);
                }
                if k < kp {
                    dst[lhs_at(r, k, kp)..][..kp - k].fill(0);
                }
            }
            for r in rows..B {
                (0..kp)
                    .step_by(B)
                    .for_each(|p| dst[lhs_at(r, p, kp)..][..B].fill(0));
            }
        }
        out
    }

    /// The rows of `b` (`k × n`, the right operand) packed as [`pack_rhs`] does, two rows
    /// at a time: each pair made into scratch rows and interleaved into every panel.
    fn pack_rhs_rows(b: &super::Rows, kp: usize, np: usize) -> Aligned<u32> {
        let (k, n) = (b.rows, b.cols);
        let panel = kp / 2 * B;
        let mut out = Aligned::unfilled(np / B * panel);
        // The pair's two rows, zero past n (the last panel's padding columns).
        let (mut lo, mut hi) = (vec![0u16; np], vec![0u16; np]);
        for i in 0..kp / 2 {
            if 2 * i < k {
                (b.fill)(2 * i, &mut lo[..n]);
                if 2 * i + 1 < k {
                    (b.fill)(2 * i + 1, &mut hi[..n]);
                } else {
                    hi.fill(0);
                }
            } else {
                lo.fill(0);
                hi.fill(0);
            }
            interleave(&lo, &hi, &mut out, i, kp);
        }
        out
    }

    /// Pair row `i` of every strip of 16 columns of a packed right operand (`[np/16][kp/2][16]`
    /// pairs, [`pack_rhs`]) from the pair's two rows `lo` and `hi` (`np` values each): the
    /// `lo` value in the low half of each word. With AVX-512 sixteen words at a time (the
    /// compiler left the loop scalar: 10 % of a bf16 convolution's forward pass).
    fn interleave(lo: &[u16], hi: &[u16], out: &mut [u32], i: usize, kp: usize) {
        let strips = lo.len().min(hi.len()) / STRIP;
        assert!(i < kp / 2 && out.len() >= strips * (kp / 2) * STRIP);
        if avx512() {
            // SAFETY: the CPU has the features; the strips lie inside the three slices
            // (asserted above).
            return unsafe { interleave_avx512(lo, hi, out, i, kp, strips) };
        }
        for s in 0..strips {
            let line = &mut out[(s * (kp / 2) + i) * STRIP..][..STRIP];
            let (l, h) = (&lo[s * STRIP..][..STRIP], &hi[s * STRIP..][..STRIP]);
            for j in 0..STRIP {
                line[j] = l[j] as u32 | (h[j] as u32) << 16;
            }
        }
    }

    /// SAFETY: AVX512F and AVX512BW; `lo` and `hi` hold `strips · 16` values, `out`
    /// `strips · kp/2 · 16`, `i < kp/2`.
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn interleave_avx512(lo: &[u16], hi: &[u16], out: &mut [u32], i: usize, kp: usize, strips: usize) {
        use std::arch::x86_64::*;
        for s in 0..strips {
            let l = _mm256_loadu_si256(lo.as_ptr().add(s * STRIP).cast());
            let h = _mm256_loadu_si256(hi.as_ptr().add(s * STRIP).cast());
            let v = super::simd::x86::pair_words(l, h);
            _mm512_storeu_si512(out.as_mut_ptr().add((s * (kp / 2) + i) * STRIP).cast(), v);
        }
    }

    /// The products of packed operands into `c` (`m × n`, or its transpose `n × m` when
    /// `transposed`), on the calling thread alone with `serial`.
    ///
    /// SAFETY: as [`gemm`]'s; `pa` and `pb` packed from op(a) `m × k` and op(b) `k × n`.
    unsafe fn multiply(
        kernel: Kernel,
        (pa, pb): (&[u16], &[u32]),
        (m, n, k): (usize, usize, usize),
        beta: f32,
        c: *mut f32,
        transposed: bool,
        serial: bool,
    ) {
        let (mp, np, kp) = (round_up(m), round_up(n), round_up(k));
        let (mblocks, nblocks) = (mp / B, np / B);
        // Contiguous ranges of row blocks per task (each task's rows of `a` stay in its
        // cache while it walks every panel of `b`), or of column panels when there are
        // fewer row blocks than threads.
        let threads = rayon::current_num_threads().max(1);
        let small = m * n * k < (1 << 20);
        let tasks = if small || serial { 1 } else { threads };
        let split_rows = mblocks >= tasks;
        let parts = if split_rows { mblocks } else { nblocks };
        let per = parts.div_ceil(tasks.min(parts));
        let out = Out(c);
        let task = move |t: usize| {
            let range = (t * per)..((t + 1) * per).min(parts);
            let (rows, cols) = if split_rows {
                (range, 0..nblocks)
            } else {
                (0..mblocks, range)
            };
            let mut acc = Block([0f32; B * B]);
            let acc = &mut acc.0;
            if kernel == Kernel::Dot {
                // SAFETY: the CPU has AVX512F and AVX512-BF16 (`kernel`); packed
                // buffers are padded to whole blocks, so every load reads inside them;
                // `store` writes only this task's blocks, inside `c`.
                unsafe {
                    for nb in cols {
                        let panel = pb.as_ptr().add(nb * kp / 2 * B);
                        for mb in rows.clone() {
                            let a = pa.as_ptr().add(mb * B * kp);
                            let (r0, c0) = (mb * B, nb * B);
                            if !transposed && r0 + B <= m && c0 + B <= n {
                                // A whole block of the output, written from the registers.
                                dot_block(a, kp, panel, (out.0.add(r0 * n + c0), n), beta);
                            } else {
                                dot_block(a, kp, panel, (acc.as_mut_ptr(), B), 0.0);
                                store(acc, out, r0, c0, m, n, beta, transposed);
                            }
                        }
                    }
                }
                return;
            }
            // SAFETY: AMX is usable (checked by the caller through `usable`, which also
            // obtained the tile permission); CONFIG describes the eight 16×64-byte tiles
            // `block` uses; packed buffers are padded to whole blocks, so every tile load
            // reads inside them; `store` writes only this task's blocks, inside `c`.
            unsafe {
                asm!("ldtilecfg [{}]", in(reg) &CONFIG as *const TileConfig, options(nostack, readonly));
                for nb in cols {
                    let panel = pb.as_ptr().add(nb * kp / 2 * B) as *const u16;
                    for mb in rows.clone() {
                        block(pa.as_ptr().add(mb * B * kp), kp, panel, acc.as_mut_ptr());
                        store(acc, out, mb * B, nb * B, m, n, beta, transposed);
                    }
                }
                asm!("tilerelease", options(nostack, nomem));
            }
        };
        if serial {
            (0..parts.div_ceil(per)).for_each(task);
        } else {
            (0..parts.div_ceil(per)).into_par_iter().for_each(task);
        }
    }

    /// One 32×32 output block: `acc = a[32, kp] · panel[kp, 32]`.
    ///
    /// SAFETY: tiles configured by CONFIG; `a` points at two strips of `16 · kp` bf16 and
    /// `panel` at two strips of `kp · 16` bf16 (`kp` a multiple of 32, packed as above),
    /// `acc` at 32 × 32 f32.
    #[inline(always)]
    unsafe fn block(a: *const u16, kp: usize, panel: *const u16, acc: *mut f32) {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem)
        );
        let (a1, b1) = (a.add(STRIP * kp), panel.add(STRIP * kp));
        let mut p = 0;
        while p < kp {
            // Tile p / 32 of each strip: 16 rows of 64 bytes, contiguous.
            let at = p * STRIP;
            asm!(
                "tileloadd tmm4, [{a0} + {s}*1]",
                "tileloadd tmm5, [{a1} + {s}*1]",
                "tileloadd tmm6, [{b0} + {s}*1]",
                "tileloadd tmm7, [{b1} + {s}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                a0 = in(reg) a.add(at),
                a1 = in(reg) a1.add(at),
                b0 = in(reg) panel.add(at),
                b1 = in(reg) b1.add(at),
                s = in(reg) 64usize,
                options(nostack, readonly)
            );
            p += B;
        }
        asm!(
            "tilestored [{c0} + {s}*1], tmm0",
            "tilestored [{c1} + {s}*1], tmm1",
            "tilestored [{c2} + {s}*1], tmm2",
            "tilestored [{c3} + {s}*1], tmm3",
            c0 = in(reg) acc,
            c1 = in(reg) acc.add(16),
            c2 = in(reg) acc.add(16 * B),
            c3 = in(reg) acc.add(16 * B + 16),
            s = in(reg) 4 * B,
            options(nostack)
        );
    }

    /// One 32×32 output block with AVX512-BF16: `c = a[32, kp] · panel[kp, 32] + beta · c`
    /// for `c` 32 rows of 32 values `ldc` apart, eight rows at a time in 16 zmm
    /// accumulators. Each step broadcasts one row's pair of bf16 (k = 2p, 2p + 1) and
    /// multiplies it by the panel's pairs for 32 columns: `vdpbf16ps` adds both products
    /// into each f32 lane, as `tdpbf16ps` does per tile row. With `beta = 0` nothing of `c`
    /// is read. (Written straight into the output, not through a block on the stack and a
    /// copy, which for a product only 64 or 128 deep, as a convolution's input gradient,
    /// is a 4 KiB store and copy per 32 × 32 × 128 multiply-adds; `gemm_layouts`' bf16
    /// products ran 3.42 / 3.56 / 4.83 ms against 3.80 / 3.78 / 4.97, fastest of three.)
    ///
    /// SAFETY: the CPU has AVX512F and AVX512-BF16; `a` and `panel` point at a block and a
    /// panel packed as above (`kp` a multiple of 32), `c` at 32 rows of 32 f32 `ldc` apart,
    /// initialised unless `beta` is 0.
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn dot_block(
        a: *const u16,
        kp: usize,
        panel: *const u32,
        (out, ldc): (*mut f32, usize),
        beta: f32,
    ) {
        use std::arch::x86_64::*;
        let panel1 = panel.add(kp / 2 * STRIP);
        for r0 in (0..B).step_by(8) {
            let mut c = [[_mm512_setzero_ps(); 2]; 8];
            for p in 0..kp / 2 {
                let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(panel.add(p * STRIP).cast()));
                let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(panel1.add(p * STRIP).cast()));
                for (r, c) in c.iter_mut().enumerate() {
                    let pair = a.add(lhs_at(r0 + r, 2 * p, kp)).cast::<i32>().read_unaligned();
                    let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                    c[0] = _mm512_dpbf16_ps(c[0], av, b0);
                    c[1] = _mm512_dpbf16_ps(c[1], av, b1);
                }
            }
            for (r, c) in c.iter().enumerate() {
                let row = out.add((r0 + r) * ldc);
                if beta == 0.0 {
                    _mm512_storeu_ps(row, c[0]);
                    _mm512_storeu_ps(row.add(16), c[1]);
                } else {
                    let b = _mm512_set1_ps(beta);
                    _mm512_storeu_ps(row, _mm512_fmadd_ps(b, _mm512_loadu_ps(row), c[0]));
                    _mm512_storeu_ps(
                        row.add(16),
                        _mm512_fmadd_ps(b, _mm512_loadu_ps(row.add(16)), c[1]),
                    );
                }
            }
        }
    }

    /// Writes the valid part of a 32×32 block at (r0, c0) into the `m × n` output, or at
    /// (c0, r0) into its `n × m` transpose.
    ///
    /// SAFETY: `out` points at `m · n` f32 and no other task writes this block.
    #[allow(clippy::too_many_arguments)]
    unsafe fn store(
        acc: &[f32; B * B],
        out: Out,
        r0: usize,
        c0: usize,
        m: usize,
        n: usize,
        beta: f32,
        transposed: bool,
    ) {
        let (rows, cols) = ((m - r0).min(B), (n - c0).min(B));
        // Through raw pointers: with beta = 0 the output may be memory not yet written.
        if transposed && rows == B && cols == B && avx512() {
            return store_transposed(acc, out.0.add(c0 * m + r0), m, beta);
        }
        if transposed {
            for c in 0..cols {
                let dst = out.0.add((c0 + c) * m + r0);
                for r in 0..rows {
                    let (s, d) = (acc[r * B + c], dst.add(r));
                    d.write(if beta == 0.0 { s } else { s + beta * d.read() });
                }
            }
            return;
        }
        for r in 0..rows {
            let dst = out.0.add((r0 + r) * n + c0);
            let src = &acc[r * B..r * B + cols];
            if beta == 0.0 && cols == B {
                // A whole row as one 128-byte value: two vector stores, where the copy of
                // a length known only at run time was a call to memcpy per row (2 % of a
                // bf16 DCGAN epoch's samples).
                dst.cast::<[f32; B]>()
                    .write_unaligned(src.as_ptr().cast::<[f32; B]>().read());
            } else if beta == 0.0 {
                for (j, &s) in src.iter().enumerate() {
                    dst.add(j).write(s);
                }
            } else {
                // With beta ≠ 0 the output holds values: as a slice, so the loop is vectorised.
                let dst = std::slice::from_raw_parts_mut(dst, cols);
                dst.iter_mut().zip(src).for_each(|(d, s)| *d = s + beta * *d);
            }
        }
    }
    /// Whether the CPU has AVX512F (and BW): the vector forms of the packing and of the
    /// transposed store.
    fn avx512() -> bool {
        static AVX512: OnceLock<bool> = OnceLock::new();
        *AVX512.get_or_init(|| is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw"))
    }

    /// A whole 32 × 32 block written transposed: `dst[c · ldd + r] = acc[r][c] + beta ·
    /// dst[…]`, as four 16 × 16 transposes in registers. (A value at a time, 32 values
    /// apart, it was 3 % of a bf16 WGAN epoch: the weight gradient of a convolution is
    /// computed transposed, [`gemm_rows_t`].)
    ///
    /// SAFETY: AVX512F; `dst` points at 32 rows of 32 f32 `ldd` apart, initialised
    /// unless `beta` is 0, that no other task writes.
    #[target_feature(enable = "avx512f")]
    unsafe fn store_transposed(acc: &[f32; B * B], dst: *mut f32, ldd: usize, beta: f32) {
        use std::arch::x86_64::*;
        for rb in [0, 16] {
            for cb in [0, 16] {
                let r: [__m512; 16] =
                    std::array::from_fn(|i| _mm512_loadu_ps(acc.as_ptr().add((rb + i) * B + cb)));
                for (c, col) in super::transpose16(&r).into_iter().enumerate() {
                    let d = dst.add((cb + c) * ldd + rb);
                    let v = if beta == 0.0 {
                        col
                    } else {
                        _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_loadu_ps(d), col)
                    };
                    _mm512_storeu_ps(d, v);
                }
            }
        }
    }
}

/// A 16 × 16 block of f32 transposed in AVX-512 registers: `r[i]` holds row `i`, the
/// result's `[c]` column `c` (lane `i` of it, row `i`'s value). Shared by the bf16
/// kernels' transposed store and the direct convolutions' re-laying of gradients.
///
/// # Safety
/// The CPU has AVX512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn transpose16(r: &[std::arch::x86_64::__m512; 16]) -> [std::arch::x86_64::__m512; 16] {
    use std::arch::x86_64::*;
    // Pairs of rows interleaved by 32 bits, then by 64: u[4g + q], lane L, holds rows
    // 4g..4g + 4 of column 4L + q.
    let t: [__m512; 16] = std::array::from_fn(|i| {
        let (a, b) = (r[i & !1], r[i | 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_ps(a, b)
        } else {
            _mm512_unpackhi_ps(a, b)
        }
    });
    let u: [__m512; 16] = std::array::from_fn(|i| {
        let (g, q) = (i / 4, i % 4);
        let (a, b) = (
            _mm512_castps_pd(t[4 * g + q / 2]),
            _mm512_castps_pd(t[4 * g + 2 + q / 2]),
        );
        _mm512_castpd_ps(if q % 2 == 0 {
            _mm512_unpacklo_pd(a, b)
        } else {
            _mm512_unpackhi_pd(a, b)
        })
    });
    let mut cols = [_mm512_setzero_ps(); 16];
    for q in 0..4 {
        // Lanes 0, 1 (v, x) and 2, 3 (w, y) of the four row groups, then each column's
        // four lanes gathered.
        let v = _mm512_shuffle_f32x4::<0x44>(u[q], u[4 + q]);
        let w = _mm512_shuffle_f32x4::<0xEE>(u[q], u[4 + q]);
        let x = _mm512_shuffle_f32x4::<0x44>(u[8 + q], u[12 + q]);
        let y = _mm512_shuffle_f32x4::<0xEE>(u[8 + q], u[12 + q]);
        cols[q] = _mm512_shuffle_f32x4::<0x88>(v, x);
        cols[4 + q] = _mm512_shuffle_f32x4::<0xDD>(v, x);
        cols[8 + q] = _mm512_shuffle_f32x4::<0x88>(w, y);
        cols[12 + q] = _mm512_shuffle_f32x4::<0xDD>(w, y);
    }
    cols
}

#[cfg(not(target_arch = "x86_64"))]
mod amx {
    use super::Operand;
    #[derive(Clone, Copy, PartialEq)]
    pub(super) enum Kernel {
        Tiles,
        Dot,
    }
    pub(super) fn kernel() -> Option<Kernel> {
        None
    }
    pub(super) struct PackedLhs {
        pub(super) m: usize,
        pub(super) k: usize,
    }
    pub(super) fn pack(_: Operand, _: usize, _: usize) -> PackedLhs {
        unreachable!("the bf16 kernels are x86-64 only")
    }
    pub(super) unsafe fn gemm_packed(_: Kernel, _: &PackedLhs, _: usize, _: Operand, _: f32, _: *mut f32) {
        unreachable!("the bf16 kernels are x86-64 only")
    }
    pub(super) unsafe fn gemm_packed_rows(_: Kernel, _: &PackedLhs, _: super::Rows, _: *mut f32) {
        unreachable!("the bf16 kernels are x86-64 only")
    }
    pub(super) fn gemm_rows_t(_: Kernel, _: usize, _: Operand, _: super::Rows, _: f32, _: &mut [f32]) {
        unreachable!("the bf16 kernels are x86-64 only")
    }
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn gemm(
        _: Kernel,
        _: usize,
        _: usize,
        _: usize,
        _: Operand,
        _: Operand,
        _: f32,
        _: *mut f32,
        _: bool,
    ) {
        unreachable!("the bf16 kernels are x86-64 only")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_to_nearest_even() {
        assert_eq!(round(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
        assert_eq!(round(1.0 + 1.0 / 256.0), 0x3f80);
        // 1 + 3·2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up to the even one.
        assert_eq!(round(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(widen(round(-2.5)), -2.5);
        assert!(widen(round(f32::NAN)).is_nan());
        assert_eq!(widen(round(f32::INFINITY)), f32::INFINITY);
        for x in [0.1f32, -3.7, 1e-30, 6.5e4] {
            assert_eq!(round(x), bf16::from_f32(x).to_bits(), "{x}");
        }
    }

    #[test]
    fn every_rounding_loop_writes_every_element_as_round_does() {
        // Ties both ways, NaN, infinities, normal values; a length that leaves a tail after
        // every vector width.
        let src: Vec<f32> = (0..100_003)
            .map(|i| match i % 7 {
                0 => 1.0 + (2 * (i % 64) + 1) as f32 / 256.0,
                1 => f32::NAN,
                2 => f32::NEG_INFINITY,
                _ => (i as f32 * 0.618).sin() * 1e3 / (1 + i % 13) as f32,
            })
            .collect();
        let want: Vec<u16> = src.iter().map(|&x| round(x)).collect();
        let bits = |v: &[bf16]| v.iter().map(|h| h.to_bits()).collect::<Vec<_>>();
        // The dispatched loop (AVX512-BF16 rounds subnormals to zero: none here).
        assert_eq!(bits(&rounded(&src)), want);
        // The loop below AVX512-BF16 (compiled for AVX2 where the CPU has it).
        let mut dst = vec![MaybeUninit::new(0x1234u16); src.len()];
        simd::round_vectorised(&src, &mut dst);
        // SAFETY: every element was initialised above.
        assert_eq!(
            dst.iter().map(|d| unsafe { d.assume_init() }).collect::<Vec<_>>(),
            want
        );
    }

    /// The vector loops' masked tails: every length up to past two vectors, each value as
    /// the scalar rounding gives it, nothing written past the end.
    #[test]
    fn short_rows_round_and_pair_as_round_does() {
        for len in [0, 1, 7, 14, 15, 16, 17, 28, 31, 32, 33, 47] {
            let (lo, hi) = (values(len, 1), values(len, 2));
            let mut words = vec![0xdead_beefu32; len + 1];
            pair_into(&lo, &hi, &mut words[..len]);
            let want: Vec<u32> = (0..len)
                .map(|i| round(lo[i]) as u32 | (round(hi[i]) as u32) << 16)
                .collect();
            assert_eq!(words[..len], want[..], "pairs of {len}");
            assert_eq!(words[len], 0xdead_beef, "pairs of {len}: written past the end");
            let mut bits = vec![0xbeefu16; len + 1];
            round_bits(&lo, &mut bits[..len]);
            let want: Vec<u16> = lo.iter().map(|&x| round(x)).collect();
            assert_eq!(bits[..len], want[..], "rounding {len}");
            assert_eq!(bits[len], 0xbeef, "rounding {len}: written past the end");
        }
    }

    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 7919 + seed * 104729) % 1013) as f32 / 1013.0 - 0.5)
            .collect()
    }

    /// op(a) · op(b) from the bf16-rounded operands, summed in f64.
    fn reference(m: usize, n: usize, k: usize, a: &Operand, b: &Operand) -> Vec<f32> {
        let mut out = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k)
                    .map(|p| widen(a.at(i, p)) as f64 * widen(b.at(p, j)) as f64)
                    .sum::<f64>() as f32;
            }
        }
        out
    }

    /// Values a product wrote into memory given to it as unwritten (here NaN-filled, so
    /// a value it skipped shows).
    fn initialised(v: Vec<MaybeUninit<f32>>) -> Vec<f32> {
        // SAFETY: every element was initialised (NaN) before the product wrote over it.
        v.into_iter().map(|x| unsafe { x.assume_init() }).collect()
    }

    /// `op(a) · op(b)` (`op_b(p, j)` its elements) through the entry points beside
    /// [`gemm`], each labelled, for the caller to compare with the reference: on the
    /// calling thread, with op(b) and its transpose made a row at a time ([`Rows`]), and
    /// from a left operand packed once (where a bf16 kernel runs), also into unwritten
    /// memory. Checks on the way that `matmul_into` gives the same bits as `matmul`.
    fn other_entry_points(
        (m, n, k): (usize, usize, usize),
        lhs: Operand,
        b: Operand,
        op_b: &(dyn Fn(usize, usize) -> f32 + Sync),
        case: &str,
    ) -> Vec<(&'static str, Vec<f32>)> {
        let mut serial = vec![f32::NAN; m * n];
        gemm_serial(m, n, k, lhs, b, 0.0, &mut serial);
        let b_row = |p: usize, dst: &mut [u16]| {
            dst.iter_mut()
                .enumerate()
                .for_each(|(j, d)| *d = round(op_b(p, j)))
        };
        let bt_row = |j: usize, dst: &mut [u16]| {
            dst.iter_mut()
                .enumerate()
                .for_each(|(p, d)| *d = round(op_b(p, j)))
        };
        let (b_rows, bt_rows) = (
            Rows {
                rows: k,
                cols: n,
                fill: &b_row,
            },
            Rows {
                rows: n,
                cols: k,
                fill: &bt_row,
            },
        );
        let mut by_rows = vec![f32::NAN; m * n];
        gemm_serial_rows_t(m, lhs, bt_rows, 0.0, &mut by_rows);
        gemm_serial_rows_t(m, lhs, bt_rows, 1.0, &mut by_rows);
        by_rows.iter_mut().for_each(|v| *v /= 2.0);
        // The layers' entry into unwritten memory: the same bits as `matmul` (bf16
        // products where they pay, else f32 ones).
        // SAFETY: `matmul_into` writes all m × n values.
        let into = unsafe { crate::scratch::written(m * n, |c| matmul_into(true, m, n, k, lhs, b, c)) };
        let mut by_matmul = vec![f32::NAN; m * n];
        matmul(true, m, n, k, lhs, b, 0.0, &mut by_matmul);
        assert!(
            into.iter()
                .zip(&by_matmul)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "matmul_into {case}"
        );
        let mut outs = vec![("serial", serial), ("rows transposed, accumulated", by_rows)];
        if let Some(packed) = Lhs::pack(m, k, lhs) {
            let mut times = vec![f32::NAN; m * n];
            packed.times(n, b, 0.0, &mut times);
            let mut into = vec![MaybeUninit::new(f32::NAN); m * n];
            packed.times_into(n, b, &mut into);
            packed.times(n, b, 1.0, &mut times);
            times.iter_mut().for_each(|v| *v /= 2.0);
            let mut rows_into = vec![MaybeUninit::new(f32::NAN); m * n];
            crate::scratch::poison();
            packed.times_rows_into(b_rows, &mut rows_into);
            outs.extend([
                ("packed, accumulated", times),
                ("packed into", initialised(into)),
                ("packed by rows into", initialised(rows_into)),
            ]);
        }
        outs
    }

    /// Every layout, ragged sizes (not multiples of the 32-wide blocks) and both output
    /// modes, on whichever kernel this machine has and on the portable one.
    #[test]
    fn products_match_the_rounded_reference_in_every_layout() {
        // (200, 190, 300) packs into recycled buffers (`scratch`), poisoned before each
        // product so that padding the packing failed to zero shows as NaN.
        for &(m, n, k) in &[
            (1, 1, 1),
            (37, 45, 70),
            (130, 33, 100),
            (16, 200, 31),
            (50, 57, 96),
            (200, 190, 300),
        ] {
            let (av, bv) = (values(m * k, 1), values(k * n, 2));
            let ab: Vec<bf16> = values(m * k, 3).iter().map(|&v| bf16::from_f32(v)).collect();
            for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                let a = Operand::F32(Mat {
                    data: &av,
                    ld: if ta { m } else { k },
                    trans: ta,
                });
                let b = Operand::F32(Mat {
                    data: &bv,
                    ld: if tb { k } else { n },
                    trans: tb,
                });
                let a16 = Operand::Bf16 {
                    data: &ab,
                    ld: if ta { m } else { k },
                    trans: ta,
                };
                for (lhs, name) in [(a, "f32"), (a16, "bf16")] {
                    let want = reference(m, n, k, &lhs, &b);
                    let mut got = vec![f32::NAN; m * n];
                    crate::scratch::poison();
                    gemm(m, n, k, lhs, b, 0.0, &mut got);
                    let err = crate::math::max_abs_diff(&want, &got);
                    assert!(err < 1e-4, "{m}x{n}x{k} ta={ta} tb={tb} {name}: error {err}");
                    let mut portable = vec![f32::NAN; m * n];
                    // SAFETY: `portable` holds the m × n values.
                    unsafe { widened((m, n, k), lhs, b, 0.0, portable.as_mut_ptr(), false) };
                    let err = crate::math::max_abs_diff(&want, &portable);
                    assert!(
                        err < 1e-4,
                        "portable {m}x{n}x{k} ta={ta} tb={tb} {name}: error {err}"
                    );
                    let op_b = |p: usize, j: usize| bv[if tb { j * k + p } else { p * n + j }];
                    let case = format!("{m}x{n}x{k} ta={ta} tb={tb} {name}");
                    let outs = other_entry_points((m, n, k), lhs, b, &op_b, &case);
                    for (how, out) in outs {
                        let err = crate::math::max_abs_diff(&want, &out);
                        assert!(err < 1e-4, "{how} {case}: error {err}");
                    }
                    // beta = 1 accumulates onto what the output holds.
                    gemm(m, n, k, lhs, b, 1.0, &mut got);
                    let twice: Vec<f32> = want.iter().map(|v| 2.0 * v).collect();
                    assert!(
                        crate::math::max_abs_diff(&twice, &got) < 2e-4,
                        "{m}x{n}x{k} accumulate"
                    );
                }
            }
        }
    }

    #[test]
    fn rounding_the_operands_is_the_only_difference_from_f32() {
        let (m, n, k) = (64, 64, 256);
        let (av, bv) = (values(m * k, 4), values(k * n, 5));
        let mut exact = vec![0f32; m * n];
        blas::gemm(m, n, k, 1.0, Mat::new(&av, k), Mat::new(&bv, n), 0.0, &mut exact);
        let mut got = vec![0f32; m * n];
        gemm(
            m,
            n,
            k,
            Operand::F32(Mat::new(&av, k)),
            Operand::F32(Mat::new(&bv, n)),
            0.0,
            &mut got,
        );
        let err = crate::math::max_abs_diff(&exact, &got);
        // Each operand carries a relative error of at most 2^-9; |a|,|b| ≤ 0.5, k = 256.
        assert!(
            err > 0.0 && err < 256.0 * 0.25 * 2.0 * (2f32).powi(-9),
            "error {err}"
        );
    }

    /// `matmul` in mixed precision: bf16 products where they pay (AMX), else f32 products
    /// with a bf16-stored operand widened exactly, in every layout and with `beta = 1`.
    #[test]
    fn matmul_keeps_f32_products_where_bf16_does_not_pay() {
        for &(m, n, k) in &[(1, 1, 1), (37, 45, 70), (16, 200, 31), (19, 40, 300)] {
            let (av, bv) = (values(m * k, 6), values(k * n, 7));
            let ab: Vec<bf16> = av.iter().map(|&v| bf16::from_f32(v)).collect();
            let aw: Vec<f32> = ab.iter().map(|v| v.to_f32()).collect();
            for (ta, tb) in [(false, false), (true, true), (false, true)] {
                let lda = if ta { m } else { k };
                let b = Mat {
                    data: &bv,
                    ld: if tb { k } else { n },
                    trans: tb,
                };
                let a16 = Operand::Bf16 {
                    data: &ab,
                    ld: lda,
                    trans: ta,
                };
                let a32 = Operand::F32(Mat {
                    data: &av,
                    ld: lda,
                    trans: ta,
                });
                for (lhs, stored) in [(a32, &av), (a16, &aw)] {
                    let want = if bf16_products(k) {
                        reference(m, n, k, &lhs, &Operand::F32(b))
                    } else {
                        let mut w = vec![0f32; m * n];
                        let a = Mat {
                            data: stored,
                            ld: lda,
                            trans: ta,
                        };
                        blas::gemm(m, n, k, 1.0, a, b, 0.0, &mut w);
                        w
                    };
                    let mut got = vec![f32::NAN; m * n];
                    matmul(true, m, n, k, lhs, Operand::F32(b), 0.0, &mut got);
                    let err = crate::math::max_abs_diff(&want, &got);
                    assert!(err < 1e-4, "{m}x{n}x{k} ta={ta} tb={tb}: error {err}");
                    matmul(true, m, n, k, lhs, Operand::F32(b), 1.0, &mut got);
                    let twice: Vec<f32> = want.iter().map(|v| 2.0 * v).collect();
                    assert!(
                        crate::math::max_abs_diff(&twice, &got) < 2e-4,
                        "{m}x{n}x{k} accumulate"
                    );
                }
            }
        }
    }
}
