//! The process-wide registry of a user's own activations and layer kinds, by name (see
//! [`crate::custom`], which re-exports it). It sits below [`crate::layers`], whose
//! `Activation::by_name` looks names up here, and [`crate::custom`], which builds on those
//! layers, so that neither imports the other.

use crate::ctx::Ctx;
use crate::{ParamBuilder, Result, Tensor};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock, RwLock};

/// An activation: any function of tensors (differentiable through candle's autograd).
pub type ActivationFn = Arc<dyn Fn(&Tensor) -> Result<Tensor> + Send + Sync>;

/// A layer of a user's: its parameters were created from the [`LayerArgs`]' builder.
pub trait Layer: Send + Sync {
    /// Applies the layer to `[batch, input]` (`ctx` says training or evaluation and seeds
    /// dropout-like randomness).
    fn forward(&self, x: &Tensor, ctx: &Ctx) -> Result<Tensor>;
}

/// What a layer factory is given.
pub struct LayerArgs<'a> {
    /// Creates the layer's parameters under its own names (`layers.<i>.<name>`), seeded
    /// and loaded from checkpoints like every built-in parameter.
    pub pb: &'a ParamBuilder,
    /// The width of the layer's input.
    pub input: usize,
    /// The layer's other keys in the TOML (`{ kind = "gated", out = 16 }` gives `out`).
    pub options: &'a serde_json::Value,
}

/// Builds a layer and says its output width.
pub type LayerFactory = Arc<dyn Fn(&LayerArgs) -> Result<(Box<dyn Layer>, usize)> + Send + Sync>;

#[derive(Default)]
struct Registry {
    activations: BTreeMap<String, ActivationFn>,
    layers: BTreeMap<String, LayerFactory>,
}

fn registry() -> &'static RwLock<Registry> {
    static R: OnceLock<RwLock<Registry>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// The activations every binary has.
pub const BUILTIN_ACTIVATIONS: [&str; 4] = ["relu", "gelu", "sigmoid", "tanh"];
/// The layer kinds every binary has (`sequential` models).
pub const BUILTIN_LAYERS: [&str; 4] = ["linear", "activation", "dropout", "layer_norm"];

/// Registers the activation `name`. A built-in name, or one already registered, is refused.
pub fn register_activation(name: &str, f: impl Fn(&Tensor) -> Result<Tensor> + Send + Sync + 'static) {
    let mut r = registry().write().expect("registry lock");
    assert!(
        !BUILTIN_ACTIVATIONS.contains(&name) && name != "softmax",
        "activation {name:?} is built in"
    );
    assert!(
        r.activations.insert(name.into(), Arc::new(f)).is_none(),
        "activation {name:?} is registered twice"
    );
}

/// Registers the layer kind `name`. A built-in kind, or one already registered, is refused.
pub fn register_layer(
    name: &str,
    factory: impl Fn(&LayerArgs) -> Result<(Box<dyn Layer>, usize)> + Send + Sync + 'static,
) {
    let mut r = registry().write().expect("registry lock");
    assert!(!BUILTIN_LAYERS.contains(&name), "layer kind {name:?} is built in");
    assert!(
        r.layers.insert(name.into(), Arc::new(factory)).is_none(),
        "layer kind {name:?} is registered twice"
    );
}

/// A registered activation.
pub fn activation(name: &str) -> Option<ActivationFn> {
    registry()
        .read()
        .expect("registry lock")
        .activations
        .get(name)
        .cloned()
}

/// A registered layer kind.
pub fn layer(name: &str) -> Option<LayerFactory> {
    registry()
        .read()
        .expect("registry lock")
        .layers
        .get(name)
        .cloned()
}

/// The registered (activation, layer kind) names, for error messages.
pub fn registered() -> (Vec<String>, Vec<String>) {
    let r = registry().read().expect("registry lock");
    (
        r.activations.keys().cloned().collect(),
        r.layers.keys().cloned().collect(),
    )
}

/// Why a name is unknown: what this binary has, and how to add one.
pub fn unknown(what: &str, name: &str) -> String {
    let (acts, layers) = registered();
    let (builtin, custom): (&[&str], Vec<String>) = if what == "activation" {
        (&BUILTIN_ACTIVATIONS, acts)
    } else {
        (&BUILTIN_LAYERS, layers)
    };
    format!(
        "{what} {name:?} is neither built in ({builtin:?}) nor registered in this program ({custom:?}); \
         a custom one is registered by the program that runs Trident (trident_nn::custom, see \
         examples/custom_layer), which must also be the one that evaluates, predicts with or \
         resumes the checkpoint"
    )
}
