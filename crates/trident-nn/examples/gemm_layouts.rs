//! GEMM throughput of candle's CPU matmul for a MiniLM-sized linear layer, with the weight
//! as stored by PyTorch (`[out, in]`, used transposed) and pre-transposed (`[in, out]`).
//!
//!     cargo run -p trident-nn --example gemm_layouts --profile release

use candle_core::{Device, Tensor};
use std::time::Instant;

fn main() -> candle_core::Result<()> {
    let dev = Device::Cpu;
    let (m, k, n) = (1024, 384, 1536);
    let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
    let w = Tensor::randn(0f32, 1.0, (n, k), &dev)?; // PyTorch layout
    let wt = w.t()?.contiguous()?; // [k, n]
    let flop = 2.0 * (m * k * n) as f64;
    for (name, f) in [
        (
            "x · wᵀ (strided view)",
            Box::new(|| x.matmul(&w.t()?)) as Box<dyn Fn() -> candle_core::Result<Tensor>>,
        ),
        ("x · w' (contiguous [in, out])", Box::new(|| x.matmul(&wt))),
        (
            "xᵀ · g (weight gradient)",
            Box::new(|| x.t()?.matmul(&x.matmul(&wt)?)),
        ),
    ] {
        f()?;
        let mut times = Vec::new();
        for _ in 0..15 {
            let t = Instant::now();
            f()?;
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let med = times[times.len() / 2];
        println!(
            "{name:32} median {:.2} ms  {:.1} GFLOP/s",
            med * 1e3,
            flop / med / 1e9
        );
    }
    Ok(())
}
