//! Image models: the ViT, the CNN, EfficientNet-Lite0 from its ImageNet weights, and the
//! collate function every image path shares.

use super::*;

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

/// The ViT of `[model] kind = "vit"`, its image size and channels checked against the
/// data's.
pub(super) fn vit(c: &VitConfig, card: &ModelCard, params: &Params, seed: u64) -> anyhow::Result<Vit> {
    if let InputSpec::Image {
        channels,
        height,
        width,
        ..
    } = card.input
    {
        if (c.channels, c.image_size, c.image_size) != (channels, height, width) {
            bail!(
                "vit: model.image_size = {} and model.channels = {} do not match the {channels}x{height}x{width} images",
                c.image_size,
                c.channels
            );
        }
    }
    Ok(Vit::new(&params.builder(seed, None), c, card.classes.len())?)
}

/// The CNN of `[model] kind = "cnn"` for square images.
pub(super) fn cnn(
    width: usize,
    dropout: f32,
    card: &ModelCard,
    params: &Params,
    seed: u64,
) -> anyhow::Result<Cnn> {
    let InputSpec::Image {
        channels,
        height,
        width: w,
        ..
    } = card.input
    else {
        bail!("cnn needs image input")
    };
    if height != w {
        bail!("cnn: images must be square, these are {height}x{w}");
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
pub(super) fn efficientnet(
    e: &crate::card::EfficientNetModel,
    card: &ModelCard,
    params: &Params,
    seed: u64,
    from_checkpoint: bool,
) -> anyhow::Result<trident_nn::efficientnet::EfficientNetLite0> {
    let InputSpec::Image { channels, .. } = card.input else {
        bail!("efficientnet_lite0 takes images")
    };
    let probe = e.mode == crate::card::TransferMode::Probe;
    match e.bn_momentum {
        Some(_) if probe => bail!(
            "model.bn_momentum has no effect with model.mode = \"probe\": the frozen backbone runs on its \
             pretrained running statistics; remove it"
        ),
        Some(m) if !(m > 0.0 && m <= 1.0) => bail!("model.bn_momentum = {m} is not in (0, 1]"),
        _ => {}
    }
    let loaded = match (&e.pretrained, from_checkpoint || params.is_view()) {
        (Some(file), false) => Some(
            trident_nn::efficientnet::pretrained(file, false)
                .with_context(|| format!("model.pretrained = {}", file.display()))?,
        ),
        (None, false) if probe => bail!(
            "model.mode = \"probe\" trains a classifier on frozen pretrained features: set model.pretrained \
             (scripts/fetch-data.sh efficientnet)"
        ),
        _ => None,
    };
    let adapter = trident_nn::efficientnet::InputAdapter {
        channels,
        scale: e.scale,
    };
    let m = trident_nn::efficientnet::EfficientNetLite0::new(
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
