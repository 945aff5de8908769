//! `trident train --profile` end to end on the tiny BERT fixture: the step phases, the
//! operator table, the Chrome trace and the step window.

mod common;
use common::{ok_log, reviews_data, tiny_bert, trident, write_texts};

use std::path::Path;

fn config(d: &Path, run: &str) -> String {
    let reviews = reviews_data("reviews.tsv");
    let cfg = format!(
        r#"
[run]
dir = "{run}"
seed = 1
{reviews}[loader]
batch_size = 8
num_workers = 1
[model]
kind = "bert"
pretrained = "{bert}"
pooling = "mean"
[train]
epochs = 1
lr = 1e-3
"#,
        bert = tiny_bert().display()
    );
    let f = format!("{run}.toml");
    std::fs::write(d.join(&f), cfg).unwrap();
    f
}

fn csv(path: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| l.split(',').map(String::from).collect())
        .collect()
}

#[test]
fn profiling_writes_phases_operators_and_a_trace() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write_texts(d);

    // Off by default: no profile directory, no profile lines.
    let f = config(d, "plain");
    let log = ok_log(&trident(&["train", "--config", &f], d));
    assert!(
        !d.join("plain/profile").exists() && !log.contains("profile:"),
        "{log}"
    );

    let f = config(d, "prof");
    let log = ok_log(&trident(&["train", "--config", &f, "--profile"], d));
    assert!(log.contains("profile:") && log.contains("top operators"), "{log}");
    let dir = d.join("prof/profile");

    // One row per optimizer step; the phases tile the step exactly, the named phases (all
    // but `other`: metrics, progress, logging) hold most of it, and the steps together
    // hold the epoch's training time as the trainer's own clock measures it (within 10 %:
    // what lies between steps is the loader's start).
    let steps = csv(&dir.join("steps.csv"));
    assert_eq!(
        steps[0],
        [
            "step",
            "data_ms",
            "forward_ms",
            "backward_ms",
            "optimizer_ms",
            "comm_ms",
            "other_ms",
            "total_ms"
        ]
    );
    let records = common::epoch_records(&d.join("prof"));
    let n_steps = records[0]["step"].as_u64().unwrap() as usize;
    assert_eq!(steps.len() - 1, n_steps);
    let (mut named, mut total) = (0.0, 0.0);
    for r in &steps[1..] {
        let v: Vec<f64> = r[1..].iter().map(|x| x.parse().unwrap()).collect();
        let sum: f64 = v[..6].iter().sum();
        assert!(
            (sum - v[6]).abs() <= 1e-3 + 1e-6 * v[6],
            "phases {sum} vs step {}",
            v[6]
        );
        named += v[..5].iter().sum::<f64>();
        total += v[6];
    }
    assert!(
        named >= 0.75 * total,
        "named phases cover {named:.2} of {total:.2} ms"
    );
    let epoch_ms = records[0]["epoch_seconds"].as_f64().unwrap() * 1e3;
    assert!(
        total >= 0.9 * epoch_ms && total <= epoch_ms,
        "steps {total:.1} ms of an epoch of {epoch_ms:.1} ms"
    );

    // Operators: the BERT kernels, forward and backward, with GFLOP/s for matrix products.
    let ops = csv(&dir.join("ops.csv"));
    let has = |name: &str, pass: &str| ops.iter().any(|r| r[0] == name && r[1] == pass);
    for (name, pass) in [
        ("attention-block", "fwd"),
        ("attention-block", "bwd"),
        ("attention-core", "fwd"),
        ("attention-core", "bwd"),
        ("gelu", "fwd"),
        ("feed-forward-block", "fwd"),
        ("feed-forward-block", "bwd"),
        ("linear", "fwd"),
        ("linear", "bwd"),
        ("layer-norm", "fwd"),
    ] {
        assert!(has(name, pass), "{name}.{pass} missing from {ops:?}");
    }
    for name in [
        "linear",
        "attention-block",
        "attention-core",
        "feed-forward-block",
    ] {
        let row = ops.iter().find(|r| r[0] == name && r[1] == "fwd").unwrap();
        assert!(row[6].parse::<f64>().unwrap() > 0.0, "{row:?}");
    }

    // Layers: the same kernel time split by model layer, forward and backward; the
    // backward pass (run by candle after the forward scopes closed) is attributed to the
    // layer whose kernel it differentiates.
    let layers = csv(&dir.join("layers.csv"));
    assert_eq!(
        layers[0],
        ["layer", "op", "pass", "calls", "self_ms", "total_ms", "share", "gflops"]
    );
    let layer_has = |layer: &str, op: &str, pass: &str| {
        layers.iter().any(|r| r[0] == layer && r[1] == op && r[2] == pass)
    };
    let n_layers =
        serde_json::from_slice::<serde_json::Value>(&std::fs::read(tiny_bert().join("config.json")).unwrap())
            .unwrap()["num_hidden_layers"]
            .as_u64()
            .unwrap();
    for i in 0..n_layers {
        let l = format!("encoder.{i}");
        for (op, pass) in [
            ("attention-block", "fwd"),
            ("attention-block", "bwd"),
            ("attention-core", "bwd"),
            ("feed-forward-block", "bwd"),
        ] {
            assert!(layer_has(&l, op, pass), "{l} {op}.{pass} missing: {layers:?}");
        }
    }
    assert!(layer_has("embeddings", "layer-norm", "bwd"), "{layers:?}");
    assert!(
        layer_has("head", "linear", "bwd") && layer_has("loss", "cross-entropy", "bwd"),
        "{layers:?}"
    );
    let self_sum = |rows: &[Vec<String>], col: usize| {
        rows[1..]
            .iter()
            .map(|r| r[col].parse::<f64>().unwrap())
            .sum::<f64>()
    };
    let (by_layer, by_op) = (self_sum(&layers, 4), self_sum(&ops, 3));
    assert!(
        (by_layer - by_op).abs() <= 1e-3 * by_op + 0.01,
        "layers {by_layer} ms, ops {by_op} ms"
    );

    // Sampled stacks (pprof): categories with counts whose shares sum to one. This run is
    // a fraction of a CPU-second, so it holds only a few samples; what each stack is
    // attributed to is tested in trident-train's `sampler` unit tests.
    let text = std::fs::read_to_string(dir.join("samples.csv")).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("category,samples,share,top_symbol"));
    let rows: Vec<(String, u64, f64)> = lines
        .map(|l| {
            // "category",samples,share,"top symbol"
            let (cat, rest) = l[1..].split_once("\",").unwrap();
            let mut f = rest.splitn(3, ',');
            let n = f.next().unwrap().parse().unwrap();
            let share = f.next().unwrap().parse().unwrap();
            (cat.to_string(), n, share)
        })
        .collect();
    let total: u64 = rows.iter().map(|r| r.1).sum();
    if total > 0 {
        let shares: f64 = rows.iter().map(|r| r.2).sum();
        assert!((shares - 1.0).abs() < 1e-3, "{rows:?}");
    }
    let summary = std::fs::read_to_string(dir.join("summary.txt")).unwrap();
    assert!(summary.contains("measured by:"), "{summary}");
    assert!(
        summary.contains(&format!("sampled ({total} samples)")),
        "{summary}"
    );

    // The Chrome trace: complete events, every phase and step, kernels inside steps.
    let trace: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("trace.json")).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    assert!(events
        .iter()
        .all(|e| e["ph"] == "X" && e["ts"].is_number() && e["dur"].is_number()));
    let names: std::collections::HashSet<&str> = events.iter().map(|e| e["name"].as_str().unwrap()).collect();
    for want in ["data", "forward", "backward", "optimizer", "other", "step 1"] {
        assert!(names.contains(want), "{want} missing from the trace");
    }
    let step1 = events.iter().find(|e| e["name"] == "step 1").unwrap();
    let (s0, s1) = (
        step1["ts"].as_f64().unwrap(),
        step1["ts"].as_f64().unwrap() + step1["dur"].as_f64().unwrap(),
    );
    let first_linear = events
        .iter()
        .filter(|e| e["name"] == "linear")
        .map(|e| e["ts"].as_f64().unwrap())
        .fold(f64::INFINITY, f64::min);
    assert!(
        first_linear >= s0 && first_linear <= s1,
        "the first kernel runs inside step 1"
    );

    // The system monitor: samples per core and a heat map.
    let monitor = csv(&dir.join("monitor.csv"));
    assert!(
        monitor[0][0] == "t_s" && monitor[0][1] == "cpu0",
        "{:?}",
        monitor[0]
    );
    assert!(std::fs::read(dir.join("cpu_heatmap.png"))
        .unwrap()
        .starts_with(b"\x89PNG"));

    // A window: only steps 2 and 3.
    let f = config(d, "window");
    ok_log(&trident(&["train", "--config", &f, "--profile-steps", "2..3"], d));
    let steps = csv(&d.join("window/profile/steps.csv"));
    assert_eq!(
        steps[1..].iter().map(|r| r[0].as_str()).collect::<Vec<_>>(),
        ["2", "3"]
    );
    let trace: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("window/profile/trace.json")).unwrap()).unwrap();
    let step_names: Vec<&str> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["cat"] == "step")
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(step_names, ["step 2", "step 3"]);

    let err = common::failed(&trident(&["train", "--config", &f, "--profile-steps", "3..2"], d));
    assert!(err.contains("the first step is after the last"), "{err}");
}
