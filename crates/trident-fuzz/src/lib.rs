//! Fuzzing harnesses: each takes arbitrary bytes, feeds them to one parser of untrusted
//! input and checks what must hold whatever the bytes (no panic; what decodes
//! round-trips). The cargo-fuzz targets in `fuzz/` call these, and this crate's tests
//! replay every input in `fuzz/regressions/<target>/` (the crashes found, kept) and the
//! seed corpus, so a fixed crash stays fixed without a nightly toolchain.
#![warn(missing_docs)]

use bytes::Bytes;
use serde_json::{json, Value};
use std::path::Path;
use trident_core::{DataType, Tensor};
use trident_server::codec::{self, ResponseOutput};

/// The HTTP inference codec: decodes `body` (`header_len` as the
/// Inference-Header-Content-Length); a request that decodes is sent back as a binary
/// response, which must decode to the same tensors, and as a JSON one, which must
/// decode to the same types and shapes.
pub fn codec(body: &[u8], header_len: Option<usize>) {
    let Ok(request) = codec::decode_request(Bytes::copy_from_slice(body), header_len) else {
        return;
    };
    for binary in [true, false] {
        let outputs: Vec<ResponseOutput> = request
            .inputs
            .iter()
            .map(|(name, tensor)| ResponseOutput {
                name: name.clone(),
                tensor: tensor.clone(),
                binary,
                shared: false,
            })
            .collect();
        let back = round_trip(&codec::encode_response("m", "1", request.id.as_deref(), &outputs));
        assert_eq!(back.len(), request.inputs.len());
        for ((name, sent), (got_name, got)) in request.inputs.iter().zip(&back) {
            assert_eq!(name, got_name);
            assert_eq!((sent.dtype(), sent.shape()), (got.dtype(), got.shape()), "{name}");
            if binary {
                assert_eq!(sent.data(), got.data(), "{name}: binary round trip");
            }
        }
    }
}

/// A response's outputs, decoded again as the inputs of a request.
fn round_trip(response: &codec::EncodedResponse) -> Vec<(String, Tensor)> {
    let json_len = response.header_len.unwrap_or(response.body.len());
    let header: Value = serde_json::from_slice(&response.body[..json_len]).expect("response JSON");
    let mut buf = serde_json::to_vec(&json!({ "inputs": header["outputs"] })).expect("JSON");
    let request_len = buf.len();
    buf.extend_from_slice(&response.body[json_len..]);
    let header_len = response.header_len.map(|_| request_len);
    codec::decode_request(buf.into(), header_len)
        .expect("an encoded response decodes")
        .inputs
}

/// `config.pbtxt` text: parsing, validation and the JSON rendering never panic.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let file = Path::new("m/config.pbtxt");
    if let Ok(parsed) = trident_core::config::parse_config(text, file) {
        let _ = trident_core::config::validate(&parsed.config, "m", file);
        let _ = trident_core::config::config_to_json(&parsed.config);
    }
}

/// A tensor from untrusted bytes: byte 0 picks the data type, byte 1 the rank (0–3),
/// the next `rank` bytes the dimensions, the rest is the data. Construction either
/// fails or gives a tensor whose BYTES elements, splits and concatenation hold up.
pub fn bytes_tensor(data: &[u8]) {
    let _ = trident_core::tensor::bytes_elements(data);
    let [kind, rank, rest @ ..] = data else {
        return;
    };
    let rank = usize::from(rank % 4).min(rest.len());
    let (dims, payload) = rest.split_at(rank);
    let dtype = DataType::ALL[usize::from(*kind) % DataType::ALL.len()];
    let shape: Vec<i64> = dims.iter().map(|&d| i64::from(d as i8)).collect();
    let Ok(tensor) = Tensor::new(dtype, shape.clone(), Bytes::copy_from_slice(payload)) else {
        return;
    };
    if dtype == DataType::Bytes {
        let elements = trident_core::tensor::bytes_elements(tensor.data()).expect("a valid BYTES tensor");
        let count: i64 = shape.iter().product();
        assert_eq!(elements.len() as i64, count);
    }
    if let Some(&rows) = shape.first().filter(|&&r| r > 0) {
        let sizes = [rows / 2, rows - rows / 2];
        if let Ok(parts) = tensor.split(&sizes) {
            let parts: Vec<&Tensor> = parts.iter().collect();
            assert_eq!(Tensor::concat(&parts).expect("concat of a split"), tensor);
        }
    }
}

/// Checkpoint files: byte 0 picks `state.json` (even) or `model.safetensors` (odd), the
/// rest is the file. Loading gives an error naming the file, never a panic.
pub fn checkpoint(data: &[u8]) {
    let [which, contents @ ..] = data else {
        return;
    };
    let dir = tempfile::tempdir().expect("temporary directory");
    if which % 2 == 0 {
        std::fs::write(dir.path().join("state.json"), contents).expect("write");
        if let Err(e) = trident_train::checkpoint::read_state(dir.path()) {
            assert!(e.to_string().contains("state.json"), "{e}");
        }
    } else {
        std::fs::write(dir.path().join("model.safetensors"), contents).expect("write");
        let params = trident_nn::Params::new();
        let builder = params.builder(1, None);
        builder
            .get((2, 3), "w", trident_nn::Init::Normal(1.0))
            .expect("param");
        builder.get(4, "b", trident_nn::Init::Zeros).expect("param");
        if let Err(e) = trident_train::checkpoint::load_weights(dir.path(), &params) {
            assert!(e.to_string().contains("model.safetensors"), "{e}");
        }
    }
}
