//! Text models: a BERT classifier from its Hugging Face folder (kept layers, narrower
//! widths, pretrained weights or a checkpoint's) and the LSTM/GRU classifiers, whose
//! embeddings may start from a BERT's projected onto their leading principal directions.

use super::{classified, mismatch, Batch, Building, Built, Net, Network};
use crate::card::{BertWidth, ModelCard, ModelConfig, RnnModel};
use crate::error::{invalid, Result, ZooError};
use std::path::Path;
use trident_nn::bert::{load_bert_weights, BertClassifier, BertConfig, Tokenizer};
use trident_nn::rnn::{CellKind, RnnClassifier};
use trident_nn::{Ctx, Loaded, Params};
use trident_train::trainer::HiddenStates;
use trident_train::StepOutput;

/// `[model] kind = "bert"`: the encoder and tokenizer from the pretrained folder, or from
/// the checkpoint being loaded.
pub(super) fn build_bert(b: &Building) -> Result<Built> {
    let ModelConfig::Bert { pretrained, .. } = &b.card.model else {
        invalid!("not a bert model")
    };
    let dir = b.asset_dir(pretrained);
    let net = bert(b.card, &dir, b.loading_checkpoint(), b.params, b.seed)?;
    Ok((Net::new(net), Some(b.tokenizer(&dir.join("tokenizer.json"))?)))
}

/// `[model] kind = "lstm" | "gru"`: the recurrent classifier over its tokenizer's vocabulary.
pub(super) fn build_rnn(b: &Building) -> Result<Built> {
    let (ModelConfig::Lstm(r) | ModelConfig::Gru(r)) = &b.card.model else {
        invalid!("not a recurrent model")
    };
    let kind = match b.card.model {
        ModelConfig::Lstm(_) => CellKind::Lstm,
        _ => CellKind::Gru,
    };
    let tok = b.tokenizer(&match b.weights_dir {
        Some(d) => d.join("tokenizer.json"),
        None => r.tokenizer.clone(),
    })?;
    // Pretrained embeddings only for a new model (a checkpoint has its own).
    let net = rnn(r, kind, &tok, b.card.classes.len(), b.params, b.seed, b.fresh())?;
    Ok((Net::new(net), Some(tok)))
}

impl Network for BertClassifier {
    fn step(&self, batch: &Batch, _card: &ModelCard, ctx: &Ctx) -> candle_core::Result<StepOutput> {
        let Batch::Text(b, labels) = batch else {
            return Err(mismatch("text"));
        };
        classified(self.forward(b, ctx)?, labels)
    }

    fn step_hidden(
        &self,
        batch: &Batch,
        ctx: &Ctx,
    ) -> candle_core::Result<Option<(StepOutput, HiddenStates)>> {
        let Batch::Text(b, labels) = batch else {
            return Err(mismatch("text"));
        };
        let (logits, states) = self.forward_hidden(b, ctx)?;
        let mask = b.mask.to_dtype(candle_core::DType::F32)?;
        Ok(Some((classified(logits, labels)?, HiddenStates { states, mask })))
    }

    fn hidden_layout(&self) -> Option<(usize, usize)> {
        Some((
            self.bert.config.num_hidden_layers + 1,
            self.bert.config.hidden_size,
        ))
    }

    /// The encoder's `config.json` (describing a student's kept layers and widths) and the
    /// tokenizer.
    fn assets(&self, card: &ModelCard) -> Result<Vec<(String, Vec<u8>)>> {
        let ModelConfig::Bert {
            pretrained, layers, ..
        } = &card.model
        else {
            invalid!("a bert network under a card of another kind")
        };
        let config = pretrained.join("config.json");
        let mut bytes = read_asset(&config)?;
        let width = BertWidth::of(&card.model);
        if layers.is_some() || width.any() {
            // The checkpoint's config describes the student: its layers and widths.
            let mut json: serde_json::Value = serde_json::from_slice(&bytes)
                .map_err(|e| ZooError::file(config.display().to_string(), e))?;
            if let Some(keep) = layers {
                json["num_hidden_layers"] = keep.len().into();
            }
            width.apply_json(&mut json);
            bytes = serde_json::to_vec_pretty(&json)?;
        }
        Ok(vec![
            ("config.json".into(), bytes),
            (
                "tokenizer.json".into(),
                read_asset(&pretrained.join("tokenizer.json"))?,
            ),
        ])
    }
}

impl Network for RnnClassifier {
    fn step(&self, batch: &Batch, _card: &ModelCard, ctx: &Ctx) -> candle_core::Result<StepOutput> {
        let Batch::Text(b, labels) = batch else {
            return Err(mismatch("text"));
        };
        classified(self.forward(&b.ids, &b.mask, ctx)?, labels)
    }

    /// The tokenizer.
    fn assets(&self, card: &ModelCard) -> Result<Vec<(String, Vec<u8>)>> {
        let (ModelConfig::Lstm(r) | ModelConfig::Gru(r)) = &card.model else {
            invalid!("a recurrent network under a card of another kind")
        };
        Ok(vec![("tokenizer.json".into(), read_asset(&r.tokenizer)?)])
    }
}

/// A file a checkpoint copies, its path named if it cannot be read.
fn read_asset(file: &Path) -> Result<Vec<u8>> {
    std::fs::read(file).map_err(|e| ZooError::file(file.display().to_string(), e))
}

/// `embedding.weight` for a recurrent student: the word embeddings of the BERT folder or
/// checkpoint `from` projected onto their `dim` leading principal directions, scaled to unit
/// standard deviation (the scale of a fresh `N(0, 1)` table).
fn projected_embeddings(from: &Path, vocab: usize, dim: usize) -> Result<Loaded> {
    let l = load_bert_weights(from)?;
    let name = "bert.embeddings.word_embeddings.weight";
    let table = l
        .tensor(name)
        .ok_or_else(|| ZooError::Config(format!("model.embeddings = {}: no {name}", from.display())))?;
    let (rows, width) = table.dims2()?;
    if rows != vocab {
        invalid!(
            "model.embeddings = {}: {rows} token embeddings, the tokenizer has {vocab} tokens \
             (use that model's tokenizer.json)",
            from.display()
        );
    }
    if dim > width {
        invalid!(
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
) -> Result<BertClassifier> {
    let ModelConfig::Bert {
        pooling,
        freeze_encoder,
        layers,
        ..
    } = &card.model
    else {
        invalid!("not a bert model")
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
            invalid!(
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
    Ok(m)
}

/// The encoder's configuration: `dir`'s `config.json`, narrowed to the card's widths and
/// kept layers unless it is a checkpoint's (which already describes them).
fn bert_config(card: &ModelCard, dir: &Path, from_checkpoint: bool) -> Result<BertConfig> {
    let ModelConfig::Bert { layers, .. } = &card.model else {
        invalid!("not a bert model")
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
            invalid!(
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
            invalid!(
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
) -> Result<Loaded> {
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
            invalid!(
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
) -> Result<RnnClassifier> {
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
