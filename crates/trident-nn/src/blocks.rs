//! Fused transformer sublayers for training: a transformer encoder layer is two of them,
//! self-attention (Q/K/V projection, multi-head attention, output projection) and the
//! feed-forward network (linear, GELU, linear), each with its dropout, residual add and
//! layer norm (after the residual add in BERT's post-norm layers, before the sublayer in
//! ViT's pre-norm ones), and each a single candle op.
//!
//! Composed of separate ops, an encoder layer gives candle's backward pass a graph edge
//! per intermediate tensor and per weight, and for each edge candle zero-fills a tensor of
//! that size and adds the gradient into it (with one thread); the weights' gradients are
//! then copied once more by the trainer. Here the intermediates stay inside the op, which
//! has one input edge, and the weight gradients are written by GEMMs straight into the
//! parameters' [`GradSink`]s (accumulating with `beta = 1` when the sink already holds this
//! step's gradient). The kernels are those of [`crate::dense`] and [`crate::ops`]; `tests`
//! check both sublayers in both placements against the composed ops, values and every
//! gradient, with dropout.
//!
//! The op takes the layer norm's scale as a second argument only to anchor it in
//! candle's graph: an op whose input needs no gradient (a frozen embedding's output) would
//! otherwise be left out of the backward pass and its sinks never written. The anchor is a
//! `Var`, which candle's backward pass skips, and the op returns no gradient for it.

