//! What every fused kernel of this crate does around its arithmetic, in one place: the
//! model layer it was built in (kept for its backward pass's profiler span), its forward
//! span, its f32 input borrowed from candle's storage with the layout checked, and its
//! output handed back to candle. A kernel's own file then holds its maths.
//!
//! This module sits below [`crate::ops`], [`crate::dense`], [`crate::blocks`] and
//! [`crate::params`] and imports none of them, so they can all share it without importing
//! each other.

use crate::trace::Span;
use candle_core::{backend::BackendStorage, bail, CpuStorage, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use std::sync::Arc;

/// Rows below this many elements in total are not worth splitting across threads.
const PAR_MIN: usize = 1 << 14;

/// Element-wise kernels run over blocks of this many values (in parallel when large).
pub(crate) const BLOCK: usize = 4096;

/// The model layer a kernel was created in (`trace::layer`'s scope), if the profiler is
/// recording. The backward pass runs later, outside that scope, so the op keeps the layer
/// from its creation and its backward span is attributed to the same layer.
#[derive(Debug, Clone, Default)]
pub(crate) struct LayerTag(Option<Arc<str>>);

impl LayerTag {
    /// The layer whose scope is open on this thread now.
    #[inline]
    pub(crate) fn capture() -> Self {
        LayerTag(crate::trace::current_layer())
    }

    /// The backward pass's span of the op `name` (`flops` floating-point operations, 0 if
    /// not counted), in the captured layer; kernels nested inside it inherit that layer.
    #[inline]
    pub(crate) fn backward(&self, name: &'static str, flops: u64) -> Span {
        crate::trace::op_span_in(&self.0, name, "op.bwd", flops)
    }
}

/// The forward span of the op `name`; it belongs to the layer whose scope is open.
#[inline]
pub(crate) fn forward(name: &'static str) -> Span {
    crate::trace::op_span(name, "op.fwd")
}

/// [`forward`] with the kernel's floating-point operations.
#[inline]
pub(crate) fn forward_flops(name: &'static str, flops: u64) -> Span {
    crate::trace::op_span_flops(name, "op.fwd", flops)
}

/// A kernel's f32 output of `shape`, as candle's `cpu_fwd` returns it.
#[inline]
pub(crate) fn output(out: Vec<f32>, shape: impl Into<Shape>) -> Result<(CpuStorage, Shape)> {
    Ok((CpuStorage::F32(out), shape.into()))
}

/// The f32 elements of a kernel's input, borrowed: the kernels read contiguous f32 memory
/// only, and say which op (`op`) was given anything else.
pub(crate) fn f32_slice<'a>(s: &'a CpuStorage, l: &Layout, op: &str) -> Result<&'a [f32]> {
    let CpuStorage::F32(v) = s else {
        bail!("{op}: only f32 tensors are supported, got {:?}", s.dtype())
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => bail!("{op}: input must be contiguous"),
    }
}

/// The f32 elements of a contiguous tensor's storage, borrowed (no copy).
pub(crate) fn cpu_slice<'a>(s: &'a candle_core::Storage, l: &Layout, what: &str) -> Result<&'a [f32]> {
    match s {
        candle_core::Storage::Cpu(c) => f32_slice(c, l, what),
        _ => bail!("{what}: only the CPU device is supported"),
    }
}

/// Runs `f` on the f32 elements of `t` (made contiguous first), borrowed from its storage
/// without a copy.
pub fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    let t = t.contiguous()?;
    let (s, l) = t.storage_and_layout();
    Ok(f(cpu_slice(&s, l, "with_f32")?))
}

/// Runs `f` on the f32 elements of the contiguous tensor `t`, in place: every tensor that
/// shares the storage (a model's clone of a parameter, say) sees the change, as with
/// `Var::set`, but nothing is allocated or copied.
pub fn update_f32(t: &Tensor, f: impl FnOnce(&mut [f32])) -> Result<()> {
    struct Update<F>(std::cell::RefCell<Option<F>>);
    impl<F: FnOnce(&mut [f32])> candle_core::InplaceOp1 for Update<F> {
        fn name(&self) -> &'static str {
            "trident-update-f32"
        }
        fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> Result<()> {
            let CpuStorage::F32(v) = s else {
                bail!("update_f32: only f32 tensors are supported")
            };
            let Some((a, b)) = l.contiguous_offsets() else {
                bail!("update_f32: the tensor must be contiguous")
            };
            if let Some(f) = self.0.borrow_mut().take() {
                f(&mut v[a..b]);
            }
            Ok(())
        }
    }
    t.inplace_op1(&Update(std::cell::RefCell::new(Some(f))))
}

/// The width of a row-wise kernel's rows: the input's last dimension, which must not be
/// empty (`op` names the kernel in the error).
pub(crate) fn last_dim(l: &Layout, op: &str) -> Result<usize> {
    match l.dims().last() {
        Some(&d) if d > 0 => Ok(d),
        _ => bail!("{op}: needs a non-empty last dimension, got shape {:?}", l.dims()),
    }
}

/// Runs `f` on each row of `out` (of width `d`), in parallel when the work is large.
pub(crate) fn for_rows<T: Send>(out: &mut [T], d: usize, f: impl Fn(usize, &mut [T]) + Sync + Send) {
    if out.len() >= PAR_MIN {
        out.par_chunks_mut(d).enumerate().for_each(|(i, r)| f(i, r));
    } else {
        out.chunks_mut(d).enumerate().for_each(|(i, r)| f(i, r));
    }
}
