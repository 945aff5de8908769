//! One graph per model kind, mirroring the forward code of `trident-nn` (`bert.rs`,
//! `vision.rs`, `rnn.rs`) operation by operation in evaluation mode.

use crate::graph::{Attr, Dim};
use crate::layers::Writer;
use crate::pb::tensor_proto::DataType as Elem;
use crate::{Exported, Flavour, Io, Options};
use anyhow::{bail, Context};
use trident_nn::bert::Pooling;
use trident_zoo::card::{AeOutput, AeShape, AutoencoderModel, ForecastNet, ForecasterModel, SeriesNormalize};
use trident_zoo::{InputSpec, Model, ModelCard, ModelConfig, Net};

const BATCH: Dim = Dim::Named("batch");
const SEQ: Dim = Dim::Named("sequence");

pub fn export(model: &Model, opts: Options) -> anyhow::Result<Exported> {
    let classes = model.card.classes.len();
    let mut w = Writer::new(&model.params, opts);
    let (kind, inputs) = match (&model.net, &model.card.model) {
        (Net::Bert(m), _) => ("bert", bert(&mut w, &m.bert.config, m.pooling)?),
        (Net::Vit(_), ModelConfig::Vit(c)) => ("vit", vit(&mut w, c, &model.card.input)?),
        (Net::Cnn(_), ModelConfig::Cnn { width, .. }) => ("cnn", cnn(&mut w, *width, &model.card.input)?),
        (Net::Rnn(_), ModelConfig::Lstm(r)) => ("lstm", rnn(&mut w, r, true)?),
        (Net::Rnn(_), ModelConfig::Gru(r)) => ("gru", rnn(&mut w, r, false)?),
        (
            Net::Mlp(_),
            ModelConfig::Mlp {
                hidden, activation, ..
            },
        ) => ("mlp", mlp(&mut w, hidden.len(), activation, &model.card.input)?),
        (Net::Sequential(_), ModelConfig::Sequential(m)) => {
            ("sequential", sequential(&mut w, &m.layers, &model.card.input)?)
        }
        (Net::Autoencoder(_), ModelConfig::Autoencoder(a)) => return autoencoder(w, a, &model.card),
        (Net::Forecaster(_), ModelConfig::Forecaster(f)) => return forecaster(w, f, &model.card),
        (Net::Gan(g), ModelConfig::Gan(_)) => return generator(w, g),
        (Net::EfficientNet(_), ModelConfig::EfficientnetLite0(e)) => {
            ("efficientnet_lite0", efficientnet(&mut w, e, &model.card.input)?)
        }
        _ => bail!("the model card does not match the network it built"),
    };
    let (logits, inputs) = inputs;
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

type Built = (String, Vec<Io>);

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

fn bert(w: &mut Writer, c: &trident_nn::bert::BertConfig, pooling: Pooling) -> anyhow::Result<Built> {
    let (ids, io_ids) = token_input(w, "input_ids");
    let (mask, io_mask) = token_input(w, "attention_mask");
    let (types, io_types) = token_input(w, "token_type_ids");
    let h = c.hidden_size;
    let eps = c.layer_norm_eps;

    // Embeddings: word + token type + positions 0..seq, then LayerNorm.
    let word = w.param("bert.embeddings.word_embeddings.weight")?;
    let ty = w.param("bert.embeddings.token_type_embeddings.weight")?;
    let pos = w.param("bert.embeddings.position_embeddings.weight")?;
    let we = w.g.op("Gather", &[&word, &ids], &[]);
    let te = w.g.op("Gather", &[&ty, &types], &[]);
    let shape = w.g.op("Shape", &[&ids], &[]);
    let (one, two, zero) = (w.g.ints(&[1]), w.g.ints(&[2]), w.g.ints(&[0]));
    let seq = w.g.op("Slice", &[&shape, &one, &two], &[]);
    let pe = w.g.op("Slice", &[&pos, &zero, &seq, &zero], &[]);
    let x = w.g.op("Add", &[&we, &te], &[]);
    let x = w.g.op("Add", &[&x, &pe], &[]);
    let mut x = w.layer_norm(&x, "bert.embeddings.LayerNorm", eps)?;

    // The mask: an additive bias (m - 1) · 1e9 as [batch, 1, 1, seq] (`mask_bias`), or
    // the int32 0/1 mask ORT's Attention takes.
    let mask_f = w.g.op("Cast", &[&mask], &[("to", Attr::Int(Elem::Float as i64))]);
    let (bias, index) = match w.opts.flavour {
        Flavour::OrtFused => (
            String::new(),
            w.g.op("Cast", &[&mask], &[("to", Attr::Int(Elem::Int32 as i64))]),
        ),
        Flavour::Portable => {
            let one_f = w.g.float_scalar(1.0);
            let big = w.g.float_scalar(1e9);
            let bias = w.g.op("Sub", &[&mask_f, &one_f], &[]);
            let bias = w.g.op("Mul", &[&bias, &big], &[]);
            let axes = w.g.ints(&[1, 2]);
            (w.g.op("Unsqueeze", &[&bias, &axes], &[]), String::new())
        }
    };

    // Post-norm encoder layers. With [CLS] pooling the last layer continues from its
    // attention on position 0 only, as `Encoder::forward_first` computes it: the head
    // reads no other row.
    let last = c.num_hidden_layers.checked_sub(1);
    for l in 0..c.num_hidden_layers {
        let p = format!("bert.encoder.layer.{l}");
        let mut a = w.self_attention(&x, &p, h, c.num_attention_heads, Some((&bias, &index)))?;
        if pooling == Pooling::Cls && Some(l) == last {
            (a, x) = (first_position(w, &a), first_position(w, &x));
        }
        let (a, ab) = w.linear_split(&a, &format!("{p}.attention.output.dense"))?;
        x = w.add_norm(&a, &ab, &x, &format!("{p}.attention.output.LayerNorm"), eps)?;
        let (f, fb) = w.linear_split(&x, &format!("{p}.intermediate.dense"))?;
        let f = w.bias_gelu(&f, &fb);
        let (f, ob) = w.linear_split(&f, &format!("{p}.output.dense"))?;
        x = w.add_norm(&f, &ob, &x, &format!("{p}.output.LayerNorm"), eps)?;
    }

    let pooled = match pooling {
        Pooling::Mean => masked_mean(w, &x, &mask_f),
        Pooling::Cls => {
            let first = w.g.int_scalar(0);
            let cls = w.g.op("Gather", &[&x, &first], &[("axis", Attr::Int(1))]);
            let y = w.linear(&cls, "bert.pooler.dense")?;
            w.g.op("Tanh", &[&y], &[])
        }
    };
    let logits = w.linear(&pooled, "classifier")?;
    Ok((logits, vec![io_ids, io_mask, io_types]))
}

fn image_input(w: &mut Writer, spec: &InputSpec) -> anyhow::Result<(String, Io, (usize, usize, usize))> {
    let &InputSpec::Image {
        channels,
        height,
        width,
        ..
    } = spec
    else {
        bail!("an image model whose card does not describe images")
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

fn vit(w: &mut Writer, c: &trident_nn::vision::VitConfig, spec: &InputSpec) -> anyhow::Result<Built> {
    let (x, io, _) = image_input(w, spec)?;
    let (h, p) = (c.hidden, c.patch_size as i64);
    let eps = 1e-6;
    let pw = w.param("patch_embed.weight")?;
    let pb = w.param("patch_embed.bias")?;
    let conv = w.g.op(
        "Conv",
        &[&x, &pw, &pb],
        &[
            ("kernel_shape", Attr::Ints(vec![p, p])),
            ("strides", Attr::Ints(vec![p, p])),
        ],
    );
    let flat = w.g.ints(&[0, h as i64, -1]);
    let patches = w.g.op("Reshape", &[&conv, &flat], &[]);
    let patches =
        w.g.op("Transpose", &[&patches], &[("perm", Attr::Ints(vec![0, 2, 1]))]);
    let batch = w.batch_dim(&x);
    let rest = w.g.ints(&[1, h as i64]);
    let shape = w.g.op("Concat", &[&batch, &rest], &[("axis", Attr::Int(0))]);
    let cls = w.param("cls_token")?;
    let cls = w.g.op("Expand", &[&cls, &shape], &[]);
    let seq = w.g.op("Concat", &[&cls, &patches], &[("axis", Attr::Int(1))]);
    let pos = w.param("pos_embed")?;
    let mut x = w.g.op("Add", &[&seq, &pos], &[]);

    // Pre-norm encoder layers: x + attn(LN(x)), then x + ffn(LN(x)); the last continues
    // from its attention on the class token only (the head reads no other row).
    for l in 0..c.layers {
        let pre = format!("encoder.layer.{l}");
        let n = w.layer_norm(&x, &format!("{pre}.attention.output.LayerNorm"), eps)?;
        let mut a = w.self_attention(&n, &pre, h, c.heads, None)?;
        if l + 1 == c.layers {
            (a, x) = (first_position(w, &a), first_position(w, &x));
        }
        let a = w.linear(&a, &format!("{pre}.attention.output.dense"))?;
        x = w.g.op("Add", &[&x, &a], &[]);
        let n = w.layer_norm(&x, &format!("{pre}.output.LayerNorm"), eps)?;
        let (f, fb) = w.linear_split(&n, &format!("{pre}.intermediate.dense"))?;
        let f = w.bias_gelu(&f, &fb);
        let f = w.linear(&f, &format!("{pre}.output.dense"))?;
        x = w.g.op("Add", &[&x, &f], &[]);
    }
    let first = w.g.int_scalar(0);
    let cls = w.g.op("Gather", &[&x, &first], &[("axis", Attr::Int(1))]);
    let cls = w.layer_norm(&cls, "norm", eps)?;
    Ok((w.linear(&cls, "head")?, vec![io]))
}

/// A 3×3 convolution (padding 1) with its evaluation-mode batch norm folded in
/// ([`folded_conv`]), then ReLU and 2×2 max pooling: one block of the CNN.
fn conv_bn(w: &mut Writer, x: &str, conv: &str, bn: &str) -> anyhow::Result<String> {
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

fn cnn(w: &mut Writer, _width: usize, spec: &InputSpec) -> anyhow::Result<Built> {
    let (x, io, _) = image_input(w, spec)?;
    let h = conv_bn(w, &x, "conv1", "bn1")?;
    let h = conv_bn(w, &h, "conv2", "bn2")?;
    let h = w.g.op("Flatten", &[&h], &[("axis", Attr::Int(1))]);
    let h = w.linear(&h, "fc1")?;
    let h = w.g.op("Relu", &[&h], &[]);
    Ok((w.linear(&h, "fc2")?, vec![io]))
}

/// The input `features` FP32 `[batch, width]` of a table model: the encoded row (scaled
/// numeric columns, one-hot categorical ones) its card's encoder gives.
fn features_input(w: &mut Writer, spec: &InputSpec) -> anyhow::Result<(String, Io)> {
    let InputSpec::Table { encoder, .. } = spec else {
        bail!("a table model whose card does not describe a table")
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

/// The MLP on encoded table rows ([`features_input`]).
fn mlp(w: &mut Writer, hidden: usize, activation_name: &str, spec: &InputSpec) -> anyhow::Result<Built> {
    let (mut h, io) = features_input(w, spec)?;
    for i in 0..hidden {
        h = match activation_name {
            "gelu" => {
                let (y, b) = w.linear_split(&h, &format!("layers.{i}"))?;
                w.bias_gelu(&y, &b)
            }
            _ => {
                let y = w.linear(&h, &format!("layers.{i}"))?;
                activation(w, &y, activation_name).with_context(|| {
                    format!("the custom activation {activation_name:?} has no ONNX export")
                })?
            }
        };
    }
    Ok((w.linear(&h, &format!("layers.{hidden}"))?, vec![io]))
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

/// A `sequential` stack of built-in layers on encoded table rows (dropout is the identity
/// in evaluation); a registered layer or activation has no ONNX form here and is named.
fn sequential(w: &mut Writer, layers: &[serde_json::Value], spec: &InputSpec) -> anyhow::Result<Built> {
    let (mut h, io) = features_input(w, spec)?;
    for (i, layer) in layers.iter().enumerate() {
        let kind = layer.get("kind").and_then(|k| k.as_str()).unwrap_or_default();
        let prefix = format!("layers.{i}");
        h = match kind {
            "linear" => w.linear(&h, &prefix)?,
            "dropout" => h,
            "layer_norm" => w.layer_norm(&h, &prefix, 1e-5)?,
            "activation" => {
                let name = layer.get("name").and_then(|n| n.as_str()).unwrap_or_default();
                activation(w, &h, name).with_context(|| {
                    format!("model.layers[{i}]: the custom activation {name:?} has no ONNX export")
                })?
            }
            other => bail!(
                "model.layers[{i}]: the custom layer {other:?} has no ONNX export (built-in layers only)"
            ),
        };
    }
    Ok((w.linear(&h, "head")?, vec![io]))
}

/// PyTorch's gate blocks reordered to ONNX's: LSTM i,f,g,o → i,o,f,c; GRU r,z,n → z,r,h.
fn onnx_gates(v: &[f32], lstm: bool) -> Vec<f32> {
    let order: &[usize] = if lstm { &[0, 3, 1, 2] } else { &[1, 0, 2] };
    let block = v.len() / order.len();
    order
        .iter()
        .flat_map(|&g| v[g * block..(g + 1) * block].iter().copied())
        .collect()
}

/// ONNX weights of layer `l` of `rnn.*` for the direction suffixes `sfx` ("" and/or
/// "_reverse"): W `[dirs, gates·H, in]`, R `[dirs, gates·H, H]`, B `[dirs, 2·gates·H]`.
/// W's rows get zero columns up to `min_input` (see [`recurrent_forecast`]).
fn rnn_weights(
    w: &mut Writer,
    l: usize,
    sfx: &[&str],
    lstm: bool,
    hidden: usize,
    min_input: usize,
) -> anyhow::Result<[String; 3]> {
    let gates = if lstm { 4 } else { 3 };
    let (mut wi, mut wh, mut b) = (Vec::new(), Vec::new(), Vec::new());
    let mut inp = 0;
    for s in sfx {
        let (d, v) = w.tensor(&format!("rnn.weight_ih_l{l}{s}"))?;
        inp = d[1].max(min_input);
        for row in onnx_gates(&v, lstm).chunks(d[1]) {
            wi.extend_from_slice(row);
            wi.extend(std::iter::repeat_n(0.0, inp - d[1]));
        }
        wh.extend(onnx_gates(&w.tensor(&format!("rnn.weight_hh_l{l}{s}"))?.1, lstm));
        b.extend(onnx_gates(&w.tensor(&format!("rnn.bias_ih_l{l}{s}"))?.1, lstm));
        b.extend(onnx_gates(&w.tensor(&format!("rnn.bias_hh_l{l}{s}"))?.1, lstm));
    }
    let (n, g) = (sfx.len(), gates * hidden);
    let tag = sfx.concat();
    Ok([
        w.g.weight(&format!("rnn.l{l}{tag}.W"), &[n, g, inp], &wi),
        w.g.weight(&format!("rnn.l{l}{tag}.R"), &[n, g, hidden], &wh),
        w.g.weight(&format!("rnn.l{l}{tag}.B"), &[n, 2 * g], &b),
    ])
}

/// Zero initial states `[1, batch, hidden]` for a one-direction LSTM/GRU node, the batch
/// taken from `like`'s first dimension: given explicitly because tract cannot build its
/// own for a symbolic batch.
fn zero_state(w: &mut Writer, like: &str, hidden: usize) -> String {
    let batch = w.batch_dim(like);
    let (one_d, h_d) = (w.g.ints(&[1]), w.g.ints(&[hidden as i64]));
    let shape =
        w.g.op("Concat", &[&one_d, &batch, &h_d], &[("axis", Attr::Int(0))]);
    let zeros = w.g.weight("rnn.zero_state", &[1, 1, hidden], &vec![0.0; hidden]);
    w.g.op("Expand", &[&zeros, &shape], &[])
}

/// The LSTM or GRU node's attributes (PyTorch's GRU applies the reset gate after the
/// recurrent product).
fn rnn_attrs(lstm: bool, hidden: usize) -> Vec<(&'static str, Attr)> {
    let mut attrs = vec![("hidden_size", Attr::Int(hidden as i64))];
    if !lstm {
        attrs.push(("linear_before_reset", Attr::Int(1)));
    }
    attrs
}

fn rnn(w: &mut Writer, r: &trident_zoo::RnnModel, lstm: bool) -> anyhow::Result<Built> {
    let (ids, io_ids) = token_input(w, "input_ids");
    let (mask, io_mask) = token_input(w, "attention_mask");
    let hidden = r.hidden;
    let op = if lstm { "LSTM" } else { "GRU" };
    let emb = w.param("embedding.weight")?;
    let mut x = w.g.op("Gather", &[&emb, &ids], &[]);
    let mask_f = w.g.op("Cast", &[&mask], &[("to", Attr::Int(Elem::Float as i64))]);
    let attrs = rnn_attrs(lstm, hidden);
    let to_time = [("perm", Attr::Ints(vec![1, 0, 2]))];
    if w.opts.flavour == Flavour::OrtFused {
        // One bidirectional node; `sequence_lens` makes the reverse direction start at
        // each sequence's last token, as packed sequences do.
        let axis1 = w.g.ints(&[1]);
        let lens =
            w.g.op("ReduceSum", &[&mask, &axis1], &[("keepdims", Attr::Int(0))]);
        let lens = w.g.op("Cast", &[&lens], &[("to", Attr::Int(Elem::Int32 as i64))]);
        let mut a = attrs.clone();
        a.push(("direction", Attr::Str("bidirectional")));
        let merge = w.g.ints(&[0, 0, 2 * hidden as i64]);
        for l in 0..r.layers {
            let [wi, wh, b] = rnn_weights(w, l, &["", "_reverse"], lstm, hidden, 0)?;
            let xt = w.g.op("Transpose", &[&x], &to_time);
            let y = w.g.op_n("", op, &[&xt, &wi, &wh, &b, &lens], &a, 1).remove(0); // [S, 2, B, H]
            let y =
                w.g.op("Transpose", &[&y], &[("perm", Attr::Ints(vec![2, 0, 1, 3]))]);
            x = w.g.op("Reshape", &[&y, &merge], &[]);
        }
    } else {
        // Standard operators only (tract takes no per-row sequence_lens): the reverse
        // direction runs forwards over each row reversed within its own length,
        // idx[b, t] = len_b − 1 − t for t < len_b, t for padding, and is reversed back
        // with the same gather.
        let axis1 = w.g.ints(&[1]);
        let lens =
            w.g.op("ReduceSum", &[&mask, &axis1], &[("keepdims", Attr::Int(1))]); // [B, 1]
        let shape = w.g.op("Shape", &[&ids], &[]);
        let one = w.g.int_scalar(1);
        let s = w.g.op("Gather", &[&shape, &one], &[]);
        let zero = w.g.int_scalar(0);
        let t = w.g.op("Range", &[&zero, &s, &one], &[]);
        let axis0 = w.g.ints(&[0]);
        let t = w.g.op("Unsqueeze", &[&t, &axis0], &[]); // [1, S]
        let valid = w.g.op("Less", &[&t, &lens], &[]);
        let last = w.g.op("Sub", &[&lens, &one], &[]);
        let back = w.g.op("Sub", &[&last, &t], &[]);
        let idx = w.g.op("Where", &[&valid, &back, &t], &[]); // [B, S]
        let axis2 = w.g.ints(&[2]);
        let idx = w.g.op("Unsqueeze", &[&idx, &axis2], &[]); // [B, S, 1]
        let reverse = |w: &mut Writer, v: &str| {
            let shape = w.g.op("Shape", &[v], &[]);
            let full = w.g.op("Expand", &[&idx, &shape], &[]);
            w.g.op("GatherElements", &[v, &full], &[("axis", Attr::Int(1))])
        };
        let h0 = zero_state(w, &ids, hidden);
        let run = |w: &mut Writer, v: &str, ws: &[String; 3]| {
            let xt = w.g.op("Transpose", &[v], &to_time);
            let mut inputs = vec![xt.as_str(), &ws[0], &ws[1], &ws[2], "", &h0];
            if lstm {
                inputs.push(&h0);
            }
            let y = w.g.op_n("", op, &inputs, &attrs, 1).remove(0); // [S, 1, B, H]
            let axes = w.g.ints(&[1]);
            let y = w.g.op("Squeeze", &[&y, &axes], &[]);
            w.g.op("Transpose", &[&y], &to_time)
        };
        for l in 0..r.layers {
            let fwd = rnn_weights(w, l, &[""], lstm, hidden, 0)?;
            let bwd = rnn_weights(w, l, &["_reverse"], lstm, hidden, 0)?;
            let f = run(w, &x, &fwd);
            let xr = reverse(w, &x);
            let b = run(w, &xr, &bwd);
            let b = reverse(w, &b);
            x = w.g.op("Concat", &[&f, &b], &[("axis", Attr::Int(2))]);
        }
    }
    let pooled = masked_mean(w, &x, &mask_f);
    let logits = w
        .linear(&pooled, "head")
        .context("the recurrent classifier's head")?;
    Ok((logits, vec![io_ids, io_mask]))
}

/// An autoencoder (`trident_nn::autoencoder`, evaluation mode: no input noise) on images or
/// encoded table rows: `reconstruction` in the input's shape and `reconstruction_error`
/// `[batch, 1]`, the mean squared error over each example's values — its anomaly score.
fn autoencoder(mut w: Writer, a: &AutoencoderModel, card: &ModelCard) -> anyhow::Result<Exported> {
    let (x, io, image) = match &card.input {
        InputSpec::Image { .. } => {
            let (x, io, shape) = image_input(&mut w, &card.input)?;
            (x, io, Some(shape))
        }
        InputSpec::Table { .. } => {
            let (x, io) = features_input(&mut w, &card.input)?;
            (x, io, None)
        }
        InputSpec::Text { .. } | InputSpec::Series(_) => bail!("an autoencoder takes images or table rows"),
    };
    let act = |w: &mut Writer, y: &str| {
        activation(w, y, &a.activation)
            .with_context(|| format!("the custom activation {:?} has no ONNX export", a.activation))
    };
    let y = match (a.shape, image) {
        (AeShape::Dense, _) => {
            let mut h = w.g.op("Flatten", &[&x], &[("axis", Attr::Int(1))]);
            let layers = a.hidden().len() + 1;
            for part in ["encoder", "decoder"] {
                for i in 0..layers {
                    h = w.linear(&h, &format!("{part}.layers.{i}"))?;
                    if i + 1 < layers {
                        h = act(&mut w, &h)?;
                    }
                }
            }
            h
        }
        (AeShape::Conv, Some((_, height, width))) => {
            let mut h = x.clone();
            for i in 0..a.channels().len() {
                h = conv3(&mut w, &h, &format!("down.{i}"), 2)?;
                h = act(&mut w, &h)?;
            }
            h = w.g.op("Flatten", &[&h], &[("axis", Attr::Int(1))]);
            h = w.linear(&h, "to_code")?;
            h = w.linear(&h, "from_code")?;
            h = act(&mut w, &h)?;
            let levels = a.channels().len();
            let (mut c, mut hh, mut ww) = (
                *a.channels().last().context("no channels")? as i64,
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
                h = conv3(&mut w, &h, &format!("up.{i}"), 1)?;
                c = w.tensor(&format!("up.{i}.weight"))?.0[0] as i64;
                if i + 1 < levels {
                    h = act(&mut w, &h)?;
                }
            }
            h
        }
        (AeShape::Conv, None) => bail!("a conv autoencoder takes images"),
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

/// A 3x3 convolution with bias, padding 1, of `stride`.
fn conv3(w: &mut Writer, x: &str, prefix: &str, stride: i64) -> anyhow::Result<String> {
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

/// A forecaster (MLP, LSTM or GRU) with its series transform in the graph: `values` FP32 `[batch,
/// window]` (raw values, oldest first) in — and `position` INT64 `[batch, 1]` (the first
/// forecast value's row in the series) where it reads calendar features — `forecast` FP32
/// `[batch, horizon]` (raw values) out: the log, the window's (or training) mean and the
/// scale, then back.
fn forecaster(mut w: Writer, f: &ForecasterModel, card: &ModelCard) -> anyhow::Result<Exported> {
    let InputSpec::Series(s) = &card.input else {
        bail!("a forecaster whose card does not describe a series")
    };
    let (window, horizon) = (s.window as i64, s.horizon as i64);
    let x = w.g.input("values", Elem::Float, &[BATCH, Dim::Fixed(window)]);
    let t = if s.log {
        w.g.op("Log", &[&x], &[])
    } else {
        x.clone()
    };
    let m = s.season as i64;
    // What the model reads (the values, or with season-trend their changes over a season),
    // what that is relative to (the training or window mean, or the last change), and what
    // the outputs are relative to: that centre, or the values one season before each
    // forecast position, the window's [window − season, window − season + horizon), plus
    // (season-trend) the last change.
    let (steps, centre, offset) = match s.normalize {
        SeriesNormalize::Global => {
            let mean = w.g.float_scalar(s.mean as f32);
            (t.clone(), mean.clone(), mean)
        }
        SeriesNormalize::Window => {
            let mean = row_mean(&mut w, &t);
            (t.clone(), mean.clone(), mean)
        }
        SeriesNormalize::Season => {
            let mean = row_mean(&mut w, &t);
            let before = slice(&mut w, &t, window - m, window - m + horizon);
            (t.clone(), mean, before)
        }
        SeriesNormalize::SeasonTrend => {
            let (now, then) = (slice(&mut w, &t, m, window), slice(&mut w, &t, 0, window - m));
            let changes = w.g.op("Sub", &[&now, &then], &[]);
            let change = slice(&mut w, &changes, window - m - 1, window - m);
            let before = slice(&mut w, &t, window - m, window - m + horizon);
            let offset = w.g.op("Add", &[&before, &change], &[]);
            (changes, change, offset)
        }
    };
    let std = w.g.float_scalar(s.std as f32);
    let centred = w.g.op("Sub", &[&steps, &centre], &[]);
    let mut h = w.g.op("Div", &[&centred, &std], &[]);
    let calendar = (!s.calendar.is_empty()).then(|| calendar_features(&mut w, &s.calendar));
    if let (Some(feats), ForecastNet::Mlp) = (&calendar, f.net) {
        h = w.g.op("Concat", &[&h, feats], &[("axis", Attr::Int(1))]);
    }
    match f.net {
        ForecastNet::Mlp => {
            let layers = f.hidden.len() + 1;
            for i in 0..layers {
                h = w.linear(&h, &format!("layers.{i}"))?;
                if i + 1 < layers {
                    h = activation(&mut w, &h, f.activation()).with_context(|| {
                        format!("the custom activation {:?} has no ONNX export", f.activation())
                    })?;
                }
            }
        }
        ForecastNet::Lstm | ForecastNet::Gru => {
            let cal = calendar.as_deref().map(|c| (c, s.calendar.as_slice()));
            h = recurrent_forecast(&mut w, &h, f, s.steps(), cal)?
        }
    }
    let scaled = w.g.op("Mul", &[&h, &std], &[]);
    let y = w.g.op("Add", &[&scaled, &offset], &[]);
    let y = if s.log { w.g.op("Exp", &[&y], &[]) } else { y };
    w.g.output(&y, "forecast", Elem::Float, &[BATCH, Dim::Fixed(horizon)]);
    let doc = format!(
        "Trident {} forecaster: the next {horizon} values of {:?} from the last {window}",
        match f.net {
            ForecastNet::Mlp => "MLP",
            ForecastNet::Lstm => "LSTM",
            ForecastNet::Gru => "GRU",
        },
        s.column
    );
    let mut inputs = vec![Io {
        name: "values".into(),
        data_type: "TYPE_FP32",
        dims: vec![window],
    }];
    if calendar.is_some() {
        inputs.push(Io {
            name: "position".into(),
            data_type: "TYPE_INT64",
            dims: vec![1],
        });
    }
    Ok(Exported {
        model: w.g.finish("forecaster", 8, 17, doc),
        inputs,
        outputs: vec![Io {
            name: "forecast".into(),
            data_type: "TYPE_FP32",
            dims: vec![horizon],
        }],
        per_class: false,
    })
}

/// The calendar features of the `position` input (INT64 `[batch, 1]`, the first forecast
/// value's row in the series): `sin` and `cos` of `2π (position mod P) / P` per period,
/// `[batch, 2 · periods]`, as `trident_nn::forecast::calendar_features` computes them.
fn calendar_features(w: &mut Writer, periods: &[usize]) -> String {
    let pos = w.g.input("position", Elem::Int64, &[BATCH, Dim::Fixed(1)]);
    let mut feats = Vec::new();
    for &p in periods {
        let period = w.g.int_scalar(p as i64);
        let phase = w.g.op("Mod", &[&pos, &period], &[]);
        let phase =
            w.g.op("Cast", &[&phase], &[("to", Attr::Int(Elem::Float as i64))]);
        let step = w.g.float_scalar((2.0 * std::f64::consts::PI / p as f64) as f32);
        let angle = w.g.op("Mul", &[&phase, &step], &[]);
        feats.push(w.g.op("Sin", &[&angle], &[]));
        feats.push(w.g.op("Cos", &[&angle], &[]));
    }
    let refs: Vec<&str> = feats.iter().map(String::as_str).collect();
    w.g.op("Concat", &refs, &[("axis", Attr::Int(1))])
}

/// An LSTM or GRU forecaster's network on the normalised window `x` `[batch, window]`:
/// the stack over the window's values, one per time step with its row's calendar
/// features (from the forecast's own `calendar` `[batch, 2F]` by `step_features`' matrix),
/// as standard nodes with explicit zero states, which ONNX Runtime and tract both run; its
/// last state through `head`.
fn recurrent_forecast(
    w: &mut Writer,
    x: &str,
    f: &ForecasterModel,
    window: usize,
    calendar: Option<(&str, &[usize])>,
) -> anyhow::Result<String> {
    let lstm = f.net == ForecastNet::Lstm;
    let hidden = *f
        .hidden
        .first()
        .context("model.hidden: an lstm or gru forecaster needs a width per layer")?;
    let op = if lstm { "LSTM" } else { "GRU" };
    let attrs = rnn_attrs(lstm, hidden);
    let h0 = zero_state(w, x, hidden);
    let axis2 = w.g.ints(&[2]);
    let mut steps = w.g.op("Unsqueeze", &[x, &axis2], &[]); // [B, window, 1]
    let mut width = 1;
    if let Some((feats, periods)) = calendar {
        let fw = 2 * periods.len();
        let m = w.g.weight(
            "calendar.steps",
            &[fw, window * fw],
            &trident_nn::forecast::step_features(periods, window),
        );
        let per_step = w.g.op("MatMul", &[feats, &m], &[]);
        let shape = w.g.ints(&[0, window as i64, fw as i64]);
        let per_step = w.g.op("Reshape", &[&per_step, &shape], &[]);
        steps = w.g.op("Concat", &[&steps, &per_step], &[("axis", Attr::Int(2))]);
        width += fw;
    }
    if width == 1 && !lstm {
        // tract 0.23's fused GRU fails on an input of width 1 ("xw not contiguous": its
        // input product comes out column-major): the GRU reads each value beside a zero,
        // through a zero weight column, which changes no result.
        let zero = w.g.float_scalar(0.0);
        let zeros = w.g.op("Mul", &[&steps, &zero], &[]);
        steps = w.g.op("Concat", &[&steps, &zeros], &[("axis", Attr::Int(2))]);
        width = 2;
    }
    // Time-major for the LSTM/GRU nodes: [window, B, width].
    let mut seq =
        w.g.op("Transpose", &[&steps], &[("perm", Attr::Ints(vec![1, 0, 2]))]);
    let mut last = String::new();
    for l in 0..f.hidden.len() {
        let [wi, wh, b] = rnn_weights(w, l, &[""], lstm, hidden, if l == 0 { width } else { 0 })?;
        let mut inputs = vec![seq.as_str(), &wi, &wh, &b, "", &h0];
        if lstm {
            inputs.push(&h0);
        }
        let outs = w.g.op_n("", op, &inputs, &attrs, 2); // Y [S, 1, B, H], Y_h [1, B, H]
        let axis1 = w.g.ints(&[1]);
        seq = w.g.op("Squeeze", &[&outs[0], &axis1], &[]);
        last = outs[1].clone();
    }
    let axis0 = w.g.ints(&[0]);
    let last = w.g.op("Squeeze", &[&last, &axis0], &[]); // [B, H]
    w.linear(&last, "head")
}

/// A GAN's generator (the discriminator only trains it): `z` FP32 `[batch, z]` (latent
/// vectors, N(0, I)) in, `image` FP32 `[batch, c, h, w]` out as pixels in [0, 1] — the
/// linear layer, batch norms on their running statistics, the two transposed
/// convolutions, `tanh` mapped from [−1, 1].
fn generator(mut w: Writer, g: &trident_zoo::model::Gan) -> anyhow::Result<Exported> {
    let shape = g.shape;
    let (c, h, wd) = shape.image;
    let z = w.g.input("z", Elem::Float, &[BATCH, Dim::Fixed(shape.z as i64)]);
    let x = w.linear(&z, "generator.fc")?;
    let inner =
        w.g.ints(&[0, 2 * shape.width as i64, (h / 4) as i64, (wd / 4) as i64]);
    let x = w.g.op("Reshape", &[&x, &inner], &[]);
    let x = batch_norm(&mut w, &x, "generator.bn0")?;
    let x = w.g.op("Relu", &[&x], &[]);
    let up = |w: &mut Writer, x: &str, prefix: &str, bias: bool| -> anyhow::Result<String> {
        let k = w.param(&format!("{prefix}.weight"))?;
        let mut inputs = vec![x.to_string(), k];
        if bias {
            inputs.push(w.param(&format!("{prefix}.bias"))?);
        }
        let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
        Ok(w.g.op(
            "ConvTranspose",
            &refs,
            &[
                ("kernel_shape", Attr::Ints(vec![4, 4])),
                ("strides", Attr::Ints(vec![2, 2])),
                ("pads", Attr::Ints(vec![1, 1, 1, 1])),
            ],
        ))
    };
    let x = up(&mut w, &x, "generator.up1", false)?;
    let x = batch_norm(&mut w, &x, "generator.bn1")?;
    let x = w.g.op("Relu", &[&x], &[]);
    let x = up(&mut w, &x, "generator.up2", true)?;
    let x = w.g.op("Tanh", &[&x], &[]);
    let half = w.g.weight("half", &[], &[0.5]);
    let x = w.g.op("Mul", &[&x, &half], &[]);
    let image = w.g.op("Add", &[&x, &half], &[]);
    let dims = [c, h, wd].map(|d| d as i64);
    w.g.output(
        &image,
        "image",
        Elem::Float,
        &[
            BATCH,
            Dim::Fixed(dims[0]),
            Dim::Fixed(dims[1]),
            Dim::Fixed(dims[2]),
        ],
    );
    let doc = format!(
        "Trident GAN generator ({:?} loss): {}-wide latent vectors from N(0, I) in, {c}x{h}x{wd} images with pixels in [0, 1] out",
        g.loss, shape.z
    );
    Ok(Exported {
        model: w.g.finish("gan-generator", 8, 17, doc),
        inputs: vec![Io {
            name: "z".into(),
            data_type: "TYPE_FP32",
            dims: vec![shape.z as i64],
        }],
        outputs: vec![Io {
            name: "image".into(),
            data_type: "TYPE_FP32",
            dims: dims.to_vec(),
        }],
        per_class: false,
    })
}

/// `BatchNormalization` on the running statistics of the batch norm `prefix`.
fn batch_norm(w: &mut Writer, x: &str, prefix: &str) -> anyhow::Result<String> {
    let names = ["weight", "bias", "running_mean", "running_var"].map(|n| w.param(&format!("{prefix}.{n}")));
    let [a, b, m, v] = names;
    let (a, b, m, v) = (a?, b?, m?, v?);
    Ok(w.g.op(
        "BatchNormalization",
        &[x, &a, &b, &m, &v],
        &[("epsilon", Attr::Float(1e-5))],
    ))
}

/// EfficientNet-Lite0 (`trident_nn::efficientnet`): the data's normalised pixels in, the
/// input adapter in the graph (pixels back to [0, 1], grey repeated to RGB by `Expand`,
/// integer nearest upsampling by `Reshape`/`Expand`, the lite models' scaling), TensorFlow's
/// SAME padding as explicit `Pad`s, batch norms folded into their convolutions, ReLU6 as
/// `Clip`, depthwise convolutions as grouped `Conv`s.
fn efficientnet(
    w: &mut Writer,
    e: &trident_zoo::card::EfficientNetModel,
    spec: &InputSpec,
) -> anyhow::Result<Built> {
    let (x, io, (c, h, wd)) = image_input(w, spec)?;
    let &InputSpec::Image { mean, std, .. } = spec else {
        bail!("an image model whose card does not describe images")
    };
    // Pixels in [0, 1], then (255·p − 127) / 128 — one affine map: a·x + b.
    let a = std * 255.0 / 128.0;
    let b = mean * 255.0 / 128.0 - 127.0 / 128.0;
    let (sa, sb) = (
        w.g.weight("input.scale", &[], &[a]),
        w.g.weight("input.shift", &[], &[b]),
    );
    let x = w.g.op("Mul", &[&x, &sa], &[]);
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
    let (mut hh, mut ww) = ((h * s) as usize, (wd * s) as usize);
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
) -> anyhow::Result<String> {
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
