//! The AVX-512 kernels of the direct passes: the tiles of the forward pass and input
//! gradient (f32, or bf16 channel pairs by `vdpbf16ps`), and those of the weight gradient.

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
pub(super) unsafe fn image_pairs(pass: &Pass, padded: &[f32], packed: &[f32], y: &mut [MaybeUninit<f32>]) {
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
            let row = xp
                .add((ch * pass.in_h + at.r * s + pass.row_off + dy) * pass.in_w + at.q0 * s + pass.col_off);
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
pub(super) unsafe fn channels_last(img: &[f32], (o, positions, ob): (usize, usize, usize), out: &mut [f32]) {
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
