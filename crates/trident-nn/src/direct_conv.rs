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

use rayon::prelude::*;
use std::mem::MaybeUninit;

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

/// The convolution `g` of `x` (`[b, c, h, w]`) with `wt` (`[o, c, k, k]`): `[b, o, oh, ow]`,
/// images in parallel on rayon's pool, in `arith`.
///
/// # Panics
/// Unless the CPU has AVX-512F ([`cpu_has_avx512`]) (and AVX512-BF16 for
/// [`Arith::Bf16`]) and the slices hold the geometry.
pub(crate) fn forward(x: &[f32], wt: &[f32], g: Geometry, arith: Arith) -> Vec<f32> {
    let Geometry {
        b,
        c,
        h,
        w,
        o,
        k,
        stride,
        padding: p,
        oh,
        ow,
    } = g;
    assert!(wt.len() >= o * c * k * k);
    let pass = Pass {
        c_in: arith.words(c),
        in_h: h + 2 * p,
        in_w: w + 2 * p,
        kh: k,
        kw: k,
        step: stride,
        row_off: 0,
        col_off: 0,
        live_rows: (p, p + h),
        out_c: o,
        rows: oh,
        cols: ow,
        out_plane: oh * ow,
        out_base: 0,
        out_rs: ow,
        out_cs: 1,
    };
    let packed = pack_weight(arith, (o, c), (k, k), |oc, ch, dy, dx| {
        wt[((oc * c + ch) * k + dy) * k + dx]
    });
    run_images(x, (c, h, w), [p; 4], &[(pass, packed)], (b, o * oh * ow), arith)
}

/// The input gradient (`[b, c, h, w]`) of the convolution `g` (weight `wt` `[o, c, k, k]`)
/// for the output gradient `dy` (`[b, o, oh, ow]`): the transposed convolution, images in
/// parallel on rayon's pool.
///
/// At stride `s`, the inputs of one phase `(iy mod s, ix mod s)` are reached by the taps
/// `kh ≡ iy + p (mod s)` only, from output rows one apart: each phase is a stride-1
/// convolution of `dy` with that phase's taps (flipped), written to every `s`-th input.
/// A phase no tap reaches (a kernel smaller than the stride) is a pass without taps: zero.
/// In `arith`, as [`forward`].
///
/// # Panics
/// As [`forward`].
pub(crate) fn backward_input(dy: &[f32], wt: &[f32], g: Geometry, arith: Arith) -> Vec<f32> {
    let Geometry {
        b,
        c,
        h,
        w,
        o,
        k,
        stride: s,
        padding: p,
        oh,
        ow,
    } = g;
    assert!(wt.len() >= o * c * k * k);
    // Along one axis, for phase r: the first tap (kh0 ≡ r + p mod s), the number of taps,
    // the output index of the last tap at phase index 0 (e = (r + p) div s), the number of
    // inputs in the phase.
    let axis = |r: usize, n: usize| {
        let first = (r + p) % s;
        let taps = if first < k { (k - first).div_ceil(s) } else { 0 };
        (
            first,
            taps,
            (r + p) / s,
            if r < n { (n - r).div_ceil(s) } else { 0 },
        )
    };
    // Padding of dy: output index qy + e − (taps − 1) + a, a < taps, must land inside.
    let pads = |n: usize, outs: usize| {
        let (mut lo, mut hi) = (0usize, 0usize);
        for r in 0..s {
            let (_, taps, e, count) = axis(r, n);
            if taps == 0 || count == 0 {
                continue;
            }
            lo = lo.max((taps - 1).saturating_sub(e));
            hi = hi.max((count + e).saturating_sub(outs));
        }
        (lo, hi)
    };
    let ((top, bottom), (left, right)) = (pads(h, oh), pads(w, ow));
    let (in_h, in_w) = (oh + top + bottom, ow + left + right);
    // One pass and packed weight per phase that has inputs.
    let mut passes = Vec::new();
    for ry in 0..s {
        for rx in 0..s {
            let (fy, ty, ey, ny) = axis(ry, h);
            let (fx, tx, ex, nx) = axis(rx, w);
            if ny == 0 || nx == 0 {
                continue;
            }
            let taps = ty > 0 && tx > 0;
            let pass = Pass {
                c_in: arith.words(o),
                in_h,
                in_w,
                kh: ty,
                kw: tx,
                step: 1,
                row_off: if taps { ey + top + 1 - ty } else { 0 },
                col_off: if taps { ex + left + 1 - tx } else { 0 },
                live_rows: (top, top + oh),
                out_c: c,
                rows: ny,
                cols: nx,
                out_plane: h * w,
                out_base: ry * w + rx,
                out_rs: s * w,
                out_cs: s,
            };
            // Tap (a, b) of the pass is kernel tap (first + s·(taps − 1 − a), …): flipped.
            let packed = pack_weight(arith, (c, o), (ty, tx), |ch, oc, a, bb| {
                wt[((oc * c + ch) * k + fy + s * (ty - 1 - a)) * k + fx + s * (tx - 1 - bb)]
            });
            passes.push((pass, packed));
        }
    }
    run_images(
        dy,
        (o, oh, ow),
        [top, left, bottom, right],
        &passes,
        (b, c * h * w),
        arith,
    )
}

/// Runs `passes` (each with its packed weight) over each of the first `images` images of
/// `src` (`[c, h, w]` each, padded by `pads` as [`pad`] does), image `n` into the `n`-th
/// `out_per` values of the output; images in parallel on rayon's pool. The passes must
/// write every output value between them (each writes `out_c` planes of `rows × cols`
/// positions, `out_base` + `out_rs`/`out_cs` steps: one pass covers a plane, or the `s²`
/// phases of a transposed convolution do), which [`covers`] checks. In bf16 each image is
/// rounded and paired as it is padded ([`pad_pairs_into`]).
fn run_images(
    src: &[f32],
    (c, h, w): (usize, usize, usize),
    pads: [usize; 4],
    passes: &[(Pass, Vec<f32>)],
    (images, out_per): (usize, usize),
    arith: Arith,
) -> Vec<f32> {
    assert!(cpu_has_avx512(), "direct convolution without AVX-512F");
    assert!(
        arith == Arith::F32 || crate::bf16::avx512_bf16(),
        "bf16 direct convolution without AVX512-BF16"
    );
    assert!(src.len() >= images * c * h * w);
    for (pass, _) in passes {
        pass.check();
    }
    assert!(
        covers(passes, out_per),
        "direct convolution passes leave output values unwritten"
    );
    let write = |out: &mut [MaybeUninit<f32>]| {
        out.par_chunks_mut(out_per.max(1)).enumerate().for_each(|(n, y)| {
            let img = &src[n * c * h * w..(n + 1) * c * h * w];
            let padded = match arith {
                Arith::F32 => pad(img, (c, h, w), pads),
                Arith::Bf16 => pad_pairs(img, (c, h, w), pads),
            };
            for (pass, packed) in passes {
                run(pass, &padded, packed, y, arith);
            }
            crate::scratch::give(padded);
        })
    };
    // SAFETY: each image's `out_per` values are written by its passes, which `covers`
    // checked cover all of them; `run` writes only inside its chunk.
    unsafe { crate::scratch::written(images * out_per, write) }
}

