//! The `Backend` trait: how a model file becomes something that executes batches.
//!
//! Three layers, following tract's plan/state split: a [`Backend`] loads a model file
//! into a [`Model`] (parsed and optimised once, shared read-only), which spawns any
//! number of [`ModelInstance`]s (per-instance scratch state and threads). The server
//! validates requests against `config.pbtxt` before anything reaches a backend, so a
//! backend only sees well-formed, correctly typed tensors. A native candle backend is a
//! new implementation of these traits, nothing else changes.

pub mod image;
pub mod repeat;
pub mod table;
pub mod tokenizer;
#[cfg(feature = "tract")]
pub mod tract;

#[cfg(feature = "ort")]
pub mod ort;

use std::path::Path;
use std::sync::Arc;
use trident_core::{DataType, Tensor};

/// The process-wide tract backend, or why this build has none (cargo feature `tract`).
pub fn tract_engine() -> Result<Arc<dyn Backend>, BackendError> {
    #[cfg(feature = "tract")]
    {
        static TRACT: std::sync::OnceLock<Arc<dyn Backend>> = std::sync::OnceLock::new();
        Ok(TRACT.get_or_init(|| Arc::new(tract::TractBackend)).clone())
    }
    #[cfg(not(feature = "tract"))]
    Err(BackendError::Unavailable {
        engine: "tract",
        why: "this trident was built without the `tract` feature".into(),
    })
}

/// The process-wide ONNX Runtime backend, or why this build (cargo feature `ort`) or this
/// machine (no library found) has none.
pub fn ort_engine() -> Result<Arc<dyn Backend>, BackendError> {
    #[cfg(feature = "ort")]
    return ort::shared();
    #[cfg(not(feature = "ort"))]
    Err(BackendError::Unavailable {
        engine: "onnxruntime",
        why: "this trident was built without the `ort` feature".into(),
    })
}

/// An input or output of a model as the model file declares it.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub dtype: DataType,
    /// Dimensions; `None` where the model leaves a dimension symbolic (batch, sequence).
    pub shape: Vec<Option<i64>>,
}

/// What a model consumes and produces.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ModelIo {
    /// Inputs in the model's order.
    pub inputs: Vec<TensorSpec>,
    /// Outputs in the model's order.
    pub outputs: Vec<TensorSpec>,
}

/// Errors a backend reports. Messages say what was wrong; they reach logs and clients.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BackendError {
    /// The model file could not be loaded or optimised.
    #[error("cannot load {path}: {message}")]
    Load {
        /// Model file.
        path: String,
        /// Cause.
        message: String,
    },
    /// The backend cannot handle a data type the model or config uses.
    #[error("backend {backend} does not support data type {dtype} (tensor '{tensor}')")]
    UnsupportedType {
        /// Backend name.
        backend: &'static str,
        /// The type.
        dtype: String,
        /// The tensor using it.
        tensor: String,
    },
    /// Execution failed.
    #[error("execution failed: {0}")]
    Execute(String),
    /// A request's data cannot be used (text too long, bytes that are not an image):
    /// the client's error, answered 400 (after a merged execution, the requests are run
    /// again one by one, so only the culprit gets it).
    #[error("{0}")]
    InvalidInput(String),
    /// An input's BYTES element is not UTF-8, for an engine that takes BYTES inputs as
    /// UTF-8 strings: the client's error, answered 400 like [`BackendError::InvalidInput`].
    #[error("input '{input}': BYTES element {element} is not valid UTF-8; {engine} takes BYTES inputs as UTF-8 strings")]
    NotUtf8 {
        /// The input's name.
        input: String,
        /// Index of the first element that is not UTF-8.
        element: usize,
        /// The engine, as its messages name it (`"tract"`, `"ONNX Runtime"`).
        engine: String,
    },
    /// The engine is not available in this build (a cargo feature left out) or on this
    /// machine (its library not found or not loadable): the operator's to fix.
    #[error("{why}")]
    Unavailable {
        /// The engine ([`Backend::name`]: `"tract"`, `"onnxruntime"`).
        engine: &'static str,
        /// Why, as the operator reads it.
        why: String,
    },
}

impl BackendError {
    /// Whether the error is the client's (its request's data), not the engine's or the
    /// model's: [`BackendError::InvalidInput`] and [`BackendError::NotUtf8`].
    pub fn is_invalid_input(&self) -> bool {
        matches!(self, BackendError::InvalidInput(_) | BackendError::NotUtf8 { .. })
    }
}

/// A `parameters` value of a model's `config.pbtxt` that does not parse as the type a
/// backend needs (the operator's mistake; backends report it as a load error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("parameter '{key}' = \"{value}\" is not a valid {expected}")]
pub struct ParameterError {
    /// The parameter's key.
    pub key: String,
    /// The value as written.
    pub value: String,
    /// The Rust type it should parse as (`usize`, `f32`, `bool`).
    pub expected: &'static str,
}

/// Options for loading a model.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Intra-op threads each instance may use.
    pub threads_per_instance: usize,
    /// The model's `config.pbtxt` as written (before auto-completion): backends that take
    /// their settings from `parameters` and their tensor names from `input`/`output`
    /// read them here.
    pub config: trident_core::config::ModelConfig,
}

impl LoadOptions {
    /// `parameters { key: ... value { string_value: ... } }`, if set.
    pub fn parameter(&self, key: &str) -> Option<&str> {
        self.config.parameters.get(key).map(|p| p.string_value.as_str())
    }

