//! What the HTTP and gRPC front ends answer before either encodes it: one inference
//! path, one model metadata, one list of extensions. Each protocol module only decodes
//! its wire format into these and encodes the results back.

use crate::codec::{SharedInput, ShmRef};
use crate::shm::SharedMemory;
use crate::ApiError;
use std::sync::Arc;
use std::time::Instant;
use trident_core::{DataType, Tensor};
use trident_serve::{InferRequest, InferResponse, ModelVersion, OutputRequest, Repository, ServeError};

/// What both front ends serve: the repository and the shared memory registry.
#[derive(Clone)]
pub(crate) struct App {
    pub repo: Arc<Repository>,
    pub shm: Arc<SharedMemory>,
    /// SageMaker mode: the model `/invocations` runs and `/ping` reports.
    pub sagemaker_model: Option<String>,
    /// Largest request body, also once decompressed.
    pub max_body_bytes: usize,
}

impl axum::extract::FromRef<App> for Arc<Repository> {
    fn from_ref(app: &App) -> Self {
        app.repo.clone()
    }
}

/// The extensions Trident implements, advertised in server metadata (HTTP and gRPC).
pub(crate) const EXTENSIONS: &[&str] = &[
    "classification",
    "sequence",
    "model_repository",
    "model_configuration",
    "system_shared_memory",
    // Listed by Triton's CPU builds too: the routes answer (no regions; registering is
    // refused by name).
    "cuda_shared_memory",
    "binary_tensor_data",
    "statistics",
];

/// Server name reported by server metadata: Triton's, since clients check it (NVIDIA's
/// own examples fail on any other name); the version is Trident's.
pub(crate) const SERVER_NAME: &str = "triton";

/// A request decoded from either wire format.
pub(crate) struct Decoded<R> {
    /// Named input tensors.
    pub inputs: Vec<(String, Tensor)>,
    /// Inputs in shared memory.
    pub shared_inputs: Vec<SharedInput>,
    /// Requested outputs (empty: all).
    pub outputs: Vec<OutputRequest>,
    /// Outputs to write to shared memory instead of the response.
    pub shared_outputs: Vec<(String, ShmRef)>,
    /// The sequence the request belongs to.
    pub sequence: Option<trident_serve::sequence::SequenceFlags>,
    /// What the protocol keeps for encoding the response (id, binary flags, ...).
    pub rest: R,
}

/// A response ready to encode.
pub(crate) struct Answer<R> {
    pub model: Arc<ModelVersion>,
    pub rest: R,
    /// Named outputs, each with whether it went to shared memory (then the response
    /// carries only its name, type and shape).
    pub outputs: Vec<(String, Tensor, bool)>,
}

/// Which entry point a request came through, for Triton's refusal of decoupled models
/// outside streams.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Entry {
    Http,
    GrpcUnary,
}

impl Entry {
    fn refuse_decoupled(self) -> ApiError {
        let text = match self {
            Entry::Http => "HTTP end point doesn't support models with decoupled transaction policy",
            Entry::GrpcUnary => "ModelInfer RPC doesn't support models with decoupled transaction policy",
        };
        ApiError::from(ServeError::Unsupported(text.into()))
    }
}

/// A request decoded and its shared memory inputs read, ready for its model.
struct Prepared<R> {
    model: Arc<ModelVersion>,
    request: InferRequest,
    shared_outputs: Vec<(String, ShmRef)>,
    rest: R,
    /// The regions stay registered until the outputs are written.
    _pinned: Vec<Arc<dyn Send + Sync>>,
}

/// Decodes the request and reads its shared memory inputs (a failure there counts as a
/// failed request of that model, as a validation failure does).
fn prepare<R>(
    app: &App,
    model: Arc<ModelVersion>,
    received: Instant,
    decode: impl FnOnce() -> Result<Decoded<R>, ApiError>,
) -> Result<Prepared<R>, ApiError> {
    let fail = |e: ApiError| {
        model.stats().record_failure(received.elapsed());
        e
    };
    let mut decoded = decode().map_err(fail)?;
    let refs: Vec<&ShmRef> = decoded
        .shared_inputs
        .iter()
        .map(|s| &s.at)
        .chain(decoded.shared_outputs.iter().map(|(_, r)| r))
        .collect();
    let pinned = app.shm.pin(&refs);
    for shared in std::mem::take(&mut decoded.shared_inputs) {
        let bytes = app.shm.read(&shared.at).map_err(fail)?;
        let tensor = Tensor::new(shared.dtype, shared.shape, bytes).map_err(|e| {
            fail(ApiError::bad_request(format!(
                "input '{}' from shared memory region '{}': {e}",
                shared.name, shared.at.region
            )))
        })?;
        decoded.inputs.push((shared.name, tensor));
    }
    Ok(Prepared {
        request: InferRequest {
            inputs: decoded.inputs,
            outputs: decoded.outputs,
            received,
            sequence: decoded.sequence,
        },
        model,
        shared_outputs: decoded.shared_outputs,
        rest: decoded.rest,
        _pinned: pinned,
    })
}

