//! Convolution throughput (`ops::conv2d` and `ops::conv_transpose2d`, forward and backward)
//! on the shapes Trident's networks train with: the Fashion CNN's two convolutions, the GAN
//! critic's stride-2 ones and the generator's transposed ones, the convolutional
//! autoencoder's four, EfficientNet-Lite0's 1 × 1 convolutions at 112 px; then each
//! gradient's backward pass alone: the input gradient of a frozen weight (as a critic's
//! while its generator trains), the weight gradient of an input outside the graph (a first
//! layer's images). Medians of `RUNS` runs (default 31) after one warm-up; `ONLY=<text>`
//! keeps the shapes whose name contains it.
//!
//!     cargo run --release -p trident-nn --example conv_bench

mod common;
use common::median_ms;

use candle_core::{Device, Tensor, Var};
use trident_nn::ops;

/// One convolution to time: input `[b, c, h, w]`, output channels, square kernel, stride,
/// padding, and whether it is a transposed convolution.
struct Shape {
    name: &'static str,
    input: [usize; 4],
    out: usize,
    k: usize,
    stride: usize,
    padding: usize,
    transposed: bool,
}

/// A convolution of `input` to `out` channels.
const fn conv(
    name: &'static str,
    input: [usize; 4],
    out: usize,
    k: usize,
    stride: usize,
    padding: usize,
) -> Shape {
    Shape {
        name,
        input,
        out,
        k,
        stride,
        padding,
        transposed: false,
    }
}

/// A transposed convolution of `input` to `out` channels.
const fn transposed(
    name: &'static str,
    input: [usize; 4],
    out: usize,
    k: usize,
    stride: usize,
    padding: usize,
) -> Shape {
    Shape {
        transposed: true,
        ..conv(name, input, out, k, stride, padding)
    }
}

const SHAPES: [Shape; 14] = [
    conv("CNN conv1", [64, 1, 28, 28], 32, 3, 1, 1),
    conv("CNN conv2", [64, 32, 14, 14], 64, 3, 1, 1),
    conv("GAN critic conv1", [128, 1, 28, 28], 64, 4, 2, 1),
    conv("GAN critic conv2", [128, 64, 14, 14], 128, 4, 2, 1),
    transposed("GAN generator up1 (transposed)", [128, 128, 7, 7], 64, 4, 2, 1),
    transposed("GAN generator up2 (transposed)", [128, 64, 14, 14], 1, 4, 2, 1),
    conv("conv autoencoder down1 1→32 @28", [128, 1, 28, 28], 32, 3, 2, 1),
    conv("conv autoencoder down2 32→64 @14", [128, 32, 14, 14], 64, 3, 2, 1),
    conv("conv autoencoder up1 64→32 @14", [128, 64, 14, 14], 32, 3, 1, 1),
    conv("conv autoencoder up2 32→1 @28", [128, 32, 28, 28], 1, 3, 1, 1),
    conv(
        "EfficientNet 1x1 expand 40→240 @14",
        [32, 40, 14, 14],
        240,
        1,
        1,
        0,
    ),
    conv("EfficientNet 1x1 project 480→80 @7", [32, 480, 7, 7], 80, 1, 1, 0),
    conv(
        "EfficientNet 1x1 head 320→1280 @4",
        [32, 320, 4, 4],
        1280,
        1,
        1,
        0,
    ),
    conv(
        "EfficientNet stem 3→32 k3 s2 @112",
        [32, 3, 112, 112],
        32,
        3,
        2,
        0,
    ),
];

fn main() -> candle_core::Result<()> {
    trident_nn::runtime::candle_on_one_thread();
    trident_nn::runtime::keep_freed_memory();
    println!("GEMM backend: {}", trident_nn::blas::backend());
    // PRECISION=bf16: every convolution created under bf16 autocast.
    let bf16 = std::env::var("PRECISION").is_ok_and(|p| p == "bf16");
    let _precision = trident_nn::bf16::autocast(bf16);
    if bf16 {
        println!("bf16 autocast: {}", trident_nn::bf16::mixed_precision());
    }
    let only = std::env::var("ONLY").unwrap_or_default();
    let runs: usize = std::env::var("RUNS").map_or(31, |v| v.parse().expect("RUNS: a count"));
    for shape in SHAPES.iter().filter(|s| s.name.contains(&only)) {
        bench(shape, runs)?;
    }
    Ok(())
}

/// Prints the median forward and backward times of `shape` over `runs` runs.
fn bench(shape: &Shape, runs: usize) -> candle_core::Result<()> {
    let &Shape {
        name,
        input: [b, c, h, w],
        out: o,
        k,
        stride: s,
        padding: p,
        transposed,
    } = shape;
    let dev = Device::Cpu;
    let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (b, c, h, w), &dev)?)?;
    // A transposed convolution's multiply-adds are those of the convolution it is the
    // input gradient of (from its output back to its input).
    let (wt, flop) = if transposed {
        let wt = Var::from_tensor(&Tensor::randn(0f32, 0.1, (c, o, k, k), &dev)?)?;
        (wt, 2.0 * (b * c * o * k * k * h * w) as f64)
    } else {
        let wt = Var::from_tensor(&Tensor::randn(0f32, 0.1, (o, c, k, k), &dev)?)?;
        let oh = (h + 2 * p - k) / s + 1;
        let ow = (w + 2 * p - k) / s + 1;
        (wt, 2.0 * (b * o * c * k * k * oh * ow) as f64)
    };
    let conv = |x: &Tensor, wt: &Tensor| {
        if transposed {
            ops::conv_transpose2d(x, wt, s, p).unwrap()
        } else {
            ops::conv2d(x, wt, s, p).unwrap()
        }
    };
    // The forward time is subtracted from the others: a slow first forward (a fresh
    // process's, before `median_ms` warmed up for long enough) made the gradients alone
    // come out impossibly fast.
    let (xd, wd) = (x.as_tensor().detach(), wt.as_tensor().detach());
    let fwd = median_ms(runs, || drop(conv(&x, &wt)));
    // Forward + backward of the gradients `x` and `wt` track; the sum's own cost is small.
    let backward = |x: &Tensor, wt: &Tensor| {
        median_ms(runs, || drop(conv(x, wt).sum_all().unwrap().backward().unwrap())) - fwd
    };
    let bwd = backward(&x, &wt);
    // The gradient passes alone: the weight outside the graph (a frozen critic's while its
    // generator trains) or the input (a first layer's images).
    let alone =
        |what: &str, x: &Tensor, wt: &Tensor| format!(" | {what} gradient alone {:7.2} ms", backward(x, wt));
    let frozen = alone("input", &x, &wd) + &alone("weight", &xd, &wt);
    println!(
        "{name:36} forward {fwd:7.2} ms {:6.1} GFLOP/s | backward {bwd:7.2} ms {:6.1} GFLOP/s{frozen}",
        flop / fwd / 1e6,
        2.0 * flop / bwd / 1e6
    );
    Ok(())
}
