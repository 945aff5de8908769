//! KServe v2 HTTP/REST routes with Triton's extensions, one module per protocol area.

mod infer;
mod models;
mod repository;

use crate::ServerConfig;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use std::sync::Arc;
use trident_serve::Repository;

/// The extensions Trident implements, advertised in server metadata.
pub(crate) const EXTENSIONS: &[&str] = &[
    "binary_tensor_data",
    "classification",
    "model_configuration",
    "model_repository",
    "statistics",
];

type Repo = State<Arc<Repository>>;

/// `{model}` and optional `{version}` path segments.
#[derive(Debug, Deserialize)]
pub(crate) struct ModelPath {
    model: String,
    version: Option<String>,
}

pub(crate) fn router(repository: Arc<Repository>, config: &ServerConfig) -> Router {
    let model = "/v2/models/{model}";
    let version = "/v2/models/{model}/versions/{version}";
    Router::new()
        .route("/v2", get(server_metadata))
        .route("/v2/health/live", get(live))
        .route("/v2/health/ready", get(ready))
        .route("/v2/models/stats", get(models::all_stats))
        .route(model, get(models::metadata))
        .route(version, get(models::metadata))
        .route(&format!("{model}/ready"), get(models::ready))
        .route(&format!("{version}/ready"), get(models::ready))
        .route(&format!("{model}/config"), get(models::config))
        .route(&format!("{version}/config"), get(models::config))
        .route(&format!("{model}/stats"), get(models::stats))
        .route(&format!("{version}/stats"), get(models::stats))
        .route(&format!("{model}/infer"), post(infer::infer))
        .route(&format!("{version}/infer"), post(infer::infer))
        .route("/v2/repository/index", post(repository::index))
        .route("/v2/repository/models/{model}/load", post(repository::load))
        .route("/v2/repository/models/{model}/unload", post(repository::unload))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .with_state(repository)
}

async fn server_metadata() -> impl IntoResponse {
    Json(serde_json::json!({
        "name": "trident",
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": EXTENSIONS,
    }))
}

async fn live() -> StatusCode {
    StatusCode::OK
}

/// Ready once the startup models have been loaded (the server is built only then).
/// Individual model failures show in model readiness and the repository index.
async fn ready(State(_): Repo) -> StatusCode {
    StatusCode::OK
}

async fn not_found(uri: axum::http::Uri) -> crate::ApiError {
    crate::ApiError::from(trident_serve::ServeError::InvalidRequest(format!(
        "no such endpoint: {}",
        uri.path()
    )))
    .with_status(StatusCode::NOT_FOUND)
}
