//! CPU sampling for what the profiler's spans cannot see: candle's own operations (inside
//! its backward pass too), autograd, gradient gathering, allocation and the thread pool.
//!
//! pprof (tikv's `pprof` crate) sends SIGPROF every 1/[`HZ`] s of the process's CPU time to
//! whichever thread is running and records its stack. Each sample is attributed to a
//! category by its innermost frame that names one (a GEMM library, a Trident module, a
//! candle module, rayon…). Samples whose innermost frame lies in libc, libgcc, libpthread
//! or the vDSO are dropped by pprof itself (unwinding from there can deadlock in a signal
//! handler), so `memset`/`memcpy` time is not attributed; the report says how many samples
//! were kept.

use serde::Serialize;
use std::collections::HashMap;

/// Samples per second of CPU time (a prime, so the timer does not beat with the loop).
pub const HZ: i32 = 199;

/// Where the samples of one category went.
#[derive(Debug, Clone, Serialize)]
pub struct SampleRow {
    /// What the samples were doing.
    pub category: String,
    /// Samples.
    pub samples: u64,
    /// Share of all kept samples.
    pub share: f64,
    /// The innermost symbol seen most often in this category.
    pub top_symbol: String,
}

/// A running sampler.
pub struct Sampler {
    guard: pprof::ProfilerGuard<'static>,
}

impl Sampler {
    /// Starts sampling every thread of the process; `None` (with the reason) when the
    /// profiler cannot start, e.g. because another one runs.
    pub fn start() -> Result<Sampler, String> {
        pprof::ProfilerGuardBuilder::default()
            .frequency(HZ)
            .blocklist(&["libc", "libgcc", "pthread", "vdso"])
            .build()
            .map(|guard| Sampler { guard })
            .map_err(|e| e.to_string())
    }

    /// Stops sampling and attributes the samples, largest category first.
    pub fn finish(self) -> Result<Vec<SampleRow>, String> {
        let report = self.guard.report().build().map_err(|e| e.to_string())?;
        let stacks = report.data.iter().map(|(frames, &count)| {
            let names: Vec<String> = frames
                .frames
                .iter()
                .flat_map(|inlined| inlined.iter().map(|s| s.name()))
                .collect();
            (names, count.max(0) as u64)
        });
        Ok(attribute(stacks))
    }
}

/// Sums sample counts per category; `stacks` gives each distinct stack (innermost frame
/// first) with its count.
pub fn attribute(stacks: impl IntoIterator<Item = (Vec<String>, u64)>) -> Vec<SampleRow> {
    let mut by: HashMap<String, (u64, HashMap<String, u64>)> = HashMap::new();
    let mut total = 0u64;
    for (stack, count) in stacks {
        let (category, leaf) = category(&stack);
        let entry = by.entry(category).or_default();
        entry.0 += count;
        *entry.1.entry(leaf).or_default() += count;
        total += count;
    }
    let mut rows: Vec<SampleRow> = by
        .into_iter()
        .map(|(category, (samples, leaves))| SampleRow {
            category,
            samples,
            share: samples as f64 / total.max(1) as f64,
            top_symbol: leaves
                .into_iter()
                .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)))
                .map(|(s, _)| s)
                .unwrap_or_default(),
        })
        .collect();
    rows.sort_by(|a, b| {
        b.samples
            .cmp(&a.samples)
            .then_with(|| a.category.cmp(&b.category))
    });
    rows
}