/// Whether `passes` write every one of `out_per` output values: the positions they write
/// (`out_c` planes of `out_plane` values, in each the `rows × cols` grid from `out_base`
/// in steps of `out_rs` and `out_cs`) counted once each add up to `out_per`, with no
/// position written by two passes and none outside.
fn covers(passes: &[(Pass, Vec<f32>)], out_per: usize) -> bool {
    let Some((first, _)) = passes.first() else {
        return out_per == 0;
    };
    let plane = first.out_plane;
    if passes
        .iter()
        .any(|(p, _)| p.out_plane != plane || p.out_c != first.out_c)
        || first.out_c * plane != out_per
    {
        return false;
    }
    let mut seen = vec![false; plane];
    for (p, _) in passes {
        for r in 0..p.rows {
            for q in 0..p.cols {
                let at = p.out_base + r * p.out_rs + q * p.out_cs;
                match seen.get_mut(at) {
                    Some(s) if !*s => *s = true,
                    _ => return false,
                }
            }
        }
    }
    seen.into_iter().all(|s| s)
}

/// Runs `pass` over one padded input into `out`, in `arith` (`padded` and `packed` in
/// that arithmetic's words).
fn run(pass: &Pass, padded: &[f32], packed: &[f32], out: &mut [MaybeUninit<f32>], arith: Arith) {
    assert!(padded.len() >= pass.c_in * pass.in_h * pass.in_w);
    assert!(packed.len() >= pass.out_c.div_ceil(LANES) * pass.c_in * pass.kh * pass.kw * LANES);
    let last = (pass.out_c - 1) * pass.out_plane
        + pass.out_base
        + (pass.rows - 1) * pass.out_rs
        + (pass.cols - 1) * pass.out_cs;
    assert!(out.len() > last, "{pass:?}: output");
    // SAFETY: the CPU has AVX-512F, and AVX512-BF16 for bf16 (`run_images` asserts
    // both); the asserts here and in `Pass::check` (run by `run_images`) bound every index
    // the kernel reads or writes.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        match arith {
            Arith::F32 => x86::image(pass, padded, packed, out),
            Arith::Bf16 => x86::image_pairs(pass, padded, packed, out),
        }
    }
}

/// The weight `[out_c, c_in, kh, kw]`, read through `at(out channel, in channel, dy,
/// dx)`, as `[⌈out_c/16⌉, words, kh, kw, 16]` in `arith`'s words ([`Arith::words`] of
/// `c_in`: in bf16 each word the rounded pair of channels `2i`, `2i + 1`), channels past
/// `out_c` (and an odd last channel's partner) zero.
fn pack_weight(
    arith: Arith,
    (out_c, c_in): (usize, usize),
    (kh, kw): (usize, usize),
    at: impl Fn(usize, usize, usize, usize) -> f32,
) -> Vec<f32> {
    let words = arith.words(c_in);
    let per = words * kh * kw;
    let blocks = out_c.div_ceil(LANES);
    let mut packed = vec![0f32; blocks * per * LANES];
    let round = |oc, ch, dy, dx| {
        if ch < c_in {
            crate::bf16::round(at(oc, ch, dy, dx))
        } else {
            0
        }
    };
    for oc in 0..out_c {
        let dst = &mut packed[(oc / LANES) * per * LANES..][..per * LANES];
        let lane = oc % LANES;
        let mut i = 0;
        for word in 0..words {
            for dy in 0..kh {
                for dx in 0..kw {
                    dst[i * LANES + lane] = match arith {
                        Arith::F32 => at(oc, word, dy, dx),
                        Arith::Bf16 => {
                            pair_word(round(oc, 2 * word, dy, dx), round(oc, 2 * word + 1, dy, dx))
                        }
                    };
                    i += 1;
                }
            }
        }
    }
    packed
}

/// Two bf16 as the 4-byte word [`Arith::Bf16`]'s buffers hold (`lo` in the low half),
/// kept in an f32 slot (moved, never computed with).
fn pair_word(lo: u16, hi: u16) -> f32 {
    f32::from_bits(u32::from(lo) | u32::from(hi) << 16)
}

/// Planes `img` (`[c, h, w]`) with zeros around them, `[top, left, bottom, right]`:
/// `[c, h + top + bottom, w + left + right]`.
fn pad(img: &[f32], (c, h, w): (usize, usize, usize), pads: [usize; 4]) -> Vec<f32> {
    let [top, left, bottom, right] = pads;
    let mut out = crate::scratch::take(c * (h + top + bottom) * (w + left + right));
    pad_into(img, (c, h, w), pads, &mut out);
    out
}

/// [`pad`] into `out` (`[c, h + top + bottom, w + left + right]`, every value written).
fn pad_into(
    img: &[f32],
    (c, h, w): (usize, usize, usize),
    [top, left, bottom, right]: [usize; 4],
    out: &mut [f32],
) {
    let (hp, wp) = (h + top + bottom, w + left + right);
    let out = &mut out[..c * hp * wp];
    if hp == h && wp == w {
        out.copy_from_slice(&img[..c * h * w]);
        return;
    }
    for (plane, src) in out.chunks_mut(hp * wp).zip(img.chunks(h * w)) {
        plane[..top * wp].fill(0.0);
        plane[(top + h) * wp..].fill(0.0);
        for (row, s) in plane[top * wp..(top + h) * wp].chunks_mut(wp).zip(src.chunks(w)) {
            row[..left].fill(0.0);
            row[left..left + w].copy_from_slice(s);
            row[left + w..].fill(0.0);
        }
    }
}

/// [`pad`] in bf16 pairs: `[⌈c/2⌉, h + top + bottom, w + left + right]` words, word
/// `(i, y, x)` channels `2i` and `2i + 1` at `(y, x)` rounded and paired ([`pair_word`]),
/// an odd last channel paired with zero.
fn pad_pairs(img: &[f32], (c, h, w): (usize, usize, usize), pads: [usize; 4]) -> Vec<f32> {
    let [top, left, bottom, right] = pads;
    let pairs = c.div_ceil(2);
    // Whole planes paired at once (a 14-wide row at a time, each row was a masked tail),
    // then padded as f32 values are (the words' bits copied unchanged).
    let mut paired = crate::scratch::take(pairs * h * w);
    let zeros = vec![0f32; if c % 2 == 1 { h * w } else { 0 }];
    for (i, plane) in paired.chunks_mut(h * w).enumerate() {
        let lo = &img[2 * i * h * w..][..h * w];
        let hi = if 2 * i + 1 < c {
            &img[(2 * i + 1) * h * w..][..h * w]
        } else {
            &zeros[..]
        };
        // SAFETY: f32 and u32 have the same size and alignment, and every bit pattern
        // is a valid value of each.
        let words = unsafe { std::slice::from_raw_parts_mut(plane.as_mut_ptr().cast::<u32>(), plane.len()) };
        crate::bf16::pair_into(lo, hi, words);
    }
    let mut out = crate::scratch::take(pairs * (h + top + bottom) * (w + left + right));
    pad_into(&paired, (pairs, h, w), pads, &mut out);
    crate::scratch::give(paired);
    out
}

/// Tap rows (one input channel's kernel row: `k` taps) per weight-gradient tile of `nb`
/// lane-blocks of output channels: as many as keep the tile's `rows · k · nb`
/// accumulators, its `nb` output-gradient vectors and a broadcast within the 32 vector
/// registers, at most 4.
const fn weight_rows(nb: usize, k: usize) -> usize {
    let r = (31 - nb) / (k * nb);
    if r > 4 {
        4
    } else {
        r
    }
}

/// The tiles of a weight gradient: each `(first lane-block, lane-blocks, first tap row)`,
/// lane-blocks split as evenly as [`tiles`] splits them (at most 4 a tile), tap rows
/// (`c · k` of them, channel by channel) [`weight_rows`] at a time.
fn weight_tiles(g: &Geometry) -> Vec<(usize, usize, usize)> {
    let rows = g.c * g.k;
    tiles(g.o.div_ceil(LANES), 4)
        .flat_map(|(j0, nb)| {
            let per = weight_rows(nb, g.k);
            (0..rows.div_ceil(per)).map(move |i| (j0, nb, i * per))
        })
        .collect()
}

