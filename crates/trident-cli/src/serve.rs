//! `trident serve`: flags named as Triton's, so existing launch scripts work.

use anyhow::Context;
use clap::{Args, ValueEnum};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use trident_serve::{ControlMode, OnnxEngine, Repository, RepositoryOptions};
use trident_server::{GrpcConfig, ServerConfig, TlsFiles};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Model repository directory (`<model>/config.pbtxt`, `<model>/<version>/model.onnx`).
    /// Required, except in SageMaker's container, where `/opt/ml/model` is used.
    #[arg(long, alias = "model-store", env = "TRIDENT_MODEL_REPOSITORY")]
    model_repository: Option<PathBuf>,
    /// SageMaker's Triton contract: `GET /ping` and `POST /invocations` for the model
    /// named by SAGEMAKER_TRITON_DEFAULT_MODEL_NAME (or the repository's only model), on
    /// --sagemaker-port or $SAGEMAKER_BIND_TO_PORT; gRPC and metrics off. On by itself
    /// when no --model-repository is given and SAGEMAKER_BIND_TO_PORT is set or
    /// /opt/ml/model exists (`docker run IMAGE serve`).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    allow_sagemaker: bool,
    /// Port of the SageMaker endpoints (SAGEMAKER_BIND_TO_PORT wins when set).
    #[arg(long, default_value_t = 8080)]
    sagemaker_port: u16,
    /// Address the HTTP and metrics services bind.
    #[arg(long, default_value = "0.0.0.0")]
    http_address: String,
    /// HTTP port (0 picks a free one; the log says which).
    #[arg(long, default_value_t = 8000)]
    http_port: u16,
    /// Serve Triton's gRPC API (inference.GRPCInferenceService and grpc.health.v1).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    allow_grpc: bool,
    /// Address the gRPC service binds.
    #[arg(long, default_value = "0.0.0.0")]
    grpc_address: String,
    /// gRPC port (0 picks a free one; the log says which). The same port as
    /// --http-port serves REST and gRPC on that one port (single-port mode, for
    /// KServe's one-port containers).
    #[arg(long, default_value_t = 8001)]
    grpc_port: u16,
    /// Largest gRPC message received or sent, in bytes (tritonclient's and Triton's
    /// limit, INT32_MAX, by default).
    #[arg(long, default_value_t = GrpcConfig::default().max_message_bytes)]
    grpc_max_message_bytes: usize,
    /// gzip inference responses for clients that accept it: none, or low/medium/high
    /// (all three use gzip's default level).
    #[arg(long, value_enum, default_value_t = Compression::None)]
    grpc_infer_response_compression_level: Compression,
    /// Milliseconds between HTTP/2 keepalive pings on a gRPC connection (Triton's
    /// default, 2 hours).
    #[arg(long, default_value_t = 7_200_000)]
    grpc_keepalive_time: u64,
    /// Milliseconds to wait for a keepalive ping's acknowledgement before closing the
    /// connection (Triton's default, 20 s).
    #[arg(long, default_value_t = 20_000)]
    grpc_keepalive_timeout: u64,
    /// Serve gRPC over TLS (Triton's flag); needs --grpc-server-cert and --grpc-server-key.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    grpc_use_ssl: bool,
    /// Also require client certificates signed by --grpc-root-cert (mutual TLS).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    grpc_use_ssl_mutual: bool,
    /// PEM certificate chain of the gRPC service.
    #[arg(long)]
    grpc_server_cert: Option<PathBuf>,
    /// PEM private key of the gRPC service.
    #[arg(long)]
    grpc_server_key: Option<PathBuf>,
    /// PEM CA certificate that client certificates must chain to (mutual TLS).
    #[arg(long)]
    grpc_root_cert: Option<PathBuf>,
    /// Serve HTTP as HTTPS (Triton has no HTTP TLS; flags named like its gRPC ones).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    http_use_ssl: bool,
    /// Also require client certificates signed by --http-root-cert (mutual TLS).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    http_use_ssl_mutual: bool,
    /// PEM certificate chain of the HTTP service.
    #[arg(long)]
    http_server_cert: Option<PathBuf>,
    /// PEM private key of the HTTP service.
    #[arg(long)]
    http_server_key: Option<PathBuf>,
    /// PEM CA certificate that HTTP client certificates must chain to (mutual TLS).
    #[arg(long)]
    http_root_cert: Option<PathBuf>,
    /// Prometheus metrics port (`GET /metrics`).
    #[arg(long, default_value_t = 8002)]
    metrics_port: u16,
    /// Serve metrics at all.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    allow_metrics: bool,
    /// none: load everything at start; explicit: load `--load-model` names and allow the
    /// load/unload API; poll: load everything and rescan the repository for changes.
    #[arg(long, value_enum, default_value_t = Mode::None)]
    model_control_mode: Mode,
    /// Model to load at start in explicit mode (repeatable; `*` loads all).
    #[arg(long)]
    load_model: Vec<String>,
    /// Seconds between repository scans in poll mode (default 15).
    #[arg(long)]
    repository_poll_secs: Option<u64>,
    /// Largest accepted HTTP request body in bytes (larger: 413).
    #[arg(long, default_value_t = ServerConfig::default().max_body_bytes)]
    http_max_body_bytes: usize,
    /// Seconds a client may take to send a request head (from its first byte, or from
    /// the accept for a connection's first request); slower heads get 408.
    #[arg(long, default_value_t = secs(ServerConfig::default().header_timeout))]
    http_header_timeout_secs: f64,
    /// Seconds a client may take to send a request body after its head (else 408).
    #[arg(long, default_value_t = secs(ServerConfig::default().body_timeout))]
    http_body_timeout_secs: f64,
    /// Seconds an idle keep-alive connection is kept open between requests.
    #[arg(long, default_value_t = secs(ServerConfig::default().keepalive_timeout))]
    http_keepalive_timeout_secs: f64,
    /// Open connections per service (HTTP, metrics); more are answered 503 and closed.
    #[arg(long, default_value_t = ServerConfig::default().max_connections)]
    http_max_connections: usize,
    /// Seconds in-flight requests may take to finish after SIGTERM before their
    /// connections are dropped and the server exits (Triton's flag).
    #[arg(long, default_value_t = secs(ServerConfig::default().drain_timeout))]
    exit_timeout_secs: f64,
    /// CPU cores shared among model instances (default: all available).
    #[arg(long)]
    cores: Option<usize>,
    /// The response cache, Triton's syntax: `local,size=BYTES` (one cache shared by the
    /// models whose config has `response_cache { enable: true }`).
    #[arg(long, value_name = "local,size=BYTES")]
    cache_config: Option<String>,
    /// ONNX engine for models that do not choose one with the `trident.onnx_engine`
    /// parameter: auto (ONNX Runtime when available, else tract), ort or tract.
    #[arg(long, value_enum, env = "TRIDENT_ONNX_ENGINE", default_value_t = Engine::Auto)]
    onnx_engine: Engine,
}

