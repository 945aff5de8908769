//! Helpers shared by the CLI's end-to-end tests.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs the `trident` binary with `args` in `cwd`.
pub fn trident(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trident"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run trident")
}

/// Asserts success; returns stdout.
pub fn ok(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "trident failed: {}\n{err}", out.status);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Asserts success; returns stderr (the log).
pub fn ok_log(out: &Output) -> String {
    ok(out);
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts failure; returns stderr.
pub fn failed(out: &Output) -> String {
    assert!(!out.status.success(), "trident should have failed");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Writes an IDX file (unsigned bytes) of `dims`.
pub fn write_idx(path: &Path, dims: &[u32], data: &[u8]) {
    let mut bytes = vec![0, 0, 0x08, dims.len() as u8];
    for d in dims {
        bytes.extend(d.to_be_bytes());
    }
    bytes.extend(data);
    std::fs::write(path, bytes).unwrap();
}

/// The tiny random BERT fixture of trident-nn (2 layers, hidden 16, 50-token vocabulary).
pub fn tiny_bert() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../trident-nn/tests/fixtures/tiny_bert")
}

/// 80 short reviews: "good/great/love/fine" ones are positive, "bad/awful/hate/poor" negative.
pub fn write_texts(dir: &Path) -> PathBuf {
    let pos = ["good", "great", "love", "fine"];
    let neg = ["bad", "awful", "hate", "poor"];
    let mut text = String::new();
    for i in 0..80 {
        let (w, label) = if i % 2 == 0 {
            (pos[i / 2 % 4], "positive")
        } else {
            (neg[i / 2 % 4], "negative")
        };
        let filler = ["the movie was", "it is a", "the plot is very", "film and"][i % 4];
        text += &format!("{filler} {w}\t{label}\n");
    }
    let f = dir.join("reviews.tsv");
    std::fs::write(&f, text).unwrap();
    f
}

/// The `[data]` section for the reviews of [`write_texts`] in `file` (max 16 tokens).
pub fn reviews_data(file: &str) -> String {
    format!(
        r#"[data]
kind = "text"
files = ["{file}"]
format = "tsv"
text_field = "0"
label_field = "1"
max_len = 16
"#
    )
}

/// A run configuration `<run>.toml` in `dir` for the reviews in `data`: the tiny BERT, batch
/// 8, 3 epochs of 4 optimizer steps (grad_accum 2), run directory `run`; `extra_data` joins
/// the `[data]` section.
pub fn text_config(dir: &Path, data: &Path, run: &str, extra_data: &str) -> PathBuf {
    let cfg = format!(
        r#"
[run]
dir = "{run}"
seed = 3

{reviews}{extra_data}

[loader]
batch_size = 8
num_workers = 1

[model]
kind = "bert"
pretrained = "{bert}"
pooling = "cls"

[train]
epochs = 3
lr = 3e-3
warmup_steps = 2
decay = "linear"
max_grad_norm = 1.0
grad_accum = 2
log_every = 1
"#,
        reviews = reviews_data(&data.display().to_string()),
        bert = tiny_bert().display(),
    );
    let f = dir.join(format!("{run}.toml"));
    std::fs::write(&f, cfg).unwrap();
    f
}

/// Asserts that the weights and optimizer state of run directories `a` and `b` are the same
/// bits (`last/`), and their best weights (`best/`): a resumed run against an uninterrupted one.
pub fn assert_same_checkpoints(a: &Path, b: &Path) {
    for f in [
        "last/model.safetensors",
        "last/optimizer.safetensors",
        "best/model.safetensors",
    ] {
        let x = std::fs::read(a.join(f)).unwrap();
        let y = std::fs::read(b.join(f)).unwrap();
        assert!(x == y, "{f} differs between {} and {}", a.display(), b.display());
    }
}

/// The tensors of a safetensors file (a checkpoint's weights or optimizer state), by name.
pub fn tensors(file: &Path) -> std::collections::HashMap<String, candle_core::Tensor> {
    candle_core::safetensors::load(file, &candle_core::Device::Cpu).unwrap()
}

/// Whether two tensors hold the same values (as f32, bit for bit up to NaN).
pub fn same(a: &candle_core::Tensor, b: &candle_core::Tensor) -> bool {
    let v = |t: &candle_core::Tensor| {
        t.flatten_all()
            .unwrap()
            .to_dtype(candle_core::DType::F32)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    };
    v(a) == v(b)
}

/// The epoch records of the run directory `run` (`metrics.jsonl`), in order.
pub fn epoch_records(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A two-class set of 8×8 IDX images in `dir` (`train-images`, `train-labels`: 96;
/// `test-images`, `test-labels`: 32): class 0 has a bright top half, class 1 a bright
/// bottom half, with noise.
pub fn write_top_bottom_images(dir: &Path) {
    let make = |n: usize, seed: u64| {
        let (mut px, mut labels, mut s) = (Vec::new(), Vec::new(), seed);
        for i in 0..n {
            let label = (i % 2) as u8;
            for r in 0..8 {
                for _ in 0..8 {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let noise = (s >> 59) as u8;
                    let bright = (r < 4) == (label == 0);
                    px.push(if bright { 200 + noise } else { noise });
                }
            }
            labels.push(label);
        }
        (px, labels)
    };
    for (split, n, seed) in [("train", 96, 1), ("test", 32, 2)] {
        let (px, lab) = make(n, seed);
        write_idx(&dir.join(format!("{split}-images")), &[n as u32, 8, 8], &px);
        write_idx(&dir.join(format!("{split}-labels")), &[n as u32], &lab);
    }
}

/// The `[data]` section of a run on [`write_top_bottom_images`]'s files (its keys up to
/// `val_fraction = 0.2`; a config adds its own after it).
pub const TOP_BOTTOM_DATA: &str = r#"[data]
kind = "idx"
train_images = "train-images"
train_labels = "train-labels"
test_images = "test-images"
test_labels = "test-labels"
classes = ["top", "bottom"]
val_fraction = 0.2"#;

/// A shipped example run on real data from `scripts/fetch-data.sh <fetch>`: `None` (the
/// test is skipped) when `data/<data_file>` is absent, unless the environment variable
/// `required` is set (CI sets it), which fails instead. Otherwise the example config is
/// copied into `dir` with its `data/` paths made absolute and its run directory inside
/// `dir` (the config's `runs/<name>` becomes `dir/<name>`).
pub fn real_example(
    example: &str,
    data_file: &str,
    fetch: &str,
    required: &str,
    dir: &Path,
) -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    if !root.join("data").join(data_file).is_file() {
        assert!(
            std::env::var_os(required).is_none(),
            "data/{data_file} is missing: scripts/fetch-data.sh {fetch}"
        );
        eprintln!("skipped: data/{data_file} is missing (scripts/fetch-data.sh {fetch})");
        return None;
    }
    let text = std::fs::read_to_string(root.join(example))
        .unwrap()
        .replace("\"data/", &format!("\"{}/data/", root.display()))
        .replace("dir = \"runs/", "dir = \"");
    let cfg = dir.join(Path::new(example).file_name().unwrap());
    std::fs::write(&cfg, text).unwrap();
    Some(cfg)
}