use crate::bf16::{self, Operand};
use crate::blas::Mat;
use crate::dense::{affine, column_sums, Attention};
use crate::kernel::{self, f32_slice, for_rows, LayerTag, BLOCK};
use crate::ops::{layer_norm_grads, normalize_row, DropMask};
use crate::params::GradSink;
use crate::scratch;
use candle_core::{bail, CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use std::borrow::Cow;
use std::sync::Mutex;

/// A linear layer's weight (`[out, in]`) and bias (`[out]`), with the sinks their gradients
/// go to.
#[derive(Debug, Clone)]
pub struct SinkLinear {
    /// `[out, in]`, contiguous.
    pub weight: Tensor,
    /// `[out]`.
    pub bias: Option<Tensor>,
    /// Receives the weight gradient.
    pub weight_sink: GradSink,
    /// Receives the bias gradient (present exactly when `bias` is).
    pub bias_sink: Option<GradSink>,
}

impl SinkLinear {
    /// (out, in), checked against the sinks.
    fn dims(&self, what: &str) -> Result<(usize, usize)> {
        let (n, k) = self.weight.dims2()?;
        let bias_ok = match (&self.bias, &self.bias_sink) {
            (Some(b), Some(s)) => b.elem_count() == n && s.len() == n,
            (None, None) => true,
            _ => false,
        };
        if self.weight_sink.len() != n * k || !bias_ok {
            bail!("{what}: a gradient sink does not match its parameter")
        }
        Ok((n, k))
    }

    /// Adds `gᵀ · x` (`g` the output gradient `[m, n]`, `x` the input `[m, k]`) into the
    /// weight sink, the product in bf16 when `bf16`, and the column sums of `g` into the
    /// bias sink.
    #[allow(clippy::too_many_arguments)]
    fn write_grads(
        &self,
        g: Operand,
        x: Operand,
        m: usize,
        n: usize,
        k: usize,
        bias_grad: Option<&[f32]>,
        bf16: bool,
    ) {
        self.weight_sink.write(|dw, holds| {
            let beta = if holds { 1.0 } else { 0.0 };
            bf16::matmul(bf16, n, k, m, g.t(), x, beta, dw)
        });
        if let (Some(sink), Some(db)) = (&self.bias_sink, bias_grad) {
            sink.accumulate(db);
        }
    }
}

/// An activation saved for the backward pass: f32, or bf16 under autocast (half the
/// memory). The forward pass computes with the f32 values and rounds them only as it
/// saves them: where the products are bf16 they round their f32 operands to the same
/// values as they pack them, and where they stay f32 (no bf16 hardware) nothing is widened
/// back in the forward pass, which is what kept mixed precision from being as fast as f32
/// there (2 % slower on the MiniLM step).
enum Act {
    F32(Vec<f32>),
    Bf16(Vec<half::bf16>),
}

impl Act {
    /// Keeps `v`, rounded to bf16 when `bf16` (the f32 buffer then goes back to scratch).
    fn keep(v: Vec<f32>, bf16: bool) -> Act {
        if !bf16 {
            return Act::F32(v);
        }
        let _span = crate::trace::op_span("bf16-round", "op.fwd");
        let h = bf16::rounded(&v);
        scratch::give(v);
        Act::Bf16(h)
    }

    /// As a `[rows, cols]` GEMM operand.
    fn operand(&self, cols: usize) -> Operand<'_> {
        match self {
            Act::F32(v) => Operand::F32(Mat::new(v, cols)),
            Act::Bf16(v) => Operand::bf16(v, cols),
        }
    }

    /// The values in f32 (widened into a new buffer when stored in bf16); `cat` is the
    /// profiler's category of the pass asking (`op.fwd` or `op.bwd`).
    fn f32(&self, cat: &'static str) -> Cow<'_, [f32]> {
        match self {
            Act::F32(v) => Cow::Borrowed(v),
            Act::Bf16(v) => {
                let _span = crate::trace::op_span("bf16-widen", cat);
                let mut w = scratch::take(v.len());
                bf16::widen_into(v, &mut w);
                Cow::Owned(w)
            }
        }
    }

    /// Returns an f32 buffer to [`scratch`].
    fn recycle(self) {
        if let Act::F32(v) = self {
            scratch::give(v)
        }
    }
}

/// Returns a widened copy to [`scratch`] (a borrowed view is left alone).
fn recycle(v: Cow<'_, [f32]>) {
    if let Cow::Owned(v) = v {
        scratch::give(v)
    }
}

/// A layer norm's scale and shift (`[hidden]` each) with their sinks.
#[derive(Debug, Clone)]
pub struct SinkNorm {
    /// Scale.
    pub gamma: Tensor,
    /// Shift.
    pub beta: Tensor,
    /// Receives the scale's gradient.
    pub gamma_sink: GradSink,
    /// Receives the shift's gradient.
    pub beta_sink: GradSink,
    /// Added to the variance.
    pub eps: f32,
}

impl SinkNorm {
    fn check(&self, d: usize) -> Result<()> {
        let sizes = [
            self.gamma.elem_count(),
            self.beta.elem_count(),
            self.gamma_sink.len(),
            self.beta_sink.len(),
        ];
        if sizes.iter().any(|&n| n != d) {
            bail!("sublayer: the layer norm has sizes {sizes:?}, the hidden size is {d}")
        }
        Ok(())
    }

    /// Writes dgamma and dbeta into the sinks.
    fn write_grads(&self, dg: &[f32], db: &[f32]) {
        self.gamma_sink.accumulate(dg);
        self.beta_sink.accumulate(db);
    }
}

/// Where a sublayer's layer norm sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Norm {
    /// `norm(x + dropout(f(x)))`: BERT.
    Post,
    /// `x + dropout(f(norm(x)))`: ViT and GPT-style.
    Pre,
}

/// The first `keep` positions of each sequence of `seq`: the only rows a model's last layer
/// needs to compute when the model reads no others (a classifier pooling the `[CLS]`
/// token). The sublayers computing them draw dropout as for the whole `[batch, seq, …]`
/// tensor, so their rows equal those of the whole computation, masks included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Firsts {
    /// Positions kept per sequence.
    pub keep: usize,
    /// Sequence length.
    pub seq: usize,
}

impl Firsts {
    /// Row `r` of the kept rows as a row of the whole `[batch · seq]` tensor.
    fn full_row(self, r: usize) -> usize {
        (r / self.keep) * self.seq + r % self.keep
    }

    /// The first `width` columns of the kept rows of `x` (rows `ld` apart, `batch · seq`
    /// of them), as a `[batch · keep, width]` matrix.
    fn gather(self, x: &[f32], ld: usize, width: usize, batch: usize) -> Vec<f32> {
        let mut out = scratch::take(batch * self.keep * width);
        for_rows(&mut out, width, |r, o| {
            let f = self.full_row(r) * ld;
            o.copy_from_slice(&x[f..f + width])
        });
        out
    }

