//! The shared memory extension's HTTP routes: `v2/systemsharedmemory[/region/{r}]/
//! {status,register,unregister}`, and the CUDA routes, which a CPU server answers as
//! Triton's CPU-only build does (nothing registered; registering refused by name).

use crate::front::App;
use crate::ApiError;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;

type AppState = State<App>;
type Region = Path<HashMap<String, String>>;

fn region(path: &Region) -> Option<&str> {
    path.get("region").map(String::as_str)
}

pub(super) async fn status(State(app): AppState, path: Region) -> Result<Json<Value>, ApiError> {
    let rows: Vec<Value> = app
        .shm
        .status(region(&path))?
        .into_iter()
        .map(|r| json!({"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}))
        .collect();
    Ok(Json(Value::Array(rows)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegisterBody {
    key: Option<String>,
    #[serde(default)]
    offset: u64,
    byte_size: Option<u64>,
}

pub(super) async fn register(
    State(app): AppState,
    path: Region,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let body: RegisterBody = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid shared memory register request JSON: {e}")))?;
    let key = body
        .key
        .ok_or_else(|| ApiError::bad_request("Shared memory register request has no 'key' field"))?;
    let byte_size = body
        .byte_size
        .ok_or_else(|| ApiError::bad_request("Shared memory register request has no 'byte_size' field"))?;
    app.shm
        .register(region(&path).unwrap_or(""), &key, body.offset, byte_size)?;
    Ok(Json(json!({})))
}

pub(super) async fn unregister(State(app): AppState, path: Region) -> Result<Json<Value>, ApiError> {
    app.shm.unregister(region(&path))?;
    Ok(Json(json!({})))
}

/// No CUDA regions exist on a CPU server: the list is empty and a named region is
/// unknown.
pub(super) async fn cuda_status(path: Region) -> Result<Json<Value>, ApiError> {
    crate::front::cuda_status(region(&path))?;
    Ok(Json(json!([])))
}

pub(super) async fn cuda_register(path: Region) -> ApiError {
    crate::front::cuda_register(region(&path).unwrap_or(""))
}

/// Unregistering succeeds: there is nothing registered (Triton's CPU build does the
/// same, and NVIDIA's shared memory examples unregister CUDA regions first).
pub(super) async fn cuda_unregister() -> Json<Value> {
    Json(json!({}))
}
