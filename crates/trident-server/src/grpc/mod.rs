//! Triton's gRPC front end: `inference.GRPCInferenceService` (Triton's
//! `grpc_service.proto`) and `grpc.health.v1.Health`, on tonic.
//!
//! Every RPC is a thin adapter over the same pieces the HTTP routes use
//! (`front::infer`, `front::metadata`, the repository, the statistics), so validation,
//! batching, statistics and metrics are one path. Errors carry the same texts as over
//! HTTP, with the gRPC code the HTTP status maps to (`error.rs`). What Trident does not
//! implement (CUDA shared memory, trace settings, changing log settings) is refused by
//! name with `UNIMPLEMENTED`.

mod tensors;

use crate::front::{self, App};
use crate::tls::TlsFiles;
use crate::ApiError;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status, Streaming};
use trident_core::config::pb;
use trident_serve::sequence::CorrelationId;

#[allow(missing_docs, clippy::all)]
mod generated {
    tonic::include_proto!("inference");
}

use generated::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};

/// gRPC settings (Triton's `--grpc-*` flags).
#[derive(Debug, Clone)]
pub struct GrpcConfig {
    /// Largest message accepted or sent, in bytes. tritonclient allows `INT32_MAX` both
    /// ways; so does Triton.
    pub max_message_bytes: usize,
    /// Compress responses with gzip when the client accepts it
    /// (`--grpc-infer-response-compression-level` other than `none`).
    pub compress_responses: bool,
    /// HTTP/2 keepalive ping interval (`--grpc-keepalive-time`).
    pub keepalive_time: Option<Duration>,
    /// How long to wait for a ping's acknowledgement (`--grpc-keepalive-timeout`).
    pub keepalive_timeout: Option<Duration>,
    /// TLS (`--grpc-use-ssl`, and `--grpc-use-ssl-mutual` with a client CA).
    pub tls: Option<crate::TlsFiles>,
    /// Single-port mode: gRPC is served on the HTTP listener (HTTP/2 connections),
    /// not a listener of its own.
    pub same_port: bool,
}

impl Default for GrpcConfig {
    fn default() -> Self {
        GrpcConfig {
            max_message_bytes: i32::MAX as usize,
            compress_responses: false,
            // Triton's defaults: a ping every 2 hours, 20 s to answer it.
            keepalive_time: Some(Duration::from_secs(7200)),
            keepalive_timeout: Some(Duration::from_secs(20)),
            tls: None,
            same_port: false,
        }
    }
}

/// Requests of one `ModelStreamInfer` stream being executed at once; more wait (the
/// stream is read no further) until one finishes.
const STREAM_IN_FLIGHT: usize = 1024;

/// The `GRPCInferenceService` implementation.
struct Service {
    app: App,
}

/// The inference service with its limits and compression.
fn service(app: App, config: &GrpcConfig) -> GrpcInferenceServiceServer<Service> {
    let mut service = GrpcInferenceServiceServer::new(Service { app })
        .max_decoding_message_size(config.max_message_bytes)
        .max_encoding_message_size(config.max_message_bytes)
        .accept_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Deflate);
    if config.compress_responses {
        service = service.send_compressed(CompressionEncoding::Gzip);
    }
    service
}

/// grpc.health.v1 reporting the server and the inference service as serving.
async fn health(
) -> tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<GrpcInferenceServiceServer<Service>>()
        .await;
    // The empty service name is the server as a whole (grpc_health_probe's default).
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    health
}

/// Both gRPC services as an axum router, for single-port mode.
pub(crate) async fn router(app: App, config: &GrpcConfig) -> axum::Router {
    tonic::service::Routes::new(health().await)
        .add_service(service(app, config))
        .prepare()
        .into_axum_router()
}

/// tonic's TLS settings from the `--grpc-*` files, each read and checked once, before
/// any service starts (a bad file stops the server with its path).
pub(crate) fn tls_config(files: &TlsFiles) -> std::io::Result<tonic::transport::ServerTlsConfig> {
    use tonic::transport::{Certificate, Identity, ServerTlsConfig};
    let pem = files.pem()?;
    let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(pem.cert, pem.key));
    if let Some(ca) = pem.client_ca {
        tls = tls.client_ca_root(Certificate::from_pem(ca));
    }
    Ok(tls)
}

