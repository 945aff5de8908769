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

/// `embedding.weight` for a recurrent student: the word embeddings of the BERT folder or
/// checkpoint `from` projected onto their `dim` leading principal directions, scaled to unit
/// standard deviation (the scale of a fresh `N(0, 1)` table).
fn projected_embeddings(from: &Path, vocab: usize, dim: usize) -> anyhow::Result<Loaded> {
    let l = load_bert_weights(from)?;
    let name = "bert.embeddings.word_embeddings.weight";
    let table = l
        .tensor(name)
        .with_context(|| format!("model.embeddings = {}: no {name}", from.display()))?;
    let (rows, width) = table.dims2()?;
    if rows != vocab {
        bail!(
            "model.embeddings = {}: {rows} token embeddings, the tokenizer has {vocab} tokens \
             (use that model's tokenizer.json)",
            from.display()
        );
    }
    if dim > width {
        bail!(
            "model.embed = {dim} is wider than {}'s {width}-wide embeddings",
            from.display()
        );
    }
    let p = trident_nn::pca::project(table, dim)?;
    let std = p.sqr()?.mean_all()?.to_scalar::<f32>()?.sqrt().max(1e-12);
    let mut out = Loaded::from_tensors(Default::default(), &from.display().to_string());
    out.insert("embedding.weight", p.affine(1.0 / std as f64, 0.0)?);
    eprintln!(
        "embeddings: {}'s {width}-wide token embeddings projected onto their {dim} leading principal directions",
        from.display()
    );
    Ok(out)
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

/// A BERT classifier from the Hugging Face folder `dir` (`config.json`, and unless the
/// weights come from a checkpoint (`from_checkpoint`) or `params` is a view,
/// `model.safetensors`; the caller reads its `tokenizer.json`), with the card's kept
/// layers, widths, pooling and frozen encoder.
fn bert(
    card: &ModelCard,
    dir: &Path,
    from_checkpoint: bool,
    params: &Params,
    seed: u64,
) -> anyhow::Result<Net> {
    let ModelConfig::Bert {
        pooling,
        freeze_encoder,
        layers,
        ..
    } = &card.model
    else {
        bail!("not a bert model")
    };
    let classes = card.classes.len();
    let width = BertWidth::of(&card.model);
    let config = bert_config(card, dir, from_checkpoint)?;
    let loaded = match from_checkpoint || params.is_view() {
        true => None,
        false => Some(pretrained_bert_weights(
            dir,
            &config,
            classes,
            *pooling,
            layers.as_deref(),
            &width,
            seed,
        )?),
    };
    let pb = params.builder(seed, loaded);
    let m = BertClassifier::new(&pb, &config, classes, *pooling)?;
    if !from_checkpoint && !params.is_view() && !width.any() {
        let fresh: Vec<_> = params
            .initialised_names()
            .into_iter()
            .filter(|n| n.starts_with("bert."))
            .collect();
        if !fresh.is_empty() {
            bail!(
                "{}: lacks encoder weights {fresh:?}",
                dir.join("model.safetensors").display()
            );
        }
    }
    if *pooling == trident_nn::bert::Pooling::Mean {
        // Mean pooling bypasses the pooler: it would get no gradient, only decay.
        params.set_trainable("bert.pooler", false);
    }
    if *freeze_encoder {
        params.set_trainable("bert.", false);
    }
    Ok(Net::Bert(Box::new(m)))
}

/// The encoder's configuration: `dir`'s `config.json`, narrowed to the card's widths and
/// kept layers unless it is a checkpoint's (which already describes them).
fn bert_config(card: &ModelCard, dir: &Path, from_checkpoint: bool) -> anyhow::Result<BertConfig> {
    let ModelConfig::Bert { layers, .. } = &card.model else {
        bail!("not a bert model")
    };
    let width = BertWidth::of(&card.model);
    let mut config = BertConfig::read(&dir.join("config.json"))?;
    // A checkpoint's config.json already describes the student's width.
    if width.any() && !from_checkpoint {
        config.hidden_size = width.hidden.unwrap_or(config.hidden_size);
        config.num_attention_heads = width.heads.unwrap_or(config.num_attention_heads);
        config.intermediate_size = width.intermediate.unwrap_or(config.intermediate_size);
        let (h, a) = (config.hidden_size, config.num_attention_heads);
        if h == 0 || a == 0 || h % a != 0 || config.intermediate_size == 0 {
            bail!(
                "model.hidden = {h}, model.heads = {a}, model.intermediate = {}: the heads must \
                 divide the hidden size and every width be at least 1",
                config.intermediate_size
            );
        }
    }
    // A checkpoint's config.json already describes the kept layers.
    if let (Some(keep), false) = (layers, from_checkpoint) {
        let n = config.num_hidden_layers;
        if keep.is_empty() || keep.iter().any(|&l| l >= n) {
            bail!(
                "model.layers = {keep:?}: {} has encoder layers 0..{n}; list one or more of them",
                dir.display()
            );
        }
        config.num_hidden_layers = keep.len();
    }
    Ok(config)
}

/// The pretrained weights of `dir` for a classifier of `config`: its kept layers, a new
/// head where the class count differs, and for a narrower student the embeddings projected
/// onto their leading principal directions and the tensors of other shapes dropped.
#[allow(clippy::too_many_arguments)]
fn pretrained_bert_weights(
    dir: &Path,
    config: &BertConfig,
    classes: usize,
    pooling: trident_nn::bert::Pooling,
    layers: Option<&[usize]>,
    width: &BertWidth,
    seed: u64,
) -> anyhow::Result<Loaded> {
    let mut l = load_bert_weights(dir)?;
    if let Some(keep) = layers {
        l.keep_layers("bert.encoder.layer.", keep)?;
    }
    // A pretrained head for another label set is replaced by a new one.
    if l.dims("classifier.weight")
        .is_some_and(|d| d.first() != Some(&classes))
    {
        let dropped = l.drop_prefix("classifier.");
        eprintln!(
            "{}: its classifier has another class count; new head instead of {dropped:?}",
            dir.display()
        );
    }
    let word = "bert.embeddings.word_embeddings.weight";
    if let Some(d) = l.dims(word).filter(|d| d.get(1) != Some(&config.hidden_size)) {
        // A narrower width: the teacher's embeddings (word, position,
        // segment; summed in the model) projected onto the leading
        // principal directions of its word embeddings.
        let k = config.hidden_size;
        if k > d[1] {
            bail!(
                "model.hidden = {k} is wider than the pretrained {}; only narrower students are supported",
                d[1]
            );
        }
        let (mean, basis) = trident_nn::pca::basis(l.tensor(word).expect("present"), k)?;
        for name in [
            word,
            "bert.embeddings.position_embeddings.weight",
            "bert.embeddings.token_type_embeddings.weight",
        ] {
            if let Some(t) = l.tensor(name) {
                let t = t.to_dtype(candle_core::DType::F32)?;
                let t = if name == word { t.broadcast_sub(&mean)? } else { t };
                l.insert(name, t.matmul(&basis)?);
            }
        }
        eprintln!(
            "narrow student: embeddings projected onto the {k} leading principal directions of {}'s",
            dir.display()
        );
    }
    if width.any() {
        // Initialised "where shapes allow": a throwaway build gives the
        // student's shapes, and weights of other shapes are dropped.
        let probe = Params::new();
        BertClassifier::new(&probe.builder(seed, None), config, classes, pooling)?;
        let shapes = probe
            .all()
            .into_iter()
            .map(|p| (p.name.clone(), p.var.dims().to_vec()))
            .collect();
        let dropped = l.retain_matching(&shapes);
        eprintln!(
            "narrow student: {} pretrained tensors of other shapes are initialised instead",
            dropped.len()
        );
    }
    Ok(l)
}

/// The network of a table model (`mlp` or `sequential`) on the card's encoded rows.
fn table_net(card: &ModelCard, params: &Params, seed: u64) -> anyhow::Result<Net> {
    let InputSpec::Table { encoder, .. } = &card.input else {
        bail!("mlp and sequential models take table input (data.kind = \"table\")")
    };
    let (pb, width, classes) = (params.builder(seed, None), encoder.width(), card.classes.len());
    Ok(match &card.model {
        ModelConfig::Mlp {
            hidden,
            activation,
            dropout,
        } => {
            let act = trident_nn::custom::activation_by_name(activation)
                .map_err(|m| anyhow::anyhow!("model.activation: {m}"))?;
            if hidden.contains(&0) {
                bail!("model.hidden = {hidden:?}: every hidden width must be at least 1");
            }
            if !(0.0..1.0).contains(dropout) {
                bail!("model.dropout = {dropout}: must be in [0, 1)");
            }
            let sizes: Vec<usize> = std::iter::once(width)
                .chain(hidden.iter().copied())
                .chain(std::iter::once(classes))
                .collect();
            Net::Mlp(trident_nn::layers::Mlp::new(&pb, &sizes, act, *dropout)?)
        }
        ModelConfig::Sequential(m) => Net::Sequential(trident_nn::custom::Sequential::new(
            &pb, &m.layers, width, classes,
        )?),
        _ => bail!("not a table model"),
    })
}

/// The forecaster of `f` on `input`'s windows.
fn forecaster(
    f: &ForecasterModel,
    input: &InputSpec,
    params: &Params,
    seed: u64,
) -> anyhow::Result<trident_nn::forecast::Forecaster> {
    use trident_nn::forecast::Forecaster;
    let InputSpec::Series(s) = input else {
        bail!("a forecaster takes a series (data.kind = \"series\")")
    };
    if !(0.0..1.0).contains(&f.dropout) {
        bail!("model.dropout = {}: must be in [0, 1)", f.dropout);
    }
    let pb = params.builder(seed, None);
    Ok(match f.net {
        ForecastNet::Mlp => {
            let act = trident_nn::custom::activation_by_name(f.activation())
                .map_err(|m| anyhow::anyhow!("model.activation: {m}"))?;
            Forecaster::mlp(&pb, s.inputs(), &f.hidden, s.horizon, act, f.dropout)?
        }
        ForecastNet::Lstm | ForecastNet::Gru => {
            let width = *f
                .hidden
                .first()
                .context("model.hidden: an lstm or gru needs a width per layer")?;
            if f.hidden.iter().any(|&h| h != width) {
                bail!(
                    "model.hidden = {:?}: an lstm or gru stack has one width for every layer",
                    f.hidden
                );
            }
            let kind = if f.net == ForecastNet::Lstm {
                CellKind::Lstm
            } else {
                CellKind::Gru
            };
            Forecaster::rnn(
                &pb,
                kind,
                width,
                f.hidden.len(),
                s.horizon,
                f.dropout,
                s.steps(),
                &s.calendar,
            )?
        }
    })
}

/// The autoencoder of `a` on `input` (images, or a table's encoded rows).
fn autoencoder(
    a: &AutoencoderModel,
    input: &InputSpec,
    params: &Params,
    seed: u64,
) -> anyhow::Result<Autoencoder> {
    use trident_nn::autoencoder::Output;
    let act = trident_nn::custom::activation_by_name(&a.activation)
        .map_err(|m| anyhow::anyhow!("model.activation: {m}"))?;
    if !(a.noise >= 0.0 && a.noise.is_finite()) {
        bail!("model.noise = {}: must be >= 0", a.noise);
    }
    let output = match (a.output, input) {
        (Some(AeOutput::Sigmoid), _) => Output::Sigmoid,
        (Some(AeOutput::Linear), _) => Output::Linear,
        (None, InputSpec::Image { mean, std, .. }) if *mean == 0.0 && *std == 1.0 => Output::Sigmoid,
        (None, _) => Output::Linear,
    };
    let pb = params.builder(seed, None);
    Ok(match (a.shape, input) {
        (AeShape::Dense, InputSpec::Table { encoder, .. }) => {
            Autoencoder::dense(&pb, encoder.width(), &a.hidden(), a.code, act, output, a.noise)?
        }
        (
            AeShape::Dense,
            InputSpec::Image {
                channels,
                height,
                width,
                ..
            },
        ) => Autoencoder::dense(
            &pb,
            channels * height * width,
            &a.hidden(),
            a.code,
            act,
            output,
            a.noise,
        )?,
        (
            AeShape::Conv,
            &InputSpec::Image {
                channels,
                height,
                width,
                ..
            },
        ) => Autoencoder::conv(
            &pb,
            (channels, height, width),
            &a.channels(),
            a.code,
            act,
            output,
            a.noise,
        )?,
        (AeShape::Conv, _) => {
            bail!("model.shape = \"conv\" takes images; use \"dense\" for table rows and series")
        }
        (AeShape::Dense, InputSpec::Series(s)) => {
            Autoencoder::dense(&pb, s.window, &a.hidden(), a.code, act, output, a.noise)?
        }
        (_, InputSpec::Text { .. }) => {
            bail!("an autoencoder takes images, table rows or series windows, not text")
        }
    })
}

/// Normalises images and stacks them into a `[n, c, h, w]` batch (training, evaluation and
/// `predict` share it).
pub fn image_collate(
    (c, h, w): (usize, usize, usize),
    mean: f32,
    std: f32,
) -> impl Fn(Vec<trident_data::idx::Image>) -> Result<Batch, DataError> + Send + Sync + 'static {
    move |items| {
        let n = items.len();
        let mut px = Vec::with_capacity(n * c * h * w);
        let mut labels = Vec::with_capacity(n);
        for mut im in items {
            trident_data::transform::normalize(&mut im.pixels, mean, std);
            px.extend(im.pixels);
            labels.push(im.label);
        }
        let x =
            Tensor::from_vec(px, (n, c, h, w), &Device::Cpu).map_err(|e| DataError::Batch(e.to_string()))?;
        Ok(Batch::Image(x, labels))
    }
}

