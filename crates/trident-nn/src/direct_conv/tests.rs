//! The direct kernels against the definition of the convolution, in f64.

use super::forward::covers;
use super::weight_gradient::weight_gradient_in;
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
