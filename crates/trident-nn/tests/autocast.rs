//! The bf16 mixed-precision policy (`trident_nn::bf16::autocast`), op by op:
//! - linear layers multiply bf16-rounded operands with f32 sums, forward and backward, where
//!   the CPU multiplies bf16 faster than f32 (AMX), and keep f32 products elsewhere; an op
//!   keeps the precision it was created with for its backward pass;
//! - layer norm, softmax, GELU and cross-entropy are untouched (bit-identical);
//! - the fused transformer layer stays within bf16 rounding of its f32 result;
//! - the mode is scoped to its guard and to its thread.

use candle_core::{Device, Tensor, Var};
use trident_nn::bf16::{autocast, autocast_enabled, bf16_products, round, widen};
use trident_nn::math::max_abs_diff;
use trident_nn::transformer::{mask_bias, EncoderConfig, EncoderLayer};
use trident_nn::{dense, ops, Ctx, Params};

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

fn pattern(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919 + seed * 104729) % 1013) as f32 / 1013.0 - 0.5)
        .collect()
}

/// `a` `[m, k]` · `b` `[n, k]`ᵀ summed in f64, with both operands first passed through `f`.
fn product(a: &[f32], b: &[f32], m: usize, n: usize, k: usize, f: impl Fn(f32) -> f32) -> Vec<f32> {
    let mut out = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k)
                .map(|p| f(a[i * k + p]) as f64 * f(b[j * k + p]) as f64)
                .sum::<f64>() as f32;
        }
    }
    out
}

fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..rows * cols)
        .map(|i| v[(i % rows) * cols + i / rows])
        .collect()
}

fn bf16(x: f32) -> f32 {
    widen(round(x))
}

#[test]
fn linear_runs_in_bf16_where_it_pays_under_autocast_and_its_backward_keeps_the_mode() {
    let dev = Device::Cpu;
    // The forward product (depth k) and the weight gradient's (depth m) reach
    // bf16::MIN_BF16_DEPTH, so they run in bf16 where the CPU has bf16 arithmetic; the
    // input gradient's (depth n) stays f32 everywhere.
    let (m, k, n) = (260, 300, 45);
    let (xv, wv, pv) = (pattern(m * k, 1), pattern(n * k, 2), pattern(m * n, 3));
    let x = Var::from_vec(xv.clone(), (m, k), &dev).unwrap();
    let w = Var::from_vec(wv.clone(), (n, k), &dev).unwrap();
    let probe = Tensor::from_vec(pv.clone(), (m, n), &dev).unwrap();

    let exact = product(&xv, &wv, m, n, k, |v| v);
    let rounded = product(&xv, &wv, m, n, k, bf16);
    // The two references differ by far more than the tolerance used below.
    assert!(max_abs_diff(&exact, &rounded) > 1e-3);

    let y32 = dense::linear(x.as_tensor(), w.as_tensor(), None).unwrap();
    assert!(max_abs_diff(&values(&y32), &exact) < 1e-4, "f32 outside autocast");

    let y16 = {
        let _bf16 = autocast(true);
        dense::linear(x.as_tensor(), w.as_tensor(), None).unwrap()
    };
    assert!(!autocast_enabled(), "the guard restores f32");
    // Where bf16 products do not pay (no AMX or AVX512-BF16, both refused, or a short inner
    // dimension) they stay f32.
    let mode = |depth: usize| -> fn(f32) -> f32 {
        if bf16_products(depth) {
            bf16
        } else {
            |v| v
        }
    };
    let want = product(&xv, &wv, m, n, k, mode(k));
    assert!(
        max_abs_diff(&values(&y16), &want) < 1e-4,
        "bf16 products (f32 without bf16 arithmetic), f32 sums"
    );

    // The backward pass runs after the guard is gone, in the op's own precision: dx = p · w
    // and dw = pᵀ · x, each in bf16 where its depth qualifies.
    let grads = (&y16 * &probe).unwrap().sum_all().unwrap().backward().unwrap();
    let dx = values(grads.get(x.as_tensor()).unwrap());
    let dw = values(grads.get(w.as_tensor()).unwrap());
    let wt = transpose(&wv, n, k); // [k, n]
    let want_dx = product(&pv, &wt, m, k, n, mode(n));
    let (pt, xt) = (transpose(&pv, m, n), transpose(&xv, m, k)); // [n, m], [k, m]
    let want_dw = product(&pt, &xt, n, k, m, mode(m));
    assert!(max_abs_diff(&dx, &want_dx) < 1e-4, "input gradient");
    assert!(max_abs_diff(&dw, &want_dw) < 1e-4, "weight gradient");
    assert_eq!(grads.get(x.as_tensor()).unwrap().dtype(), candle_core::DType::F32);
}

