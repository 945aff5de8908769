//! Image models: the ViT, the CNN, EfficientNet-Lite0 from its ImageNet weights, and the
//! collate function every image path shares.

use super::{classified, mismatch, Batch, Building, Built, Net, Network};
use crate::card::{InputSpec, ModelCard, ModelConfig};
use crate::error::{invalid, Result, ZooError};
use trident_data::DataError;
use trident_nn::efficientnet::EfficientNetLite0;
use trident_nn::vision::{Cnn, Vit, VitConfig};
use trident_nn::{Ctx, Device, Params, Tensor};
use trident_train::StepOutput;

/// Normalises images and stacks them into a `[n, c, h, w]` batch (training, evaluation and
/// `predict` share it).
pub fn image_collate(
    (c, h, w): (usize, usize, usize),
    mean: f32,
    std: f32,
) -> impl Fn(Vec<trident_data::idx::Image>) -> Result<Batch, DataError> + Send + Sync + 'static {
    move |items| {
        let n = items.len();
        let mut px = Vec::with_capacity(n * c * h * w);
        let mut labels = Vec::with_capacity(n);
        for mut im in items {
            trident_data::transform::normalize(&mut im.pixels, mean, std);
            px.extend(im.pixels);
            labels.push(im.label);
        }
        let x =
            Tensor::from_vec(px, (n, c, h, w), &Device::Cpu).map_err(|e| DataError::Batch(e.to_string()))?;
        Ok(Batch::Image(x, labels))
    }
}

/// `[model] kind = "vit"`.
pub(super) fn build_vit(b: &Building) -> Result<Built> {
    let ModelConfig::Vit(c) = &b.card.model else {
        invalid!("not a vit model")
    };
    Ok((Net::new(vit(c, b.card, b.params, b.seed)?), None))
}

/// `[model] kind = "cnn"`.
pub(super) fn build_cnn(b: &Building) -> Result<Built> {
    let ModelConfig::Cnn { width, dropout } = b.card.model else {
        invalid!("not a cnn model")
    };
    Ok((Net::new(cnn(width, dropout, b.card, b.params, b.seed)?), None))
}

/// `[model] kind = "efficientnet_lite0"`.
pub(super) fn build_efficientnet(b: &Building) -> Result<Built> {
    let ModelConfig::EfficientnetLite0(e) = &b.card.model else {
        invalid!("not an efficientnet_lite0 model")
    };
    let net = efficientnet(e, b.card, b.params, b.seed, b.loading_checkpoint())?;
    Ok((Net::new(net), None))
}

impl Network for Vit {
    fn step(&self, batch: &Batch, _card: &ModelCard, ctx: &Ctx) -> candle_core::Result<StepOutput> {
        let Batch::Image(x, labels) = batch else {
            return Err(mismatch("images"));
        };
        classified(self.forward(x, ctx)?, labels)
    }
}

impl Network for Cnn {
    fn step(&self, batch: &Batch, _card: &ModelCard, ctx: &Ctx) -> candle_core::Result<StepOutput> {
        let Batch::Image(x, labels) = batch else {
            return Err(mismatch("images"));
        };
        classified(self.forward(x, ctx)?, labels)
    }
}

impl Network for EfficientNetLite0 {
    fn step(&self, batch: &Batch, card: &ModelCard, ctx: &Ctx) -> candle_core::Result<StepOutput> {
        let Batch::Image(x, labels) = batch else {
            return Err(mismatch("images"));
        };
        // The network takes pixels in [0, 1] and scales them as it was trained.
        let InputSpec::Image { mean, std, .. } = card.input else {
            candle_core::bail!("an image model whose card does not describe images")
        };
        classified(self.forward(&x.affine(std as f64, mean as f64)?, ctx)?, labels)
    }
}

/// The ViT of `[model] kind = "vit"`, its image size and channels checked against the
/// data's.
fn vit(c: &VitConfig, card: &ModelCard, params: &Params, seed: u64) -> Result<Vit> {
    if let InputSpec::Image {
        channels,
        height,
        width,
        ..
    } = card.input
    {
        if (c.channels, c.image_size, c.image_size) != (channels, height, width) {
            invalid!(
                "vit: model.image_size = {} and model.channels = {} do not match the {channels}x{height}x{width} images",
                c.image_size,
                c.channels
            );
        }
    }
    Ok(Vit::new(&params.builder(seed, None), c, card.classes.len())?)
}

/// The CNN of `[model] kind = "cnn"` for square images.
fn cnn(width: usize, dropout: f32, card: &ModelCard, params: &Params, seed: u64) -> Result<Cnn> {
    let InputSpec::Image {
        channels,
        height,
        width: w,
        ..
    } = card.input
    else {
        invalid!("cnn needs image input")
    };
    if height != w {
        invalid!("cnn: images must be square, these are {height}x{w}");
    }
    Ok(Cnn::new(
        &params.builder(seed, None),
        channels,
        height,
        width,
        card.classes.len(),
        dropout,
    )?)
}

/// EfficientNet-Lite0 of `[model] kind = "efficientnet_lite0"`: the pretrained weights by
/// name (unless a checkpoint's are loaded after), a new classifier, and in probe mode
/// everything but the classifier frozen.
fn efficientnet(
    e: &crate::card::EfficientNetModel,
    card: &ModelCard,
    params: &Params,
    seed: u64,
    from_checkpoint: bool,
) -> Result<EfficientNetLite0> {
    let InputSpec::Image { channels, .. } = card.input else {
        invalid!("efficientnet_lite0 takes images")
    };
    let probe = e.mode == crate::card::TransferMode::Probe;
    match e.bn_momentum {
        Some(_) if probe => invalid!(
            "model.bn_momentum has no effect with model.mode = \"probe\": the frozen backbone runs on its \
             pretrained running statistics; remove it"
        ),
        Some(m) if !(m > 0.0 && m <= 1.0) => invalid!("model.bn_momentum = {m} is not in (0, 1]"),
        _ => {}
    }
    let loaded = match (&e.pretrained, from_checkpoint || params.is_view()) {
        (Some(file), false) => Some(
            trident_nn::efficientnet::pretrained(file, false)
                .map_err(|e| ZooError::file(format!("model.pretrained = {}", file.display()), e))?,
        ),
        (None, false) if probe => invalid!(
            "model.mode = \"probe\" trains a classifier on frozen pretrained features: set model.pretrained \
             (scripts/fetch-data.sh efficientnet)"
        ),
        _ => None,
    };
    let adapter = trident_nn::efficientnet::InputAdapter {
        channels,
        scale: e.scale,
    };
    let m = EfficientNetLite0::new(
        &params.builder(seed, loaded),
        card.classes.len(),
        adapter,
        e.dropout,
        probe,
        e.bn_momentum(),
    )?;
    if probe {
        // The backbone's names all start with `_` (the port's); the classifier is `head`.
        params.set_trainable("_", false);
    }
    Ok(m)
}
