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
mod simd;

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
mod amx;

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
mod tests;
