//! Checkpoints: a directory holding the weights (`model.safetensors`), the optimizer state
//! (`optimizer.safetensors`), the trainer state (`state.json`: counters, data position,
//! early-stopping state, config hash) and any files the caller adds (the model description
//! that `trident predict` needs).
//!
//! Written atomically: everything goes into a temporary sibling directory, each file and
//! the directory are fsynced, then the directory is renamed over the old one. A crash at any
//! moment leaves either the old checkpoint or the new one, never a mixture.

use crate::optim::Optimizer;
use serde::{Deserialize, Serialize};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use trident_nn::{Loaded, Params};

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
    /// Running sums of the epoch in progress (loss, micro-batches, correct, examples), so
    /// a resumed epoch reports the same training loss and accuracy as an uninterrupted one.
    #[serde(default)]
    pub epoch_sums: (f64, u64, u64, u64),
    /// Hash of the training configuration: resuming with another configuration is refused.
    pub config_hash: String,
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
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.into(),
        source,
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
    let tmp = begin(dir, &format!("tmp-{}", std::process::id()))?;
    finish(&tmp, dir, params, Some(optimizer), state, extra)
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
    let parent = dir.parent().unwrap_or(Path::new("."));
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    parent.join(format!(".{name}.{tag}"))
}

/// Writes the weights, the optimizer state (unless the ranks wrote it sharded), the trainer
/// state and `extra` into `tmp`, syncs everything (shard files included), and renames it
/// over `dir`.
pub fn finish(
    tmp: &Path,
    dir: &Path,
    params: &Params,
    optimizer: Option<&Optimizer>,
    state: &TrainerState,
    extra: &[(String, Vec<u8>)],
) -> Result<(), CheckpointError> {
    let parent = dir.parent().unwrap_or(Path::new("."));
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let model = tmp.join("model.safetensors");
    params
        .save(&model)
        .map_err(|e| CheckpointError::Tensor(format!("{}: {e}", model.display())))?;
    let mut files = vec![model];
    if let Some(optimizer) = optimizer {
        let opt = tmp.join("optimizer.safetensors");
        let tensors = optimizer
            .state_tensors()
            .map_err(|e| CheckpointError::Tensor(e.to_string()))?;
        candle_core::safetensors::save(&tensors, &opt)
            .map_err(|e| CheckpointError::Tensor(format!("{}: {e}", opt.display())))?;
        files.push(opt);
    }
    let state_file = tmp.join("state.json");
    let json = serde_json::to_vec_pretty(state).expect("state serialises");
    write_file(&state_file, &json)?;
    files.push(state_file);
    for (n, bytes) in extra {
        let f = tmp.join(n);
        write_file(&f, bytes)?;
        files.push(f);
    }
    for f in &files {
        sync_file(f)?;
    }
    sync_file(tmp)?;
    // Swap: move any old checkpoint aside, rename the new one in, then delete the old.
    let old = parent.join(format!(".{name}.old-{}", std::process::id()));
    if dir.exists() {
        fs::rename(dir, &old).map_err(io(dir))?;
    }
    fs::rename(tmp, dir).map_err(io(dir))?;
    sync_file(parent)?;
    if old.exists() {
        fs::remove_dir_all(&old).map_err(io(&old))?;
    }
    Ok(())
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let mut f = File::create(path).map_err(io(path))?;
    f.write_all(bytes).map_err(io(path))
}

/// Reads a checkpoint's trainer state.
pub fn read_state(dir: &Path) -> Result<TrainerState, CheckpointError> {
    let f = dir.join("state.json");
    let bytes = fs::read(&f).map_err(io(&f))?;
    serde_json::from_slice(&bytes).map_err(|e| CheckpointError::Tensor(format!("{}: {e}", f.display())))
}

/// Loads weights and optimizer state from `dir` into `params` and `optimizer`. A
/// checkpoint whose optimizer state was written sharded (ZeRO-1) is reassembled.
pub fn load(dir: &Path, params: &Params, optimizer: &mut Optimizer) -> Result<TrainerState, CheckpointError> {
    let state = read_state(dir)?;
    load_weights(dir, params)?;
    let f = dir.join("optimizer.safetensors");
    let tensors = if f.exists() {
        candle_core::safetensors::load(&f, &candle_core::Device::Cpu)
            .map_err(|e| CheckpointError::Tensor(format!("{}: {e}", f.display())))?
    } else {
        crate::ddp::unshard_state(dir, &params.trainable())
            .map_err(|e| CheckpointError::Tensor(e.to_string()))?
    };
    optimizer
        .load_state(&tensors, state.optimizer_step)
        .map_err(|e| CheckpointError::Tensor(format!("{}: {e}", f.display())))?;
    Ok(state)
}

/// Loads only the weights of the checkpoint in `dir`.
pub fn load_weights(dir: &Path, params: &Params) -> Result<(), CheckpointError> {
    let f = dir.join("model.safetensors");
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
            epoch_sums: (1.5, 2, 3, 4),
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
