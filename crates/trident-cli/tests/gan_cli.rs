//! `[model] kind = "gan"` end to end on tiny images: a DCGAN judged by a small CNN (sample
//! grids per epoch, the per-epoch Fréchet distance that picks `best`, the report beside
//! the real images' floor, `trident eval` reproducing it), a WGAN (RMSprop, weight
//! clipping, five critic updates per generator update) resuming bit for bit from a
//! checkpoint holding both optimizers, a WGAN-GP (its penalty in the critic's loss, its
//! random interpolations resumed exactly), and the errors for configurations that cannot
//! work.

mod common;
use common::{
    assert_same_checkpoints, epoch_records, failed, ok, ok_log, same, tensors, trident, TOP_BOTTOM_DATA,
};

use std::path::{Path, PathBuf};

fn config(dir: &Path, run: &str, model: &str, train: &str, extra: &str) -> PathBuf {
    let cfg = format!(
        r#"
[run]
dir = "{run}"
seed = 3
{TOP_BOTTOM_DATA}
[loader]
batch_size = 8
num_workers = 0
[model]
{model}
[train]
epochs = 3
log_every = 2
{train}
{extra}
"#
    );
    let path = dir.join(format!("{run}.toml"));
    std::fs::write(&path, cfg).unwrap();
    path
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

const DCGAN: &str = "kind = \"gan\"\nz = 8\nwidth = 4";
const ADAM: &str = "lr = 2e-3\n[train.optimizer]\nname = \"adamw\"\nbeta1 = 0.5\nweight_decay = 0.0";
const JUDGE: &str = "[gan]\njudge = \"judge/best\"\nsamples = 32\nepoch_samples = 12";

/// A small CNN that tells the two image kinds apart: the judge.
fn train_judge(d: &Path) {
    let cfg = config(d, "judge", "kind = \"cnn\"\nwidth = 4", "lr = 1e-2", "");
    ok(&trident(&["train", "--config", cfg.to_str().unwrap()], d));
}

#[test]
fn a_dcgan_is_judged_every_epoch_and_reported_against_the_real_floor() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    common::write_top_bottom_images(d);
    train_judge(d);
    let cfg = config(d, "gan", DCGAN, ADAM, JUDGE);
    let out = trident(&["train", "--config", cfg.to_str().unwrap()], d);
    let printed = ok(&out);
    for e in 1..=3 {
        assert!(d.join(format!("gan/samples/epoch-{e:03}.png")).is_file());
    }
    for f in [
        "samples.png",
        "report.json",
        "classes.png",
        "best/model.safetensors",
    ] {
        assert!(d.join("gan").join(f).is_file(), "{f}");
    }
    // Every epoch's record carries the two losses, the scores and the Fréchet distance.
    let records = epoch_records(&d.join("gan"));
    assert_eq!(records.len(), 3);
    for r in &records {
        for k in ["generator_loss", "d_real", "d_fake", "val_fd"] {
            assert!(r["figures"][k].as_f64().is_some_and(f64::is_finite), "{k}: {r}");
        }
        assert!(r["train_accuracy"].is_null());
    }
    // `best` is the epoch of the lowest validation Fréchet distance.
    let fds: Vec<f64> = records
        .iter()
        .map(|r| r["figures"]["val_fd"].as_f64().unwrap())
        .collect();
    let best = fds
        .iter()
        .enumerate()
        .min_by(|a, b| a.1.total_cmp(b.1))
        .unwrap()
        .0;
    let state = json(&d.join("gan/best/state.json"));
    assert_eq!(state["best_epoch"].as_u64(), Some(best as u64), "{fds:?}");
    let r = json(&d.join("gan/report.json"));
    let (g, floor) = (&r["generated"], &r["floor"]);
    assert_eq!(g["images"], 32);
    assert_eq!(floor["images"], 32);
    for q in [g, floor] {
        let shares: f64 = q["class_shares"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .sum();
        assert!((shares - 1.0).abs() < 1e-9);
        let one_nn = q["one_nn_accuracy"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&one_nn));
    }
    // Real training images are as good as samples get: their Fréchet distance to the
    // test images lies below the generated ones', and the judge sees both kinds in them.
    assert!(
        floor["frechet"].as_f64().unwrap() < g["frechet"].as_f64().unwrap(),
        "{r}"
    );
    assert!(floor["class_entropy_bits"].as_f64().unwrap() > 0.9, "{r}");
    assert!(
        printed.contains("generated") && printed.contains("real"),
        "{printed}"
    );
    // `eval` reproduces the report from the checkpoint.
    ok(&trident(&["eval", "--model", "gan/best"], d));
    let again = json(&d.join("gan/best/eval-test/report.json"));
    assert_eq!(again["generated"], r["generated"]);
    assert_eq!(again["floor"], r["floor"]);
}

