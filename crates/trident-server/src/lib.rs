//! Trident's network front ends: the KServe v2 / Triton HTTP API and the Prometheus
//! metrics endpoint, on top of `trident-serve`'s repository.
//!
//! Entry point: [`run`], which takes bound listeners and a shutdown future, so tests
//! bind port 0 and the CLI binds the user's ports.
#![warn(missing_docs)]

pub mod codec;
mod error;
mod front;
mod grpc;
mod guard;
mod http;
mod listen;
mod metrics;
mod shm;
mod tls;

pub use error::ApiError;
pub use grpc::GrpcConfig;
pub use tls::TlsFiles;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use trident_serve::Repository;

/// Server settings: request limits, timeouts and the shutdown drain.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Largest accepted request body; larger ones get 413 (checked against
    /// `Content-Length` before any of the body is read).
    pub max_body_bytes: usize,
    /// A request head must arrive whole within this time of its first byte (of the
    /// accept, for a connection's first request); else 408 and the connection closes.
    pub header_timeout: Duration,
    /// The whole body must arrive within this time of the head; else 408.
    pub body_timeout: Duration,
    /// A connection idle this long between requests is closed.
    pub keepalive_timeout: Duration,
    /// Open connections per service; past it a new connection gets 503 and is closed.
    pub max_connections: usize,
    /// On shutdown, how long in-flight requests may take before their connections are
    /// dropped.
    pub drain_timeout: Duration,
    /// HTTPS for the HTTP service (`--http-use-ssl`); `None`: plain HTTP.
    pub tls: Option<TlsFiles>,
    /// SageMaker mode: `GET /ping` and `POST /invocations` serve this model.
    pub sagemaker_model: Option<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            // Triton's HTTP front end has no fixed cap; 64 MiB holds a batch of 64 × 512
            // tokens many times over while bounding what one request can make us buffer.
            max_body_bytes: 64 << 20,
            // nginx allows 60 s for a header and Go servers commonly 10–30 s; a client
            // on loopback or a LAN sends its head in one packet.
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            keepalive_timeout: Duration::from_secs(75),
            max_connections: 1024,
            // Triton's --exit-timeout-secs default.
            drain_timeout: Duration::from_secs(30),
            tls: None,
            sagemaker_model: None,
        }
    }
}

/// The bound sockets the server answers on.
#[derive(Debug)]
pub struct Listeners {
    /// KServe v2 / Triton HTTP.
    pub http: TcpListener,
    /// Triton gRPC, when served.
    pub grpc: Option<TcpListener>,
    /// Prometheus metrics, when served.
    pub metrics: Option<TcpListener>,
}

/// Serves HTTP, and gRPC and metrics when their listeners are given, until `shutdown`
/// completes, then stops accepting connections, lets in-flight requests finish for up
/// to `drain_timeout`, and returns.
pub async fn run(
    repository: Arc<Repository>,
    config: ServerConfig,
    grpc_config: GrpcConfig,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let Listeners { http, grpc, metrics } = listeners;
    // Every certificate is read and checked before any service starts.
    let https = config.tls.as_ref().map(TlsFiles::acceptor).transpose()?;
    let grpc_tls = grpc_config.tls.as_ref().map(grpc::tls_config).transpose()?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let limits = guard::Limits::new(&config, stop_rx.clone());
    let app = front::App {
        repo: repository.clone(),
        shm: Arc::new(shm::SharedMemory::default()),
        sagemaker_model: config.sagemaker_model.clone(),
        max_body_bytes: config.max_body_bytes,
    };
    // Single-port mode: gRPC on the HTTP listener, its routes as an axum router.
    let single_port = match grpc_config.same_port {
        true => Some(listen::SinglePort {
            router: grpc::router(app.clone(), &grpc_config).await,
            keepalive_time: grpc_config.keepalive_time,
            keepalive_timeout: grpc_config.keepalive_timeout,
        }),
        false => None,
    };
    let api = listen::serve(
        http,
        http::router(app.clone(), &config),
        limits.clone(),
        config.clone(),
        "HTTP",
        listen::Extras {
            tls: https,
            grpc: single_port,
        },
        stop_rx.clone(),
    );
    let grpc = async {
        match grpc {
            Some(listener) => {
                grpc::serve(
                    listener,
                    app.clone(),
                    grpc_config,
                    grpc_tls,
                    config.drain_timeout,
                    stop_rx.clone(),
                )
                .await
            }
            None => Ok(()),
        }
    };
    let metrics = async {
        match metrics {
            Some(listener) => {
                let router = metrics::router(repository.clone());
                listen::serve(
                    listener,
                    router,
                    limits,
                    config.clone(),
                    "metrics",
                    listen::Extras::default(),
                    stop_rx.clone(),
                )
                .await
            }
            None => Ok(()),
        }
    };
    // A service that fails ends the others too, so the error is seen at once.
    tokio::try_join!(api, grpc, metrics).map(|_| ())
}
