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
