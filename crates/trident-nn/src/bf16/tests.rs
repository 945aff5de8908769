//! The bf16 kernels against f32 references, in every layout and entry point.

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
