//! `ModelInferRequest` to tensors and tensors to `ModelInferResponse`.
//!
//! Input data comes either from `raw_input_contents` (one entry per input, in input
//! order, row-major bytes as the binary tensor extension lays them out; BYTES elements
//! are a 4-byte little-endian length then the bytes) or from each input's typed
//! `contents`, never both in one request (Triton's rule). FP16 and BF16 have no typed
//! field, so they travel raw. Outputs always go back as `raw_output_contents`, which is
//! what tritonclient's `as_numpy` reads.

use crate::codec::{duplicate, SharedInput, ShmRef, SHM_PARAMETERS};
use crate::front::Decoded;
use crate::ApiError;
use bytes::Bytes;
use std::collections::HashMap;
use trident_core::config::pb::{
    self, infer_parameter::ParameterChoice, model_infer_response::InferOutputTensor, InferParameter,
    InferTensorContents,
};
use trident_core::tensor::element_count;
use trident_core::{DataType, Tensor};
use trident_serve::sequence::{CorrelationId, SequenceFlags};
use trident_serve::OutputRequest;

/// Inputs (in the message, or in shared memory) and requested outputs of a request;
/// `rest` (the id) is left for the caller.
pub(super) fn decode(request: &mut pb::ModelInferRequest, model: &str) -> Result<Decoded<String>, ApiError> {
    refuse_parameters("request", &request.parameters, &REQUEST_PARAMETERS)?;
    empty_final_response(&request.parameters)?;
    let sequence = sequence(&request.parameters)?;
    let raw_count = request.raw_input_contents.len();
    let mut raw = std::mem::take(&mut request.raw_input_contents).into_iter();
    let mut inputs = Vec::with_capacity(request.inputs.len());
    let mut shared_inputs = Vec::new();
    for input in std::mem::take(&mut request.inputs) {
        let at = format!("input '{}'", input.name);
        refuse_parameters(&at, &input.parameters, &SHM_PARAMETERS)?;
        let dtype = datatype(&input.name, &input.datatype)?;
        // Negative or overflowing shapes are refused here, shared memory or not.
        let count = element_count(&input.shape).map_err(|e| ApiError::bad_request(format!("{at}: {e}")))?;
        if let Some(shared) = shm_ref(&input.name, &input.parameters)? {
            if input.contents.is_some() {
                return Err(ApiError::bad_request(format!(
                    "unexpected 'content' provided when using shared memory for input tensor '{}' for model '{model}'",
                    input.name
                )));
            }
            shared_inputs.push(SharedInput {
                name: input.name,
                dtype,
                shape: input.shape,
                at: shared,
            });
            continue;
        }
        let data = match input.contents {
            Some(_) if raw_count > 0 => {
                return Err(ApiError::bad_request(format!(
                    "contents field must not be specified when using raw_input_contents for '{}' for model '{model}'",
                    input.name
                )))
            }
            Some(contents) => typed(&at, dtype, count, contents)?,
            None => raw.next().ok_or_else(|| {
                ApiError::bad_request(format!(
                    "unable to find data for input tensor '{}' for model '{model}' in request.",
                    input.name
                ))
            })?,
        };
        let tensor =
            Tensor::new(dtype, input.shape, data).map_err(|e| ApiError::bad_request(format!("{at}: {e}")))?;
        inputs.push((input.name, tensor));
    }
    if raw.len() > 0 {
        return Err(ApiError::bad_request(format!(
            "{raw_count} raw_input_contents for model '{model}', but only {} inputs take their data from them",
            raw_count - raw.len()
        )));
    }
    let names = inputs
        .iter()
        .map(|(n, _)| n.as_str())
        .chain(shared_inputs.iter().map(|s| s.name.as_str()));
    if let Some(name) = duplicate(names) {
        return Err(ApiError::bad_request(format!(
            "input '{name}' already exists in request"
        )));
    }
    let mut outputs = Vec::with_capacity(request.outputs.len());
    let mut shared_outputs = Vec::new();
    for o in &request.outputs {
        let at = format!("output '{}'", o.name);
        let known = [
            "classification",
            SHM_PARAMETERS[0],
            SHM_PARAMETERS[1],
            SHM_PARAMETERS[2],
        ];
        refuse_parameters(&at, &o.parameters, &known)?;
        let classification = match o.parameters.get("classification").and_then(|p| p.parameter_choice.as_ref()) {
            None => None,
            Some(ParameterChoice::Int64Param(k)) if *k >= 1 => Some(*k as usize),
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "{at}: parameter 'classification' must be a positive int64_param (the number of classes), got {other:?}"
                )))
            }
        };
        if let Some(shared) = shm_ref(&o.name, &o.parameters)? {
            if classification.is_some() {
                return Err(ApiError::bad_request(format!(
                    "{at}: Output can't set both 'shared_memory_region' and 'classification'"
                )));
            }
            shared_outputs.push((o.name.clone(), shared));
        }
        outputs.push(OutputRequest {
            name: o.name.clone(),
            classification,
        });
    }
    if let Some(name) = duplicate(outputs.iter().map(|o| o.name.as_str())) {
        return Err(ApiError::bad_request(format!(
            "output '{name}' is requested more than once, expected unique output names"
        )));
    }
    Ok(Decoded {
        inputs,
        shared_inputs,
        outputs,
        shared_outputs,
        sequence,
        rest: String::new(),
    })
}

