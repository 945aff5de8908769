//! Errors of the serving engine. Each variant is one kind of failure the front ends map
//! to a status code (in exactly one place, `trident-server`'s error module).

/// Why a request or a repository operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ServeError {
    /// No model of that name in the repository.
    #[error("unknown model: '{0}'")]
    ModelNotFound(String),
    /// The model exists but not that version (or the version is not loaded).
    #[error("model '{model}' has no ready version {version}")]
    VersionNotFound {
        /// Model name.
        model: String,
        /// Requested version.
        version: String,
    },
    /// The model is known but not ready (failed to load, unloaded, loading).
    #[error("model '{model}' is not ready: {reason}")]
    NotReady {
        /// Model name.
        model: String,
        /// Why.
        reason: String,
    },
    /// The request does not match the model (names, types, shapes, batch size).
    #[error("{0}")]
    InvalidRequest(String),
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
    /// The backend failed while executing.
    #[error("inference failed: {0}")]
    Backend(String),
    /// The model is shutting down.
    #[error("model '{0}' is unloading")]
    Unloading(String),
}