#[test]
fn norms_softmax_gelu_and_losses_stay_f32() {
    let dev = Device::Cpu;
    let x = Tensor::from_vec(pattern(24 * 33, 4), (24, 33), &dev).unwrap();
    let gamma = Tensor::from_vec(pattern(33, 5), 33, &dev).unwrap();
    let beta = Tensor::from_vec(pattern(33, 6), 33, &dev).unwrap();
    let labels = Tensor::from_iter((0..24u32).map(|i| i % 33), &dev).unwrap();
    let run = || {
        [
            ops::layer_norm(&x, &gamma, &beta, 1e-5).unwrap(),
            ops::softmax_last_dim(&x).unwrap(),
            dense::gelu(&x).unwrap(),
            ops::cross_entropy(&x, &labels).unwrap(),
        ]
        .map(|t| values(&t))
    };
    let f32_run = run();
    let bf16_run = {
        let _bf16 = autocast(true);
        run()
    };
    assert_eq!(f32_run, bf16_run);
}

#[test]
fn autocast_is_scoped_and_per_thread() {
    assert!(!autocast_enabled());
    let outer = autocast(true);
    assert!(autocast_enabled());
    {
        let _inner = autocast(false);
        assert!(!autocast_enabled());
    }
    assert!(autocast_enabled(), "the inner guard restores the outer mode");
    let other = std::thread::spawn(autocast_enabled).join().unwrap();
    assert!(!other, "another thread keeps its own mode");
    drop(outer);
    assert!(!autocast_enabled());
}

/// The fused encoder layer (both norm placements) under autocast against the same layer in
/// f32: output, input gradient and every parameter gradient within bf16 rounding (a few
/// 2⁻⁸-relative errors compounded through seven products), and not identical.
#[test]
fn the_fused_transformer_layer_stays_within_bf16_rounding_of_f32() {
    for pre_norm in [false, true] {
        let params = Params::new();
        let c = EncoderConfig {
            hidden: 64,
            heads: 4,
            intermediate: 256,
            layers: 1,
            attention_dropout: 0.0,
            hidden_dropout: 0.0,
            eps: 1e-12,
            pre_norm,
            init_std: 0.1,
        };
        let layer = EncoderLayer::new(&params.builder(5, None).pp("layer"), &c).unwrap();
        let dev = Device::Cpu;
        let (b, s) = (4, 64);
        let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (b, s, 64), &dev).unwrap()).unwrap();
        let mask: Vec<f32> = (0..b * s)
            .map(|i| if i >= (b - 1) * s + 40 { 0.0 } else { 1.0 })
            .collect();
        let bias = mask_bias(&Tensor::from_vec(mask, (b, s), &dev).unwrap()).unwrap();
        let probe = Tensor::randn(0f32, 1.0, (b, s, 64), &dev).unwrap();
        let step = |bf16: bool| {
            let _mode = autocast(bf16);
            params.begin_step();
            let y = layer
                .forward(x.as_tensor(), Some(&bias), &Ctx::train(1, 1))
                .unwrap();
            let grads = (&y * &probe).unwrap().sum_all().unwrap().backward().unwrap();
            let mut all = vec![
                ("output".to_string(), values(&y)),
                (
                    "input gradient".to_string(),
                    values(grads.get(x.as_tensor()).unwrap()),
                ),
            ];
            for p in params.trainable() {
                let mut g = vec![0f32; p.var.elem_count()];
                assert!(params.gradient_into(&grads, &p, &mut g, false).unwrap());
                all.push((p.name, g));
            }
            all
        };
        let (full, mixed) = (step(false), step(true));
        let name = if pre_norm { "pre-norm" } else { "post-norm" };
        for ((what, a), (_, b)) in full.iter().zip(&mixed) {
            // The floor covers the key bias, whose gradient is zero up to rounding (softmax
            // does not see a shift shared by all keys).
            let scale = a.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-3);
            let diff = max_abs_diff(a, b);
            assert!(
                diff <= 0.03 * scale,
                "{name} {what}: difference {diff}, scale {scale}"
            );
            // The output, the input gradient and every projection's weight gradient pass
            // through bf16 products, or (without bf16 arithmetic) the gradients through
            // activations saved in bf16 while the output is computed from f32 values. (Some
            // bias and norm gradients are sums of the output gradient alone and equal in
            // both modes.)
            let rounded = what != "output" || bf16_products(c.intermediate);
            if rounded && !what.contains("LayerNorm") && !what.ends_with("bias") {
                assert!(diff > 0.0, "{name} {what}: bf16 gave exactly the f32 result");
            }
        }
    }
}