/// The category of a stack (innermost frame first) and the frame that decided it.
pub fn category(stack: &[String]) -> (String, String) {
    let in_backward = stack
        .iter()
        .any(|s| s.contains("candle_core::backprop") || s.contains("Tensor::backward"));
    for s in stack {
        let found = if s.contains("sgemm") || s.contains("gemm_f32") || s.contains("gemm_common") {
            Some("f32 GEMM (OpenBLAS / gemm crate)")
        } else if s.contains("trident_nn::bf16") {
            Some("bf16 GEMM (AMX or AVX512-BF16, packing)")
        } else if s.contains("trident_nn::direct_conv") {
            Some("direct convolutions (AVX-512)")
        } else if s.contains("trident_nn::dense::Attention") {
            Some("attention core (scores, softmax, per-head products)")
        } else if s.contains("trident_nn::math") {
            Some("GELU / exp (trident_nn::math)")
        } else if s.contains("trident_nn::ops") {
            Some("Trident kernels: norms, softmax, losses, dropout")
        } else if s.contains("trident_nn::blocks")
            || s.contains("trident_nn::dense")
            || s.contains("trident_nn::scratch")
        {
            Some("Trident fused blocks: bias, residual, sums, buffers")
        } else if s.contains("trident_nn::params") {
            Some("gradient gathering (Params::gradient_into)")
        } else if s.contains("trident_train::optim") {
            Some("optimizer")
        } else if s.contains("trident_data") || s.contains("trident_cli::learn::task") {
            Some("data loading and collation")
        } else if s.contains("candle_core::backprop") {
            Some("candle autograd: graph walk, gradient sums")
        } else if s.contains("candle_core") || s.contains("candle_nn") {
            Some(if in_backward {
                "candle ops, in the backward pass"
            } else {
                "candle ops, forward"
            })
        } else if s.contains("rayon_core") || s.contains("crossbeam") {
            Some("thread pool: waiting, stealing, waking")
        } else if s.contains("malloc")
            || s.contains("__rust_alloc")
            || s.contains("__rust_dealloc")
            || s == "free"
        {
            Some("allocation")
        } else if s.contains("safetensors") || s.contains("trident_train::checkpoint") {
            Some("checkpoints")
        } else {
            None
        };
        if let Some(c) = found {
            return (c.to_string(), s.clone());
        }
    }
    (
        "other (no recognised frame)".to_string(),
        stack.first().cloned().unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(frames: &[&str]) -> Vec<String> {
        frames.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_innermost_recognised_frame_decides() {
        // GELU called from a fused block: math, not the block.
        let s = stack(&[
            "core::iter::traits::iterator::Iterator::for_each",
            "trident_nn::math::gelu_with_derivative_avx2",
            "trident_nn::blocks::Inner::forward",
        ]);
        assert_eq!(category(&s).0, "GELU / exp (trident_nn::math)");
        assert_eq!(category(&s).1, "trident_nn::math::gelu_with_derivative_avx2");
        // A candle op reached from the backward pass is told apart from a forward one.
        let bwd = stack(&[
            "candle_core::cpu_backend::utils::binary_map",
            "candle_core::tensor::Tensor::add",
            "candle_core::backprop::<impl candle_core::tensor::Tensor>::backward",
        ]);
        assert_eq!(category(&bwd).0, "candle ops, in the backward pass");
        let fwd = stack(&[
            "candle_core::cpu_backend::utils::binary_map",
            "trident_train::trainer::Run::micro_step",
        ]);
        assert_eq!(category(&fwd).0, "candle ops, forward");
        assert_eq!(
            category(&stack(&["sgemm_kernel_SKYLAKEX"])).0,
            "f32 GEMM (OpenBLAS / gemm crate)"
        );
        assert_eq!(
            category(&stack(&["0x7f00", "???"])).0,
            "other (no recognised frame)"
        );
        // A direct convolution's kernel runs inside rayon's loop over images: the kernel,
        // not the pool (it was counted as waiting: 32 % of an f32 WGAN's samples).
        let conv = stack(&[
            "trident_nn::direct_conv::tile",
            "rayon::iter::plumbing::bridge_producer_consumer::helper",
            "rayon_core::join::join_context",
        ]);
        assert_eq!(category(&conv).0, "direct convolutions (AVX-512)");
    }

    #[test]
    fn rows_sum_counts_and_shares_largest_first() {
        let rows = attribute([
            (stack(&["sgemm_kernel_SKYLAKEX"]), 30),
            (stack(&["sgemm_itcopy"]), 10),
            (stack(&["trident_train::optim::adamw"]), 10),
        ]);
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].samples, rows[0].share), (40, 0.8));
        assert_eq!(rows[0].top_symbol, "sgemm_kernel_SKYLAKEX");
        assert_eq!((rows[1].category.as_str(), rows[1].share), ("optimizer", 0.2));
    }
}