/// The ViT of `[model] kind = "vit"`, its image size and channels checked against the
/// data's.
fn vit(c: &VitConfig, card: &ModelCard, params: &Params, seed: u64) -> anyhow::Result<Vit> {
    if let InputSpec::Image {
        channels,
        height,
        width,
        ..
    } = card.input
    {
        if (c.channels, c.image_size, c.image_size) != (channels, height, width) {
            bail!(
                "vit: model.image_size = {} and model.channels = {} do not match the {channels}x{height}x{width} images",
                c.image_size,
                c.channels
            );
        }
    }
    Ok(Vit::new(&params.builder(seed, None), c, card.classes.len())?)
}

/// The CNN of `[model] kind = "cnn"` for square images.
fn cnn(width: usize, dropout: f32, card: &ModelCard, params: &Params, seed: u64) -> anyhow::Result<Cnn> {
    let InputSpec::Image {
        channels,
        height,
        width: w,
        ..
    } = card.input
    else {
        bail!("cnn needs image input")
    };
    if height != w {
        bail!("cnn: images must be square, these are {height}x{w}");
    }
    Ok(Cnn::new(
        &params.builder(seed, None),
        channels,
        height,
        width,
        card.classes.len(),
        dropout,
    )?)
}

/// The recurrent classifier of `[model] kind = "lstm" | "gru"` over `tok`'s vocabulary;
/// with `fresh` (a new model) its embeddings start from `model.embeddings` when given.
fn rnn(
    r: &RnnModel,
    kind: CellKind,
    tok: &Tokenizer,
    classes: usize,
    params: &Params,
    seed: u64,
    fresh: bool,
) -> anyhow::Result<RnnClassifier> {
    let vocab = tok.vocab_size();
    let loaded = match &r.embeddings {
        Some(from) if fresh => Some(projected_embeddings(from, vocab, r.embed)?),
        _ => None,
    };
    Ok(RnnClassifier::new(
        &params.builder(seed, loaded),
        kind,
        vocab,
        r.embed,
        r.hidden,
        r.layers,
        classes,
        r.dropout,
    )?)
}

