//! A user's own layers and activations for Trident (TK-6).
//!
//! [`register`] adds them by name; the `trident-custom` binary ([`main`](../src/main.rs))
//! registers them and then is the `trident` command line, so a run's TOML can use them:
//! ```toml
//! [model]
//! kind = "sequential"
//! layers = [{ kind = "gated", out = 16 }, { kind = "activation", name = "softsign" }]
//! ```
//! Two ways are shown: `gated` and `swish` go through candle's autograd (their backward
//! pass is derived), `softsign` has a hand-written derivative ([`trident_nn::custom::elementwise`]).
//! `tests/custom.rs` checks all three against finite differences with
//! [`trident_nn::gradcheck`] and trains a model of them end to end.

use trident_nn::custom::{self, Layer, LayerArgs};
use trident_nn::layers::{sigmoid, Linear};
use trident_nn::{Ctx, Init, Result, Tensor};

/// A gated linear unit: `(x·W + b) ⊙ σ(x·V + c)` (Dauphin et al. 2017), `out` wide.
pub struct Gated {
    value: Linear,
    gate: Linear,
}

impl Gated {
    /// Parameters `value.{weight,bias}` and `gate.{weight,bias}` under the layer's names.
    pub fn build(a: &LayerArgs) -> Result<(Box<dyn Layer>, usize)> {
        let out = a
            .options
            .get("out")
            .and_then(|o| o.as_u64())
            .filter(|&o| o >= 1)
            .ok_or_else(|| msg("gated needs out = <width, at least 1>"))? as usize;
        if let Some(k) = a
            .options
            .as_object()
            .and_then(|o| o.keys().find(|k| !["kind", "out"].contains(&k.as_str())))
        {
            return Err(msg(&format!("gated takes out, not {k:?}")));
        }
        let layer = Gated {
            value: Linear::new(&a.pb.pp("value"), a.input, out)?,
            gate: Linear::new(&a.pb.pp("gate"), a.input, out)?,
        };
        Ok((Box::new(layer), out))
    }
}

fn msg(m: &str) -> trident_nn::Error {
    trident_nn::Error::Msg(m.into())
}

impl Layer for Gated {
    fn forward(&self, x: &Tensor, _ctx: &Ctx) -> Result<Tensor> {
        self.value.forward(x)? * sigmoid(&self.gate.forward(x)?)?
    }
}

/// `x · σ(β ⊙ x)` with a learned β per feature, starting at 1 (Ramachandran et al. 2017).
pub struct Swish {
    beta: Tensor,
}

impl Layer for Swish {
    fn forward(&self, x: &Tensor, _ctx: &Ctx) -> Result<Tensor> {
        x * sigmoid(&x.broadcast_mul(&self.beta)?)?
    }
}

/// `x / (1 + |x|)`, and its derivative `1 / (1 + |x|)²`, written by hand.
pub fn softsign(x: f64) -> f64 {
    x / (1.0 + x.abs())
}

/// The derivative of [`softsign`].
pub fn softsign_derivative(x: f64) -> f64 {
    1.0 / (1.0 + x.abs()).powi(2)
}

/// Registers the layer kinds `gated` and `swish` and the activation `softsign`.
pub fn register() {
    custom::register_layer("gated", Gated::build);
    custom::register_layer("swish", |a: &LayerArgs| {
        let beta = a.pb.get(a.input, "beta", Init::Ones)?;
        Ok((Box::new(Swish { beta }) as Box<dyn Layer>, a.input))
    });
    custom::register_activation(
        "softsign",
        custom::elementwise("softsign", softsign, softsign_derivative),
    );
}
