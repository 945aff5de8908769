//! Helpers shared by the CLI's end-to-end tests.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::Path;
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
