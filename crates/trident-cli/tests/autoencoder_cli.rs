//! `[model] kind = "autoencoder"` end to end: training on images (dense and conv) and on
//! a table, the reconstruction report with `[anomaly]` (ROC-AUC of the reconstruction
//! error, normal against the rest), `trident eval` and `predict` agreeing with it, exact
//! resume of a denoising run, the exported ONNX graph scoring like the checkpoint, and the
//! errors for configurations that cannot work.

mod common;
use common::{assert_same_checkpoints, epoch_records, failed, ok, trident, TOP_BOTTOM_DATA};

use std::path::{Path, PathBuf};

fn image_config(dir: &Path, run: &str, model: &str, extra: &str) -> PathBuf {
    let cfg = format!(
        r#"
[run]
dir = "{run}"
seed = 4
{TOP_BOTTOM_DATA}
[loader]
batch_size = 8
num_workers = 0
[model]
kind = "autoencoder"
{model}
[train]
epochs = 6
lr = 1e-2
log_every = 2
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

#[test]
fn an_autoencoder_of_normal_images_flags_the_other_class_and_eval_agrees() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    common::write_top_bottom_images(d);
    let cfg = image_config(
        d,
        "ae",
        "hidden = [16]\ncode = 4",
        "[anomaly]\nnormal = [\"top\"]",
    );
    let log = String::from_utf8_lossy(&trident(&["train", "--config", cfg.to_str().unwrap()], d).stderr)
        .into_owned();
    assert!(d.join("ae/best/model.safetensors").is_file(), "{log}");
    // Training and validation saw only the normal class: of 96 images (77 train / 19
    // validation), the "top" half.
    assert!(log.contains("data 36 train / 12 val / 32 test"), "{log}");
    let m = json(&d.join("ae/test/metrics.json"));
    let r = &m["reconstruction"];
    let auroc = r["anomaly"]["auroc"].as_f64().unwrap();
    assert!(
        auroc > 0.95,
        "bright-bottom images are far from every top one: AUROC {auroc}"
    );
    assert_eq!(r["anomaly"]["normal_examples"], 16);
    assert_eq!(r["anomaly"]["anomalous_examples"], 16);
    let (top, bottom) = (&r["per_class"][0], &r["per_class"][1]);
    assert!(top["mse"].as_f64().unwrap() < bottom["mse"].as_f64().unwrap());
    assert_eq!(top["normal"], true);
    // The overall error is the mean of the equal-sized classes', and the test loss.
    let mse = r["mse"].as_f64().unwrap();
    let mean = (top["mse"].as_f64().unwrap() + bottom["mse"].as_f64().unwrap()) / 2.0;
    assert!((mse - mean).abs() < 1e-6 && (mse - m["loss"].as_f64().unwrap()).abs() < 1e-6 * mse.max(1.0));
    for f in ["scores.png", "reconstructions.png"] {
        assert!(d.join("ae/test").join(f).is_file(), "{f}");
    }
    // Validation loss is monitored; a model without classes has no accuracy curve.
    let records = epoch_records(&d.join("ae"));
    assert_eq!(records.len(), 6);
    assert!(records
        .iter()
        .all(|r| r["train_accuracy"].is_null() && r["val_loss"].is_number()));
    assert!(d.join("ae/loss.png").is_file() && !d.join("ae/accuracy.png").exists());
    let first = records[0]["train_loss"].as_f64().unwrap();
    let last = records[5]["train_loss"].as_f64().unwrap();
    assert!(last < first, "reconstruction improves: {first} → {last}");
    let report = json(&d.join("ae/report.json"));
    assert!(report["student"]["test_accuracy"].is_null());
    // (the loss summed per batch in f32, the report's mean per example in f64)
    assert!((report["student"]["test_loss"].as_f64().unwrap() - mse).abs() < 1e-6 * mse.max(1.0));

    // `trident eval` reproduces the test figures from the checkpoint alone.
    let best = d.join("ae/best");
    let out = ok(&trident(&["eval", "--model", best.to_str().unwrap()], d));
    assert!(out.contains(&format!("anomaly ROC-AUC {auroc:.4}")), "{out}");
    let e = json(&best.join("eval-test/metrics.json"));
    assert_eq!(e["reconstruction"]["anomaly"]["auroc"], r["anomaly"]["auroc"]);
    // The validation split holds normal images only: no ROC-AUC to compute.
    let out = ok(&trident(
        &["eval", "--model", best.to_str().unwrap(), "--split", "val"],
        d,
    ));
    assert!(
        out.contains("anomaly ROC-AUC undefined") && out.contains("anomalous: 0"),
        "{out}"
    );

    onnx_scores_like_the_checkpoint(d, &best);
}

/// `trident export` writes the autoencoder's graph (reconstruction and its error), and
/// `trident eval --onnx` on it, with each engine, reproduces the checkpoint's test figures.
fn onnx_scores_like_the_checkpoint(d: &Path, best: &Path) {
    let b = best.to_str().unwrap();
    let mine = json(&best.join("eval-test/metrics.json"));
    let onnx = d.join(format!(
        "{}.onnx",
        best.parent().unwrap().file_name().unwrap().to_string_lossy()
    ));
    let o = onnx.to_str().unwrap();
    ok(&trident(&["export", "--model", b, "--out", o], d));
    for engine in ["tract", "ort"] {
        if engine == "ort" && !cfg!(feature = "ort") {
            continue;
        }
        ok(&trident(
            &["eval", "--model", b, "--onnx", o, "--engine", engine],
            d,
        ));
        let theirs = json(&best.join("eval-test-onnx/metrics.json"));
        let (a, t) = (&mine["reconstruction"], &theirs["reconstruction"]);
        let (ma, mt) = (a["mse"].as_f64().unwrap(), t["mse"].as_f64().unwrap());
        assert!(
            (ma - mt).abs() < 1e-5 * ma.max(1e-3),
            "{engine}: MSE {mt} vs the checkpoint's {ma}"
        );
        if let Some(auc) = a["anomaly"]["auroc"].as_f64() {
            let other = t["anomaly"]["auroc"].as_f64().unwrap();
            assert!((auc - other).abs() < 1e-3, "{engine}: ROC-AUC {other} vs {auc}");
        }
    }
}

#[test]
fn a_denoising_conv_autoencoder_resumes_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    common::write_top_bottom_images(d);
    let model = "shape = \"conv\"\nchannels = [4, 8]\ncode = 6\nnoise = 0.2";
    let whole = image_config(d, "whole", model, "");
    let out = trident(&["train", "--config", whole.to_str().unwrap()], d);
    ok(&out);
    let m = json(&d.join("whole/test/metrics.json"));
    let mse = m["reconstruction"]["mse"].as_f64().unwrap();
    // A sigmoid decoder on [0, 1] pixels: better than predicting 0.5 everywhere (≈ 0.17).
    assert!(mse < 0.1, "test MSE {mse}");
    assert!(m["reconstruction"]["anomaly"].is_null());
    let best = d.join("whole/best");
    ok(&trident(&["eval", "--model", best.to_str().unwrap()], d));
    onnx_scores_like_the_checkpoint(d, &best);
    let parts = image_config(d, "parts", model, "");
    let p = parts.to_str().unwrap();
    ok(&trident(&["train", "--config", p, "--stop-after-steps", "7"], d));
    ok(&trident(&["train", "--config", p, "--resume"], d));
    assert_same_checkpoints(&d.join("whole"), &d.join("parts"));
}