    /// Adds `src` (`[batch · keep, d]`) into the kept rows of `dst` (`[batch · seq, d]`).
    fn add_into(self, dst: &mut [f32], src: &[f32], d: usize) {
        for (r, v) in src.chunks(d).enumerate() {
            let f = self.full_row(r) * d;
            dst[f..f + d].iter_mut().zip(v).for_each(|(a, b)| *a += b);
        }
    }
}

/// The self-attention sublayer on `x` `[batch, seq, hidden]`: the Q/K/V projections (one
/// GEMM on their stacked weights), multi-head attention as
/// [`crate::dense::attention_packed`] (`bias`, `heads` and `attention_dropout` as there),
/// the output projection, then `hidden_dropout`, the residual add and `norm` placed as
/// `placement` says. One op; its backward pass writes all ten parameter gradients
/// into their sinks.
///
/// With `queries`, only the first that many positions of each sequence are computed
/// (`[batch, queries, hidden]`, every key still attended to): their queries, attention,
/// output projection and norm; the keys and values of every position.
#[allow(clippy::too_many_arguments)]
pub fn self_attention(
    x: &Tensor,
    qkv: [&SinkLinear; 3],
    out: &SinkLinear,
    norm: &SinkNorm,
    placement: Norm,
    bias: Option<&Tensor>,
    heads: usize,
    attention_dropout: Option<(f32, u64)>,
    hidden_dropout: Option<(f32, u64)>,
    queries: Option<usize>,
) -> Result<Tensor> {
    let (b, s, hidden) = x.dims3()?;
    for l in qkv.iter().chain([&out]) {
        if l.dims("self-attention")? != (hidden, hidden) {
            bail!(
                "self-attention: a projection is {:?}, the hidden size is {hidden}",
                l.weight.dims()
            )
        }
    }
    let with_bias = qkv.iter().filter(|l| l.bias.is_some()).count();
    if with_bias != 0 && with_bias != 3 {
        bail!("self-attention: query, key and value must all have a bias or none")
    }
    let weights: Vec<&Tensor> = qkv.iter().map(|l| &l.weight).collect();
    let packed_w = Tensor::cat(&weights, 0)?.detach();
    let packed_b = match with_bias {
        3 => {
            let bs: Vec<&Tensor> = qkv.iter().filter_map(|l| l.bias.as_ref()).collect();
            Some(Tensor::cat(&bs, 0)?.detach())
        }
        _ => None,
    };
    let inner = Inner::Attention {
        qkv: Box::new(qkv.map(|l| l.clone())),
        out: out.clone(),
        packed_w,
        packed_b,
        attention: Attention::new(b, s, hidden, bias, heads, attention_dropout)?.first_queries(s, queries)?,
        batch: b,
    };
    let positions = inner.firsts(b * s);
    Sublayer::apply(x, inner, norm, placement, hidden_dropout, positions)
}

/// The feed-forward sublayer on `x` `[..., hidden]`: `gelu(x · w1ᵀ + b1) · w2ᵀ + b2`, then
/// `hidden_dropout`, the residual add and `norm` placed as `placement` says. One op; its
/// backward pass writes all six parameter gradients into their sinks. `positions`: `x`
/// holds only these rows of a longer sequence (after a [`self_attention`] with `queries`),
/// and dropout is drawn as for the whole sequence.
pub fn feed_forward(
    x: &Tensor,
    inter: &SinkLinear,
    out: &SinkLinear,
    norm: &SinkNorm,
    placement: Norm,
    hidden_dropout: Option<(f32, u64)>,
    positions: Option<Firsts>,
) -> Result<Tensor> {
    let (n1, k1) = inter.dims("feed-forward")?;
    let (n2, k2) = out.dims("feed-forward")?;
    if k2 != n1 || n2 != k1 {
        bail!(
            "feed-forward: layers {:?} and {:?} do not chain back to the input width",
            inter.weight.dims(),
            out.weight.dims()
        )
    }
    let inner = Inner::FeedForward {
        inter: inter.clone(),
        out: out.clone(),
    };
    Sublayer::apply(x, inner, norm, placement, hidden_dropout, positions)
}

/// The function inside a sublayer, on `[rows, hidden]` slices.
enum Inner {
    Attention {
        qkv: Box<[SinkLinear; 3]>,
        out: SinkLinear,
        /// `[3 · hidden, hidden]`: query, key and value weights stacked.
        packed_w: Tensor,
        packed_b: Option<Tensor>,
        attention: Attention,
        batch: usize,
    },
    FeedForward {
        inter: SinkLinear,
        out: SinkLinear,
    },
}

