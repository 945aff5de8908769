//! Dense operations on [`crate::blas`]: a linear layer with its bias fused into the GEMM
//! (the weight read transposed in place, no copy of `wᵀ`), multi-head attention on a packed
//! Q/K/V projection, and GELU; each a candle custom op whose backward pass is again a few
//! GEMMs or one element-wise pass. (The element-wise activations are kernels of
//! [`crate::ops`], below this module, since batch norm's fused activations use them too;
//! they are re-exported here.) Checked against PyTorch in `tests/vs_torch.rs` and
//! against candle's own ops in this module's tests.

use crate::bf16::{self, Operand};
use crate::blas::{self, Mat};
use crate::kernel::{self, cpu_slice, f32_slice, LayerTag};
pub(crate) use crate::ops::activation::logistic_f64;
pub use crate::ops::activation::{gelu, leaky_relu, relu, relu6, sigmoid};
use crate::ops::DropMask;
use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

// ---------------------------------------------------------------- linear

/// `x · wᵀ + b` for `x` of shape `[..., in]`, `w` `[out, in]` (PyTorch's layout) and `b`
/// `[out]`: one GEMM that accumulates onto the broadcast bias; the backward pass is two
/// GEMMs and a column sum. The leading dimensions are taken as rows in place, with no
/// reshape nodes (each node in candle's graph costs a zero-filled gradient and an add in
/// the backward pass). Under [`bf16::autocast`] the three products run in bf16 with f32
/// accumulation; input, output and gradients stay f32.
pub fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    let (x, w) = (x.contiguous()?, w.contiguous()?);
    let op = Linear {
        bf16: bf16::autocast_enabled(),
        layer: LayerTag::capture(),
    };
    match b {
        Some(b) => x.apply_op3(&w, &b.contiguous()?, op),
        None => x.apply_op2(&w, op),
    }
}

struct Linear {
    /// Products in bf16 (the mode when the op was created).
    bf16: bool,
    /// The model layer this kernel ran for (profiling), kept for its backward pass.
    layer: LayerTag,
}

/// (rows, in, out, output dims) of a linear layer, or an error naming the shapes.
fn linear_dims(lx: &Layout, lw: &Layout) -> Result<(usize, usize, usize, Vec<usize>)> {
    let (dx, dw) = (lx.dims(), lw.dims());
    match (dx.last(), dw) {
        (Some(&inp), &[out, win]) if inp == win => {
            let mut dims = dx.to_vec();
            *dims.last_mut().expect("non-empty") = out;
            Ok((lx.shape().elem_count() / inp.max(1), inp, out, dims))
        }
        _ => bail!("linear: input {dx:?} does not match weight {dw:?} ([out, in])"),
    }
}

impl Linear {
    fn forward(
        &self,
        x: &[f32],
        lx: &Layout,
        w: &[f32],
        lw: &Layout,
        bias: Option<&[f32]>,
    ) -> Result<(CpuStorage, Shape)> {
        let (m, k, n, dims) = linear_dims(lx, lw)?;
        if let Some(bias) = bias.filter(|b| b.len() != n) {
            bail!(
                "linear: bias has {} elements, the layer has {n} outputs",
                bias.len()
            )
        }
        let out = affine(Operand::F32(Mat::new(x, k)), m, k, w, n, bias, self.bf16);
        kernel::output(out, Shape::from(dims))
    }

