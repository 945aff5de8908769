//! `[model] kind = "efficientnet_lite0"`: a linear probe on the pretrained network trains
//! the classifier alone (the backbone's weights and batch-norm statistics stay as loaded),
//! fine-tuning trains everything, `data.per_class` draws that many training images of each
//! class, the exported graph scores like the checkpoint, and the configurations that
//! cannot work are refused by name.

mod common;
use common::{failed, ok, same, tensors, trident, TOP_BOTTOM_DATA};

use std::path::{Path, PathBuf};

fn weights() -> Option<PathBuf> {
    let f = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/efficientnet-lite0/efficientnet-lite0-57934424.pth");
    if f.is_file() {
        return Some(f);
    }
    assert!(
        std::env::var_os("TRIDENT_EFFICIENTNET_REQUIRED").is_none(),
        "{} is missing: scripts/fetch-data.sh efficientnet",
        f.display()
    );
    eprintln!("skipped: scripts/fetch-data.sh efficientnet");
    None
}

fn config(dir: &Path, run: &str, model: &str, data: &str) -> PathBuf {
    let cfg = format!(
        r#"
[run]
dir = "{run}"
seed = 2
{TOP_BOTTOM_DATA}
{data}
[loader]
batch_size = 8
[model]
kind = "efficientnet_lite0"
scale = 4
{model}
[train]
epochs = 1
lr = 1e-2
"#
    );
    let path = dir.join(format!("{run}.toml"));
    std::fs::write(&path, cfg).unwrap();
    path
}

#[test]
fn a_probe_trains_the_classifier_alone_and_fine_tuning_trains_everything() {
    let Some(pth) = weights() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    common::write_top_bottom_images(d);
    let pretrained = trident_nn::pth::read(&pth).unwrap();
    let original = |name: &str| pretrained.iter().find(|(n, _)| n == name).unwrap().1.clone();
    let model = format!("pretrained = \"{}\"", pth.display());
    for (run, mode) in [("probe", "probe"), ("finetune", "finetune")] {
        let cfg = config(d, run, &format!("{model}\nmode = \"{mode}\""), "per_class = 12");
        let log = String::from_utf8_lossy(&trident(&["train", "--config", cfg.to_str().unwrap()], d).stderr)
            .into_owned();
        assert!(d.join(run).join("best/model.safetensors").is_file(), "{log}");
        assert!(log.contains("data 24 train"), "{log}");
        let w = tensors(&d.join(run).join("last/model.safetensors"));
        // The head is new (2 classes) and trained in both modes.
        assert_eq!(w["head.weight"].dims(), [2, 1280]);
        for name in [
            "_blocks.3._depthwise_conv.weight",
            "_conv_head.weight",
            "_bn1.running_mean",
        ] {
            let kept = same(&w[name], &original(name));
            assert_eq!(kept, mode == "probe", "{mode}: {name} kept = {kept}");
        }
        if mode == "probe" {
            // Only the classifier was trainable.
            assert!(log.contains("2562 trainable parameters"), "{log}");
        }
        // `eval` agrees with the run's own test report.
        let best = d.join(run).join("best");
        ok(&trident(&["eval", "--model", best.to_str().unwrap()], d));
        let a: serde_json::Value =
            serde_json::from_slice(&std::fs::read(d.join(run).join("test/metrics.json")).unwrap()).unwrap();
        let b: serde_json::Value =
            serde_json::from_slice(&std::fs::read(best.join("eval-test/metrics.json")).unwrap()).unwrap();
        assert_eq!(a["accuracy"], b["accuracy"], "{mode}");
    }
}

#[test]
fn transfer_configurations_that_cannot_work_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    common::write_top_bottom_images(d);
    let e = failed(&trident(
        &[
            "train",
            "--config",
            config(d, "a", "mode = \"probe\"", "").to_str().unwrap(),
        ],
        d,
    ));
    assert!(e.contains("model.pretrained") && e.contains("probe"), "{e}");
    let e = failed(&trident(
        &[
            "train",
            "--config",
            config(d, "b", "", "per_class = 40").to_str().unwrap(),
        ],
        d,
    ));
    assert!(e.contains("data.per_class = 40") && e.contains("class"), "{e}");
    let e = failed(&trident(
        &[
            "train",
            "--config",
            config(d, "c", "pretrained = \"nowhere.pth\"", "")
                .to_str()
                .unwrap(),
        ],
        d,
    ));
    assert!(e.contains("model.pretrained = nowhere.pth"), "{e}");
    let e = failed(&trident(
        &[
            "train",
            "--config",
            config(d, "d", "mode = \"probe\"\nbn_momentum = 0.1", "")
                .to_str()
                .unwrap(),
        ],
        d,
    ));
    assert!(e.contains("model.bn_momentum") && e.contains("probe"), "{e}");
    let e = failed(&trident(
        &[
            "train",
            "--config",
            config(d, "e", "bn_momentum = 0", "").to_str().unwrap(),
        ],
        d,
    ));
    assert!(e.contains("model.bn_momentum = 0 is not in (0, 1]"), "{e}");
    // From scratch with a few images of each class trains and tests.
    let cfg = config(d, "scratch", "", "per_class = 5");
    let log = String::from_utf8_lossy(&trident(&["train", "--config", cfg.to_str().unwrap()], d).stderr)
        .into_owned();
    assert!(log.contains("data 10 train"), "{log}");
    assert!(d.join("scratch/test/metrics.json").is_file(), "{log}");
    // Exported (the input adapter in the graph), it scores the test images as the checkpoint does.
    ok(&trident(
        &["export", "--model", "scratch/best", "--out", "x.onnx"],
        d,
    ));
    ok(&trident(
        &[
            "eval",
            "--model",
            "scratch/best",
            "--onnx",
            "x.onnx",
            "--engine",
            "tract",
        ],
        d,
    ));
    let json = |p: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(d.join(p)).unwrap()).unwrap()
    };
    let (a, b) = (
        json("scratch/test/metrics.json"),
        json("scratch/best/eval-test-onnx/metrics.json"),
    );
    assert_eq!(a["accuracy"], b["accuracy"]);
    assert!(
        (a["loss"].as_f64().unwrap() - b["loss"].as_f64().unwrap()).abs() < 1e-3,
        "{a} {b}"
    );
}