#[test]
fn a_wgan_resumes_exactly_with_both_optimizers() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    common::write_top_bottom_images(d);
    let model = "kind = \"gan\"\nloss = \"wgan\"\nz = 8\nwidth = 4\nclip = 0.05";
    let train = "lr = 5e-4\n[train.optimizer]\nname = \"rmsprop\"";
    let whole = config(d, "whole", model, train, "");
    ok(&trident(&["train", "--config", whole.to_str().unwrap()], d));
    // 77 training images in batches of 8: 10 per epoch, 30 critic updates in 3 epochs, a
    // generator update after every 5th.
    let state = json(&d.join("whole/last/state.json"));
    assert_eq!(state["optimizer_step"], 30);
    // The critic's weights stay clipped.
    let weights = tensors(&d.join("whole/last/model.safetensors"));
    let w = weights["discriminator.conv2.weight"]
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert!(w.iter().all(|v| v.abs() <= 0.05 + 1e-7));
    assert!(w.iter().any(|v| v.abs() > 0.049), "clipped at the bound");
    // The generator's optimizer state is there beside the critic's.
    let opt = tensors(&d.join("whole/last/optimizer.safetensors"));
    assert!(opt.contains_key("v.generator.up1.weight") && opt.contains_key("v.discriminator.conv1.weight"));
    // Stopped after 7 critic updates (mid-epoch, between generator updates), then after
    // 17 (in the second epoch), resumed each time: the same weights and states.
    let parts = config(d, "parts", model, train, "");
    let p = parts.to_str().unwrap();
    ok(&trident(&["train", "--config", p, "--stop-after-steps", "7"], d));
    ok(&trident(
        &["train", "--config", p, "--resume", "--stop-after-steps", "10"],
        d,
    ));
    ok(&trident(&["train", "--config", p, "--resume"], d));
    assert_same_checkpoints(&d.join("whole"), &d.join("parts"));
}

#[test]
fn a_wgan_gp_penalises_the_critic_and_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    common::write_top_bottom_images(d);
    let model = |loss: &str| {
        format!("kind = \"gan\"\nloss = \"{loss}\"\nz = 8\nwidth = 4\ncritic_batch_norm = false")
    };
    let train =
        "lr = 1e-3\n[train.optimizer]\nname = \"adamw\"\nbeta1 = 0.0\nbeta2 = 0.9\nweight_decay = 0.0";
    let whole = config(d, "whole", &model("wgan-gp"), train, "");
    ok(&trident(&["train", "--config", whole.to_str().unwrap()], d));
    // The critic's loss is mean D(G(z)) − mean D(x) plus the penalty, which is positive;
    // the same run without it (WGAN, nothing clipped at this bound) has no such excess.
    let excess = |run: &str| -> Vec<f64> {
        epoch_records(&d.join(run))
            .iter()
            .map(|r| {
                let f = &r["figures"];
                r["train_loss"].as_f64().unwrap()
                    - (f["d_fake"].as_f64().unwrap() - f["d_real"].as_f64().unwrap())
            })
            .collect()
    };
    let penalty = excess("whole");
    assert_eq!(penalty.len(), 3);
    assert!(penalty.iter().all(|p| *p > 1e-3), "{penalty:?}");
    let plain = config(d, "plain", &format!("{}\nclip = 100.0", model("wgan")), train, "");
    ok(&trident(&["train", "--config", plain.to_str().unwrap()], d));
    assert!(
        excess("plain").iter().all(|p| p.abs() < 1e-5),
        "{:?}",
        excess("plain")
    );
    // Stopped mid-epoch and between generator updates, resumed: the same weights.
    let parts = config(d, "parts", &model("wgan-gp"), train, "");
    let p = parts.to_str().unwrap();
    ok(&trident(&["train", "--config", p, "--stop-after-steps", "13"], d));
    ok(&trident(&["train", "--config", p, "--resume"], d));
    assert_same_checkpoints(&d.join("whole"), &d.join("parts"));
    // Profiled: steps 4..5 (the fifth has the generator's update), the penalty's kernels
    // under the critic's layers, both networks' backward passes.
    let prof = config(d, "prof", &model("wgan-gp"), train, "");
    ok(&trident(
        &[
            "train",
            "--config",
            prof.to_str().unwrap(),
            "--profile-steps",
            "4..5",
        ],
        d,
    ));
    let steps = std::fs::read_to_string(d.join("prof/profile/steps.csv")).unwrap();
    let rows: Vec<&str> = steps.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{steps}");
    let layers = std::fs::read_to_string(d.join("prof/profile/layers.csv")).unwrap();
    for want in [
        "discriminator.input_gradient,conv-transpose2d,fwd",
        "discriminator.input_gradient,conv-transpose2d,bwd",
        "discriminator.conv2,conv2d,bwd",
        "generator.up2,conv-transpose2d,bwd",
    ] {
        assert!(layers.contains(want), "{want} missing: {layers}");
    }
    // The same weights as the run without the profiler.
    assert_same_checkpoints(&d.join("whole"), &d.join("prof"));
}

