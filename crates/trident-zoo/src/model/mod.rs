//! The models Trident trains, built from a model card, loaded from a checkpoint, and the
//! [`TrainStep`] that ties each to its loss.

use crate::card::{
    AeOutput, AeShape, AutoencoderModel, BertWidth, ForecastNet, ForecasterModel, InputSpec, ModelCard,
    ModelConfig, RnnModel,
};
use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use trident_data::tokenize::EncodeError;
use trident_data::DataError;
use trident_nn::autoencoder::Autoencoder;
use trident_nn::bert::{load_bert_weights, BertClassifier, BertConfig, TextBatch, Tokenizer};
use trident_nn::rnn::{CellKind, RnnClassifier};
use trident_nn::vision::{Cnn, Vit, VitConfig};
use trident_nn::{ops, Ctx, Device, Loaded, Params, Tensor};
use trident_train::trainer::HiddenStates;
use trident_train::{Prediction, StepOutput, TrainStep};

mod autoencoder;
mod gan;
mod series;
mod table;
mod text;
mod vision;

use autoencoder::autoencoder;
use gan::gan;
use series::forecaster;
use table::table_net;
use text::{bert, rnn};
pub use vision::image_collate;
use vision::{cnn, efficientnet, vit};

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

/// The networks Trident trains from a config.
pub enum Net {
    Bert(Box<BertClassifier>),
    Vit(Vit),
    Cnn(Cnn),
    Rnn(RnnClassifier),
    Mlp(trident_nn::layers::Mlp),
    Sequential(trident_nn::custom::Sequential),
    Autoencoder(trident_nn::autoencoder::Autoencoder),
    Forecaster(trident_nn::forecast::Forecaster),
    Gan(Box<Gan>),
    EfficientNet(Box<trident_nn::efficientnet::EfficientNetLite0>),
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
        if let Net::Forecaster(f) = &self.net {
            let Batch::Series(x, y) = batch else {
                candle_core::bail!("a forecaster takes series windows")
            };
            let errors = trident_nn::layers::mse_per_example(y, &f.forward(x, ctx)?)?;
            let _layer = trident_nn::trace::layer(|| "loss".into());
            return Ok(StepOutput {
                loss: errors.mean_all()?,
                prediction: Prediction::Scores(errors),
                labels: vec![0; x.dim(0)?],
            });
        }
        if let Net::Autoencoder(m) = &self.net {
            let (x, labels) = match batch {
                Batch::Image(x, l) | Batch::Features(x, l) => (x, l.clone()),
                // A series' windows: reconstructed, their next values unused.
                Batch::Series(x, _) => (x, vec![0; x.dim(0)?]),
                Batch::Text(..) => {
                    candle_core::bail!("an autoencoder takes images, table rows or series windows, not text")
                }
            };
            let errors = trident_nn::layers::mse_per_example(x, &m.forward(x, ctx)?)?;
            let _layer = trident_nn::trace::layer(|| "loss".into());
            return Ok(StepOutput {
                loss: errors.mean_all()?,
                prediction: Prediction::Scores(errors),
                labels,
            });
        }
        let (logits, labels) = match (batch, &self.net) {
            (Batch::Text(b, l), Net::Bert(m)) => (m.forward(b, ctx)?, l),
            (Batch::Text(b, l), Net::Rnn(m)) => (m.forward(&b.ids, &b.mask, ctx)?, l),
            (Batch::Image(x, l), Net::Vit(m)) => (m.forward(x, ctx)?, l),
            (Batch::Image(x, l), Net::Cnn(m)) => (m.forward(x, ctx)?, l),
            (Batch::Image(x, l), Net::EfficientNet(m)) => {
                // The network takes pixels in [0, 1] and scales them as it was trained.
                let InputSpec::Image { mean, std, .. } = self.card.input else {
                    candle_core::bail!("an image model whose card does not describe images")
                };
                (m.forward(&x.affine(std as f64, mean as f64)?, ctx)?, l)
            }
            (Batch::Features(x, l), Net::Mlp(m)) => (m.forward(x, ctx)?, l),
            (Batch::Features(x, l), Net::Sequential(m)) => (m.forward(x, ctx)?, l),
            _ => candle_core::bail!("batch kind does not match the model"),
        };
        let y = Tensor::from_iter(labels.iter().map(|&l| l as u32), &Device::Cpu)?;
        let _layer = trident_nn::trace::layer(|| "loss".into());
        Ok(StepOutput::classified(
            ops::cross_entropy(&logits, &y)?,
            logits,
            labels.clone(),
        ))
    }

    fn params(&self) -> &Params {
        &self.params
    }

    fn evaluator(&self) -> candle_core::Result<Option<Box<dyn TrainStep<Batch = Batch>>>> {
        match self.inference_twin() {
            Ok(twin) => Ok(Some(Box::new(twin))),
            Err(e) => Err(candle_core::Error::Msg(format!("the evaluation twin: {e:#}"))),
        }
    }

    fn forward_hidden(
        &self,
        batch: &Batch,
        ctx: &Ctx,
    ) -> candle_core::Result<Option<(StepOutput, HiddenStates)>> {
        let (Batch::Text(b, labels), Net::Bert(m)) = (batch, &self.net) else {
            return Ok(None);
        };
        let (logits, states) = m.forward_hidden(b, ctx)?;
        let y = Tensor::from_iter(labels.iter().map(|&l| l as u32), &Device::Cpu)?;
        let _layer = trident_nn::trace::layer(|| "loss".into());
        Ok(Some((
            StepOutput::classified(ops::cross_entropy(&logits, &y)?, logits, labels.clone()),
            HiddenStates {
                states,
                mask: b.mask.to_dtype(candle_core::DType::F32)?,
            },
        )))
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
        match &self.net {
            Net::Bert(m) => Some((m.bert.config.num_hidden_layers + 1, m.bert.config.hidden_size)),
            _ => None,
        }
    }

    /// Builds the model of `card`. `weights_dir` holds `model.safetensors` with every
    /// tensor (a checkpoint); without it, new layers are initialised from `seed` and a
    /// BERT encoder is loaded from its pretrained folder.
    pub fn build(card: &ModelCard, seed: u64, weights_dir: Option<&Path>) -> anyhow::Result<Self> {
        Self::build_on(card, seed, weights_dir, Params::new(), None)
    }

    /// The same model over the same parameter values, for evaluation passes: its
    /// parameters are detached views of this model's (sharing their storage, so optimizer
    /// updates and loaded checkpoints show), so its forward pass records no graph and frees
    /// each activation once read (an EfficientNet-Lite0 evaluation batch of 200 at 112 px
    /// otherwise keeps 4 GB of activations alive to its end).
    pub fn inference_twin(&self) -> anyhow::Result<Self> {
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
    ) -> anyhow::Result<Self> {
        let tokenizer_from = |file: &Path| -> anyhow::Result<Arc<Tokenizer>> {
            match tokenizer {
                Some(t) => Ok(t.clone()),
                None => Ok(Arc::new(Tokenizer::from_file(file).map_err(anyhow::Error::msg)?)),
            }
        };
        let classes = card.classes.len();
        let asset_dir = |configured: &Path| -> PathBuf {
            weights_dir
                .map(Path::to_path_buf)
                .unwrap_or_else(|| configured.into())
        };
        let (net, tokenizer) = match &card.model {
            ModelConfig::Bert { pretrained, .. } => {
                let dir = asset_dir(pretrained);
                let net = bert(card, &dir, weights_dir.is_some(), &params, seed)?;
                (net, Some(tokenizer_from(&dir.join("tokenizer.json"))?))
            }
            ModelConfig::Vit(c) => (Net::Vit(vit(c, card, &params, seed)?), None),
            ModelConfig::Cnn { width, dropout } => {
                (Net::Cnn(cnn(*width, *dropout, card, &params, seed)?), None)
            }
            ModelConfig::Lstm(r) | ModelConfig::Gru(r) => {
                let kind = if matches!(card.model, ModelConfig::Lstm(_)) {
                    CellKind::Lstm
                } else {
                    CellKind::Gru
                };
                let tok_file = match weights_dir {
                    Some(d) => d.join("tokenizer.json"),
                    None => r.tokenizer.clone(),
                };
                let tok = tokenizer_from(&tok_file)?;
                // Pretrained embeddings only for a new model (a checkpoint has its own).
                let fresh = weights_dir.is_none() && !params.is_view();
                (
                    Net::Rnn(rnn(r, kind, &tok, classes, &params, seed, fresh)?),
                    Some(tok),
                )
            }
            ModelConfig::Mlp { .. } | ModelConfig::Sequential(_) => (table_net(card, &params, seed)?, None),
            ModelConfig::Autoencoder(a) => (
                Net::Autoencoder(autoencoder(a, &card.input, &params, seed)?),
                None,
            ),
            ModelConfig::Forecaster(f) => (Net::Forecaster(forecaster(f, &card.input, &params, seed)?), None),
            ModelConfig::Gan(g) => (Net::Gan(Box::new(gan(g, &card.input, &params, seed)?)), None),
            ModelConfig::EfficientnetLite0(e) => (
                Net::EfficientNet(Box::new(efficientnet(
                    e,
                    card,
                    &params,
                    seed,
                    weights_dir.is_some(),
                )?)),
                None,
            ),
        };
        if let Some(dir) = weights_dir {
            let file = dir.join("model.safetensors");
            params
                .load_values(&Loaded::read(&file)?)
                .with_context(|| format!("loading {}", file.display()))?;
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
    pub fn checkpoint_files(&self) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        let mut files = vec![("trident.json".to_string(), serde_json::to_vec_pretty(&self.card)?)];
        let copy = |from: PathBuf, name: &str, files: &mut Vec<(String, Vec<u8>)>| -> anyhow::Result<()> {
            files.push((
                name.into(),
                std::fs::read(&from).with_context(|| from.display().to_string())?,
            ));
            Ok(())
        };
        match &self.card.model {
            ModelConfig::Bert {
                pretrained, layers, ..
            } => {
                copy(pretrained.join("config.json"), "config.json", &mut files)?;
                let width = BertWidth::of(&self.card.model);
                if layers.is_some() || width.any() {
                    // The checkpoint's config describes the student: its layers and widths.
                    let (_, bytes) = files.last_mut().expect("just pushed");
                    let mut json: serde_json::Value = serde_json::from_slice(bytes)
                        .with_context(|| pretrained.join("config.json").display().to_string())?;
                    if let Some(keep) = layers {
                        json["num_hidden_layers"] = keep.len().into();
                    }
                    width.apply_json(&mut json);
                    *bytes = serde_json::to_vec_pretty(&json)?;
                }
                copy(pretrained.join("tokenizer.json"), "tokenizer.json", &mut files)?;
            }
            ModelConfig::Lstm(r) | ModelConfig::Gru(r) => {
                copy(r.tokenizer.clone(), "tokenizer.json", &mut files)?
            }
            _ => {}
        }
        Ok(files)
    }

    /// Reads a checkpoint directory written by `trident train`.
    pub fn load_checkpoint(dir: &Path) -> anyhow::Result<Self> {
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
        let card: ModelCard = serde_json::from_slice(
            &std::fs::read(&card_file)
                .with_context(|| format!("{}: not a Trident checkpoint", card_file.display()))?,
        )
        .with_context(|| card_file.display().to_string())?;
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
    pub fn tokenize(&self, text: &str, what: &dyn Fn() -> String) -> anyhow::Result<Vec<u32>> {
        let tok = self.tokenizer.as_ref().context("this model does not take text")?;
        let rule = self.length_rule().context("this model does not take text")?;
        tok.encode_within(text, rule).map_err(|e| match e {
            EncodeError::TooLong { tokens, max_len } => anyhow::anyhow!(
                "{}: {tokens} tokens, longer than data.max_len = {max_len} (set data.truncate = true to cut)",
                what()
            ),
            e => anyhow::anyhow!("{}: {e}", what()),
        })
    }
}