/// Whether [`weight_gradient`] runs for `g`: a 3 × 3 or 4 × 4 kernel (the two it is
/// compiled for), output channels filling at least half the lanes, and at least 16 tiles
/// to share among the threads (a first convolution's one input channel makes 1–4, one
/// thread's work: its weight gradient stays with the unfolded product).
pub(crate) fn suits_weight_gradient(g: &Geometry) -> bool {
    matches!(g.k, 3 | 4) && 2 * g.o >= LANES && weight_tiles(g).len() >= 16
}

/// How [`weight_gradient`] lays out a batch's images and output gradients, and how the
/// kernel walks them, in its arithmetic. Input offsets count elements (f32, or bf16 for
/// pairs) within one image.
/// - f32: each image zero-padded (`c` planes of `hp × wp`), its output gradients
///   channels-last (`oh · ow` positions of `ob` values); a step is one output position.
/// - bf16 pairs: each padded row rounded to bf16 and split by column phase (each plane
///   `hp` rows of `s` phase rows of `wq` values, phase `φ` holding padded columns `φ`,
///   `φ + s`, …, zeros past the row), so that the two inputs a tap reads for two
///   consecutive output positions lie side by side; the output gradients channels-last in
///   pairs of consecutive positions of a row (`oh` rows of `⌈ow/2⌉` words of `ob` pairs,
///   an odd row's last position paired with zero); a step is a pair of positions.
#[derive(Clone, Copy, Debug)]
struct WeightLayout {
    pairs: bool,
    oh: usize,
    /// Steps per output row.
    steps: usize,
    /// Input elements per padded image, per channel plane, per tap row, per output row
    /// and per step along it.
    image: usize,
    plane: usize,
    tap_row: usize,
    out_row: usize,
    step: usize,
    /// Each tap's (`kx`) input offset from its step's first.
    taps: [usize; 4],
    /// Lanes of re-laid output gradients per position (or pair): `o` rounded up to 16.
    ob: usize,
}

impl WeightLayout {
    fn new(g: &Geometry, arith: Arith) -> Self {
        let (hp, wp, s, k) = (g.h + 2 * g.padding, g.w + 2 * g.padding, g.stride, g.k);
        assert!(k <= 4, "direct weight gradient of a {k} × {k} kernel");
        let ob = g.o.div_ceil(LANES) * LANES;
        match arith {
            Arith::F32 => WeightLayout {
                pairs: false,
                oh: g.oh,
                steps: g.ow,
                image: g.c * hp * wp,
                plane: hp * wp,
                tap_row: wp,
                out_row: s * wp,
                step: s,
                taps: [0, 1, 2, 3],
                ob,
            },
            Arith::Bf16 => {
                // A phase row reaches the last pair's partner's last tap: ⌈ow/2⌉·2 − 1 +
                // (k − 1)/s; even, so that every image is whole words.
                let wq = (g.ow + 1 + (k - 1) / s).next_multiple_of(2);
                WeightLayout {
                    pairs: true,
                    oh: g.oh,
                    steps: g.ow.div_ceil(2),
                    image: g.c * hp * s * wq,
                    plane: hp * s * wq,
                    tap_row: s * wq,
                    out_row: s * s * wq,
                    step: 2,
                    taps: std::array::from_fn(|kx| (kx % s) * wq + kx / s),
                    ob,
                }
            }
        }
    }

    /// 4-byte words per padded image (two bf16 a word in pairs).
    fn image_words(&self) -> usize {
        if self.pairs {
            self.image / 2
        } else {
            self.image
        }
    }

    /// Words of re-laid output gradients per image.
    fn dy_words(&self) -> usize {
        self.oh * self.steps * self.ob
    }
}

/// One weight-gradient tile's work over a chunk of images laid out as `layout` says: the
/// chunk's inputs and re-laid output gradients (as words), the tile's first tap row (tap
/// row `t` is channel `t / k`'s kernel row `t % k`) and first lane-block `j0`.
struct WeightTile<'a> {
    x: &'a [f32],
    dy: &'a [f32],
    layout: &'a WeightLayout,
    rows: usize,
    row0: usize,
    j0: usize,
}

impl WeightTile<'_> {
    /// Images in the chunk.
    fn images(&self) -> usize {
        self.x.len() / self.layout.image_words()
    }

    /// The tile's `r` tap rows' offsets in an image (past the last row: the last row
    /// again, its sums dropped by the caller); panics unless every read of `nb`
    /// lane-blocks and `k` taps lies inside the chunk.
    fn offsets<const R: usize>(&self, k: usize, nb: usize) -> [usize; R] {
        let l = self.layout;
        assert!(self.row0 < self.rows && self.rows.is_multiple_of(k));
        let imgs = self.images();
        assert!(imgs > 0 && self.x.len() == imgs * l.image_words());
        assert!(self.dy.len() >= imgs * l.dy_words() && (self.j0 + nb) * LANES <= l.ob);
        let offset = |t: usize| (t / k) * l.plane + (t % k) * l.tap_row;
        let last_read = offset(self.rows - 1)
            + (l.oh - 1) * l.out_row
            + (l.steps - 1) * l.step
            + l.taps[..k].iter().max().expect("k ≥ 1")
            + usize::from(l.pairs);
        assert!(last_read < l.image, "{l:?}: a tap reads past the image");
        std::array::from_fn(|r| offset((self.row0 + r).min(self.rows - 1)))
    }
}

/// The weight gradient (`[o, c, k, k]`) of the convolution `g` of `x` (`[b, c, h, w]`)
/// for the output gradient `dy` (`[b, o, oh, ow]`), without unfolding patches, in
/// `arith`.
///
/// `dW[oc, ch, ky, kx] = Σ_n Σ_(y, x) dy[n, oc, y, x] · x[n, ch, y·s + ky − p, x·s + kx − p]`.
/// Output channels lie across the lanes (the output gradients re-laid channels-last,
/// [`WeightLayout`]); a tile of up to 4 lane-blocks by a few tap rows (an input
/// channel's kernel row, all `k` taps) holds its sums in registers while it walks every
/// output position: per position (in bf16, per pair of positions: `vdpbf16ps` adds both
/// products), one vector of output gradients per lane-block and one broadcast input per
/// tap, read from the zero-padded images. The unfolded form wrote a patch matrix
/// `k²/s²` times the images' size and had the GEMM copy it again into its panels.
///
/// Tiles run in parallel on rayon's pool; each sums the images in order (a chunk of images
/// at a time, its sums carried in memory between chunks), so the result does not depend
/// on the number of threads.
///
/// # Panics
/// Unless the CPU has AVX-512F (and AVX512-BF16 for [`Arith::Bf16`]), `g.k` is 3 or 4
/// and the slices hold the geometry.
pub(crate) fn weight_gradient(x: &[f32], dy: &[f32], g: Geometry, arith: Arith) -> Vec<f32> {
    weight_gradient_in(x, dy, g, arith, 32 << 20)
}

