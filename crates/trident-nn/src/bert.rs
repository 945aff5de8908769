//! BERT-family encoders loaded from a Hugging Face folder (`config.json`,
//! `model.safetensors`, `tokenizer.json`), with a sequence-classification head.
//!
//! Parameter names are those of `transformers`' `BertForSequenceClassification`
//! (`bert.embeddings…`, `bert.encoder.layer.N…`, `bert.pooler.dense`, `classifier`), so a
//! checkpoint Trident writes loads in `transformers` and back. Files whose names lack the
//! `bert.` prefix (sentence-transformers' MiniLM) load too.

use crate::layers::{masked_mean, Ctx, Dropout, Embedding, LayerNorm, Linear};
use crate::params::{Loaded, ParamBuilder};
use crate::transformer::{mask_bias, Encoder, EncoderConfig};
use candle_core::{DType, Device, Result, Tensor};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The fields of a Hugging Face BERT `config.json` that Trident uses (others are ignored:
/// the file carries many that concern only `transformers`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BertConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden width.
    pub hidden_size: usize,
    /// Layers.
    pub num_hidden_layers: usize,
    /// Heads.
    pub num_attention_heads: usize,
    /// Feed-forward width.
    pub intermediate_size: usize,
    /// Longest sequence the position table allows.
    pub max_position_embeddings: usize,
    /// Segment vocabulary.
    #[serde(default = "two")]
    pub type_vocab_size: usize,
    /// Dropout on residual branches and embeddings.
    #[serde(default = "p_default")]
    pub hidden_dropout_prob: f32,
    /// Dropout on attention probabilities.
    #[serde(default = "p_default")]
    pub attention_probs_dropout_prob: f32,
    /// Layer-norm epsilon.
    #[serde(default = "eps_default")]
    pub layer_norm_eps: f32,
    /// Std of the initialisation of new weights.
    #[serde(default = "std_default")]
    pub initializer_range: f32,
    /// Only GELU (erf form) is implemented; anything else is refused when loading.
    #[serde(default = "gelu")]
    pub hidden_act: String,
}

fn two() -> usize {
    2
}
fn p_default() -> f32 {
    0.1
}
fn eps_default() -> f32 {
    1e-12
}
fn std_default() -> f32 {
    0.02
}
fn gelu() -> String {
    "gelu".into()
}

impl BertConfig {
    /// Reads a `config.json`.
    pub fn read(file: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(file)
            .map_err(|e| candle_core::Error::Msg(format!("{}: {e}", file.display())))?;
        let c: BertConfig = serde_json::from_str(&text)
            .map_err(|e| candle_core::Error::Msg(format!("{}: {e}", file.display())))?;
        if c.hidden_act != "gelu" {
            candle_core::bail!(
                "{}: hidden_act `{}` is not supported (only `gelu`)",
                file.display(),
                c.hidden_act
            )
        }
        Ok(c)
    }

    fn encoder(&self) -> EncoderConfig {
        EncoderConfig {
            hidden: self.hidden_size,
            heads: self.num_attention_heads,
            intermediate: self.intermediate_size,
            layers: self.num_hidden_layers,
            attention_dropout: self.attention_probs_dropout_prob,
            hidden_dropout: self.hidden_dropout_prob,
            eps: self.layer_norm_eps,
            pre_norm: false,
            init_std: self.initializer_range,
        }
    }
}

/// How the sequence becomes one vector for the classifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pooling {
    /// `tanh(pooler.dense(h[CLS]))`, as `BertForSequenceClassification`.
    Cls,
    /// Mean of the token states under the attention mask, as sentence-transformers.
    Mean,
}

/// A tokenised batch: `[batch, seq]` ids, segment ids and mask (u32).
#[derive(Debug, Clone)]
pub struct TextBatch {
    /// Token ids.
    pub ids: Tensor,
    /// Segment ids.
    pub type_ids: Tensor,
    /// 1 for tokens, 0 for padding.
    pub mask: Tensor,
}

impl TextBatch {
    /// From row-major id, segment and mask vectors of `batch × seq`.
    pub fn new(ids: Vec<u32>, type_ids: Vec<u32>, mask: Vec<u32>, batch: usize, seq: usize) -> Result<Self> {
        let d = Device::Cpu;
        Ok(TextBatch {
            ids: Tensor::from_vec(ids, (batch, seq), &d)?,
            type_ids: Tensor::from_vec(type_ids, (batch, seq), &d)?,
            mask: Tensor::from_vec(mask, (batch, seq), &d)?,
        })
    }
}

/// The BERT encoder.
#[derive(Debug, Clone)]
pub struct Bert {
    word: Embedding,
    position: Embedding,
    token_type: Embedding,
    norm: LayerNorm,
    drop: Dropout,
    encoder: Encoder,
    pooler: Linear,
    /// Its configuration.
    pub config: BertConfig,
}

impl Bert {
    /// Builds (or loads, through `pb`) the encoder under `pb`, e.g. `bert`.
    pub fn new(pb: &ParamBuilder, c: &BertConfig) -> Result<Self> {
        let e = pb.pp("embeddings");
        let s = c.initializer_range;
        Ok(Bert {
            word: Embedding::new(&e.pp("word_embeddings"), c.vocab_size, c.hidden_size, s)?,
            position: Embedding::new(
                &e.pp("position_embeddings"),
                c.max_position_embeddings,
                c.hidden_size,
                s,
            )?,
            token_type: Embedding::new(
                &e.pp("token_type_embeddings"),
                c.type_vocab_size,
                c.hidden_size,
                s,
            )?,
            norm: LayerNorm::new(&e.pp("LayerNorm"), c.hidden_size, c.layer_norm_eps)?,
            drop: Dropout::new(pb, c.hidden_dropout_prob),
            encoder: Encoder::new(&pb.pp("encoder"), &c.encoder())?,
            pooler: Linear::normal(&pb.pp("pooler.dense"), c.hidden_size, c.hidden_size, s)?,
            config: c.clone(),
        })
    }