/// The server's limits from the flags, checked before anything is loaded.
fn server_config(args: &ServeArgs) -> anyhow::Result<ServerConfig> {
    anyhow::ensure!(
        args.http_max_connections > 0,
        "--http-max-connections must be at least 1"
    );
    Ok(ServerConfig {
        sagemaker_model: None,
        tls: tls_files(
            "http",
            args.http_use_ssl,
            args.http_use_ssl_mutual,
            &args.http_server_cert,
            &args.http_server_key,
            &args.http_root_cert,
        )?,
        max_body_bytes: args.http_max_body_bytes,
        header_timeout: duration("http-header-timeout-secs", args.http_header_timeout_secs)?,
        body_timeout: duration("http-body-timeout-secs", args.http_body_timeout_secs)?,
        keepalive_timeout: duration("http-keepalive-timeout-secs", args.http_keepalive_timeout_secs)?,
        max_connections: args.http_max_connections,
        drain_timeout: duration("exit-timeout-secs", args.exit_timeout_secs)?,
    })
}

/// The TLS files of one service from its `--{proto}-use-ssl*` flags; a certificate
/// given without `--{proto}-use-ssl`, or TLS without its files, is an error (never
/// silently plain).
fn tls_files(
    proto: &str,
    use_ssl: bool,
    mutual: bool,
    cert: &Option<PathBuf>,
    key: &Option<PathBuf>,
    root: &Option<PathBuf>,
) -> anyhow::Result<Option<TlsFiles>> {
    if !use_ssl {
        anyhow::ensure!(
            !mutual && cert.is_none() && key.is_none() && root.is_none(),
            "--{proto}-server-cert/-key/-root-cert and --{proto}-use-ssl-mutual need --{proto}-use-ssl true"
        );
        return Ok(None);
    }
    let (Some(cert), Some(key)) = (cert, key) else {
        anyhow::bail!("--{proto}-use-ssl needs --{proto}-server-cert and --{proto}-server-key");
    };
    anyhow::ensure!(
        mutual == root.is_some(),
        "--{proto}-use-ssl-mutual and --{proto}-root-cert go together (the CA that client certificates must chain to)"
    );
    Ok(Some(TlsFiles {
        cert: cert.clone(),
        key: key.clone(),
        client_ca: root.clone(),
    }))
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// A positive, finite number of seconds from a flag.
fn duration(flag: &str, secs: f64) -> anyhow::Result<Duration> {
    anyhow::ensure!(
        secs.is_finite() && secs > 0.0,
        "--{flag} must be a positive number of seconds, got {secs}"
    );
    Ok(Duration::from_secs_f64(secs))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Compression {
    None,
    Low,
    Medium,
    High,
}

fn grpc_config(args: &ServeArgs) -> anyhow::Result<GrpcConfig> {
    anyhow::ensure!(
        args.grpc_max_message_bytes > 0,
        "--grpc-max-message-bytes must be at least 1"
    );
    anyhow::ensure!(
        args.grpc_keepalive_time > 0 && args.grpc_keepalive_timeout > 0,
        "--grpc-keepalive-time and --grpc-keepalive-timeout must be positive milliseconds"
    );
    let same_port = args.allow_grpc && args.grpc_port != 0 && args.grpc_port == args.http_port;
    if same_port {
        anyhow::ensure!(
            args.grpc_address == args.http_address,
            "single-port mode (--grpc-port = --http-port {}) needs --grpc-address equal to --http-address",
            args.http_port
        );
        anyhow::ensure!(
            !args.grpc_use_ssl && !args.http_use_ssl,
            "single-port mode does not support TLS yet: use separate --http-port and --grpc-port with --*-use-ssl"
        );
    }
    Ok(GrpcConfig {
        same_port,
        tls: tls_files(
            "grpc",
            args.grpc_use_ssl,
            args.grpc_use_ssl_mutual,
            &args.grpc_server_cert,
            &args.grpc_server_key,
            &args.grpc_root_cert,
        )?,
        max_message_bytes: args.grpc_max_message_bytes,
        compress_responses: args.grpc_infer_response_compression_level != Compression::None,
        keepalive_time: Some(Duration::from_millis(args.grpc_keepalive_time)),
        keepalive_timeout: Some(Duration::from_millis(args.grpc_keepalive_timeout)),
    })
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Engine {
    Auto,
    Ort,
    Tract,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Mode {
    None,
    Explicit,
    Poll,
}

/// Where SageMaker puts the model archive's contents.
const SAGEMAKER_MODEL_DIR: &str = "/opt/ml/model";

/// Applies SageMaker mode to the flags: repository, port, explicit loading of the
/// default model, gRPC and metrics off. Returns the default model when in that mode.
fn sagemaker(args: &mut ServeArgs) -> anyhow::Result<Option<String>> {
    let bind_port = std::env::var("SAGEMAKER_BIND_TO_PORT").ok();
    if args.model_repository.is_none() {
        anyhow::ensure!(
            bind_port.is_some() || Path::new(SAGEMAKER_MODEL_DIR).is_dir(),
            "--model-repository is required (outside SageMaker's container, which provides {SAGEMAKER_MODEL_DIR})"
        );
        args.allow_sagemaker = true;
        args.model_repository = Some(SAGEMAKER_MODEL_DIR.into());
    }
    if !args.allow_sagemaker {
        return Ok(None);
    }
    let root = args.model_repository.clone().expect("set above");
    anyhow::ensure!(
        !root.join("config.pbtxt").exists(),
        "{}: SageMaker's model.tar.gz must hold model folders at its top, not a config.pbtxt (build it with `trident package --archive`)",
        root.display()
    );
    let model = match std::env::var("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME") {
        Ok(name) => name,
        Err(_) => {
            let dirs = trident_serve::repository::model_dirs(&root)
                .with_context(|| format!("cannot read {}", root.display()))?;
            match dirs.as_slice() {
                [one] => one.clone(),
                _ => anyhow::bail!(
                    "SageMaker mode: set SAGEMAKER_TRITON_DEFAULT_MODEL_NAME to one of {dirs:?} (the repository has {} models)",
                    dirs.len()
                ),
            }
        }
    };
    args.http_port = match bind_port {
        Some(p) => p
            .parse()
            .with_context(|| format!("SAGEMAKER_BIND_TO_PORT '{p}' is not a port"))?,
        None => args.sagemaker_port,
    };
    args.allow_grpc = false;
    args.allow_metrics = false;
    args.model_control_mode = Mode::Explicit;
    args.load_model = vec![model.clone()];
    tracing::info!(model = %model, "SageMaker mode: /ping and /invocations on port {}", args.http_port);
    Ok(Some(model))
}

pub fn run(mut args: ServeArgs) -> anyhow::Result<()> {
    let sagemaker_model = sagemaker(&mut args)?;
    let mut config = server_config(&args)?;
    config.sagemaker_model = sagemaker_model;
    let grpc = grpc_config(&args)?;
    let cores = args
        .cores
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let mode = match args.model_control_mode {
        Mode::None => ControlMode::None,
        Mode::Explicit => ControlMode::Explicit,
        Mode::Poll => ControlMode::Poll,
    };
    if !args.load_model.is_empty() && !matches!(mode, ControlMode::Explicit) {
        anyhow::bail!("--load-model needs --model-control-mode explicit");
    }
    if args.repository_poll_secs.is_some() && !matches!(mode, ControlMode::Poll) {
        anyhow::bail!("--repository-poll-secs needs --model-control-mode poll");
    }
    let root = args
        .model_repository
        .clone()
        .expect("required or set by SageMaker mode");
    anyhow::ensure!(
        root.is_dir(),
        "--model-repository {} is not a directory",
        root.display()
    );
    let cache = match &args.cache_config {
        Some(spec) => {
            let c = trident_serve::cache::ResponseCache::from_config(spec).map_err(anyhow::Error::msg)?;
            tracing::info!("response cache: local, {} bytes", c.capacity());
            Some(Arc::new(c))
        }
        None => None,
    };
    let repository = Arc::new(Repository::new(RepositoryOptions {
        cache,
        root,
        mode,
        startup_models: args.load_model.clone(),
        cores,
        onnx_engine: match args.onnx_engine {
            Engine::Auto => OnnxEngine::Auto,
            Engine::Ort => OnnxEngine::Ort,
            Engine::Tract => OnnxEngine::Tract,
        },
    }));
    repository.load_startup_models()?;
    if let ControlMode::Poll = mode {
        spawn_poller(
            repository.clone(),
            Duration::from_secs(args.repository_poll_secs.unwrap_or(15).max(1)),
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores.clamp(1, 4))
        .thread_name("trident-http")
        .enable_all()
        .build()?;
    let result = runtime.block_on(serve(repository, args, config, grpc));
    // Connections the drain gave up on are dropped here, not waited for.
    runtime.shutdown_timeout(Duration::from_millis(500));
    result
}

async fn serve(
    repository: Arc<Repository>,
    args: ServeArgs,
    config: ServerConfig,
    grpc_config: GrpcConfig,
) -> anyhow::Result<()> {
    let http = bind(&args.http_address, args.http_port).await?;
    let tls = if config.tls.is_some() { " (TLS)" } else { "" };
    tracing::info!("HTTP service listening on {}{tls}", http.local_addr()?);
    if grpc_config.same_port {
        tracing::info!(
            "gRPC service listening on {} (single-port mode: REST and gRPC)",
            http.local_addr()?
        );
    }
    let metrics = match args.allow_metrics {
        true => {
            let listener = bind(&args.http_address, args.metrics_port).await?;
            tracing::info!("metrics service listening on {}", listener.local_addr()?);
            Some(listener)
        }
        false => None,
    };
    let grpc = match args.allow_grpc && !grpc_config.same_port {
        true => {
            let listener = bind(&args.grpc_address, args.grpc_port).await?;
            let tls = if grpc_config.tls.is_some() { " (TLS)" } else { "" };
            tracing::info!("gRPC service listening on {}{tls}", listener.local_addr()?);
            Some(listener)
        }
        false => None,
    };
    let listeners = trident_server::Listeners { http, grpc, metrics };
    trident_server::run(repository, config, grpc_config, listeners, shutdown_signal()).await?;
    tracing::info!("stopped");
    Ok(())
}

async fn bind(address: &str, port: u16) -> anyhow::Result<tokio::net::TcpListener> {
    let addr: SocketAddr = format!("{address}:{port}")
        .parse()
        .with_context(|| format!("invalid address {address}:{port}"))?;
    tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot bind {addr}"))
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down: finishing in-flight requests");
}

fn spawn_poller(repository: Arc<Repository>, every: Duration) {
    std::thread::Builder::new()
        .name("repository-poll".into())
        .spawn(move || loop {
            std::thread::sleep(every);
            if let Err(e) = repository.poll() {
                tracing::error!("repository poll failed: {e}");
            }
        })
        .expect("spawn repository poller");
}
