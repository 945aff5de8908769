//! Autoencoders on images or table rows: the reconstruction and its error per example.

use super::{activation, card_mismatch, custom_activation, features_input, image_input, row_mean, BATCH};
use crate::error::{ExportError, Result};
use crate::graph::{Attr, Dim};
use crate::layers::Writer;
use crate::pb::tensor_proto::DataType as Elem;
use crate::{Exported, Io};
use trident_zoo::card::{AeOutput, AeShape, AutoencoderModel};
use trident_zoo::{InputSpec, Model, ModelCard, ModelConfig};

/// The model `autoencoder`.
pub(super) fn export(w: Writer, model: &Model) -> Result<Exported> {
    let ModelConfig::Autoencoder(a) = &model.card.model else {
        return Err(card_mismatch());
    };
    autoencoder(w, a, &model.card)
}

/// An autoencoder (`trident_nn::autoencoder`, evaluation mode: no input noise) on images or
/// encoded table rows: `reconstruction` in the input's shape and `reconstruction_error`
/// `[batch, 1]`, the mean squared error over each example's values — its anomaly score.
fn autoencoder(mut w: Writer, a: &AutoencoderModel, card: &ModelCard) -> Result<Exported> {
    let (x, io, image) = match &card.input {
        InputSpec::Image { .. } => {
            let (x, io, shape) = image_input(&mut w, &card.input)?;
            (x, io, Some(shape))
        }
        InputSpec::Table { .. } => {
            let (x, io) = features_input(&mut w, &card.input)?;
            (x, io, None)
        }
        InputSpec::Text { .. } | InputSpec::Series(_) => {
            return Err(unsupported("it takes images or table rows"))
        }
    };
    let y = match (a.shape, image) {
        (AeShape::Dense, _) => dense(&mut w, a, &x)?,
        (AeShape::Conv, Some((_, height, width))) => conv(&mut w, a, &x, height, width)?,
        (AeShape::Conv, None) => return Err(unsupported("a conv autoencoder takes images")),
    };
    let sigmoid = match a.output {
        Some(o) => o == AeOutput::Sigmoid,
        None => matches!(card.input, InputSpec::Image { mean, std, .. } if mean == 0.0 && std == 1.0),
    };
    let y = if sigmoid { w.g.op("Sigmoid", &[&y], &[]) } else { y };
    let shape = w.g.op("Shape", &[&x], &[]);
    let y = w.g.op("Reshape", &[&y, &shape], &[]);
    let diff = w.g.op("Sub", &[&y, &x], &[]);
    let sq = w.g.op("Mul", &[&diff, &diff], &[]);
    let flat = w.g.op("Flatten", &[&sq], &[("axis", Attr::Int(1))]);
    let err = row_mean(&mut w, &flat);
    let in_dims: Vec<Dim> = std::iter::once(BATCH)
        .chain(io.dims.iter().map(|&d| Dim::Fixed(d)))
        .collect();
    w.g.output(&y, "reconstruction", Elem::Float, &in_dims);
    w.g.output(&err, "reconstruction_error", Elem::Float, &[BATCH, Dim::Fixed(1)]);
    let doc = format!(
        "Trident {:?} autoencoder ({}-wide code); outputs the reconstruction and its mean squared error per value",
        a.shape, a.code
    );
    let outputs = vec![
        Io {
            name: "reconstruction".into(),
            data_type: "TYPE_FP32",
            dims: io.dims.clone(),
        },
        Io {
            name: "reconstruction_error".into(),
            data_type: "TYPE_FP32",
            dims: vec![1],
        },
    ];
    Ok(Exported {
        model: w.g.finish("autoencoder", 8, 17, doc),
        inputs: vec![io],
        outputs,
        per_class: false,
    })
}
/// The card's activation (a registered one has no ONNX form here).
fn act(w: &mut Writer, a: &AutoencoderModel, y: &str) -> Result<String> {
    activation(w, y, &a.activation).ok_or_else(|| custom_activation("autoencoder", &a.activation))
}

/// The `dense` shape: the input flattened through the encoder's and the decoder's
/// linear layers, the activation between them.
fn dense(w: &mut Writer, a: &AutoencoderModel, x: &str) -> Result<String> {
    let mut h = w.g.op("Flatten", &[x], &[("axis", Attr::Int(1))]);
    let layers = a.hidden().len() + 1;
    for part in ["encoder", "decoder"] {
        for i in 0..layers {
            h = w.linear(&h, &format!("{part}.layers.{i}"))?;
            if i + 1 < layers {
                h = act(w, a, &h)?;
            }
        }
    }
    Ok(h)
}

/// The `conv` shape on `height` × `width` images: stride-2 convolutions down to a linear
/// code and back, nearest 2× upsampling and a convolution per level.
fn conv(w: &mut Writer, a: &AutoencoderModel, x: &str, height: usize, width: usize) -> Result<String> {
    let mut h = x.to_string();
    for i in 0..a.channels().len() {
        h = conv3(w, &h, &format!("down.{i}"), 2)?;
        h = act(w, a, &h)?;
    }
    h = w.g.op("Flatten", &[&h], &[("axis", Attr::Int(1))]);
    h = w.linear(&h, "to_code")?;
    h = w.linear(&h, "from_code")?;
    h = act(w, a, &h)?;
    let levels = a.channels().len();
    let (mut c, mut hh, mut ww) = (
        *a.channels()
            .last()
            .ok_or_else(|| unsupported("model.channels: no channels"))? as i64,
        (height >> levels) as i64,
        (width >> levels) as i64,
    );
    let shape = w.g.ints(&[0, c, hh, ww]);
    h = w.g.op("Reshape", &[&h, &shape], &[]);
    for i in 0..levels {
        // Nearest 2x upsampling as the model does it: a broadcast of each value
        // over a 2x2 block.
        let split = w.g.ints(&[0, c, hh, 1, ww, 1]);
        let blocks = w.g.ints(&[1, 1, 1, 2, 1, 2]);
        h = w.g.op("Reshape", &[&h, &split], &[]);
        h = w.g.op("Expand", &[&h, &blocks], &[]);
        (hh, ww) = (2 * hh, 2 * ww);
        let merged = w.g.ints(&[0, c, hh, ww]);
        h = w.g.op("Reshape", &[&h, &merged], &[]);
        h = conv3(w, &h, &format!("up.{i}"), 1)?;
        c = w.tensor(&format!("up.{i}.weight"))?.0[0] as i64;
        if i + 1 < levels {
            h = act(w, a, &h)?;
        }
    }
    Ok(h)
}

/// A 3x3 convolution with bias, padding 1, of `stride`.
fn conv3(w: &mut Writer, x: &str, prefix: &str, stride: i64) -> Result<String> {
    let k = w.param(&format!("{prefix}.weight"))?;
    let b = w.param(&format!("{prefix}.bias"))?;
    Ok(w.g.op(
        "Conv",
        &[x, &k, &b],
        &[
            ("kernel_shape", Attr::Ints(vec![3, 3])),
            ("strides", Attr::Ints(vec![stride, stride])),
            ("pads", Attr::Ints(vec![1, 1, 1, 1])),
        ],
    ))
}

/// What an autoencoder's graph does not cover.
fn unsupported(why: &str) -> ExportError {
    ExportError::Unsupported {
        kind: "autoencoder",
        why: why.into(),
    }
}
