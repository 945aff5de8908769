//! The transformer encoder shared by BERT (post-norm) and ViT (pre-norm). Parameter names
//! follow Hugging Face's BERT (`attention.self.query`, `attention.output.LayerNorm`, …), so
//! BERT-family checkpoints load by name.

use crate::dense;
use crate::layers::{Activation, Ctx, Dropout, LayerNorm, Linear};
use crate::params::ParamBuilder;
use candle_core::{Result, Tensor};

/// Sizes and options of an encoder.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderConfig {
    /// Width of the residual stream.
    pub hidden: usize,
    /// Attention heads (must divide `hidden`).
    pub heads: usize,
    /// Width of the feed-forward layer.
    pub intermediate: usize,
    /// Number of layers.
    pub layers: usize,
    /// Dropout after attention probabilities.
    pub attention_dropout: f32,
    /// Dropout on each residual branch.
    pub hidden_dropout: f32,
    /// Layer-norm epsilon.
    pub eps: f32,
    /// Pre-norm (ViT) instead of post-norm (BERT).
    pub pre_norm: bool,
    /// Std of the Normal initialisation of new weights.
    pub init_std: f32,
}

/// One encoder layer.
#[derive(Debug, Clone)]
pub struct EncoderLayer {
    query: Linear,
    key: Linear,
    value: Linear,
    attn_out: Linear,
    attn_norm: LayerNorm,
    inter: Linear,
    out: Linear,
    out_norm: LayerNorm,
    attn_drop: Dropout,
    hidden_drop: Dropout,
    heads: usize,
    pre_norm: bool,
}

impl EncoderLayer {
    /// Builds layer parameters under `pb`.
    pub fn new(pb: &ParamBuilder, c: &EncoderConfig) -> Result<Self> {
        if c.heads == 0 || !c.hidden.is_multiple_of(c.heads) {
            candle_core::bail!(
                "hidden size {} is not divisible by {} attention heads",
                c.hidden,
                c.heads
            )
        }
        let (h, s) = (c.hidden, c.init_std);
        let att = pb.pp("attention");
        Ok(EncoderLayer {
            query: Linear::normal(&att.pp("self.query"), h, h, s)?,
            key: Linear::normal(&att.pp("self.key"), h, h, s)?,
            value: Linear::normal(&att.pp("self.value"), h, h, s)?,
            attn_out: Linear::normal(&att.pp("output.dense"), h, h, s)?,
            attn_norm: LayerNorm::new(&att.pp("output.LayerNorm"), h, c.eps)?,
            inter: Linear::normal(&pb.pp("intermediate.dense"), h, c.intermediate, s)?,
            out: Linear::normal(&pb.pp("output.dense"), c.intermediate, h, s)?,
            out_norm: LayerNorm::new(&pb.pp("output.LayerNorm"), h, c.eps)?,
            attn_drop: Dropout::new(pb, c.attention_dropout),
            hidden_drop: Dropout::new(pb, c.hidden_dropout),
            heads: c.heads,
            pre_norm: c.pre_norm,
        })
    }

    fn self_attention(&self, x: &Tensor, bias: Option<&Tensor>, ctx: &Ctx) -> Result<Tensor> {
        // One projection to [q | k | v]: one GEMM, and one gradient edge into x instead of
        // three (each edge costs candle's backward a zero-filled tensor and an add).
        let w = Tensor::cat(&[&self.query.weight, &self.key.weight, &self.value.weight], 0)?;
        let bias_qkv = match (&self.query.bias, &self.key.bias, &self.value.bias) {
            (Some(q), Some(k), Some(v)) => Some(Tensor::cat(&[q, k, v], 0)?),
            (None, None, None) => None,
            _ => candle_core::bail!("attention: query, key and value must all have a bias or none"),
        };
        let qkv = dense::linear(x, &w, bias_qkv.as_ref())?;
        let merged = dense::attention_packed(&qkv, bias, self.heads, self.attn_drop.active(ctx))?;
        self.attn_out.forward(&merged)
    }

    /// Applies the layer to `[batch, seq, hidden]`; `bias` is the additive attention mask.
    pub fn forward(&self, x: &Tensor, bias: Option<&Tensor>, ctx: &Ctx) -> Result<Tensor> {
        let gelu = Activation::Gelu;
        if self.pre_norm {
            let a = self.self_attention(&self.attn_norm.forward(x)?, bias, ctx)?;
            let x = (x + self.hidden_drop.forward(&a, ctx)?)?;
            let f = self
                .out
                .forward(&gelu.forward(&self.inter.forward(&self.out_norm.forward(&x)?)?)?)?;
            x + self.hidden_drop.forward(&f, ctx)?
        } else {
            // Dropout and residual adds fused into the layer norms that follow them.
            let a = self.self_attention(x, bias, ctx)?;
            let x = self.attn_norm.forward_residual(&a, x, &self.hidden_drop, ctx)?;
            let f = self.out.forward(&gelu.forward(&self.inter.forward(&x)?)?)?;
            self.out_norm.forward_residual(&f, &x, &self.hidden_drop, ctx)
        }
    }
}

/// A stack of encoder layers (`layer.0`, `layer.1`, …).
#[derive(Debug, Clone)]
pub struct Encoder {
    layers: Vec<EncoderLayer>,
}

impl Encoder {
    /// Builds `c.layers` layers under `pb`.
    pub fn new(pb: &ParamBuilder, c: &EncoderConfig) -> Result<Self> {
        let layers = (0..c.layers)
            .map(|i| EncoderLayer::new(&pb.pp(format!("layer.{i}")), c))
            .collect::<Result<_>>()?;
        Ok(Encoder { layers })
    }

    /// Runs every layer; returns the hidden states after each (the last is the output).
    pub fn forward_all(&self, x: &Tensor, bias: Option<&Tensor>, ctx: &Ctx) -> Result<Vec<Tensor>> {
        let mut states = Vec::with_capacity(self.layers.len());
        let mut h = x.clone();
        for l in &self.layers {
            h = l.forward(&h, bias, ctx)?;
            states.push(h.clone());
        }
        Ok(states)
    }

    /// Runs every layer.
    pub fn forward(&self, x: &Tensor, bias: Option<&Tensor>, ctx: &Ctx) -> Result<Tensor> {
        let mut h = x.clone();
        for l in &self.layers {
            h = l.forward(&h, bias, ctx)?;
        }
        Ok(h)
    }
}

/// The additive attention bias for a `[batch, seq]` mask of 1 (token) / 0 (padding):
/// `[batch, 1, 1, seq]` with 0 for tokens and -1e9 for padding.
pub fn mask_bias(mask: &Tensor) -> Result<Tensor> {
    let (b, s) = mask.dims2()?;
    let m = mask.to_dtype(candle_core::DType::F32)?;
    ((m - 1.0)? * 1e9)?.reshape((b, 1, 1, s))
}
