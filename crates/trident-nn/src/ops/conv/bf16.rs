//! Which arithmetic a convolution's products run in: the direct kernels, bf16 (packed once
//! per pass) or f32.

use super::unfold::Unfold;
use super::{apart, Conv};
use crate::blas::{self, Mat};
use std::mem::MaybeUninit;
use std::sync::OnceLock;

impl Conv {
    /// This convolution of `(b, c, h, w, oh, ow)` ([`Self::geometry`]) to `o` channels in
    /// [`crate::direct_conv`]'s terms.
    pub(super) fn direct(
        &self,
        (b, c, h, w, oh, ow): (usize, usize, usize, usize, usize, usize),
        o: usize,
    ) -> crate::direct_conv::Geometry {
        crate::direct_conv::Geometry {
            b,
            c,
            h,
            w,
            o,
            k: self.k,
            stride: self.stride,
            padding: self.padding,
            oh,
            ow,
        }
    }

    pub(super) fn flops(&self, b: usize, o: usize, ckk: usize, ohw: usize) -> u64 {
        2 * (b * o * ckk * ohw) as u64
    }

    /// The arithmetic the weight gradient of the convolution `geometry` runs in directly
    /// ([`crate::direct_conv::weight_gradient`]), where it does rather than as the
    /// unfolded product of `m × k` by `k × n`: that product's ([`Self::direct_arith`])
    /// where the kernel suits the shape. (This op's weight gradient, and a transposed
    /// convolution's: that of the convolution it is the input gradient of.)
    pub(super) fn direct_weight_gradient(
        &self,
        geometry: &crate::direct_conv::Geometry,
        (m, n, k): (usize, usize, usize),
    ) -> Option<crate::direct_conv::Arith> {
        self.direct_arith((m, n, k))
            .filter(|_| crate::direct_conv::suits_weight_gradient(geometry))
    }

    /// The arithmetic of a direct pass ([`crate::direct_conv`]) standing for an unfolded
    /// product of `m × k` by `k × n`: bf16 where that product would run in bf16
    /// ([`Self::in_bf16`]) and the CPU multiplies bf16 with `vdpbf16ps`
    /// ([`crate::direct_conv::bf16_available`]), f32 where it would stay f32; `None` where
    /// direct convolutions do not run, or the product would run in bf16 on AMX tiles (the
    /// unfolded product then).
    pub(super) fn direct_arith(&self, (m, n, k): (usize, usize, usize)) -> Option<crate::direct_conv::Arith> {
        use crate::direct_conv::{available, bf16_available, Arith};
        if !available() {
            None
        } else if self.in_bf16(m, n, k) {
            bf16_available().then_some(Arith::Bf16)
        } else {
            Some(Arith::F32)
        }
    }

    /// Whether an unfolded product of `m × k` by `k × n` runs in bf16: under autocast, on
    /// bf16 hardware ([`crate::bf16::accelerated`]), and deep and wide enough that the
    /// faster products outweigh rounding and packing both operands.
    pub(super) fn in_bf16(&self, m: usize, n: usize, k: usize) -> bool {
        self.bf16 && conv_bf16_pays(m, n, k)
    }

    /// `c = a · b + beta · c` for one group's unfolded product, on the calling thread, in
    /// bf16 where [`Self::in_bf16`], else in f32.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn product(&self, m: usize, n: usize, k: usize, a: Mat, b: Mat, beta: f32, c: &mut [f32]) {
        if self.in_bf16(m, n, k) {
            use crate::bf16::Operand;
            crate::bf16::gemm_serial(m, n, k, Operand::F32(a), Operand::F32(b), beta, c)
        } else {
            blas::gemm_serial(m, n, k, 1.0, a, b, beta, c)
        }
    }

    /// `c = a · colsᵀ + beta · c` (`a` `m × wide`, the patches `cols` `[c·k·k, wide]`, `c`
    /// `m × c·k·k`: a weight gradient) on the calling thread: in bf16 where
    /// [`Self::in_bf16`], the patch rows unfolded straight into the packed operand
    /// ([`crate::bf16::gemm_serial_rows_t`]); else unfolded into a matrix for an f32
    /// product.
    pub(super) fn product_by_patches(&self, m: usize, a: Mat, cols: &Unfold, beta: f32, c: &mut [f32]) {
        let (n, k) = (cols.len(), cols.imgs * cols.ohw);
        if cols.in_bf16() {
            let a = crate::bf16::Operand::F32(a);
            return cols.rows(|rows| crate::bf16::gemm_serial_rows_t(m, a, rows, beta, c));
        }
        let mut stored = crate::scratch::take(n * k);
        cols.write_matrix(&mut stored);
        blas::gemm_serial(m, n, k, 1.0, a, Mat::new(&stored, k).t(), beta, c);
        crate::scratch::give(stored);
    }

    /// `a` (`m × k`) as the left operand of a pass whose groups multiply it by `k × n`
    /// patches: packed once in bf16 where those products run in bf16 ([`Self::in_bf16`]).
    pub(super) fn weight<'a>(&self, a: Mat<'a>, (m, n, k): (usize, usize, usize)) -> Weight<'a> {
        if self.in_bf16(m, n, k) {
            if let Some(packed) = crate::bf16::Lhs::pack(m, k, crate::bf16::Operand::F32(a)) {
                return Weight::Bf16(packed);
            }
        }
        Weight::F32 { a, m, k }
    }
}

/// The left operand every group of one convolution pass multiplies by (the weight or its
/// transpose, `m × k`): as it is for f32 products, rounded and packed once for bf16 ones
/// (packed for each group of images, the GAN critic's second convolution would round and
/// pack its 128 × 1024 weight values beside every group's 1024 × 245 patch values: a third
/// of the values packed, by count).
pub(super) enum Weight<'a> {
    F32 { a: Mat<'a>, m: usize, k: usize },
    Bf16(crate::bf16::Lhs),
}