#[test]
fn a_table_autoencoder_scores_rows_in_eval_and_predict() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    // Class "a" rows lie on a plane (y = 2x + noise, z free): two degrees of freedom, which
    // a 2-wide code holds; class "b" rows leave the plane.
    let mut text = String::from("x,y,z,kind\n");
    let mut s = 7u64;
    let mut next = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 33) as f64) / (1u64 << 31) as f64
    };
    for i in 0..200 {
        let x = next() * 4.0 - 2.0;
        let z = next();
        let (y, kind) = if i % 4 == 3 {
            (next() * 8.0 - 4.0, "b")
        } else {
            (2.0 * x + 0.05 * next(), "a")
        };
        text += &format!("{x:.4},{y:.4},{z:.4},{kind}\n");
    }
    std::fs::write(d.join("rows.csv"), &text).unwrap();
    let cfg = d.join("t.toml");
    std::fs::write(
        &cfg,
        r#"
[run]
dir = "t"
[data]
kind = "table"
file = "rows.csv"
test_fraction = 0.3
val_fraction = 0.1
[anomaly]
normal = ["a"]
[loader]
batch_size = 16
num_workers = 0
[model]
kind = "autoencoder"
hidden = [16]
code = 2
activation = "tanh"
[train]
epochs = 60
lr = 1e-2
log_every = 10
"#,
    )
    .unwrap();
    let log = String::from_utf8_lossy(&trident(&["train", "--config", cfg.to_str().unwrap()], d).stderr)
        .into_owned();
    let m = json(&d.join("t/test/metrics.json"));
    let auroc = m["reconstruction"]["anomaly"]["auroc"]
        .as_f64()
        .unwrap_or_else(|| panic!("{log}"));
    assert!(auroc > 0.8, "off-line rows reconstruct worse: AUROC {auroc}");
    let best = d.join("t/best");
    let b = best.to_str().unwrap();
    let on = ok(&trident(&["predict", "--model", b, "1.0,2.0,0.5"], d));
    let off = ok(&trident(&["predict", "--model", b, "1.0,-3.0,0.5"], d));
    let err = |out: &str| -> f64 {
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        v["reconstruction_error"].as_f64().unwrap()
    };
    assert!(err(&on) < err(&off), "{on} vs {off}");
    ok(&trident(&["eval", "--model", b], d));
    onnx_scores_like_the_checkpoint(d, &best);
    // A whole file: one line per row.
    let out = ok(&trident(
        &["predict", "--model", b, d.join("rows.csv").to_str().unwrap()],
        d,
    ));
    assert_eq!(out.lines().count(), 200);
}

