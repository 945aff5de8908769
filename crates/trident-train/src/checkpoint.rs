//! Checkpoints: a directory holding the weights (`model.safetensors`), the optimizer state
//! (`optimizer.safetensors`), the trainer state (`state.json`: counters, data position,
//! early-stopping state, config hash), any files the caller adds (the model description
//! that `trident predict` needs) and a manifest (`manifest.json`: every file's size and
//! CRC-32C).
//!
//! Written atomically: everything goes into a temporary sibling directory, each file and
//! the directory are fsynced, then the directory is renamed over the old one. A crash at any
//! moment leaves either the old checkpoint or the new one, never a mixture: the one moment
//! where neither is at its place (between moving the old one aside and renaming the new one
//! in) is repaired by [`recover`], which the trainer runs before it looks at a run directory.
//! A write that fails (a full disk) removes its temporary directory and leaves the old
//! checkpoint as it was.
//!
//! Loading checks the files against the manifest first, so a truncated or damaged file is
//! reported by name instead of being read as weights (checkpoints from before the manifest
//! load unchecked).

use crate::optim::Optimizer;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use trident_nn::{Loaded, Params};

/// The manifest's file name.
pub const MANIFEST: &str = "manifest.json";

/// Where training stands: enough to continue exactly where it stopped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Epoch being run (0-based).
    pub epoch: u64,
    /// Micro-batches of that epoch already consumed.
    pub batch_in_epoch: u64,
    /// Micro-batches consumed over the whole run (seeds dropout).
    pub micro_step: u64,
    /// Optimizer updates taken.
    pub optimizer_step: u64,
    /// Best validation metric so far.
    pub best_metric: Option<f64>,
    /// Epoch of the best metric.
    pub best_epoch: Option<u64>,
    /// Epochs without improvement (early stopping).
    pub epochs_without_improvement: u64,
    /// The run has finished (all epochs or early stop).
    pub finished: bool,
    /// Running sums of the epoch in progress, so that a resumed epoch reports the same
    /// figures as an uninterrupted one.
    #[serde(default)]
    pub sums: EpochSums,
    /// Hash of the training configuration: resuming with another configuration is refused.
    pub config_hash: String,
}

/// The running sums of an epoch in progress: those every task has (its loss per batch and
/// its units of progress) and the task's own, by name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EpochSums {
    /// Sum of the losses of the epoch's batches so far.
    pub loss: f64,
    /// Batches whose loss is summed.
    pub batches: u64,
    /// Units of progress so far: examples, or an agent's environment steps.
    pub units: u64,
    /// The task's own sums (a classifier's correct predictions, a GAN's critic scores).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub named: BTreeMap<String, f64>,
}

impl EpochSums {
    /// The mean loss per batch so far (0 before the first).
    pub fn mean_loss(&self) -> f64 {
        self.loss / self.batches.max(1) as f64
    }

    /// Adds `v` to the sum named `name`.
    pub fn add(&mut self, name: &str, v: f64) {
        *self.named.entry(name.to_string()).or_default() += v;
    }

    /// The sum named `name` (0 when nothing was added to it).
    pub fn get(&self, name: &str) -> f64 {
        self.named.get(name).copied().unwrap_or(0.0)
    }
}

/// `state.json` as runs before [`EpochSums`] wrote it: the sums as a tuple (loss,
/// batches, correct, examples) and a GAN's four more by position; read into the
/// named sums so that such a run still resumes exactly.
#[derive(Deserialize)]
struct LegacySums {
    #[serde(default)]
    epoch_sums: Option<(f64, u64, u64, u64)>,
    #[serde(default)]
    extra_sums: Vec<f64>,
}

impl LegacySums {
    fn into_sums(self) -> Option<EpochSums> {
        let (loss, batches, correct, units) = self.epoch_sums?;
        let mut sums = EpochSums {
            loss,
            batches,
            units,
            named: BTreeMap::new(),
        };
        if correct > 0 {
            sums.add("correct", correct as f64);
        }
        let gan = ["generator_loss", "generator_steps", "d_real", "d_fake"];
        for (name, v) in gan.iter().zip(self.extra_sums) {
            sums.add(name, v);
        }
        Some(sums)
    }
}

