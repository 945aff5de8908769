//! Replays every input the fuzzers were seeded with (`fuzz/seeds/<target>/`) and every
//! crash they found (`fuzz/regressions/<target>/`, kept after the fix) through the same
//! harnesses, so the normal suite guards them without a nightly toolchain.

use std::path::PathBuf;

fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut found = Vec::new();
    for kind in ["seeds", "regressions"] {
        let Ok(dir) = std::fs::read_dir(root.join(kind).join(target)) else {
            continue;
        };
        for entry in dir.filter_map(Result::ok) {
            let path = entry.path();
            found.push((path.clone(), std::fs::read(&path).unwrap()));
        }
    }
    found.sort();
    found
}

fn replay(target: &str, run: impl Fn(&[u8])) {
    let inputs = inputs(target);
    assert!(!inputs.is_empty(), "no seeds for {target} in fuzz/seeds/{target}");
    for (path, data) in inputs {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&data)));
        assert!(result.is_ok(), "{} panicked", path.display());
    }
}

#[test]
fn codec_json() {
    replay("codec_json", |d| trident_fuzz::codec(d, None));
}

#[test]
fn codec_binary() {
    replay("codec_binary", |d| {
        if let [a, b, body @ ..] = d {
            trident_fuzz::codec(body, Some(u16::from_le_bytes([*a, *b]) as usize));
        }
    });
}

#[test]
fn config_pbtxt() {
    replay("config_pbtxt", trident_fuzz::config);
}

#[test]
fn bytes_tensor() {
    replay("bytes_tensor", trident_fuzz::bytes_tensor);
}

#[test]
fn checkpoint() {
    replay("checkpoint", trident_fuzz::checkpoint);
}
