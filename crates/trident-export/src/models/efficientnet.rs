//! EfficientNet-Lite0 with its input adapter in the graph.

use super::{card_mismatch, classifier, folded_conv, image_input, Built};
use crate::error::{ExportError, Result};
use crate::graph::Attr;
use crate::layers::Writer;
use crate::Exported;
use trident_zoo::{InputSpec, Model, ModelConfig};

/// The classifier `efficientnet_lite0`.
pub(super) fn export(mut w: Writer, model: &Model) -> Result<Exported> {
    let ModelConfig::EfficientnetLite0(e) = &model.card.model else {
        return Err(card_mismatch());
    };
    let built = efficientnet(&mut w, e, &model.card.input)?;
    classifier(w, "efficientnet_lite0", built, model)
}

/// EfficientNet-Lite0 (`trident_nn::efficientnet`): the data's normalised pixels in, the
/// input adapter in the graph (pixels back to [0, 1], grey repeated to RGB by `Expand`,
/// integer nearest upsampling by `Reshape`/`Expand`, the lite models' scaling), TensorFlow's
/// SAME padding in the `Conv`s' pads, batch norms folded into their convolutions, ReLU6 as
/// `Clip`, depthwise convolutions as grouped `Conv`s.
fn efficientnet(w: &mut Writer, e: &trident_zoo::card::EfficientNetModel, spec: &InputSpec) -> Result<Built> {
    let (x, io, (c, h, wd)) = image_input(w, spec)?;
    let (mut x, (mut hh, mut ww)) = input_adapter(w, &x, e, spec, (c, h, wd))?;
    let (lo, hi) = (
        w.g.weight("relu6.min", &[], &[0.0]),
        w.g.weight("relu6.max", &[], &[6.0]),
    );
    let relu6 = |w: &mut Writer, x: &str| w.g.op("Clip", &[x, &lo, &hi], &[]);
    let conv = |w: &mut Writer,
                x: &str,
                conv: &str,
                bn: &str,
                k: usize,
                stride: usize,
                size: (usize, usize),
                groups: bool| {
        let (pt, pb) = trident_nn::ops::same_padding(size.0, k, stride);
        let (pl, pr) = trident_nn::ops::same_padding(size.1, k, stride);
        let pads = if k == 1 {
            vec![0; 4]
        } else {
            vec![pt as i64, pl as i64, pb as i64, pr as i64]
        };
        folded_conv(w, x, conv, bn, 1e-3, stride as i64, pads, groups)
    };
    x = conv(w, &x, "_conv_stem", "_bn0", 3, 2, (hh, ww), false)?;
    (hh, ww) = (hh.div_ceil(2), ww.div_ceil(2));
    x = relu6(w, &x);
    let mut i = 0;
    for (k, st, ex, cin, cout, repeats) in trident_nn::efficientnet::STAGES {
        for r in 0..repeats {
            let p = format!("_blocks.{i}");
            let (inp, stride) = if r == 0 { (cin, st) } else { (cout, 1) };
            let mut y = x.clone();
            if ex != 1 {
                y = conv(
                    w,
                    &y,
                    &format!("{p}._expand_conv"),
                    &format!("{p}._bn0"),
                    1,
                    1,
                    (hh, ww),
                    false,
                )?;
                y = relu6(w, &y);
            }
            y = conv(
                w,
                &y,
                &format!("{p}._depthwise_conv"),
                &format!("{p}._bn1"),
                k,
                stride,
                (hh, ww),
                true,
            )?;
            y = relu6(w, &y);
            (hh, ww) = (hh.div_ceil(stride), ww.div_ceil(stride));
            y = conv(
                w,
                &y,
                &format!("{p}._project_conv"),
                &format!("{p}._bn2"),
                1,
                1,
                (hh, ww),
                false,
            )?;
            x = if stride == 1 && inp == cout {
                w.g.op("Add", &[&y, &x], &[])
            } else {
                y
            };
            i += 1;
        }
    }
    x = conv(w, &x, "_conv_head", "_bn1", 1, 1, (hh, ww), false)?;
    x = relu6(w, &x);
    let pooled = w.g.op("GlobalAveragePool", &[&x], &[]);
    let flat = w.g.op("Flatten", &[&pooled], &[("axis", Attr::Int(1))]);
    Ok((w.linear(&flat, "head")?, vec![io]))
}

/// The input adapter on the image input `x` (`channels`, `height`, `width`): the data's
/// normalised pixels back to [0, 1] and through the lite models' scaling (one affine map),
/// grey repeated to RGB, integer nearest upsampling by `e.scale`; returns the RGB input
/// and its height and width.
fn input_adapter(
    w: &mut Writer,
    x: &str,
    e: &trident_zoo::card::EfficientNetModel,
    spec: &InputSpec,
    (c, h, wd): (usize, usize, usize),
) -> Result<(String, (usize, usize))> {
    let &InputSpec::Image { mean, std, .. } = spec else {
        return Err(ExportError::Input { expected: "images" });
    };
    // Pixels in [0, 1], then (255·p − 127) / 128 — one affine map: a·x + b.
    let a = std * 255.0 / 128.0;
    let b = mean * 255.0 / 128.0 - 127.0 / 128.0;
    let (sa, sb) = (
        w.g.weight("input.scale", &[], &[a]),
        w.g.weight("input.shift", &[], &[b]),
    );
    let x = w.g.op("Mul", &[x, &sa], &[]);
    let mut x = w.g.op("Add", &[&x, &sb], &[]);
    let (s, (h, wd)) = (e.scale as i64, (h as i64, wd as i64));
    if c == 1 {
        let rgb = w.g.ints(&[1, 3, 1, 1]);
        x = w.g.op("Expand", &[&x, &rgb], &[]);
    }
    if s > 1 {
        let split = w.g.ints(&[0, 3, h, 1, wd, 1]);
        let blocks = w.g.ints(&[1, 1, 1, s, 1, s]);
        let merged = w.g.ints(&[0, 3, h * s, wd * s]);
        x = w.g.op("Reshape", &[&x, &split], &[]);
        x = w.g.op("Expand", &[&x, &blocks], &[]);
        x = w.g.op("Reshape", &[&x, &merged], &[]);
    }
    Ok((x, ((h * s) as usize, (wd * s) as usize)))
}