/// Optional tensor view: binds the guard and yields the slice.
macro_rules! view_opt {
    ($t:expr, $guard:ident, $what:expr) => {
        match &$t {
            Some(t) => Some(view!(t, $guard, $what)),
            None => None,
        }
    };
}

impl Inner {
    /// The rows this function computes of an input of `m` rows, when not all: an attention
    /// asked for its first queries only.
    fn firsts(&self, m: usize) -> Option<Firsts> {
        match self {
            Inner::Attention { attention, batch, .. } => {
                let seq = m / (*batch).max(1);
                let keep = attention.rows(seq);
                (keep < seq).then_some(Firsts { keep, seq })
            }
            Inner::FeedForward { .. } => None,
        }
    }

    /// The output `[m, d]` for input `x` `[m, d]` (`[batch · keep, d]` for an attention
    /// asked for its [`Firsts`]), and what the backward pass needs: for
    /// attention the projection `[m, 3d]` and the attention output `[m, d]`; for the
    /// feed-forward network GELU's derivative at the pre-activation and the activation
    /// (`[m, inter]` each). With `bf16` the products run in bf16 and the saved tensors are
    /// bf16; the attention scores, softmax and GELU stay f32.
    fn forward(&self, x: &[f32], m: usize, d: usize, bf16: bool) -> Result<(Vec<f32>, [Act; 2])> {
        let xo = Operand::F32(Mat::new(x, d));
        let (g1, g2, g3, g4);
        match self {
            Inner::Attention {
                out,
                packed_w,
                packed_b,
                attention,
                batch,
                ..
            } => {
                let wqkv = view!(packed_w, g1, "self-attention weight");
                let bqkv = view_opt!(packed_b, g2, "self-attention bias");
                let wo = view!(out.weight, g3, "self-attention weight");
                let bo = view_opt!(out.bias, g4, "self-attention bias");
                let seq = m / batch;
                let projected = match self.firsts(m) {
                    None => affine(xo, m, d, wqkv, 3 * d, bqkv, bf16),
                    Some(f) => project_firsts(f, x, m, d, wqkv, bqkv, *batch, bf16),
                };
                let merged = {
                    let _core = attention.core_span(*batch, seq, d, false);
                    attention.forward_slices(&projected, *batch, seq, 3 * d)
                };
                let qkv = Act::keep(projected, bf16);
                let rows = self.firsts(m).map_or(m, |f| batch * f.keep);
                let y = affine(Operand::F32(Mat::new(&merged, d)), rows, d, wo, d, bo, bf16);
                Ok((y, [qkv, Act::keep(merged, bf16)]))
            }
            Inner::FeedForward { inter, out } => {
                let n1 = inter.weight.dim(0)?;
                let w1 = view!(inter.weight, g1, "feed-forward weight");
                let b1 = view_opt!(inter.bias, g2, "feed-forward bias");
                let w2 = view!(out.weight, g3, "feed-forward weight");
                let b2 = view_opt!(out.bias, g4, "feed-forward bias");
                // The pre-activation is overwritten by GELU's derivative: the backward pass
                // needs only that.
                let mut h = affine(xo, m, d, w1, n1, b1, bf16);
                let mut a = scratch::take(h.len());
                {
                    let _gelu = crate::trace::op_span("gelu", "op.fwd");
                    a.par_chunks_mut(BLOCK)
                        .zip(h.par_chunks_mut(BLOCK))
                        .for_each(|(a, h)| crate::math::gelu_with_derivative(h, a));
                }
                let y = affine(Operand::F32(Mat::new(&a, n1)), m, n1, w2, d, b2, bf16);
                Ok((y, [Act::keep(h, bf16), Act::keep(a, bf16)]))
            }
        }
    }