    /// (dx, dw, db) from the saved input and weight and the output gradient.
    fn backward(
        &self,
        x: &Tensor,
        w: &Tensor,
        g: &Tensor,
        bias: bool,
    ) -> Result<(Tensor, Tensor, Option<Tensor>)> {
        let g = g.contiguous()?;
        let (m, k, n, _) = linear_dims(x.layout(), w.layout())?;
        let (dx, dw);
        let db = {
            let (sx, lx) = x.storage_and_layout();
            let (sw, lw) = w.storage_and_layout();
            let (sg, lg) = g.storage_and_layout();
            let xs = cpu_slice(&sx, lx, "linear backward")?;
            let ws = cpu_slice(&sw, lw, "linear backward")?;
            let gs = cpu_slice(&sg, lg, "linear backward")?;
            let (g, w, x) = (
                Operand::F32(Mat::new(gs, n)),
                Operand::F32(Mat::new(ws, k)),
                Operand::F32(Mat::new(xs, k)),
            );
            // Written whole by the products (beta = 0), not zero-filled first.
            // SAFETY: `matmul_into` writes all m · k (n · k) values.
            dx =
                unsafe { crate::scratch::written(m * k, |c| bf16::matmul_into(self.bf16, m, k, n, g, w, c)) };
            dw = unsafe {
                crate::scratch::written(n * k, |c| bf16::matmul_into(self.bf16, n, k, m, g.t(), x, c))
            };
            bias.then(|| column_sums(gs, m, n))
        };
        let dev = x.device();
        Ok((
            Tensor::from_vec(dx, x.shape(), dev)?,
            Tensor::from_vec(dw, w.shape(), dev)?,
            db.map(|v| Tensor::from_vec(v, n, dev)).transpose()?,
        ))
    }
}

/// `2·m·n·k` for `x` `[…, k]` times `w` `[n, k]`ᵀ.
fn linear_flops(x: &[usize], w: &[usize]) -> u64 {
    let k = x.last().copied().unwrap_or(0).max(1);
    let m = x.iter().product::<usize>() / k;
    2 * (m * k * w.first().copied().unwrap_or(0)) as u64
}

impl CustomOp2 for Linear {
    fn name(&self) -> &'static str {
        "trident-linear"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let _span = kernel::forward_flops("linear", linear_flops(l1.dims(), l2.dims()));
        let x = f32_slice(s1, l1, "linear")?;
        let w = f32_slice(s2, l2, "linear weight")?;
        self.forward(x, l1, w, l2, None)
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let _span = self
            .layer
            .backward("linear", 2 * linear_flops(x.dims(), w.dims()));
        let (dx, dw, _) = self.backward(x, w, g, false)?;
        Ok((Some(dx), Some(dw)))
    }
}

impl CustomOp3 for Linear {
    fn name(&self) -> &'static str {
        "trident-linear"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let _span = kernel::forward_flops("linear", linear_flops(l1.dims(), l2.dims()));
        let x = f32_slice(s1, l1, "linear")?;
        let w = f32_slice(s2, l2, "linear weight")?;
        let bias = f32_slice(s3, l3, "linear bias")?;
        self.forward(x, l1, w, l2, Some(bias))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let _span = self
            .layer
            .backward("linear", 2 * linear_flops(x.dims(), w.dims()));
        let (dx, dw, db) = self.backward(x, w, g, true)?;
        Ok((Some(dx), Some(dw), db))
    }
}

/// `x · wᵀ + b` on slices: `x` `[m, k]`, `w` `[n, k]`, `bias` `[n]` (checked by the caller);
/// the product in bf16 when `bf16`.
pub(crate) fn affine(
    x: Operand,
    m: usize,
    k: usize,
    w: &[f32],
    n: usize,
    bias: Option<&[f32]>,
    bf16: bool,
) -> Vec<f32> {
    let mut out = crate::scratch::take(m * n);
    let beta = match bias {
        Some(bias) => {
            out.par_chunks_mut(n.max(1) * 64)
                .for_each(|c| c.chunks_mut(n.max(1)).for_each(|r| r.copy_from_slice(bias)));
            1.0
        }
        None => 0.0,
    };
    bf16::matmul(bf16, m, n, k, x, Operand::F32(Mat::new(w, k).t()), beta, &mut out);
    out
}

