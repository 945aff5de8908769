//! Layers: Linear, Embedding, LayerNorm, Dropout, Conv2d, BatchNorm2d, pooling and
//! activations. Every layer's parameters live in a [`Params`](crate::Params) store.

use crate::ops;
use crate::params::{Init, ParamBuilder, Params};
use candle_core::{Result, Tensor, D};
use std::sync::Arc;

/// The logistic function as one graph node (autoencoder outputs, `Activation::Sigmoid`).
pub use crate::dense::sigmoid;

pub use crate::ctx::Ctx;

/// `y = x Wᵀ + b` over the last dimension (PyTorch's layout: `weight` is `[out, in]`).
#[derive(Debug, Clone)]
pub struct Linear {
    /// `[out, in]`.
    pub weight: Tensor,
    /// `[out]`, if any.
    pub bias: Option<Tensor>,
    params: Params,
    /// Full parameter names of the weight and the bias.
    names: (String, String),
}

impl Linear {
    /// PyTorch's default initialisation: U(±1/√in) for weight and bias.
    pub fn new(pb: &ParamBuilder, inp: usize, out: usize) -> Result<Self> {
        let bound = 1.0 / (inp as f32).sqrt();
        Self::with_init(pb, inp, out, Init::Uniform(bound), Some(Init::Uniform(bound)))
    }

    /// BERT's initialisation: Normal(0, std) weights, zero bias.
    pub fn normal(pb: &ParamBuilder, inp: usize, out: usize, std: f32) -> Result<Self> {
        Self::with_init(pb, inp, out, Init::Normal(std), Some(Init::Zeros))
    }

    /// Chosen initialisers; `bias: None` builds no bias.
    pub fn with_init(pb: &ParamBuilder, inp: usize, out: usize, w: Init, bias: Option<Init>) -> Result<Self> {
        Ok(Linear {
            weight: pb.get((out, inp), "weight", w)?,
            bias: bias.map(|b| pb.get(out, "bias", b)).transpose()?,
            params: pb.params().clone(),
            names: (pb.path("weight"), pb.path("bias")),
        })
    }

    /// The layer's parameters with their gradient sinks, for the fused training blocks of
    /// [`crate::blocks`]; `None` unless every parameter of the layer is trainable.
    pub fn sinks(&self) -> Option<crate::blocks::SinkLinear> {
        let weight_sink = self.params.sink(&self.names.0)?;
        let bias_sink = match &self.bias {
            Some(_) => Some(self.params.sink(&self.names.1)?),
            None => None,
        };
        Some(crate::blocks::SinkLinear {
            weight: self.weight.clone(),
            bias: self.bias.clone(),
            weight_sink,
            bias_sink,
        })
    }

    /// Applies the layer to `[..., in]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        crate::dense::linear(x, &self.weight, self.bias.as_ref())
    }
}

/// A lookup table `[vocab, dim]`.
#[derive(Debug, Clone)]
pub struct Embedding {
    /// `[vocab, dim]`.
    pub weight: Tensor,
    params: Params,
    name: String,
}

impl Embedding {
    /// Normal(0, std) initialisation.
    pub fn new(pb: &ParamBuilder, vocab: usize, dim: usize, std: f32) -> Result<Self> {
        Ok(Embedding {
            weight: pb.get((vocab, dim), "weight", Init::Normal(std))?,
            params: pb.params().clone(),
            name: pb.path("weight"),
        })
    }

    /// Rows for integer `ids` of any shape: output is `ids.shape + [dim]`. In evaluation
    /// the lookup is an ordinary graph node (a backward pass gives the table a dense
    /// gradient); in training it goes through [`Params::gather_rows`], whose gradient is
    /// sparse and collected with [`Params::gradient_into`].
    pub fn forward(&self, ids: &Tensor, ctx: &Ctx) -> Result<Tensor> {
        if ctx.train {
            return self.params.gather_rows(&self.weight, &self.name, ids);
        }
        let mut shape = ids.dims().to_vec();
        shape.push(self.weight.dim(1)?);
        self.weight.index_select(&ids.flatten_all()?, 0)?.reshape(shape)
    }
}

/// Layer normalisation over the last dimension (fused kernel, see [`ops::layer_norm`]).
#[derive(Debug, Clone)]
pub struct LayerNorm {
    /// Scale.
    pub weight: Tensor,
    /// Shift.
    pub bias: Tensor,
    /// Added to the variance.
    pub eps: f32,
    params: Params,
    /// Full parameter names of the scale and the shift.
    names: (String, String),
}

