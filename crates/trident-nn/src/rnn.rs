//! LSTM and GRU (multi-layer, optionally bidirectional, variable lengths) with PyTorch's
//! parameter names and gate order, and a recurrent text classifier.
//!
//! Built from differentiable candle primitives: the input projection of every time step is
//! one matmul, the recurrence one small matmul per step. Padding positions (mask 0) leave
//! the state unchanged and output zeros, which is what PyTorch's packed sequences compute,
//! so the reverse direction starts at each sequence's own last token.

use crate::layers::{masked_mean, sigmoid, Ctx, Dropout, Embedding, Linear};
use crate::params::{Init, ParamBuilder};
use candle_core::{DType, Result, Tensor};

/// Which recurrent cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CellKind {
    /// Gates i, f, g, o.
    Lstm,
    /// Gates r, z, n.
    Gru,
}

impl CellKind {
    fn gates(self) -> usize {
        match self {
            CellKind::Lstm => 4,
            CellKind::Gru => 3,
        }
    }
}

#[derive(Debug, Clone)]
struct Direction {
    w_ih: Tensor,
    w_hh: Tensor,
    b_ih: Tensor,
    b_hh: Tensor,
}

/// A multi-layer (bi)directional LSTM or GRU over `[batch, seq, input]`.
#[derive(Debug, Clone)]
pub struct Rnn {
    kind: CellKind,
    hidden: usize,
    layers: Vec<Vec<Direction>>,
    drop: Dropout,
}

impl Rnn {
    /// PyTorch's initialisation U(±1/√hidden); names `weight_ih_l0`, `weight_hh_l0_reverse`, …
    pub fn new(
        pb: &ParamBuilder,
        kind: CellKind,
        input: usize,
        hidden: usize,
        num_layers: usize,
        bidirectional: bool,
        dropout: f32,
    ) -> Result<Self> {
        let bound = Init::Uniform(1.0 / (hidden as f32).sqrt());
        let g = kind.gates() * hidden;
        let dirs = if bidirectional { 2 } else { 1 };
        let mut layers = Vec::new();
        for l in 0..num_layers {
            let inp = if l == 0 { input } else { hidden * dirs };
            let mut ds = Vec::new();
            for d in 0..dirs {
                let sfx = if d == 1 {
                    format!("l{l}_reverse")
                } else {
                    format!("l{l}")
                };
                ds.push(Direction {
                    w_ih: pb.get((g, inp), &format!("weight_ih_{sfx}"), bound)?,
                    w_hh: pb.get((g, hidden), &format!("weight_hh_{sfx}"), bound)?,
                    b_ih: pb.get(g, &format!("bias_ih_{sfx}"), bound)?,
                    b_hh: pb.get(g, &format!("bias_hh_{sfx}"), bound)?,
                });
            }
            layers.push(ds);
        }
        Ok(Rnn {
            kind,
            hidden,
            layers,
            drop: Dropout::new(pb, dropout),
        })
    }

    /// Output width (`hidden × directions`).
    pub fn output_size(&self) -> usize {
        self.hidden * self.layers[0].len()
    }