/// Serves gRPC on `listener` (over TLS with `tls`) until `stop` turns true, then lets
/// in-flight calls finish for up to `drain`.
pub(crate) async fn serve(
    listener: TcpListener,
    app: App,
    config: GrpcConfig,
    tls: Option<tonic::transport::ServerTlsConfig>,
    drain: Duration,
    stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let service = service(app, &config);
    let health = health().await;
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let stopping = stopped(stop.clone());
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls).map_err(std::io::Error::other)?;
    }
    let server = builder
        .http2_keepalive_interval(config.keepalive_time)
        .http2_keepalive_timeout(config.keepalive_timeout)
        .add_service(health)
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, stopping);
    let deadline = async move {
        stopped(stop).await;
        tokio::time::sleep(drain).await;
        tracing::warn!("gRPC: calls still running after the drain timeout were dropped");
    };
    tokio::select! {
        served = server => served.map_err(std::io::Error::other),
        () = deadline => Ok(()),
    }
}

async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|&s| s).await;
}

fn version_of(v: &str) -> Option<&str> {
    (!v.is_empty()).then_some(v)
}

/// The request's tensors and its id, for `front`.
fn decode(request: &mut pb::ModelInferRequest, name: &str) -> Result<front::Decoded<String>, ApiError> {
    let mut decoded = tensors::decode(request, name)?;
    decoded.rest = std::mem::take(&mut request.id);
    Ok(decoded)
}

/// One unary `ModelInfer`.
async fn infer_one(app: &App, mut request: pb::ModelInferRequest) -> Result<pb::ModelInferResponse, Status> {
    let received = Instant::now();
    let name = std::mem::take(&mut request.model_name);
    let version = std::mem::take(&mut request.model_version);
    let answer = front::infer(
        app,
        &name,
        version_of(&version),
        received,
        front::Entry::GrpcUnary,
        || decode(&mut request, &name),
    )
    .await?;
    Ok(tensors::encode(
        answer.model.name(),
        answer.model.version(),
        answer.rest,
        answer.outputs,
    ))
}

type StreamSender = mpsc::Sender<Result<pb::ModelStreamInferResponse, Status>>;

/// Marks a streamed response as Triton does: `triton_final_response` says whether it
/// completes its request.
fn with_final_flag(mut response: pb::ModelInferResponse, last: bool) -> pb::ModelStreamInferResponse {
    response.parameters.insert(
        "triton_final_response".to_string(),
        pb::InferParameter {
            parameter_choice: Some(pb::infer_parameter::ParameterChoice::BoolParam(last)),
        },
    );
    pb::ModelStreamInferResponse {
        error_message: String::new(),
        infer_response: Some(response),
    }
}

/// One request of a `ModelStreamInfer` stream: its response, or a decoupled model's
/// responses as they come (none final; an empty final one follows when the request
/// sets `triton_enable_empty_final_response`), or its error in-stream.
async fn stream_one(app: &App, mut request: pb::ModelInferRequest, tx: &StreamSender) {
    let received = Instant::now();
    let empty_final = tensors::empty_final_response(&request.parameters).unwrap_or(false);
    let name = std::mem::take(&mut request.model_name);
    let version = std::mem::take(&mut request.model_version);
    let id = request.id.clone();
    let result = front::infer_streamed(
        app,
        &name,
        version_of(&version),
        received,
        || decode(&mut request, &name),
        |answer: front::Answer<String>| {
            let last = !answer.model.decoupled();
            let response = tensors::encode(
                answer.model.name(),
                answer.model.version(),
                answer.rest,
                answer.outputs,
            );
            let tx = tx.clone();
            async move { tx.send(Ok(with_final_flag(response, last))).await.is_ok() }
        },
    )
    .await;
    let message = match result {
        Ok(model) if model.decoupled() && empty_final => with_final_flag(
            pb::ModelInferResponse {
                model_name: model.name().to_string(),
                model_version: model.version().to_string(),
                id,
                ..Default::default()
            },
            true,
        ),
        Ok(_) => return,
        Err(e) => pb::ModelStreamInferResponse {
            error_message: Status::from(e).message().to_string(),
            infer_response: Some(pb::ModelInferResponse {
                model_name: name,
                model_version: version,
                id,
                ..Default::default()
            }),
        },
    };
    let _ = tx.send(Ok(message)).await;
}

fn unimplemented(what: &str) -> Status {
    Status::unimplemented(format!("{what} is not supported by Trident"))
}

fn duration(d: trident_serve::stats::DurationSnapshot) -> Option<pb::StatisticDuration> {
    Some(pb::StatisticDuration {
        count: d.count,
        ns: d.ns,
    })
}

