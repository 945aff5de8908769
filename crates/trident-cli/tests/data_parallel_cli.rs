//! `trident train --data-parallel N` and `--dist mpi` end to end, on a BiLSTM over the
//! reviews made here (no dropout, no batch statistics: a model whose gradient over a batch
//! is the mean of its examples', so data parallelism must reproduce one process exactly,
//! up to the order of floating-point sums).

mod common;
use common::{epoch_records, failed, ok, ok_log, reviews_data, tiny_bert, trident, write_texts};

use std::collections::HashMap;
use std::path::Path;

fn config(d: &Path, run: &str, batch: usize, epochs: u64) -> String {
    let cfg = format!(
        r#"
[run]
dir = "{run}"
seed = 5
{reviews}[loader]
batch_size = {batch}
[model]
kind = "lstm"
tokenizer = "{tok}"
embed = 16
hidden = 16
[train]
epochs = {epochs}
lr = 1e-2
max_grad_norm = 1.0
"#,
        reviews = reviews_data("reviews.tsv"),
        tok = tiny_bert().join("tokenizer.json").display(),
    );
    let f = format!("{run}.toml");
    std::fs::write(d.join(&f), cfg).unwrap();
    f
}

fn weights(path: &Path) -> HashMap<String, Vec<f32>> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, t)| {
            let v = t
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (name, v)
        })
        .collect()
}

/// Largest absolute difference between two checkpoints' weights, and the largest weight.
fn max_diff(a: &Path, b: &Path) -> (f32, f32) {
    let (a, b) = (weights(a), weights(b));
    assert_eq!(
        a.keys().collect::<std::collections::BTreeSet<_>>(),
        b.keys().collect()
    );
    let mut d = 0f32;
    let mut big = 0f32;
    for (k, va) in &a {
        for (x, y) in va.iter().zip(&b[k]) {
            d = d.max((x - y).abs());
            big = big.max(x.abs());
        }
    }
    (d, big)
}

#[test]
fn two_replicas_of_batch_4_train_like_one_process_of_batch_8() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write_texts(d);
    let one = config(d, "one", 8, 2);
    ok(&trident(&["train", "--config", &one], d));
    let two = config(d, "two", 4, 2);
    let log = ok_log(&trident(&["train", "--config", &two, "--data-parallel", "2"], d));
    assert!(
        log.contains("2 replicas") && log.contains("global batch 8"),
        "{log}"
    );
    // Same number of optimizer steps, the same data per step: the weights agree to float
    // rounding (summing two half-batch gradients instead of one batch's changes the last
    // bits, and the AdamW steps carry that along).
    let steps = |run: &str| -> Vec<u64> {
        epoch_records(&d.join(run))
            .iter()
            .map(|r| r["step"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(steps("one"), steps("two"));
    // Validation is shared among the replicas (every other batch each) and gathered: the
    // same figures as one process's.
    let val = |run: &str| -> Vec<(f64, f64)> {
        epoch_records(&d.join(run))
            .iter()
            .map(|v| {
                (
                    v["val_accuracy"].as_f64().unwrap(),
                    v["val_loss"].as_f64().unwrap(),
                )
            })
            .collect()
    };
    for ((a1, l1), (a2, l2)) in val("one").into_iter().zip(val("two")) {
        assert_eq!(a1, a2);
        assert!((l1 - l2).abs() < 1e-5, "val loss {l1} vs {l2}");
    }
    let (diff, big) = max_diff(
        &d.join("one/last/model.safetensors"),
        &d.join("two/last/model.safetensors"),
    );
    assert!(big > 0.05, "weights are not all ~0");
    eprintln!(
        "one vs two replicas: max abs diff {diff} after {} optimizer steps (largest weight {big})",
        steps("two").last().unwrap()
    );
    assert!(diff <= 5e-6, "max |one - two| = {diff}");
    // …and differ from a run that saw other batches (the comparison can fail).
    let other = config(d, "other", 4, 2);
    ok(&trident(&["train", "--config", &other], d));
    let (diff_other, _) = max_diff(
        &d.join("one/last/model.safetensors"),
        &d.join("other/last/model.safetensors"),
    );
    assert!(diff_other > 100.0 * diff.max(1e-7), "{diff_other} vs {diff}");

    // Only rank 0 wrote the run directory, and it reports like a lone run.
    for f in [
        "metrics.jsonl",
        "test/metrics.json",
        "report.json",
        "best/model.safetensors",
    ] {
        assert!(d.join("two").join(f).is_file(), "{f}");
    }
}

#[test]
fn an_interrupted_data_parallel_run_resumes_to_the_same_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write_texts(d);
    let full = config(d, "full", 4, 2);
    ok(&trident(&["train", "--config", &full, "--data-parallel", "2"], d));
    let cut = config(d, "cut", 4, 2);
    let out = trident(
        &[
            "train",
            "--config",
            &cut,
            "--data-parallel",
            "2",
            "--stop-after-steps",
            "7",
        ],
        d,
    );
    let log = ok_log(&out);
    assert!(log.contains("resume with"), "{log}");
    ok(&trident(
        &["train", "--config", &cut, "--data-parallel", "2", "--resume"],
        d,
    ));
    let (diff, _) = max_diff(
        &d.join("full/last/model.safetensors"),
        &d.join("cut/last/model.safetensors"),
    );
    assert_eq!(diff, 0.0, "resumed data-parallel run differs");
}

#[test]
fn bad_data_parallel_requests_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write_texts(d);
    let f = config(d, "r", 4, 1);
    let e = failed(&trident(&["train", "--config", &f, "--data-parallel", "0"], d));
    assert!(e.contains("--data-parallel must be at least 1"), "{e}");
    let e = failed(&trident(
        &["train", "--config", &f, "--data-parallel", "2", "--dist", "mpi"],
        d,
    ));
    assert!(e.contains("cannot be used with"), "{e}");
}

