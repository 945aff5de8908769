//! One graph per model kind, mirroring the forward code of `trident-nn` (`bert.rs`,
//! `vision.rs`, `rnn.rs`) operation by operation in evaluation mode: one module per kind,
//! registered by the card's kind in [`export`]'s one `match`; here the pieces several kinds share (their
//! inputs, the classifier's outputs, pooling, slicing, folded batch norms).

mod autoencoder;
mod bert;
mod cnn;
mod efficientnet;
mod forecaster;
mod gan;
pub mod policy;
mod rnn;
mod table;
mod vit;

use crate::error::{ExportError, Result};
use crate::graph::{Attr, Dim};
use crate::layers::Writer;
use crate::pb::tensor_proto::DataType as Elem;
use crate::{Exported, Io, Options};
use trident_zoo::{InputSpec, Model, ModelConfig};

const BATCH: Dim = Dim::Named("batch");
const SEQ: Dim = Dim::Named("sequence");

pub fn export(model: &Model, opts: Options) -> Result<Exported> {
    let w = Writer::new(&model.params, opts);
    match &model.card.model {
        ModelConfig::Bert { .. } => bert::export(w, model),
        ModelConfig::Vit(_) => vit::export(w, model),
        ModelConfig::Cnn { .. } => cnn::export(w, model),
        ModelConfig::Lstm(_) | ModelConfig::Gru(_) => rnn::export(w, model),
        ModelConfig::Mlp { .. } => table::export_mlp(w, model),
        ModelConfig::Sequential(_) => table::export_sequential(w, model),
        ModelConfig::Autoencoder(_) => autoencoder::export(w, model),
        ModelConfig::Forecaster(_) => forecaster::export(w, model),
        ModelConfig::Gan(_) => gan::export(w, model),
        ModelConfig::EfficientnetLite0(_) => efficientnet::export(w, model),
    }
}

/// Why a kind's card and network disagree (a checkpoint edited by hand, or a bug).
fn card_mismatch() -> ExportError {
    ExportError::CardMismatch
}

/// A registered activation: the graph knows the built-in ones only.
fn custom_activation(kind: &'static str, name: &str) -> ExportError {
    ExportError::Unsupported {
        kind,
        why: format!("the custom activation {name:?} has no ONNX export"),
    }
}

/// A classifier's graph so far: its logits and its inputs.
type Built = (String, Vec<Io>);

/// A classifier's outputs, shared by every kind with classes: `logits` and
/// `probabilities` (their softmax) FP32 `[batch, classes]`.
fn classifier(mut w: Writer, kind: &str, (logits, inputs): Built, model: &Model) -> Result<Exported> {
    let opts = w.opts;
    let classes = model.card.classes.len();
    let out_dims = [BATCH, Dim::Fixed(classes as i64)];
    let probs = w.g.op("Softmax", &[&logits], &[("axis", Attr::Int(-1))]);
    w.g.output(&logits, "logits", Elem::Float, &out_dims);
    w.g.output(&probs, "probabilities", Elem::Float, &out_dims);
    let doc = format!(
        "Trident {kind} classifier, {} flavour, {} weights; classes: {}",
        opts.flavour.name(),
        opts.precision.name(),
        model.card.classes.join(", ")
    );
    Ok(Exported {
        model: w.g.finish(kind, 8, 17, doc),
        inputs,
        per_class: true,
        outputs: ["logits", "probabilities"]
            .map(|name| Io {
                name: name.into(),
                data_type: "TYPE_FP32",
                dims: vec![classes as i64],
            })
            .to_vec(),
    })
}

fn token_input(w: &mut Writer, name: &str) -> (String, Io) {
    let n = w.g.input(name, Elem::Int64, &[BATCH, SEQ]);
    (
        n,
        Io {
            name: name.into(),
            data_type: "TYPE_INT64",
            dims: vec![-1],
        },
    )
}

/// `Σ_t x[:, t] · m[:, t] / max(Σ_t m[:, t], 1e-9)` over `[batch, seq, width]` with the
/// float mask `[batch, seq]` (`layers::masked_mean`).
fn masked_mean(w: &mut Writer, x: &str, mask_f: &str) -> String {
    let axis2 = w.g.ints(&[2]);
    let m3 = w.g.op("Unsqueeze", &[mask_f, &axis2], &[]);
    let prod = w.g.op("Mul", &[x, &m3], &[]);
    let axis1 = w.g.ints(&[1]);
    let keep0 = [("keepdims", Attr::Int(0))];
    let num = w.g.op("ReduceSum", &[&prod, &axis1], &keep0);
    let den = w.g.op("ReduceSum", &[&m3, &axis1], &keep0);
    let floor = w.g.float_scalar(1e-9);
    let den = w.g.op("Max", &[&den, &floor], &[]);
    w.g.op("Div", &[&num, &den], &[])
}

