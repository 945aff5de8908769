//! A user's own activations and layers (TK-6), usable from a run's TOML by name once
//! registered, and [`gradcheck`], which checks any of them against finite differences.
//!
//! Two ways to write one:
//! - **Through candle's autograd**: a function or a [`Layer`] built from candle tensor
//!   operations; the backward pass comes for free.
//! - **With a hand-written derivative**: [`elementwise`] makes one graph node of an
//!   element-wise function `f` and its derivative `df`, both on `f64` (the node runs on f32
//!   and f64 tensors).
//!
//! A program registers them before it hands over to Trident's command line:
//! ```no_run
//! use trident_nn::custom::{self, Layer, LayerArgs};
//! use trident_nn::{Ctx, Init, Result, Tensor};
//!
//! /// x · sigmoid(β x) with a learned β per feature.
//! struct Swish { beta: Tensor }
//! impl Layer for Swish {
//!     fn forward(&self, x: &Tensor, _ctx: &Ctx) -> Result<Tensor> {
//!         let s = trident_nn::layers::sigmoid(&x.broadcast_mul(&self.beta)?)?;
//!         x * s
//!     }
//! }
//!
//! custom::register_activation("softsign", custom::elementwise(
//!     "softsign", |x| x / (1.0 + x.abs()), |x| 1.0 / (1.0 + x.abs()).powi(2)));
//! custom::register_layer("swish", |a: &LayerArgs| {
//!     let beta = a.pb.get(a.input, "beta", Init::Ones)?;
//!     Ok((Box::new(Swish { beta }) as Box<dyn Layer>, a.input))
//! });
//! ```
//! after which a run's `[model]` may say `activation = "softsign"` (kind `mlp`) or list
//! `{ kind = "swish" }` among its `layers` (kind `sequential`). A checkpoint records the
//! names, so `eval`, `predict` and further training need a program that registered them
//! too; `trident export` exports built-in layers only and names the custom one it cannot.

use crate::layers::{Ctx, Dropout, LayerNorm, Linear};
pub use crate::ops::activation::elementwise;
pub use crate::registry::{
    activation, layer, register_activation, register_layer, registered, unknown, ActivationFn, Layer,
    LayerArgs, LayerFactory, BUILTIN_ACTIVATIONS, BUILTIN_LAYERS,
};
use crate::{ParamBuilder, Result, Tensor, Var};

/// The activation a config names (`mlp`'s `activation`, a `sequential` `activation`
/// layer): a built-in one other than softmax, or a registered one; else [`unknown`]'s reason.
pub fn activation_by_name(name: &str) -> std::result::Result<crate::layers::Activation, String> {
    match crate::layers::Activation::by_name(name) {
        Some(crate::layers::Activation::Softmax) | None => Err(unknown("activation", name)),
        Some(a) => Ok(a),
    }
}

/// A stack of layers named in a run's TOML (`[model] kind = "sequential"`): built-in
/// `linear` (`out`), `activation` (`name`: built in or registered), `dropout` (`p`) and
/// `layer_norm`, and registered kinds, each given its TOML table; then a linear head.
pub struct Sequential {
    layers: Vec<Step>,
    head: Linear,
}

enum Step {
    Linear(Linear),
    Activation(crate::layers::Activation),
    Dropout(Dropout),
    Norm(LayerNorm),
    Custom(Box<dyn Layer>),
}