impl Weight<'_> {
    /// Whether this pass multiplies in bf16.
    pub(super) fn is_bf16(&self) -> bool {
        matches!(self, Weight::Bf16(_))
    }

    /// `c = a · b + beta · c` for `b` `k × n`, on the calling thread.
    pub(super) fn times(&self, n: usize, b: Mat, beta: f32, c: &mut [f32]) {
        match self {
            Weight::F32 { a, m, k } => blas::gemm_serial(*m, n, *k, 1.0, *a, b, beta, c),
            Weight::Bf16(p) => p.times(n, crate::bf16::Operand::F32(b), beta, c),
        }
    }

    /// `a [m, k] · cols [k, imgs·n]`, each image's `n` columns written to its place in
    /// `out` (`[imgs, m, n]`, every value written; it need not be initialised).
    pub(super) fn apart(&self, cols: &[f32], dims: (usize, usize, usize), out: &mut [MaybeUninit<f32>]) {
        let wide = dims.2 * dims.1;
        self.apart_with(dims, out, |c| match self {
            Weight::F32 { a, m, k } => blas::gemm_serial_into(*m, wide, *k, 1.0, *a, Mat::new(cols, wide), c),
            Weight::Bf16(p) => p.times_into(wide, crate::bf16::Operand::F32(Mat::new(cols, wide)), c),
        })
    }

    /// [`Self::apart`] of the patches of `imgs` images: in bf16 their rows unfolded
    /// straight into the packed operand, in f32 into a matrix first.
    pub(super) fn apart_patches(
        &self,
        cols: &Unfold,
        dims: (usize, usize, usize),
        out: &mut [MaybeUninit<f32>],
    ) {
        let wide = dims.2 * dims.1;
        self.apart_with(dims, out, |c| match self {
            Weight::F32 { a, m, k } => {
                let mut stored = crate::scratch::take(k * wide);
                cols.write_matrix(&mut stored);
                blas::gemm_serial_into(*m, wide, *k, 1.0, *a, Mat::new(&stored, wide), c);
                crate::scratch::give(stored);
            }
            Weight::Bf16(p) => cols.rows(|rows| p.times_rows_into(rows, c)),
        })
    }

    /// `product(c)` writes the `[m, imgs·n]` product into `c`: straight into `out` for
    /// one image, else into a scratch product whose images' columns are then moved apart.
    fn apart_with(
        &self,
        (m, n, imgs): (usize, usize, usize),
        out: &mut [MaybeUninit<f32>],
        product: impl FnOnce(&mut [MaybeUninit<f32>]),
    ) {
        if imgs == 1 {
            return product(out);
        }
        let mut prod = crate::scratch::take(m * imgs * n);
        // SAFETY: viewing initialised f32 as MaybeUninit; `product` writes only f32 values.
        product(unsafe { std::slice::from_raw_parts_mut(prod.as_mut_ptr().cast(), prod.len()) });
        apart(&prod, (imgs, m, n), out);
        crate::scratch::give(prod);
    }
}

/// Whether convolutions created under bf16 autocast run their products in bf16 on this CPU
/// (those deep and wide enough, [`CONV_BF16_DEPTH`], [`CONV_BF16_EDGE`]): where it has bf16
/// arithmetic ([`crate::bf16::accelerated`]), unless `TRIDENT_CONV_BF16=off` (for
/// comparisons).
pub fn conv_bf16() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        crate::bf16::accelerated()
            && !std::env::var("TRIDENT_CONV_BF16").is_ok_and(|v| v.eq_ignore_ascii_case("off"))
    })
}

/// Whether a convolution's unfolded product of `m × k` by `k × n` pays in bf16 here (see
/// [`Conv::in_bf16`]).
pub(super) fn conv_bf16_pays(m: usize, n: usize, k: usize) -> bool {
    conv_bf16() && deep_and_wide(m, n, k)
}

/// Whether a convolution's product of `m × k` by `k × n` is deep and wide enough for bf16.
pub(super) fn deep_and_wide(m: usize, n: usize, k: usize) -> bool {
    k >= CONV_BF16_DEPTH && m >= CONV_BF16_EDGE && n >= CONV_BF16_EDGE
}

/// Counts `flops` of a convolution's products of `m × k` by `k × n` for the profiler's
/// bf16 advice ([`crate::trace::count_bf16_ready`]) where they are deep and wide enough to
/// run in bf16 under autocast, whatever this run's precision and CPU.
pub(super) fn count_bf16_ready(m: usize, n: usize, k: usize, flops: u64) {
    if deep_and_wide(m, n, k) {
        crate::trace::count_bf16_ready(flops);
    }
}

/// The shortest inner dimension of a convolution's product run in bf16. Unlike a dense
/// layer's ([`crate::bf16::MIN_BF16_DEPTH`]), the weight is rounded and packed once per
/// pass, not per product, so shallower products pay: the backward passes of the Fashion
/// CNN's second convolution (its input gradient 64 deep) and of the GAN critic's (128 deep)
/// ran 1.25–1.5x faster in bf16 (`conv_bench`, AMD EPYC Zen 4), their input gradient
/// alone level with the direct f32 kernel.
pub(super) const CONV_BF16_DEPTH: usize = 64;

/// The fewest rows and columns of a convolution's product run in bf16: one block of the
/// bf16 kernels ([`crate::bf16`]), 32.
pub(super) const CONV_BF16_EDGE: usize = 32;
