//! Image models trained from scratch: a ViT (patch embedding + pre-norm encoder) and a
//! small CNN.

use crate::layers::{BatchNorm2d, Conv2d, Ctx, Dropout, LayerNorm, Linear};
use crate::params::{Init, ParamBuilder};
use crate::transformer::{Encoder, EncoderConfig};
use candle_core::{Result, Tensor};
use serde::{Deserialize, Serialize};

/// A ViT's sizes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VitConfig {
    /// Input height = width.
    pub image_size: usize,
    /// Input channels.
    #[serde(default = "one")]
    pub channels: usize,
    /// Patch side (must divide `image_size`).
    pub patch_size: usize,
    /// Width.
    pub hidden: usize,
    /// Layers.
    pub layers: usize,
    /// Heads.
    pub heads: usize,
    /// Feed-forward width.
    pub mlp: usize,
    /// Dropout.
    #[serde(default)]
    pub dropout: f32,
}

fn one() -> usize {
    1
}

/// Vision transformer: a stride-p convolution cuts patches, a learned class token and
/// position embeddings are added, a pre-norm encoder runs, and the class token's final
/// normalised state is classified.
#[derive(Debug, Clone)]
pub struct Vit {
    patch: Conv2d,
    cls: Tensor,
    pos: Tensor,
    encoder: Encoder,
    norm: LayerNorm,
    head: Linear,
    drop: Dropout,
    config: VitConfig,
}

impl Vit {
    /// A new ViT for `classes` classes.
    pub fn new(pb: &ParamBuilder, c: &VitConfig, classes: usize) -> Result<Self> {
        if c.patch_size == 0 || !c.image_size.is_multiple_of(c.patch_size) {
            candle_core::bail!(
                "vit: patch_size {} does not divide image_size {}",
                c.patch_size,
                c.image_size
            )
        }
        let n = (c.image_size / c.patch_size).pow(2);
        let enc = EncoderConfig {
            hidden: c.hidden,
            heads: c.heads,
            intermediate: c.mlp,
            layers: c.layers,
            attention_dropout: 0.0,
            hidden_dropout: c.dropout,
            eps: 1e-6,
            pre_norm: true,
            init_std: 0.02,
        };
        Ok(Vit {
            patch: Conv2d::new(
                &pb.pp("patch_embed"),
                c.channels,
                c.hidden,
                c.patch_size,
                c.patch_size,
                0,
                true,
            )?,
            cls: pb.get((1, 1, c.hidden), "cls_token", Init::Normal(0.02))?,
            pos: pb.get((1, n + 1, c.hidden), "pos_embed", Init::Normal(0.02))?,
            encoder: Encoder::new(&pb.pp("encoder"), &enc)?,
            norm: LayerNorm::new(&pb.pp("norm"), c.hidden, 1e-6)?,
            head: Linear::normal(&pb.pp("head"), c.hidden, classes, 0.02)?,
            drop: Dropout::new(pb, c.dropout),
            config: c.clone(),
        })
    }

    /// Patch embeddings `[batch, patches, hidden]` of `[batch, channels, h, w]` images.
    pub fn patches(&self, x: &Tensor) -> Result<Tensor> {
        let p = self.patch.forward(x)?; // [b, hidden, h/p, w/p]
        let (b, h, _, _) = p.dims4()?;
        p.flatten_from(2)?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b, (), h))
    }

    /// Logits `[batch, classes]`.
    pub fn forward(&self, x: &Tensor, ctx: &Ctx) -> Result<Tensor> {
        let h = {
            let _layer = crate::trace::layer(|| "patch-embed".into());
            let p = self.patches(x)?;
            let b = p.dim(0)?;
            let cls = self.cls.broadcast_as((b, 1, self.config.hidden))?;
            Tensor::cat(&[&cls, &p], 1)?.broadcast_add(&self.pos)?
        };
        // The head reads the class token only: the last layer computes no other position.
        let h = self
            .encoder
            .forward_first(&self.drop.forward(&h, ctx)?, None, ctx, Some(1))?;
        let _layer = crate::trace::layer(|| "head".into());
        let h = self.norm.forward(&h.squeeze(1)?)?;
        self.head.forward(&h)
    }
}

/// Two conv-BN-ReLU-pool blocks and a classifier: the small CNN baseline.
#[derive(Debug, Clone)]
pub struct Cnn {
    conv1: Conv2d,
    bn1: BatchNorm2d,
    conv2: Conv2d,
    bn2: BatchNorm2d,
    fc1: Linear,
    fc2: Linear,
    drop: Dropout,
}

impl Cnn {
    /// For `channels × size × size` images (size divisible by 4).
    pub fn new(
        pb: &ParamBuilder,
        channels: usize,
        size: usize,
        width: usize,
        classes: usize,
        dropout: f32,
    ) -> Result<Self> {
        if !size.is_multiple_of(4) {
            candle_core::bail!("cnn: image size {size} must be divisible by 4")
        }
        let flat = 2 * width * (size / 4) * (size / 4);
        Ok(Cnn {
            conv1: Conv2d::new(&pb.pp("conv1"), channels, width, 3, 1, 1, false)?,
            bn1: BatchNorm2d::new(&pb.pp("bn1"), width)?,
            conv2: Conv2d::new(&pb.pp("conv2"), width, 2 * width, 3, 1, 1, false)?,
            bn2: BatchNorm2d::new(&pb.pp("bn2"), 2 * width)?,
            fc1: Linear::new(&pb.pp("fc1"), flat, 128)?,
            fc2: Linear::new(&pb.pp("fc2"), 128, classes)?,
            drop: Dropout::new(pb, dropout),
        })
    }

    /// Logits `[batch, classes]`.
    pub fn forward(&self, x: &Tensor, ctx: &Ctx) -> Result<Tensor> {
        use crate::trace::layer;
        let h = {
            let _layer = layer(|| "conv1".into());
            self.bn1.forward_relu_pool(&self.conv1.forward(x)?, ctx, 2)?
        };
        let h = {
            let _layer = layer(|| "conv2".into());
            self.bn2.forward_relu_pool(&self.conv2.forward(&h)?, ctx, 2)?
        };
        let h = {
            let _layer = layer(|| "fc1".into());
            self.drop
                .forward(&crate::dense::relu(&self.fc1.forward(&h.flatten_from(1)?)?)?, ctx)?
        };
        let _layer = layer(|| "fc2".into());
        self.fc2.forward(&h)
    }

    /// The penultimate layer `[batch, 128]` (after its ReLU, without dropout) and the
    /// logits, in evaluation mode: the feature space that judges generated images.
    pub fn features_and_logits(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let ctx = Ctx::eval();
        let h = self.bn1.forward_relu_pool(&self.conv1.forward(x)?, &ctx, 2)?;
        let h = self.bn2.forward_relu_pool(&self.conv2.forward(&h)?, &ctx, 2)?;
        let f = crate::dense::relu(&self.fc1.forward(&h.flatten_from(1)?)?)?;
        let logits = self.fc2.forward(&f)?;
        Ok((f, logits))
    }
}
