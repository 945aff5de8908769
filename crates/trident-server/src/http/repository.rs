//! The model repository extension: index, load, unload.

use super::Repo;
use crate::ApiError;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{Map, Value};
use trident_serve::repository::IndexEntry;

#[derive(Debug, Default, Deserialize)]
struct IndexRequest {
    #[serde(default)]
    ready: bool,
}

#[derive(Debug, Default, Deserialize)]
struct ControlRequest {
    #[serde(default)]
    parameters: Map<String, Value>,
}

fn body<T: Default + for<'de> Deserialize<'de>>(bytes: &Bytes) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("invalid request JSON: {e}")))
}

pub(super) async fn index(State(repo): Repo, bytes: Bytes) -> Result<Json<Vec<IndexEntry>>, ApiError> {
    let request: IndexRequest = body(&bytes)?;
    Ok(Json(repo.index(request.ready)?))
}

pub(super) async fn load(
    State(repo): Repo,
    Path(model): Path<String>,
    bytes: Bytes,
) -> Result<Json<Value>, ApiError> {
    let request: ControlRequest = body(&bytes)?;
    if let Some(key) = request.parameters.keys().next() {
        return Err(ApiError::bad_request(format!(
            "load parameter '{key}' is not supported yet (Trident loads models from the repository as they are)"
        )));
    }
    crate::front::blocking("load", move || repo.load(&model)).await?;
    Ok(Json(Value::Object(Map::new())))
}

pub(super) async fn unload(
    State(repo): Repo,
    Path(model): Path<String>,
    bytes: Bytes,
) -> Result<Json<Value>, ApiError> {
    let request: ControlRequest = body(&bytes)?;
    // `unload_dependents` concerns ensembles, which Trident does not have yet: with no
    // dependents it has nothing to do, so it is accepted; anything else is refused.
    if let Some(key) = request.parameters.keys().find(|k| *k != "unload_dependents") {
        return Err(ApiError::bad_request(format!(
            "unload parameter '{key}' is not supported"
        )));
    }
    crate::front::blocking("unload", move || repo.unload(&model)).await?;
    Ok(Json(Value::Object(Map::new())))
}
