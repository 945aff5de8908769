//! Faults during `trident train`, end to end on the tiny BERT of `common`:
//!
//! - `kill -9` at seeded-random moments and inside checkpoint writes, then `--resume` until
//!   the run completes: the weights equal an uninterrupted run's, bit for bit;
//! - a truncated or damaged checkpoint file is named on `--resume`, `trident eval` and
//!   `trident predict` (an error, not a panic);
//! - a full disk during a checkpoint write: a clear error naming the checkpoint and the OS
//!   error, the previous checkpoint intact and resumable once there is space again.

mod common;
use common::{assert_same_checkpoints, epoch_records, failed, ok, text_config, trident, write_texts};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The reviews config of `common` with a run long enough to kill at random moments (12
/// epochs of 4 optimizer steps) and the `last` checkpoint written after every step.
fn fault_config(dir: &Path, data: &Path, run: &str, epochs: u64) -> PathBuf {
    let cfg = text_config(dir, data, run, "");
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(text.contains("epochs = 3\n"), "common::text_config changed");
    let text = text.replace(
        "epochs = 3\n",
        &format!("epochs = {epochs}\ncheckpoint_every = 1\n"),
    );
    std::fs::write(&cfg, text).unwrap();
    cfg
}

/// `train --config cfg --run-dir run`.
fn train_args<'a>(cfg: &'a Path, run: &'a Path) -> Vec<&'a str> {
    vec![
        "train",
        "--config",
        cfg.to_str().unwrap(),
        "--run-dir",
        run.to_str().unwrap(),
    ]
}

/// `trident train --config cfg --run-dir run [--resume] extra…`, not yet waited for.
fn spawn_train(cfg: &Path, run: &Path, resume: bool, extra: &[&str], log: &Path) -> Child {
    let mut args = train_args(cfg, run);
    if resume {
        args.push("--resume");
    }
    args.extend(extra);
    Command::new(env!("CARGO_BIN_EXE_trident"))
        .args(&args)
        .current_dir(cfg.parent().unwrap())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("run trident")
}

/// `trident train` on `run` to its end, as [`common::trident`] does.
fn train(cfg: &Path, run: &Path, extra: &[&str]) -> Output {
    let mut args = train_args(cfg, run);
    args.extend(extra);
    trident(&args, cfg.parent().unwrap())
}

/// Names in `dir` starting with `prefix` (none when `dir` does not exist yet).
fn entries(dir: &Path, prefix: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// A seeded generator (SplitMix64) for the kill delays: a failing seed reruns the same plan.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// When to kill one attempt.
#[derive(Debug, Clone, Copy)]
enum Kill {
    /// This long after the start.
    After(Duration),
    /// As soon as this process's `.last.<prefix><pid>` appears: `tmp-` is a checkpoint being
    /// written, `old-` one being swapped in (leftovers of earlier kills have other pids).
    OnSight(&'static str),
}

/// What one attempt came to.
#[derive(Debug)]
enum Outcome {
    /// Killed; `inside` names the temporary directory the killed process left, if any.
    Killed { inside: Option<String> },
    /// The run finished before the kill.
    Finished,
}

/// Runs one attempt on `run` (resuming when there is a checkpoint) and kills it as `kill` says.
fn attempt(cfg: &Path, run: &Path, kill: Kill, log: &Path) -> Outcome {
    // `last` or, killed between the two renames of a swap, the old checkpoint moved aside
    // (the trainer puts it back): either way there is a checkpoint to resume from.
    let resume = run.join("last/state.json").exists() || !entries(run, ".last.old-").is_empty();
    let mut child = spawn_train(cfg, run, resume, &[], log);
    let pid = child.id();
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let err = std::fs::read_to_string(log).unwrap_or_default();
            assert!(status.success(), "trident train failed: {status}\n{err}");
            return Outcome::Finished;
        }
        let now = match kill {
            Kill::After(d) => started.elapsed() >= d,
            Kill::OnSight(prefix) => run.join(format!(".last.{prefix}{pid}")).exists(),
        };
        if now {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{kill:?}: the run neither finished nor reached the kill"
        );
        match kill {
            Kill::After(_) => std::thread::sleep(Duration::from_micros(200)),
            Kill::OnSight(_) => std::thread::yield_now(),
        }
    }
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    if status.success() {
        return Outcome::Finished; // it exited between the last look and the kill
    }
    Outcome::Killed {
        inside: [".last.tmp-", ".last.old-"]
            .map(|p| format!("{p}{pid}"))
            .into_iter()
            .find(|n| run.join(n).exists()),
    }
}

#[test]
fn killed_at_random_moments_and_inside_checkpoint_writes_then_resumed_equals_an_uninterrupted_run() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let data = write_texts(d);
    let cfg = fault_config(d, &data, "faults", 12);
    let t0 = Instant::now();
    ok(&train(&cfg, &d.join("whole"), &[]));
    let whole = t0.elapsed();

    // The plan: kills at random moments of a run (the start-up, a step, a checkpoint write,
    // the evaluation, the end), and kills aimed at checkpoint writes: the first one at the
    // fresh run's first checkpoint (so there is none to resume from), the next ones in
    // resumed runs. A random kill comes at most 0.35 of an uninterrupted run after the start.
    let seed = std::env::var("TRIDENT_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(17u64);
    let mut rng = Rng(seed);
    let mut random = || Kill::After(whole.mul_f64(0.02 + 0.33 * rng.unit()));
    let plan = [
        Kill::OnSight("tmp-"),
        random(),
        Kill::OnSight("tmp-"),
        random(),
        Kill::OnSight("old-"),
        random(),
        random(),
        Kill::OnSight("tmp-"),
        random(),
        random(),
        random(),
    ];
    eprintln!("uninterrupted run {whole:.2?}; seed {seed} (TRIDENT_FAULT_SEED): {plan:?}");
    let run = d.join("killed");
    let (mut killed, mut inside_writes, mut steps_seen) = (0, 0, Vec::new());
    for (i, kill) in plan.iter().enumerate() {
        let log = d.join(format!("attempt-{i}.log"));
        match attempt(&cfg, &run, *kill, &log) {
            Outcome::Finished => {
                eprintln!("attempt {i} ({kill:?}): the run finished first");
                break;
            }
            Outcome::Killed { inside } => {
                killed += 1;
                let step = std::fs::read(run.join("last/state.json"))
                    .ok()
                    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                    .and_then(|s| s["optimizer_step"].as_u64());
                eprintln!("attempt {i} ({kill:?}): killed; last/ at step {step:?}, left {inside:?}");
                if inside.as_deref().is_some_and(|n| n.starts_with(".last.tmp-")) {
                    inside_writes += 1;
                }
                steps_seen.push(step);
            }
        }
    }
    // Then resume to the end; a leftover of the last kill is cleaned up on the way.
    ok(&train(&cfg, &run, &["--resume"]));
    assert!(
        killed >= 4,
        "only {killed} of the kills landed before the run finished"
    );
    assert!(
        inside_writes >= 2,
        "{inside_writes} kills landed inside a checkpoint write (left its temporary directory \
         behind): the two aimed at the first ones should have"
    );
    assert!(
        steps_seen.iter().any(|s| s.is_some_and(|s| s > 0)),
        "no kill came after a checkpoint: {steps_seen:?}"
    );
    assert_same_checkpoints(&d.join("whole"), &run);
    let losses = |run: &Path| -> Vec<f64> {
        epoch_records(run)
            .iter()
            .map(|r| r["train_loss"].as_f64().unwrap())
            .collect()
    };
    assert_eq!(losses(&d.join("whole")), losses(&run));
    let left: Vec<_> = [".last.", ".best."]
        .iter()
        .flat_map(|p| entries(&run, p))
        .collect();
    assert!(left.is_empty(), "leftovers of killed writes: {left:?}");

    // Killed between the two renames of a swap (`last` moved aside, the new one not yet in
    // its place): the window is a few microseconds wide, so it is made here by hand, as the
    // kill would leave it. `--resume` puts the old checkpoint back and goes on.
    let parts = d.join("swap");
    ok(&train(&cfg, &parts, &["--stop-after-steps", "5"]));
    std::fs::rename(parts.join("last"), parts.join(".last.old-4242")).unwrap();
    std::fs::create_dir(parts.join(".last.tmp-4242")).unwrap();
    let log = common::ok_log(&train(&cfg, &parts, &["--resume"]));
    assert!(
        log.contains("restored from") && log.contains(".last.old-4242"),
        "{log}"
    );
    assert_same_checkpoints(&d.join("whole"), &parts);
    assert!(entries(&parts, ".last.").is_empty());
}

/// Copies directory `from` to `to`, recursively.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

/// Asserts that `out` is an error (exit status 1, no panic) whose message names `file`.
fn names_file(out: &Output, file: &Path, what: &str) -> String {
    let err = failed(out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{what}: not a clean error exit\n{err}"
    );
    assert!(!err.contains("panicked"), "{what}: panicked\n{err}");
    assert!(
        err.contains(&file.display().to_string()),
        "{what}: the error does not name {}\n{err}",
        file.display()
    );
    err
}

#[test]
fn a_truncated_or_damaged_checkpoint_file_is_named_not_a_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let data = write_texts(d);
    let cfg = text_config(d, &data, "base", "");
    ok(&train(&cfg, &d.join("base"), &["--stop-after-steps", "3"]));

    #[derive(Debug, Clone, Copy)]
    enum Damage {
        /// Cut to half its length.
        Truncate,
        /// Cut to nothing.
        Empty,
        /// One bit of the last byte flipped (for safetensors, in the tensor data).
        Flip,
    }
    // (file, damage, with the manifest: else the checkpoint is made to look like one
    // written before manifests, so the readers of the files themselves must name them).
    let cases = [
        ("model.safetensors", Damage::Truncate, true),
        ("model.safetensors", Damage::Flip, true),
        ("optimizer.safetensors", Damage::Truncate, true),
        ("optimizer.safetensors", Damage::Flip, true),
        ("state.json", Damage::Truncate, true),
        ("manifest.json", Damage::Truncate, true),
        ("model.safetensors", Damage::Truncate, false),
        ("model.safetensors", Damage::Empty, false),
        ("optimizer.safetensors", Damage::Truncate, false),
        ("optimizer.safetensors", Damage::Empty, false),
        ("state.json", Damage::Truncate, false),
        ("state.json", Damage::Empty, false),
    ];
    for (i, (file, damage, manifest)) in cases.into_iter().enumerate() {
        let what = format!(
            "{file} {damage:?}{}",
            if manifest { "" } else { " (no manifest)" }
        );
        let run = d.join(format!("case-{i}"));
        copy_dir(&d.join("base"), &run);
        let ck = run.join("last");
        if !manifest {
            std::fs::remove_file(ck.join("manifest.json")).unwrap();
        }
        let f = ck.join(file);
        let mut bytes = std::fs::read(&f).unwrap();
        match damage {
            Damage::Truncate => bytes.truncate(bytes.len() / 2),
            Damage::Empty => bytes.clear(),
            Damage::Flip => *bytes.last_mut().unwrap() ^= 0x10,
        }
        std::fs::write(&f, bytes).unwrap();

        let err = names_file(
            &train(&cfg, &run, &["--resume"]),
            &f,
            &format!("--resume, {what}"),
        );
        eprintln!(
            "{what}: {}",
            err.lines().find(|l| l.starts_with("Error")).unwrap_or("")
        );
        let model = ck.to_str().unwrap();
        let eval = trident(&["eval", "--model", model], d);
        let predict = trident(&["predict", "--model", model, "the movie was great"], d);
        if matches!(file, "model.safetensors" | "manifest.json") {
            names_file(&eval, &f, &format!("eval, {what}"));
            names_file(&predict, &f, &format!("predict, {what}"));
        } else {
            // The weights are intact: eval and predict, which do not read the optimizer or
            // trainer state, still work.
            ok(&eval);
            ok(&predict);
        }
    }
}

