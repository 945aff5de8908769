//! The forward pass: padded images, the weight re-laid across the lanes, and the passes of
//! tiles over every image (shared with the input gradient, which runs the same passes).

use super::*;
use rayon::prelude::*;
use std::mem::MaybeUninit;

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

/// Runs `passes` (each with its packed weight) over each of the first `images` images of
/// `src` (`[c, h, w]` each, padded by `pads` as [`pad`] does), image `n` into the `n`-th
/// `out_per` values of the output; images in parallel on rayon's pool. The passes must
/// write every output value between them (each writes `out_c` planes of `rows × cols`
/// positions, `out_base` + `out_rs`/`out_cs` steps: one pass covers a plane, or the `s²`
/// phases of a transposed convolution do), which [`covers`] checks. In bf16 each image is
/// rounded and paired as it is padded ([`pad_pairs_into`]).
pub(super) fn run_images(
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
pub(super) fn covers(passes: &[(Pass, Vec<f32>)], out_per: usize) -> bool {
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
pub(super) fn pack_weight(
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
pub(super) fn pad_into(
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
