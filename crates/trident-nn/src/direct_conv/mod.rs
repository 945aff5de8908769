//! A convolution's forward pass and input gradient computed directly, without unfolding
//! patches.
//!
//! [`crate::ops::conv2d`] unfolds each image's patches (`[c·k·k, oh·ow]`) and hands them to
//! the GEMM, which copies them once more into its own packed panels: two passes over a
//! matrix `k·k/s²` times the image's size before the first multiply. Here the output
//! channels lie across AVX-512's 16 lanes and each input value is broadcast from a
//! zero-padded copy of the image, so the only copies are that image and the weight,
//! re-laid once per call as `[⌈o/16⌉, c, k, k, 16]`. A tile of up to 3 lane-blocks of
//! output channels by up to 7 output positions of one row is held in 21 of the 32 vector
//! registers over the whole `c·k·k` reduction and written out once; the positions are read
//! `stride` apart along the padded row (no gather).
//!
//! Used where it measured faster than unfolding (`conv_bench` against itself and oneDNN,
//! docs/PERFORMANCE.md): on AVX-512, for kernels larger than 1 × 1 with enough output
//! channels to fill the lanes, over a reduction (`c·k·k`) long enough to pay for writing
//! the tile out; [`forward`] for convolutions, [`backward_input`] for transposed
//! convolutions and for a convolution's input gradient. [`weight_gradient`] turns the
//! roles round (the sums over output positions, in registers, per tap) for the weight
//! gradients of 3 × 3 and 4 × 4 kernels, both convolutions' and transposed ones': with
//! it, neither gradient unfolds patches. Under bf16 autocast, on a CPU with AVX512-BF16
//! (and no AMX tiles), every pass runs in bf16 ([`Arith::Bf16`]): `vdpbf16ps` adds two
//! products per lane, of two input channels (forward, input gradient) or of two output
//! positions (weight gradient), into f32 sums. An AVX2 form (8 lanes, tiles of 2 × 6 in 16 registers) ran level with
//! unfolding onto OpenBLAS's Haswell kernels, or 1.2x slower (Fashion CNN conv2), and was
//! not kept. `TRIDENT_CONV=unfold` turns it off (comparisons).
//!
//! One file per pass: [`forward`] (and the passes of tiles it shares with the input
//! gradient), [`backward_input`], [`weight_gradient`]; their AVX-512 kernels in `x86`.

mod forward;
mod input_gradient;
#[cfg(test)]
mod tests;
mod weight_gradient;
#[cfg(target_arch = "x86_64")]
mod x86;

pub(crate) use forward::forward;
use forward::{pack_weight, pad_into, run_images};
pub(crate) use input_gradient::backward_input;
pub(crate) use weight_gradient::{suits_weight_gradient, weight_gradient};
use weight_gradient::{tiles, weight_rows, WeightTile};

/// A convolution's shape: input `[b, c, h, w]`, `o` output channels of a square `k × k`
/// kernel at `stride` with zero `padding`, output `[b, o, oh, ow]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geometry {
    pub b: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub o: usize,
    pub k: usize,
    pub stride: usize,
    pub padding: usize,
    pub oh: usize,
    pub ow: usize,
}

/// Output channels per vector: AVX-512's 16 lanes of f32.
const LANES: usize = 16;

/// What a direct pass multiplies in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arith {
    /// f32 multiply-adds.
    F32,
    /// Both operands rounded to bf16, two input channels at a time multiplied and summed
    /// into f32 (AVX512-BF16's `vdpbf16ps`: twice the multiply-adds of an f32 FMA per
    /// instruction). The padded input and the packed weight then hold pairs of bf16 (the
    /// even channel in the low half) in 4-byte words where the f32 form holds one value,
    /// so that both forms share the passes, their addressing and their checks.
    Bf16,
}

impl Arith {
    /// Words per position for `channels` input channels: one per channel in f32, one per
    /// pair of channels in bf16 (an odd last channel paired with zeros).
    fn words(self, channels: usize) -> usize {
        match self {
            Arith::F32 => channels,
            Arith::Bf16 => channels.div_ceil(2),
        }
    }
}