fn statistics(s: trident_serve::stats::ModelStatSnapshot) -> pb::ModelStatistics {
    let i = s.inference_stats;
    pb::ModelStatistics {
        name: s.name,
        version: s.version,
        last_inference: s.last_inference,
        inference_count: s.inference_count,
        execution_count: s.execution_count,
        inference_stats: Some(pb::InferStatistics {
            success: duration(i.success),
            fail: duration(i.fail),
            queue: duration(i.queue),
            compute_input: duration(i.compute_input),
            compute_infer: duration(i.compute_infer),
            compute_output: duration(i.compute_output),
            cache_hit: duration(i.cache_hit),
            cache_miss: duration(i.cache_miss),
        }),
        batch_stats: s
            .batch_stats
            .into_iter()
            .map(|b| pb::InferBatchStatistics {
                batch_size: b.batch_size as u64,
                compute_input: duration(b.compute_input),
                compute_infer: duration(b.compute_infer),
                compute_output: duration(b.compute_output),
            })
            .collect(),
        memory_usage: vec![],
        response_stats: HashMap::new(),
    }
}

#[tonic::async_trait]
impl GrpcInferenceService for Service {
    async fn server_live(
        &self,
        _: Request<pb::ServerLiveRequest>,
    ) -> Result<Response<pb::ServerLiveResponse>, Status> {
        Ok(Response::new(pb::ServerLiveResponse { live: true }))
    }

    /// Ready once the startup models are loaded (the server is built only then).
    async fn server_ready(
        &self,
        _: Request<pb::ServerReadyRequest>,
    ) -> Result<Response<pb::ServerReadyResponse>, Status> {
        Ok(Response::new(pb::ServerReadyResponse { ready: true }))
    }

