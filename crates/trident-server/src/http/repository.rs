//! The model repository extension: index, load, unload.

use super::Repo;
use crate::front::{self, ParamValue};
use crate::ApiError;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::sync::Arc;
use trident_serve::repository::IndexEntry;
use trident_serve::Repository;

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

/// A JSON parameter as a load/unload parameter: `file:` values are base64 text.
fn param(key: &str, value: Value) -> Result<(String, ParamValue), ApiError> {
    let v = match value {
        Value::String(text) if key.starts_with("file:") => {
            use base64::Engine;
            let data = base64::engine::general_purpose::STANDARD
                .decode(text.trim())
                .map_err(|e| {
                    ApiError::bad_request(format!("load parameter '{key}': not valid base64: {e}"))
                })?;
            ParamValue::Bytes(data)
        }
        Value::String(text) => ParamValue::Text(text),
        Value::Bool(b) => ParamValue::Bool(b),
        Value::Number(_) => ParamValue::Other("number"),
        Value::Null => ParamValue::Other("null"),
        Value::Array(_) => ParamValue::Other("array"),
        Value::Object(_) => ParamValue::Other("object"),
    };
    Ok((key.to_string(), v))
}

fn params(map: Map<String, Value>) -> Result<Vec<(String, ParamValue)>, ApiError> {
    map.into_iter().map(|(k, v)| param(&k, v)).collect()
}

pub(super) async fn load(
    State(repo): State<Arc<Repository>>,
    Path(model): Path<String>,
    bytes: Bytes,
) -> Result<Json<Value>, ApiError> {
    let request: ControlRequest = body(&bytes)?;
    let overrides = front::load_override(params(request.parameters)?)?;
    front::blocking("load", move || repo.load_with(&model, overrides)).await?;
    Ok(Json(Value::Object(Map::new())))
}

pub(super) async fn unload(
    State(repo): State<Arc<Repository>>,
    Path(model): Path<String>,
    bytes: Bytes,
) -> Result<Json<Value>, ApiError> {
    let request: ControlRequest = body(&bytes)?;
    let dependents = front::unload_dependents(params(request.parameters)?)?;
    front::blocking("unload", move || repo.unload_with(&model, dependents)).await?;
    Ok(Json(Value::Object(Map::new())))
}
