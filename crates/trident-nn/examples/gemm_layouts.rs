//! GEMM throughput on MiniLM's feed-forward shapes (1024 tokens, 384 → 1536): candle's
//! matmul against Trident's `blas::gemm` (OpenBLAS when present, rows split over rayon) for
//! the forward product and both backward products.
//!
//! Then every product shape of a MiniLM encoder layer's training step (1024 tokens, hidden
//! 384, feed-forward 1536; forward, input gradient, weight gradient) through `blas::gemm`.
//!
//! The same three products in bf16 with f32 accumulation (`trident_nn::bf16::gemm`, AMX
//! where the CPU has it) follow, from f32 operands (rounded while packing) as the
//! mixed-precision linear layer uses them.
//!
//!     cargo run --release -p trident-nn --example gemm_layouts
//!     ONLY=bf16 cargo run …   # the bf16 products alone (for tuning or profiling them)

mod common;
use common::median_ms;

use candle_core::{Device, Tensor};
use trident_nn::bf16::{self, Operand};
use trident_nn::blas::{self, Mat};

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
    let f32_too = std::env::var("ONLY").map_or(true, |v| v != "bf16");
    if f32_too {
        f32_products(&x, &w, &g, &report)?;
    }
    let (xv, wv, gv) = (
        x.flatten_all()?.to_vec1::<f32>()?,
        w.flatten_all()?.to_vec1::<f32>()?,
        g.flatten_all()?.to_vec1::<f32>()?,
    );
    let (mut out, mut dx, mut dw) = (vec![0f32; m * n], vec![0f32; m * k], vec![0f32; n * k]);
    println!("bf16 kernel: {}", bf16::backend());
    let (xo, wo, go) = (
        Operand::F32(Mat::new(&xv, k)),
        Operand::F32(Mat::new(&wv, k)),
        Operand::F32(Mat::new(&gv, n)),
    );
    report(
        "bf16    x · wᵀ (forward)",
        median_ms(15, || bf16::gemm(m, n, k, xo, wo.t(), 0.0, &mut out)),
    );
    report(
        "bf16    g · w (input gradient)",
        median_ms(15, || bf16::gemm(m, k, n, go, wo, 0.0, &mut dx)),
    );
    report(
        "bf16    gᵀ · x (weight gradient)",
        median_ms(15, || bf16::gemm(n, k, m, go.t(), xo, 0.0, &mut dw)),
    );
    Ok(())
}

/// candle's and Trident's f32 products on the feed-forward shape, then every MiniLM shape.
fn f32_products(x: &Tensor, w: &Tensor, g: &Tensor, report: &impl Fn(&str, f64)) -> candle_core::Result<()> {
    let (m, k) = x.dims2()?;
    let n = w.dims2()?.0;
    let wt = w.t()?.contiguous()?;
    report(
        "candle  x · wᵀ (strided view)",
        median_ms(15, || drop(x.matmul(&w.t().unwrap()).unwrap())),
    );
    report(
        "candle  x · w' (contiguous [in, out])",
        median_ms(15, || drop(x.matmul(&wt).unwrap())),
    );
    let (xv, wv, gv) = (
        x.flatten_all()?.to_vec1::<f32>()?,
        w.flatten_all()?.to_vec1::<f32>()?,
        g.flatten_all()?.to_vec1::<f32>()?,
    );
    let mut out = vec![0f32; m * n];
    report(
        "trident x · wᵀ (forward)",
        median_ms(15, || {
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
        median_ms(15, || {
            blas::gemm(m, k, n, 1.0, Mat::new(&gv, n), Mat::new(&wv, k), 0.0, &mut dx)
        }),
    );
    let mut dw = vec![0f32; n * k];
    report(
        "trident gᵀ · x (weight gradient)",
        median_ms(15, || {
            blas::gemm(n, k, m, 1.0, Mat::new(&gv, n).t(), Mat::new(&xv, k), 0.0, &mut dw)
        }),
    );
    minilm_shapes();
    Ok(())
}

/// Every f32 product of a MiniLM encoder layer's training step at 1024 tokens, through
/// `blas::gemm` as the fused sublayers call it: (name, m, n, k, lhs transposed, rhs
/// transposed).
fn minilm_shapes() {
    let shapes = [
        ("forward q/k/v", 1024, 1152, 384, false, true),
        ("forward output projection", 1024, 384, 384, false, true),
        ("forward feed-forward 1", 1024, 1536, 384, false, true),
        ("forward feed-forward 2", 1024, 384, 1536, false, true),
        ("input gradient q/k/v", 1024, 384, 1152, false, false),
        ("input gradient output projection", 1024, 384, 384, false, false),
        ("input gradient feed-forward 1", 1024, 384, 1536, false, false),
        ("input gradient feed-forward 2", 1024, 1536, 384, false, false),
        ("weight gradient one projection", 384, 384, 1024, true, false),
        ("weight gradient q/k/v", 1152, 384, 1024, true, false),
        ("weight gradient feed-forward 1", 1536, 384, 1024, true, false),
        ("weight gradient feed-forward 2", 384, 1536, 1024, true, false),
    ];
    println!("MiniLM layer products through blas::gemm:");
    for (name, m, n, k, ta, tb) in shapes {
        let a: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 * 0.1).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 7) as f32 * 0.1).collect();
        // op(a) is m × k, op(b) k × n, each stored transposed when flagged.
        let am = if ta { Mat::new(&a, m).t() } else { Mat::new(&a, k) };
        let bm = if tb { Mat::new(&b, k).t() } else { Mat::new(&b, n) };
        let mut c = vec![0f32; m * n];
        let ms = median_ms(15, || blas::gemm(m, n, k, 1.0, am, bm, 0.0, &mut c));
        let gflops = 2.0 * (m * n * k) as f64 / ms / 1e6;
        println!("  {name:34} {m:4} x {n:4} x {k:4}  median {ms:6.2} ms  {gflops:6.1} GFLOP/s");
    }
}
