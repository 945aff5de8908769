//! GEMM throughput on MiniLM's feed-forward shapes (1024 tokens, 384 → 1536): candle's
//! matmul against Trident's `blas::gemm` (OpenBLAS when present, rows split over rayon) for
//! the forward product and both backward products.
//!
//! The same three products in bf16 with f32 accumulation (`trident_nn::bf16::gemm`, AMX
//! where the CPU has it) follow, from f32 operands (rounded while packing) as the
//! mixed-precision linear layer uses them.
//!
//!     cargo run --release -p trident-nn --example gemm_layouts

use candle_core::{Device, Tensor};
use std::time::Instant;
use trident_nn::bf16::{self, Operand};
use trident_nn::blas::{self, Mat};

fn median_ms(mut f: impl FnMut()) -> f64 {
    f();
    let mut times: Vec<f64> = (0..15)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(|a, b| a.total_cmp(b));
    times[times.len() / 2]
}

fn main() -> candle_core::Result<()> {
    // As `trident train` runs: freed buffers are reused rather than unmapped.
    trident_nn::runtime::keep_freed_memory();
    let dev = Device::Cpu;
    let (m, k, n) = (1024, 384, 1536);
    let flop = 2.0 * (m * k * n) as f64;
    let report =
        |name: &str, ms: f64| println!("{name:44} median {ms:6.2} ms  {:6.1} GFLOP/s", flop / ms / 1e6);
    println!("GEMM backend: {}", blas::backend());
    let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
    let w = Tensor::randn(0f32, 1.0, (n, k), &dev)?; // PyTorch layout [out, in]
    let g = Tensor::randn(0f32, 1.0, (m, n), &dev)?;
    let wt = w.t()?.contiguous()?;
    report(
        "candle  x · wᵀ (strided view)",
        median_ms(|| drop(x.matmul(&w.t().unwrap()).unwrap())),
    );
    report(
        "candle  x · w' (contiguous [in, out])",
        median_ms(|| drop(x.matmul(&wt).unwrap())),
    );
    let (xv, wv, gv) = (
        x.flatten_all()?.to_vec1::<f32>()?,
        w.flatten_all()?.to_vec1::<f32>()?,
        g.flatten_all()?.to_vec1::<f32>()?,
    );
    let mut out = vec![0f32; m * n];
    report(
        "trident x · wᵀ (forward)",
        median_ms(|| {
            blas::gemm(
                m,
                n,
                k,
                1.0,
                Mat::new(&xv, k),
                Mat::new(&wv, k).t(),
                0.0,
                &mut out,
            )
        }),
    );
    let mut dx = vec![0f32; m * k];
    report(
        "trident g · w (input gradient)",
        median_ms(|| blas::gemm(m, k, n, 1.0, Mat::new(&gv, n), Mat::new(&wv, k), 0.0, &mut dx)),
    );
    let mut dw = vec![0f32; n * k];
    report(
        "trident gᵀ · x (weight gradient)",
        median_ms(|| blas::gemm(n, k, m, 1.0, Mat::new(&gv, n).t(), Mat::new(&xv, k), 0.0, &mut dw)),
    );
    println!("bf16 kernel: {}", bf16::backend());
    let (xo, wo, go) = (
        Operand::F32(Mat::new(&xv, k)),
        Operand::F32(Mat::new(&wv, k)),
        Operand::F32(Mat::new(&gv, n)),
    );
    report(
        "bf16    x · wᵀ (forward)",
        median_ms(|| bf16::gemm(m, n, k, xo, wo.t(), 0.0, &mut out)),
    );
    report(
        "bf16    g · w (input gradient)",
        median_ms(|| bf16::gemm(m, k, n, go, wo, 0.0, &mut dx)),
    );
    report(
        "bf16    gᵀ · x (weight gradient)",
        median_ms(|| bf16::gemm(n, k, m, go.t(), xo, 0.0, &mut dw)),
    );
    Ok(())
}
