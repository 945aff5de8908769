//! The one error type of the exporter, so callers can tell a model that cannot be
//! exported (a custom layer, a hand-edited card) from a damaged checkpoint.

/// Why a model could not be exported.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// A `--flavour` or `--precision` the exporter does not know; the message names the
    /// flag, since the CLI passes the user's text straight through.
    #[error("--{flag} `{value}`: expected {expected}")]
    Option {
        /// The flag without its dashes (`flavour`, `precision`).
        flag: &'static str,
        /// What the user wrote.
        value: String,
        /// The accepted values, for the message.
        expected: &'static str,
    },
    /// The card names another model kind than the network it built: a checkpoint edited
    /// by hand, or a zoo bug.
    #[error("the model card does not match the network it built")]
    CardMismatch,
    /// The card's input spec is not what the network reads (say, a table for a CNN).
    #[error("a model reading {expected} whose card does not describe {expected}")]
    Input {
        /// What the network reads (`images`, `a table`, `a series`).
        expected: &'static str,
    },
    /// Part of the model has no ONNX form here (a registered layer or activation, a
    /// shape the graph does not cover).
    #[error("{kind}: {why}")]
    Unsupported {
        /// The model kind (`mlp`, `sequential`, `autoencoder`, `forecaster`).
        kind: &'static str,
        /// What is missing, naming the card's field where there is one.
        why: String,
    },
    /// The checkpoint lacks a parameter the kind's graph reads.
    #[error("the model has no parameter `{name}`")]
    MissingParameter {
        /// The parameter's name (PyTorch's naming).
        name: String,
    },
    /// A parameter's values could not be read as f32.
    #[error("reading parameter `{name}`")]
    Tensor {
        /// The parameter's name.
        name: String,
        /// candle's error.
        source: candle_core::Error,
    },
}

/// The exporter's result.
pub type Result<T> = std::result::Result<T, ExportError>;