/// `sequence_id` (int64, uint64 or string), `sequence_start`, `sequence_end` (bool),
/// with Triton's texts for wrong types.
pub(super) fn sequence(
    parameters: &HashMap<String, InferParameter>,
) -> Result<Option<SequenceFlags>, ApiError> {
    let get = |key: &str| parameters.get(key).and_then(|p| p.parameter_choice.as_ref());
    let id = match get("sequence_id") {
        None => None,
        Some(ParameterChoice::Int64Param(v)) if *v >= 0 => Some(CorrelationId::U64(*v as u64)),
        Some(ParameterChoice::Uint64Param(v)) => Some(CorrelationId::U64(*v)),
        Some(ParameterChoice::StringParam(s)) => Some(CorrelationId::Str(s.clone())),
        Some(_) => {
            return Err(ApiError::bad_request(
                "invalid value type for 'sequence_id' parameter, expected int64_param or string_param.",
            ))
        }
    };
    let flag = |key: &str| match get(key) {
        None => Ok(false),
        Some(ParameterChoice::BoolParam(b)) => Ok(*b),
        Some(_) => Err(ApiError::bad_request(format!(
            "invalid value type for '{key}' parameter, expected bool_param."
        ))),
    };
    SequenceFlags::new(id, flag("sequence_start")?, flag("sequence_end")?).map_err(ApiError::from)
}

/// Request-level parameters Trident acts on. `triton_enable_empty_final_response`
/// (perf_analyzer and tritonclient's streams send it) asks a decoupled model's stream
/// for an empty last response marking the end of the request's responses; the one
/// response of any other model is already the final one.
const REQUEST_PARAMETERS: [&str; 4] = [
    "sequence_id",
    "sequence_start",
    "sequence_end",
    "triton_enable_empty_final_response",
];

/// Whether the request asks for an empty final response (`triton_enable_empty_final_response`).
pub(super) fn empty_final_response(parameters: &HashMap<String, InferParameter>) -> Result<bool, ApiError> {
    match parameters
        .get("triton_enable_empty_final_response")
        .and_then(|p| p.parameter_choice.as_ref())
    {
        None => Ok(false),
        Some(ParameterChoice::BoolParam(b)) => Ok(*b),
        Some(_) => Err(ApiError::bad_request(
            "invalid value type for 'triton_enable_empty_final_response' parameter, expected bool_param.",
        )),
    }
}