/// Sums a row-major `[rows, cols]` matrix over its rows (a bias gradient).
pub(crate) fn column_sums(g: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let chunk = rows.div_ceil(rayon::current_num_threads().max(1)).max(1);
    let partials: Vec<Vec<f32>> = g[..rows * cols]
        .par_chunks((chunk * cols).max(1))
        .map(|block| {
            let mut acc = vec![0f32; cols];
            for row in block.chunks(cols.max(1)) {
                acc.iter_mut().zip(row).for_each(|(a, v)| *a += v);
            }
            acc
        })
        .collect();
    let mut out = vec![0f32; cols];
    for p in partials {
        out.iter_mut().zip(&p).for_each(|(a, v)| *a += v);
    }
    out
}

// ---------------------------------------------------------------- attention

/// Multi-head scaled dot-product attention, fused: `q`, `k`, `v` are `[batch, seq, heads ·
/// head_dim]`, and so is the result. `bias` is additive per key (`batch · seq` elements,
/// e.g. [`mask_bias`]: 0 for tokens, -1e9 for padding); `dropout` =
/// (p, seed) drops attention probabilities exactly as [`crate::ops::dropout`] would on the
/// `[batch, heads, seq, seq]` probability tensor. Concatenates q, k, v and calls
/// [`attention_packed`].
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: Option<&Tensor>,
    heads: usize,
    dropout: Option<(f32, u64)>,
) -> Result<Tensor> {
    if k.dims() != q.dims() || v.dims() != q.dims() {
        bail!(
            "attention: q, k, v shapes differ: {:?} {:?} {:?}",
            q.dims(),
            k.dims(),
            v.dims()
        )
    }
    attention_packed(&Tensor::cat(&[q, k, v], 2)?, bias, heads, dropout)
}

/// [`attention`] on one `[batch, seq, 3 · width]` tensor holding q, k and v side by side, as
/// a single projection to 3 · width produces them: no head is split out or merged back by a
/// copy, and the backward pass returns one gradient for the whole projection.
///
/// Per (sequence, head) the forward pass is one GEMM for the scores, one pass for bias,
/// softmax and dropout, one GEMM for the output; the probabilities are not kept: the
/// backward pass recomputes them (one more small GEMM) and then needs four GEMMs and one
/// pass for the softmax gradient.
pub fn attention_packed(
    qkv: &Tensor,
    bias: Option<&Tensor>,
    heads: usize,
    dropout: Option<(f32, u64)>,
) -> Result<Tensor> {
    attention_packed_first(qkv, bias, heads, dropout, None)
}

/// [`attention_packed`] for the first `queries` positions of each sequence only (all when
/// `None`): `[batch, queries, width]`, every key still attended to. The rows left out would
/// be discarded by a model that reads only its first positions (a classifier pooling the
/// `[CLS]` token), and the rows kept are those [`attention_packed`] gives, with the same
/// attention dropout.
pub fn attention_packed_first(
    qkv: &Tensor,
    bias: Option<&Tensor>,
    heads: usize,
    dropout: Option<(f32, u64)>,
    queries: Option<usize>,
) -> Result<Tensor> {
    let (b, s, width3) = qkv.dims3()?;
    if !width3.is_multiple_of(3) {
        bail!("attention: the packed q/k/v width {width3} is not a multiple of 3")
    }
    let op = Attention::new(b, s, width3 / 3, bias, heads, dropout)?.first_queries(s, queries)?;
    qkv.contiguous()?.apply_op1(op)
}

pub(crate) struct Attention {
    heads: usize,
    /// Only the first this many positions of each sequence ask (queries); all when `None`.
    queries: Option<usize>,
    /// `[batch · seq]` additive key bias.
    bias: Option<Vec<f32>>,
    dropout: Option<DropMask>,
    /// The model layer this kernel ran for (profiling), kept for its backward pass.
    layer: LayerTag,
}

/// One sequence's packed `[seq, 3 · width]` block and the geometry.
struct Seq<'a> {
    qkv: &'a [f32],
    /// Sequence length.
    s: usize,
    /// Head width.
    d: usize,
    /// heads · d.
    width: usize,
}

