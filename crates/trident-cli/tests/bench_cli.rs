//! `trident bench` as a user runs it, against a `trident serve` process on port 0: the
//! model's metadata from a file (as for TorchServe) instead of the server, and the errors
//! for a bad metadata file and for an unknown model.

use std::path::Path;
use std::process::{Command, Output};
use trident_bench::recommend::ServeProcess;

/// Serves the `simple` fixture; returns the process and its `host:port`.
fn serve() -> (ServeProcess, String) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models");
    let server = ServeProcess::spawn(Path::new(env!("CARGO_BIN_EXE_trident")), &repo).unwrap();
    let addr = server.url.trim_start_matches("http://").to_string();
    (server, addr)
}

fn bench(addr: &str, model: &str, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_trident"))
        .args(["bench", "-u", addr, "-m", model, "--concurrency-range", "1"])
        .args([
            "--measurement-interval",
            "200",
            "--warmup",
            "0.1",
            "--max-trials",
            "2",
        ])
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn metadata_from_a_file_drives_the_load() {
    let (_server, addr) = serve();
    let dir = tempfile::tempdir().unwrap();
    let meta = dir.path().join("meta.json");
    std::fs::write(
        &meta,
        r#"{"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
                       {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]}],
            "outputs": [], "max_batch_size": 8}"#,
    )
    .unwrap();
    let json = dir.path().join("r.json");
    let out = bench(
        &addr,
        "simple",
        &[
            "--model-metadata",
            meta.to_str().unwrap(),
            "--encoding",
            "json",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let row = &report["rows"][0];
    assert!(row["latency"]["count"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(row["latency"]["errors"].as_u64(), Some(0), "{report}");

    // Metadata that does not match the model: the server refuses the first request and the
    // error says so.
    std::fs::write(
        &meta,
        r#"{"inputs": [{"name": "WRONG", "datatype": "INT32", "shape": [-1, 16]}], "max_batch_size": 8}"#,
    )
    .unwrap();
    let out = bench(&addr, "simple", &["--model-metadata", meta.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("a first request to model `simple` failed"),
        "{stderr}"
    );

    // A file that is not JSON is named in the error.
    std::fs::write(&meta, "inputs: x").unwrap();
    let out = bench(&addr, "simple", &["--model-metadata", meta.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("meta.json: not JSON"), "{stderr}");

    // Without the file, an unknown model's 404 points at --model-metadata.
    let out = bench(&addr, "nope", &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("--model-metadata"), "{stderr}");
}