/// The shared memory parameters of a tensor, with Triton's texts for wrong types.
fn shm_ref(tensor: &str, parameters: &HashMap<String, InferParameter>) -> Result<Option<ShmRef>, ApiError> {
    let get = |key: &str| parameters.get(key).and_then(|p| p.parameter_choice.as_ref());
    let int = |key: &str| match get(key) {
        None => Ok(None),
        Some(ParameterChoice::Int64Param(v)) if *v >= 0 => Ok(Some(*v as u64)),
        Some(_) => Err(ApiError::bad_request(format!(
            "invalid value type for '{key}' parameter for tensor '{tensor}', expected int64_param."
        ))),
    };
    let region = match get("shared_memory_region") {
        None => {
            for key in ["shared_memory_offset", "shared_memory_byte_size"] {
                if get(key).is_some() {
                    return Err(ApiError::bad_request(format!(
                        "'{key}' can not be specified without 'shared_memory_region' parameter for tensor '{tensor}'"
                    )));
                }
            }
            return Ok(None);
        }
        Some(ParameterChoice::StringParam(r)) => r.clone(),
        Some(_) => {
            return Err(ApiError::bad_request(format!(
                "invalid value type for 'shared_memory_region' parameter for tensor '{tensor}', expected string_param."
            )))
        }
    };
    let byte_size = int("shared_memory_byte_size")?.ok_or_else(|| {
        ApiError::bad_request(format!(
            "'shared_memory_byte_size' must be given with 'shared_memory_region' for tensor '{tensor}'"
        ))
    })?;
    Ok(Some(ShmRef {
        region,
        offset: int("shared_memory_offset")?.unwrap_or(0),
        byte_size,
    }))
}

/// The datatype of input `name`, refused in the HTTP codec's words.
fn datatype(name: &str, datatype: &str) -> Result<DataType, ApiError> {
    datatype.parse().map_err(|_| {
        ApiError::from(crate::codec::CodecError::UnknownDatatype {
            input: name.to_string(),
            datatype: datatype.to_string(),
        })
    })
}

