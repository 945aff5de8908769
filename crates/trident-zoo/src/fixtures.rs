//! Small model cards and inputs for tests (this crate's and the exporter's): the tiny BERT
//! fixture folder, cards for text and 8 × 8 images, a padded text batch, and a
//! deterministic shift of every parameter. Not for use outside tests.

use crate::{InputSpec, Model, ModelCard, ModelConfig, RnnModel};
use std::path::PathBuf;
use trident_nn::bert::{Pooling, TextBatch};
use trident_nn::vision::VitConfig;
use trident_nn::{Device, Tensor};

/// `crates/trident-nn/tests/fixtures/tiny_bert`: a 2-layer BERT with its tokenizer.
pub fn tiny_bert() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../trident-nn/tests/fixtures/tiny_bert")
}

/// `n` class names `c0, c1, …`.
pub fn classes(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("c{i}")).collect()
}

/// A 3-class text model, texts up to 32 tokens (cut beyond).
pub fn text_card(model: ModelConfig) -> ModelCard {
    ModelCard {
        model,
        classes: classes(3),
        input: InputSpec::Text {
            max_len: 32,
            truncate: true,
        },
    }
}

/// A 4-class model of 8 × 8 images with `channels` channels.
pub fn image_card(model: ModelConfig, channels: usize) -> ModelCard {
    ModelCard {
        model,
        classes: classes(4),
        input: InputSpec::Image {
            channels,
            height: 8,
            width: 8,
            mean: 0.5,
            std: 0.25,
        },
    }
}

/// A 3-class classifier on the tiny BERT with `pooling`, its kept `layers`, and when
/// `narrow` a student 8 wide (2 heads, feed-forward 12).
pub fn bert_card(pooling: Pooling, layers: Option<Vec<usize>>, narrow: bool) -> ModelCard {
    text_card(ModelConfig::Bert {
        pretrained: tiny_bert(),
        pooling,
        freeze_encoder: false,
        layers,
        hidden: narrow.then_some(8),
        heads: narrow.then_some(2),
        intermediate: narrow.then_some(12),
    })
}

/// A text model: an LSTM (or GRU) of `layers` layers, 8-wide embeddings, 6-wide states,
/// on the tiny BERT's tokenizer.
pub fn rnn_card(lstm: bool, layers: usize) -> ModelCard {
    let r = RnnModel {
        tokenizer: tiny_bert().join("tokenizer.json"),
        embeddings: None,
        embed: 8,
        hidden: 6,
        layers,
        dropout: 0.0,
    };
    text_card(if lstm {
        ModelConfig::Lstm(r)
    } else {
        ModelConfig::Gru(r)
    })
}

/// A ViT on 8 × 8 RGB images ([`image_card`] with 3 channels): 4 × 4 patches, 2 layers of
/// width 8, 2 heads.
pub fn tiny_vit() -> ModelConfig {
    ModelConfig::Vit(VitConfig {
        image_size: 8,
        channels: 3,
        patch_size: 4,
        hidden: 8,
        layers: 2,
        heads: 2,
        mlp: 16,
        dropout: 0.0,
    })
}

/// Three sequences of lengths 5, 2 and 7 (padded to 7), ids within the tiny vocabulary,
/// segment 1 from position 4; with the ids and segments as i64 (ONNX inputs).
pub fn text_batch() -> (TextBatch, Vec<i64>, Vec<i64>) {
    let lens = [5usize, 2, 7];
    let (b, s) = (lens.len(), 7);
    let mut ids = vec![0u32; b * s];
    let mut mask = vec![0u32; b * s];
    for (r, &l) in lens.iter().enumerate() {
        for t in 0..l {
            ids[r * s + t] = ((r * 11 + t * 5) % 47 + 2) as u32;
            mask[r * s + t] = 1;
        }
    }
    let types: Vec<u32> = (0..b * s).map(|i| u32::from(i % s >= 4)).collect();
    let batch = TextBatch::new(ids.clone(), types.clone(), mask, b, s).unwrap();
    (
        batch,
        ids.iter().map(|&v| v as i64).collect(),
        types.iter().map(|&v| v as i64).collect(),
    )
}

/// Moves every parameter by `by` times a fixed pattern, in place (layer norms away from
/// 1/0; running variances up by `0.5 + |pattern|`, so they stay positive), so a test sees
/// each weight used in the right place.
pub fn perturb(model: &Model, by: f32) {
    for (k, p) in model.params.all().iter().enumerate() {
        let n = p.var.elem_count();
        let v: Vec<f32> = (0..n)
            .map(|i| {
                let s = ((i * 7 + k * 13) as f32 * 0.61).sin();
                if p.name.ends_with("running_var") {
                    0.5 + s.abs()
                } else {
                    by * s
                }
            })
            .collect();
        let t = Tensor::from_vec(v, p.var.dims().to_vec(), &Device::Cpu).unwrap();
        let cur = p.var.as_tensor().clone();
        p.var.set(&(cur + t).unwrap()).unwrap();
    }
}