/// The same run as two MPI processes gives the same weights as two replicas on threads:
/// both sum rank 0's and rank 1's gradients, in that order.
#[cfg(feature = "mpi")]
#[test]
fn two_mpi_ranks_match_two_replicas_on_threads() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write_texts(d);
    let threads = config(d, "threads", 4, 1);
    ok(&trident(
        &["train", "--config", &threads, "--data-parallel", "2"],
        d,
    ));
    let mpi = config(d, "mpi", 4, 1);
    let out = std::process::Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
        .arg(env!("CARGO_BIN_EXE_trident"))
        .args(["train", "--config", &mpi, "--dist", "mpi"])
        .current_dir(d)
        .output()
        .unwrap();
    let log = ok_log(&out);
    assert!(log.contains("2 MPI ranks"), "{log}");
    let (diff, _) = max_diff(
        &d.join("threads/last/model.safetensors"),
        &d.join("mpi/last/model.safetensors"),
    );
    eprintln!("threads vs MPI: max abs diff {diff}");
    assert!(diff <= 1e-6, "threads vs MPI: {diff}");
}

/// The optimizer moments of a whole (unsharded) checkpoint, per parameter.
fn moments(ck: &Path) -> HashMap<String, Vec<f32>> {
    weights(&ck.join("optimizer.safetensors"))
}

#[test]
fn zero_1_trains_like_unsharded_data_parallelism_and_resumes_on_other_world_sizes() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write_texts(d);
    // Small buckets, so parameters straddle bucket and shard boundaries.
    let run = |name: &str, extra: &[&str]| {
        let f = config(d, name, 4, 2);
        let mut a = vec!["train", "--config", f.as_str(), "--bucket-mb", "0.002"];
        a.extend_from_slice(extra);
        ok_log(&trident(&a, d))
    };
    run("ddp", &["--data-parallel", "2"]);
    let log = run("zero", &["--data-parallel", "2", "--zero", "1"]);
    assert!(log.contains("ZeRO-1: rank 0 updates"), "{log}");
    // Each rank holds half of AdamW's two moments.
    let line = log.lines().find(|l| l.starts_with("ZeRO-1")).unwrap();
    let pct: f64 = line
        .rsplit('(')
        .next()
        .unwrap()
        .trim_end_matches(" %)")
        .parse()
        .unwrap();
    assert!((pct - 50.0).abs() < 1.0, "{line}");
    let (diff, _) = max_diff(
        &d.join("ddp/last/model.safetensors"),
        &d.join("zero/last/model.safetensors"),
    );
    eprintln!("ZeRO-1 vs unsharded: max abs weight diff {diff}");
    assert!(diff <= 5e-6, "ZeRO-1 vs unsharded: {diff}");
    assert!(!d.join("zero/last/optimizer.safetensors").exists());
    for r in 0..2 {
        assert!(d
            .join(format!("zero/last/optimizer-shard-{r:03}-of-002.safetensors"))
            .is_file());
    }

    // Interrupted at step 7 with two ranks; the shards reassemble for three ranks, for one
    // process, and for two ranks again (exactly the uninterrupted run).
    for (name, resume) in [
        ("z3", vec!["--data-parallel", "3", "--zero", "1"]),
        ("z1", vec![]),
        ("z2", vec!["--data-parallel", "2", "--zero", "1"]),
    ] {
        let log = run(
            name,
            &["--data-parallel", "2", "--zero", "1", "--stop-after-steps", "7"],
        );
        assert!(log.contains("resume with"), "{log}");
        let mut a = vec!["--resume"];
        a.extend(resume);
        run(name, &a);
        let state: serde_json::Value =
            serde_json::from_slice(&std::fs::read(d.join(name).join("last/state.json")).unwrap()).unwrap();
        assert_eq!(state["finished"], true, "{name}");
    }
    let (diff, _) = max_diff(
        &d.join("zero/last/model.safetensors"),
        &d.join("z2/last/model.safetensors"),
    );
    assert_eq!(diff, 0.0, "ZeRO-1 resumed on the same world size");
    // A one-process run wrote the whole state again; it is a plain checkpoint.
    assert!(moments(&d.join("z1/last")).keys().any(|k| k.starts_with("m.")));
}