    /// The input gradient `[m, d]` from the output gradient `g`; the parameter gradients
    /// go into the sinks.
    fn backward(
        &self,
        x: &[f32],
        m: usize,
        d: usize,
        saved: &[Act; 2],
        g: &[f32],
        bf16: bool,
    ) -> Result<Vec<f32>> {
        let (g1, g2);
        let (xo, go) = (Operand::F32(Mat::new(x, d)), Operand::F32(Mat::new(g, d)));
        match self {
            Inner::Attention {
                qkv,
                out,
                packed_w,
                packed_b,
                attention,
                batch,
            } => {
                let [qkv_v, merged] = saved;
                let wqkv = view!(packed_w, g1, "self-attention weight");
                let wo = view!(out.weight, g2, "self-attention weight");
                let firsts = self.firsts(m);
                // Rows of the output (and of `g`).
                let rows = firsts.map_or(m, |f| batch * f.keep);
                // Output projection.
                let dbo = out.bias.is_some().then(|| column_sums(g, rows, d));
                out.write_grads(go, merged.operand(d), rows, d, d, dbo.as_deref(), bf16);
                let mut dmerged = scratch::take(rows * d);
                let wo = Operand::F32(Mat::new(wo, d));
                bf16::matmul(bf16, rows, d, d, go, wo, 0.0, &mut dmerged);
                // Attention, then the three projections: each weight gradient from its
                // column block of dqkv, read in place with row stride 3 · hidden.
                let qkv_f32 = qkv_v.f32("op.bwd");
                let seq = m / batch;
                let dqkv = {
                    let _core = attention.core_span(*batch, seq, d, true);
                    attention.backward_slices(&qkv_f32, &dmerged, *batch, seq, 3 * d)
                };
                recycle(qkv_f32);
                scratch::give(dmerged);
                let dbqkv = packed_b.is_some().then(|| column_sums(&dqkv, m, 3 * d));
                let dx =
                    projections_backward(firsts, qkv, x, m, d, wqkv, &dqkv, dbqkv.as_deref(), *batch, bf16);
                scratch::give(dqkv);
                Ok(dx)
            }
            Inner::FeedForward { inter, out } => {
                let [derivative, a] = saved;
                let n1 = inter.weight.dim(0)?;
                let w1 = view!(inter.weight, g1, "feed-forward weight");
                let w2 = view!(out.weight, g2, "feed-forward weight");
                // Output layer: dW2 = gᵀ · a, db2 = Σ g, da = g · W2.
                let db2 = out.bias.is_some().then(|| column_sums(g, m, d));
                out.write_grads(go, a.operand(n1), m, d, n1, db2.as_deref(), bf16);
                let mut dh = scratch::take(m * n1);
                bf16::matmul(bf16, m, n1, d, go, Operand::F32(Mat::new(w2, n1)), 0.0, &mut dh);
                // Through GELU (times its saved derivative), then the first layer.
                match derivative {
                    Act::F32(dv) => dh
                        .par_chunks_mut(BLOCK)
                        .zip(dv.par_chunks(BLOCK))
                        .for_each(|(g, d)| g.iter_mut().zip(d).for_each(|(g, d)| *g *= d)),
                    Act::Bf16(dv) => dh
                        .par_chunks_mut(BLOCK)
                        .zip(dv.par_chunks(BLOCK))
                        .for_each(|(g, d)| {
                            g.iter_mut()
                                .zip(d)
                                .for_each(|(g, d)| *g *= bf16::widen(d.to_bits()))
                        }),
                }
                let db1 = inter.bias.is_some().then(|| column_sums(&dh, m, n1));
                let dho = Operand::F32(Mat::new(&dh, n1));
                inter.write_grads(dho, xo, m, n1, d, db1.as_deref(), bf16);
                let mut dx = vec![0f32; m * d];
                bf16::matmul(bf16, m, d, n1, dho, Operand::F32(Mat::new(w1, d)), 0.0, &mut dx);
                scratch::give(dh);
                Ok(dx)
            }
        }
    }
}

