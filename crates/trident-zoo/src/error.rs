//! The zoo's one error type, so a caller can tell a `[model]` setting that does not fit its
//! data from a file that cannot be read, a damaged checkpoint or a text too long for the
//! model.

/// A boxed cause, for errors of the libraries a model reads its files with.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// Why a model could not be built, loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum ZooError {
    /// The `[model]` settings do not fit together or with the data; the message names the
    /// key (`model.dropout = 1.5: must be in [0, 1)`).
    #[error("{0}")]
    Config(String),
    /// A file the model reads (a checkpoint's card or weights, a tokenizer, an encoder's
    /// config, pretrained weights) could not be read or parsed.
    #[error("{what}")]
    File {
        /// The file, and what it was read for where that says more.
        what: String,
        /// Why.
        source: Cause,
    },
    /// A checkpoint's files do not match its manifest.
    #[error(transparent)]
    Checkpoint(#[from] trident_train::checkpoint::CheckpointError),
    /// Tensor arithmetic or a parameter store failed.
    #[error(transparent)]
    Tensor(#[from] candle_core::Error),
    /// The model card could not be written as JSON.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// A text the model cannot take under its card's length rule.
    #[error("{what}: {why}")]
    Text {
        /// The text, as the caller names it (a file and line, a request's input).
        what: String,
        /// Why, naming the setting that decides (`data.max_len`).
        why: String,
    },
    /// The model is not of a kind that does what was asked (a tokenizer of an image model,
    /// the adversarial step of a classifier).
    #[error("{0}")]
    Kind(&'static str),
    /// A picture could not be drawn or written.
    #[error(transparent)]
    Plot(#[from] trident_train::plot::PlotError),
    /// An exported graph failed or lacks what it was read for.
    #[error("{0}")]
    Graph(String),
}

impl ZooError {
    /// A file error: `what` names the file, `source` says why.
    pub fn file(what: impl Into<String>, source: impl Into<Cause>) -> Self {
        ZooError::File {
            what: what.into(),
            source: source.into(),
        }
    }

    /// The message with its causes, each after a colon (as anyhow's `{:#}` prints it).
    pub fn report(&self) -> String {
        let mut out = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(c) = cause {
            out.push_str(&format!(": {c}"));
            cause = c.source();
        }
        out
    }
}

/// The zoo's result.
pub type Result<T, E = ZooError> = std::result::Result<T, E>;

/// `return Err(ZooError::Config(format!(…)))`: a `[model]` setting that does not fit.
macro_rules! invalid {
    ($($arg:tt)*) => {
        return Err($crate::error::ZooError::Config(format!($($arg)*)))
    };
}
pub(crate) use invalid;