/// The GAN of `[model] kind = "gan"` for image input.
fn gan(g: &crate::card::GanModel, input: &InputSpec, params: &Params, seed: u64) -> anyhow::Result<Gan> {
    let InputSpec::Image {
        channels,
        height,
        width,
        ..
    } = *input
    else {
        bail!("a gan generates images: it needs image data")
    };
    if height % 4 != 0 || width % 4 != 0 {
        bail!("gan: images of {height}x{width}: height and width must be multiples of 4");
    }
    if g.z == 0 || g.width == 0 || g.critic_steps() == 0 || g.clip() <= 0.0 {
        bail!("gan: model.z, model.width, model.critic_steps and model.clip must be positive");
    }
    let shape = trident_nn::gan::GanShape {
        image: (channels, height, width),
        z: g.z,
        width: g.width,
        critic_batch_norm: g.critic_batch_norm,
    };
    Ok(Gan {
        generator: trident_nn::gan::Generator::new(&params.builder(seed, None).pp("generator"), shape)?,
        discriminator: trident_nn::gan::Discriminator::new(
            &params.builder(seed ^ 0xd15c, None).pp("discriminator"),
            shape,
        )?,
        loss: g.objective(),
        shape,
        critic_steps: g.critic_steps(),
    })
}

/// EfficientNet-Lite0 of `[model] kind = "efficientnet_lite0"`: the pretrained weights by
/// name (unless a checkpoint's are loaded after), a new classifier, and in probe mode
/// everything but the classifier frozen.
fn efficientnet(
    e: &crate::card::EfficientNetModel,
    card: &ModelCard,
    params: &Params,
    seed: u64,
    from_checkpoint: bool,
) -> anyhow::Result<trident_nn::efficientnet::EfficientNetLite0> {
    let InputSpec::Image { channels, .. } = card.input else {
        bail!("efficientnet_lite0 takes images")
    };
    let probe = e.mode == crate::card::TransferMode::Probe;
    match e.bn_momentum {
        Some(_) if probe => bail!(
            "model.bn_momentum has no effect with model.mode = \"probe\": the frozen backbone runs on its \
             pretrained running statistics; remove it"
        ),
        Some(m) if !(m > 0.0 && m <= 1.0) => bail!("model.bn_momentum = {m} is not in (0, 1]"),
        _ => {}
    }
    let loaded = match (&e.pretrained, from_checkpoint || params.is_view()) {
        (Some(file), false) => Some(
            trident_nn::efficientnet::pretrained(file, false)
                .with_context(|| format!("model.pretrained = {}", file.display()))?,
        ),
        (None, false) if probe => bail!(
            "model.mode = \"probe\" trains a classifier on frozen pretrained features: set model.pretrained \
             (scripts/fetch-data.sh efficientnet)"
        ),
        _ => None,
    };
    let adapter = trident_nn::efficientnet::InputAdapter {
        channels,
        scale: e.scale,
    };
    let m = trident_nn::efficientnet::EfficientNetLite0::new(
        &params.builder(seed, loaded),
        card.classes.len(),
        adapter,
        e.dropout,
        probe,
        e.bn_momentum(),
    )?;
    if probe {
        // The backbone's names all start with `_` (the port's); the classifier is `head`.
        params.set_trainable("_", false);
    }
    Ok(m)
}
