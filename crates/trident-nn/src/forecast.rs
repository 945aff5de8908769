//! Forecasters: a window of past values in, the next `horizon` values out, optionally with
//! calendar features after the window (the sine and cosine of the first forecast value's
//! position in each of some periods). An MLP reads the window and the features as one
//! vector (no hidden layer: a linear autoregression); an LSTM or GRU reads the window as a
//! sequence, each value with its own row's calendar features, and maps its last state to
//! the horizon.

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
        /// With calendar features: `[2F, window · 2F]`, the map from the first forecast
        /// value's features to each window value's ([`step_features`]).
        calendar: Option<Tensor>,
    },
}

/// The calendar features of row `position` of a series: `sin θ` and `cos θ` per period
/// `P`, θ = 2π (position mod P) / P.
pub fn calendar_features(periods: &[usize], position: usize) -> Vec<f32> {
    periods
        .iter()
        .flat_map(|&p| {
            let a = 2.0 * std::f64::consts::PI * (position % p) as f64 / p as f64;
            [a.sin() as f32, a.cos() as f32]
        })
        .collect()
}

/// The matrix that turns the calendar features of row `t` (`sin θ`, `cos θ` per period
/// `P`, θ = 2π (t mod P) / P) into those of rows `t − window … t − 1`: a row `d` earlier
/// is θ − 2πd/P, a rotation of (`sin θ`, `cos θ`), so one `[2F, window · 2F]` product gives
/// every step's features (step-major) from the forecast's own.
pub fn step_features(periods: &[usize], window: usize) -> Vec<f32> {
    let f = 2 * periods.len();
    let mut m = vec![0f32; f * window * f];
    for (j, &p) in periods.iter().enumerate() {
        for k in 0..window {
            let delta = 2.0 * std::f64::consts::PI * (window - k) as f64 / p as f64;
            let (sd, cd) = (delta.sin() as f32, delta.cos() as f32);
            let col = k * f + 2 * j;
            // sin(θ − δ) = sin θ cos δ − cos θ sin δ; cos(θ − δ) = sin θ sin δ + cos θ cos δ.
            let at = |row: usize, c: usize| row * window * f + c;
            m[at(2 * j, col)] = cd;
            m[at(2 * j + 1, col)] = -sd;
            m[at(2 * j, col + 1)] = sd;
            m[at(2 * j + 1, col + 1)] = cd;
        }
    }
    m
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

    /// An LSTM or GRU forecaster of `layers` layers of `hidden` units over windows of
    /// `window` values, followed in each input row by the calendar features of `periods`.
    #[allow(clippy::too_many_arguments)]
    pub fn rnn(
        pb: &ParamBuilder,
        kind: CellKind,
        hidden: usize,
        layers: usize,
        horizon: usize,
        dropout: f32,
        window: usize,
        periods: &[usize],
    ) -> Result<Self> {
        if hidden == 0 || layers == 0 || horizon == 0 || window == 0 {
            bail!(
                "forecaster: hidden {hidden}, layers {layers}, horizon {horizon} and window {window} must be at least 1"
            )
        }
        let f = 2 * periods.len();
        let rnn = Rnn::new(&pb.pp("rnn"), kind, 1 + f, hidden, layers, false, dropout)?;
        let calendar = (f > 0)
            .then(|| {
                Tensor::from_vec(
                    step_features(periods, window),
                    (f, window * f),
                    &candle_core::Device::Cpu,
                )
            })
            .transpose()?;
        Ok(Forecaster::Rnn {
            head: Linear::new(&pb.pp("head"), rnn.output_size(), horizon)?,
            rnn,
            calendar,
        })
    }

    /// `[batch, window + calendar features]` → `[batch, horizon]`.
    pub fn forward(&self, x: &Tensor, ctx: &Ctx) -> Result<Tensor> {
        match self {
            Forecaster::Mlp(m) => m.forward(x, ctx),
            Forecaster::Rnn { rnn, head, calendar } => {
                let (b, width) = x.dims2()?;
                let f = calendar.as_ref().map(|m| m.dim(0)).transpose()?.unwrap_or(0);
                let s = width - f;
                let mut steps = x.narrow(1, 0, s)?.unsqueeze(2)?;
                if let Some(m) = calendar {
                    let feats = x.narrow(1, s, f)?.matmul(m)?.reshape((b, s, f))?;
                    steps = Tensor::cat(&[&steps, &feats], 2)?;
                }
                let mask = Tensor::ones((b, s), DType::F32, x.device())?;
                let h = rnn.forward(&steps, &mask, ctx)?;
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
            Forecaster::rnn(&p.builder(1, None).pp("c"), CellKind::Lstm, 5, 2, 3, 0.0, 6, &[]).unwrap(),
            Forecaster::rnn(&p.builder(1, None).pp("d"), CellKind::Gru, 5, 1, 3, 0.0, 6, &[]).unwrap(),
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

    #[test]
    fn step_features_are_each_window_rows_own() {
        let (periods, window, t) = ([7usize, 24], 5usize, 1000usize);
        let spec = |row: usize| calendar_features(&periods, row);
        let m = Tensor::from_vec(step_features(&periods, window), (4, window * 4), &Device::Cpu).unwrap();
        let at_t = Tensor::from_vec(spec(t), (1, 4), &Device::Cpu).unwrap();
        let got = at_t
            .matmul(&m)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        for k in 0..window {
            let want = spec(t - window + k);
            for (g, w) in got[k * 4..(k + 1) * 4].iter().zip(&want) {
                assert!(
                    (g - w).abs() < 1e-5,
                    "step {k}: {:?} vs {want:?}",
                    &got[k * 4..(k + 1) * 4]
                );
            }
        }
    }
}
