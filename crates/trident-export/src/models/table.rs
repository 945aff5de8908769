//! Models on a table's encoded rows (`features` in): the MLP and `sequential` stacks of
//! built-in layers.

use super::{activation, card_mismatch, classifier, custom_activation, features_input, Built};
use crate::error::{ExportError, Result};
use crate::layers::Writer;
use crate::Exported;
use trident_zoo::{InputSpec, Model, ModelConfig};

/// The classifier `mlp`.
pub(super) fn export_mlp(mut w: Writer, model: &Model) -> Result<Exported> {
    let ModelConfig::Mlp {
        hidden, activation, ..
    } = &model.card.model
    else {
        return Err(card_mismatch());
    };
    let built = mlp(&mut w, hidden.len(), activation, &model.card.input)?;
    classifier(w, "mlp", built, model)
}

/// The classifier `sequential`.
pub(super) fn export_sequential(mut w: Writer, model: &Model) -> Result<Exported> {
    let ModelConfig::Sequential(m) = &model.card.model else {
        return Err(card_mismatch());
    };
    let built = sequential(&mut w, &m.layers, &model.card.input)?;
    classifier(w, "sequential", built, model)
}

/// The MLP on encoded table rows ([`features_input`]).
fn mlp(w: &mut Writer, hidden: usize, activation_name: &str, spec: &InputSpec) -> Result<Built> {
    let (mut h, io) = features_input(w, spec)?;
    for i in 0..hidden {
        h = match activation_name {
            "gelu" => {
                let (y, b) = w.linear_split(&h, &format!("layers.{i}"))?;
                w.bias_gelu(&y, &b)
            }
            _ => {
                let y = w.linear(&h, &format!("layers.{i}"))?;
                activation(w, &y, activation_name).ok_or_else(|| custom_activation("mlp", activation_name))?
            }
        };
    }
    Ok((w.linear(&h, &format!("layers.{hidden}"))?, vec![io]))
}
/// A `sequential` stack of built-in layers on encoded table rows (dropout is the identity
/// in evaluation); a registered layer or activation has no ONNX form here and is named.
fn sequential(w: &mut Writer, layers: &[serde_json::Value], spec: &InputSpec) -> Result<Built> {
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
                activation(w, &h, name).ok_or_else(|| ExportError::Unsupported {
                    kind: "sequential",
                    why: format!("model.layers[{i}]: the custom activation {name:?} has no ONNX export"),
                })?
            }
            other => {
                return Err(ExportError::Unsupported {
                    kind: "sequential",
                    why: format!(
                    "model.layers[{i}]: the custom layer {other:?} has no ONNX export (built-in layers only)"
                ),
                })
            }
        };
    }
    Ok((w.linear(&h, "head")?, vec![io]))
}