impl LayerNorm {
    /// Ones and zeros.
    pub fn new(pb: &ParamBuilder, dim: usize, eps: f32) -> Result<Self> {
        Ok(LayerNorm {
            weight: pb.get(dim, "weight", Init::Ones)?,
            bias: pb.get(dim, "bias", Init::Zeros)?,
            eps,
            params: pb.params().clone(),
            names: (pb.path("weight"), pb.path("bias")),
        })
    }

    /// The parameters with their gradient sinks, for the fused sublayers of
    /// [`crate::blocks`]; `None` unless both are trainable.
    pub fn sinks(&self) -> Option<crate::blocks::SinkNorm> {
        Some(crate::blocks::SinkNorm {
            gamma: self.weight.clone(),
            beta: self.bias.clone(),
            gamma_sink: self.params.sink(&self.names.0)?,
            beta_sink: self.params.sink(&self.names.1)?,
            eps: self.eps,
        })
    }

    /// Normalises `x`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::layer_norm(x, &self.weight, &self.bias, self.eps)
    }

    /// `forward(drop(x) + residual)` in one fused kernel ([`ops::add_dropout_layer_norm`]),
    /// dropping exactly what `drop.forward(x, ctx)` would.
    pub fn forward_residual(
        &self,
        x: &Tensor,
        residual: &Tensor,
        drop: &Dropout,
        ctx: &Ctx,
    ) -> Result<Tensor> {
        ops::add_dropout_layer_norm(x, residual, &self.weight, &self.bias, self.eps, drop.active(ctx))
    }
}

/// Inverted dropout; each layer draws its own mask from the step seed and its id.
#[derive(Debug, Clone, Copy)]
pub struct Dropout {
    /// Drop probability.
    pub p: f32,
    id: u64,
}

impl Dropout {
    /// A dropout layer with probability `p`.
    pub fn new(pb: &ParamBuilder, p: f32) -> Self {
        Dropout {
            p,
            id: pb.params().next_id(),
        }
    }

    /// Identity in evaluation.
    pub fn forward(&self, x: &Tensor, ctx: &Ctx) -> Result<Tensor> {
        match self.active(ctx) {
            Some((p, seed)) => ops::dropout(x, p, seed),
            None => Ok(x.clone()),
        }
    }

    /// (p, seed) of this layer's mask in the step of `ctx`, or None when it drops nothing
    /// (evaluation, or p = 0): what fused kernels take in place of calling `forward`.
    pub fn active(&self, ctx: &Ctx) -> Option<(f32, u64)> {
        (ctx.train && self.p > 0.0).then(|| (self.p, self.seed(ctx)))
    }

    /// The seed of this layer's mask in the step of `ctx`.
    pub fn seed(&self, ctx: &Ctx) -> u64 {
        ops::splitmix(ctx.seed ^ self.id.wrapping_mul(0xD134_2543_DE82_EF95))
    }
}

/// 2-D convolution over `[batch, channels, height, width]`.
#[derive(Debug, Clone)]
pub struct Conv2d {
    /// `[out, in, k, k]`.
    pub weight: Tensor,
    /// `[out]`.
    pub bias: Option<Tensor>,
    /// Stride.
    pub stride: usize,
    /// Zero padding on each side.
    pub padding: usize,
}

impl Conv2d {
    /// PyTorch's default initialisation: U(±1/√(in·k·k)).
    pub fn new(
        pb: &ParamBuilder,
        inp: usize,
        out: usize,
        k: usize,
        stride: usize,
        padding: usize,
        bias: bool,
    ) -> Result<Self> {
        let bound = 1.0 / ((inp * k * k) as f32).sqrt();
        Ok(Conv2d {
            weight: pb.get((out, inp, k, k), "weight", Init::Uniform(bound))?,
            bias: if bias {
                Some(pb.get(out, "bias", Init::Uniform(bound))?)
            } else {
                None
            },
            stride,
            padding,
        })
    }

    /// Convolves `x`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match &self.bias {
            Some(b) => ops::conv2d_bias(x, &self.weight, b, self.stride, self.padding),
            None => ops::conv2d(x, &self.weight, self.stride, self.padding),
        }
    }
}

/// Batch normalisation over the channels of `[batch, channels, h, w]`. Training uses the
/// batch statistics and updates the running ones (buffers saved with the model).
#[derive(Debug, Clone)]
pub struct BatchNorm2d {
    weight: Tensor,
    bias: Tensor,
    running_mean: candle_core::Var,
    running_var: candle_core::Var,
    momentum: f64,
    eps: f64,
}

impl BatchNorm2d {
    /// PyTorch's defaults: momentum 0.1, eps 1e-5.
    pub fn new(pb: &ParamBuilder, channels: usize) -> Result<Self> {
        Self::with(pb, channels, 0.1, 1e-5)
    }