    fn embed(&self, b: &TextBatch, ctx: &Ctx) -> Result<Tensor> {
        let _layer = crate::trace::layer(|| "embeddings".into());
        let (batch, seq) = b.ids.dims2()?;
        if seq > self.config.max_position_embeddings {
            candle_core::bail!(
                "sequence of {seq} tokens is longer than the model's max_position_embeddings {}",
                self.config.max_position_embeddings
            )
        }
        let pos = Tensor::arange(0u32, seq as u32, &Device::Cpu)?;
        let pos = self.position.forward(&pos, ctx)?.unsqueeze(0)?.broadcast_as((
            batch,
            seq,
            self.config.hidden_size,
        ))?;
        let x = ((self.word.forward(&b.ids, ctx)? + self.token_type.forward(&b.type_ids, ctx)?)? + pos)?;
        self.drop.forward(&self.norm.forward(&x)?, ctx)
    }

    /// Hidden states after the embeddings and after each layer (`1 + layers` tensors of
    /// `[batch, seq, hidden]`), as `transformers`' `output_hidden_states`.
    pub fn hidden_states(&self, b: &TextBatch, ctx: &Ctx) -> Result<Vec<Tensor>> {
        let x = self.embed(b, ctx)?;
        let bias = mask_bias(&b.mask)?;
        let mut states = vec![x.clone()];
        states.extend(self.encoder.forward_all(&x, Some(&bias), ctx)?);
        Ok(states)
    }

    /// The last hidden state.
    pub fn forward(&self, b: &TextBatch, ctx: &Ctx) -> Result<Tensor> {
        self.forward_first(b, ctx, None)
    }

    /// The last hidden state's first `keep` positions (all when `None`), the last layer
    /// computing no others ([`Encoder::forward_first`]).
    pub fn forward_first(&self, b: &TextBatch, ctx: &Ctx, keep: Option<usize>) -> Result<Tensor> {
        let x = self.embed(b, ctx)?;
        self.encoder
            .forward_first(&x, Some(&mask_bias(&b.mask)?), ctx, keep)
    }

    /// One vector per sequence.
    pub fn pool(&self, h: &Tensor, b: &TextBatch, pooling: Pooling) -> Result<Tensor> {
        match pooling {
            Pooling::Cls => self.pooler.forward(&h.narrow(1, 0, 1)?.squeeze(1)?)?.tanh(),
            Pooling::Mean => masked_mean(h, &b.mask.to_dtype(DType::F32)?),
        }
    }
}

/// BERT with a dropout + linear classification head.
#[derive(Debug, Clone)]
pub struct BertClassifier {
    /// The encoder.
    pub bert: Bert,
    drop: Dropout,
    classifier: Linear,
    /// How sequences are pooled.
    pub pooling: Pooling,
}

impl BertClassifier {
    /// Builds under `pb` (`bert.*`, `classifier.*`).
    pub fn new(pb: &ParamBuilder, c: &BertConfig, classes: usize, pooling: Pooling) -> Result<Self> {
        Ok(BertClassifier {
            bert: Bert::new(&pb.pp("bert"), c)?,
            drop: Dropout::new(pb, c.hidden_dropout_prob),
            classifier: Linear::normal(&pb.pp("classifier"), c.hidden_size, classes, c.initializer_range)?,
            pooling,
        })
    }

    /// Logits `[batch, classes]`. With `[CLS]` pooling the last layer computes that
    /// position only: the head reads no other, and the logits and every gradient are those
    /// of the whole computation (`transformer` tests).
    pub fn forward(&self, b: &TextBatch, ctx: &Ctx) -> Result<Tensor> {
        let keep = match self.pooling {
            Pooling::Cls => Some(1),
            Pooling::Mean => None,
        };
        let h = self.bert.forward_first(b, ctx, keep)?;
        self.head(&h, b, ctx)
    }

    /// Logits and every hidden state (after the embeddings and after each layer).
    pub fn forward_hidden(&self, b: &TextBatch, ctx: &Ctx) -> Result<(Tensor, Vec<Tensor>)> {
        let states = self.bert.hidden_states(b, ctx)?;
        let last = states.last().expect("embeddings at least");
        Ok((self.head(last, b, ctx)?, states))
    }

    fn head(&self, h: &Tensor, b: &TextBatch, ctx: &Ctx) -> Result<Tensor> {
        let _layer = crate::trace::layer(|| "head".into());
        let pooled = self.bert.pool(h, b, self.pooling)?;
        self.classifier.forward(&self.drop.forward(&pooled, ctx)?)
    }
}

/// Reads `model.safetensors` from a Hugging Face folder, adding the `bert.` prefix where
/// the file's names lack it.
pub fn load_bert_weights(dir: &Path) -> Result<Loaded> {
    let loaded = Loaded::read(&dir.join("model.safetensors"))?;
    Ok(if loaded.contains("bert.embeddings.word_embeddings.weight") {
        loaded
    } else {
        loaded.with_prefix("bert.")
    })
}

pub use trident_data::tokenize::Tokenizer;

/// Pads `seqs` to their longest into a batch (single segment).
pub fn pad_batch(tok: &Tokenizer, seqs: &[Vec<u32>]) -> Result<TextBatch> {
    let p = tok.pad(seqs, None);
    TextBatch::new(p.ids, vec![0; p.rows * p.len], p.mask, p.rows, p.len)
}