/// The packed `[m, 3d]` projection of an attention asked for its [`Firsts`]: keys and values
/// of every row, queries of the kept rows only (the other rows' query columns are 0 and
/// never read). Two products instead of one: a third of the projection's work for the rows
/// not kept is saved.
#[allow(clippy::too_many_arguments)]
fn project_firsts(
    f: Firsts,
    x: &[f32],
    m: usize,
    d: usize,
    wqkv: &[f32],
    bqkv: Option<&[f32]>,
    batch: usize,
    bf16: bool,
) -> Vec<f32> {
    let xq = f.gather(x, d, d, batch);
    let rows = batch * f.keep;
    let q = affine(
        Operand::F32(Mat::new(&xq, d)),
        rows,
        d,
        &wqkv[..d * d],
        d,
        bqkv.map(|b| &b[..d]),
        bf16,
    );
    let kv = affine(
        Operand::F32(Mat::new(x, d)),
        m,
        d,
        &wqkv[d * d..],
        2 * d,
        bqkv.map(|b| &b[d..]),
        bf16,
    );
    let mut packed = scratch::take(m * 3 * d);
    for_rows(&mut packed, 3 * d, |r, o| {
        let (i, p) = (r / f.seq, r % f.seq);
        if p < f.keep {
            let at = (i * f.keep + p) * d;
            o[..d].copy_from_slice(&q[at..at + d]);
        } else {
            o[..d].fill(0.0);
        }
        o[d..].copy_from_slice(&kv[r * 2 * d..(r + 1) * 2 * d]);
    });
    scratch::give(xq);
    scratch::give(q);
    scratch::give(kv);
    packed
}

/// The Q/K/V projections' backward pass from the packed gradient `dqkv` (`[m, 3d]`):
/// each weight's gradient into its sink and the input gradient `[m, d]`. For an attention
/// asked for its [`Firsts`] the query columns are 0 outside the kept rows, so the query
/// weight's gradient and its share of the input gradient come from the kept rows only,
/// the key and value weights' from every row.
#[allow(clippy::too_many_arguments)]
fn projections_backward(
    firsts: Option<Firsts>,
    qkv: &[SinkLinear; 3],
    x: &[f32],
    m: usize,
    d: usize,
    wqkv: &[f32],
    dqkv: &[f32],
    dbqkv: Option<&[f32]>,
    batch: usize,
    bf16: bool,
) -> Vec<f32> {
    // The blocks (0: query, 1: key, 2: value) whose products run over every row.
    let from = usize::from(firsts.is_some());
    let block = |i: usize| {
        Operand::F32(Mat {
            data: &dqkv[i * d..],
            ld: 3 * d,
            trans: false,
        })
    };
    for (i, l) in qkv.iter().enumerate().skip(from) {
        let db = dbqkv.map(|v| &v[i * d..(i + 1) * d]);
        l.write_grads(block(i), Operand::F32(Mat::new(x, d)), m, d, d, db, bf16);
    }
    let mut dx = vec![0f32; m * d];
    let w = Operand::F32(Mat::new(&wqkv[from * d * d..], d));
    bf16::matmul(bf16, m, d, (3 - from) * d, block(from), w, 0.0, &mut dx);
    if let Some(f) = firsts {
        let rows = batch * f.keep;
        let xq = f.gather(x, d, d, batch);
        let dq = f.gather(dqkv, 3 * d, d, batch);
        let (xqo, dqo) = (Operand::F32(Mat::new(&xq, d)), Operand::F32(Mat::new(&dq, d)));
        qkv[0].write_grads(dqo, xqo, rows, d, d, dbqkv.map(|v| &v[..d]), bf16);
        let mut dxq = scratch::take(rows * d);
        let wq = Operand::F32(Mat::new(&wqkv[..d * d], d));
        bf16::matmul(bf16, rows, d, d, dqo, wq, 0.0, &mut dxq);
        f.add_into(&mut dx, &dxq, d);
        scratch::give(dxq);
        scratch::give(xq);
        scratch::give(dq);
    }
    dx
}

/// A sublayer as one candle op.
struct Sublayer {
    inner: Inner,
    norm: SinkNorm,
    placement: Norm,
    dropout: Option<DropMask>,
    /// Products and saved activations in bf16 ([`bf16::autocast`] when the op was made).
    bf16: bool,
    /// The model layer this sublayer ran for (profiling), kept for its backward pass.
    layer: LayerTag,
    /// The output rows are these positions of longer sequences (dropout is drawn as for
    /// the whole sequences).
    positions: Option<Firsts>,
    /// The inner function's saved tensors, and the layer norm's input: the residual sum
    /// (post-norm) or the sublayer input (pre-norm, whose normalised value is saved as
    /// the inner function's input in `normed`).
    saved: Mutex<Option<Saved>>,
}

struct Saved {
    inner: [Act; 2],
    /// Post-norm: the residual sum `x + dropout(f(x))`. Pre-norm: `norm(x)`.
    kept: Vec<f32>,
}