/// `precision = "bf16"` on a WGAN-GP wide enough (width 32, batches of 32) for its
/// convolutions' and its critic's linear layer's products to run in bf16 where the CPU has
/// bf16 arithmetic, the penalty's double backward included: the run says so, its weights
/// differ from the f32 run's there (and are the same bits elsewhere, where every product
/// stays f32), and it resumes bit for bit from a checkpoint.
#[test]
fn a_wgan_gp_trains_in_bf16_mixed_precision_and_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    common::write_top_bottom_images(d);
    let model = "kind = \"gan\"\nloss = \"wgan-gp\"\nz = 8\nwidth = 32\ncritic_batch_norm = false";
    let run = |name: &str, precision: &str| {
        let train = format!(
            "precision = \"{precision}\"\nlr = 1e-3\n[train.optimizer]\nname = \"adamw\"\nbeta1 = 0.0\nbeta2 = 0.9\nweight_decay = 0.0"
        );
        let cfg = config(d, name, model, &train, "");
        let text = std::fs::read_to_string(&cfg)
            .unwrap()
            .replace("batch_size = 8", "batch_size = 32");
        std::fs::write(&cfg, text).unwrap();
        cfg
    };
    let whole = run("whole", "bf16");
    let log = ok_log(&trident(&["train", "--config", whole.to_str().unwrap()], d));
    // Said once, at the start (not per batch).
    assert_eq!(log.matches("bf16 mixed precision:").count(), 1, "{log}");
    let f32_run = run("f32", "f32");
    ok(&trident(&["train", "--config", f32_run.to_str().unwrap()], d));
    let weights = |run: &str| tensors(&d.join(run).join("last/model.safetensors"));
    let (mixed, full) = (weights("whole"), weights("f32"));
    let bf16_here = trident_nn::bf16::accelerated();
    for name in [
        "discriminator.conv2.weight",
        "discriminator.fc.weight",
        "generator.up1.weight",
    ] {
        assert_eq!(
            same(&mixed[name], &full[name]),
            !bf16_here,
            "{name}: bf16 arithmetic here: {bf16_here}"
        );
    }
    // Stopped after the fourth critic update (mid-epoch), resumed: the same weights.
    let parts = run("parts", "bf16");
    let p = parts.to_str().unwrap();
    ok(&trident(&["train", "--config", p, "--stop-after-steps", "4"], d));
    ok(&trident(&["train", "--config", p, "--resume"], d));
    assert_same_checkpoints(&d.join("whole"), &d.join("parts"));
}

