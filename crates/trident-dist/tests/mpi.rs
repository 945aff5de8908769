//! The Open MPI backend under `mpirun` (feature `mpi`): the conformance suite on 2 and 3
//! processes, and the failure drills: a rank that hangs, calls a different collective, or
//! dies stops the job within the timeout, with an error naming it.
#![cfg(feature = "mpi")]

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// The example binary cargo built beside this test.
fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    dir.join("examples").join("mpi_conformance")
}

fn mpirun(np: usize, extra: &[&str]) -> (bool, String, Duration) {
    let t0 = Instant::now();
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", &np.to_string()])
        .arg(example())
        .args(extra)
        .output()
        .expect("mpirun runs (apt install openmpi-bin)");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text, t0.elapsed())
}

#[test]
fn conformance_on_two_and_three_processes() {
    for np in [2, 3] {
        let (ok, text, _) = mpirun(np, &[]);
        assert!(ok, "{text}");
        for r in 0..np {
            assert!(
                text.contains(&format!("rank {r} of {np}: conformance passed")),
                "{text}"
            );
        }
    }
}

#[test]
fn a_hung_rank_stops_the_job_within_the_timeout_and_is_named() {
    let (ok, text, took) = mpirun(3, &["--timeout", "3", "--hang", "1"]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("timed out after 3.0 s waiting for rank 1 "),
        "{text}"
    );
    // The hung rank sleeps 12 s; the job ends at the timeout, not then.
    assert!(took < Duration::from_secs(11), "{took:?}\n{text}");
}

#[test]
fn a_mismatched_call_names_both_ranks() {
    let (ok, text, _) = mpirun(2, &["--timeout", "30", "--mismatch", "1"]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("ranks disagree")
            && text.contains("all_reduce of 5 values")
            && text.contains("all_reduce of 4 values"),
        "{text}"
    );
}

#[test]
fn a_dead_rank_stops_the_job() {
    let (ok, text, took) = mpirun(3, &["--timeout", "30", "--die", "1"]);
    assert!(!ok, "{text}");
    // mpirun itself notices the exit and names the process.
    assert!(text.contains("rank 1"), "{text}");
    assert!(took < Duration::from_secs(25), "{took:?}");
}