/// [`weight_gradient`], the images in batches of at most `batch_bytes` padded and
/// re-laid (at least one image a batch).
fn weight_gradient_in(x: &[f32], dy: &[f32], g: Geometry, arith: Arith, batch_bytes: usize) -> Vec<f32> {
    let Geometry {
        b,
        c,
        h,
        w,
        o,
        k,
        stride: s,
        padding: p,
        oh,
        ow,
    } = g;
    assert!(cpu_has_avx512(), "direct convolution without AVX-512F");
    assert!(
        arith == Arith::F32 || crate::bf16::avx512_bf16(),
        "bf16 direct weight gradient without AVX512-BF16"
    );
    assert!(matches!(k, 3 | 4), "direct weight gradient of a {k} × {k} kernel");
    assert!(x.len() >= b * c * h * w && dy.len() >= b * o * oh * ow);
    assert!(
        (oh - 1) * s + k <= h + 2 * p && (ow - 1) * s + k <= w + 2 * p,
        "{g:?}"
    );
    let layout = WeightLayout::new(&g, arith);
    let (image, dy_image) = (layout.image_words(), layout.dy_words());
    let (chw, ohw) = (c * h * w, o * oh * ow);
    let tiles = weight_tiles(&g);
    // Runs of consecutive tiles, several per thread (this VM's threads are not equally
    // fast), each with its tiles' sums.
    let runs = (4 * rayon::current_num_threads()).clamp(1, tiles.len());
    let per_run = tiles.len().div_ceil(runs);
    let mut sums: Vec<Vec<f32>> = tiles
        .chunks(per_run)
        .map(|run| vec![0f32; run.iter().map(|&(_, nb, _)| tile_sums(nb, k)).sum()])
        .collect();
    // The images in batches of at most `batch_bytes` padded and re-laid (32 MiB: all of a
    // GAN's or the Fashion CNN's batch at once, large images a few at a time); within a
    // batch, each run walks chunks of images whose output gradients (four lane-blocks)
    // fill 256 KiB, kept in cache while the run's tiles go over them.
    let batch = (batch_bytes / (4 * (image + dy_image))).clamp(1, b);
    let chunk = (256 * 1024 / (layout.oh * layout.steps * 4 * LANES * 4)).clamp(1, batch);
    let mut padded = crate::scratch::take(batch * image);
    let mut dyt = crate::scratch::take(batch * dy_image);
    for m0 in (0..b).step_by(batch) {
        let imgs = batch.min(b - m0);
        // The batch's images padded and its output gradients re-laid, image by image in
        // parallel.
        let (padded, dyt) = (&mut padded[..imgs * image], &mut dyt[..imgs * dy_image]);
        padded
            .par_chunks_mut(image)
            .zip(x[m0 * chw..(m0 + imgs) * chw].par_chunks(chw))
            .for_each(|(out, img)| match arith {
                Arith::F32 => pad_into(img, (c, h, w), [p; 4], out),
                Arith::Bf16 => pad_phases(img, (c, h, w), (p, s), &layout, out),
            });
        dyt.par_chunks_mut(dy_image)
            .zip(dy[m0 * ohw..(m0 + imgs) * ohw].par_chunks(ohw))
            .for_each(|(out, img)| relay_output_gradients(img, (o, oh, ow), &layout, out));
        let (padded, dyt) = (&*padded, &*dyt);
        tiles
            .par_chunks(per_run)
            .zip(sums.par_iter_mut())
            .for_each(|(run, sums)| {
                for n0 in (0..imgs).step_by(chunk) {
                    let n1 = (n0 + chunk).min(imgs);
                    let mut at = 0;
                    for &(j0, nb, row0) in run {
                        let acc = &mut sums[at..at + tile_sums(nb, k)];
                        at += tile_sums(nb, k);
                        let tile = WeightTile {
                            x: &padded[n0 * image..n1 * image],
                            dy: &dyt[n0 * dy_image..n1 * dy_image],
                            layout: &layout,
                            rows: c * k,
                            row0,
                            j0,
                        };
                        #[cfg(target_arch = "x86_64")]
                        // SAFETY: the CPU has AVX-512F, and AVX512-BF16 for bf16 (asserted
                        // above); `WeightTile::offsets` (in the kernel) bounds every read.
                        unsafe {
                            match arith {
                                Arith::F32 => x86::weight(&tile, k, nb, acc),
                                Arith::Bf16 => x86::weight_pairs(&tile, k, nb, acc),
                            }
                        }
                    }
                }
            });
    }
    crate::scratch::give(padded);
    crate::scratch::give(dyt);
    place_sums(&g, tiles.chunks(per_run).zip(sums.iter().map(Vec::as_slice)))
}

/// Values of one weight-gradient tile's sums (`[row, kx, block, lane]`) for `nb`
/// lane-blocks of a `k × k` kernel.
const fn tile_sums(nb: usize, k: usize) -> usize {
    weight_rows(nb, k) * k * nb * LANES
}

/// The weight gradient `[o, c, k, k]` of `g` from its tiles' sums: `runs` pairs each run
/// of tiles with its sums, tile after tile ([`tile_sums`] each); tap rows past `c · k` (a
/// last tile's repeats) dropped.
fn place_sums<'a>(
    g: &Geometry,
    runs: impl Iterator<Item = (&'a [(usize, usize, usize)], &'a [f32])>,
) -> Vec<f32> {
    let Geometry { o, c, k, .. } = *g;
    let mut dw = vec![0f32; o * c * k * k];
    for (run, sums) in runs {
        let mut at = 0;
        for &(j0, nb, row0) in run {
            let acc = &sums[at..at + tile_sums(nb, k)];
            at += tile_sums(nb, k);
            for r in 0..weight_rows(nb, k) {
                let t = row0 + r;
                if t >= c * k {
                    break;
                }
                let (ch, ky) = (t / k, t % k);
                for kx in 0..k {
                    for j in 0..nb {
                        let lanes = &acc[((r * k + kx) * nb + j) * LANES..][..LANES];
                        for (lane, &v) in lanes.iter().enumerate() {
                            let oc = (j0 + j) * LANES + lane;
                            if oc < o {
                                dw[((oc * c + ch) * k + ky) * k + kx] = v;
                            }
                        }
                    }
                }
            }
        }
    }
    dw
}

/// One image (`[c, h, w]`) padded by `p` on every side, rounded to bf16 and split by the
/// stride `s`'s column phases as [`WeightLayout`] lays them out for pairs, into `out` (the image's words,
/// every one written).
fn pad_phases(
    img: &[f32],
    (c, h, w): (usize, usize, usize),
    (p, s): (usize, usize),
    l: &WeightLayout,
    out: &mut [f32],
) {
    let hp = h + 2 * p;
    // A padded row is `s` phase rows of `wq`.
    let wq = l.tap_row / s;
    // SAFETY: a word is two u16; any bits are a valid u16.
    let out = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u16>(), 2 * out.len()) };
    assert!(img.len() == c * h * w && out.len() == l.image && l.plane == hp * s * wq);
    // The whole image rounded at once (vectorised), then its rows placed.
    let mut rounded = crate::scratch::take((c * h * w).div_ceil(2));
    // SAFETY: as above.
    let bits = unsafe { std::slice::from_raw_parts_mut(rounded.as_mut_ptr().cast::<u16>(), c * h * w) };
    crate::bf16::round_bits(img, bits);
    #[cfg(target_arch = "x86_64")]
    let split = x86::PhaseSplit::new(w, p, s, wq);
    for (plane, src) in out.chunks_mut(l.plane).zip(bits.chunks(h * w)) {
        for (yy, dst) in plane.chunks_mut(s * wq).enumerate() {
            if yy < p || yy >= p + h {
                dst.fill(0);
                continue;
            }
            let row = &src[(yy - p) * w..][..w];
            #[cfg(target_arch = "x86_64")]
            if let Some(split) = &split {
                // SAFETY: `PhaseSplit::new` gives one only where the CPU has AVX512BW.
                unsafe { split.row(row, dst) };
                continue;
            }
            for (phase, d) in dst.chunks_mut(wq).enumerate() {
                for (i, v) in d.iter_mut().enumerate() {
                    *v = (i * s + phase)
                        .checked_sub(p)
                        .and_then(|col| row.get(col))
                        .copied()
                        .unwrap_or(0);
                }
            }
        }
    }
    crate::scratch::give(rounded);
}