impl Drop for Sublayer {
    /// The saved buffers go back to [`scratch`] for the next step's forward pass.
    fn drop(&mut self) {
        let saved = self.saved.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(Saved { inner, kept }) = saved {
            inner.into_iter().for_each(Act::recycle);
            scratch::give(kept);
        }
    }
}

impl Sublayer {
    fn apply(
        x: &Tensor,
        inner: Inner,
        norm: &SinkNorm,
        placement: Norm,
        dropout: Option<(f32, u64)>,
        positions: Option<Firsts>,
    ) -> Result<Tensor> {
        let d = x.dim(candle_core::D::Minus1)?;
        norm.check(d)?;
        let op = Sublayer {
            positions,
            inner,
            norm: norm.clone(),
            placement,
            dropout: DropMask::from_option("sublayer", dropout)?,
            bf16: bf16::autocast_enabled(),
            layer: LayerTag::capture(),
            saved: Mutex::new(None),
        };
        x.contiguous()?.apply_op2(&norm.gamma, op)
    }

    /// The dropout multiplier of element `i` of the output (rows of `d`), drawn at its
    /// place in the whole sequences.
    fn drop_scale(&self, mask: &DropMask, i: usize, d: usize) -> f32 {
        match self.positions {
            None => mask.scale(i),
            Some(f) => mask.scale(f.full_row(i / d) * d + i % d),
        }
    }

    /// `y = dropout(y) + x` in place (rows of `d`).
    fn drop_and_add(&self, y: &mut [f32], x: &[f32], d: usize) {
        y.par_chunks_mut(BLOCK)
            .zip(x.par_chunks(BLOCK))
            .enumerate()
            .for_each(|(c, (y, x))| match &self.dropout {
                None => y.iter_mut().zip(x).for_each(|(y, x)| *y += x),
                Some(mask) => {
                    let base = c * BLOCK;
                    y.iter_mut()
                        .zip(x)
                        .enumerate()
                        .for_each(|(j, (y, x))| *y = *y * self.drop_scale(mask, base + j, d) + x)
                }
            });
    }

    /// `v` times the dropout mask (a copy), or `v` itself without dropout (rows of `d`).
    fn dropped<'a>(&self, v: &'a [f32], d: usize) -> std::borrow::Cow<'a, [f32]> {
        match &self.dropout {
            None => std::borrow::Cow::Borrowed(v),
            Some(mask) => {
                let mut out = vec![0f32; v.len()];
                for_rows(&mut out, BLOCK, |c, o| {
                    let base = c * BLOCK;
                    o.iter_mut()
                        .zip(&v[base..])
                        .enumerate()
                        .for_each(|(j, (o, v))| *o = v * self.drop_scale(mask, base + j, d))
                });
                std::borrow::Cow::Owned(out)
            }
        }
    }

    /// Adds the residual path's gradient `g` (the output's rows) into `dx` (the input's `m`
    /// rows of `d`).
    fn add_residual_grad(&self, dx: &mut [f32], g: &[f32], m: usize, d: usize) {
        match self.inner.firsts(m) {
            None => dx.iter_mut().zip(g).for_each(|(a, b)| *a += b),
            Some(f) => f.add_into(dx, g, d),
        }
    }

    /// The residual stream's rows this sublayer adds to: all of `x`, or its kept rows.
    fn residual<'a>(&self, x: &'a [f32], m: usize, d: usize) -> Cow<'a, [f32]> {
        match self.inner.firsts(m) {
            None => Cow::Borrowed(x),
            Some(f) => Cow::Owned(f.gather(x, d, d, m / f.seq)),
        }
    }
}

impl Sublayer {
    /// The profiler's name for this block and the FLOPs of its forward matrix products
    /// (input `dims` = `[…, hidden]`): Q/K/V and output projections (the two attention
    /// products are counted by their own span, `attention-core`), or the two feed-forward
    /// projections.
    fn cost(&self, dims: &[usize]) -> (&'static str, u64) {
        let d = dims.last().copied().unwrap_or(1).max(1);
        let m = (dims.iter().product::<usize>() / d) as u64;
        let d = d as u64;
        match &self.inner {
            Inner::Attention { .. } => {
                // Keys and values of every row; queries and output of the rows computed.
                let kept = self
                    .inner
                    .firsts(m as usize)
                    .map_or(m, |f| m / f.seq as u64 * f.keep as u64);
                ("attention-block", 2 * m * d * 2 * d + 2 * kept * d * 2 * d)
            }
            Inner::FeedForward { inter, .. } => {
                let i = inter.weight.dims().first().copied().unwrap_or(0) as u64;
                ("feed-forward-block", 4 * m * d * i)
            }
        }
    }
}

