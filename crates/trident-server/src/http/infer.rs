//! `POST v2/models/{m}[/versions/{v}]/infer` and SageMaker's `POST /invocations`:
//! decompress, decode (JSON or binary), run, encode, compress.

use super::ModelPath;
use crate::codec::{self, ResponseOutput, INFERENCE_HEADER_CONTENT_LENGTH};
use crate::front::{self, App, Decoded};
use crate::ApiError;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use std::time::Instant;
use trident_serve::OutputRequest;

pub(super) async fn infer(
    State(app): State<App>,
    Path(p): Path<ModelPath>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    run(
        &app,
        &p.model,
        p.version.as_deref(),
        &headers,
        body,
        Framing::Kserve,
    )
    .await
}

/// SageMaker's `POST /invocations`: the KServe v2 body for the default model; binary
/// data framed by the content type's `json-header-size` (SageMaker drops custom
/// headers such as `Inference-Header-Content-Length`).
pub(super) async fn invocations(
    State(app): State<App>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let model = app.sagemaker_model.clone().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "no such endpoint: /invocations (not in SageMaker mode)",
        )
    })?;
    run(&app, &model, None, &headers, body, Framing::SageMaker).await
}

/// How the JSON header's length travels when binary tensor data follows it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// The `Inference-Header-Content-Length` header.
    Kserve,
    /// `Content-Type: application/vnd.sagemaker-triton.binary+json;json-header-size=N`.
    SageMaker,
}

/// SageMaker's content type for binary+JSON bodies (requests and responses).
const SAGEMAKER_BINARY: &str = "application/vnd.sagemaker-triton.binary+json";

fn sagemaker_header_len(headers: &HeaderMap) -> Result<Option<usize>, ApiError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .map_err(|_| ApiError::bad_request("Content-Type is not ASCII"))?;
    let mut parts = value.split(';').map(str::trim);
    if !parts
        .next()
        .is_some_and(|t| t.eq_ignore_ascii_case(SAGEMAKER_BINARY))
    {
        return Ok(None);
    }
    for part in parts {
        if let Some(n) = part.strip_prefix("json-header-size=") {
            return n.trim().parse().map(Some).map_err(|_| {
                ApiError::bad_request(format!(
                    "Content-Type {SAGEMAKER_BINARY}: json-header-size '{n}' is not a number"
                ))
            });
        }
    }
    Err(ApiError::bad_request(format!(
        "Content-Type {SAGEMAKER_BINARY} needs ;json-header-size=N (the JSON header's length)"
    )))
}

async fn run(
    app: &App,
    model: &str,
    version: Option<&str>,
    headers: &HeaderMap,
    body: Bytes,
    framing: Framing,
) -> Result<Response, ApiError> {
    let received = Instant::now();
    let accept = response_encoding(headers);
    // Its error, if any, is the request's: counted as the model's failure below.
    let body = decompressed(headers, body, app.max_body_bytes).await;
    let answer = front::infer(app, model, version, received, front::Entry::Http, || {
        let body = body?;
        let header_len = match framing {
            Framing::Kserve => crate::guard::numeric_header(
                headers,
                INFERENCE_HEADER_CONTENT_LENGTH,
                INFERENCE_HEADER_CONTENT_LENGTH,
            )?,
            Framing::SageMaker => sagemaker_header_len(headers)?,
        };
        let mut request = codec::decode_request(body, header_len)?;
        let outputs = request
            .outputs
            .iter()
            .map(|o| OutputRequest {
                name: o.name.clone(),
                classification: o.classification,
            })
            .collect();
        let shared_outputs = request
            .outputs
            .iter()
            .filter_map(|o| Some((o.name.clone(), o.shared_memory.clone()?)))
            .collect();
        Ok(Decoded {
            inputs: std::mem::take(&mut request.inputs),
            shared_inputs: std::mem::take(&mut request.shared_inputs),
            outputs,
            shared_outputs,
            sequence: request.sequence.take(),
            rest: request,
        })
    })
    .await?;
    let request = answer.rest;
    let model = answer.model;
    let outputs: Vec<ResponseOutput> = answer
        .outputs
        .into_iter()
        .map(|(name, tensor, shared)| ResponseOutput {
            binary: request.wants_binary(&name),
            name,
            tensor,
            shared,
        })
        .collect();
    let version = model.version().to_string();
    let encoded = codec::encode_response(model.name(), &version, request.id.as_deref(), &outputs);
    let encoding = accept.filter(|_| encoded.body.len() >= MIN_COMPRESSED_BYTES);
    let body = match encoding {
        None => encoded.body,
        // Compression is CPU work: on tokio's blocking pool, off the async threads.
        Some(encoding) => tokio::task::spawn_blocking(move || compress(encoded.body, encoding))
            .await
            .map_err(|e| ApiError::internal(format!("compressing the response failed: {e}")))??,
    };
    let mut response = body.into_response();
    let h = response.headers_mut();
    if let Some(encoding) = encoding {
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static(encoding));
    }
    match (encoded.header_len, framing) {
        (Some(len), Framing::Kserve) => {
            h.insert(INFERENCE_HEADER_CONTENT_LENGTH, HeaderValue::from(len));
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
        }
        (Some(len), Framing::SageMaker) => {
            let value = format!("{SAGEMAKER_BINARY};json-header-size={len}");
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_str(&value).expect("ASCII"),
            );
        }
        (None, _) => {
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
    }
    Ok(response)
}