impl Seq<'_> {
    /// The columns of head `h` in part `part` (0: q, 1: k, 2: v), rows 3 · width apart.
    fn head(&self, part: usize, h: usize) -> Mat<'_> {
        Mat {
            data: &self.qkv[part * self.width + h * self.d..],
            ld: 3 * self.width,
            trans: false,
        }
    }
}

impl Attention {
    /// Checks the geometry and reads the key bias (`batch · seq` elements).
    pub(crate) fn new(
        b: usize,
        s: usize,
        width: usize,
        bias: Option<&Tensor>,
        heads: usize,
        dropout: Option<(f32, u64)>,
    ) -> Result<Self> {
        if heads == 0 || !width.is_multiple_of(heads) {
            bail!("attention: width {width} is not divisible by {heads} heads")
        }
        let bias = match bias {
            Some(t) if t.elem_count() != b * s => {
                bail!(
                    "attention: the key bias has shape {:?}, expected {b}·{s} elements",
                    t.dims()
                )
            }
            Some(t) => Some(t.flatten_all()?.to_vec1::<f32>()?),
            None => None,
        };
        let dropout = DropMask::from_option("attention", dropout)?;
        Ok(Attention {
            heads,
            queries: None,
            bias,
            dropout,
            layer: LayerTag::capture(),
        })
    }

    /// The same attention computed for the first `queries` positions of each sequence of `s`
    /// only (all when `None`).
    pub(crate) fn first_queries(mut self, s: usize, queries: Option<usize>) -> Result<Self> {
        if let Some(q) = queries {
            if q == 0 || q > s {
                bail!("attention: {q} query positions asked of sequences of {s}")
            }
        }
        self.queries = queries.filter(|&q| q < s);
        Ok(self)
    }

    /// The positions of a sequence of `s` that ask: its first [`Self::first_queries`].
    pub(crate) fn rows(&self, s: usize) -> usize {
        self.queries.map_or(s, |q| q.min(s))
    }

    /// The keys of sequence `i` (of `s`) that can receive attention: all but a suffix
    /// masked out by the bias (padding, ≤ −1e4: its probability is exactly 0 after the
    /// softmax, whose exponential flushes to 0 far above that). Leaving them out of the
    /// products changes no bit of the result and saves their share of the work. A fully
    /// masked row keeps every key (its softmax is uniform).
    fn live_keys(&self, i: usize, s: usize) -> usize {
        const MASKED: f32 = -1e4;
        let Some(bias) = &self.bias else { return s };
        let row = &bias[i * s..(i + 1) * s];
        match row.iter().rposition(|&b| b > MASKED) {
            Some(last) => last + 1,
            None => s,
        }
    }

    /// (query, key) pairs the products cover over a batch of `b` sequences of `s`.
    pub(crate) fn live_pairs(&self, b: usize, s: usize) -> usize {
        (0..b).map(|i| self.rows(s) * self.live_keys(i, s)).sum()
    }

    /// The profiler span of the core over `b` sequences of `s` and `width` columns, with
    /// the FLOPs of its products over the live pairs: 4 × width per pair forward, 8
    /// backward.
    pub(crate) fn core_span(&self, b: usize, s: usize, width: usize, backward: bool) -> crate::trace::Span {
        let (cat, per) = if backward { ("op.bwd", 8) } else { ("op.fwd", 4) };
        crate::trace::op_span_flops(
            "attention-core",
            cat,
            (per * width * self.live_pairs(b, s)) as u64,
        )
    }

    /// Writes the (pre-dropout) probabilities of sequence `i`, head `h` over its first `k`
    /// keys into `p` (`[rows, k]`, the asking positions).
    fn probabilities(&self, x: &Seq, i: usize, h: usize, k: usize, p: &mut [f32]) {
        let (s, rows) = (x.s, self.rows(x.s));
        let scale = 1.0 / (x.d as f32).sqrt();
        blas::gemm_serial(
            rows,
            k,
            x.d,
            scale,
            x.head(0, h),
            x.head(1, h).t(),
            0.0,
            &mut p[..rows * k],
        );
        for r in p[..rows * k].chunks_mut(k) {
            if let Some(bias) = &self.bias {
                r.iter_mut()
                    .zip(&bias[i * s..i * s + k])
                    .for_each(|(v, b)| *v += b);
            }
            crate::ops::softmax_in_place(r);
        }
    }