/// A convolution (`transposed` or not) of `x` by `w`, its output and the gradients of
/// `sum(output · probe)` for `x` and `w`, created under `autocast(bf16)`.
fn conv_and_grads(
    x: &[f32],
    xs: [usize; 4],
    w: &[f32],
    ws: [usize; 4],
    probe: &[f32],
    (transposed, stride, padding): (bool, usize, usize),
    bf16: bool,
) -> [Vec<f32>; 3] {
    let dev = Device::Cpu;
    let x = Var::from_vec(x.to_vec(), xs.to_vec(), &dev).unwrap();
    let w = Var::from_vec(w.to_vec(), ws.to_vec(), &dev).unwrap();
    let y = {
        let _mode = autocast(bf16);
        if transposed {
            ops::conv_transpose2d(x.as_tensor(), w.as_tensor(), stride, padding).unwrap()
        } else {
            ops::conv2d(x.as_tensor(), w.as_tensor(), stride, padding).unwrap()
        }
    };
    let probe = Tensor::from_vec(probe.to_vec(), y.shape(), &dev).unwrap();
    let grads = (&y * &probe).unwrap().sum_all().unwrap().backward().unwrap();
    [
        values(&y),
        values(grads.get(x.as_tensor()).unwrap()),
        values(grads.get(w.as_tensor()).unwrap()),
    ]
}

#[test]
fn convolutions_multiply_in_bf16_under_autocast_where_the_cpu_has_bf16_arithmetic() {
    // Shapes whose three products (forward, input gradient, weight gradient) are all deep
    // and wide enough for bf16 (ops::conv_bf16): a 3 × 3 convolution 32 → 64
    // channels on 14 × 14 (one image per product), a 4 × 4 stride-2 one 64 → 64 channels
    // on 14 × 14 (several images per product, read from their phase layouts), and a 4 × 4
    // stride-2 transposed one 64 → 32 channels from 7 × 7.
    for (how, xs, ws, ys) in [
        ((false, 1, 1), [2, 32, 14, 14], [64, 32, 3, 3], [2, 64, 14, 14]),
        ((false, 2, 1), [5, 64, 14, 14], [64, 64, 4, 4], [5, 64, 7, 7]),
        ((true, 2, 1), [4, 64, 7, 7], [64, 32, 4, 4], [4, 32, 14, 14]),
    ] {
        let transposed = how.0;
        let len = |s: [usize; 4]| s.iter().product::<usize>();
        let (xv, wv, pv) = (pattern(len(xs), 7), pattern(len(ws), 8), pattern(len(ys), 9));
        let f32_run = conv_and_grads(&xv, xs, &wv, ws, &pv, how, false);
        let bf16_run = conv_and_grads(&xv, xs, &wv, ws, &pv, how, true);
        // The reference for bf16 products with f32 sums: the f32 convolution of the rounded
        // input and weight, and its gradients for the rounded probe (each backward product
        // multiplies the rounded output gradient by a rounded operand).
        let r = |v: &[f32]| v.iter().map(|&v| bf16(v)).collect::<Vec<f32>>();
        let rounded_run = conv_and_grads(&r(&xv), xs, &r(&wv), ws, &r(&pv), how, false);
        let want = if ops::conv_bf16() { &rounded_run } else { &f32_run };
        for (what, i) in [("output", 0), ("input gradient", 1), ("weight gradient", 2)] {
            // The two references differ by far more than the tolerance.
            let apart = max_abs_diff(&f32_run[i], &rounded_run[i]);
            assert!(apart > 1e-3, "{what}: references too close ({apart})");
            let diff = max_abs_diff(&bf16_run[i], &want[i]);
            assert!(
                diff < 1e-4,
                "transposed {transposed}, stride {}, {what}: {diff} from the reference",
                how.1
            );
        }
    }
}