    /// A batch norm with its running statistics' `momentum` and `eps` (TensorFlow-trained
    /// EfficientNets: 0.01 and 1e-3).
    pub fn with(pb: &ParamBuilder, channels: usize, momentum: f64, eps: f64) -> Result<Self> {
        let weight = pb.get(channels, "weight", Init::Ones)?;
        let bias = pb.get(channels, "bias", Init::Zeros)?;
        pb.buffer(channels, "running_mean", Init::Zeros)?;
        pb.buffer(channels, "running_var", Init::Ones)?;
        let params = pb.params();
        let var = |n: &str| params.get(&pb.path(n)).map(|p| p.var).expect("just created");
        Ok(BatchNorm2d {
            weight,
            bias,
            running_mean: var("running_mean"),
            running_var: var("running_var"),
            momentum,
            eps,
        })
    }

    /// Normalises `x`.
    pub fn forward(&self, x: &Tensor, ctx: &Ctx) -> Result<Tensor> {
        if ctx.train {
            let (y, mean, var) = ops::batch_norm_train(x, &self.weight, &self.bias, self.eps as f32)?;
            self.update_running(x, mean, var)?;
            return Ok(y);
        }
        self.evaluate(x)
    }

    /// `act(self.forward(x))`; in training one op ([`ops::batch_norm_act_train`]), the
    /// same values and gradients.
    pub fn forward_act(&self, x: &Tensor, ctx: &Ctx, act: ops::Act) -> Result<Tensor> {
        if ctx.train {
            let (y, mean, var) =
                ops::batch_norm_act_train(x, &self.weight, &self.bias, self.eps as f32, act)?;
            self.update_running(x, mean, var)?;
            return Ok(y);
        }
        act.apply(&self.evaluate(x)?)
    }

    /// `relu_max_pool2d(self.forward(x), k)`; in training one op
    /// ([`ops::batch_norm_relu_pool_train`]), the same values and gradients.
    pub fn forward_relu_pool(&self, x: &Tensor, ctx: &Ctx, k: usize) -> Result<Tensor> {
        if ctx.train {
            let (y, mean, var) =
                ops::batch_norm_relu_pool_train(x, &self.weight, &self.bias, self.eps as f32, k)?;
            self.update_running(x, mean, var)?;
            return Ok(y);
        }
        ops::relu_max_pool2d(&self.evaluate(x)?, k)
    }

    /// Moves the running statistics towards a batch's mean and biased variance.
    fn update_running(&self, x: &Tensor, mean: Vec<f32>, var: Vec<f32>) -> Result<()> {
        let c = x.dim(1)?;
        let n = (x.elem_count() / c) as f64;
        let m = self.momentum;
        let mean = Tensor::from_vec(mean, c, x.device())?;
        let unbiased = (Tensor::from_vec(var, c, x.device())? * (n / (n - 1.0).max(1.0)))?;
        self.running_mean
            .set(&((self.running_mean.as_tensor() * (1.0 - m))? + (mean * m)?)?)?;
        self.running_var
            .set(&((self.running_var.as_tensor() * (1.0 - m))? + (unbiased * m)?)?)
    }

    /// Evaluation mode: the running statistics folded into a scale and a shift per
    /// channel, applied in one pass (gradients still reach the weight and bias through
    /// the folding).
    fn evaluate(&self, x: &Tensor) -> Result<Tensor> {
        // The running statistics are buffers: read detached, so no graph is recorded
        // through them.
        let scale = (&self.weight / (self.running_var.as_detached_tensor() + self.eps)?.sqrt()?)?;
        let shift = (&self.bias - (self.running_mean.as_detached_tensor() * &scale)?)?;
        ops::channel_affine(x, &scale, &shift)
    }
}

/// Max pooling with a square window equal to its stride.
pub fn max_pool2d(x: &Tensor, k: usize) -> Result<Tensor> {
    x.max_pool2d(k)
}

/// `max_pool2d(relu(x), k)` as one fused op ([`crate::ops::relu_max_pool2d`]).
pub fn relu_max_pool2d(x: &Tensor, k: usize) -> Result<Tensor> {
    crate::ops::relu_max_pool2d(x, k)
}

/// Average pooling with a square window equal to its stride.
pub fn avg_pool2d(x: &Tensor, k: usize) -> Result<Tensor> {
    x.avg_pool2d(k)
}

/// A user-defined activation: any closure of differentiable tensor operations.
pub type CustomActivation = Arc<dyn Fn(&Tensor) -> Result<Tensor> + Send + Sync>;

