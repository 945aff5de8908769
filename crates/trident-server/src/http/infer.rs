//! `POST v2/models/{m}[/versions/{v}]/infer`: decode (JSON or binary), run, encode.

use super::ModelPath;
use crate::codec::{self, ResponseOutput, INFERENCE_HEADER_CONTENT_LENGTH};
use crate::front::{self, App, Decoded};
use crate::ApiError;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use std::time::Instant;
use trident_serve::OutputRequest;

pub(super) async fn infer(
    State(app): State<App>,
    Path(p): Path<ModelPath>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let received = Instant::now();
    let answer = front::infer(&app, &p.model, p.version.as_deref(), received, |_| {
        refuse_content_encoding(&headers)?;
        let header_len = crate::guard::numeric_header(
            &headers,
            INFERENCE_HEADER_CONTENT_LENGTH,
            INFERENCE_HEADER_CONTENT_LENGTH,
        )?;
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
    let mut response = encoded.body.into_response();
    let h = response.headers_mut();
    match encoded.header_len {
        Some(len) => {
            h.insert(INFERENCE_HEADER_CONTENT_LENGTH, HeaderValue::from(len));
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
        }
        None => {
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
    }
    Ok(response)
}

/// tritonclient can gzip/deflate request bodies; Trident does not decompress yet, so
/// such a body is refused by name rather than failing as "invalid JSON".
fn refuse_content_encoding(headers: &HeaderMap) -> Result<(), ApiError> {
    match headers
        .get(header::CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap_or("?").trim())
    {
        None | Some("") | Some("identity") => Ok(()),
        Some(other) => Err(ApiError::bad_request(format!(
            "Content-Encoding '{other}' is not supported: send the request body uncompressed"
        ))),
    }
}
