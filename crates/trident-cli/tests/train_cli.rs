//! `trident train / eval / predict` end to end on tiny data made here: the tiny random BERT
//! fixture of trident-nn on a two-word-class text set, and a small CNN on generated IDX
//! images. Checks the run directory, exact resume, and the errors for bad input.

mod common;
use common::{assert_same_checkpoints, epoch_records, failed, ok, text_config, trident, write_texts};

use std::io::Write;

#[test]
fn train_eval_predict_and_the_run_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let cfg = text_config(d, &write_texts(d), "run", "");
    ok(&trident(&["train", "--config", cfg.to_str().unwrap()], d));
    let run = d.join("run");
    for f in [
        "config.toml",
        "metrics.jsonl",
        "loss.png",
        "accuracy.png",
        "test/metrics.json",
        "test/confusion.png",
    ] {
        assert!(run.join(f).is_file(), "{f} missing");
    }
    for ck in ["best", "last"] {
        for f in [
            "model.safetensors",
            "optimizer.safetensors",
            "state.json",
            "trident.json",
            "tokenizer.json",
            "config.json",
            "run.toml",
        ] {
            assert!(run.join(ck).join(f).is_file(), "{ck}/{f} missing");
        }
    }
    let events: Vec<_> = std::fs::read_dir(run.join("tensorboard")).unwrap().collect();
    assert_eq!(events.len(), 1);
    // The real TensorBoard reads the step scalars back, the gradient norm before clipping
    // among them (the run clips: max_grad_norm = 1.0), one per optimizer step.
    let script = r#"
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1]); acc.Reload()
for tag in ("train/loss", "train/grad_norm"):
    v = [e.value for e in acc.Scalars(tag)]
    print(tag, len(v), min(v))
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script, run.join("tensorboard").to_str().unwrap()])
        .output()
        .expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let counts: Vec<(usize, f64)> = text
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[1].parse().unwrap(), f[2].parse().unwrap())
        })
        .collect();
    assert!(counts[0].0 > 0 && counts[1].0 == counts[0].0, "{text}");
    assert!(counts[1].1 > 0.0 && counts[1].1.is_finite(), "{text}");
    let lines = epoch_records(&run);
    assert_eq!(lines.len(), 3);
    let loss = |i: usize| lines[i]["train_loss"].as_f64().unwrap();
    assert!(
        loss(2) < loss(0),
        "training lowers the loss: {} → {}",
        loss(0),
        loss(2)
    );

    let out = ok(&trident(
        &["eval", "--model", run.join("best").to_str().unwrap()],
        d,
    ));
    assert!(
        out.contains("accuracy") && out.contains("negative") && out.contains("positive"),
        "{out}"
    );
    assert!(run.join("best/eval-test/confusion.png").is_file());

    let out = ok(&trident(
        &[
            "predict",
            "--model",
            run.join("best").to_str().unwrap(),
            "the movie was great",
            "awful",
        ],
        d,
    ));
    let preds: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(preds.len(), 2);
    for p in &preds {
        let scores = p["scores"].as_object().unwrap();
        let sum: f64 = scores.values().map(|v| v.as_f64().unwrap()).sum();
        assert!((sum - 1.0).abs() < 1e-3, "{p}");
        assert!(scores.contains_key(p["label"].as_str().unwrap()));
    }

    // A second train into the same directory is refused (nothing is overwritten).
    let err = failed(&trident(&["train", "--config", cfg.to_str().unwrap()], d));
    assert!(
        err.contains("already holds a run") && err.contains("--resume"),
        "{err}"
    );
}

