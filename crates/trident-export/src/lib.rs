//! ONNX export of Trident's trained models.
//!
//! Every model kind of [`trident_zoo`] (BERT-family classifiers, fine-tuned or distilled
//! students with kept layers and narrow widths; ViT; the CNN with its batch norms folded
//! into the convolutions; bidirectional LSTM/GRU classifiers) is written as an ONNX graph
//! from the checkpoint's named parameters, mirroring the forward code in `trident-nn`.
//! `onnx.proto` is vendored and compiled with prost + protox ([`pb`]); [`graph`] is a small
//! graph builder.
//!
//! Two flavours: [`Flavour::Portable`] (IR 8, opset 17, standard operators only: runs on
//! ONNX Runtime, tract and Triton's ORT backend) and [`Flavour::OrtFused`] (adds
//! com.microsoft `Attention`, `SkipLayerNormalization`, `BiasGelu` and a bidirectional
//! `LSTM`/`GRU` with `sequence_lens`: ONNX Runtime only, which does not fuse these itself
//! for modern graphs). [`Precision::Int8`] writes every linear layer as
//! com.microsoft `DynamicQuantizeMatMul` with symmetric per-column int8 weights (ONNX
//! Runtime only); embeddings, norms, softmax and the recurrences stay f32.

mod error;
pub mod graph;
mod layers;
mod models;
pub mod pb {
    //! ONNX's protobuf messages (generated from `proto/onnx.proto`).
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}

pub use error::{ExportError, Result};
use prost::Message;

/// Which operators the graph may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    /// Standard ONNX operators, opset 17, IR 8.
    Portable,
    /// ONNX Runtime's contrib operators where they are faster.
    OrtFused,
}

impl Flavour {
    /// `portable` or `ort-fused`.
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "portable" => Flavour::Portable,
            "ort-fused" => Flavour::OrtFused,
            _ => {
                return Err(ExportError::Option {
                    flag: "flavour",
                    value: s.into(),
                    expected: "`portable` or `ort-fused`",
                })
            }
        })
    }

    /// The name `parse` reads.
    pub fn name(self) -> &'static str {
        match self {
            Flavour::Portable => "portable",
            Flavour::OrtFused => "ort-fused",
        }
    }
}

/// How linear layers store their weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    Fp32,
    /// Per-column symmetric int8 weights, activations quantised at run time.
    Int8,
}

impl Precision {
    /// `fp32` or `int8`.
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "fp32" => Precision::Fp32,
            "int8" => Precision::Int8,
            _ => {
                return Err(ExportError::Option {
                    flag: "precision",
                    value: s.into(),
                    expected: "`fp32` or `int8`",
                })
            }
        })
    }

    /// The name `parse` reads.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Int8 => "int8",
        }
    }
}

/// Export options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    pub flavour: Flavour,
    pub precision: Precision,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            flavour: Flavour::Portable,
            precision: Precision::Fp32,
        }
    }
}

/// A graph input or output as `config.pbtxt` declares it.
#[derive(Debug, Clone, PartialEq)]
pub struct Io {
    pub name: String,
    /// Triton's type name (`TYPE_INT64`, `TYPE_FP32`).
    pub data_type: &'static str,
    /// Dimensions after the batch dimension; -1 where variable (the sequence).
    pub dims: Vec<i64>,
}

/// An exported model.
pub struct Exported {
    pub model: pb::ModelProto,
    pub inputs: Vec<Io>,
    pub outputs: Vec<Io>,
    /// The outputs are per-class (`logits`, `probabilities`): a labels file applies. An
    /// autoencoder's (`reconstruction`, `reconstruction_error`) are not.
    pub per_class: bool,
}

impl Exported {
    /// The serialised model.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.model.encode_to_vec()
    }

    /// Operator counts.
    pub fn histogram(&self) -> std::collections::BTreeMap<String, usize> {
        graph::Graph::histogram(&self.model)
    }
}

/// Exports `model` as an ONNX graph with inputs `input_ids`, `attention_mask`
/// (+ `token_type_ids` for BERT) INT64 `[batch, sequence]`, or `pixel_values` FP32
/// `[batch, channels, height, width]`, or `features` FP32 `[batch, width]` (a table's
/// encoded rows); a classifier's outputs are `logits` and `probabilities` (their softmax)
/// FP32 `[batch, classes]`, an autoencoder's `reconstruction` (the input's shape) and
/// `reconstruction_error` FP32 `[batch, 1]` (mean squared error per value).
pub fn export(model: &trident_zoo::Model, opts: Options) -> Result<Exported> {
    models::export(model, opts)
}

pub use models::policy::PolicyNet;

/// Exports an agent's network (`trident rl`): input `observation` FP32 `[batch, width]`,
/// outputs its scores (`logits` of a policy, `q_values` of a Q-network) FP32
/// `[batch, actions]` and the greedy `action` INT64 `[batch]`.
pub fn export_policy(
    params: &trident_nn::Params,
    net: &PolicyNet,
    actions: usize,
    opts: Options,
) -> Result<Exported> {
    models::policy::export_net(layers::Writer::new(params, opts), net, actions)
}

/// Exports a Q-table (the tensor `table` of `params`): input `state` INT64 `[batch]`,
/// outputs `q_values` and the greedy `action`.
pub fn export_q_table(
    params: &trident_nn::Params,
    table: &str,
    actions: usize,
    opts: Options,
) -> Result<Exported> {
    models::policy::export_table(layers::Writer::new(params, opts), table, actions)
}
