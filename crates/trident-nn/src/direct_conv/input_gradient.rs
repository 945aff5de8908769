//! The input gradient (a transposed convolution): per phase of the stride, a stride-1
//! convolution of the padded output gradients with that phase's flipped taps.

use super::*;

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