#[test]
fn an_interrupted_and_resumed_run_equals_an_uninterrupted_one() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let data = write_texts(d);
    let whole = text_config(d, &data, "whole", "");
    ok(&trident(&["train", "--config", whole.to_str().unwrap()], d));
    // 64 training texts / batch 8 = 8 micro-batches = 4 optimizer steps per epoch: stop
    // mid-epoch (step 3), then at an epoch boundary (step 4 = end of epoch 2), then finish.
    let parts = text_config(d, &data, "parts", "");
    let p = parts.to_str().unwrap();
    ok(&trident(&["train", "--config", p, "--stop-after-steps", "3"], d));
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("parts/last/state.json")).unwrap()).unwrap();
    assert_eq!(
        (state["epoch"].as_u64(), state["batch_in_epoch"].as_u64()),
        (Some(0), Some(6))
    );
    ok(&trident(
        &["train", "--config", p, "--resume", "--stop-after-steps", "5"],
        d,
    ));
    ok(&trident(&["train", "--config", p, "--resume"], d));
    assert_same_checkpoints(&d.join("whole"), &d.join("parts"));
    let losses = |run: &str| -> Vec<f64> {
        epoch_records(&d.join(run))
            .iter()
            .map(|r| r["train_loss"].as_f64().unwrap())
            .collect()
    };
    assert_eq!(losses("whole"), losses("parts"));
    // Resuming with another configuration is refused.
    let changed = std::fs::read_to_string(&parts)
        .unwrap()
        .replace("lr = 3e-3", "lr = 1e-3");
    std::fs::write(&parts, changed).unwrap();
    let err = failed(&trident(&["train", "--config", p, "--resume"], d));
    assert!(err.contains("another configuration"), "{err}");
}

#[test]
fn bad_input_is_refused_before_training_with_file_line_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let data = write_texts(d);
    let run_cfg = |name: &str, extra: &str| text_config(d, &data, name, extra);

    let cfg = run_cfg("typo", "");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("epochs = 3", "epochs = 3\nlearning_rate = 1");
    std::fs::write(&cfg, &text).unwrap();
    let err = failed(&trident(&["train", "--config", cfg.to_str().unwrap()], d));
    let at = format!("line {}", line_of(&text, "learning_rate"));
    assert!(
        err.contains("typo.toml") && err.contains(&at) && err.contains("unknown field `learning_rate`"),
        "{err}"
    );

    let cfg = run_cfg("types", "");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("batch_size = 8", "batch_size = \"eight\"");
    std::fs::write(&cfg, &text).unwrap();
    let err = failed(&trident(&["train", "--config", cfg.to_str().unwrap()], d));
    let at = format!("line {}", line_of(&text, "batch_size"));
    assert!(err.contains(&at) && err.contains("invalid type"), "{err}");

    let cfg = text_config(d, &d.join("nope.tsv"), "missing", "");
    let err = failed(&trident(&["train", "--config", cfg.to_str().unwrap()], d));
    assert!(err.contains("nope.tsv") && err.contains("No such file"), "{err}");

    let mut f = std::fs::OpenOptions::new().append(true).open(&data).unwrap();
    writeln!(f, "the movie was fine\tmeh").unwrap();
    let cfg = run_cfg("label", "classes = [\"negative\", \"positive\"]");
    let err = failed(&trident(&["train", "--config", cfg.to_str().unwrap()], d));
    assert!(err.contains("reviews.tsv:81") && err.contains("'meh'"), "{err}");

    std::fs::write(
        &data,
        "good\tpositive\nthe movie was very very very very very good and fine\tpositive\nbad\tnegative\n",
    )
    .unwrap();
    let cfg = run_cfg("long", "max_len = 6").to_str().unwrap().to_string();
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("max_len = 16\n", "");
    std::fs::write(&cfg, text).unwrap();
    let err = failed(&trident(&["train", "--config", &cfg], d));
    assert!(
        err.contains("reviews.tsv:2") && err.contains("longer than data.max_len = 6"),
        "{err}"
    );

    for run in ["typo", "types", "missing", "label", "long"] {
        assert!(
            !d.join(run).exists(),
            "{run}: nothing is written when the input is refused"
        );
    }
}

fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .expect("needle in text")
        + 1
}

#[test]
fn a_cnn_trains_on_idx_images() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    // Class 0: bright top half; class 1: bright bottom half; with noise.
    common::write_top_bottom_images(d);
    let cfg = d.join("cnn.toml");
    std::fs::write(
        &cfg,
        r#"
[run]
dir = "cnn"
[data]
kind = "idx"
train_images = "train-images"
train_labels = "train-labels"
test_images = "test-images"
test_labels = "test-labels"
classes = ["top", "bottom"]
mean = 0.4
std = 0.4
augment = true
[loader]
batch_size = 16
[model]
kind = "cnn"
width = 4
[train]
epochs = 2
lr = 1e-2
"#,
    )
    .unwrap();
    ok(&trident(&["train", "--config", cfg.to_str().unwrap()], d));
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("cnn/test/metrics.json")).unwrap()).unwrap();
    let acc = m["report"]["accuracy"].as_f64().unwrap();
    assert!(acc >= 0.9, "a trivially separable set is learnt: accuracy {acc}");
    let out = ok(&trident(
        &["eval", "--model", d.join("cnn/best").to_str().unwrap()],
        d,
    ));
    assert!(out.contains("top") && out.contains("bottom"), "{out}");
}

