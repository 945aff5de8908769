//! The layers every exported model is made of, written once for both flavours and both
//! precisions: linear maps (fp32 MatMul + Add, or int8 weights), layer norms, GELU and
//! multi-head self-attention.

use crate::error::{ExportError, Result};
use crate::graph::{Attr, Graph};
use crate::{Flavour, Options, Precision};
use trident_nn::Params;

/// A graph being written from a model's named parameters.
pub struct Writer<'a> {
    pub g: Graph,
    params: &'a Params,
    pub opts: Options,
}

impl<'a> Writer<'a> {
    pub fn new(params: &'a Params, opts: Options) -> Self {
        Writer {
            g: Graph::new(),
            params,
            opts,
        }
    }

    /// The shape and f32 values of parameter `name`.
    pub fn tensor(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let p = self
            .params
            .get(name)
            .ok_or_else(|| ExportError::MissingParameter { name: name.into() })?;
        let t = p.var.as_tensor();
        let values = t
            .flatten_all()
            .and_then(|t| t.to_dtype(candle_core::DType::F32))
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|source| ExportError::Tensor {
                name: name.into(),
                source,
            })?;
        Ok((t.dims().to_vec(), values))
    }

    /// Parameter `name` as an initializer of the same name and shape.
    pub fn param(&mut self, name: &str) -> Result<String> {
        let (dims, v) = self.tensor(name)?;
        Ok(self.g.weight(name, &dims, &v))
    }

    /// `x · Wᵀ` for the `[out, in]` weights `w` (PyTorch's layout, stored transposed as
    /// `[in, out]`), with `bias` added when given; int8 weights under `--precision int8`.
    pub fn matmul(
        &mut self,
        x: &str,
        w: &[f32],
        (out, inp): (usize, usize),
        name: &str,
        bias: Option<&str>,
    ) -> String {
        let mut t = vec![0f32; w.len()];
        for o in 0..out {
            for i in 0..inp {
                t[i * out + o] = w[o * inp + i];
            }
        }
        match self.opts.precision {
            Precision::Fp32 => {
                let wt = self.g.weight(name, &[inp, out], &t);
                let y = self.g.op("MatMul", &[x, &wt], &[]);
                match bias {
                    Some(b) => self.g.op("Add", &[&y, b], &[]),
                    None => y,
                }
            }
            Precision::Int8 => {
                // Symmetric per output column: scale = max |w| / 127, zero point 0.
                let mut scales = vec![0f32; out];
                for i in 0..inp {
                    for (o, s) in scales.iter_mut().enumerate() {
                        *s = s.max(t[i * out + o].abs());
                    }
                }
                scales
                    .iter_mut()
                    .for_each(|s| *s = if *s > 0.0 { *s / 127.0 } else { 1.0 });
                let q: Vec<i8> = t
                    .iter()
                    .enumerate()
                    .map(|(k, v)| (v / scales[k % out]).round().clamp(-127.0, 127.0) as i8)
                    .collect();
                let qw = self.g.weight_i8(name, &[inp, out], &q);
                let s = self.g.weight(&format!("{name}.scale"), &[out], &scales);
                let z = self
                    .g
                    .weight_i8(&format!("{name}.zero_point"), &[out], &vec![0; out]);
                let mut inputs = vec![x, qw.as_str(), s.as_str(), z.as_str()];
                if let Some(b) = bias {
                    inputs.push(b);
                }
                self.g.ms("DynamicQuantizeMatMul", &inputs, &[])
            }
        }
    }

    /// The linear layer `prefix` (`prefix.weight` `[out, in]`, `prefix.bias` if present).
    pub fn linear(&mut self, x: &str, prefix: &str) -> Result<String> {
        let (dims, w) = self.tensor(&format!("{prefix}.weight"))?;
        let bias = match self.params.get(&format!("{prefix}.bias")) {
            Some(_) => Some(self.param(&format!("{prefix}.bias"))?),
            None => None,
        };
        Ok(self.matmul(
            x,
            &w,
            (dims[0], dims[1]),
            &format!("{prefix}.weight"),
            bias.as_deref(),
        ))
    }

    /// The linear layer `prefix` without its bias, and the bias initializer (for fused
    /// bias + activation or bias + residual + norm operators).
    pub fn linear_split(&mut self, x: &str, prefix: &str) -> Result<(String, String)> {
        let (dims, w) = self.tensor(&format!("{prefix}.weight"))?;
        let bias = self.param(&format!("{prefix}.bias"))?;
        Ok((
            self.matmul(x, &w, (dims[0], dims[1]), &format!("{prefix}.weight"), None),
            bias,
        ))
    }

    /// Layer normalisation `prefix` over the last axis.
    pub fn layer_norm(&mut self, x: &str, prefix: &str, eps: f32) -> Result<String> {
        let w = self.param(&format!("{prefix}.weight"))?;
        let b = self.param(&format!("{prefix}.bias"))?;
        Ok(self.g.op(
            "LayerNormalization",
            &[x, &w, &b],
            &[("axis", Attr::Int(-1)), ("epsilon", Attr::Float(eps))],
        ))
    }

    /// `LayerNorm(x + residual)`: SkipLayerNormalization (with the preceding linear
    /// layer's bias folded in) in the fused flavour.
    pub fn add_norm(
        &mut self,
        x: &str,
        bias: &str,
        residual: &str,
        prefix: &str,
        eps: f32,
    ) -> Result<String> {
        if self.opts.flavour == Flavour::OrtFused {
            let w = self.param(&format!("{prefix}.weight"))?;
            let b = self.param(&format!("{prefix}.bias"))?;
            return Ok(self.g.ms(
                "SkipLayerNormalization",
                &[x, residual, &w, &b, bias],
                &[("epsilon", Attr::Float(eps))],
            ));
        }
        let y = self.g.op("Add", &[x, bias], &[]);
        let s = self.g.op("Add", &[&y, residual], &[]);
        self.layer_norm(&s, prefix, eps)
    }

    /// Exact GELU of `x + bias`, `0.5 · y · (1 + erf(y / √2))` (BiasGelu when fused).
    pub fn bias_gelu(&mut self, x: &str, bias: &str) -> String {
        if self.opts.flavour == Flavour::OrtFused {
            return self.g.ms("BiasGelu", &[x, bias], &[]);
        }
        let y = self.g.op("Add", &[x, bias], &[]);
        let inv_sqrt2 = self.g.float_scalar(std::f32::consts::FRAC_1_SQRT_2);
        let half = self.g.float_scalar(0.5);
        let one = self.g.float_scalar(1.0);
        let scaled = self.g.op("Mul", &[&y, &inv_sqrt2], &[]);
        let erf = self.g.op("Erf", &[&scaled], &[]);
        let plus = self.g.op("Add", &[&erf, &one], &[]);
        let half_y = self.g.op("Mul", &[&y, &half], &[]);
        self.g.op("Mul", &[&half_y, &plus], &[])
    }

    /// Multi-head self-attention of the encoder layer `prefix` (Hugging Face names
    /// `attention.self.{query,key,value}`) over `x` `[batch, seq, hidden]`, before its
    /// output projection. `mask` is `(additive bias [batch, 1, 1, seq], int32 0/1 mask
    /// [batch, seq])` for padded text, `None` for images.
    pub fn self_attention(
        &mut self,
        x: &str,
        prefix: &str,
        hidden: usize,
        heads: usize,
        mask: Option<(&str, &str)>,
    ) -> Result<String> {
        let dh = hidden / heads;
        let names = ["query", "key", "value"].map(|n| format!("{prefix}.attention.self.{n}"));
        if self.opts.flavour == Flavour::OrtFused {
            // One packed [hidden, 3·hidden] projection, the layout Trident trains with.
            let mut w = vec![0f32; hidden * 3 * hidden];
            let mut b = Vec::with_capacity(3 * hidden);
            for (k, n) in names.iter().enumerate() {
                let (_, wk) = self.tensor(&format!("{n}.weight"))?;
                for o in 0..hidden {
                    for i in 0..hidden {
                        w[i * 3 * hidden + k * hidden + o] = wk[o * hidden + i];
                    }
                }
                b.extend(self.tensor(&format!("{n}.bias"))?.1);
            }
            let w = self.g.weight(
                &format!("{prefix}.attention.qkv.weight"),
                &[hidden, 3 * hidden],
                &w,
            );
            let b = self
                .g
                .weight(&format!("{prefix}.attention.qkv.bias"), &[3 * hidden], &b);
            let mut inputs = vec![x, w.as_str(), b.as_str()];
            if let Some((_, index)) = mask {
                inputs.push(index);
            }
            return Ok(self
                .g
                .ms("Attention", &inputs, &[("num_heads", Attr::Int(heads as i64))]));
        }
        let split = self.g.ints(&[0, 0, heads as i64, dh as i64]);
        let mut qkv = Vec::new();
        for (n, perm) in names.iter().zip([[0, 2, 1, 3], [0, 2, 3, 1], [0, 2, 1, 3]]) {
            let y = self.linear(x, n)?;
            let y = self.g.op("Reshape", &[&y, &split], &[]);
            qkv.push(
                self.g
                    .op("Transpose", &[&y], &[("perm", Attr::Ints(perm.to_vec()))]),
            );
        }
        let scores = self.g.op("MatMul", &[&qkv[0], &qkv[1]], &[]);
        let scale = self.g.float_scalar(1.0 / (dh as f32).sqrt());
        let mut scores = self.g.op("Mul", &[&scores, &scale], &[]);
        if let Some((bias, _)) = mask {
            scores = self.g.op("Add", &[&scores, bias], &[]);
        }
        let p = self.g.op("Softmax", &[&scores], &[("axis", Attr::Int(-1))]);
        let ctx = self.g.op("MatMul", &[&p, &qkv[2]], &[]);
        let ctx = self
            .g
            .op("Transpose", &[&ctx], &[("perm", Attr::Ints(vec![0, 2, 1, 3]))]);
        let merge = self.g.ints(&[0, 0, hidden as i64]);
        Ok(self.g.op("Reshape", &[&ctx, &merge], &[]))
    }

    /// `[batch]`-leading slice `[0:1]` of `x`'s shape, for building broadcast shapes.
    pub fn batch_dim(&mut self, x: &str) -> String {
        let shape = self.g.op("Shape", &[x], &[]);
        let (s, e) = (self.g.ints(&[0]), self.g.ints(&[1]));
        self.g.op("Slice", &[&shape, &s, &e], &[])
    }
}