    /// A parameter parsed as `T`, `default` when absent; the error names the key.
    pub fn parsed<T: std::str::FromStr>(&self, key: &str, default: T) -> Result<T, ParameterError> {
        match self.parameter(key) {
            None => Ok(default),
            Some(v) => v.trim().parse().map_err(|_| ParameterError {
                key: key.to_string(),
                value: v.to_string(),
                expected: std::any::type_name::<T>(),
            }),
        }
    }
}

/// A factory for models from files of one format.
pub trait Backend: Send + Sync {
    /// Short name for logs and errors (`"tract"`, `"onnxruntime"`).
    fn name(&self) -> &'static str;
    /// Loads and optimises a model file once; instances are spawned from the result.
    fn load(&self, path: &Path, options: &LoadOptions) -> Result<Box<dyn Model>, BackendError>;
}

/// A loaded, optimised model, shared read-only by its instances.
pub trait Model: Send + Sync {
    /// Inputs and outputs as the model file declares them.
    fn io(&self) -> &ModelIo;
    /// A new instance with its own execution state.
    fn instance(&self) -> Result<Box<dyn ModelInstance>, BackendError>;
    /// Checks an input for what this engine needs beyond `config.pbtxt` (e.g. BYTES
    /// that are UTF-8), before the request joins a batch: a refusal fails only that
    /// request, as the client's error (whatever the variant: the server answers 400),
    /// and never an execution shared with others.
    fn check_input(&self, name: &str, tensor: &Tensor) -> Result<(), BackendError> {
        let _ = (name, tensor);
        Ok(())
    }
}

/// For engines whose string tensors are UTF-8 (ONNX Runtime, tract): the first BYTES
/// element that is not, named.
pub fn check_utf8(engine: &str, name: &str, tensor: &Tensor) -> Result<(), BackendError> {
    if tensor.dtype() != DataType::Bytes {
        return Ok(());
    }
    let elements = trident_core::tensor::bytes_elements(tensor.data())
        .map_err(|e| BackendError::InvalidInput(format!("input '{name}': {e}")))?;
    match elements.iter().position(|e| std::str::from_utf8(e).is_err()) {
        Some(element) => Err(BackendError::NotUtf8 {
            input: name.to_string(),
            element,
            engine: engine.to_string(),
        }),
        None => Ok(()),
    }
}

/// The elements of the BYTES input `name` among `inputs` (Trident's pre-processing
/// backends take one text or image per element).
pub fn bytes_input<'a>(inputs: &'a [(String, Tensor)], name: &str) -> Result<Vec<&'a [u8]>, BackendError> {
    let (_, t) = inputs
        .iter()
        .find(|(n, _)| n == name)
        .ok_or_else(|| BackendError::Execute(format!("input '{name}' missing")))?;
    trident_core::tensor::bytes_elements(t.data())
        .map_err(|e| BackendError::InvalidInput(format!("input '{name}': {e}")))
}

/// Runs `f`, turning a panic inside an engine (a bug, or a model the engine cannot
/// handle) into an error naming it, so that one model cannot take the server down.
pub fn guard_panics<T>(what: &str, f: impl FnOnce() -> Result<T, BackendError>) -> Result<T, BackendError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".into());
            Err(BackendError::Execute(format!(
                "the engine panicked {what}: {message}"
            )))
        }
    }
}

/// One execution context, used by exactly one OS thread at a time.
pub trait ModelInstance: Send {
    /// Runs the model on named inputs (a subset of [`ModelIo::inputs`] when some are
    /// optional) and returns every output of the model, in [`ModelIo::outputs`] order.
    fn execute(&mut self, inputs: Vec<(String, Tensor)>) -> Result<Vec<(String, Tensor)>, BackendError>;

    /// Runs one request of a decoupled model (`model_transaction_policy { decoupled:
    /// true }`): any number of responses, each sent through `responses`, possibly from
    /// threads the instance starts and after this returns (Triton's response factory).
    /// The request is complete when the last clone of `responses` is dropped. The
    /// instance takes the next request once this returns. An error returned here ends
    /// the request with that error after the responses already sent.
    ///
    /// By default the model's one answer is the one response.
    fn execute_decoupled(
        &mut self,
        inputs: Vec<(String, Tensor)>,
        responses: ResponseSender,
    ) -> Result<(), BackendError> {
        let outputs = self.execute(inputs)?;
        responses.send(outputs);
        Ok(())
    }
}

/// What travels from an instance to the request a decoupled model is answering.
#[derive(Debug)]
pub(crate) enum Streamed {
    /// An instance took the request at this instant.
    Dispatched(std::time::Instant),
    /// One response: every output of the model.
    Response(Vec<(String, Tensor)>),
    /// The request failed; nothing follows.
    Failed(crate::ServeError),
}

/// Where a decoupled model sends the responses of one request. Clone it into the
/// threads that produce them; the request completes when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct ResponseSender {
    tx: tokio::sync::mpsc::Sender<Streamed>,
}

impl ResponseSender {
    pub(crate) fn new(tx: tokio::sync::mpsc::Sender<Streamed>) -> Self {
        ResponseSender { tx }
    }

    /// Sends one response: every output of the model, in [`ModelIo::outputs`] order.
    /// Waits while the client is a few responses behind. Returns `false` when the
    /// client has gone (the stream was closed or cancelled): stop producing.
    ///
    /// Call it from an instance thread or a thread of the backend's own, never from
    /// an async task (it blocks).
    pub fn send(&self, outputs: Vec<(String, Tensor)>) -> bool {
        self.tx.blocking_send(Streamed::Response(outputs)).is_ok()
    }

    /// Whether the client has gone, so that a backend can stop early.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// The suite every ONNX engine passes; nothing to run in a build with neither.
#[cfg(all(test, any(feature = "tract", feature = "ort")))]
pub(crate) mod conformance;