    fn run_direction(&self, d: &Direction, x: &Tensor, mask: &Tensor, reverse: bool) -> Result<Tensor> {
        let (b, s, _) = x.dims3()?;
        let h = self.hidden;
        let xw = crate::dense::linear(x, &d.w_ih, Some(&d.b_ih))?; // [b, s, gates]
        let mut state = Tensor::zeros((b, h), DType::F32, x.device())?;
        let mut cell = state.clone();
        let mut outs = vec![None; s];
        let order: Vec<usize> = if reverse {
            (0..s).rev().collect()
        } else {
            (0..s).collect()
        };
        for t in order {
            let xt = xw.narrow(1, t, 1)?.squeeze(1)?;
            let hw = crate::dense::linear(&state, &d.w_hh, Some(&d.b_hh))?;
            let m = mask.narrow(1, t, 1)?; // [b, 1]
            let (new_h, new_c) = match self.kind {
                CellKind::Lstm => {
                    let gates = (xt + hw)?;
                    let i = sigmoid(&gates.narrow(1, 0, h)?)?;
                    let f = sigmoid(&gates.narrow(1, h, h)?)?;
                    let g = gates.narrow(1, 2 * h, h)?.tanh()?;
                    let o = sigmoid(&gates.narrow(1, 3 * h, h)?)?;
                    let c = ((f * &cell)? + (i * g)?)?;
                    ((o * c.tanh()?)?, c)
                }
                CellKind::Gru => {
                    let r = sigmoid(&(xt.narrow(1, 0, h)? + hw.narrow(1, 0, h)?)?)?;
                    let z = sigmoid(&(xt.narrow(1, h, h)? + hw.narrow(1, h, h)?)?)?;
                    let n = (xt.narrow(1, 2 * h, h)? + (r * hw.narrow(1, 2 * h, h)?)?)?.tanh()?;
                    let one_minus_z = (z.ones_like()? - &z)?;
                    (((one_minus_z * n)? + (z * &state)?)?, cell.clone())
                }
            };
            // Padding keeps the state and outputs zero.
            let keep = (m.ones_like()? - &m)?;
            state = (new_h.broadcast_mul(&m)? + state.broadcast_mul(&keep)?)?;
            cell = (new_c.broadcast_mul(&m)? + cell.broadcast_mul(&keep)?)?;
            outs[t] = Some(state.broadcast_mul(&m)?);
        }
        let outs: Vec<Tensor> = outs.into_iter().map(|o| o.expect("every step ran")).collect();
        Tensor::stack(&outs, 1)
    }

    /// Outputs `[batch, seq, hidden × directions]` of the last layer; `mask` is
    /// `[batch, seq]` (1 = token, 0 = padding, any numeric type).
    pub fn forward(&self, x: &Tensor, mask: &Tensor, ctx: &Ctx) -> Result<Tensor> {
        let mask = mask.to_dtype(DType::F32)?;
        let mut h = x.clone();
        for (l, dirs) in self.layers.iter().enumerate() {
            let _layer = crate::trace::layer(|| format!("rnn.{l}"));
            if l > 0 {
                h = self.drop.forward(&h, ctx)?;
            }
            let outs = dirs
                .iter()
                .enumerate()
                .map(|(i, d)| self.run_direction(d, &h, &mask, i == 1))
                .collect::<Result<Vec<_>>>()?;
            h = Tensor::cat(&outs, 2)?;
        }
        Ok(h)
    }
}

/// Embedding → (Bi)LSTM/GRU → masked mean over time → linear: a recurrent text classifier.
#[derive(Debug, Clone)]
pub struct RnnClassifier {
    embed: Embedding,
    rnn: Rnn,
    drop: Dropout,
    head: Linear,
}

impl RnnClassifier {
    /// A new classifier.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        pb: &ParamBuilder,
        kind: CellKind,
        vocab: usize,
        embed: usize,
        hidden: usize,
        layers: usize,
        classes: usize,
        dropout: f32,
    ) -> Result<Self> {
        let rnn = Rnn::new(&pb.pp("rnn"), kind, embed, hidden, layers, true, dropout)?;
        Ok(RnnClassifier {
            embed: Embedding::new(&pb.pp("embedding"), vocab, embed, 1.0)?,
            head: Linear::new(&pb.pp("head"), rnn.output_size(), classes)?,
            rnn,
            drop: Dropout::new(pb, dropout),
        })
    }

    /// Logits for `[batch, seq]` ids and mask.
    pub fn forward(&self, ids: &Tensor, mask: &Tensor, ctx: &Ctx) -> Result<Tensor> {
        let x = {
            let _layer = crate::trace::layer(|| "embedding".into());
            self.drop.forward(&self.embed.forward(ids, ctx)?, ctx)?
        };
        let h = self.rnn.forward(&x, mask, ctx)?;
        let _layer = crate::trace::layer(|| "head".into());
        let pooled = masked_mean(&h, &mask.to_dtype(DType::F32)?)?;
        self.head.forward(&self.drop.forward(&pooled, ctx)?)
    }
}