#[test]
fn a_vit_trains_on_an_rgb_image_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    // "red" images are reddish, "blue" ones bluish, with noise; 6x6 PNGs resized to 8x8.
    let mut s = 7u64;
    for (split, n) in [("train", 40), ("test", 12)] {
        for (class, base) in [("blue", [20u8, 40, 200]), ("red", [200u8, 40, 20])] {
            let dir = d.join(split).join(class);
            std::fs::create_dir_all(&dir).unwrap();
            for i in 0..n {
                let img = image::RgbImage::from_fn(6, 6, |_, _| {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let noise = (s >> 59) as u8;
                    image::Rgb([base[0] + noise, base[1] + noise, base[2] + noise])
                });
                img.save(dir.join(format!("{i}.png"))).unwrap();
            }
        }
    }
    let cfg = d.join("vit.toml");
    std::fs::write(
        &cfg,
        r#"
[run]
dir = "vit"
[data]
kind = "folder"
train_dir = "train"
test_dir = "test"
channels = 3
height = 8
width = 8
mean = 0.4
std = 0.3
augment = true
[loader]
batch_size = 8
num_workers = 2
[model]
kind = "vit"
image_size = 8
channels = 3
patch_size = 4
hidden = 16
layers = 1
heads = 2
mlp = 32
[train]
epochs = 3
lr = 5e-3
"#,
    )
    .unwrap();
    ok(&trident(&["train", "--config", cfg.to_str().unwrap()], d));
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("vit/test/metrics.json")).unwrap()).unwrap();
    assert_eq!(m["classes"], serde_json::json!(["blue", "red"]));
    let acc = m["report"]["accuracy"].as_f64().unwrap();
    assert!(acc >= 0.9, "colour is learnt: accuracy {acc}");
    // The same run in bf16 mixed precision learns as well, and is not the f32 run again.
    let bf16_cfg = d.join("vit-bf16.toml");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("dir = \"vit\"", "dir = \"vit-bf16\"")
        .replace("[train]\n", "[train]\nprecision = \"bf16\"\n");
    std::fs::write(&bf16_cfg, text).unwrap();
    ok(&trident(&["train", "--config", bf16_cfg.to_str().unwrap()], d));
    let m16: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("vit-bf16/test/metrics.json")).unwrap()).unwrap();
    let acc16 = m16["report"]["accuracy"].as_f64().unwrap();
    assert!(acc16 >= 0.9, "bf16 learns colour too: accuracy {acc16}");
    let first_loss = |run: &str| -> f64 { epoch_records(&d.join(run))[0]["train_loss"].as_f64().unwrap() };
    let (l32, l16) = (first_loss("vit"), first_loss("vit-bf16"));
    assert!(
        l32 != l16 && (l32 - l16).abs() < 0.05 * l32,
        "f32 {l32}, bf16 {l16}"
    );
    // predict classifies image files with the training preprocessing (resize, normalise).
    let out = ok(&trident(
        &[
            "predict",
            "--model",
            "vit/best",
            "test/red/0.png",
            "test/blue/3.png",
        ],
        d,
    ));
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(lines[0]["file"], "test/red/0.png");
    assert_eq!(lines[0]["label"], "red", "{out}");
    assert_eq!(lines[1]["label"], "blue", "{out}");
    let total: f64 = lines[0]["scores"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_f64().unwrap())
        .sum();
    assert!((total - 1.0).abs() < 1e-3, "{out}");
    let err = failed(&trident(
        &["predict", "--model", "vit/best", "test/red/missing.png"],
        d,
    ));
    assert!(err.contains("missing.png"), "{err}");
    // A model whose size does not match the images is refused before training.
    let bad = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("image_size = 8", "image_size = 12")
        .replace("dir = \"vit\"", "dir = \"vit2\"");
    std::fs::write(&cfg, bad).unwrap();
    let err = failed(&trident(&["train", "--config", cfg.to_str().unwrap()], d));
    assert!(err.contains("do not match the 3x8x8 images"), "{err}");
}