    /// The dropout multiplier of each probability of (i, h) over the first `k` keys
    /// (`[rows, k]`, drawn as for the full `[s, s]` matrix); false without dropout.
    fn dropout_scale(&self, i: usize, h: usize, s: usize, k: usize, out: &mut [f32]) -> bool {
        let Some(m) = &self.dropout else {
            return false;
        };
        let base = (i * self.heads + h) * s * s;
        for (r, o) in out[..self.rows(s) * k].chunks_mut(k).enumerate() {
            o.iter_mut()
                .enumerate()
                .for_each(|(c, v)| *v = m.scale(base + r * s + c));
        }
        true
    }
}

impl Attention {
    /// The output `[b, rows, width]` for packed `qkv` (`[b, s, 3 · width]`), `rows` the
    /// asking positions ([`Self::rows`]).
    pub(crate) fn forward_slices(&self, qkv: &[f32], b: usize, s: usize, width3: usize) -> Vec<f32> {
        let width = width3 / 3;
        let d = width / self.heads;
        let q = self.rows(s);
        let (n3, n) = (s * width3, q * width);
        // Every head writes its columns of every row.
        let mut out = crate::scratch::take(b * n);
        out.par_chunks_mut(n.max(1)).enumerate().for_each(|(i, o)| {
            let x = Seq {
                qkv: &qkv[i * n3..(i + 1) * n3],
                s,
                d,
                width,
            };
            let k = self.live_keys(i, s);
            let mut p = vec![0f32; q * k];
            let mut mask = vec![0f32; q * k];
            for h in 0..self.heads {
                self.probabilities(&x, i, h, k, &mut p);
                if self.dropout_scale(i, h, s, k, &mut mask) {
                    p.iter_mut().zip(&mask).for_each(|(p, m)| *p *= m);
                }
                blas::gemm_serial_ld(
                    q,
                    d,
                    k,
                    1.0,
                    Mat::new(&p, k),
                    x.head(2, h),
                    0.0,
                    &mut o[h * d..],
                    width,
                );
            }
        });
        out
    }

