//! KServe v2 HTTP/REST routes with Triton's extensions, one module per protocol area.

mod infer;
mod models;
mod repository;
mod shm;

use crate::ServerConfig;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use std::sync::Arc;
use trident_serve::Repository;

type Repo = State<Arc<Repository>>;

/// `{model}` and optional `{version}` path segments.
#[derive(Debug, Deserialize)]
pub(crate) struct ModelPath {
    model: String,
    version: Option<String>,
}

pub(crate) fn router(app: crate::front::App, config: &ServerConfig) -> Router {
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
        .route("/v2/systemsharedmemory/status", get(shm::status))
        .route("/v2/systemsharedmemory/region/{region}/status", get(shm::status))
        .route("/v2/systemsharedmemory/register", post(shm::register))
        .route(
            "/v2/systemsharedmemory/region/{region}/register",
            post(shm::register),
        )
        .route("/v2/systemsharedmemory/unregister", post(shm::unregister))
        .route(
            "/v2/systemsharedmemory/region/{region}/unregister",
            post(shm::unregister),
        )
        .route("/v2/cudasharedmemory/status", get(shm::cuda_status))
        .route(
            "/v2/cudasharedmemory/region/{region}/status",
            get(shm::cuda_status),
        )
        .route("/v2/cudasharedmemory/register", post(shm::cuda_register))
        .route(
            "/v2/cudasharedmemory/region/{region}/register",
            post(shm::cuda_register),
        )
        .route("/v2/cudasharedmemory/unregister", post(shm::cuda_unregister))
        .route(
            "/v2/cudasharedmemory/region/{region}/unregister",
            post(shm::cuda_unregister),
        )
        .route("/v2/logging", get(logging).post(set_logging))
        .route("/ping", get(ping))
        .route("/invocations", post(infer::invocations))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .with_state(app)
}

async fn server_metadata() -> impl IntoResponse {
    Json(serde_json::json!({
        "name": crate::front::SERVER_NAME,
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": crate::front::EXTENSIONS,
    }))
}

/// Triton's log settings extension: the settings in force; changes are refused by name.
async fn logging() -> Json<serde_json::Value> {
    let settings = crate::front::log_settings()
        .into_iter()
        .map(|(k, v)| {
            let v = match v {
                crate::front::Setting::Bool(b) => serde_json::Value::from(b),
                crate::front::Setting::Uint(u) => serde_json::Value::from(u),
                crate::front::Setting::Text(s) => serde_json::Value::from(s),
            };
            (k.to_string(), v)
        })
        .collect::<serde_json::Map<_, _>>();
    Json(serde_json::Value::Object(settings))
}

async fn set_logging(body: axum::body::Bytes) -> Result<Json<serde_json::Value>, crate::ApiError> {
    let settings: serde_json::Map<String, serde_json::Value> = if body.iter().all(u8::is_ascii_whitespace) {
        serde_json::Map::new()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| crate::ApiError::bad_request(format!("invalid log settings JSON: {e}")))?
    };
    crate::front::refuse_log_change(settings.keys())?;
    Ok(logging().await)
}

/// SageMaker's health check: 200 once the default model is ready.
async fn ping(State(app): State<crate::front::App>) -> Result<StatusCode, crate::ApiError> {
    let model = app.sagemaker_model.as_deref().ok_or_else(|| {
        crate::ApiError::new(
            StatusCode::NOT_FOUND,
            "no such endpoint: /ping (not in SageMaker mode)",
        )
    })?;
    Ok(match app.repo.get(model, None) {
        Ok(_) => StatusCode::OK,
        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
    })
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