/// How the test makes a checkpoint write fail for lack of space.
enum Disk {
    /// A tmpfs of limited size mounted at this point (needs root / CAP_SYS_ADMIN); a filler
    /// file takes up the space: writes fail with ENOSPC, as on a full disk.
    Tmpfs(PathBuf),
    /// Where mounting is not permitted: the resumed process runs with RLIMIT_FSIZE below
    /// the checkpoint's weights file (`ulimit -f` in `sh`, SIGXFSZ ignored), so writing that
    /// file fails with EFBIG ("File too large"). Not a full disk, but the same failure of a
    /// checkpoint write half-way through a file, through the same error path.
    FileSizeLimit,
}

/// Unmounts the tmpfs when the test ends, passed or failed.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn sh_available() -> bool {
    Command::new("sh")
        .args(["-c", "ulimit -f 100000"])
        .status()
        .is_ok_and(|s| s.success())
}

fn try_mount(at: &Path, size: &str) -> Result<(), String> {
    std::fs::create_dir_all(at).unwrap();
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(at)
        .output()
        .map_err(|e| format!("mount: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// Fills the file system of `filler` up, then frees `room` bytes.
fn fill_leaving(filler: &Path, room: u64) {
    use std::io::Write;
    let mut f = std::fs::File::create(filler).unwrap();
    for chunk in [1 << 16, 1 << 12, 1] {
        let buf = vec![0u8; chunk];
        while f.write_all(&buf).and_then(|_| f.flush()).is_ok() {}
    }
    let len = f.metadata().unwrap().len();
    assert!(len > room, "the file system is smaller than the room to leave");
    f.set_len(len - room).unwrap();
    f.sync_all().unwrap();
}

#[test]
fn a_full_disk_during_a_checkpoint_write_is_a_clear_error_and_keeps_the_previous_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    // A tmpfs where it can be mounted, else a file-size limit, else the test is skipped,
    // saying so. TRIDENT_FAULT_DISK=tmpfs|fsize|none forces a way (to run the fallback, or
    // the skip, where mounting works); TRIDENT_REQUIRE_FAULT_TESTS=1 makes a skip a failure.
    let forced = std::env::var("TRIDENT_FAULT_DISK").ok();
    let mount_at = d.join("disk");
    let disk = match forced.as_deref() {
        Some("fsize") => Ok(Disk::FileSizeLimit),
        Some("tmpfs") => {
            try_mount(&mount_at, "16m").expect("TRIDENT_FAULT_DISK=tmpfs: mount failed");
            Ok(Disk::Tmpfs(mount_at.clone()))
        }
        Some("none") => Err("TRIDENT_FAULT_DISK=none".to_string()),
        _ => match try_mount(&mount_at, "16m") {
            Ok(()) => Ok(Disk::Tmpfs(mount_at.clone())),
            Err(why) if cfg!(unix) && sh_available() => {
                eprintln!("cannot mount a tmpfs ({why}): limiting the file size instead");
                Ok(Disk::FileSizeLimit)
            }
            Err(why) => Err(format!(
                "cannot mount a tmpfs ({why}) and no `sh` to set RLIMIT_FSIZE with"
            )),
        },
    };
    let disk = match disk {
        Ok(disk) => disk,
        Err(why) => {
            let msg = format!("SKIPPED: no way to fill a disk here: {why}");
            assert!(std::env::var_os("TRIDENT_REQUIRE_FAULT_TESTS").is_none(), "{msg}");
            eprintln!("{msg}");
            return;
        }
    };
    let _unmount = matches!(disk, Disk::Tmpfs(_)).then(|| Unmount(mount_at.clone()));
    let data = write_texts(d);
    let cfg = fault_config(d, &data, "disk", 3);
    ok(&train(&cfg, &d.join("whole"), &[]));

    let run = match &disk {
        Disk::Tmpfs(at) => at.join("run"),
        Disk::FileSizeLimit => d.join("run"),
    };
    ok(&train(&cfg, &run, &["--stop-after-steps", "2"]));
    let last = run.join("last");
    let snapshot = |dir: &Path| -> Vec<(String, Vec<u8>)> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_type().unwrap().is_file())
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).unwrap(),
                )
            })
            .collect();
        files.sort();
        files
    };
    let before = snapshot(&last);
    let model_bytes = std::fs::metadata(last.join("model.safetensors")).unwrap().len();

    // The next step's checkpoint write runs out of space.
    let (out, os_error) = match &disk {
        Disk::Tmpfs(at) => {
            // Room for what a resumed run writes before its first checkpoint (metrics, a
            // TensorBoard file), not for the checkpoint's weights.
            fill_leaving(&at.join("filler"), model_bytes / 2);
            (train(&cfg, &run, &["--resume"]), "No space left on device")
        }
        Disk::FileSizeLimit => {
            // `ulimit -f` counts 512-byte blocks in dash and POSIX shells, 1024-byte ones in
            // bash: either way a limit below the weights file and above the small files.
            let blocks = (model_bytes / 2 / 1024).to_string();
            let args = [
                "-c",
                r#"trap "" XFSZ; ulimit -f "$0" && exec "$@""#,
                &blocks,
                env!("CARGO_BIN_EXE_trident"),
                "train",
                "--config",
                cfg.to_str().unwrap(),
                "--run-dir",
                run.to_str().unwrap(),
                "--resume",
            ];
            let out = Command::new("sh").args(args).current_dir(d).output().unwrap();
            (out, "File too large")
        }
    };
    let err = failed(&out);
    assert_eq!(out.status.code(), Some(1), "not a clean error exit\n{err}");
    assert!(!err.contains("panicked"), "{err}");
    let head = format!("writing checkpoint {}: ", last.display());
    assert!(
        err.contains(&head)
            && err.contains(&format!("{}/.last.tmp-", run.display()))
            && err.contains(os_error)
            && err.contains("the previous checkpoint there is unchanged"),
        "the error names the checkpoint, the file and the OS error:\n{err}"
    );
    eprintln!("the error: {}", err.lines().find(|l| l.contains(&head)).unwrap());
    assert_eq!(snapshot(&last), before, "last/ is unchanged");
    assert!(
        entries(&run, ".last.").is_empty(),
        "the failed write's temporary directory is removed (it holds the space)"
    );

    // Space again: the old checkpoint loads, and the run resumes from it to the same end.
    if let Disk::Tmpfs(at) = &disk {
        std::fs::remove_file(at.join("filler")).unwrap();
    }
    ok(&trident(&["eval", "--model", last.to_str().unwrap()], d));
    ok(&train(&cfg, &run, &["--resume"]));
    assert_same_checkpoints(&d.join("whole"), &run);
}