/// Why a checkpoint could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// File-system failure, naming the path.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Tensor (de)serialisation failed.
    #[error("{0}")]
    Tensor(String),
    /// A file of the checkpoint is not the one that was written (truncated or damaged), or
    /// does not fit the model.
    #[error("{}: {what}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
    },
    /// Writing checkpoint `dir` failed (`error`); `kept` says whether the checkpoint that
    /// was there before is still there, unchanged.
    #[error(
        "writing checkpoint {}: {error}{}",
        dir.display(),
        if *kept { "; the previous checkpoint there is unchanged" } else { "" }
    )]
    Write {
        /// The checkpoint directory.
        dir: PathBuf,
        /// What failed.
        error: Box<CheckpointError>,
        /// A previous checkpoint is in `dir`, unchanged.
        kept: bool,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.into(),
        source,
    }
}

fn corrupt(path: &Path, what: impl Into<String>) -> CheckpointError {
    CheckpointError::Corrupt {
        path: path.into(),
        what: what.into(),
    }
}

fn sync_file(path: &Path) -> Result<(), CheckpointError> {
    File::open(path).and_then(|f| f.sync_all()).map_err(io(path))
}

/// Writes `dir` atomically with the weights, optimizer and trainer state, and `extra`
/// files (name → bytes).
pub fn save(
    dir: &Path,
    params: &Params,
    optimizer: &Optimizer,
    state: &TrainerState,
    extra: &[(String, Vec<u8>)],
) -> Result<(), CheckpointError> {
    save_groups(dir, params, &[optimizer], state, extra)
}

/// [`save`] of a model whose parameter groups have optimizers of their own (a GAN's
/// generator and discriminator): their states, keyed by parameter name, share
/// `optimizer.safetensors`.
pub fn save_groups(
    dir: &Path,
    params: &Params,
    optimizers: &[&Optimizer],
    state: &TrainerState,
    extra: &[(String, Vec<u8>)],
) -> Result<(), CheckpointError> {
    let tmp = begin_own(dir)?;
    write_files(&tmp, params, Some(optimizers), state, extra).map_err(|e| write_failed(dir, &tmp, e))?;
    swap(&tmp, dir)
}

/// [`begin`] with this process's tag (a write not shared with data-parallel ranks).
fn begin_own(dir: &Path) -> Result<PathBuf, CheckpointError> {
    let tag = format!("tmp-{}", std::process::id());
    begin(dir, &tag).map_err(|e| write_failed(dir, &tmp_path(dir, &tag), e))
}

/// Writes checkpoint `dir` as a copy of checkpoint `from`, which was just written with the
/// same state: each file hard-linked where the file system allows it (a checkpoint's files
/// are never changed in place — a checkpoint is always replaced whole — so sharing them is
/// safe), copied and synced where it does not; then swapped in like a written checkpoint.
/// Half the writing of an epoch that is the best so far (`best/` then `last/`).
pub fn save_copy(from: &Path, dir: &Path) -> Result<(), CheckpointError> {
    let tmp = begin_own(dir)?;
    let fill = || -> Result<(), CheckpointError> {
        for entry in fs::read_dir(from).map_err(io(from))? {
            let entry = entry.map_err(io(from))?;
            if !entry.file_type().map_err(io(&entry.path()))?.is_file() {
                continue;
            }
            let target = tmp.join(entry.file_name());
            if fs::hard_link(entry.path(), &target).is_err() {
                fs::copy(entry.path(), &target).map_err(io(&target))?;
                sync_file(&target)?;
            }
        }
        // The new directory entries, durable before the swap.
        sync_file(&tmp)
    };
    fill().map_err(|e| write_failed(dir, &tmp, e))?;
    swap(&tmp, dir)
}