impl Sequential {
    /// Builds `specs` (each `{ kind = …, … }`) on `input`-wide rows, then a head to
    /// `outputs`. Parameters are `layers.<i>.*` and `head.*`.
    pub fn new(pb: &ParamBuilder, specs: &[serde_json::Value], input: usize, outputs: usize) -> Result<Self> {
        let err = |i: usize, m: String| candle_core::Error::Msg(format!("model.layers[{i}]: {m}"));
        let mut width = input;
        let mut layers = Vec::with_capacity(specs.len());
        for (i, spec) in specs.iter().enumerate() {
            let kind = spec
                .get("kind")
                .and_then(|k| k.as_str())
                .ok_or_else(|| err(i, "needs kind = \"…\"".into()))?;
            let keys: Vec<&str> = spec
                .as_object()
                .map(|o| o.keys().map(String::as_str).filter(|k| *k != "kind").collect())
                .unwrap_or_default();
            let only = |allowed: &[&str]| -> Result<()> {
                match keys.iter().find(|k| !allowed.contains(k)) {
                    Some(k) => Err(err(i, format!("{kind} takes {allowed:?}, not {k:?}"))),
                    None => Ok(()),
                }
            };
            let number = |key: &str| spec.get(key).and_then(|v| v.as_f64());
            let lp = pb.pp(format!("layers.{i}"));
            let step = match kind {
                "linear" => {
                    only(&["out"])?;
                    let out = number("out")
                        .filter(|o| *o >= 1.0 && o.fract() == 0.0)
                        .ok_or_else(|| err(i, "linear needs out = <width, at least 1>".into()))?
                        as usize;
                    let l = Linear::new(&lp, width, out)?;
                    width = out;
                    Step::Linear(l)
                }
                "activation" => {
                    only(&["name"])?;
                    let name = spec
                        .get("name")
                        .and_then(|n| n.as_str())
                        .ok_or_else(|| err(i, "activation needs name = \"…\"".into()))?;
                    Step::Activation(activation_by_name(name).map_err(|m| err(i, m))?)
                }
                "dropout" => {
                    only(&["p"])?;
                    let p = number("p")
                        .filter(|p| (0.0..1.0).contains(p))
                        .ok_or_else(|| err(i, "dropout needs p in [0, 1)".into()))?;
                    Step::Dropout(Dropout::new(&lp, p as f32))
                }
                "layer_norm" => {
                    only(&[])?;
                    Step::Norm(LayerNorm::new(&lp, width, 1e-5)?)
                }
                other => {
                    let factory = layer(other).ok_or_else(|| err(i, unknown("layer kind", other)))?;
                    let (l, out) = factory(&LayerArgs {
                        pb: &lp,
                        input: width,
                        options: spec,
                    })
                    .map_err(|e| err(i, format!("{other}: {e}")))?;
                    width = out;
                    Step::Custom(l)
                }
            };
            layers.push(step);
        }
        Ok(Sequential {
            layers,
            head: Linear::new(&pb.pp("head"), width, outputs)?,
        })
    }

    /// Applies the stack and the head to `[batch, input]`.
    pub fn forward(&self, x: &Tensor, ctx: &Ctx) -> Result<Tensor> {
        let mut h = x.clone();
        for (i, step) in self.layers.iter().enumerate() {
            let _layer = crate::trace::layer(|| format!("layers.{i}"));
            h = match step {
                Step::Linear(l) => l.forward(&h)?,
                Step::Activation(a) => a.forward(&h)?,
                Step::Dropout(d) => d.forward(&h, ctx)?,
                Step::Norm(n) => n.forward(&h)?,
                Step::Custom(l) => l.forward(&h, ctx)?,
            };
        }
        let _layer = crate::trace::layer(|| "head".into());
        self.head.forward(&h)
    }
}

/// What [`gradcheck`] found: the worst element, by its error relative to
/// `atol + rtol · |numeric|`.
#[derive(Debug, Clone)]
pub struct GradCheck {
    /// Elements compared.
    pub checked: usize,
    /// The worst element: (variable name, flat index, analytic, numeric).
    pub worst: Option<(String, usize, f64, f64)>,
    /// Its |analytic − numeric| / (atol + rtol · |numeric|); ≤ 1 passes.
    pub ratio: f64,
}

impl GradCheck {
    /// Whether every element was within tolerance.
    pub fn passed(&self) -> bool {
        self.ratio <= 1.0
    }
}

impl std::fmt::Display for GradCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.worst {
            Some((name, i, a, n)) => write!(
                f,
                "{} elements; worst {name}[{i}]: backward pass {a:.6e}, finite differences {n:.6e} ({:.2} of the tolerance)",
                self.checked, self.ratio
            ),
            None => write!(f, "nothing to check"),
        }
    }
}

