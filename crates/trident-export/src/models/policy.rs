//! An agent's policy (`trident rl`): an MLP from observations to action scores — a policy's
//! logits or a Q-network's values — and the greedy action; or a Q-table looked up by state.

use super::{activation, BATCH};
use crate::error::{ExportError, Result};
use crate::graph::{Attr, Dim};
use crate::layers::Writer;
use crate::pb::tensor_proto::DataType as Elem;
use crate::{Exported, Io};

/// What an agent's network is.
pub struct PolicyNet<'a> {
    /// Its parameters' prefix (`actor`, `policy`, `q`).
    pub prefix: &'a str,
    /// Its linear layers (`<prefix>.layers.{i}`).
    pub layers: usize,
    /// The activation between them (`relu`, `tanh`).
    pub activation: &'a str,
    /// The observation's width (a box's values, or a discrete state one-hot).
    pub width: usize,
    /// The scores' name: `logits` (a policy) or `q_values`.
    pub scores: &'a str,
}

fn outputs(w: &mut Writer, scores: &str, name: &str, actions: usize) -> Vec<Io> {
    let action = w.g.op(
        "ArgMax",
        &[scores],
        &[("axis", Attr::Int(1)), ("keepdims", Attr::Int(0))],
    );
    w.g.output(scores, name, Elem::Float, &[BATCH, Dim::Fixed(actions as i64)]);
    w.g.output(&action, "action", Elem::Int64, &[BATCH]);
    vec![
        Io {
            name: name.into(),
            data_type: "TYPE_FP32",
            dims: vec![actions as i64],
        },
        Io {
            name: "action".into(),
            data_type: "TYPE_INT64",
            dims: vec![],
        },
    ]
}

/// `observation` FP32 `[batch, width]` in; `net.scores` FP32 `[batch, actions]` and the
/// greedy `action` INT64 `[batch]` out.
pub(crate) fn export_net(mut w: Writer, net: &PolicyNet, actions: usize) -> Result<Exported> {
    let mut h =
        w.g.input("observation", Elem::Float, &[BATCH, Dim::Fixed(net.width as i64)]);
    for i in 0..net.layers {
        h = w.linear(&h, &format!("{}.layers.{i}", net.prefix))?;
        if i + 1 < net.layers {
            h = activation(&mut w, &h, net.activation).ok_or_else(|| ExportError::Unsupported {
                kind: "policy",
                why: format!("the activation {:?} has no ONNX export", net.activation),
            })?;
        }
    }
    let outs = outputs(&mut w, &h, net.scores, actions);
    let doc = format!(
        "Trident agent: {} of {} actions from observations",
        net.scores, actions
    );
    Ok(Exported {
        model: w.g.finish("policy", 8, 17, doc),
        inputs: vec![Io {
            name: "observation".into(),
            data_type: "TYPE_FP32",
            dims: vec![net.width as i64],
        }],
        outputs: outs,
        per_class: false,
    })
}

/// `state` INT64 `[batch]` in; `q_values` (the table's rows) and `action` out.
pub(crate) fn export_table(mut w: Writer, table: &str, actions: usize) -> Result<Exported> {
    let s = w.g.input("state", Elem::Int64, &[BATCH]);
    let q = w.param(table)?;
    let rows = w.g.op("Gather", &[&q, &s], &[("axis", Attr::Int(0))]);
    let outs = outputs(&mut w, &rows, "q_values", actions);
    Ok(Exported {
        model: w.g.finish(
            "q_table",
            8,
            17,
            format!("Trident agent: a Q-table of {actions} actions"),
        ),
        inputs: vec![Io {
            name: "state".into(),
            data_type: "TYPE_INT64",
            dims: vec![],
        }],
        outputs: outs,
        per_class: false,
    })
}
