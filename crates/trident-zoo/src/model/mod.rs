//! The models Trident trains, built from a model card, loaded from a checkpoint, and the
//! [`TrainStep`] that ties each to its loss.

use crate::card::{InputSpec, ModelCard, ModelConfig};
use crate::error::{Result, ZooError};
use std::any::Any;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use trident_data::tokenize::EncodeError;
use trident_nn::bert::{TextBatch, Tokenizer};
use trident_nn::{ops, Ctx, Device, Loaded, Params, Tensor};
use trident_train::trainer::HiddenStates;
use trident_train::{Prediction, StepOutput, TrainStep};

mod autoencoder;
mod gan;
mod series;
mod table;
mod text;
mod vision;

pub use vision::image_collate;

/// A batch for any of the models.
pub enum Batch {
    /// Token ids, segments and mask.
    Text(TextBatch, Vec<usize>),
    /// `[batch, channels, h, w]` images.
    Image(Tensor, Vec<usize>),
    /// `[batch, features]` encoded table rows.
    Features(Tensor, Vec<usize>),
    /// `[batch, window]` series windows and their `[batch, horizon]` next values, both in
    /// the model's scale ([`crate::card::SeriesSpec`]).
    Series(Tensor, Tensor),
}

impl Batch {
    /// Examples in the batch.
    pub fn len(&self) -> usize {
        match self {
            Batch::Text(_, l) | Batch::Image(_, l) | Batch::Features(_, l) => l.len(),
            Batch::Series(x, _) => x.dims().first().copied().unwrap_or(0),
        }
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Example `i` alone, as a batch of one (text without the batch's padding).
    pub fn row(&self, i: usize) -> candle_core::Result<Batch> {
        match self {
            Batch::Image(x, l) => Ok(Batch::Image(x.narrow(0, i, 1)?, vec![l[i]])),
            Batch::Features(x, l) => Ok(Batch::Features(x.narrow(0, i, 1)?, vec![l[i]])),
            Batch::Series(x, y) => Ok(Batch::Series(x.narrow(0, i, 1)?, y.narrow(0, i, 1)?)),
            Batch::Text(b, l) => {
                let len = b
                    .mask
                    .narrow(0, i, 1)?
                    .to_dtype(candle_core::DType::F32)?
                    .sum_all()?
                    .to_scalar::<f32>()? as usize;
                let cut = |t: &Tensor| t.narrow(0, i, 1)?.narrow(1, 0, len.max(1));
                Ok(Batch::Text(
                    TextBatch {
                        ids: cut(&b.ids)?,
                        type_ids: cut(&b.type_ids)?,
                        mask: cut(&b.mask)?,
                    },
                    vec![l[i]],
                ))
            }
        }
    }
}

impl trident_train::distill::RowKeys for Batch {
    /// Images and table rows: the bytes of each normalised image or encoded row (an
    /// augmented view is another key). Text: the unpadded token ids of each row (padding
    /// depends on the batch).
    fn row_keys(&self) -> candle_core::Result<Vec<u64>> {
        use trident_train::distill::{fnv1a, FNV_START};
        match self {
            Batch::Image(x, _) | Batch::Features(x, _) | Batch::Series(x, _) => {
                let rows = x.flatten_from(1)?.to_vec2::<f32>()?;
                Ok(rows
                    .iter()
                    .map(|r| r.iter().fold(FNV_START, |h, v| fnv1a(&v.to_le_bytes(), h)))
                    .collect())
            }
            Batch::Text(b, _) => {
                let ids = b.ids.to_vec2::<u32>()?;
                let mask = b.mask.to_vec2::<u32>()?;
                Ok(ids
                    .iter()
                    .zip(&mask)
                    .map(|(r, m)| {
                        r.iter()
                            .zip(m)
                            .filter(|(_, m)| **m != 0)
                            .fold(FNV_START, |h, (id, _)| fnv1a(&id.to_le_bytes(), h))
                    })
                    .collect())
            }
        }
    }
}

/// A model kind's network: what the kind's module implements so the trainer, evaluation,
/// distillation and checkpoints can use it without knowing the kind. A new kind is one
/// module (its build function and this trait) and one line in [`Model::build`]'s registry.
pub trait Network: Any + Send + Sync {
    /// The kind's objective on `batch`: its loss and its prediction (class logits,
    /// reconstruction or forecast errors). `card` describes the input the batch holds.
    fn step(&self, batch: &Batch, card: &ModelCard, ctx: &Ctx) -> candle_core::Result<StepOutput>;

    /// [`Network::step`] with the encoder's hidden states (embeddings and every layer), for
    /// networks that expose them to intermediate-layer distillation; `None` for others.
    fn step_hidden(
        &self,
        _batch: &Batch,
        _ctx: &Ctx,
    ) -> candle_core::Result<Option<(StepOutput, HiddenStates)>> {
        Ok(None)
    }

    /// The count (embeddings + layers) and width of the hidden states
    /// [`Network::step_hidden`] returns; `None` for networks without them.
    fn hidden_layout(&self) -> Option<(usize, usize)> {
        None
    }

    /// Files besides the weights that a checkpoint of this kind needs to load alone (a
    /// tokenizer, an encoder's config), as (name, bytes).
    fn assets(&self, _card: &ModelCard) -> Result<Vec<(String, Vec<u8>)>> {
        Ok(Vec::new())
    }
}

/// The network of a [`Model`]: any kind's, behind [`Network`]; code that needs one kind's
/// own methods asks for it by type ([`Net::get`]).
pub struct Net(Box<dyn Network>);

impl Net {
    /// Wraps a kind's network.
    pub fn new(net: impl Network) -> Self {
        Net(Box::new(net))
    }

    /// The network as the kind `T`, if it is one.
    pub fn get<T: Network>(&self) -> Option<&T> {
        let any: &dyn Any = &*self.0;
        any.downcast_ref()
    }

    /// Whether the network is of kind `T`.
    pub fn is<T: Network>(&self) -> bool {
        self.get::<T>().is_some()
    }

    /// The network as the kind `T`, owned; itself back if it is another kind.
    pub fn into_kind<T: Network>(self) -> Result<Box<T>, Net> {
        if !self.is::<T>() {
            return Err(self);
        }
        let any: Box<dyn Any> = self.0;
        Ok(any.downcast().expect("checked above"))
    }
}

impl std::ops::Deref for Net {
    type Target = dyn Network;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

/// A classifier's step: cross-entropy of `logits` against `labels`.
fn classified(logits: Tensor, labels: &[usize]) -> candle_core::Result<StepOutput> {
    let y = Tensor::from_iter(labels.iter().map(|&l| l as u32), &Device::Cpu)?;
    let _layer = trident_nn::trace::layer(|| "loss".into());
    Ok(StepOutput::classified(
        ops::cross_entropy(&logits, &y)?,
        logits,
        labels.to_vec(),
    ))
}

/// A regression step: the mean of per-example squared errors, which are the prediction
/// (reconstruction or forecast errors, the anomaly or error scores).
fn scored(errors: Tensor, labels: Vec<usize>) -> candle_core::Result<StepOutput> {
    let _layer = trident_nn::trace::layer(|| "loss".into());
    Ok(StepOutput {
        loss: errors.mean_all()?,
        prediction: Prediction::Scores(errors),
        labels,
    })
}

/// The error for a batch of another kind than the network takes.
fn mismatch(takes: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!("batch kind does not match the model: it takes {takes}"))
}

/// A GAN's two networks (parameters under `generator.` and `discriminator.`) and its loss.
pub struct Gan {
    pub generator: trident_nn::gan::Generator,
    pub discriminator: trident_nn::gan::Discriminator,
    pub loss: trident_nn::gan::GanLoss,
    pub shape: trident_nn::gan::GanShape,
    /// Critic updates per generator update.
    pub critic_steps: u64,
}

/// A network, its parameters and (for text) its tokenizer.
pub struct Model {
    pub net: Net,
    pub params: Params,
    pub tokenizer: Option<Arc<Tokenizer>>,
    pub card: ModelCard,
}

impl TrainStep for Model {
    type Batch = Batch;

    fn forward(&self, batch: &Batch, ctx: &Ctx) -> candle_core::Result<StepOutput> {
        self.net.step(batch, &self.card, ctx)
    }

    fn params(&self) -> &Params {
        &self.params
    }

    fn evaluator(&self) -> candle_core::Result<Option<Box<dyn TrainStep<Batch = Batch>>>> {
        match self.inference_twin() {
            Ok(twin) => Ok(Some(Box::new(twin))),
            Err(e) => Err(candle_core::Error::Msg(format!(
                "the evaluation twin: {}",
                e.report()
            ))),
        }
    }

    fn forward_hidden(
        &self,
        batch: &Batch,
        ctx: &Ctx,
    ) -> candle_core::Result<Option<(StepOutput, HiddenStates)>> {
        self.net.step_hidden(batch, ctx)
    }
}

/// What a kind's build function gets: the card, the parameter store to build into, and
/// where weights and assets come from.
pub(crate) struct Building<'a> {
    pub card: &'a ModelCard,
    pub seed: u64,
    /// A checkpoint's folder (`model.safetensors` and assets), when loading one.
    pub weights_dir: Option<&'a Path>,
    pub params: &'a Params,
    /// A tokenizer already read for this card.
    tokenizer: Option<&'a Arc<Tokenizer>>,
}

impl Building<'_> {
    /// Whether the weights come from a checkpoint (loaded after the build).
    pub fn loading_checkpoint(&self) -> bool {
        self.weights_dir.is_some()
    }