fn image_input(w: &mut Writer, spec: &InputSpec) -> Result<(String, Io, (usize, usize, usize))> {
    let &InputSpec::Image {
        channels,
        height,
        width,
        ..
    } = spec
    else {
        return Err(ExportError::Input { expected: "images" });
    };
    let dims = [channels, height, width].map(|d| d as i64);
    let x = w.g.input(
        "pixel_values",
        Elem::Float,
        &[
            BATCH,
            Dim::Fixed(dims[0]),
            Dim::Fixed(dims[1]),
            Dim::Fixed(dims[2]),
        ],
    );
    Ok((
        x,
        Io {
            name: "pixel_values".into(),
            data_type: "TYPE_FP32",
            dims: dims.to_vec(),
        },
        (channels, height, width),
    ))
}

/// The input `features` FP32 `[batch, width]` of a table model: the encoded row (scaled
/// numeric columns, one-hot categorical ones) its card's encoder gives.
fn features_input(w: &mut Writer, spec: &InputSpec) -> Result<(String, Io)> {
    let InputSpec::Table { encoder, .. } = spec else {
        return Err(ExportError::Input { expected: "a table" });
    };
    let width = encoder.width() as i64;
    let x = w.g.input("features", Elem::Float, &[BATCH, Dim::Fixed(width)]);
    Ok((
        x,
        Io {
            name: "features".into(),
            data_type: "TYPE_FP32",
            dims: vec![width],
        },
    ))
}

/// An activation by name, as ONNX operators (`None`: not one of the built-in ones).
fn activation(w: &mut Writer, x: &str, name: &str) -> Option<String> {
    Some(match name {
        "relu" => w.g.op("Relu", &[x], &[]),
        "sigmoid" => w.g.op("Sigmoid", &[x], &[]),
        "tanh" => w.g.op("Tanh", &[x], &[]),
        "gelu" => {
            let zero = w.g.float_scalar(0.0);
            w.bias_gelu(x, &zero)
        }
        _ => return None,
    })
}

/// `x[:, 0:1]`: the first position of `[batch, seq, hidden]`, kept as a sequence of one.
fn first_position(w: &mut Writer, x: &str) -> String {
    slice(w, x, 0, 1)
}

/// Columns `[from, to)` of `x` (positions, for `[batch, seq, …]`).
fn slice(w: &mut Writer, x: &str, from: i64, to: i64) -> String {
    let (starts, ends, axes) = (w.g.ints(&[from]), w.g.ints(&[to]), w.g.ints(&[1]));
    w.g.op("Slice", &[x, &starts, &ends, &axes], &[])
}

/// The mean of each row of `x`, `[batch, 1]`.
fn row_mean(w: &mut Writer, x: &str) -> String {
    w.g.op(
        "ReduceMean",
        &[x],
        &[("axes", Attr::Ints(vec![1])), ("keepdims", Attr::Int(1))],
    )
}

/// The convolution `conv` (no bias) with the batch norm `bn` (running statistics, `eps`)
/// folded into its weights and a bias; zero `pads` [top, left, bottom, right] given to
/// the `Conv` itself; with `depthwise`, one group per channel.
#[allow(clippy::too_many_arguments)]
fn folded_conv(
    w: &mut Writer,
    x: &str,
    conv: &str,
    bn: &str,
    eps: f32,
    stride: i64,
    pads: Vec<i64>,
    depthwise: bool,
) -> Result<String> {
    let (dims, mut k) = w.tensor(&format!("{conv}.weight"))?;
    let (_, gamma) = w.tensor(&format!("{bn}.weight"))?;
    let (_, beta) = w.tensor(&format!("{bn}.bias"))?;
    let (_, mean) = w.tensor(&format!("{bn}.running_mean"))?;
    let (_, var) = w.tensor(&format!("{bn}.running_var"))?;
    let per_out = k.len() / dims[0];
    let mut bias = vec![0f32; dims[0]];
    for o in 0..dims[0] {
        let s = gamma[o] / (var[o] + eps).sqrt();
        k[o * per_out..(o + 1) * per_out].iter_mut().for_each(|v| *v *= s);
        bias[o] = beta[o] - mean[o] * s;
    }
    let kw = w.g.weight(&format!("{conv}.weight"), &dims, &k);
    let kb = w.g.weight(&format!("{conv}.bias"), &[dims[0]], &bias);
    // ONNX's pads are [top, left, bottom, right] = [x1_begin, x2_begin, x1_end, x2_end].
    let mut attrs = vec![
        ("kernel_shape", Attr::Ints(vec![dims[2] as i64, dims[3] as i64])),
        ("strides", Attr::Ints(vec![stride, stride])),
        ("pads", Attr::Ints(pads)),
    ];
    if depthwise {
        attrs.push(("group", Attr::Int(dims[0] as i64)));
    }
    Ok(w.g.op("Conv", &[x, &kw, &kb], &attrs))
}