/// Starts writing checkpoint `dir`: an empty temporary sibling `.<name>.<tag>` (any older
/// one removed), returned. Data-parallel ranks agree on `tag` and write their optimizer
/// shards into it before rank 0 calls [`finish`].
pub fn begin(dir: &Path, tag: &str) -> Result<PathBuf, CheckpointError> {
    let parent = dir.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(parent).map_err(io(parent))?;
    let tmp = tmp_path(dir, tag);
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    Ok(tmp)
}

/// The temporary sibling [`begin`] makes for `dir`.
pub fn tmp_path(dir: &Path, tag: &str) -> PathBuf {
    sibling(dir, tag)
}

/// `.<name>.<tag>` next to `dir`.
fn sibling(dir: &Path, tag: &str) -> PathBuf {
    let parent = dir.parent().unwrap_or(Path::new("."));
    parent.join(format!(".{}.{tag}", dir_name(dir)))
}

fn dir_name(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The failure `error` of a write of `dir` through `tmp`: the temporary directory is
/// removed (it would hold the space a full disk needs), the old checkpoint is untouched.
fn write_failed(dir: &Path, tmp: &Path, error: CheckpointError) -> CheckpointError {
    if tmp.exists() {
        // Best effort: what is left is removed by the next write or `recover`.
        let _ = fs::remove_dir_all(tmp);
    }
    CheckpointError::Write {
        dir: dir.into(),
        error: Box::new(error),
        kept: dir.join("state.json").exists(),
    }
}

/// Writes the weights, the optimizer state (unless the ranks wrote it sharded), the trainer
/// state, `extra` and the manifest into `tmp`, syncs everything (shard files included), and
/// renames it over `dir`. On failure `tmp` is removed and `dir` is as it was.
pub fn finish(
    tmp: &Path,
    dir: &Path,
    params: &Params,
    optimizer: Option<&Optimizer>,
    state: &TrainerState,
    extra: &[(String, Vec<u8>)],
) -> Result<(), CheckpointError> {
    let one = optimizer.map(|o| [o]);
    write_files(tmp, params, one.as_ref().map(|o| &o[..]), state, extra)
        .map_err(|e| write_failed(dir, tmp, e))?;
    swap(tmp, dir)
}

/// The files of a checkpoint, into `tmp`, synced.
fn write_files(
    tmp: &Path,
    params: &Params,
    optimizers: Option<&[&Optimizer]>,
    state: &TrainerState,
    extra: &[(String, Vec<u8>)],
) -> Result<(), CheckpointError> {
    let model = tmp.join("model.safetensors");
    params
        .save(&model)
        .map_err(|e| CheckpointError::Tensor(format!("{}: {e}", model.display())))?;
    if let Some(optimizers) = optimizers {
        let opt = tmp.join("optimizer.safetensors");
        let mut tensors = std::collections::HashMap::new();
        for o in optimizers {
            for (k, t) in o
                .state_tensors()
                .map_err(|e| CheckpointError::Tensor(e.to_string()))?
            {
                if tensors.insert(k.clone(), t).is_some() {
                    return Err(CheckpointError::Tensor(format!(
                        "{}: two optimizers hold state `{k}`: a parameter belongs to one group only",
                        opt.display()
                    )));
                }
            }
        }
        candle_core::safetensors::save(&tensors, &opt)
            .map_err(|e| CheckpointError::Tensor(format!("{}: {e}", opt.display())))?;
    }
    let json = serde_json::to_vec_pretty(state).expect("state serialises");
    let state_file = tmp.join("state.json");
    write_file(&state_file, &json)?;
    for (n, bytes) in extra {
        write_file(&tmp.join(n), bytes)?;
    }
    // The safetensors writer (0.8) makes its files through a temporary file of mode 0600,
    // whatever the umask: other users of a shared run directory, or a container's non-root
    // user, could not read the weights. Every file gets the mode a plain file of ours got.
    let mode = fs::metadata(&state_file).map_err(io(&state_file))?.permissions();
    // Every file of the directory (data-parallel ranks' optimizer shards too), read back.
    let mut files = Vec::new();
    for entry in fs::read_dir(tmp).map_err(io(tmp))? {
        let entry = entry.map_err(io(tmp))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type().map_err(io(&entry.path()))?.is_file() && name != MANIFEST {
            fs::set_permissions(entry.path(), mode.clone()).map_err(io(&entry.path()))?;
            files.push(name);
        }
    }
    let mut manifest = Manifest::default();
    for name in &files {
        let f = tmp.join(name);
        let bytes = fs::read(&f).map_err(io(&f))?;
        manifest.files.insert(name.clone(), FileSum::of(&bytes));
    }
    let manifest_file = tmp.join(MANIFEST);
    let json = serde_json::to_vec_pretty(&manifest).expect("manifest serialises");
    write_file(&manifest_file, &json)?;
    for name in files.iter().map(String::as_str).chain([MANIFEST]) {
        sync_file(&tmp.join(name))?;
    }
    sync_file(tmp)
}

/// Moves the complete checkpoint `tmp` to `dir`: the old one aside, the new one in, the old
/// one deleted. [`recover`] puts the old one back after a crash between the two renames.
fn swap(tmp: &Path, dir: &Path) -> Result<(), CheckpointError> {
    let parent = dir.parent().unwrap_or(Path::new("."));
    let old = sibling(dir, &format!("old-{}", std::process::id()));
    let fail = |e| write_failed(dir, tmp, e);
    if old.exists() {
        // A leftover of an earlier failed write: a rename cannot replace a full directory.
        fs::remove_dir_all(&old).map_err(io(&old)).map_err(fail)?;
    }
    let had_old = dir.exists();
    if had_old {
        fs::rename(dir, &old).map_err(io(dir)).map_err(fail)?;
    }
    if let Err(e) = fs::rename(tmp, dir) {
        if had_old {
            // Put the old one back; if even that fails, `recover` will.
            let _ = fs::rename(&old, dir);
        }
        return Err(fail(CheckpointError::Io {
            path: dir.into(),
            source: e,
        }));
    }
    sync_file(parent)?;
    if had_old {
        // The new checkpoint is in place; a leftover is removed by the next write or by
        // `recover`, so a failure here does not fail the run.
        let _ = fs::remove_dir_all(&old);
    }
    Ok(())
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let mut f = File::create(path).map_err(io(path))?;
    f.write_all(bytes).map_err(io(path))
}

/// Repairs what a process killed while writing checkpoint `dir` leaves behind: when `dir`
/// is missing but the old checkpoint was moved aside (the moment between the two renames
/// of a swap), puts it back; removes leftover temporary and old directories. Returns a line
/// saying what was restored, if anything. Only one process may write a run directory.
pub fn recover(dir: &Path) -> Result<Option<String>, CheckpointError> {
    let parent = dir.parent().unwrap_or(Path::new("."));
    let entries = match fs::read_dir(parent) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(parent)(e)),
    };
    let name = dir_name(dir);
    let (tmp_prefix, old_prefix) = (format!(".{name}.tmp-"), format!(".{name}.old-"));
    let (mut olds, mut tmps) = (Vec::new(), Vec::new());
    for entry in entries {
        let entry = entry.map_err(io(parent))?;
        let n = entry.file_name().to_string_lossy().into_owned();
        if n.starts_with(&old_prefix) {
            let modified = entry.metadata().and_then(|m| m.modified()).ok();
            olds.push((modified, entry.path()));
        } else if n.starts_with(&tmp_prefix) {
            tmps.push(entry.path());
        }
    }
    let mut restored = None;
    if !dir.exists() {
        // The newest old one is the checkpoint that was in place.
        olds.sort();
        if let Some((_, old)) = olds.pop() {
            fs::rename(&old, dir).map_err(io(dir))?;
            sync_file(parent)?;
            restored = Some(format!(
                "{}: restored from {} (the process was stopped while replacing it)",
                dir.display(),
                old.display()
            ));
        }
    }
    for p in olds.into_iter().map(|(_, p)| p).chain(tmps) {
        fs::remove_dir_all(&p).map_err(io(&p))?;
    }
    Ok(restored)
}