    /// Whether this is a new model: no checkpoint and not a view of another's parameters,
    /// so pretrained weights and initial embeddings are read.
    pub fn fresh(&self) -> bool {
        self.weights_dir.is_none() && !self.params.is_view()
    }

    /// The checkpoint's folder when loading one, else the configured asset folder.
    pub fn asset_dir(&self, configured: &Path) -> PathBuf {
        self.weights_dir
            .map(Path::to_path_buf)
            .unwrap_or_else(|| configured.into())
    }

    /// The tokenizer in `file`, or the one already read for this card.
    pub fn tokenizer(&self, file: &Path) -> Result<Arc<Tokenizer>> {
        match self.tokenizer {
            Some(t) => Ok(t.clone()),
            None => Ok(Arc::new(Tokenizer::from_file(file).map_err(ZooError::Config)?)),
        }
    }
}

/// A built network and the tokenizer it reads text with.
pub(crate) type Built = (Net, Option<Arc<Tokenizer>>);

/// Builds the network of `b.card`'s kind: the registry of model kinds, one line each.
fn build_kind(b: &Building) -> Result<Built> {
    match &b.card.model {
        ModelConfig::Bert { .. } => text::build_bert(b),
        ModelConfig::Lstm(_) | ModelConfig::Gru(_) => text::build_rnn(b),
        ModelConfig::Vit(_) => vision::build_vit(b),
        ModelConfig::Cnn { .. } => vision::build_cnn(b),
        ModelConfig::EfficientnetLite0(_) => vision::build_efficientnet(b),
        ModelConfig::Mlp { .. } | ModelConfig::Sequential(_) => table::build(b),
        ModelConfig::Autoencoder(_) => autoencoder::build(b),
        ModelConfig::Forecaster(_) => series::build(b),
        ModelConfig::Gan(_) => gan::build(b),
    }
}