/// Writes the outputs asked for in shared memory; the others go in the answer.
fn answer<R>(
    app: &App,
    model: &Arc<ModelVersion>,
    rest: R,
    shared_outputs: &[(String, ShmRef)],
    response: InferResponse,
) -> Result<Answer<R>, ApiError> {
    let mut outputs = Vec::with_capacity(response.outputs.len());
    for (name, tensor) in response.outputs {
        let shared = match shared_outputs.iter().find(|(n, _)| *n == name) {
            Some((_, at)) => {
                app.shm.write(&name, at, tensor.data())?;
                true
            }
            None => false,
        };
        outputs.push((name, tensor, shared));
    }
    Ok(Answer {
        model: model.clone(),
        rest,
        outputs,
    })
}

/// One inference with one answer, whatever the protocol: find the model version
/// (refusing a decoupled one as Triton does at `entry`), decode the request and read
/// its shared memory inputs, validate, queue and run it, then write the outputs asked
/// for in shared memory.
pub(crate) async fn infer<R>(
    app: &App,
    model: &str,
    version: Option<&str>,
    received: Instant,
    entry: Entry,
    decode: impl FnOnce() -> Result<Decoded<R>, ApiError>,
) -> Result<Answer<R>, ApiError> {
    let model = app.repo.get(model, version)?;
    if model.decoupled() {
        return Err(entry.refuse_decoupled());
    }
    let p = prepare(app, model, received, decode)?;
    let response = p.model.infer(p.request).await?;
    answer(app, &p.model, p.rest, &p.shared_outputs, response)
}

/// One inference of a stream: as [`infer`], except that a decoupled model's responses
/// (any number) are each given to `each` as they come. Returns the model version that
/// answered. `each` returns `false` when the client has gone, which stops the request.
pub(crate) async fn infer_streamed<R: Clone, F: std::future::Future<Output = bool>>(
    app: &App,
    model: &str,
    version: Option<&str>,
    received: Instant,
    decode: impl FnOnce() -> Result<Decoded<R>, ApiError>,
    mut each: impl FnMut(Answer<R>) -> F,
) -> Result<Arc<ModelVersion>, ApiError> {
    let model = app.repo.get(model, version)?;
    let p = prepare(app, model, received, decode)?;
    if !p.model.decoupled() {
        let response = p.model.infer(p.request).await?;
        each(answer(app, &p.model, p.rest, &p.shared_outputs, response)?).await;
        return Ok(p.model);
    }
    let mut responses = p.model.infer_decoupled(p.request)?;
    while let Some(response) = responses.next().await {
        let answer = answer(app, &p.model, p.rest.clone(), &p.shared_outputs, response?)?;
        if !each(answer).await {
            break;
        }
    }
    drop(responses);
    Ok(p.model)
}

/// A model version's metadata.
pub(crate) struct Metadata {
    pub name: String,
    pub versions: Vec<String>,
    pub platform: String,
    pub inputs: Vec<TensorMeta>,
    pub outputs: Vec<TensorMeta>,
}

/// One input or output as clients see it.
pub(crate) struct TensorMeta {
    pub name: String,
    pub datatype: DataType,
    pub shape: Vec<i64>,
}

/// Metadata of `model` (latest ready version when `version` is `None`).
pub(crate) fn metadata(repo: &Repository, model: &str, version: Option<&str>) -> Result<Metadata, ApiError> {
    let found = repo.get(model, version)?;
    let versions = match version {
        Some(v) => vec![v.to_string()],
        None => repo.ready_versions(model).iter().map(i64::to_string).collect(),
    };
    let tensors = |specs: &[trident_serve::IoSpec]| {
        specs
            .iter()
            .map(|s| TensorMeta {
                name: s.name.clone(),
                datatype: s.dtype,
                shape: s.client_shape(found.batching()),
            })
            .collect()
    };
    let config = found.config();
    let platform = if config.platform.is_empty() {
        &config.backend
    } else {
        &config.platform
    };
    Ok(Metadata {
        name: found.name().to_string(),
        versions,
        platform: platform.clone(),
        inputs: tensors(found.inputs()),
        outputs: tensors(found.outputs()),
    })
}

/// Loading parses and optimises model files: blocking work, run off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    what: &'static str,
    work: impl FnOnce() -> Result<T, trident_serve::ServeError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::internal(format!("{what} task failed: {e}")))?
        .map_err(ApiError::from)
}