/// A CNN with batch norm: each replica normalises over its own part of the batch (as
/// PyTorch's DDP without SyncBatchNorm), so the replicas' running statistics differ; rank
/// 0's are given to every replica before evaluation and checkpoints, which then pass the
/// replica check.
#[test]
fn a_batch_norm_cnn_trains_data_parallel() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    common::write_top_bottom_images(d);
    std::fs::write(
        d.join("cnn.toml"),
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
[loader]
batch_size = 8
[model]
kind = "cnn"
width = 4
[train]
epochs = 2
lr = 1e-2
checkpoint_every = 3
"#,
    )
    .unwrap();
    ok(&trident(
        &[
            "train",
            "--config",
            "cnn.toml",
            "--data-parallel",
            "2",
            "--zero",
            "1",
        ],
        d,
    ));
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("cnn/test/metrics.json")).unwrap()).unwrap();
    let acc = m["report"]["accuracy"].as_f64().unwrap();
    assert!(acc >= 0.9, "accuracy {acc}");
}

/// Ranks started with different configurations (here another learning rate on rank 1,
/// through mpirun's MPMD syntax) refuse to train, naming the rank that differs.
#[cfg(feature = "mpi")]
#[test]
fn mpi_ranks_with_different_configurations_are_refused_at_the_start() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write_texts(d);
    let a = config(d, "same", 4, 1);
    std::fs::write(
        d.join("other.toml"),
        std::fs::read_to_string(d.join(&a))
            .unwrap()
            .replace("lr = 1e-2", "lr = 2e-2"),
    )
    .unwrap();
    let bin = env!("CARGO_BIN_EXE_trident");
    let t0 = std::time::Instant::now();
    let out = std::process::Command::new("mpirun")
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            "1",
            bin,
            "train",
            "--config",
            &a,
            "--dist",
            "mpi",
        ])
        .args([
            ":",
            "-np",
            "1",
            bin,
            "train",
            "--config",
            "other.toml",
            "--dist",
            "mpi",
        ])
        .current_dir(d)
        .output()
        .unwrap();
    let err = failed(&out);
    assert!(
        err.contains("the configuration (hash) differs") && err.contains("rank 1 has"),
        "{err}"
    );
    assert!(t0.elapsed() < std::time::Duration::from_secs(60));
    assert!(!d.join("same/last").exists(), "nothing was trained");
}

/// `trident distill --data-parallel 2`: each replica runs its own frozen teacher on its part
/// of the batch (online), or reads the cache rank 0 filled (cached); the student's weights
/// agree with one process distilling the global batch.
#[test]
fn distillation_runs_data_parallel_online_and_cached() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write_texts(d);
    let teacher = config(d, "teacher", 8, 2);
    ok(&trident(&["train", "--config", &teacher], d));
    let student = |run: &str, batch: usize, mode: &str| {
        let f = config(d, run, batch, 1);
        let text = std::fs::read_to_string(d.join(&f)).unwrap().replace("hidden = 16", "hidden = 8")
            + &format!(
                "[distill]\nteacher = \"teacher/best\"\nmode = \"{mode}\"\n[distill.loss]\nkind = \"soft\"\ntemperature = 2.0\nalpha = 0.5\n"
            );
        std::fs::write(d.join(&f), text).unwrap();
        f
    };
    let one = student("one", 8, "online");
    ok(&trident(&["distill", "--config", &one], d));
    let two = student("two", 4, "online");
    let log = ok_log(&trident(
        &["distill", "--config", &two, "--data-parallel", "2"],
        d,
    ));
    assert!(log.contains("2 replicas") && log.contains("(rank 0)"), "{log}");
    let (diff, _) = max_diff(
        &d.join("one/last/model.safetensors"),
        &d.join("two/last/model.safetensors"),
    );
    eprintln!("distill one vs two replicas: max abs diff {diff}");
    assert!(diff <= 5e-6, "{diff}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("two/report.json")).unwrap()).unwrap();
    assert!(
        report["distill"]["teacher"]["params"].as_u64().unwrap() > 0,
        "{report}"
    );

    let cached = student("cached", 4, "cached");
    let log = ok_log(&trident(
        &["distill", "--config", &cached, "--data-parallel", "2"],
        d,
    ));
    assert!(
        log.contains("teacher: 0 batches run during training"),
        "the cache rank 0 filled serves every replica: {log}"
    );
}