/// Every file of a checkpoint with its size and CRC-32C.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Manifest {
    files: BTreeMap<String, FileSum>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct FileSum {
    bytes: u64,
    crc32c: u32,
}

impl FileSum {
    fn of(bytes: &[u8]) -> Self {
        FileSum {
            bytes: bytes.len() as u64,
            crc32c: crc32c::crc32c(bytes),
        }
    }
}

/// Checks the files `names` of checkpoint `dir` (all when empty) against its manifest:
/// present, of the size written and with the same CRC-32C. Files the manifest does not
/// list, and checkpoints without a manifest (written before it existed), are not checked.
pub fn verify(dir: &Path, names: &[&str]) -> Result<(), CheckpointError> {
    let manifest_file = dir.join(MANIFEST);
    let bytes = match fs::read(&manifest_file) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(&manifest_file)(e)),
    };
    let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|e| {
        corrupt(
            &manifest_file,
            format!("damaged checkpoint manifest ({e}); the checkpoint cannot be checked"),
        )
    })?;
    for (name, want) in &manifest.files {
        if !names.is_empty() && !names.contains(&name.as_str()) {
            continue;
        }
        let f = dir.join(name);
        let bytes = fs::read(&f).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                corrupt(&f, format!("missing (the checkpoint's {MANIFEST} lists it)"))
            }
            _ => io(&f)(e),
        })?;
        let got = FileSum::of(&bytes);
        if got.bytes != want.bytes {
            return Err(corrupt(
                &f,
                format!(
                    "{} bytes, but {} were written: the file is truncated or damaged",
                    got.bytes, want.bytes
                ),
            ));
        }
        if got.crc32c != want.crc32c {
            return Err(corrupt(
                &f,
                format!(
                    "the contents differ from those written (CRC-32C {:08x}, written {:08x}): the file is damaged",
                    got.crc32c, want.crc32c
                ),
            ));
        }
    }
    Ok(())
}