/// Checks the gradients candle's backward pass gives for `f`'s output against central
/// finite differences, `(L(v + ε) − L(v − ε)) / 2ε` for every element of every variable in
/// `vars`, where `L = Σ f() · w` with fixed weights `w` (so that every output element
/// counts, each differently). This crate's tests pass f64 variables (`DType::F64`) at
/// `eps` 1e-6 and a tolerance of 1e-9 + 1e-6·|g|, and f32 ones at `eps` 1e-2 and 1e-3 +
/// 1e-2·|g|: a smaller step in f32 drowns in rounding.
pub fn gradcheck(
    f: impl Fn() -> Result<Tensor>,
    vars: &[(&str, &Var)],
    eps: f64,
    atol: f64,
    rtol: f64,
) -> Result<GradCheck> {
    let y = f()?;
    let n = y.elem_count();
    // Fixed pseudo-random weights in [0.5, 1.5): no output element is ignored or mirrored.
    let mut rng = trident_data::rng::SplitMix64::new(0x6772_6164);
    let w: Vec<f64> = (0..n).map(|_| 0.5 + rng.next_f32() as f64).collect();
    let w = Tensor::from_vec(w, y.shape(), y.device())?.to_dtype(y.dtype())?;
    let weighted = |y: &Tensor| (y * &w)?.sum_all();
    let loss =
        |y: &Tensor| -> Result<f64> { weighted(y)?.to_dtype(candle_core::DType::F64)?.to_scalar::<f64>() };
    let grads = weighted(&y)?.backward()?;
    let mut report = GradCheck {
        checked: 0,
        worst: None,
        ratio: 0.0,
    };
    for (name, var) in vars {
        let analytic: Vec<f64> = match grads.get(var.as_tensor()) {
            Some(g) => g.flatten_all()?.to_dtype(candle_core::DType::F64)?.to_vec1()?,
            None => vec![0.0; var.elem_count()],
        };
        let original = var.as_tensor().copy()?;
        let values: Vec<f64> = original
            .flatten_all()?
            .to_dtype(candle_core::DType::F64)?
            .to_vec1()?;
        // Every element perturbed in turn; the variable restored whatever happens.
        let checked = (|| -> Result<()> {
            for (i, &a) in analytic.iter().enumerate() {
                let at = |v: f64| -> Result<f64> {
                    let mut p = values.clone();
                    p[i] = v;
                    var.set(
                        &Tensor::from_vec(p, original.shape(), original.device())?
                            .to_dtype(original.dtype())?,
                    )?;
                    loss(&f()?)
                };
                let numeric = (at(values[i] + eps)? - at(values[i] - eps)?) / (2.0 * eps);
                let ratio = (a - numeric).abs() / (atol + rtol * numeric.abs());
                report.checked += 1;
                if ratio > report.ratio || report.worst.is_none() {
                    report.ratio = ratio;
                    report.worst = Some((name.to_string(), i, a, numeric));
                }
            }
            Ok(())
        })();
        var.set(&original)?;
        checked?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    fn var(v: &[f64], shape: (usize, usize)) -> Var {
        Var::from_tensor(&Tensor::from_vec(v.to_vec(), shape, &Device::Cpu).unwrap()).unwrap()
    }

    #[test]
    fn a_hand_written_derivative_passes_and_a_wrong_one_is_caught() {
        let x = var(&[-2.0, -0.3, 0.0, 0.4, 1.5, 3.0], (2, 3));
        let good = elementwise(
            "softsign",
            |x| x / (1.0 + x.abs()),
            |x| 1.0 / (1.0 + x.abs()).powi(2),
        );
        let r = gradcheck(|| good(x.as_tensor()), &[("x", &x)], 1e-6, 1e-9, 1e-6).unwrap();
        assert!(r.passed() && r.checked == 6, "{r}");
        // The derivative of x / (1 + |x|) is not 1 / (1 + |x|).
        let bad = elementwise("softsign", |x| x / (1.0 + x.abs()), |x| 1.0 / (1.0 + x.abs()));
        let r = gradcheck(|| bad(x.as_tensor()), &[("x", &x)], 1e-6, 1e-9, 1e-6).unwrap();
        assert!(!r.passed(), "{r}");
        assert!(r.to_string().contains("worst x["), "{r}");
        // The same node on f32 tensors, and the variable restored after the check.
        let x32 = Tensor::new(&[[-1.0f32, 2.0]], &Device::Cpu).unwrap();
        let y = good(&x32).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(y, [[-0.5, 2.0 / 3.0]]);
        assert_eq!(x.as_tensor().to_vec2::<f64>().unwrap()[0], [-2.0, -0.3, 0.0]);
    }

    #[test]
    fn a_layer_through_autograd_checks_against_its_inputs_and_parameters() {
        let params = crate::Params::new();
        let pb = params.builder(1, None);
        let specs: Vec<serde_json::Value> = serde_json::from_str(
            r#"[{"kind": "linear", "out": 4}, {"kind": "activation", "name": "tanh"}, {"kind": "layer_norm"}]"#,
        )
        .unwrap();
        let net = Sequential::new(&pb, &specs, 3, 2).unwrap();
        let names: Vec<String> = params.all().iter().map(|p| p.name.clone()).collect();
        assert_eq!(
            names,
            [
                "layers.0.weight",
                "layers.0.bias",
                "layers.2.weight",
                "layers.2.bias",
                "head.weight",
                "head.bias"
            ]
        );
        // In f64: the parameters converted, the input a variable too.
        let all: Vec<(String, Var)> = params
            .all()
            .iter()
            .map(|p| {
                let v = Var::from_tensor(&p.var.as_tensor().to_dtype(DType::F64).unwrap()).unwrap();
                (p.name.clone(), v)
            })
            .collect();
        let x = var(&[0.3, -1.2, 0.8, 1.1, 0.2, -0.5], (2, 3));
        let get = |n: &str| all.iter().find(|(m, _)| m == n).unwrap().1.as_tensor().clone();
        let f = || -> Result<Tensor> {
            let h = x
                .as_tensor()
                .matmul(&get("layers.0.weight").t()?)?
                .broadcast_add(&get("layers.0.bias"))?;
            let h = h.tanh()?;
            let mean = h.mean_keepdim(1)?;
            let c = h.broadcast_sub(&mean)?;
            let var = c.sqr()?.mean_keepdim(1)?;
            let h = c.broadcast_div(&(var + 1e-5)?.sqrt()?)?;
            let h = h
                .broadcast_mul(&get("layers.2.weight"))?
                .broadcast_add(&get("layers.2.bias"))?;
            h.matmul(&get("head.weight").t()?)?
                .broadcast_add(&get("head.bias"))
        };
        let mut vars: Vec<(&str, &Var)> = all.iter().map(|(n, v)| (n.as_str(), v)).collect();
        vars.push(("x", &x));
        let r = gradcheck(f, &vars, 1e-6, 1e-8, 1e-5).unwrap();
        assert!(r.passed(), "{r}");
        assert_eq!(r.checked, 12 + 4 + 4 + 4 + 8 + 2 + 6);
        // The built network's own backward pass (the fused layer norm's among them) in f32,
        // where rounding needs a wider step and tolerance.
        let x32 = x.as_tensor().to_dtype(DType::F32).unwrap();
        let own = params.all();
        let vars: Vec<(&str, &Var)> = own.iter().map(|p| (p.name.as_str(), &p.var)).collect();
        let r = gradcheck(|| net.forward(&x32, &Ctx::eval()), &vars, 1e-2, 1e-3, 1e-2).unwrap();
        assert!(r.passed() && r.checked == 34, "{r}");
        // The built network computes the same function.
        let a = net.forward(&x32, &Ctx::eval()).unwrap().to_vec2::<f32>().unwrap();
        let b = f()
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        for (ra, rb) in a.iter().zip(&b) {
            for (u, v) in ra.iter().zip(rb) {
                assert!((u - v).abs() < 1e-4, "{a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn unknown_kinds_and_bad_options_are_named() {
        let params = crate::Params::new();
        let pb = params.builder(1, None);
        let specs = |s: &str| -> Vec<serde_json::Value> { serde_json::from_str(s).unwrap() };
        let e = |s: &str| Sequential::new(&pb, &specs(s), 3, 2).err().unwrap().to_string();
        let m = e(r#"[{"kind": "linear", "out": 4}, {"kind": "gated"}]"#);
        assert!(
            m.contains("model.layers[1]: layer kind \"gated\" is neither built in"),
            "{m}"
        );
        let m = e(r#"[{"kind": "activation", "name": "swishy"}]"#);
        assert!(m.contains("activation \"swishy\" is neither built in"), "{m}");
        let m = e(r#"[{"kind": "linear", "width": 4}]"#);
        assert!(m.contains("linear takes [\"out\"], not \"width\""), "{m}");
        let m = e(r#"[{"kind": "dropout", "p": 1.5}]"#);
        assert!(m.contains("dropout needs p in [0, 1)"), "{m}");
    }
}
