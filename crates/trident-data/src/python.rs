//! Where pip installed things, found without starting Python: the folders a `python3`
//! started here would import packages from, and the environments' prefixes. The server
//! finds ONNX Runtime's library this way, and the dense layers Intel MKL's (used on Intel
//! CPUs, or with `TRIDENT_BLAS=mkl`).

use std::path::{Path, PathBuf};

/// The installation prefixes of the Python environments [`package_dirs`] searches, in
/// its order (`$VIRTUAL_ENV`, `$TRIDENT_PYTHON_ENV` at run time and at build time, the
/// user's `~/.local`, then each `python3` on `PATH`) (pip puts a package's data files, such as `mkl`'s libraries, in `<prefix>/lib`).
pub fn prefixes() -> Vec<PathBuf> {
    let mut prefixes: Vec<PathBuf> = Vec::new();
    if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
        prefixes.push(venv.into());
    }
    // An environment named for Trident: at run time, or when the binary was built
    // (`scripts/quickstart` builds in the project's `.venv`, where it put onnxruntime, so the
    // installed `trident` finds it from any shell).
    if let Some(env) = std::env::var_os("TRIDENT_PYTHON_ENV") {
        prefixes.push(env.into());
    }
    if let Some(env) = option_env!("TRIDENT_PYTHON_ENV").filter(|e| !e.is_empty()) {
        prefixes.push(env.into());
    }
    if let Some(home) = std::env::var_os("HOME") {
        prefixes.push(Path::new(&home).join(".local"));
    }
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        let exe = dir.join("python3");
        if !exe.is_file() {
            continue;
        }
        // pyenv: `python3` is a shim script in $PYENV_ROOT/shims; the interpreter it runs
        // is $PYENV_ROOT/versions/<v>, <v> from $PYENV_VERSION or the root's `version`
        // file (a directory's own `.python-version` is not read).
        if dir.ends_with("shims") {
            if let Some(root) = dir.parent().filter(|r| r.join("versions").is_dir()) {
                let chosen = std::env::var("PYENV_VERSION")
                    .ok()
                    .or_else(|| std::fs::read_to_string(root.join("version")).ok())
                    .unwrap_or_default();
                for v in chosen.split([':', '\n']).map(str::trim).filter(|v| !v.is_empty()) {
                    prefixes.push(root.join("versions").join(v));
                }
            }
        }
        // A venv's bin/python3 links to the base interpreter; both prefixes count.
        let real = std::fs::canonicalize(&exe).ok();
        for e in std::iter::once(exe).chain(real) {
            if let Some(prefix) = e.parent().and_then(Path::parent) {
                prefixes.push(prefix.to_path_buf());
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    prefixes.retain(|p| seen.insert(p.clone()));
    prefixes
}

/// The folders Python packages are installed into, in the order a `python3` started here
/// would look (a virtual environment first, then the user's site, then each interpreter's
/// own), without starting one: `lib/python3.*/{site,dist}-packages` under `$VIRTUAL_ENV`,
/// `~/.local` and the prefix of every `python3` on `PATH` (as found, and with its links
/// followed; for a pyenv shim, the version pyenv would run), and Debian's
/// `/usr/lib/python3/dist-packages`.
pub fn package_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for prefix in prefixes() {
        let mut versions = entries_named(&prefix.join("lib"), "python3");
        versions.sort();
        for v in versions.into_iter().rev() {
            dirs.push(v.join("site-packages"));
            dirs.push(v.join("dist-packages"));
        }
    }
    dirs.push("/usr/lib/python3/dist-packages".into());
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

/// The entries of `dir` whose names start with `prefix` (none when it cannot be read).
pub fn entries_named(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .collect()
}