/// A log setting's value (Triton's log settings extension).
pub(crate) enum Setting {
    Bool(bool),
    Uint(u32),
    Text(String),
}

/// The log settings in force, under Triton's names. Trident logs with `tracing` to
/// standard error, filtered by `TRIDENT_LOG` at start; they cannot be changed at run time.
pub(crate) fn log_settings() -> Vec<(&'static str, Setting)> {
    use tracing::level_filters::LevelFilter;
    let level = LevelFilter::current();
    vec![
        ("log_file", Setting::Text(String::new())),
        ("log_info", Setting::Bool(level >= LevelFilter::INFO)),
        ("log_warning", Setting::Bool(level >= LevelFilter::WARN)),
        ("log_error", Setting::Bool(level >= LevelFilter::ERROR)),
        (
            "log_verbose_level",
            Setting::Uint(u32::from(level >= LevelFilter::DEBUG)),
        ),
        ("log_format", Setting::Text("default".to_string())),
    ]
}

/// A load or unload parameter's value, as either protocol carries it (HTTP: `file:`
/// contents already base64-decoded).
pub(crate) enum ParamValue {
    Text(String),
    Bytes(Vec<u8>),
    Bool(bool),
    /// Another type, named for the error.
    Other(&'static str),
}

impl ParamValue {
    fn kind(&self) -> &'static str {
        match self {
            ParamValue::Text(_) => "a string",
            ParamValue::Bytes(_) => "bytes",
            ParamValue::Bool(_) => "a bool",
            ParamValue::Other(kind) => kind,
        }
    }
}

/// Triton's load parameters: `config` (JSON text) and `file:<path>` (bytes).
pub(crate) fn load_override(
    params: impl IntoIterator<Item = (String, ParamValue)>,
) -> Result<trident_serve::LoadOverride, ApiError> {
    let mut out = trident_serve::LoadOverride::default();
    for (key, value) in params {
        match (key.as_str(), value) {
            ("config", ParamValue::Text(text)) => out.config = Some(text),
            ("config", other) => {
                return Err(ApiError::bad_request(format!(
                "invalid value type for load parameter 'config', expected string_param (JSON text), got {}.",
                other.kind()
            )))
            }
            (k, ParamValue::Bytes(data)) if k.starts_with("file:") => {
                out.files.push((k["file:".len()..].to_string(), data));
            }
            (k, other) if k.starts_with("file:") => {
                return Err(ApiError::bad_request(format!(
                    "invalid value type for load parameter '{k}', expected bytes_param, got {}.",
                    other.kind()
                )))
            }
            (k, _) => {
                return Err(ApiError::bad_request(format!(
                    "unrecognized load parameter '{k}' (Trident's load parameters: config, file:<path>)"
                )))
            }
        }
    }
    Ok(out)
}

/// Triton's unload parameter `unload_dependents` (a bool; default false).
pub(crate) fn unload_dependents(
    params: impl IntoIterator<Item = (String, ParamValue)>,
) -> Result<bool, ApiError> {
    let mut dependents = false;
    for (key, value) in params {
        match (key.as_str(), value) {
            ("unload_dependents", ParamValue::Bool(b)) => dependents = b,
            ("unload_dependents", other) => {
                return Err(ApiError::bad_request(format!(
                    "invalid value type for 'unload_dependents' parameter, expected bool_param, got {}.",
                    other.kind()
                )))
            }
            (k, _) => {
                return Err(ApiError::bad_request(format!(
                    "unrecognized unload parameter '{k}' (Trident's unload parameter: unload_dependents)"
                )))
            }
        }
    }
    Ok(dependents)
}

/// CUDA shared memory on a CPU server (both front ends): no region exists, so the list
/// is empty and a named region is unknown.
pub(crate) fn cuda_status(region: Option<&str>) -> Result<(), ApiError> {
    match region {
        None => Ok(()),
        Some(name) => Err(ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            format!("Unable to find cuda shared memory region: '{name}'"),
        )),
    }
}

/// Registering CUDA shared memory is refused: no GPU.
pub(crate) fn cuda_register(region: &str) -> ApiError {
    ApiError::bad_request(format!(
        "failed to register CUDA shared memory region: '{region}', GPUs not supported"
    ))
}

/// Changing log settings at run time is refused, naming the first setting asked for
/// (in name order).
pub(crate) fn refuse_log_change<'a>(keys: impl Iterator<Item = &'a String>) -> Result<(), ApiError> {
    match keys.min() {
        Some(key) => Err(ApiError::new(
            axum::http::StatusCode::NOT_IMPLEMENTED,
            format!("changing log setting '{key}' at run time is not supported by Trident (set TRIDENT_LOG at start)"),
        )),
        None => Ok(()),
    }
}
