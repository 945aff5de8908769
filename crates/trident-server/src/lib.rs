//! Trident's network front ends: the KServe v2 / Triton HTTP API and the Prometheus
//! metrics endpoint, on top of `trident-serve`'s repository.
//!
//! Entry point: [`run`], which takes bound listeners and a shutdown future, so tests
//! bind port 0 and the CLI binds the user's ports.
#![warn(missing_docs)]

pub mod codec;
mod error;
mod http;
mod metrics;

pub use error::ApiError;

use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;
use trident_serve::Repository;

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Largest accepted request body; larger ones get 413.
    pub max_body_bytes: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        // Triton's HTTP front end has no fixed cap; 64 MiB holds a batch of 64 × 512
        // tokens many times over while bounding what one request can make us buffer.
        ServerConfig {
            max_body_bytes: 64 << 20,
        }
    }
}

/// Serves HTTP (and metrics, when a listener is given) until `shutdown` completes, then
/// stops accepting connections and waits for in-flight requests to finish.
pub async fn run(
    repository: Arc<Repository>,
    config: ServerConfig,
    http: TcpListener,
    metrics: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|&stop| stop).await;
    };
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let api = axum::serve(http, http::router(repository.clone(), &config))
        .with_graceful_shutdown(stopped(stop_rx.clone()));
    match metrics {
        Some(listener) => {
            let metrics =
                axum::serve(listener, metrics::router(repository)).with_graceful_shutdown(stopped(stop_rx));
            let (a, m) = tokio::join!(api, metrics);
            a.and(m)
        }
        None => api.await,
    }
}
