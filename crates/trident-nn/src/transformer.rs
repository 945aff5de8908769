//! The transformer encoder shared by BERT (post-norm) and ViT (pre-norm). Parameter names
//! follow Hugging Face's BERT (`attention.self.query`, `attention.output.LayerNorm`, …), so
//! BERT-family checkpoints load by name.

use crate::blocks::{self, Firsts, Norm};
use crate::dense;
pub use crate::dense::mask_bias;
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

/// One encoder layer. In training, when all its parameters are trainable, it runs as the
/// two fused sublayers of [`crate::blocks`], whose parameter gradients go to the
/// parameters' sinks (collect them with
/// [`Params::gradient_into`](crate::Params::gradient_into)); otherwise as separate ops.
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

    fn self_attention(
        &self,
        x: &Tensor,
        bias: Option<&Tensor>,
        ctx: &Ctx,
        queries: Option<usize>,
    ) -> Result<Tensor> {
        // One projection to [q | k | v]: one GEMM, and one gradient edge into x instead of
        // three (each edge costs candle's backward a zero-filled tensor and an add).
        let w = Tensor::cat(&[&self.query.weight, &self.key.weight, &self.value.weight], 0)?;
        let bias_qkv = match (&self.query.bias, &self.key.bias, &self.value.bias) {
            (Some(q), Some(k), Some(v)) => Some(Tensor::cat(&[q, k, v], 0)?),
            (None, None, None) => None,
            _ => candle_core::bail!("attention: query, key and value must all have a bias or none"),
        };
        let qkv = dense::linear(x, &w, bias_qkv.as_ref())?;
        let merged =
            dense::attention_packed_first(&qkv, bias, self.heads, self.attn_drop.active(ctx), queries)?;
        self.attn_out.forward(&merged)
    }

    /// The layer as the two fused sublayers of [`crate::blocks`], when training and every
    /// parameter of the layer is trainable (then each has a gradient sink).
    fn fused(
        &self,
        x: &Tensor,
        bias: Option<&Tensor>,
        ctx: &Ctx,
        firsts: Option<Firsts>,
    ) -> Result<Option<Tensor>> {
        let (Some(q), Some(k), Some(v), Some(o), Some(inter), Some(out), Some(attn_norm), Some(out_norm)) = (
            self.query.sinks(),
            self.key.sinks(),
            self.value.sinks(),
            self.attn_out.sinks(),
            self.inter.sinks(),
            self.out.sinks(),
            self.attn_norm.sinks(),
            self.out_norm.sinks(),
        ) else {
            return Ok(None);
        };
        let placement = if self.pre_norm { Norm::Pre } else { Norm::Post };
        let hidden_drop = self.hidden_drop.active(ctx);
        let x = blocks::self_attention(
            x,
            [&q, &k, &v],
            &o,
            &attn_norm,
            placement,
            bias,
            self.heads,
            self.attn_drop.active(ctx),
            hidden_drop,
            firsts.map(|f| f.keep),
        )?;
        blocks::feed_forward(&x, &inter, &out, &out_norm, placement, hidden_drop, firsts).map(Some)
    }

    /// Applies the layer to `[batch, seq, hidden]`; `bias` is the additive attention mask.
    pub fn forward(&self, x: &Tensor, bias: Option<&Tensor>, ctx: &Ctx) -> Result<Tensor> {
        self.forward_first(x, bias, ctx, None)
    }

    /// [`Self::forward`] for the first `keep` positions of each sequence only (all when
    /// `None`): `[batch, keep, hidden]`, equal to those rows of the whole output. Every
    /// position's keys and values are still computed; the queries, attention, projections,
    /// feed-forward network and norms of the other positions are not.
    pub fn forward_first(
        &self,
        x: &Tensor,
        bias: Option<&Tensor>,
        ctx: &Ctx,
        keep: Option<usize>,
    ) -> Result<Tensor> {
        let seq = x.dim(1)?;
        let firsts = match keep {
            Some(k) if k == 0 || k > seq => {
                candle_core::bail!("encoder layer: {k} positions asked of sequences of {seq}")
            }
            Some(k) if k < seq => Some(Firsts { keep: k, seq }),
            _ => None,
        };
        if ctx.train {
            if let Some(y) = self.fused(x, bias, ctx, firsts)? {
                return Ok(y);
            }
        }
        match firsts {
            // The separate ops draw the residual dropout over the tensor they see: the
            // whole layer runs, then its first rows are taken, so a dropout mask is the
            // one the whole output has.
            Some(f) if self.hidden_drop.active(ctx).is_some() => {
                self.composed(x, bias, ctx, None)?.narrow(1, 0, f.keep)
            }
            _ => self.composed(x, bias, ctx, firsts),
        }
    }

    /// The layer as separate ops (evaluation, or frozen parameters), for the first
    /// positions only with `firsts` (the residual dropout must then be off).
    fn composed(
        &self,
        x: &Tensor,
        bias: Option<&Tensor>,
        ctx: &Ctx,
        firsts: Option<Firsts>,
    ) -> Result<Tensor> {
        let gelu = Activation::Gelu;
        let queries = firsts.map(|f| f.keep);
        let kept = match firsts {
            Some(f) => x.narrow(1, 0, f.keep)?,
            None => x.clone(),
        };
        if self.pre_norm {
            let a = self.self_attention(&self.attn_norm.forward(x)?, bias, ctx, queries)?;
            let x = (kept + self.hidden_drop.forward(&a, ctx)?)?;
            let f = self
                .out
                .forward(&gelu.forward(&self.inter.forward(&self.out_norm.forward(&x)?)?)?)?;
            x + self.hidden_drop.forward(&f, ctx)?
        } else {
            // Dropout and residual adds fused into the layer norms that follow them.
            let a = self.self_attention(x, bias, ctx, queries)?;
            let x = self
                .attn_norm
                .forward_residual(&a, &kept, &self.hidden_drop, ctx)?;
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
        for (i, l) in self.layers.iter().enumerate() {
            let _layer = crate::trace::layer(|| format!("encoder.{i}"));
            h = l.forward(&h, bias, ctx)?;
            states.push(h.clone());
        }
        Ok(states)
    }

    /// Runs every layer.
    pub fn forward(&self, x: &Tensor, bias: Option<&Tensor>, ctx: &Ctx) -> Result<Tensor> {
        self.forward_first(x, bias, ctx, None)
    }

    /// Runs every layer, the last for the first `keep` positions of each sequence only
    /// (all when `None`; see [`EncoderLayer::forward_first`]): `[batch, keep, hidden]`,
    /// equal to those rows of [`Self::forward`]'s output, for a model that reads no other
    /// rows (a classifier pooling the `[CLS]` token).
    pub fn forward_first(
        &self,
        x: &Tensor,
        bias: Option<&Tensor>,
        ctx: &Ctx,
        keep: Option<usize>,
    ) -> Result<Tensor> {
        let mut h = x.clone();
        let last = self.layers.len().saturating_sub(1);
        for (i, l) in self.layers.iter().enumerate() {
            let _layer = crate::trace::layer(|| format!("encoder.{i}"));
            h = l.forward_first(&h, bias, ctx, if i == last { keep } else { None })?;
        }
        match keep {
            // No layer: the input's first rows.
            Some(k) if self.layers.is_empty() => h.narrow(1, 0, k),
            _ => Ok(h),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Params;
    use candle_core::{Device, Var};

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    }

    fn assert_close(what: &str, a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len(), "{what}");
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-3);
        let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(
            worst <= 1e-4 * scale,
            "{what}: max difference {worst} (scale {scale})"
        );
    }

    /// A one-layer encoder (hidden 64, 4 heads, both dropouts on) with non-trivial layer
    /// norms, an input `[4, seq, 64]` and the mask bias of a batch whose last sequence is
    /// padded after `tokens`.
    fn layer_fixture(
        pre_norm: bool,
        seed: u64,
        seq: usize,
        tokens: usize,
    ) -> (Params, EncoderLayer, Var, Tensor) {
        let params = Params::new();
        let c = EncoderConfig {
            hidden: 64,
            heads: 4,
            intermediate: 256,
            layers: 1,
            attention_dropout: 0.2,
            hidden_dropout: 0.3,
            eps: 1e-12,
            pre_norm,
            init_std: 0.1,
        };
        let layer = EncoderLayer::new(&params.builder(seed, None).pp("layer"), &c).unwrap();
        for p in params.all().iter().filter(|p| p.name.contains("LayerNorm")) {
            let n = p.var.elem_count();
            let v: Vec<f32> = (0..n).map(|i| 0.5 + (i as f32 * 0.37).sin()).collect();
            p.var.set(&Tensor::from_vec(v, n, &Device::Cpu).unwrap()).unwrap();
        }
        let (dev, b) = (Device::Cpu, 4);
        let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (b, seq, 64), &dev).unwrap()).unwrap();
        let mask: Vec<f32> = (0..b * seq)
            .map(|i| if i >= (b - 1) * seq + tokens { 0.0 } else { 1.0 })
            .collect();
        let bias = mask_bias(&Tensor::from_vec(mask, (b, seq), &dev).unwrap()).unwrap();
        (params, layer, x, bias)
    }

    /// A layer computed for the first positions only (fused in training, composed in
    /// evaluation and with frozen parameters) equals those rows of the whole layer: output,
    /// input gradient and every parameter's gradient of a loss that reads only them, with
    /// both dropouts on (the masks are those of the whole layer) and a padded sequence, in
    /// both norm placements.
    #[test]
    fn first_positions_equal_those_rows_of_the_whole_layer() {
        for (pre_norm, keep) in [(false, 1), (true, 1), (false, 3), (true, 5)] {
            let (params, layer, x, bias) = layer_fixture(pre_norm, 7, 48, 30);
            let probe = Tensor::randn(0f32, 1.0, (4, keep, 64), &Device::Cpu).unwrap();
            let name = format!("{} keep {keep}", if pre_norm { "pre-norm" } else { "post-norm" });
            let grads_of = |y: &Tensor, fused: bool| {
                let grads = (y * &probe).unwrap().sum_all().unwrap().backward().unwrap();
                let dx = values(grads.get(x.as_tensor()).unwrap());
                let g: Vec<Vec<f32>> = params
                    .trainable()
                    .iter()
                    .map(|p| {
                        if fused {
                            let mut g = vec![f32::NAN; p.var.elem_count()];
                            assert!(params.gradient_into(&grads, p, &mut g, false).unwrap());
                            g
                        } else {
                            values(grads.get(p.var.as_tensor()).unwrap())
                        }
                    })
                    .collect();
                (dx, g)
            };
            for ctx in [Ctx::train(13, 2), Ctx::eval()] {
                let whole = layer
                    .composed(x.as_tensor(), Some(&bias), &ctx, None)
                    .unwrap()
                    .narrow(1, 0, keep)
                    .unwrap();
                let (want_dx, want_g) = grads_of(&whole, false);
                // Training: the fused sublayers; evaluation: the separate ops, pruned.
                params.begin_step();
                let first = layer
                    .forward_first(x.as_tensor(), Some(&bias), &ctx, Some(keep))
                    .unwrap();
                assert_eq!(first.dims(), &[4, keep, 64], "{name}");
                assert_close(&format!("{name} output"), &values(&first), &values(&whole));
                let (dx, g) = grads_of(&first, ctx.train);
                assert_close(&format!("{name} input gradient"), &dx, &want_dx);
                for ((p, w), g) in params.trainable().iter().zip(&want_g).zip(&g) {
                    // The key bias's gradient is 0 up to rounding (a softmax does not see
                    // a shift shared by every key): compared at the input gradient's scale
                    // (a fixed 1e-2 floor left it at the edge of the tolerance: 1 run in 6
                    // failed by 1.0e-6 against 1.0e-6).
                    let floor = if p.name.ends_with("key.bias") {
                        want_dx.iter().fold(0f32, |m, v| m.max(v.abs()))
                    } else {
                        0.0
                    };
                    let w: Vec<f32> = w.iter().map(|v| v + floor).collect();
                    let g: Vec<f32> = g.iter().map(|v| v + floor).collect();
                    assert_close(&format!("{name} {}", p.name), &g, &w);
                }
            }
        }
    }

    /// The fused sublayers (training, with sinks) against the same layer as separate ops:
    /// output, input gradient and every parameter's gradient, with both dropouts on and a
    /// padded sequence, in both norm placements; a second step, on recycled buffers filled
    /// with NaN, repeats the first exactly, and without `begin_step` the sinks accumulate.
    /// The sizes are large enough for the intermediates to come from `scratch`.
    #[test]
    fn fused_sublayers_equal_the_composed_layer() {
        for pre_norm in [false, true] {
            // The last sequence is padded after 40 tokens.
            let (params, layer, x, bias) = layer_fixture(pre_norm, 5, 64, 40);
            let probe = Tensor::randn(0f32, 1.0, (4, 64, 64), &Device::Cpu).unwrap();
            let ctx = Ctx::train(11, 3);
            let name = if pre_norm { "pre-norm" } else { "post-norm" };

            let y = layer.composed(x.as_tensor(), Some(&bias), &ctx, None).unwrap();
            let grads = (&y * &probe).unwrap().sum_all().unwrap().backward().unwrap();
            let want_y = values(&y);
            let want_dx = values(grads.get(x.as_tensor()).unwrap());
            let want: Vec<(String, Vec<f32>)> = params
                .trainable()
                .iter()
                .map(|p| (p.name.clone(), values(grads.get(p.var.as_tensor()).unwrap())))
                .collect();

            let fused_step = |begin: bool| {
                if begin {
                    params.begin_step();
                }
                let y = layer.forward(x.as_tensor(), Some(&bias), &ctx).unwrap();
                let grads = (&y * &probe).unwrap().sum_all().unwrap().backward().unwrap();
                let got: Vec<Vec<f32>> = params
                    .trainable()
                    .iter()
                    .map(|p| {
                        assert!(
                            grads.get(p.var.as_tensor()).is_none(),
                            "{}: not in candle's graph",
                            p.name
                        );
                        let mut g = vec![f32::NAN; p.var.elem_count()];
                        assert!(params.gradient_into(&grads, p, &mut g, false).unwrap());
                        g
                    })
                    .collect();
                (values(&y), values(grads.get(x.as_tensor()).unwrap()), got)
            };
            let (y1, dx1, g1) = fused_step(true);
            assert_close(&format!("{name} output"), &y1, &want_y);
            assert_close(&format!("{name} input gradient"), &dx1, &want_dx);
            for ((n, w), g) in want.iter().zip(&g1) {
                assert_close(&format!("{name} {n}"), g, w);
            }
            crate::scratch::poison();
            let (y2, dx2, g2) = fused_step(true);
            assert_eq!((y2, dx2, &g2), (y1, dx1, &g1), "{name}: second step differs");
            let (_, _, g3) = fused_step(false);
            for (a, b) in g3.iter().zip(&g1) {
                assert_close(
                    &format!("{name} accumulated"),
                    a,
                    &b.iter().map(|v| 2.0 * v).collect::<Vec<_>>(),
                );
            }
        }
    }
}
