//! Batch norm throughput in training (`ops::batch_norm_train` and the fused
//! `ops::batch_norm_act_train`, forward and backward) on the shapes Trident's networks
//! train with: the DCGAN's three batch norms, the Fashion CNN's first, an EfficientNet-Lite0
//! expansion at 56 × 56. Medians of `RUNS` runs (default 31) after one warm-up; `ONLY=<text>`
//! keeps the shapes whose name contains it.
//!
//!     cargo run --release -p trident-nn --example norm_bench

mod common;
use common::median_ms;

use candle_core::{Device, Tensor, Var};
use trident_nn::ops::{self, Act};

fn main() -> candle_core::Result<()> {
    trident_nn::runtime::candle_on_one_thread();
    trident_nn::runtime::keep_freed_memory();
    let dev = Device::Cpu;
    let shapes: [(&str, [usize; 4], Option<Act>); 5] = [
        ("DCGAN generator bn0 + ReLU", [128, 128, 7, 7], Some(Act::Relu)),
        ("DCGAN generator bn1 + ReLU", [128, 64, 14, 14], Some(Act::Relu)),
        (
            "DCGAN critic bn2 + LeakyReLU",
            [128, 128, 7, 7],
            Some(Act::LeakyRelu),
        ),
        ("Fashion CNN bn1", [64, 32, 28, 28], None),
        (
            "EfficientNet expand 96 @56 + ReLU6",
            [32, 96, 56, 56],
            Some(Act::Relu6),
        ),
    ];
    let only = std::env::var("ONLY").unwrap_or_default();
    let runs: usize = std::env::var("RUNS").map_or(31, |v| v.parse().expect("RUNS: a count"));
    for (name, dims, act) in shapes.into_iter().filter(|s| s.0.contains(&only)) {
        let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, &dims, &dev)?)?;
        let g = Var::from_tensor(&Tensor::randn(1f32, 0.1, dims[1], &dev)?)?;
        let b = Var::from_tensor(&Tensor::randn(0f32, 0.1, dims[1], &dev)?)?;
        let norm = || match act {
            Some(act) => ops::batch_norm_act_train(&x, &g, &b, 1e-5, act).unwrap().0,
            None => ops::batch_norm_train(&x, &g, &b, 1e-5).unwrap().0,
        };
        let fwd = median_ms(runs, || drop(norm()));
        // Forward + backward (input, scale and shift gradients); the sum's own cost is small.
        let both = median_ms(runs, || drop(norm().sum_all().unwrap().backward().unwrap()));
        let mb = (dims.iter().product::<usize>() * 4) as f64 / 1e6;
        println!(
            "{name:36} {mb:5.1} MB  forward {fwd:6.2} ms | backward {:6.2} ms",
            both - fwd
        );
    }
    Ok(())
}
