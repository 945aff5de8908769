//! Forecasters: a window of past values in, the next `horizon` values out. An MLP reads
//! the window as one vector (no hidden layer: a linear autoregression); an LSTM or GRU
//! reads it as a sequence and maps its last state to the horizon.

use crate::layers::{Activation, Ctx, Linear, Mlp};
use crate::params::ParamBuilder;
use crate::rnn::{CellKind, Rnn};
use candle_core::{bail, DType, Result, Tensor};

/// A forecaster (see the module).
#[derive(Debug, Clone)]
pub enum Forecaster {
    /// `window → hidden… → horizon`.
    Mlp(Mlp),
    /// A unidirectional recurrent stack over the window's values, then a linear map.
    Rnn {
        /// The stack.
        rnn: Rnn,
        /// Last state → horizon.
        head: Linear,
    },
}

impl Forecaster {
    /// An MLP forecaster.
    pub fn mlp(
        pb: &ParamBuilder,
        window: usize,
        hidden: &[usize],
        horizon: usize,
        activation: Activation,
        dropout: f32,
    ) -> Result<Self> {
        if window == 0 || horizon == 0 || hidden.contains(&0) {
            bail!("forecaster: window {window}, horizon {horizon} and every hidden width must be at least 1")
        }
        let sizes: Vec<usize> = std::iter::once(window)
            .chain(hidden.iter().copied())
            .chain(std::iter::once(horizon))
            .collect();
        Ok(Forecaster::Mlp(Mlp::new(pb, &sizes, activation, dropout)?))
    }

    /// An LSTM or GRU forecaster of `layers` layers of `hidden` units.
    pub fn rnn(
        pb: &ParamBuilder,
        kind: CellKind,
        hidden: usize,
        layers: usize,
        horizon: usize,
        dropout: f32,
    ) -> Result<Self> {
        if hidden == 0 || layers == 0 || horizon == 0 {
            bail!("forecaster: hidden {hidden}, layers {layers} and horizon {horizon} must be at least 1")
        }
        let rnn = Rnn::new(&pb.pp("rnn"), kind, 1, hidden, layers, false, dropout)?;
        Ok(Forecaster::Rnn {
            head: Linear::new(&pb.pp("head"), rnn.output_size(), horizon)?,
            rnn,
        })
    }

    /// `[batch, window]` → `[batch, horizon]`.
    pub fn forward(&self, x: &Tensor, ctx: &Ctx) -> Result<Tensor> {
        match self {
            Forecaster::Mlp(m) => m.forward(x, ctx),
            Forecaster::Rnn { rnn, head } => {
                let (b, s) = x.dims2()?;
                let mask = Tensor::ones((b, s), DType::F32, x.device())?;
                let h = rnn.forward(&x.unsqueeze(2)?, &mask, ctx)?;
                let last = h.narrow(1, s - 1, 1)?.squeeze(1)?;
                let _layer = crate::trace::layer(|| "head".into());
                head.forward(&last)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Params;
    use candle_core::Device;

    #[test]
    fn every_net_maps_a_window_to_the_horizon_and_learns() {
        let p = Params::new();
        let x = Tensor::rand(0f32, 1.0, (4, 6), &Device::Cpu).unwrap();
        for (i, f) in [
            Forecaster::mlp(&p.builder(1, None).pp("a"), 6, &[8], 3, Activation::Relu, 0.0).unwrap(),
            Forecaster::mlp(&p.builder(1, None).pp("b"), 6, &[], 3, Activation::Relu, 0.0).unwrap(),
            Forecaster::rnn(&p.builder(1, None).pp("c"), CellKind::Lstm, 5, 2, 3, 0.0).unwrap(),
            Forecaster::rnn(&p.builder(1, None).pp("d"), CellKind::Gru, 5, 1, 3, 0.0).unwrap(),
        ]
        .iter()
        .enumerate()
        {
            let y = f.forward(&x, &Ctx::eval()).unwrap();
            assert_eq!(y.dims(), [4, 3], "net {i}");
            let g = y.sqr().unwrap().sum_all().unwrap().backward().unwrap();
            let prefix = ["a.", "b.", "c.", "d."][i];
            for param in p.all().into_iter().filter(|q| q.name.starts_with(prefix)) {
                let grad = g
                    .get(param.var.as_tensor())
                    .unwrap_or_else(|| panic!("{} has no gradient", param.name));
                let norm = grad.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
                assert!(norm > 0.0, "{} gets a zero gradient", param.name);
            }
        }
    }
}
