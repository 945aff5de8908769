//! Data for training: datasets (IDX images, CSV/TSV/JSONL text classification),
//! seeded shuffling and minibatching, and a loader with `num_workers` background workers
//! and bounded prefetching (DL-1).
//!
//! Nothing here depends on a tensor engine: a dataset yields items, a collate function
//! turns a list of items into whatever batch type the training step wants (candle
//! tensors in `trident-train`). Randomness comes from [`rng::SplitMix64`] seeded by
//! (seed, epoch, index), so an epoch's order and augmentations are reproducible and a
//! resumed run sees exactly the batches an uninterrupted one would.
#![warn(missing_docs)]

pub mod folder;
pub mod idx;
pub mod loader;
pub mod python;
pub mod rng;
pub mod sampler;
pub mod series;
pub mod table;
pub mod text;
pub mod tokenize;
pub mod transform;

use std::path::PathBuf;

pub use loader::{DataLoader, LoaderConfig};

/// A random-access collection of training examples.
pub trait Dataset: Send + Sync {
    /// One example.
    type Item: Send;
    /// Number of examples.
    fn len(&self) -> usize;
    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Example `index` (`index < len()`).
    fn get(&self, index: usize) -> Result<Self::Item, DataError>;
    /// Example `index` as seen in `epoch`: datasets with random augmentation override this
    /// to draw from (seed, epoch, index); the loader calls it. Defaults to [`get`](Self::get).
    fn get_in_epoch(&self, index: usize, epoch: u64) -> Result<Self::Item, DataError> {
        let _ = epoch;
        self.get(index)
    }
}

/// A file's bytes; gzip data (found by its magic number, not the name) is decompressed.
/// Errors name the file.
pub fn read_file(file: &std::path::Path) -> Result<Vec<u8>, DataError> {
    let raw = std::fs::read(file).map_err(|source| DataError::Io {
        file: file.into(),
        source,
    })?;
    if !raw.starts_with(&[0x1f, 0x8b]) {
        return Ok(raw);
    }
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(raw.as_slice()), &mut out).map_err(|e| {
        DataError::Format {
            file: file.into(),
            line: 0,
            message: format!("corrupt gzip data: {e}"),
        }
    })?;
    Ok(out)
}

/// Why data could not be read. Messages name the file and, where it applies, the line.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file could not be opened or read.
    #[error("{file}: {source}")]
    Io {
        /// The file.
        file: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file's content is not what its format requires.
    #[error("{file}:{line}: {message}")]
    Format {
        /// The file.
        file: PathBuf,
        /// 1-based line (record for binary formats, 0 for the header).
        line: u64,
        /// What is wrong.
        message: String,
    },
    /// A collate function or worker failed.
    #[error("{0}")]
    Batch(String),
}
