//! `trident recommend` end to end: it starts `trident serve` for each candidate on a copy
//! of the `simple` fixture, measures it, ranks, and writes `config.recommended.pbtxt`.

use std::path::Path;
use std::process::Command;

#[test]
fn recommend_measures_candidates_and_writes_the_best_config() {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models/simple");
    trident_bench::recommend::copy_dir(&fixtures, &dir.path().join("simple")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_trident"))
        .args(["recommend", "--model-repository"])
        .arg(dir.path())
        .args([
            "-m",
            "simple",
            "--p99-ms",
            "1000",
            "--price-per-hour",
            "1",
            "--target-rps",
            "100000",
        ])
        .args([
            "--queue-delays",
            "100",
            "--preferred-batch-sizes",
            "2,64",
            "--engines",
            "tract",
            "--instances",
            "1,2",
            "--max-concurrency",
            "2",
        ])
        .args(["--measurement-interval", "200", "--max-trials", "2"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // Batching off and on at one instance, then the preferred size (64 is above the
    // model's max_batch_size 8 and is skipped) if batching was kept, then the undominated
    // ones at two instances.
    assert!(stdout.contains("tract, no batching, 1 instance(s)"), "{stdout}");
    assert!(
        stdout.contains("tract, batching 100us, 1 instance(s)"),
        "{stdout}"
    );
    assert!(stdout.contains("2 instance(s)"), "{stdout}");
    assert!(!stdout.contains("preferred 64"), "{stdout}");
    let batching_kept = stderr.contains("measuring tract, batching 100us, 2 instance(s)")
        || stderr.contains("measuring tract, batching 100us (preferred 2), 2 instance(s)");
    assert_eq!(
        stdout.contains("batching 100us (preferred 2), 1 instance(s)"),
        stderr.contains("measuring tract, batching 100us (preferred 2), 1 instance(s)")
    );
    if batching_kept {
        assert!(stdout.contains("(preferred 2)"), "{stdout}\n{stderr}");
    }
    let best = stdout
        .lines()
        .find(|l| l.starts_with("best: "))
        .expect("a best line");
    let written = std::fs::read_to_string(dir.path().join("simple/config.recommended.pbtxt")).unwrap();
    assert!(
        written.contains("instance_group") && written.contains("name: \"simple\""),
        "{written}"
    );
    assert!(written.contains("string_value: \"tract\""), "{written}");
    assert_eq!(
        best.contains("no batching"),
        !written.contains("dynamic_batching"),
        "{best}\n{written}"
    );
    // The original is untouched.
    let original = std::fs::read_to_string(dir.path().join("simple/config.pbtxt")).unwrap();
    assert_eq!(
        original,
        std::fs::read_to_string(fixtures.join("config.pbtxt")).unwrap()
    );

    let bad = Command::new(env!("CARGO_BIN_EXE_trident"))
        .args(["recommend", "--model-repository"])
        .arg(dir.path())
        .args(["-m", "simple", "--p99-ms", "0"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--p99-ms 0"));
}