#[test]
fn configurations_that_cannot_work_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    common::write_top_bottom_images(d);
    let run = |model: &str, extra: &str, name: &str| {
        let cfg = image_config(d, name, model, extra);
        failed(&trident(&["train", "--config", cfg.to_str().unwrap()], d))
    };
    let e = run("code = 4", "monitor = \"val_accuracy\"", "a");
    assert!(e.contains("train.monitor") && e.contains("val_loss"), "{e}");
    let e = run("code = 4", "[anomaly]\nnormal = [\"side\"]", "b");
    assert!(e.contains("\"side\" is not one of the data's classes"), "{e}");
    let e = run("shape = \"conv\"\nchannels = [4, 8, 8, 8]", "", "c");
    assert!(e.contains("not divisible by 16"), "{e}");
    let e = run("code = 4\nnoise = -1.0", "", "d");
    assert!(e.contains("model.noise"), "{e}");
    // [anomaly] belongs to autoencoders.
    let cfg = image_config(d, "e", "code = 4", "[anomaly]\nnormal = [\"top\"]");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("kind = \"autoencoder\"\ncode = 4", "kind = \"cnn\"\nwidth = 4");
    std::fs::write(&cfg, text).unwrap();
    let e = failed(&trident(&["train", "--config", cfg.to_str().unwrap()], d));
    assert!(e.contains("[anomaly]") && e.contains("autoencoder"), "{e}");
}

/// The shipped breast-cancer anomaly example on the real table (`scripts/fetch-data.sh
/// tabular`), seed 0: measured ROC-AUC 0.948 (Mahalanobis on the same split 0.945); the
/// bound leaves room for other CPUs' rounding. Skipped when the data is absent, unless
/// TRIDENT_TABULAR_REQUIRED is set (CI sets it).
#[test]
fn the_breast_cancer_example_separates_malignant_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let Some(cfg) = common::real_example(
        "examples/autoencoder/breast_cancer.toml",
        "tabular/breast_cancer.csv",
        "tabular",
        "TRIDENT_TABULAR_REQUIRED",
        d,
    ) else {
        return;
    };
    let log = common::ok_log(&trident(&["train", "--config", cfg.to_str().unwrap()], d));
    let m = json(&d.join("ae-breast-cancer/test/metrics.json"));
    let a = &m["reconstruction"]["anomaly"];
    assert_eq!(
        (a["normal_examples"].as_u64(), a["anomalous_examples"].as_u64()),
        (Some(143), Some(85))
    );
    let auroc = a["auroc"].as_f64().unwrap();
    assert!(auroc >= 0.93, "test ROC-AUC {auroc}\n{log}");
}