impl CustomOp2 for Sublayer {
    fn name(&self) -> &'static str {
        "trident-sublayer"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (kind, flops) = self.cost(l1.dims());
        let _span = kernel::forward_flops(kind, flops);
        let x = f32_slice(s1, l1, "sublayer")?;
        // `apply` checked the last dimension against the layer norm.
        let d = l1.dims().last().copied().unwrap_or(1);
        let m = x.len() / d;
        let (g1, g2);
        let gamma = view!(self.norm.gamma, g1, "layer norm scale");
        let beta = view!(self.norm.beta, g2, "layer norm shift");
        let eps = self.norm.eps;
        let (out, saved) = match self.placement {
            Norm::Post => {
                let (mut sum, inner) = self.inner.forward(x, m, d, self.bf16)?;
                let residual = self.residual(x, m, d);
                self.drop_and_add(&mut sum, &residual, d);
                recycle(residual);
                let mut out = sum.clone();
                for_rows(&mut out, d, |_, o| normalize_row(o, gamma, beta, eps));
                (out, Saved { inner, kept: sum })
            }
            Norm::Pre => {
                let mut normed = scratch::take(x.len());
                for_rows(&mut normed, d, |i, o| {
                    o.copy_from_slice(&x[i * d..(i + 1) * d]);
                    normalize_row(o, gamma, beta, eps)
                });
                let (mut out, inner) = self.inner.forward(&normed, m, d, self.bf16)?;
                let residual = self.residual(x, m, d);
                self.drop_and_add(&mut out, &residual, d);
                recycle(residual);
                (out, Saved { inner, kept: normed })
            }
        };
        *self.saved.lock().unwrap_or_else(|e| e.into_inner()) = Some(saved);
        let shape = match self.inner.firsts(m) {
            None => l1.shape().clone(),
            Some(f) => Shape::from((m / f.seq, f.keep, d)),
        };
        kernel::output(out, shape)
    }

    fn bwd(
        &self,
        x: &Tensor,
        _: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (kind, flops) = self.cost(x.dims());
        let _span = self.layer.backward(kind, 2 * flops);
        let g = g.contiguous()?;
        let d = x.dim(candle_core::D::Minus1)?;
        let saved = self.saved.lock().unwrap_or_else(|e| e.into_inner());
        let Some(saved) = saved.as_ref() else {
            bail!("sublayer backward: the forward pass saved nothing")
        };
        let (gx, gg, g1);
        let xs = view!(x, gx, "sublayer backward");
        let gs = view!(g, gg, "sublayer backward");
        let gamma = view!(self.norm.gamma, g1, "layer norm scale");
        let m = xs.len() / d.max(1);
        let dx = match self.placement {
            Norm::Post => {
                // Through the norm to the residual sum; the sum's gradient goes to x
                // directly and, through the dropout mask, into the inner function.
                let (dsum, dg, db) = layer_norm_grads(&saved.kept, gs, gamma, d, self.norm.eps);
                self.norm.write_grads(&dg, &db);
                let mut dx =
                    self.inner
                        .backward(xs, m, d, &saved.inner, &self.dropped(&dsum, d), self.bf16)?;
                self.add_residual_grad(&mut dx, &dsum, m, d);
                dx
            }
            Norm::Pre => {
                let dnormed =
                    self.inner
                        .backward(&saved.kept, m, d, &saved.inner, &self.dropped(gs, d), self.bf16)?;
                let (mut dx, dg, db) = layer_norm_grads(xs, &dnormed, gamma, d, self.norm.eps);
                self.norm.write_grads(&dg, &db);
                self.add_residual_grad(&mut dx, gs, m, d);
                dx
            }
        };
        Ok((Some(Tensor::from_vec(dx, x.shape(), x.device())?), None))
    }
}