/// Reads a checkpoint's trainer state.
pub fn read_state(dir: &Path) -> Result<TrainerState, CheckpointError> {
    verify(dir, &["state.json"])?;
    read_state_unchecked(dir)
}

fn read_state_unchecked(dir: &Path) -> Result<TrainerState, CheckpointError> {
    let f = dir.join("state.json");
    let bytes = fs::read(&f).map_err(io(&f))?;
    let not_state = |e: serde_json::Error| corrupt(&f, format!("not a trainer state: {e}"));
    let mut state: TrainerState = serde_json::from_slice(&bytes).map_err(not_state)?;
    if let Some(sums) = serde_json::from_slice::<LegacySums>(&bytes)
        .map_err(not_state)?
        .into_sums()
    {
        state.sums = sums;
    }
    Ok(state)
}

/// Loads weights and optimizer state from `dir` into `params` and `optimizer`. A
/// checkpoint whose optimizer state was written sharded (ZeRO-1) is reassembled.
pub fn load(dir: &Path, params: &Params, optimizer: &mut Optimizer) -> Result<TrainerState, CheckpointError> {
    let trainable = params.trainable();
    load_groups(dir, params, &mut [(optimizer, &trainable[..])])
}

/// [`load`] of a model whose parameter groups have optimizers of their own (written by
/// [`save_groups`]): each optimizer gets the state of its group's parameters, and its
/// step count is the state's `optimizer_step` (a caller whose groups step at different
/// rates sets theirs).
pub fn load_groups(
    dir: &Path,
    params: &Params,
    groups: &mut [(&mut Optimizer, &[trident_nn::Param])],
) -> Result<TrainerState, CheckpointError> {
    verify(dir, &[])?;
    let state = read_state_unchecked(dir)?;
    load_weights_unchecked(dir, params)?;
    let f = dir.join("optimizer.safetensors");
    let trainable: Vec<trident_nn::Param> = groups.iter().flat_map(|(_, p)| p.iter().cloned()).collect();
    let tensors = if f.exists() {
        candle_core::safetensors::load(&f, &candle_core::Device::Cpu)
            .map_err(|e| corrupt(&f, format!("not a readable optimizer state: {e}")))?
    } else {
        crate::ddp::unshard_state(dir, &trainable).map_err(|e| CheckpointError::Tensor(e.to_string()))?
    };
    // Every moment must belong to a trainable parameter and have its size: the optimizer
    // indexes them with the parameter's.
    for (k, t) in &tensors {
        let p = k
            .split_once('.')
            .and_then(|(_, name)| trainable.iter().find(|p| p.name == name));
        match p {
            None => {
                return Err(corrupt(
                    &f,
                    format!(
                        "has optimizer state `{k}`, which belongs to no trainable parameter of this model"
                    ),
                ))
            }
            Some(p) if p.var.elem_count() != t.elem_count() => {
                return Err(corrupt(
                    &f,
                    format!(
                        "optimizer state `{k}` has {} values, the parameter {}",
                        t.elem_count(),
                        p.var.elem_count()
                    ),
                ))
            }
            Some(_) => {}
        }
    }
    for (optimizer, group) in groups.iter_mut() {
        let mine = tensors
            .iter()
            .filter(|(k, _)| {
                k.split_once('.')
                    .is_some_and(|(_, n)| group.iter().any(|p| p.name == n))
            })
            .map(|(k, t)| (k.clone(), t.clone()))
            .collect();
        optimizer
            .load_state(&mine, state.optimizer_step)
            .map_err(|e| corrupt(&f, e.to_string()))?;
    }
    Ok(state)
}

