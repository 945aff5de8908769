//! `trident export`, `trident eval --onnx` and `trident package` on a checkpoint trained
//! here: the exported graph scores the test split exactly as the checkpoint does, int8
//! keeps its accuracy, and bad arguments are named.

mod common;

use common::{failed, ok, text_config, trident, write_texts};

/// (accuracy, loss) from `trident eval`'s summary line.
fn scores(stdout: &str) -> (f64, f64) {
    let line = stdout.lines().next().expect("a summary line");
    let field = |key: &str| -> f64 {
        let rest = &line[line.find(key).unwrap_or_else(|| panic!("{key} in {line}")) + key.len()..];
        rest.split_whitespace().next().unwrap().parse().unwrap()
    };
    (field("accuracy "), field("loss "))
}

#[test]
fn exported_graphs_evaluate_like_the_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let cfg = text_config(d, &write_texts(d), "run", "");
    ok(&trident(&["train", "--config", cfg.to_str().unwrap()], d));
    let (acc, loss) = scores(&ok(&trident(&["eval", "--model", "run/best"], d)));

    ok(&trident(&["export", "--model", "run/best", "--out", "m.onnx"], d));
    for engine in ["tract", "ort"] {
        if engine == "ort" && !cfg!(feature = "ort") {
            continue;
        }
        let out = ok(&trident(
            &[
                "eval", "--model", "run/best", "--onnx", "m.onnx", "--engine", engine,
            ],
            d,
        ));
        let (a, l) = scores(&out);
        assert_eq!(a, acc, "{engine}: accuracy");
        assert!(
            (l - loss).abs() < 1e-3,
            "{engine}: loss {l} vs the checkpoint's {loss}"
        );
    }
    assert!(d.join("run/best/eval-test-onnx/metrics.json").exists());

    if cfg!(feature = "ort") {
        ok(&trident(
            &[
                "export",
                "--model",
                "run/best",
                "--out",
                "q.onnx",
                "--flavour",
                "ort-fused",
                "--precision",
                "int8",
            ],
            d,
        ));
        let (a, _) = scores(&ok(&trident(
            &["eval", "--model", "run/best", "--onnx", "q.onnx"],
            d,
        )));
        assert!((a - acc).abs() <= 0.01 + 1e-9, "int8 accuracy {a} vs fp32 {acc}");
    }

    let err = failed(&trident(
        &[
            "export",
            "--model",
            "run/best",
            "--out",
            "x.onnx",
            "--flavour",
            "fast",
        ],
        d,
    ));
    assert!(err.contains("--flavour `fast`"), "{err}");
    let err = failed(&trident(&["eval", "--model", "run/best", "--engine", "tract"], d));
    assert!(
        err.contains("--onnx"),
        "--engine alone is refused, not ignored: {err}"
    );
    let err = failed(&trident(&["export", "--model", "nowhere", "--out", "x.onnx"], d));
    assert!(err.contains("nowhere"), "{err}");
    assert!(!d.join("x.onnx").exists(), "nothing written on failure");

    // package: refuses to overwrite without --force, and needs a destination.
    let package = |extra: &[&str]| {
        let mut args = vec![
            "package",
            "--model",
            "run/best",
            "--repository",
            "models",
            "--name",
            "s",
        ];
        args.extend_from_slice(extra);
        trident(&args, d)
    };
    ok(&package(&[]));
    for f in [
        "s/config.pbtxt",
        "s_preprocess/1/tokenizer.json",
        "s_onnx/1/model.onnx",
        "s_onnx/labels.txt",
    ] {
        assert!(d.join("models").join(f).exists(), "{f}");
    }
    let err = failed(&package(&[]));
    assert!(err.contains("--force"), "{err}");
    ok(&package(&["--force"]));
    let err = failed(&trident(&["package", "--model", "run/best"], d));
    assert!(err.contains("--repository") || err.contains("--archive"), "{err}");
}
