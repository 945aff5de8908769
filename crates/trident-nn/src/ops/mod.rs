//! Fused CPU kernels with hand-written backward passes, as candle custom ops.
//!
//! candle's own `layer_norm`, `softmax_last_dim` and `sdpa` have no backward pass: a graph
//! built from them trains nothing, silently. These replace them. Each forward is one pass
//! over contiguous rows (rayon-parallel); each backward is one pass that recomputes what it
//! needs from the saved input or output instead of keeping intermediates alive. All are
//! checked against PyTorch (values and gradients) in `tests/vs_torch.rs`.
//!
//! One file per family of kernels; what they all do around their arithmetic (the layer a
//! kernel was built in, its spans, its f32 inputs and output) is [`crate::kernel`]'s.

pub(crate) mod activation;
mod batch_norm;
mod conv;
mod dropout;
mod loss;
mod norm;
mod pool;
mod softmax;
#[cfg(test)]
pub(crate) mod testing;

pub use crate::kernel::{update_f32, with_f32};
pub use batch_norm::{
    batch_norm_act_train, batch_norm_relu_pool_train, batch_norm_train, channel_affine, Act,
};
pub use conv::{
    conv2d, conv2d_bias, conv_bf16, conv_transpose2d, conv_transpose2d_bias, depthwise_conv2d, same_padding,
};
pub(crate) use dropout::DropMask;
pub use dropout::{dropout, splitmix};
pub use loss::{argmax_rows, cross_entropy, distill_kl};
pub use norm::{add_dropout_layer_norm, add_layer_norm, layer_norm};
pub(crate) use norm::{layer_norm_grads, normalize_row};
pub use pool::relu_max_pool2d;
pub(crate) use softmax::softmax_in_place;
pub use softmax::softmax_last_dim;
