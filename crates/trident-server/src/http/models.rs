//! Model metadata, readiness, configuration and statistics.

use super::{ModelPath, Repo};
use crate::ApiError;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};
use trident_serve::ServeError;

pub(super) async fn metadata(State(repo): Repo, Path(p): Path<ModelPath>) -> Result<Json<Value>, ApiError> {
    let m = crate::front::metadata(&repo, &p.model, p.version.as_deref())?;
    let tensors = |specs: &[crate::front::TensorMeta]| -> Vec<Value> {
        specs
            .iter()
            .map(|s| json!({"name": s.name, "datatype": s.datatype.as_str(), "shape": s.shape}))
            .collect()
    };
    Ok(Json(json!({
        "name": m.name,
        "versions": m.versions,
        "platform": m.platform,
        "inputs": tensors(&m.inputs),
        "outputs": tensors(&m.outputs),
    })))
}

pub(super) async fn ready(State(repo): Repo, Path(p): Path<ModelPath>) -> Result<StatusCode, ApiError> {
    match repo.get(&p.model, p.version.as_deref()) {
        Ok(_) => Ok(StatusCode::OK),
        Err(ServeError::ModelNotFound(_)) if repo.index(false)?.iter().any(|e| e.name == p.model) => {
            Ok(StatusCode::SERVICE_UNAVAILABLE)
        }
        Err(ServeError::ModelNotFound(m)) => Err(ServeError::ModelNotFound(m).into()),
        Err(_) => Ok(StatusCode::SERVICE_UNAVAILABLE),
    }
}

pub(super) async fn config(State(repo): Repo, Path(p): Path<ModelPath>) -> Result<Json<Value>, ApiError> {
    let model = repo.get(&p.model, p.version.as_deref())?;
    Ok(Json(trident_core::config::config_to_json(model.config())))
}

pub(super) async fn stats(State(repo): Repo, Path(p): Path<ModelPath>) -> Result<Json<Value>, ApiError> {
    let stats = repo.stats(Some(&p.model), p.version.as_deref())?;
    Ok(Json(json!({ "model_stats": stats })))
}

pub(super) async fn all_stats(State(repo): Repo) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!({ "model_stats": repo.stats(None, None)? })))
}