/// The bytes of typed contents, checked against the datatype and element count.
fn typed(at: &str, dtype: DataType, count: usize, c: InferTensorContents) -> Result<Bytes, ApiError> {
    // Each field with its element count: exactly the datatype's field may be set.
    let lens = [
        ("bool_contents", c.bool_contents.len()),
        ("int_contents", c.int_contents.len()),
        ("int64_contents", c.int64_contents.len()),
        ("uint_contents", c.uint_contents.len()),
        ("uint64_contents", c.uint64_contents.len()),
        ("fp32_contents", c.fp32_contents.len()),
        ("fp64_contents", c.fp64_contents.len()),
        ("bytes_contents", c.bytes_contents.len()),
    ];
    let field = match dtype {
        DataType::Bool => "bool_contents",
        DataType::I8 | DataType::I16 | DataType::I32 => "int_contents",
        DataType::I64 => "int64_contents",
        DataType::U8 | DataType::U16 | DataType::U32 => "uint_contents",
        DataType::U64 => "uint64_contents",
        DataType::F32 => "fp32_contents",
        DataType::F64 => "fp64_contents",
        DataType::Bytes => "bytes_contents",
        DataType::F16 | DataType::Bf16 => {
            return Err(ApiError::bad_request(format!(
                "{at}: {dtype} has no typed contents field; send it in raw_input_contents"
            )))
        }
    };
    if let Some((other, _)) = lens.iter().find(|(f, n)| *n > 0 && *f != field) {
        return Err(ApiError::bad_request(format!(
            "{at}: {dtype} data must be in '{field}', got '{other}'"
        )));
    }
    let got = lens.iter().find(|(f, _)| *f == field).map_or(0, |(_, n)| *n);
    if got != count {
        return Err(ApiError::bad_request(format!(
            "{at}: shape needs {count} elements, got {got} in '{field}'"
        )));
    }
    let out_of_range = |i: usize, v: i64| {
        ApiError::bad_request(format!(
            "{at}: element {i} of '{field}' is {v}, outside the range of {dtype}"
        ))
    };
    let mut buf = Vec::with_capacity(count * dtype.size().unwrap_or(0));
    match dtype {
        DataType::Bool => buf.extend(c.bool_contents.iter().map(|&b| u8::from(b))),
        DataType::I8 => {
            for (i, &v) in c.int_contents.iter().enumerate() {
                buf.push(i8::try_from(v).map_err(|_| out_of_range(i, v.into()))? as u8);
            }
        }
        DataType::I16 => {
            for (i, &v) in c.int_contents.iter().enumerate() {
                let v = i16::try_from(v).map_err(|_| out_of_range(i, v.into()))?;
                buf.extend_from_slice(&v.to_le_bytes());
            }
        }
        DataType::I32 => c
            .int_contents
            .iter()
            .for_each(|v| buf.extend_from_slice(&v.to_le_bytes())),
        DataType::I64 => c
            .int64_contents
            .iter()
            .for_each(|v| buf.extend_from_slice(&v.to_le_bytes())),
        DataType::U8 => {
            for (i, &v) in c.uint_contents.iter().enumerate() {
                buf.push(u8::try_from(v).map_err(|_| out_of_range(i, v.into()))?);
            }
        }
        DataType::U16 => {
            for (i, &v) in c.uint_contents.iter().enumerate() {
                let v = u16::try_from(v).map_err(|_| out_of_range(i, v.into()))?;
                buf.extend_from_slice(&v.to_le_bytes());
            }
        }
        DataType::U32 => c
            .uint_contents
            .iter()
            .for_each(|v| buf.extend_from_slice(&v.to_le_bytes())),
        DataType::U64 => c
            .uint64_contents
            .iter()
            .for_each(|v| buf.extend_from_slice(&v.to_le_bytes())),
        DataType::F32 => c
            .fp32_contents
            .iter()
            .for_each(|v| buf.extend_from_slice(&v.to_le_bytes())),
        DataType::F64 => c
            .fp64_contents
            .iter()
            .for_each(|v| buf.extend_from_slice(&v.to_le_bytes())),
        DataType::Bytes => {
            return Ok(trident_core::tensor::encode_bytes_elements(
                c.bytes_contents.iter(),
            ));
        }
        DataType::F16 | DataType::Bf16 => unreachable!("refused above"),
    }
    Ok(buf.into())
}

/// The response: every output as raw contents, in output order.
pub(super) fn encode(
    model: &str,
    version: i64,
    id: String,
    outputs: Vec<(String, Tensor, bool)>,
) -> pb::ModelInferResponse {
    let mut tensors = Vec::with_capacity(outputs.len());
    let mut raw = Vec::with_capacity(outputs.len());
    for (name, tensor, shared) in outputs {
        tensors.push(InferOutputTensor {
            name,
            datatype: tensor.dtype().as_str().to_string(),
            shape: tensor.shape().to_vec(),
            parameters: HashMap::new(),
            contents: None,
        });
        // One entry per output, empty for one written to shared memory (as Triton).
        raw.push(if shared {
            Bytes::new()
        } else {
            tensor.data().clone()
        });
    }
    pb::ModelInferResponse {
        model_name: model.to_string(),
        model_version: version.to_string(),
        id,
        parameters: HashMap::new(),
        outputs: tensors,
        raw_output_contents: raw,
    }
}

/// Refuses parameters outside `known` by name, rather than ignoring them.
fn refuse_parameters(
    at: &str,
    parameters: &HashMap<String, InferParameter>,
    known: &[&str],
) -> Result<(), ApiError> {
    let mut unknown: Vec<&String> = parameters
        .keys()
        .filter(|k| !known.contains(&k.as_str()))
        .collect();
    unknown.sort();
    match unknown.first() {
        None => Ok(()),
        Some(name) => Err(ApiError::bad_request(format!(
            "{at}: parameter '{name}' is not supported by Trident (supported here: {})",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        ))),
    }
}
