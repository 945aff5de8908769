//! The small CNN: two convolution blocks with their batch norms folded in, two linear
//! layers.

use super::{card_mismatch, classifier, folded_conv, image_input, Built};
use crate::error::Result;
use crate::graph::Attr;
use crate::layers::Writer;
use crate::Exported;
use trident_zoo::{InputSpec, Model, ModelConfig};

/// The classifier `cnn`.
pub(super) fn export(mut w: Writer, model: &Model) -> Result<Exported> {
    let ModelConfig::Cnn { width, .. } = &model.card.model else {
        return Err(card_mismatch());
    };
    let built = cnn(&mut w, *width, &model.card.input)?;
    classifier(w, "cnn", built, model)
}

/// A 3×3 convolution (padding 1) with its evaluation-mode batch norm folded in
/// ([`folded_conv`]), then ReLU and 2×2 max pooling: one block of the CNN.
fn conv_bn(w: &mut Writer, x: &str, conv: &str, bn: &str) -> Result<String> {
    const EPS: f32 = 1e-5; // BatchNorm2d's
    let y = folded_conv(w, x, conv, bn, EPS, 1, vec![1, 1, 1, 1], false)?;
    let y = w.g.op("Relu", &[&y], &[]);
    Ok(w.g.op(
        "MaxPool",
        &[&y],
        &[
            ("kernel_shape", Attr::Ints(vec![2, 2])),
            ("strides", Attr::Ints(vec![2, 2])),
        ],
    ))
}
fn cnn(w: &mut Writer, _width: usize, spec: &InputSpec) -> Result<Built> {
    let (x, io, _) = image_input(w, spec)?;
    let h = conv_bn(w, &x, "conv1", "bn1")?;
    let h = conv_bn(w, &h, "conv2", "bn2")?;
    let h = w.g.op("Flatten", &[&h], &[("axis", Attr::Int(1))]);
    let h = w.linear(&h, "fc1")?;
    let h = w.g.op("Relu", &[&h], &[]);
    Ok((w.linear(&h, "fc2")?, vec![io]))
}