/// One image's output gradients (`[o, oh, ow]`) re-laid as `l` says into `out` (its
/// words, every one written): channels-last ([`x86::channels_last`]), and for pairs the
/// rows' consecutive positions rounded and paired.
fn relay_output_gradients(
    img: &[f32],
    (o, oh, ow): (usize, usize, usize),
    l: &WeightLayout,
    out: &mut [f32],
) {
    let (positions, ob) = (oh * ow, l.ob);
    if !l.pairs {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the CPU has AVX-512F (`weight_gradient_in` asserts it).
        unsafe {
            x86::channels_last(img, (o, positions, ob), out)
        }
        return;
    }
    let mut last = crate::scratch::take(positions * ob);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as above.
    unsafe {
        x86::channels_last(img, (o, positions, ob), &mut last)
    }
    // SAFETY: f32 and u32 have the same size and alignment; any bits are a valid u32.
    let words = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u32>(), out.len()) };
    let zeros = vec![0f32; ob];
    for (y, dst) in words[..oh * l.steps * ob].chunks_mut(l.steps * ob).enumerate() {
        for (m, d) in dst.chunks_mut(ob).enumerate() {
            let q = y * ow + 2 * m;
            let hi = if 2 * m + 1 < ow {
                &last[(q + 1) * ob..][..ob]
            } else {
                &zeros[..]
            };
            crate::bf16::pair_into(&last[q * ob..][..ob], hi, d);
        }
    }
    crate::scratch::give(last);
}