    /// The gradient of packed `qkv` from the output gradient `gs` (`[b, rows, width]`);
    /// positions that did not ask get a zero query gradient.
    pub(crate) fn backward_slices(
        &self,
        xs: &[f32],
        gs: &[f32],
        b: usize,
        s: usize,
        width3: usize,
    ) -> Vec<f32> {
        let width = width3 / 3;
        let d = width / self.heads;
        let scale = 1.0 / (d as f32).sqrt();
        let q = self.rows(s);
        let (n3, n) = (s * width3, q * width);
        // Every head writes its q, k and v columns of every row.
        let mut dqkv = crate::scratch::take(b * n3);
        dqkv.par_chunks_mut(n3.max(1)).enumerate().for_each(|(i, dx)| {
            let x = Seq {
                qkv: &xs[i * n3..(i + 1) * n3],
                s,
                d,
                width,
            };
            let g = &gs[i * n..(i + 1) * n];
            let k = self.live_keys(i, s);
            let mut p = vec![0f32; q * k];
            let mut pd = vec![0f32; q * k];
            let mut dp = vec![0f32; q * k];
            let mut mask = vec![0f32; q * k];
            // Keys left out received no attention: their dK and dV rows are 0; positions
            // that did not ask have no query gradient.
            for (r, row) in dx.chunks_mut(width3).enumerate() {
                if r >= k {
                    row[width..].fill(0.0);
                }
                if r >= q {
                    row[..width].fill(0.0);
                }
            }
            for h in 0..self.heads {
                let col = h * d;
                let g_h = Mat {
                    data: &g[col..],
                    ld: width,
                    trans: false,
                };
                self.probabilities(&x, i, h, k, &mut p);
                let dropped = self.dropout_scale(i, h, s, k, &mut mask);
                let used: &[f32] = if dropped {
                    pd.iter_mut()
                        .zip(p.iter().zip(&mask))
                        .for_each(|(o, (p, m))| *o = p * m);
                    &pd
                } else {
                    &p
                };
                // dV = P_usedᵀ · dO
                blas::gemm_serial_ld(
                    k,
                    d,
                    q,
                    1.0,
                    Mat::new(used, k).t(),
                    g_h,
                    0.0,
                    &mut dx[2 * width + col..],
                    width3,
                );
                // dP_used = dO · Vᵀ, then through dropout.
                blas::gemm_serial(q, k, d, 1.0, g_h, x.head(2, h).t(), 0.0, &mut dp);
                if dropped {
                    dp.iter_mut().zip(&mask).for_each(|(g, m)| *g *= m);
                }
                // dS = P ⊙ (dP − rowsum(dP ⊙ P)) · scale (the scale of the scores).
                for (gr, pr) in dp.chunks_mut(k).zip(p.chunks(k)) {
                    let dot: f32 = gr.iter().zip(pr).map(|(a, b)| a * b).sum();
                    gr.iter_mut()
                        .zip(pr)
                        .for_each(|(g, p)| *g = p * (*g - dot) * scale);
                }
                // dQ = dS · K, dK = dSᵀ · Q
                blas::gemm_serial_ld(
                    q,
                    d,
                    k,
                    1.0,
                    Mat::new(&dp, k),
                    x.head(1, h),
                    0.0,
                    &mut dx[col..],
                    width3,
                );
                blas::gemm_serial_ld(
                    k,
                    d,
                    q,
                    1.0,
                    Mat::new(&dp, k).t(),
                    x.head(0, h),
                    0.0,
                    &mut dx[width + col..],
                    width3,
                );
            }
        });
        dqkv
    }
}

impl CustomOp1 for Attention {
    fn name(&self) -> &'static str {
        "trident-attention"
    }

    fn cpu_fwd(&self, st: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let _span = kernel::forward(self.name());
        let (b, s, width3) = l.shape().dims3()?;
        let qkv = f32_slice(st, l, "attention")?;
        let out = self.forward_slices(qkv, b, s, width3);
        kernel::output(out, (b, self.rows(s), width3 / 3))
    }

    fn bwd(&self, qkv: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let _span = self.layer.backward(self.name(), 0);
        let (b, s, width3) = qkv.dims3()?;
        let grad = grad.contiguous()?;
        let dqkv = {
            let (sx, lx) = qkv.storage_and_layout();
            let (sg, lg) = grad.storage_and_layout();
            let xs = cpu_slice(&sx, lx, "attention backward")?;
            let gs = cpu_slice(&sg, lg, "attention backward")?;
            self.backward_slices(xs, gs, b, s, width3)
        };
        Ok(Some(Tensor::from_vec(dqkv, qkv.shape(), qkv.device())?))
    }
}

