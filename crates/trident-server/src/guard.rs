//! The request guard in front of every route (called by `listen` for each request): size limits checked before anything is
//! read, the body read whole under a deadline, and every error answer in the server's
//! one shape, `{"error": "..."}` (axum's own rejections, 404 and 405 included).

use crate::{ApiError, ServerConfig};
use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use bytes::BytesMut;
use http_body_util::BodyExt;
use std::future::Future;
use std::time::Duration;
use tokio::sync::watch;
use tower_service::Service;

/// Longest request URI (path and query) accepted.
pub(crate) const MAX_URI_BYTES: usize = 8 << 10;
/// Largest total size of the request's header fields (names and values).
pub(crate) const MAX_HEADER_BYTES: usize = 64 << 10;

/// Limits the guard enforces.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    max_body_bytes: usize,
    body_timeout: Duration,
    /// Turns true at shutdown: a body still arriving then is not waited for.
    stop: watch::Receiver<bool>,
}

impl Limits {
    pub(crate) fn new(c: &ServerConfig, stop: watch::Receiver<bool>) -> Self {
        Limits {
            max_body_bytes: c.max_body_bytes,
            body_timeout: c.body_timeout,
            stop,
        }
    }
}

/// One request through the guard: checks, reads the body, runs `router`, and rewrites
/// a non-JSON error answer into `{"error": ...}`. Called by the connection's service
/// directly (a `from_fn` middleware would clone the router for every request).
pub(crate) async fn handle(mut router: Router, limits: Limits, request: Request) -> Response {
    let (method, uri) = (request.method().clone(), request.uri().clone());
    let request = match admit(request, limits).await {
        Ok(request) => request,
        Err(e) => return e.into_response(),
    };
    let Ok(response) = router.call(request).await;
    if response.status().is_client_error() || response.status().is_server_error() {
        return as_json_error(response, &method, uri.path()).await;
    }
    response
}

async fn admit(request: Request, limits: Limits) -> Result<Request, ApiError> {
    check_head(&request)?;
    let declared = numeric_header::<u64>(
        request.headers(),
        header::CONTENT_LENGTH.as_str(),
        "Content-Length",
    )?;
    if let Some(len) = declared.filter(|&len| len > limits.max_body_bytes as u64) {
        return Err(too_large(len, limits.max_body_bytes));
    }
    let (parts, body) = request.into_parts();
    let mut read = std::pin::pin!(read_body(body, declared, &limits));
    // A body already here (nearly every one) is taken without arming a timer.
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(read.as_mut().poll(cx))).await;
    let bytes = match first {
        std::task::Poll::Ready(bytes) => bytes?,
        std::task::Poll::Pending => {
            let mut stop = limits.stop.clone();
            tokio::select! {
                read = tokio::time::timeout(limits.body_timeout, read) => read.map_err(|_| {
                    ApiError::new(
                        StatusCode::REQUEST_TIMEOUT,
                        format!(
                            "the request body was not received within {:?} (--http-body-timeout-secs)",
                            limits.body_timeout
                        ),
                    )
                })??,
                // A request still arriving at shutdown is not in flight yet: it is not
                // waited for.
                () = async { let _ = stop.wait_for(|&s| s).await; } => {
                    return Err(ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the server is shutting down; the request body had not arrived",
                    ))
                }
            }
        }
    };
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

fn check_head(request: &Request) -> Result<(), ApiError> {
    let uri = request.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if uri > MAX_URI_BYTES {
        return Err(ApiError::new(
            StatusCode::URI_TOO_LONG,
            format!("the request URI has {uri} bytes, more than the limit of {MAX_URI_BYTES}"),
        ));
    }
    let headers: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if headers > MAX_HEADER_BYTES {
        return Err(ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            format!(
                "the request header fields have {headers} bytes, more than the limit of {MAX_HEADER_BYTES}"
            ),
        ));
    }
    Ok(())
}

/// The number in header `name` (`shown` in the error), if the request has it.
pub(crate) fn numeric_header<T: std::str::FromStr>(
    headers: &HeaderMap,
    name: &str,
    shown: &str,
) -> Result<Option<T>, ApiError> {
    let Some(value) = headers.get(name) else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .map(Some)
        .ok_or_else(|| ApiError::bad_request(format!("{shown} is not a number: {value:?}")))
}

fn too_large(len: u64, limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the request body has {len} bytes, more than the limit of {limit} (--http-max-body-bytes)"),
    )
}

/// Reads the whole body. A body that arrives as one chunk is kept as it is; one in
/// several is gathered into one buffer sized from `Content-Length` up front, so a large
/// body is held once.
async fn read_body(mut body: Body, declared: Option<u64>, limits: &Limits) -> Result<bytes::Bytes, ApiError> {
    let mut first: Option<bytes::Bytes> = None;
    let mut buf = BytesMut::new();
    let mut len = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::bad_request(format!("cannot read the request body: {e}")))?;
        let Ok(data) = frame.into_data() else { continue };
        len += data.len();
        if len > limits.max_body_bytes {
            return Err(too_large(len as u64, limits.max_body_bytes));
        }
        match first.take() {
            None if buf.is_empty() => first = Some(data),
            None => buf.extend_from_slice(&data),
            Some(head) => {
                buf.reserve(declared.map_or(0, |d| d as usize).max(head.len() + data.len()));
                buf.extend_from_slice(&head);
                buf.extend_from_slice(&data);
            }
        }
    }
    Ok(first.unwrap_or_else(|| buf.freeze()))
}

/// An error answer that is not JSON (axum's rejections are plain text, 405 is empty)
/// becomes `{"error": "<its text>"}` with the same status and headers.
async fn as_json_error(response: Response, method: &axum::http::Method, path: &str) -> Response {
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = match http_body_util::Limited::new(body, 64 << 10).collect().await {
        Ok(collected) => String::from_utf8_lossy(&collected.to_bytes()).trim().to_string(),
        Err(_) => String::new(),
    };
    let message = match (parts.status, text.is_empty()) {
        (StatusCode::METHOD_NOT_ALLOWED, _) => format!("method {method} is not allowed for {path}"),
        (status, true) => status.canonical_reason().unwrap_or("error").to_lowercase(),
        (_, false) => text,
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.remove(header::CONTENT_TYPE);
    let json = ApiError::new(parts.status, message).into_response();
    let (json_parts, json_body) = json.into_parts();
    parts.headers.extend(json_parts.headers);
    Response::from_parts(parts, json_body)
}