/// Splits `n` positions (or lane-blocks) into the fewest tiles of at most `max`, as even
/// as can be: a row of 7 on 6-wide tiles is 4 + 3, not 6 + 1 (a one-wide tile runs at a
/// fraction of the rate).
fn tiles(n: usize, max: usize) -> impl Iterator<Item = (usize, usize)> {
    let count = n.div_ceil(max);
    let (base, extra) = (n / count, n % count);
    (0..count).map(move |i| (i * base + i.min(extra), base + usize::from(i < extra)))
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{tiles, weight_rows, Pass, WeightTile, LANES};
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    /// Lane-blocks of output channels per tile, and output positions per tile: 21
    /// accumulators, 3 weight vectors and a broadcast in the 32 registers (4 × 7 spilled).
    const BLOCKS: usize = 3;
    const POSITIONS: usize = 7;

    /// Every tile of one image: lane-blocks of output channels at most [`BLOCKS`] at a
    /// time, each output row in tiles of at most [`POSITIONS`]; f32 words.
    ///
    /// # Safety
    /// The CPU has AVX-512F; `run`'s asserts hold.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn image(pass: &Pass, padded: &[f32], packed: &[f32], y: &mut [MaybeUninit<f32>]) {
        image_in::<false>(pass, padded, packed, y)
    }

    /// [`image`] on bf16 pairs ([`super::Arith::Bf16`]).
    ///
    /// # Safety
    /// The CPU has AVX-512F and AVX512-BF16; `run`'s asserts hold.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn image_pairs(
        pass: &Pass,
        padded: &[f32],
        packed: &[f32],
        y: &mut [MaybeUninit<f32>],
    ) {
        image_in::<true>(pass, padded, packed, y)
    }

    /// [`image`]'s body, on f32 words or (`PAIRS`) bf16 pairs: inlined into the two entry
    /// points above, each compiled for its own instructions (the f32 one must run on
    /// AVX-512 CPUs without AVX512-BF16).
    #[inline(always)]
    unsafe fn image_in<const PAIRS: bool>(
        pass: &Pass,
        padded: &[f32],
        packed: &[f32],
        y: &mut [MaybeUninit<f32>],
    ) {
        // Lane-blocks split as evenly as positions: 4 blocks as 2 + 2, not 3 + 1.
        for (b0, nb) in tiles(pass.out_c.div_ceil(LANES), BLOCKS) {
            for r in 0..pass.rows {
                for (q0, t) in tiles(pass.cols, POSITIONS) {
                    let at = Tile { b0, r, q0 };
                    // One monomorphised kernel per (blocks, positions): the accumulators
                    // must be a fixed set of registers.
                    macro_rules! dispatch {
                        ($($nb:literal => [$($t:literal),*]),*) => {
                            match (nb, t) {
                                $($(($nb, $t) => tile::<$nb, $t, PAIRS>(pass, padded, packed, at, y),)*)*
                                _ => unreachable!("tile {nb} x {t} beyond {BLOCKS} x {POSITIONS}"),
                            }
                        };
                    }
                    dispatch!(1 => [1, 2, 3, 4, 5, 6, 7], 2 => [1, 2, 3, 4, 5, 6, 7], 3 => [1, 2, 3, 4, 5, 6, 7])
                }
            }
        }
    }

    /// Where a tile lies: its first lane-block of output channels, its output row, its
    /// first position in that row.
    #[derive(Clone, Copy)]
    struct Tile {
        b0: usize,
        r: usize,
        q0: usize,
    }

    /// `NB` lane-blocks of output channels from `at.b0` by `NT` positions from `at.q0` of
    /// output row `at.r`: the whole reduction over `c_in · kh · kw` words in registers,
    /// then written out, channels past `out_c` dropped. Per word, an f32 FMA, or with
    /// `PAIRS` a `vdpbf16ps` (two channels' products added to each sum).
    #[inline(always)]
    unsafe fn tile<const NB: usize, const NT: usize, const PAIRS: bool>(
        pass: &Pass,
        padded: &[f32],
        packed: &[f32],
        at: Tile,
        y: &mut [MaybeUninit<f32>],
    ) {
        let (kh, kw, s) = (pass.kh, pass.kw, pass.step);
        let per = pass.c_in * kh * kw;
        let mut acc = [[_mm512_setzero_ps(); NT]; NB];
        let xp = padded.as_ptr();
        let wb = packed.as_ptr().add(at.b0 * per * LANES);
        // The tap rows that read input rows with values: the padding rows above and below
        // add nothing (as oneDNN skips them: 5–7 % of a 3 × 3 or 4 × 4 convolution's taps
        // on a 14 × 14 or 7 × 7 output).
        let top = at.r * s + pass.row_off;
        let live = pass.live_rows.0.saturating_sub(top).min(kh)..pass.live_rows.1.saturating_sub(top).min(kh);
        for ch in 0..pass.c_in {
            for dy in live.clone() {
                // The input row that tap row `dy` of this output row reads, from the tile's
                // first position's first tap.
                let row = xp.add(
                    (ch * pass.in_h + at.r * s + pass.row_off + dy) * pass.in_w + at.q0 * s + pass.col_off,
                );
                let wrow = wb.add((ch * kh + dy) * kw * LANES);
                for dx in 0..kw {
                    let mut wv = [_mm512_setzero_ps(); NB];
                    for (j, v) in wv.iter_mut().enumerate() {
                        *v = _mm512_loadu_ps(wrow.add(j * per * LANES + dx * LANES));
                    }
                    // Each broadcast feeds every block's accumulator at that position.
                    #[allow(clippy::needless_range_loop)]
                    for t in 0..NT {
                        let xv = _mm512_set1_ps(*row.add(t * s + dx));
                        for j in 0..NB {
                            acc[j][t] = if PAIRS {
                                dot_pairs(acc[j][t], wv[j], xv)
                            } else {
                                _mm512_fmadd_ps(wv[j], xv, acc[j][t])
                            };
                        }
                    }
                }
            }
        }
        let mut lane_values = [0f32; LANES];
        for (j, accs) in acc.iter().enumerate() {
            let ch0 = (at.b0 + j) * LANES;
            let live = pass.out_c.saturating_sub(ch0).min(LANES);
            for (t, &v) in accs.iter().enumerate() {
                _mm512_storeu_ps(lane_values.as_mut_ptr(), v);
                let pos = pass.out_base + at.r * pass.out_rs + (at.q0 + t) * pass.out_cs;
                for (lane, &value) in lane_values[..live].iter().enumerate() {
                    y.get_unchecked_mut((ch0 + lane) * pass.out_plane + pos)
                        .write(value);
                }
            }
        }
    }

    /// `acc` plus, lane by lane, the products of the two bf16 in each of `a`'s and `b`'s
    /// words (`vdpbf16ps`); `a` and `b` are the words' bits in f32 registers.
    ///
    /// # Safety
    /// The CPU has AVX512-BF16 (the function itself is compiled where it is inlined).
    #[inline(always)]
    unsafe fn dot_pairs(acc: __m512, a: __m512, b: __m512) -> __m512 {
        _mm512_dpbf16_ps(
            acc,
            std::mem::transmute::<__m512, __m512bh>(a),
            std::mem::transmute::<__m512, __m512bh>(b),
        )
    }

    /// Splits rows of bf16 by column phase in registers ([`super::pad_phases`]): a row of
    /// `w` values padded by `p` zeros on the left, phase `φ` of `s` taking its padded
    /// columns `φ`, `φ + s`, … as `wq` values (zeros outside the row). One masked load,
    /// and per phase a permutation and a masked store, where `w` and `wq` fit one vector
    /// of 32 (a value at a time, the split was a third as long as the weight gradient's
    /// kernel on the GAN critic).
    pub(super) struct PhaseSplit {
        index: [__m512i; 4],
        keep: [__mmask32; 4],
        w: usize,
        s: usize,
        wq: usize,
    }

    impl PhaseSplit {
        /// `None` where the rows are too wide, the stride is above 4, or the CPU lacks
        /// AVX512BW.
        pub(super) fn new(w: usize, p: usize, s: usize, wq: usize) -> Option<Self> {
            if w > 32 || wq > 32 || s > 4 || !std::arch::is_x86_feature_detected!("avx512bw") {
                return None;
            }
            let mut index = [[0i16; 32]; 4];
            let mut keep = [0u32; 4];
            for (phase, (index, keep)) in index.iter_mut().zip(&mut keep).take(s).enumerate() {
                for (i, lane) in index.iter_mut().enumerate().take(wq) {
                    if let Some(col) = (i * s + phase).checked_sub(p).filter(|&col| col < w) {
                        *lane = col as i16;
                        *keep |= 1 << i;
                    }
                }
            }
            Some(PhaseSplit {
                // SAFETY: 32 i16 are one 512-bit vector.
                index: index.map(|v| unsafe { std::mem::transmute::<[i16; 32], __m512i>(v) }),
                keep,
                w,
                s,
                wq,
            })
        }

        /// One row (`w` values) into `dst` (`s` phase rows of `wq`).
        ///
        /// # Safety
        /// The CPU has AVX512BW (as `new` checked).
        #[target_feature(enable = "avx512f,avx512bw")]
        pub(super) unsafe fn row(&self, src: &[u16], dst: &mut [u16]) {
            assert!(src.len() == self.w && dst.len() == self.s * self.wq);
            let first = |n: usize| if n >= 32 { u32::MAX } else { (1u32 << n) - 1 };
            let v = _mm512_maskz_loadu_epi16(first(self.w), src.as_ptr().cast());
            for phase in 0..self.s {
                let r = _mm512_maskz_permutexvar_epi16(self.keep[phase], self.index[phase], v);
                _mm512_mask_storeu_epi16(dst.as_mut_ptr().add(phase * self.wq).cast(), first(self.wq), r);
            }
        }
    }

    /// One image's output gradients (`[o, positions]`) channels-last into `out`
    /// (`[positions, ob]`, lanes past `o` zero): 16 × 16 blocks transposed in registers
    /// (a value at a time, this re-laying took as long as padding the images and was 2 %
    /// of the Fashion CNN step), the positions and channels past whole blocks one by one.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn channels_last(
        img: &[f32],
        (o, positions, ob): (usize, usize, usize),
        out: &mut [f32],
    ) {
        assert!(img.len() >= o * positions && out.len() >= positions * ob && ob >= o);
        let (whole, blocked) = (o / LANES * LANES, positions / 16 * 16);
        for c0 in (0..whole).step_by(LANES) {
            for p0 in (0..blocked).step_by(16) {
                let rows: [__m512; 16] =
                    std::array::from_fn(|i| _mm512_loadu_ps(img.as_ptr().add((c0 + i) * positions + p0)));
                for (j, column) in crate::bf16::transpose16(&rows).into_iter().enumerate() {
                    _mm512_storeu_ps(out.as_mut_ptr().add((p0 + j) * ob + c0), column);
                }
            }
            for pos in blocked..positions {
                for oc in c0..c0 + LANES {
                    out[pos * ob + oc] = img[oc * positions + pos];
                }
            }
        }
        for (pos, row) in out[..positions * ob].chunks_mut(ob).enumerate() {
            for oc in whole..o {
                row[oc] = img[oc * positions + pos];
            }
            row[o..].fill(0.0);
        }
    }

    /// Adds one tile's products over its chunk of images into `acc` (`[row, kx, block,
    /// lane]`, [`super::weight_rows`]`(nb, k)` rows): the kernel for `(nb, k)`, f32.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn weight(tile: &WeightTile, k: usize, nb: usize, acc: &mut [f32]) {
        weight_in::<false>(tile, k, nb, acc)
    }

    /// [`weight`] in bf16 pairs of positions.
    ///
    /// # Safety
    /// The CPU has AVX-512F and AVX512-BF16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn weight_pairs(tile: &WeightTile, k: usize, nb: usize, acc: &mut [f32]) {
        weight_in::<true>(tile, k, nb, acc)
    }

    /// [`weight`]'s dispatch, inlined into each entry point (as [`image_in`]).
    #[inline(always)]
    unsafe fn weight_in<const PAIRS: bool>(tile: &WeightTile, k: usize, nb: usize, acc: &mut [f32]) {
        macro_rules! dispatch {
            ($(($nb:literal, $k:literal)),*) => {
                match (nb, k) {
                    $(($nb, $k) => weight_tile::<$nb, $k, { weight_rows($nb, $k) }, PAIRS>(tile, acc),)*
                    _ => unreachable!("weight-gradient tile of {nb} blocks, {k} taps"),
                }
            };
        }
        dispatch!((1, 3), (2, 3), (3, 3), (4, 3), (1, 4), (2, 4), (3, 4), (4, 4))
    }

    /// `NB` lane-blocks of output channels by `R` tap rows of `K` taps: the sums in
    /// registers over every step (position, or pair of positions with `PAIRS`) of the
    /// chunk, loaded from and stored back to `acc`.
    #[inline(always)]
    unsafe fn weight_tile<const NB: usize, const K: usize, const R: usize, const PAIRS: bool>(
        tile: &WeightTile,
        acc: &mut [f32],
    ) {
        assert!(acc.len() >= R * K * NB * LANES);
        let rows: [usize; R] = tile.offsets(K, NB);
        let l = tile.layout;
        // Each tap's input offset from its step's (f32: the tap itself, a constant).
        let taps: [usize; K] = std::array::from_fn(|kx| if PAIRS { l.taps[kx] } else { kx });
        let mut sums = [[[_mm512_setzero_ps(); NB]; K]; R];
        for (r, row) in sums.iter_mut().enumerate() {
            for (kx, blocks) in row.iter_mut().enumerate() {
                for (j, v) in blocks.iter_mut().enumerate() {
                    *v = _mm512_loadu_ps(acc.as_ptr().add(((r * K + kx) * NB + j) * LANES));
                }
            }
        }
        // The inputs as f32, or as bf16 whose pairs are read as one word.
        let (xf, xh) = (tile.x.as_ptr(), tile.x.as_ptr().cast::<u16>());
        let broadcast = |at: usize| {
            if PAIRS {
                _mm512_castsi512_ps(_mm512_set1_epi32(xh.add(at).cast::<i32>().read_unaligned()))
            } else {
                _mm512_set1_ps(*xf.add(at))
            }
        };
        for n in 0..tile.images() {
            let di = tile.dy.as_ptr().add(n * l.dy_words() + tile.j0 * LANES);
            for y in 0..l.oh {
                let xrow = n * l.image + y * l.out_row;
                let drow = di.add(y * l.steps * l.ob);
                for q in 0..l.steps {
                    let d = drow.add(q * l.ob);
                    let mut dv = [_mm512_setzero_ps(); NB];
                    for (j, v) in dv.iter_mut().enumerate() {
                        *v = _mm512_loadu_ps(d.add(j * LANES));
                    }
                    let xq = xrow + q * l.step;
                    for (r, row) in sums.iter_mut().enumerate() {
                        let xr = xq + rows[r];
                        for (kx, blocks) in row.iter_mut().enumerate() {
                            // Each broadcast input feeds every block's sum for that tap.
                            let xv = broadcast(xr + taps[kx]);
                            for (j, v) in blocks.iter_mut().enumerate() {
                                *v = if PAIRS {
                                    dot_pairs(*v, dv[j], xv)
                                } else {
                                    _mm512_fmadd_ps(dv[j], xv, *v)
                                };
                            }
                        }
                    }
                }
            }
        }
        for (r, row) in sums.iter().enumerate() {
            for (kx, blocks) in row.iter().enumerate() {
                for (j, v) in blocks.iter().enumerate() {
                    _mm512_storeu_ps(acc.as_mut_ptr().add(((r * K + kx) * NB + j) * LANES), *v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls `f(x index, weight index, output index)` for every multiply-add of the
    /// convolution `g` by its definition (taps in the padding skipped).
    fn each_product(g: &Geometry, mut f: impl FnMut(usize, usize, usize)) {
        for n in 0..g.b {
            for oc in 0..g.o {
                for oy in 0..g.oh {
                    for ox in 0..g.ow {
                        let out = ((n * g.o + oc) * g.oh + oy) * g.ow + ox;
                        for ch in 0..g.c {
                            for ky in 0..g.k {
                                for kx in 0..g.k {
                                    let iy = (oy * g.stride + ky) as isize - g.padding as isize;
                                    let ix = (ox * g.stride + kx) as isize - g.padding as isize;
                                    if iy < 0 || ix < 0 || iy >= g.h as isize || ix >= g.w as isize {
                                        continue;
                                    }
                                    let input = ((n * g.c + ch) * g.h + iy as usize) * g.w + ix as usize;
                                    f(input, ((oc * g.c + ch) * g.k + ky) * g.k + kx, out);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The convolution by its definition, in f64.
    fn reference(x: &[f32], wt: &[f32], g: &Geometry) -> Vec<f32> {
        let mut out = vec![0f64; g.b * g.o * g.oh * g.ow];
        each_product(g, |i, k, o| out[o] += f64::from(x[i]) * f64::from(wt[k]));
        out.into_iter().map(|v| v as f32).collect()
    }

    /// The input gradient by its definition, in f64: the adjoint of [`reference`].
    fn reference_input_gradient(dy: &[f32], wt: &[f32], g: &Geometry) -> Vec<f32> {
        let mut dx = vec![0f64; g.b * g.c * g.h * g.w];
        each_product(g, |i, k, o| dx[i] += f64::from(dy[o]) * f64::from(wt[k]));
        dx.into_iter().map(|v| v as f32).collect()
    }

    /// The weight gradient by its definition, in f64.
    fn reference_weight_gradient(x: &[f32], dy: &[f32], g: &Geometry) -> Vec<f32> {
        let mut dw = vec![0f64; g.o * g.c * g.k * g.k];
        each_product(g, |i, k, o| dw[k] += f64::from(x[i]) * f64::from(dy[o]));
        dw.into_iter().map(|v| v as f32).collect()
    }

    /// Every value of `got` within 1e-4 (relative, above 1) of `want`'s.
    fn assert_close(got: &[f32], want: &[f32], g: &Geometry) {
        assert_eq!(got.len(), want.len());
        for (j, (a, b)) in got.iter().zip(want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                "{g:?} value {j}: {a} against {b}"
            );
        }
    }

    fn geometry(
        b: usize,
        c: usize,
        hw: (usize, usize),
        o: usize,
        k: usize,
        stride: usize,
        padding: usize,
    ) -> Geometry {
        let (h, w) = hw;
        Geometry {
            b,
            c,
            h,
            w,
            o,
            k,
            stride,
            padding,
            oh: (h + 2 * padding - k) / stride + 1,
            ow: (w + 2 * padding - k) / stride + 1,
        }
    }

    /// Whether this CPU lacks AVX-512 (the direct kernels' tests then check nothing, and say so).
    fn skipped_without_avx512() -> bool {
        let skipped = !cpu_has_avx512();
        if skipped {
            eprintln!("no AVX-512 on this CPU: the direct convolution does not run here");
        }
        skipped
    }

    /// Deterministic values in [-1, 1).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn tiles_cover_a_row_evenly() {
        let all = |n, max| tiles(n, max).collect::<Vec<_>>();
        assert_eq!(all(7, 6), vec![(0, 4), (4, 3)]);
        assert_eq!(all(14, 7), vec![(0, 7), (7, 7)]);
        assert_eq!(all(28, 6), vec![(0, 6), (6, 6), (12, 6), (18, 5), (23, 5)]);
        assert_eq!(all(3, 7), vec![(0, 3)]);
    }

    /// The passes' coverage check (the output buffers are not zero-filled: every value must
    /// be written): a whole plane passes, a missing row, a position written twice and one
    /// outside the plane do not; the `s²` phases of a stride-2 transposed pass cover it.
    #[test]
    fn passes_must_write_every_output_value() {
        let pass = |rows, cols, out_base, out_rs, out_cs| Pass {
            c_in: 1,
            in_h: 8,
            in_w: 8,
            kh: 1,
            kw: 1,
            step: 1,
            row_off: 0,
            col_off: 0,
            live_rows: (0, 8),
            out_c: 2,
            rows,
            cols,
            out_plane: 4 * 6,
            out_base,
            out_rs,
            out_cs,
        };
        let one = |p: Pass| vec![(p, Vec::new())];
        assert!(covers(&one(pass(4, 6, 0, 6, 1)), 2 * 24));
        assert!(
            !covers(&one(pass(4, 6, 0, 6, 1)), 3 * 24),
            "a third plane unwritten"
        );
        assert!(!covers(&one(pass(3, 6, 0, 6, 1)), 2 * 24), "a row unwritten");
        assert!(!covers(&one(pass(4, 6, 1, 6, 1)), 2 * 24), "past the plane");
        let phases: Vec<_> = [(0, 0), (0, 1), (1, 0), (1, 1)]
            .into_iter()
            .map(|(ry, rx)| (pass(2, 3, ry * 6 + rx, 12, 2), Vec::new()))
            .collect();
        assert!(covers(&phases, 2 * 24));
        assert!(!covers(&phases[..3], 2 * 24), "a phase missing");
        let twice = [phases.clone(), phases[..1].to_vec()].concat();
        assert!(!covers(&twice, 2 * 24), "a phase written twice");
    }

    #[test]
    fn direct_convolutions_match_the_definition() {
        if skipped_without_avx512() {
            return;
        }
        // Strides 1 and 2, padding 0–2, output channels below, at and past a lane-block
        // and past four of them, rows of 1–15 positions (every tile width, remainders).
        let shapes = [
            geometry(2, 3, (9, 11), 5, 3, 1, 1),
            geometry(3, 4, (14, 14), 16, 4, 2, 1),
            geometry(2, 2, (13, 15), 70, 3, 2, 0),
            geometry(1, 5, (8, 8), 33, 2, 1, 0),
            geometry(2, 1, (28, 28), 8, 3, 2, 2),
            geometry(1, 3, (5, 30), 17, 5, 1, 2),
            geometry(2, 2, (6, 6), 9, 1, 1, 0),
        ];
        for (i, g) in shapes.iter().enumerate() {
            let x = values(g.b * g.c * g.h * g.w, i as u64);
            let wt = values(g.o * g.c * g.k * g.k, 100 + i as u64);
            // Unwritten values would show as NaN; odd channel counts pair the last
            // channel with zero in bf16.
            for (arith, want) in expected(&x, &wt, g, reference) {
                assert_close(&forward(&x, &wt, *g, arith), &want, g);
            }
        }
    }

    /// Each arithmetic this CPU runs the direct passes in, with what a pass of operands
    /// `a` and `b` must give by `reference`: f32, and where the CPU has `vdpbf16ps` bf16,
    /// whose products are those of the rounded operands, summed in f32 (where it has not,
    /// bf16 is left out, and that is said).
    fn expected(
        a: &[f32],
        b: &[f32],
        g: &Geometry,
        reference: fn(&[f32], &[f32], &Geometry) -> Vec<f32>,
    ) -> Vec<(Arith, Vec<f32>)> {
        let mut all = vec![(Arith::F32, reference(a, b, g))];
        if crate::bf16::avx512_bf16() {
            all.push((Arith::Bf16, reference(&rounded(a), &rounded(b), g)));
        } else {
            eprintln!("no AVX512-BF16: the bf16 direct passes do not run here");
        }
        all
    }

    /// `v` rounded to bf16 and widened back.
    fn rounded(v: &[f32]) -> Vec<f32> {
        v.iter()
            .map(|&x| crate::bf16::widen(crate::bf16::round(x)))
            .collect()
    }

    #[test]
    fn direct_input_gradients_match_the_definition() {
        if skipped_without_avx512() {
            return;
        }
        // Strides 1–3 (every phase, phases no tap reaches: k 1 or 2 at stride 3),
        // padding 0–2, input sizes not a multiple of the stride, channels past a block.
        let shapes = [
            geometry(2, 5, (9, 11), 3, 3, 1, 1),
            geometry(2, 17, (14, 14), 6, 4, 2, 1),
            geometry(2, 20, (13, 15), 4, 3, 2, 0),
            geometry(1, 33, (8, 8), 5, 2, 1, 0),
            geometry(2, 3, (28, 27), 8, 3, 2, 2),
            geometry(1, 18, (10, 12), 3, 2, 3, 1),
            geometry(1, 4, (7, 9), 2, 1, 3, 0),
            geometry(2, 9, (11, 10), 7, 5, 3, 2),
        ];
        for (i, g) in shapes.iter().enumerate() {
            let dy = values(g.b * g.o * g.oh * g.ow, 200 + i as u64);
            let wt = values(g.o * g.c * g.k * g.k, 300 + i as u64);
            for (arith, want) in expected(&dy, &wt, g, reference_input_gradient) {
                assert_close(&backward_input(&dy, &wt, *g, arith), &want, g);
            }
        }
    }

    #[test]
    fn direct_weight_gradients_match_the_definition() {
        if skipped_without_avx512() {
            return;
        }
        // 3 × 3 and 4 × 4, strides 1 and 2, padding 0–2; output channels below, at and
        // past a lane-block and past four of them (every tile width 1–4); tap rows not a
        // multiple of a tile's (a last tile's repeated rows); more images than a chunk;
        // batches of one image, of three, and all at once.
        let shapes = [
            geometry(2, 5, (9, 11), 70, 3, 1, 1),
            geometry(3, 6, (14, 14), 16, 4, 2, 1),
            geometry(2, 7, (13, 15), 40, 3, 2, 0),
            geometry(40, 9, (12, 12), 9, 3, 1, 2),
            geometry(2, 11, (8, 9), 33, 4, 1, 2),
            geometry(1, 13, (7, 7), 64, 3, 1, 1),
            geometry(3, 8, (15, 13), 20, 4, 2, 2),
            geometry(2, 3, (10, 7), 24, 3, 2, 1),
            // Rows wider than one vector of 32 bf16 (split by phase a value at a time).
            geometry(1, 4, (6, 40), 16, 3, 2, 1),
        ];
        for (i, g) in shapes.iter().enumerate() {
            let x = values(g.b * g.c * g.h * g.w, 400 + i as u64);
            let dy = values(g.b * g.o * g.oh * g.ow, 500 + i as u64);
            let per_image = 4
                * (g.c * (g.h + 2 * g.padding) * (g.w + 2 * g.padding)
                    + g.oh * g.ow * g.o.div_ceil(LANES) * LANES);
            // In bf16, odd rows' last positions paired with zero.
            for (arith, want) in expected(&x, &dy, g, reference_weight_gradient) {
                let all_at_once = weight_gradient(&x, &dy, *g, arith);
                assert_close(&all_at_once, &want, g);
                // The same bits on one thread and on three as on the default pool.
                for threads in [1, 3] {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .unwrap();
                    let dw = pool.install(|| weight_gradient(&x, &dy, *g, arith));
                    assert!(
                        dw == all_at_once,
                        "{g:?} {arith:?}: {threads} threads changed the sums"
                    );
                }
                // `weight_gradient`'s 32 MiB take each test shape in one batch.
                for batch_bytes in [1, 3 * per_image] {
                    let dw = weight_gradient_in(&x, &dy, *g, arith, batch_bytes);
                    // Each sum runs over the images in order whatever the batches: the
                    // same bits.
                    assert!(
                        dw == all_at_once,
                        "{g:?} {arith:?}: batches of {batch_bytes} bytes changed the sums"
                    );
                }
            }
        }
    }

    #[test]
    fn only_kernels_larger_than_one_with_enough_channels_go_direct() {
        let g = geometry(1, 16, (8, 8), 32, 3, 1, 1);
        assert!(suits(&g) && suits(&Geometry { o: 8, ..g }));
        assert!(!suits(&Geometry { c: 3, ..g }));
        assert!(!suits(&Geometry { k: 1, ..g }));
        assert!(!suits(&Geometry { o: 7, ..g }));
        // The input gradient: input channels across the lanes, o·⌈k/s⌉² per phase.
        let critic = geometry(1, 64, (14, 14), 128, 4, 2, 1);
        assert!(suits_input_gradient(&critic));
        assert!(!suits_input_gradient(&Geometry { c: 1, ..critic }));
        assert!(
            !suits_input_gradient(&Geometry { o: 31, ..critic })
                && suits_input_gradient(&Geometry { o: 32, ..critic })
        );
        // The weight gradient: 3 × 3 or 4 × 4, enough tiles (the Fashion CNN's first
        // convolution, one input channel, is one tile).
        assert!(suits_weight_gradient(&critic));
        assert!(suits_weight_gradient(&geometry(64, 32, (14, 14), 64, 3, 1, 1)));
        assert!(!suits_weight_gradient(&geometry(64, 1, (28, 28), 32, 3, 1, 1)));
        assert!(!suits_weight_gradient(&Geometry { k: 5, ..critic }));
        assert!(!suits_weight_gradient(&Geometry { o: 7, ..critic }));
    }
}