/// Loads only the weights of the checkpoint in `dir`.
pub fn load_weights(dir: &Path, params: &Params) -> Result<(), CheckpointError> {
    verify(dir, &["model.safetensors"])?;
    load_weights_unchecked(dir, params)
}

fn load_weights_unchecked(dir: &Path, params: &Params) -> Result<(), CheckpointError> {
    let f = dir.join("model.safetensors");
    // Both errors name the file.
    let loaded = Loaded::read(&f).map_err(|e| CheckpointError::Tensor(e.to_string()))?;
    params
        .load_values(&loaded)
        .map_err(|e| CheckpointError::Tensor(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optim::OptimizerConfig;
    use trident_nn::Init;

    fn small() -> (Params, Optimizer, TrainerState) {
        let params = Params::new();
        params
            .builder(3, None)
            .get((2, 3), "w", Init::Normal(1.0))
            .unwrap();
        let mut opt = Optimizer::new(OptimizerConfig::default());
        opt.step(&params.trainable(), &[vec![0.5; 6]], 0.1).unwrap();
        let state = TrainerState {
            epoch: 0,
            batch_in_epoch: 1,
            micro_step: 1,
            optimizer_step: 1,
            best_metric: None,
            best_epoch: None,
            epochs_without_improvement: 0,
            finished: false,
            sums: EpochSums {
                loss: 0.5,
                batches: 1,
                units: 2,
                named: BTreeMap::from([("correct".into(), 1.0)]),
            },
            config_hash: "h".into(),
        };
        (params, opt, state)
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut n: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        n.sort();
        n
    }

    #[test]
    fn a_state_written_with_positional_sums_resumes_with_them_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let old = r#"{"epoch":1,"batch_in_epoch":3,"micro_step":9,"optimizer_step":9,"best_metric":0.5,"best_epoch":0,"epochs_without_improvement":0,"finished":false,"epoch_sums":[1.5,3,2,96],"extra_sums":[0.25,1.0,0.75,-0.5],"config_hash":"h"}"#;
        fs::write(dir.path().join("state.json"), old).unwrap();
        let s = read_state_unchecked(dir.path()).unwrap();
        assert_eq!((s.sums.loss, s.sums.batches, s.sums.units), (1.5, 3, 96));
        let named = |n: &str| s.sums.get(n);
        assert_eq!(
            [
                named("correct"),
                named("generator_loss"),
                named("generator_steps"),
                named("d_real"),
                named("d_fake")
            ],
            [2.0, 0.25, 1.0, 0.75, -0.5]
        );
        // Written back, the sums are named.
        let text = serde_json::to_string(&s).unwrap();
        assert!(
            text.contains(r#""sums":{"loss":1.5,"batches":3,"units":96"#) && !text.contains("epoch_sums"),
            "{text}"
        );
    }

    #[test]
    fn recover_puts_back_a_checkpoint_moved_aside_and_clears_leftovers() {
        let dir = tempfile::tempdir().unwrap();
        let ck = dir.path().join("last");
        let (params, opt, state) = small();
        save(&ck, &params, &opt, &state, &[]).unwrap();
        assert_eq!(recover(&ck).unwrap(), None, "nothing to repair");
        // Killed between the two renames of a swap, with a killed write's leftover too.
        fs::rename(&ck, dir.path().join(".last.old-77")).unwrap();
        fs::create_dir(dir.path().join(".last.tmp-78")).unwrap();
        fs::write(dir.path().join(".last.tmp-78/model.safetensors"), b"half").unwrap();
        let note = recover(&ck).unwrap().expect("restored");
        assert!(note.contains(".last.old-77"), "{note}");
        assert_eq!(names(dir.path()), ["last"]);
        let mut opt2 = Optimizer::new(OptimizerConfig::default());
        assert_eq!(load(&ck, &params, &mut opt2).unwrap(), state);
        // A leftover old directory of this process does not block the next write.
        fs::create_dir(sibling(&ck, &format!("old-{}", std::process::id()))).unwrap();
        save(&ck, &params, &opt, &state, &[]).unwrap();
        assert_eq!(names(dir.path()), ["last"]);
    }

    #[test]
    fn damaged_files_are_named_and_a_failed_write_keeps_the_old_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let ck = dir.path().join("last");
        let (params, opt, state) = small();
        save(&ck, &params, &opt, &state, &[("note.txt".into(), b"hi".to_vec())]).unwrap();
        assert!(names(&ck).contains(&MANIFEST.to_string()));
        let pristine: Vec<(String, Vec<u8>)> = names(&ck)
            .into_iter()
            .map(|n| (n.clone(), fs::read(ck.join(&n)).unwrap()))
            .collect();
        let restore = || {
            for (n, b) in &pristine {
                fs::write(ck.join(n), b).unwrap();
            }
        };
        let mut opt2 = Optimizer::new(OptimizerConfig::default());
        for (file, damage) in [
            ("model.safetensors", "truncate"),
            ("model.safetensors", "flip"),
            ("optimizer.safetensors", "flip"),
            ("state.json", "truncate"),
            (MANIFEST, "truncate"),
        ] {
            let f = ck.join(file);
            let mut bytes = fs::read(&f).unwrap();
            match damage {
                "truncate" => bytes.truncate(bytes.len() / 2),
                _ => *bytes.last_mut().unwrap() ^= 0x40,
            }
            fs::write(&f, bytes).unwrap();
            let e = load(&ck, &params, &mut opt2).unwrap_err().to_string();
            assert!(e.contains(&f.display().to_string()), "{file} {damage}: {e}");
            restore();
        }
        load(&ck, &params, &mut opt2).unwrap();
        // A write that cannot finish (here: a directory where a file goes) removes its
        // temporary directory and leaves the old checkpoint.
        let e = save(&ck, &params, &opt, &state, &[("sub/x".into(), vec![1])]).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!("writing checkpoint {}: ", ck.display()))
                && msg.contains("sub/x")
                && msg.ends_with("the previous checkpoint there is unchanged"),
            "{msg}"
        );
        assert_eq!(names(dir.path()), ["last"]);
        assert_eq!(load(&ck, &params, &mut opt2).unwrap(), state);
        assert!(ck.join("note.txt").exists());
    }

    #[test]
    fn a_copied_checkpoint_shares_the_files_and_survives_the_original_being_replaced() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let (best, last) = (dir.path().join("best"), dir.path().join("last"));
        let (params, opt, state) = small();
        save(
            &best,
            &params,
            &opt,
            &state,
            &[("note.txt".into(), b"hi".to_vec())],
        )
        .unwrap();
        save_copy(&best, &last).unwrap();
        assert_eq!(names(&best), names(&last));
        for n in names(&best) {
            let (a, b) = (
                fs::metadata(best.join(&n)).unwrap(),
                fs::metadata(last.join(&n)).unwrap(),
            );
            assert_eq!(a.ino(), b.ino(), "{n}: hard-linked on one file system");
        }
        verify(&last, &[]).unwrap();
        // Every file with the mode of a plain file (the safetensors writer's are 0600).
        let mode = |n: &str| fs::metadata(last.join(n)).unwrap().permissions();
        for n in ["model.safetensors", "optimizer.safetensors", "note.txt", MANIFEST] {
            assert_eq!(mode(n), mode("state.json"), "{n}");
        }
        let before = fs::read(last.join("model.safetensors")).unwrap();
        // `best` replaced by another state: the copy keeps its own files.
        let (params2, opt2, mut state2) = small();
        state2.epoch += 1;
        save(&best, &params2, &opt2, &state2, &[]).unwrap();
        assert_eq!(fs::read(last.join("model.safetensors")).unwrap(), before);
        verify(&last, &[]).unwrap();
        assert_eq!(read_state(&last).unwrap().epoch, state.epoch);
        assert!(
            !fs::read_dir(dir.path()).unwrap().any(|e| e
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with('.')),
            "no temporary directory is left"
        );
    }

    #[test]
    fn round_trip_and_replace() {
        let dir = tempfile::tempdir().unwrap();
        let ck = dir.path().join("last");
        let params = Params::new();
        params
            .builder(3, None)
            .get((2, 3), "w", Init::Normal(1.0))
            .unwrap();
        let mut opt = Optimizer::new(OptimizerConfig::default());
        let p = params.trainable();
        opt.step(&p, &[vec![0.5; 6]], 0.1).unwrap();
        let state = TrainerState {
            epoch: 1,
            batch_in_epoch: 2,
            micro_step: 7,
            optimizer_step: 1,
            best_metric: Some(0.5),
            best_epoch: Some(0),
            epochs_without_improvement: 0,
            finished: false,
            sums: EpochSums {
                loss: 1.5,
                batches: 2,
                units: 4,
                named: BTreeMap::from([("correct".into(), 3.0), ("d_real".into(), 0.25)]),
            },
            config_hash: "abc".into(),
        };
        save(&ck, &params, &opt, &state, &[("note.txt".into(), b"hi".to_vec())]).unwrap();
        save(&ck, &params, &opt, &state, &[]).unwrap();
        assert!(
            !ck.join("note.txt").exists(),
            "the second save replaced the whole directory"
        );
        let leftovers: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers, ["last"], "no temporary directory is left behind");

        let restored = Params::new();
        restored.builder(99, None).get((2, 3), "w", Init::Zeros).unwrap();
        let mut opt2 = Optimizer::new(OptimizerConfig::default());
        assert_eq!(load(&ck, &restored, &mut opt2).unwrap(), state);
        let a = params
            .get("w")
            .unwrap()
            .var
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let b = restored
            .get("w")
            .unwrap()
            .var
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(a, b);
        assert_eq!(opt2.steps, 1);
        assert_eq!(
            opt.state_tensors().unwrap()["m.w"].to_vec1::<f32>().unwrap(),
            opt2.state_tensors().unwrap()["m.w"].to_vec1::<f32>().unwrap()
        );
    }
}