/// The additive attention bias for a `[batch, seq]` mask of 1 (token) / 0 (padding):
/// `[batch, 1, 1, seq]` with 0 for tokens and -1e9 for padding.
pub fn mask_bias(mask: &Tensor) -> Result<Tensor> {
    let (b, s) = mask.dims2()?;
    let m = mask.to_dtype(candle_core::DType::F32)?;
    ((m - 1.0)? * 1e9)?.reshape((b, 1, 1, s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::testing::max_diff;
    use candle_core::{Device, Var};

    #[test]
    fn linear_and_gelu_gradients_match_candle() -> Result<()> {
        let dev = Device::Cpu;
        let x = Var::randn(0f32, 1.0, (2, 70, 48), &dev)?;
        let w = Var::randn(0f32, 0.2, (96, 48), &dev)?;
        let b = Var::randn(0f32, 1.0, 96, &dev)?;
        let r = Tensor::randn(0f32, 1.0, (2, 70, 96), &dev)?;
        let want = x
            .as_tensor()
            .broadcast_matmul(&w.t()?)?
            .broadcast_add(b.as_tensor())?
            .gelu_erf()?;
        let got = gelu(&linear(x.as_tensor(), w.as_tensor(), Some(b.as_tensor()))?)?;
        assert!(max_diff(&want, &got) < 1e-4);
        let gw = (want * &r)?.sum_all()?.backward()?;
        let gg = (got * &r)?.sum_all()?.backward()?;
        for v in [&x, &w, &b] {
            let d = max_diff(gw.get(v).unwrap(), gg.get(v).unwrap());
            assert!(d < 1e-3, "gradient differs by {d}");
        }
        Ok(())
    }

    #[test]
    fn masked_key_suffixes_are_left_out_of_the_products() -> Result<()> {
        let dev = Device::Cpu;
        // Padding at the end, none, everything masked, and a masked key in the middle.
        let mask = Tensor::new(&[[1u32, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0]], &dev)?;
        let bias = mask_bias(&mask)?;
        let a = Attention::new(4, 4, 8, Some(&bias), 2, None)?;
        let keys: Vec<usize> = (0..4).map(|i| a.live_keys(i, 4)).collect();
        assert_eq!(keys, [2, 4, 4, 3]);
        assert_eq!(a.live_pairs(4, 4), 4 * (2 + 4 + 4 + 3));
        assert_eq!(Attention::new(2, 4, 8, None, 2, None)?.live_pairs(2, 4), 32);
        Ok(())
    }

    #[test]
    fn fused_attention_with_dropout_equals_the_composed_ops() -> Result<()> {
        let dev = Device::Cpu;
        let (b, s, h, d) = (3, 7, 2, 4);
        let q = Var::randn(0f32, 1.0, (b, s, h * d), &dev)?;
        let k = Var::randn(0f32, 1.0, (b, s, h * d), &dev)?;
        let v = Var::randn(0f32, 1.0, (b, s, h * d), &dev)?;
        let mask = Tensor::new(
            &[
                [1u32, 1, 1, 1, 1, 1, 1],
                [1, 1, 1, 0, 0, 0, 0],
                [1, 1, 1, 1, 1, 0, 0],
            ],
            &dev,
        )?;
        let bias = mask_bias(&mask)?;
        let probe = Tensor::randn(0f32, 1.0, (b, s, h * d), &dev)?;
        let (p, seed) = (0.3f32, 1234u64);
        // The same computation from separate ops, heads split out.
        let split = |t: &Var| t.as_tensor().reshape((b, s, h, d))?.transpose(1, 2)?.contiguous();
        let scores = (split(&q)?.matmul(&split(&k)?.t()?)? / (d as f64).sqrt())?.broadcast_add(&bias)?;
        let probs = crate::ops::dropout(&crate::ops::softmax_last_dim(&scores)?, p, seed)?;
        let want = probs
            .matmul(&split(&v)?)?
            .transpose(1, 2)?
            .reshape((b, s, h * d))?;
        let got = attention(
            q.as_tensor(),
            k.as_tensor(),
            v.as_tensor(),
            Some(&bias),
            h,
            Some((p, seed)),
        )?;
        assert!(
            max_diff(&want, &got) < 1e-5,
            "values differ by {}",
            max_diff(&want, &got)
        );
        let gw = (want * &probe)?.sum_all()?.backward()?;
        let gg = (got * &probe)?.sum_all()?.backward()?;
        for (name, t) in [("q", &q), ("k", &k), ("v", &v)] {
            let diff = max_diff(gw.get(t).unwrap(), gg.get(t).unwrap());
            assert!(diff < 1e-5, "d{name} differs by {diff}");
        }
        Ok(())
    }
}