    /// Ready or not, as Triton answers: an unknown model is not ready (no error).
    async fn model_ready(
        &self,
        request: Request<pb::ModelReadyRequest>,
    ) -> Result<Response<pb::ModelReadyResponse>, Status> {
        let r = request.into_inner();
        let ready = self.app.repo.get(&r.name, version_of(&r.version)).is_ok();
        Ok(Response::new(pb::ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        _: Request<pb::ServerMetadataRequest>,
    ) -> Result<Response<pb::ServerMetadataResponse>, Status> {
        Ok(Response::new(pb::ServerMetadataResponse {
            name: front::SERVER_NAME.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            extensions: front::EXTENSIONS.iter().map(|e| e.to_string()).collect(),
        }))
    }

    async fn model_metadata(
        &self,
        request: Request<pb::ModelMetadataRequest>,
    ) -> Result<Response<pb::ModelMetadataResponse>, Status> {
        let r = request.into_inner();
        let m = front::metadata(&self.app.repo, &r.name, version_of(&r.version))?;
        let tensors = |specs: Vec<front::TensorMeta>| {
            specs
                .into_iter()
                .map(|t| pb::model_metadata_response::TensorMetadata {
                    name: t.name,
                    datatype: t.datatype.as_str().to_string(),
                    shape: t.shape,
                })
                .collect()
        };
        Ok(Response::new(pb::ModelMetadataResponse {
            name: m.name,
            versions: m.versions,
            platform: m.platform,
            inputs: tensors(m.inputs),
            outputs: tensors(m.outputs),
        }))
    }

    async fn model_infer(
        &self,
        request: Request<pb::ModelInferRequest>,
    ) -> Result<Response<pb::ModelInferResponse>, Status> {
        Ok(Response::new(infer_one(&self.app, request.into_inner()).await?))
    }

    type ModelStreamInferStream = ReceiverStream<Result<pb::ModelStreamInferResponse, Status>>;

    /// Each request of the stream runs as it arrives (up to [`STREAM_IN_FLIGHT`] at
    /// once) and its response is sent when it completes; a failed request is answered
    /// in-stream with `error_message` (and its id) while the stream goes on.
    async fn model_stream_infer(
        &self,
        request: Request<Streaming<pb::ModelInferRequest>>,
    ) -> Result<Response<Self::ModelStreamInferStream>, Status> {
        let mut incoming = request.into_inner();
        let (tx, rx) = mpsc::channel(64);
        let app = self.app.clone();
        tokio::spawn(async move {
            let in_flight = Arc::new(Semaphore::new(STREAM_IN_FLIGHT));
            // Requests of one sequence run in stream order: each waits for the one before
            // it (of the same model and correlation ID) to finish.
            let mut chains: HashMap<(String, CorrelationId), oneshot::Receiver<()>> = HashMap::new();
            loop {
                let message = match incoming.message().await {
                    Ok(Some(m)) => m,
                    Ok(None) => break,
                    Err(status) => {
                        let _ = tx.send(Err(status)).await;
                        break;
                    }
                };
                let Ok(permit) = in_flight.clone().acquire_owned().await else {
                    break;
                };
                let (done, after) = match tensors::sequence(&message.parameters) {
                    Ok(Some(flags)) => {
                        let (done, next) = oneshot::channel();
                        let key = (message.model_name.clone(), flags.id.clone());
                        let after = if flags.end {
                            chains.remove(&key)
                        } else {
                            chains.insert(key, next)
                        };
                        (Some(done), after)
                    }
                    _ => (None, None),
                };
                let (tx, app) = (tx.clone(), app.clone());
                tokio::spawn(async move {
                    if let Some(previous) = after {
                        // Finished or gone (its sender dropped): either way it is done.
                        let _ = previous.await;
                    }
                    stream_one(&app, message, &tx).await;
                    if let Some(done) = done {
                        let _ = done.send(());
                    }
                    drop(permit);
                });
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn model_config(
        &self,
        request: Request<pb::ModelConfigRequest>,
    ) -> Result<Response<pb::ModelConfigResponse>, Status> {
        let r = request.into_inner();
        let model = self
            .app
            .repo
            .get(&r.name, version_of(&r.version))
            .map_err(ApiError::from)?;
        Ok(Response::new(pb::ModelConfigResponse {
            config: Some(model.config().clone()),
        }))
    }

    async fn model_statistics(
        &self,
        request: Request<pb::ModelStatisticsRequest>,
    ) -> Result<Response<pb::ModelStatisticsResponse>, Status> {
        let r = request.into_inner();
        let name = (!r.name.is_empty()).then_some(r.name.as_str());
        let stats = self
            .app
            .repo
            .stats(name, version_of(&r.version))
            .map_err(ApiError::from)?;
        Ok(Response::new(pb::ModelStatisticsResponse {
            model_stats: stats.into_iter().map(statistics).collect(),
        }))
    }

    async fn repository_index(
        &self,
        request: Request<pb::RepositoryIndexRequest>,
    ) -> Result<Response<pb::RepositoryIndexResponse>, Status> {
        let r = request.into_inner();
        one_repository(&r.repository_name)?;
        let models = self
            .app
            .repo
            .index(r.ready)
            .map_err(ApiError::from)?
            .into_iter()
            .map(|e| pb::repository_index_response::ModelIndex {
                name: e.name,
                version: e.version.unwrap_or_default(),
                state: e.state.unwrap_or_default().to_string(),
                reason: e.reason.unwrap_or_default(),
            })
            .collect();
        Ok(Response::new(pb::RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(
        &self,
        request: Request<pb::RepositoryModelLoadRequest>,
    ) -> Result<Response<pb::RepositoryModelLoadResponse>, Status> {
        let r = request.into_inner();
        one_repository(&r.repository_name)?;
        let overrides = front::load_override(r.parameters.into_iter().map(repository_param))?;
        let repo = self.app.repo.clone();
        front::blocking("load", move || repo.load_with(&r.model_name, overrides)).await?;
        Ok(Response::new(pb::RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        request: Request<pb::RepositoryModelUnloadRequest>,
    ) -> Result<Response<pb::RepositoryModelUnloadResponse>, Status> {
        let r = request.into_inner();
        one_repository(&r.repository_name)?;
        let dependents = front::unload_dependents(r.parameters.into_iter().map(repository_param))?;
        let repo = self.app.repo.clone();
        front::blocking("unload", move || repo.unload_with(&r.model_name, dependents)).await?;
        Ok(Response::new(pb::RepositoryModelUnloadResponse {}))
    }

    async fn system_shared_memory_status(
        &self,
        request: Request<pb::SystemSharedMemoryStatusRequest>,
    ) -> Result<Response<pb::SystemSharedMemoryStatusResponse>, Status> {
        let r = request.into_inner();
        let regions = self
            .app
            .shm
            .status((!r.name.is_empty()).then_some(r.name.as_str()))?
            .into_iter()
            .map(|s| {
                let status = pb::system_shared_memory_status_response::RegionStatus {
                    name: s.name.clone(),
                    key: s.key,
                    offset: s.offset,
                    byte_size: s.byte_size,
                };
                (s.name, status)
            })
            .collect();
        Ok(Response::new(pb::SystemSharedMemoryStatusResponse { regions }))
    }

    async fn system_shared_memory_register(
        &self,
        request: Request<pb::SystemSharedMemoryRegisterRequest>,
    ) -> Result<Response<pb::SystemSharedMemoryRegisterResponse>, Status> {
        let r = request.into_inner();
        self.app.shm.register(&r.name, &r.key, r.offset, r.byte_size)?;
        Ok(Response::new(pb::SystemSharedMemoryRegisterResponse {}))
    }

    async fn system_shared_memory_unregister(
        &self,
        request: Request<pb::SystemSharedMemoryUnregisterRequest>,
    ) -> Result<Response<pb::SystemSharedMemoryUnregisterResponse>, Status> {
        let r = request.into_inner();
        self.app
            .shm
            .unregister((!r.name.is_empty()).then_some(r.name.as_str()))?;
        Ok(Response::new(pb::SystemSharedMemoryUnregisterResponse {}))
    }

    /// A CPU server has no CUDA regions: the list is empty, a named one is unknown.
    async fn cuda_shared_memory_status(
        &self,
        request: Request<pb::CudaSharedMemoryStatusRequest>,
    ) -> Result<Response<pb::CudaSharedMemoryStatusResponse>, Status> {
        let r = request.into_inner();
        front::cuda_status(version_of(&r.name))?;
        Ok(Response::new(pb::CudaSharedMemoryStatusResponse::default()))
    }

    async fn cuda_shared_memory_register(
        &self,
        request: Request<pb::CudaSharedMemoryRegisterRequest>,
    ) -> Result<Response<pb::CudaSharedMemoryRegisterResponse>, Status> {
        Err(front::cuda_register(&request.into_inner().name).into())
    }

    /// Nothing is registered, so unregistering succeeds (as on Triton's CPU build).
    async fn cuda_shared_memory_unregister(
        &self,
        _: Request<pb::CudaSharedMemoryUnregisterRequest>,
    ) -> Result<Response<pb::CudaSharedMemoryUnregisterResponse>, Status> {
        Ok(Response::new(pb::CudaSharedMemoryUnregisterResponse {}))
    }

    async fn trace_setting(
        &self,
        _: Request<pb::TraceSettingRequest>,
    ) -> Result<Response<pb::TraceSettingResponse>, Status> {
        Err(unimplemented("request tracing (trace settings)"))
    }

    /// The log settings as they are; changing them is refused by name.
    async fn log_settings(
        &self,
        request: Request<pb::LogSettingsRequest>,
    ) -> Result<Response<pb::LogSettingsResponse>, Status> {
        let r = request.into_inner();
        front::refuse_log_change(r.settings.keys())?;
        use pb::log_settings_response::{setting_value::ParameterChoice, SettingValue};
        let value = |c| SettingValue {
            parameter_choice: Some(c),
        };
        let settings = crate::front::log_settings()
            .into_iter()
            .map(|(k, v)| {
                let c = match v {
                    front::Setting::Bool(b) => ParameterChoice::BoolParam(b),
                    front::Setting::Uint(u) => ParameterChoice::Uint32Param(u),
                    front::Setting::Text(s) => ParameterChoice::StringParam(s),
                };
                (k.to_string(), value(c))
            })
            .collect();
        Ok(Response::new(pb::LogSettingsResponse { settings }))
    }
}

/// A `ModelRepositoryParameter` as the shared load/unload parameter type.
fn repository_param((key, p): (String, pb::ModelRepositoryParameter)) -> (String, front::ParamValue) {
    use pb::model_repository_parameter::ParameterChoice as C;
    let value = match p.parameter_choice {
        Some(C::StringParam(s)) => front::ParamValue::Text(s),
        Some(C::BytesParam(b)) => front::ParamValue::Bytes(b),
        Some(C::BoolParam(b)) => front::ParamValue::Bool(b),
        Some(C::Int64Param(_)) => front::ParamValue::Other("int64_param"),
        None => front::ParamValue::Other("no value"),
    };
    (key, value)
}

/// Trident serves one repository, addressed with an empty `repository_name`.
fn one_repository(name: &str) -> Result<(), Status> {
    match name {
        "" => Ok(()),
        other => Err(ApiError::bad_request(format!(
            "repository_name '{other}': Trident serves one model repository; leave repository_name empty"
        ))
        .into()),
    }
}