/// A period-20 wave with a burst of noise at 700..712, marked in its own column.
fn write_marked_series(dir: &Path) {
    let mut s = 5u64;
    let mut text = String::from("t,value,anomaly\n");
    for t in 0..1000 {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let noise = (s >> 33) as f64 / (1u64 << 31) as f64 - 0.5;
        let marked = (700..712).contains(&t);
        let v = (2.0 * std::f64::consts::PI * t as f64 / 20.0).sin()
            + if marked { 2.0 * noise } else { 0.05 * noise };
        text += &format!("{t},{v:.4},{}\n", u8::from(marked));
    }
    std::fs::write(dir.join("marked.csv"), text).unwrap();
}

#[test]
fn an_autoencoder_of_series_windows_ranks_the_marked_anomaly_first() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write_marked_series(d);
    let cfg = d.join("s.toml");
    let text = r#"
[run]
dir = "s"
[data]
kind = "series"
file = "marked.csv"
column = "value"
window = 40
test = 600
[anomaly]
column = "anomaly"
[loader]
batch_size = 16
num_workers = 0
[model]
kind = "autoencoder"
hidden = [32]
code = 4
[train]
epochs = 10
lr = 3e-3
"#;
    std::fs::write(&cfg, text).unwrap();
    ok(&trident(&["train", "--config", cfg.to_str().unwrap()], d));
    let m = json(&d.join("s/test/metrics.json"));
    let r = &m["series_anomaly"];
    assert_eq!(r["windows"], 561, "every window of the 600 test values");
    assert_eq!(r["marked"], serde_json::json!([[700, 712]]));
    assert_eq!(r["top_is_marked"], true, "{r}");
    assert_eq!(r["best_marked_rank"], 1);
    assert!(r["auroc"].as_f64().unwrap() > 0.9, "{r}");
    assert!(d.join("s/test/scores.png").is_file());
    // eval ranks the same windows; predict says where series are scored.
    let out = ok(&trident(&["eval", "--model", "s/best"], d));
    assert!(out.contains("holds the marked anomaly"), "{out}");
    let e = json(&d.join("s/best/eval-test/metrics.json"));
    assert_eq!(e["series_anomaly"]["top"], r["top"]);
    let err = failed(&trident(&["predict", "--model", "s/best", "marked.csv"], d));
    assert!(err.contains("trident eval"), "{err}");
    // A series autoencoder forecasts nothing: backtest keys are refused, not ignored.
    std::fs::write(&cfg, text.replace("window = 40", "window = 40\nrefit = true")).unwrap();
    let err = failed(&trident(&["train", "--config", cfg.to_str().unwrap()], d));
    assert!(err.contains("data.refit is not used here"), "{err}");
    // An [anomaly] for a series names its column, not classes.
    std::fs::write(&cfg, text.replace("column = \"anomaly\"", "normal = [\"0\"]")).unwrap();
    let err = failed(&trident(&["train", "--config", cfg.to_str().unwrap()], d));
    assert!(err.contains("[anomaly] on a series takes column"), "{err}");
}

/// The shipped KDD-TSAD 135 example (`scripts/fetch-data.sh series`): the labelled anomaly
/// is in the top-ranked window (measured: rank 1 for seeds 0–4, ROC-AUC 0.993–0.997).
/// Skipped when the data is absent, unless TRIDENT_SERIES_REQUIRED is set (CI sets it).
#[test]
fn the_kdd_tsad_example_ranks_the_labelled_anomaly_first() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let Some(cfg) = common::real_example(
        "examples/autoencoder/kdd_tsad_135.toml",
        "series/kdd_tsad_135.csv",
        "series",
        "TRIDENT_SERIES_REQUIRED",
        d,
    ) else {
        return;
    };
    let log = common::ok_log(&trident(&["train", "--config", cfg.to_str().unwrap()], d));
    let r = &json(&d.join("ae-kdd-tsad-135/test/metrics.json"))["series_anomaly"];
    assert_eq!(r["marked"], serde_json::json!([[4187, 4199]]));
    assert_eq!(r["top_is_marked"], true, "{r}\n{log}");
}

#[test]
fn keys_the_chosen_shape_does_not_read_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    common::write_top_bottom_images(d);
    let run = |model: &str, name: &str| {
        let cfg = image_config(d, name, model, "");
        failed(&trident(&["train", "--config", cfg.to_str().unwrap()], d))
    };
    let e = run("shape = \"conv\"\nchannels = [4]\nhidden = [16]", "a");
    assert!(e.contains("model.hidden is not used here"), "{e}");
    let e = run("channels = [4]", "b");
    assert!(e.contains("model.channels is not used here"), "{e}");
}