/// Whether the direct passes run in bf16 here ([`Arith::Bf16`]): direct convolutions
/// ([`available`]) on a CPU whose bf16 products run on AVX512-BF16's `vdpbf16ps`
/// ([`crate::bf16::dot_products`]; where AMX tiles run them, the unfolded products stay).
/// `TRIDENT_CONV_BF16=unfold` keeps bf16 convolutions on unfolded products everywhere,
/// `TRIDENT_CONV_BF16=direct` puts them on the direct kernels wherever the CPU has
/// AVX512-BF16, AMX or not (for comparisons: on AMX CPUs the two have not been measured
/// against each other).
pub(crate) fn bf16_available() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        let choice = std::env::var("TRIDENT_CONV_BF16")
            .unwrap_or_default()
            .to_ascii_lowercase();
        available()
            && match choice.as_str() {
                "" => crate::bf16::dot_products(),
                // `off` keeps the convolutions f32 (`ops::conv_bf16`), so nothing is bf16.
                "off" | "unfold" => false,
                "direct" => crate::bf16::avx512_bf16(),
                other => panic!("TRIDENT_CONV_BF16={other}: expected `off`, `unfold` or `direct` (or unset)"),
            }
    })
}

/// Whether direct convolutions run here: a CPU with AVX-512F, unless
/// `TRIDENT_CONV=unfold` (any other value is an error).
pub(crate) fn available() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| match std::env::var("TRIDENT_CONV") {
        Err(_) => cpu_has_avx512(),
        Ok(v) if v.eq_ignore_ascii_case("unfold") => false,
        Ok(v) => panic!("TRIDENT_CONV={v}: expected `unfold` (or unset)"),
    })
}

/// Whether this CPU has AVX-512F, which [`forward`] needs.
pub(crate) fn cpu_has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the direct pass is the faster one for `g`: a kernel larger than
/// 1 × 1 (a 1 × 1 convolution's patches are the image itself, a plain product), output
/// channels filling at least half the lanes (one output channel would leave 15 of 16
/// lanes idle), and at least 128 multiply-adds per output (`c·k·k`): the first
/// convolutions of the Fashion networks (one input channel, 9–16) and EfficientNet's stem
/// (27) ran 1.2–2x slower direct, as each tile's writing-out weighs on so short a sum.
pub(crate) fn suits(g: &Geometry) -> bool {
    g.k > 1 && 2 * g.o >= LANES && g.c * g.k * g.k >= 128
}

/// One direct pass over an image, in the terms the kernel knows: an input of `c_in`
/// planes `in_h × in_w` (already zero-padded), a `kh × kw` kernel stepping `step` input
/// columns (and rows) per output position, and `rows × cols` output positions per output
/// channel, each written to `out[ch · out_plane + out_base + r · out_rs + q · out_cs]`.
/// Output row `r`, tap `(dy, dx)` at position `q` read input `(r·step + row_off + dy,
/// q·step + col_off + dx)`. A pass without taps (`kh` or `kw` 0) writes zeros. Only the
/// input rows `live_rows` hold values (the rest are padding, zero): taps that would read
/// other rows are skipped.
#[derive(Clone, Copy, Debug)]
struct Pass {
    c_in: usize,
    in_h: usize,
    in_w: usize,
    kh: usize,
    kw: usize,
    step: usize,
    row_off: usize,
    col_off: usize,
    live_rows: (usize, usize),
    out_c: usize,
    rows: usize,
    cols: usize,
    out_plane: usize,
    out_base: usize,
    out_rs: usize,
    out_cs: usize,
}

impl Pass {
    /// Panics unless every input the pass reads lies in its padded planes.
    fn check(&self) {
        assert!(self.rows > 0 && self.cols > 0);
        if self.kh == 0 || self.kw == 0 {
            return; // reads nothing
        }
        assert!(
            (self.rows - 1) * self.step + self.row_off + self.kh <= self.in_h,
            "{self:?}: rows"
        );
        assert!(
            (self.cols - 1) * self.step + self.col_off + self.kw <= self.in_w,
            "{self:?}: columns"
        );
    }
}

/// Whether [`backward_input`] is the faster way to `g`'s input gradient (and so to the
/// transposed convolution's forward pass): as [`suits`] with the roles turned round, the
/// input channels across the lanes and, per phase, about `o·⌈k/s⌉²` multiply-adds.
pub(crate) fn suits_input_gradient(g: &Geometry) -> bool {
    let taps = g.k.div_ceil(g.stride);
    g.k > 1 && 2 * g.c >= LANES && g.o * taps * taps >= 128
}