/// An activation function. `Custom` takes any closure built from differentiable tensor
/// operations.
#[derive(Clone)]
pub enum Activation {
    /// max(0, x).
    Relu,
    /// GELU, exact (erf) form as BERT uses.
    Gelu,
    /// 1 / (1 + e^-x).
    Sigmoid,
    /// tanh.
    Tanh,
    /// Softmax over the last dimension.
    Softmax,
    /// Anything else.
    Custom(CustomActivation),
}

impl std::fmt::Debug for Activation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            Activation::Relu => "relu",
            Activation::Gelu => "gelu",
            Activation::Sigmoid => "sigmoid",
            Activation::Tanh => "tanh",
            Activation::Softmax => "softmax",
            Activation::Custom(_) => "custom",
        };
        f.write_str(name)
    }
}

impl Activation {
    /// By name, as configs write it (`relu`, `gelu`, `sigmoid`, `tanh`, `softmax`, or one
    /// registered with [`crate::custom::register_activation`]).
    pub fn by_name(name: &str) -> Option<Self> {
        Some(match name {
            "relu" => Activation::Relu,
            "gelu" => Activation::Gelu,
            "sigmoid" => Activation::Sigmoid,
            "tanh" => Activation::Tanh,
            "softmax" => Activation::Softmax,
            _ => Activation::Custom(crate::registry::activation(name)?),
        })
    }

    /// Applies the function.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Activation::Relu => crate::dense::relu(x),
            Activation::Gelu => crate::dense::gelu(x),
            Activation::Sigmoid => sigmoid(x),
            Activation::Tanh => x.tanh(),
            Activation::Softmax => ops::softmax_last_dim(x),
            Activation::Custom(f) => f(x),
        }
    }
}

/// A multi-layer perceptron: Linear → activation (→ dropout) for each hidden size, then a
/// final Linear.
#[derive(Debug, Clone)]
pub struct Mlp {
    layers: Vec<Linear>,
    activation: Activation,
    dropout: Dropout,
}

impl Mlp {
    /// `sizes = [in, hidden..., out]`.
    pub fn new(pb: &ParamBuilder, sizes: &[usize], activation: Activation, dropout: f32) -> Result<Self> {
        let layers = sizes
            .windows(2)
            .enumerate()
            .map(|(i, w)| Linear::new(&pb.pp(format!("layers.{i}")), w[0], w[1]))
            .collect::<Result<_>>()?;
        Ok(Mlp {
            layers,
            activation,
            dropout: Dropout::new(pb, dropout),
        })
    }

    /// Applies the network to `[..., in]`.
    pub fn forward(&self, x: &Tensor, ctx: &Ctx) -> Result<Tensor> {
        let mut h = x.clone();
        let last = self.layers.len() - 1;
        for (i, l) in self.layers.iter().enumerate() {
            let _layer = crate::trace::layer(|| format!("fc{i}"));
            h = l.forward(&h)?;
            if i < last {
                h = self.dropout.forward(&self.activation.forward(&h)?, ctx)?;
            }
        }
        Ok(h)
    }
}

/// Mean squared error of each example over its values, `[batch]`: an autoencoder's
/// reconstruction error (its anomaly score), a forecaster's error per window.
pub fn mse_per_example(target: &Tensor, prediction: &Tensor) -> Result<Tensor> {
    (prediction - target)?.sqr()?.flatten_from(1)?.mean(1)
}

/// Mean over the sequence of `[batch, seq, dim]` counting only positions where `mask`
/// (`[batch, seq]`, 1/0 as f32) is 1.
pub fn masked_mean(x: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let m = mask.unsqueeze(D::Minus1)?;
    let summed = x.broadcast_mul(&m)?.sum(1)?;
    let counts = m.sum(1)?.clamp(1e-9, f64::MAX)?;
    summed.broadcast_div(&counts)
}

#[cfg(test)]
mod sigmoid_tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn sigmoid_and_its_gradient_stay_finite_where_exp_overflows() {
        let x = Var::new(&[-200f32, -90.0, -1.0, 0.0, 3.0, 200.0], &Device::Cpu).unwrap();
        let y = sigmoid(x.as_tensor()).unwrap();
        let v = y.to_vec1::<f32>().unwrap();
        let want = [0.0, 8.19e-40, 0.268_941_4, 0.5, 0.952_574_1, 1.0];
        for (a, b) in v.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{v:?}");
        }
        let g = y.sum_all().unwrap().backward().unwrap();
        let g = g.get(x.as_tensor()).unwrap().to_vec1::<f32>().unwrap();
        assert!(g.iter().all(|g| g.is_finite()), "{g:?}");
        assert!(
            (g[2] - 0.196_611_9).abs() < 1e-6 && (g[3] - 0.25).abs() < 1e-7,
            "{g:?}"
        );
    }
}
