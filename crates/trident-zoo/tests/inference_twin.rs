//! A model's evaluation twin (`Model::inference_twin`): the same outputs as the model in
//! evaluation mode, no graph recorded, and the model's later weight changes (optimizer
//! updates in place, batch-norm running statistics) seen without rebuilding.
use trident_nn::bert::Pooling;
use trident_nn::{Ctx, Device, Tensor};
use trident_train::TrainStep;
use trident_zoo::fixtures::{self, bert_card, image_card, perturb, rnn_card, tiny_vit};
use trident_zoo::model::Batch;
use trident_zoo::{Model, ModelCard, ModelConfig};

fn text_batch() -> Batch {
    Batch::Text(fixtures::text_batch().0, vec![0, 1, 2])
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
    perturb(&model, 0.3);
    let twin = model.inference_twin().unwrap();
    let eval = Ctx::eval();
    let (want, tracked) = logits(&model, &batch, &eval);
    let (got, twin_tracked) = logits(&twin, &batch, &eval);
    assert!(tracked, "{what}: the model's own forward pass records a graph");
    assert!(!twin_tracked, "{what}: the twin's forward pass records no graph");
    assert_eq!(got, want, "{what}: the twin computes what the model computes");
    // The model's weights move (as an optimizer step writes them, in place), and a
    // training pass moves its batch-norm statistics: the twin follows without rebuilding.
    perturb(&model, 0.2);
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
    check("bert cls", bert_card(Pooling::Cls, None, false), text_batch());
    check(
        "bert narrowed, mean, one layer",
        bert_card(Pooling::Mean, Some(vec![1]), true),
        text_batch(),
    );
    check("lstm", rnn_card(true, 2), text_batch());
    let cnn = ModelConfig::Cnn {
        width: 4,
        dropout: 0.0,
    };
    check("cnn (batch norm)", image_card(cnn, 1), image_batch(1));
    check("vit", image_card(tiny_vit(), 3), image_batch(3));
}

#[test]
fn a_distillation_is_evaluated_on_its_students_twin() {
    let student = Model::build(&bert_card(Pooling::Cls, Some(vec![0]), false), 3, None).unwrap();
    let teacher = Model::build(&bert_card(Pooling::Cls, None, false), 4, None).unwrap();
    perturb(&student, 0.3);
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

#[test]
fn a_gans_twin_critic_gives_the_generator_its_gradients_and_computes_none_of_its_own() {
    use trident_zoo::card::{GanModel, GanObjective};
    let gan = GanModel {
        loss: GanObjective::Dcgan,
        z: 6,
        width: 4,
        clip: None,
        gp: None,
        critic_steps: None,
        critic_batch_norm: true,
    };
    let model = Model::build(&image_card(ModelConfig::Gan(gan), 1), 7, None).unwrap();
    perturb(&model, 0.3);
    let twin = model.inference_twin().unwrap();
    let (Some(g), Some(frozen)) = (
        model.net.get::<trident_zoo::Gan>(),
        twin.net.get::<trident_zoo::Gan>(),
    ) else {
        panic!("gans")
    };
    let z = trident_nn::gan::latent(5, 6, 11).unwrap();
    let ctx = Ctx::train(0, 1);
    // The generator's update scored by the critic itself, then by its twin (the training
    // pass's batch statistics, as the generator's step uses them).
    let score = |critic: &trident_nn::gan::Discriminator| {
        let fake = g.generator.forward(&z, &ctx).unwrap();
        let s = critic.forward(&fake, &ctx).unwrap();
        let grads = s.sum_all().unwrap().backward().unwrap();
        (s.to_vec1::<f32>().unwrap(), grads)
    };
    let (want, all) = score(&g.discriminator);
    let (got, generator_only) = score(&frozen.discriminator);
    assert_eq!(got, want, "the twin critic scores as the critic does");
    let mut compared = 0;
    for p in model.params.trainable() {
        let (a, b) = (all.get(p.var.as_tensor()), generator_only.get(p.var.as_tensor()));
        if p.name.starts_with("generator.") {
            let flat = |t: Option<&Tensor>| t.unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(flat(b), flat(a), "{}: the same gradient", p.name);
            compared += 1;
        } else {
            assert!(
                a.is_some(),
                "{}: the critic's own pass computes its gradient",
                p.name
            );
            assert!(b.is_none(), "{}: its twin computes none", p.name);
        }
    }
    assert!(compared > 5, "every generator weight compared ({compared})");
}