/// The request body, decompressed when `Content-Encoding` is gzip or deflate (zlib, as
/// HTTP means it), at most `limit` bytes once decompressed. Decompression runs on tokio's
/// blocking pool, off the async threads.
async fn decompressed(headers: &HeaderMap, body: Bytes, limit: usize) -> Result<Bytes, ApiError> {
    let encoding = match headers.get(header::CONTENT_ENCODING) {
        None => return Ok(body),
        Some(v) => v.to_str().unwrap_or("?").trim().to_ascii_lowercase(),
    };
    if matches!(encoding.as_str(), "" | "identity") {
        return Ok(body);
    }
    tokio::task::spawn_blocking(move || decompress(&encoding, body, limit))
        .await
        .map_err(|e| ApiError::internal(format!("decompressing the request failed: {e}")))?
}

fn decompress(encoding: &str, body: Bytes, limit: usize) -> Result<Bytes, ApiError> {
    use std::io::Read;
    let reader: Box<dyn Read> = match encoding {
        "gzip" => Box::new(flate2::read::GzDecoder::new(&body[..])),
        "deflate" => Box::new(flate2::read::ZlibDecoder::new(&body[..])),
        other => {
            return Err(ApiError::bad_request(format!(
                "Content-Encoding '{other}' is not supported: use gzip, deflate or identity"
            )))
        }
    };
    let mut out = Vec::new();
    reader
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| ApiError::bad_request(format!("request body is not valid {encoding} data: {e}")))?;
    if out.len() > limit {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the decompressed request body exceeds {limit} bytes (--http-max-body-bytes)"),
        ));
    }
    Ok(out.into())
}

/// The response encoding the client accepts (gzip preferred over deflate).
fn response_encoding(headers: &HeaderMap) -> Option<&'static str> {
    let accepted = headers
        .get(header::ACCEPT_ENCODING)?
        .to_str()
        .ok()?
        .to_ascii_lowercase();
    // `gzip`, `gzip;q=0.5`; a q of 0 (`q=0`, `q=0.0`) refuses the coding.
    let offers: Vec<&str> = accepted
        .split(',')
        .filter_map(|offer| {
            let mut parts = offer.split(';').map(str::trim);
            let coding = parts.next()?;
            let refused = parts
                .filter_map(|p| p.strip_prefix("q="))
                .any(|q| q.trim().parse::<f32>().is_ok_and(|q| q == 0.0));
            (!refused).then_some(coding)
        })
        .collect();
    ["gzip", "deflate"].into_iter().find(|e| offers.contains(e))
}

/// Smaller responses are sent as they are: compressing them costs more than it saves.
const MIN_COMPRESSED_BYTES: usize = 1024;

fn compress(body: Bytes, encoding: &'static str) -> Result<Bytes, ApiError> {
    use std::io::Write;
    let level = flate2::Compression::default();
    let out = match encoding {
        "gzip" => {
            let mut e = flate2::write::GzEncoder::new(Vec::with_capacity(body.len() / 2), level);
            e.write_all(&body).and_then(|_| e.finish())
        }
        _ => {
            let mut e = flate2::write::ZlibEncoder::new(Vec::with_capacity(body.len() / 2), level);
            e.write_all(&body).and_then(|_| e.finish())
        }
    }
    .map_err(|e| ApiError::internal(format!("compressing the response failed: {e}")))?;
    Ok(out.into())
}