impl Model {
    /// Elements of every parameter tensor (buffers included).
    pub fn param_count(&self) -> usize {
        self.params.all().iter().map(|p| p.var.elem_count()).sum()
    }

    /// Hidden states a transformer encoder exposes: their count (embeddings + layers) and
    /// width; `None` for other networks.
    pub fn hidden_layout(&self) -> Option<(usize, usize)> {
        self.net.hidden_layout()
    }

    /// Builds the model of `card`. `weights_dir` holds `model.safetensors` with every
    /// tensor (a checkpoint); without it, new layers are initialised from `seed` and a
    /// BERT encoder is loaded from its pretrained folder.
    pub fn build(card: &ModelCard, seed: u64, weights_dir: Option<&Path>) -> Result<Self> {
        Self::build_on(card, seed, weights_dir, Params::new(), None)
    }

    /// The same model over the same parameter values, for evaluation passes: its
    /// parameters are detached views of this model's (sharing their storage, so optimizer
    /// updates and loaded checkpoints show), so its forward pass records no graph and frees
    /// each activation once read (an EfficientNet-Lite0 evaluation batch of 200 at 112 px
    /// otherwise keeps 4 GB of activations alive to its end).
    pub fn inference_twin(&self) -> Result<Self> {
        Self::build_on(
            &self.card,
            0,
            None,
            self.params.inference_view(),
            self.tokenizer.as_ref(),
        )
    }