#[test]
fn gan_configurations_that_cannot_work_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    common::write_top_bottom_images(d);
    let run = |name: &str, model: &str, train: &str, extra: &str| {
        let cfg = config(d, name, model, train, extra);
        failed(&trident(&["train", "--config", cfg.to_str().unwrap()], d))
    };
    let e = run("a", &format!("{DCGAN}\nclip = 0.01"), ADAM, "");
    assert!(e.contains("model.clip") && e.contains("wgan"), "{e}");
    let e = run("b", DCGAN, &format!("monitor = \"val_loss\"\n{ADAM}"), "");
    assert!(e.contains("train.monitor") && e.contains("val_fd"), "{e}");
    let e = run("c", DCGAN, &format!("early_stopping_patience = 2\n{ADAM}"), "");
    assert!(
        e.contains("early_stopping_patience") && e.contains("[gan] judge"),
        "{e}"
    );
    let e = run("d", DCGAN, ADAM, "[gan]\njudge = \"nowhere/best\"");
    assert!(e.contains("gan.judge = nowhere/best"), "{e}");
    let e = run("e", "kind = \"cnn\"", ADAM, "[gan]\njudge = \"nowhere/best\"");
    assert!(e.contains("[gan]") && e.contains("model.kind = \"gan\""), "{e}");
    let e = run("f", DCGAN, &format!("grad_accum = 2\n{ADAM}"), "");
    assert!(e.contains("grad_accum"), "{e}");
    let gp = "kind = \"gan\"\nloss = \"wgan-gp\"\nz = 8\nwidth = 4";
    let e = run("g", gp, ADAM, "");
    assert!(e.contains("critic_batch_norm = false"), "{e}");
    let e = run(
        "h",
        &format!("{gp}\ncritic_batch_norm = false\nclip = 0.01"),
        ADAM,
        "",
    );
    assert!(e.contains("model.clip") && e.contains("\"wgan\""), "{e}");
    let e = run("i", &format!("{DCGAN}\ngp = 10.0"), ADAM, "");
    assert!(e.contains("model.gp") && e.contains("wgan-gp"), "{e}");
    let e = run(
        "j",
        &format!("{gp}\ncritic_batch_norm = false\ngp = -1.0"),
        ADAM,
        "",
    );
    assert!(e.contains("model.gp = -1"), "{e}");
}

/// The shipped DCGAN example on a slice of Fashion-MNIST, judged by the shipped CNN
/// example trained for one epoch on another slice: the scoring on real images. Real
/// training images against real test images sit at the floor (1-NN accuracy near 0.5,
/// every class present); a generator after nine batches does not.
#[test]
fn the_fashion_dcgan_example_is_scored_against_real_images() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let required = "TRIDENT_FASHION_REQUIRED";
    let file = "fashion-mnist/train-images-idx3-ubyte.gz";
    let Some(judge) = common::real_example("examples/fashion/cnn.toml", file, "fashion", required, d) else {
        return;
    };
    let slice = |cfg: &Path, n: usize, extra: &str| {
        let text = std::fs::read_to_string(cfg)
            .unwrap()
            .replace(
                "val_fraction = 0.1",
                &format!("val_fraction = 0.1\nmax_train = {n}"),
            )
            .replace(
                "judge = \"runs/fashion-cnn/best\"",
                "judge = \"fashion-cnn/best\"",
            )
            + extra;
        std::fs::write(cfg, text).unwrap();
    };
    slice(&judge, 3000, "");
    ok(&trident(
        &["train", "--config", judge.to_str().unwrap(), "--epochs", "1"],
        d,
    ));
    let gan = common::real_example("examples/gan/fashion-dcgan.toml", file, "fashion", required, d).unwrap();
    slice(&gan, 1280, "");
    let text = std::fs::read_to_string(&gan)
        .unwrap()
        .replace("samples = 10000", "samples = 1000")
        .replace("epoch_samples = 2000", "epoch_samples = 128");
    std::fs::write(&gan, text).unwrap();
    ok(&trident(
        &["train", "--config", gan.to_str().unwrap(), "--epochs", "1"],
        d,
    ));
    let r = json(&d.join("gan-fashion-dcgan/report.json"));
    let (g, floor) = (&r["generated"], &r["floor"]);
    let f = |q: &serde_json::Value, k: &str| q[k].as_f64().unwrap();
    assert_eq!(g["images"], 1000);
    assert!(f(floor, "one_nn_accuracy") < 0.6, "{r}");
    assert!(f(floor, "class_entropy_bits") > 3.0, "{r}");
    assert!(f(floor, "frechet") < f(g, "frechet"), "{r}");
    assert!(f(floor, "kernel_mmd2") < f(g, "kernel_mmd2"), "{r}");
    assert!(f(g, "one_nn_accuracy") > f(floor, "one_nn_accuracy"), "{r}");
}
