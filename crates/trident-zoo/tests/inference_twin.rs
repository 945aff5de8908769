//! A model's evaluation twin (`Model::inference_twin`): the same outputs as the model in
//! evaluation mode, no graph recorded, and the model's later weight changes (optimizer
//! updates in place, batch-norm running statistics) seen without rebuilding.
use std::path::PathBuf;
use trident_nn::bert::{Pooling, TextBatch};
use trident_nn::vision::VitConfig;
use trident_nn::{Ctx, Device, Tensor};
use trident_train::TrainStep;
use trident_zoo::model::Batch;
use trident_zoo::{InputSpec, Model, ModelCard, ModelConfig, RnnModel};

fn tiny_bert() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../trident-nn/tests/fixtures/tiny_bert")
}

fn classes(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("c{i}")).collect()
}

fn text_card(model: ModelConfig) -> ModelCard {
    ModelCard {
        model,
        classes: classes(3),
        input: InputSpec::Text {
            max_len: 32,
            truncate: true,
        },
    }
}

fn image_card(model: ModelConfig, channels: usize) -> ModelCard {
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

/// Adds a deterministic pattern scaled by `by` to every parameter, in place (running
/// variances kept positive).
fn shift(model: &Model, by: f32) {
    for (k, p) in model.params.all().iter().enumerate() {
        let n = p.var.elem_count();
        let v: Vec<f32> = (0..n)
            .map(|i| by * ((i * 7 + k * 13) as f32 * 0.61).sin())
            .map(|d| {
                if p.name.ends_with("running_var") {
                    d.abs()
                } else {
                    d
                }
            })
            .collect();
        let t = Tensor::from_vec(v, p.var.dims().to_vec(), &Device::Cpu).unwrap();
        let cur = p.var.as_tensor().clone();
        p.var.set(&(cur + t).unwrap()).unwrap();
    }
}

fn text_batch() -> Batch {
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
    let types = vec![0u32; b * s];
    Batch::Text(TextBatch::new(ids, types, mask, b, s).unwrap(), vec![0, 1, 2])
}

fn image_batch(channels: usize) -> Batch {
    let n = 3 * channels * 64;
    let x: Vec<f32> = (0..n).map(|i| ((i * 37) % 101) as f32 / 101.0).collect();
    Batch::Image(
        Tensor::from_vec(x, (3, channels, 8, 8), &Device::Cpu).unwrap(),
        vec![0, 1, 3],
    )
}

fn logits(step: &impl TrainStep<Batch = Batch>, batch: &Batch, ctx: &Ctx) -> (Vec<f32>, bool) {
    let out = step.forward(batch, ctx).unwrap();
    let tracked = out.loss.track_op();
    let trident_train::Prediction::Logits(l) = out.prediction else {
        panic!("a classifier")
    };
    (l.flatten_all().unwrap().to_vec1::<f32>().unwrap(), tracked)
}

fn check(what: &str, card: ModelCard, batch: Batch) {
    let model = Model::build(&card, 7, None).unwrap();
    shift(&model, 0.3);
    let twin = model.inference_twin().unwrap();
    let eval = Ctx::eval();
    let (want, tracked) = logits(&model, &batch, &eval);
    let (got, twin_tracked) = logits(&twin, &batch, &eval);
    assert!(tracked, "{what}: the model's own forward pass records a graph");
    assert!(!twin_tracked, "{what}: the twin's forward pass records no graph");
    assert_eq!(got, want, "{what}: the twin computes what the model computes");
    // The model's weights move (as an optimizer step writes them, in place), and a
    // training pass moves its batch-norm statistics: the twin follows without rebuilding.
    shift(&model, 0.2);
    let _ = model.forward(&batch, &Ctx::train(3, 1)).unwrap();
    let (moved, _) = logits(&model, &batch, &eval);
    assert_ne!(moved, want, "{what}: the shift changed the model's outputs");
    let (got, _) = logits(&twin, &batch, &eval);
    assert_eq!(got, moved, "{what}: the twin sees the model's new weights");
    // The twin owns nothing of its own: the store is the model's.
    assert_eq!(twin.params.len(), model.params.len(), "{what}");
}

#[test]
fn the_twin_matches_the_model_records_no_graph_and_follows_its_updates() {
    let bert = |pooling, layers, narrow: bool| ModelConfig::Bert {
        pretrained: tiny_bert(),
        pooling,
        freeze_encoder: false,
        layers,
        hidden: narrow.then_some(8),
        heads: narrow.then_some(2),
        intermediate: narrow.then_some(12),
    };
    check(
        "bert cls",
        text_card(bert(Pooling::Cls, None, false)),
        text_batch(),
    );
    check(
        "bert narrowed, mean, one layer",
        text_card(bert(Pooling::Mean, Some(vec![1]), true)),
        text_batch(),
    );
    let lstm = RnnModel {
        tokenizer: tiny_bert().join("tokenizer.json"),
        embeddings: None,
        embed: 8,
        hidden: 6,
        layers: 2,
        dropout: 0.0,
    };
    check("lstm", text_card(ModelConfig::Lstm(lstm)), text_batch());
    let cnn = ModelConfig::Cnn {
        width: 4,
        dropout: 0.0,
    };
    check("cnn (batch norm)", image_card(cnn, 1), image_batch(1));
    let vit = VitConfig {
        image_size: 8,
        channels: 3,
        patch_size: 4,
        hidden: 8,
        layers: 2,
        heads: 2,
        mlp: 16,
        dropout: 0.0,
    };
    check("vit", image_card(ModelConfig::Vit(vit), 3), image_batch(3));
}

#[test]
fn a_distillation_is_evaluated_on_its_students_twin() {
    let card = |layers: Option<Vec<usize>>| {
        text_card(ModelConfig::Bert {
            pretrained: tiny_bert(),
            pooling: Pooling::Cls,
            freeze_encoder: false,
            layers,
            hidden: None,
            heads: None,
            intermediate: None,
        })
    };
    let student = Model::build(&card(Some(vec![0])), 3, None).unwrap();
    let teacher = Model::build(&card(None), 4, None).unwrap();
    shift(&student, 0.3);
    let batch = text_batch();
    let (want, _) = logits(&student, &batch, &Ctx::eval());
    let kd = trident_train::distill::Distill::new(
        student,
        teacher,
        trident_train::distill::KdLoss::Soft {
            temperature: 2.0,
            alpha: 0.5,
        },
        None,
    );
    let evaluator = kd.evaluator().unwrap().expect("the student's twin");
    let out = evaluator.forward(&batch, &Ctx::eval()).unwrap();
    assert!(!out.loss.track_op(), "no graph");
    let got = out
        .logits()
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert_eq!(got, want, "the student's own evaluation");
}