    /// [`Model::build`] into `params`: a new store, one [`Params::for_inference`], or an
    /// [`Params::inference_view`] of an existing model's (no weight file is read for it);
    /// `tokenizer`, one already read for this card (not read again).
    fn build_on(
        card: &ModelCard,
        seed: u64,
        weights_dir: Option<&Path>,
        params: Params,
        tokenizer: Option<&Arc<Tokenizer>>,
    ) -> Result<Self> {
        let (net, tokenizer) = build_kind(&Building {
            card,
            seed,
            weights_dir,
            params: &params,
            tokenizer,
        })?;
        if let Some(dir) = weights_dir {
            let file = dir.join("model.safetensors");
            params
                .load_values(&Loaded::read(&file)?)
                .map_err(|e| ZooError::file(format!("loading {}", file.display()), e))?;
        }
        Ok(Model {
            net,
            params,
            tokenizer,
            card: card.clone(),
        })
    }

    /// Files a checkpoint carries so it can be loaded alone: `trident.json`, and the
    /// tokenizer and BERT config.
    pub fn checkpoint_files(&self) -> Result<Vec<(String, Vec<u8>)>> {
        let mut files = vec![("trident.json".to_string(), serde_json::to_vec_pretty(&self.card)?)];
        files.extend(self.net.assets(&self.card)?);
        Ok(files)
    }

    /// Reads a checkpoint directory written by `trident train`.
    pub fn load_checkpoint(dir: &Path) -> Result<Self> {
        // The files read here, against the checkpoint's manifest (not the optimizer state).
        trident_train::checkpoint::verify(
            dir,
            &[
                "trident.json",
                "model.safetensors",
                "config.json",
                "tokenizer.json",
                "run.toml",
            ],
        )?;
        let card_file = dir.join("trident.json");
        let card: ModelCard =
            serde_json::from_slice(&std::fs::read(&card_file).map_err(|e| {
                ZooError::file(format!("{}: not a Trident checkpoint", card_file.display()), e)
            })?)
            .map_err(|e| ZooError::file(card_file.display().to_string(), e))?;
        // Loaded for forward passes only: its models record no graph.
        Self::build_on(&card, 0, Some(dir), Params::for_inference(), None)
    }

    /// The card's length rule for texts (`None` for image models).
    pub fn length_rule(&self) -> Option<trident_data::tokenize::LengthRule> {
        match self.card.input {
            InputSpec::Text { max_len, truncate } => {
                Some(trident_data::tokenize::LengthRule { max_len, truncate })
            }
            InputSpec::Image { .. } | InputSpec::Table { .. } | InputSpec::Series(_) => None,
        }
    }

    /// Tokenises one text under the card's length rule; `what` names it in errors.
    pub fn tokenize(&self, text: &str, what: &dyn Fn() -> String) -> Result<Vec<u32>> {
        let tok = self
            .tokenizer
            .as_ref()
            .ok_or(ZooError::Kind("this model does not take text"))?;
        let rule = self
            .length_rule()
            .ok_or(ZooError::Kind("this model does not take text"))?;
        tok.encode_within(text, rule).map_err(|e| match e {
            EncodeError::TooLong { tokens, max_len } => ZooError::Text {
                what: what(),
                why: format!(
                    "{tokens} tokens, longer than data.max_len = {max_len} (set data.truncate = true to cut)"
                ),
            },
            e => ZooError::Text {
                what: what(),
                why: e.to_string(),
            },
        })
    }
}
