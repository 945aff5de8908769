//! The crate's error: why training (or a part of it — a checkpoint, a collective, a plot)
//! stopped. Below every module that can fail, so none of them imports the loop for it.

use std::path::PathBuf;

/// Why training stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A tensor operation failed.
    #[error("{0}")]
    Tensor(#[from] candle_core::Error),
    /// Data could not be loaded.
    #[error("{0}")]
    Data(#[from] trident_data::DataError),
    /// A checkpoint could not be written or read.
    #[error("{0}")]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// Any other I/O failure, naming the path.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The run cannot go on as asked.
    #[error("{0}")]
    Invalid(String),
    /// A data-parallel collective failed (this rank's, or another rank's failure).
    #[error("{0}")]
    Dist(#[from] trident_dist::DistError),
    /// A plot could not be drawn or written.
    #[error("{0}")]
    Plot(#[from] crate::plot::PlotError),
}
