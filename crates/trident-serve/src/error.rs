//! Errors of the serving engine. Each variant is one kind of failure the front ends map
//! to a status code (in exactly one place, `trident-server`'s error module).

/// Why a request or a repository operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ServeError {
    /// No model of that name in the repository (Triton's text).
    #[error("Request for unknown model: '{0}' is not found")]
    ModelNotFound(String),
    /// The model exists but not that version, or that version is not ready (Triton's
    /// texts for both).
    #[error("Request for unknown model: '{model}' version {version} is not {}", if *.ready_missing { "at ready state" } else { "found" })]
    VersionNotFound {
        /// Model name.
        model: String,
        /// Requested version.
        version: String,
        /// The version exists but is not ready (failed to load).
        ready_missing: bool,
    },
    /// The model is known but no version is ready (failed to load, unloaded, loading).
    #[error("Request for unknown model: '{model}' has no available versions: {reason}")]
    NotReady {
        /// Model name.
        model: String,
        /// Why.
        reason: String,
    },
    /// The request does not match the model (names, types, shapes, batch size).
    #[error("{0}")]
    InvalidRequest(String),
    /// A model could not be loaded: no such directory, an invalid configuration or
    /// override, or a version that failed. Triton's "failed to load" texts begin it.
    #[error("failed to load '{model}': {reason}")]
    LoadFailed {
        /// Model name.
        model: String,
        /// Why.
        reason: String,
    },
    /// The model's queue is full.
    #[error("model '{model}' is overloaded: {pending} requests pending (max_queue_size {limit})")]
    Overloaded {
        /// Model name.
        model: String,
        /// Requests already queued.
        pending: usize,
        /// The bound.
        limit: usize,
    },
    /// The operation is not allowed in the current model control mode.
    #[error("{0}")]
    NotAllowed(String),
    /// The request asks for something this model or endpoint does not do (Triton's
    /// UNSUPPORTED), e.g. a single answer from a decoupled model.
    #[error("{0}")]
    Unsupported(String),
    /// The backend failed while executing.
    #[error("inference failed: {0}")]
    Backend(String),
    /// The model is shutting down.
    #[error("model '{0}' is unloading")]
    Unloading(String),
}

/// A setting that cannot be served: an invalid or unsupported part of a model's
/// `config.pbtxt` (or of a server option such as `--cache-config`), the operator's to
/// fix, never a client's. Display is the message operators have always read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{why}")]
pub struct ConfigError {
    /// The section or option at fault: `sequence_batching`, `ensemble_scheduling`,
    /// `model_warmup`, `--cache-config`, ...
    pub field: &'static str,
    /// What is wrong, naming the element at fault.
    pub why: String,
}

impl ConfigError {
    /// An error in `field`.
    pub fn new(field: &'static str, why: impl Into<String>) -> Self {
        ConfigError {
            field,
            why: why.into(),
        }
    }
}

/// Why a version of a model could not be loaded or started. Display is the reason a
/// [`ServeError::LoadFailed`] carries.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LoadError {
    /// The configuration asks for something invalid or unsupported.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A file the configuration names cannot be read.
    #[error("{context}{}: {source}", .path.display())]
    Io {
        /// What the file is for, as a prefix of the message (may be empty).
        context: String,
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        source: std::sync::Arc<std::io::Error>,
    },
    /// A model this one depends on (an ensemble's composing model) is not available.
    #[error("{step}: the composing model is not available: {source}")]
    Dependency {
        /// The step that names it (`step 2 (model 'x')`).
        step: String,
        /// Why it is not available.
        source: Box<ServeError>,
    },
    /// The backend could not start the version (instances, warmup).
    #[error(transparent)]
    Backend(#[from] crate::backend::BackendError),
}

impl LoadError {
    /// The same error with `prefix` before its message (the configuration element it
    /// concerns).
    pub(crate) fn within(self, prefix: &str) -> Self {
        match self {
            LoadError::Config(c) => LoadError::Config(ConfigError {
                why: format!("{prefix}{}", c.why),
                ..c
            }),
            LoadError::Io {
                context,
                path,
                source,
            } => LoadError::Io {
                context: format!("{prefix}{context}"),
                path,
                source,
            },
            e => e,
        }
    }
}
