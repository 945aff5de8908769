//! Trident's layers and models on candle.
//!
//! candle supplies tensors, GEMM and autograd; the hot operations whose candle versions
//! have no backward pass (layer norm, softmax, attention) or are slow unfused
//! (cross-entropy, dropout) are our own fused kernels in [`ops`]. Models own their
//! parameters through a [`Params`] store with seeded, per-name initialisation, so a run is
//! reproducible from its seed.
#![warn(missing_docs)]

/// Borrows a contiguous f32 tensor's elements for as long as the guard binding lives:
/// `let g; let v = view!(t, g, "what");` (the guard keeps the storage's read lock).
macro_rules! view {
    ($t:expr, $guard:ident, $what:expr) => {{
        let (s, l) = $t.storage_and_layout();
        $guard = s;
        $crate::kernel::cpu_slice(&$guard, l, $what)?
    }};
}

pub mod autoencoder;
pub mod bert;
pub mod bf16;
pub mod blas;
pub mod blocks;
mod ctx;
pub mod custom;
pub mod dense;
mod direct_conv;
pub mod efficientnet;
pub mod forecast;
pub mod gan;
mod kernel;
pub mod layers;
pub mod math;
pub mod ops;
pub mod params;
pub mod pca;
pub mod pth;
mod registry;
pub mod rnn;
pub mod runtime;
mod scratch;
pub mod trace;
pub mod transformer;
pub mod vision;

pub use candle_core::{DType, Device, Error, Result, Tensor, Var};
pub use custom::gradcheck;
pub use layers::Ctx;
pub use params::{GradSink, Init, Loaded, Param, ParamBuilder, Params};
