//! LSTM/GRU classifiers, and the recurrent pieces the forecasters share with them: gate
//! blocks reordered to ONNX's, explicit zero states, the node's attributes.

use super::{card_mismatch, classifier, masked_mean, token_input, Built};
use crate::error::Result;
use crate::graph::Attr;
use crate::layers::Writer;
use crate::pb::tensor_proto::DataType as Elem;
use crate::{Exported, Flavour};
use trident_zoo::{Model, ModelConfig};

/// The classifier `lstm` or `gru`, as the card names it.
pub(super) fn export(mut w: Writer, model: &Model) -> Result<Exported> {
    let (kind, r, lstm) = match &model.card.model {
        ModelConfig::Lstm(r) => ("lstm", r, true),
        ModelConfig::Gru(r) => ("gru", r, false),
        _ => return Err(card_mismatch()),
    };
    let built = rnn(&mut w, r, lstm)?;
    classifier(w, kind, built, model)
}

/// PyTorch's gate blocks reordered to ONNX's: LSTM i,f,g,o → i,o,f,c; GRU r,z,n → z,r,h.
pub(super) fn onnx_gates(v: &[f32], lstm: bool) -> Vec<f32> {
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
pub(super) fn rnn_weights(
    w: &mut Writer,
    l: usize,
    sfx: &[&str],
    lstm: bool,
    hidden: usize,
    min_input: usize,
) -> Result<[String; 3]> {
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
pub(super) fn zero_state(w: &mut Writer, like: &str, hidden: usize) -> String {
    let batch = w.batch_dim(like);
    let (one_d, h_d) = (w.g.ints(&[1]), w.g.ints(&[hidden as i64]));
    let shape =
        w.g.op("Concat", &[&one_d, &batch, &h_d], &[("axis", Attr::Int(0))]);
    let zeros = w.g.weight("rnn.zero_state", &[1, 1, hidden], &vec![0.0; hidden]);
    w.g.op("Expand", &[&zeros, &shape], &[])
}

/// The LSTM or GRU node's attributes (PyTorch's GRU applies the reset gate after the
/// recurrent product).
pub(super) fn rnn_attrs(lstm: bool, hidden: usize) -> Vec<(&'static str, Attr)> {
    let mut attrs = vec![("hidden_size", Attr::Int(hidden as i64))];
    if !lstm {
        attrs.push(("linear_before_reset", Attr::Int(1)));
    }
    attrs
}
fn rnn(w: &mut Writer, r: &trident_zoo::RnnModel, lstm: bool) -> Result<Built> {
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
    let logits = w.linear(&pooled, "head")?;
    Ok((logits, vec![io_ids, io_mask]))
}
