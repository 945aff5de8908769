//! The KServe v2 / Triton HTTP inference codec: request bodies to tensors, output
//! tensors to response bodies, including Triton's binary tensor data extension.
//!
//! # Requests
//!
//! A body is a JSON inference header, optionally followed by binary tensor data; the
//! `Inference-Header-Content-Length` header (see [`INFERENCE_HEADER_CONTENT_LENGTH`])
//! gives the JSON length when binary data follows. Inputs with a `binary_data_size`
//! parameter take their bytes from the binary section, in input order, as zero-copy
//! slices of the body. Inputs with `data` are parsed from JSON: nested and flat arrays
//! are both accepted (nesting is flattened row-major and need not match the shape, as
//! in Triton); only the element count must match the shape. Element rules:
//!
//! * BOOL: `true` / `false` only;
//! * integer types: JSON numbers written as integers (not `1.0`) within the type's range;
//! * FP16, BF16, FP32, FP64: any JSON number that fits the type (finite values that
//!   would overflow are refused), or the strings `"NaN"`, `"Infinity"`, `"-Infinity"`;
//!   numbers are parsed by serde_json as f64 and then narrowed;
//! * BYTES: JSON strings (their UTF-8 bytes).
//!
//! Raw binary requests (`Inference-Header-Content-Length: 0`, body = one input's bytes)
//! need the model's metadata, so [`decode_request`] refuses them
//! ([`CodecError::EmptyHeader`]); a route that supports them builds the tensor itself.
//!
//! # Responses
//!
//! [`encode_response`] writes the JSON directly into one buffer (no `serde_json::Value`
//! tree) and appends binary outputs after it, in output order. JSON `data` is a flat
//! array. Two departures from plain JSON numbers:
//!
//! * non-finite floats are written as the strings `"NaN"`, `"Infinity"` and
//!   `"-Infinity"` (JSON has no such numbers; [`decode_request`] reads them back);
//! * a BYTES output with an element that is not valid UTF-8 is always sent as binary,
//!   whatever was requested, since a JSON string could only carry it lossily.
//!
//! FP16 and BF16 are written as the shortest decimal that reads back as the same f32
//! value (exactly their value); every error this module returns is a client error
//! (HTTP 400).

mod binary;
mod json;

use bytes::Bytes;
use serde_json::{Map, Value};
use trident_core::tensor::element_count;
use trident_core::{DataType, Tensor, TensorError};
use trident_serve::sequence::{CorrelationId, SequenceFlags};

/// The HTTP header giving the JSON header's length when binary data follows it (in
/// lower case, as `http::HeaderName` wants it).
pub const INFERENCE_HEADER_CONTENT_LENGTH: &str = "inference-header-content-length";

/// Where a tensor lives in a registered system shared memory region (the
/// `shared_memory_region`, `shared_memory_offset` and `shared_memory_byte_size`
/// parameters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmRef {
    /// Registered region name.
    pub region: String,
    /// Offset within the region.
    pub offset: u64,
    /// Bytes the tensor takes (inputs) or may take (outputs).
    pub byte_size: u64,
}

/// An input whose bytes are in shared memory, read once the registry is at hand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedInput {
    /// Input name.
    pub name: String,
    /// Its datatype.
    pub dtype: DataType,
    /// Its shape.
    pub shape: Vec<i64>,
    /// Where its bytes are.
    pub at: ShmRef,
}

/// A decoded `$inference_request`.
#[derive(Debug, Clone, PartialEq)]
pub struct InferRequest {
    /// The request `id`, echoed in the response.
    pub id: Option<String>,
    /// Input tensors, in request order, with unique names.
    pub inputs: Vec<(String, Tensor)>,
    /// Inputs in shared memory (names unique across both lists).
    pub shared_inputs: Vec<SharedInput>,
    /// Requested outputs, with unique names; empty means all outputs.
    pub outputs: Vec<RequestedOutput>,
    /// The request-level `binary_data_output` parameter: the default for outputs.
    pub binary_data_output: bool,
    /// `sequence_id`, `sequence_start`, `sequence_end` (stateful models).
    pub sequence: Option<SequenceFlags>,
}

/// One `$request_output`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestedOutput {
    /// Output name.
    pub name: String,
    /// Its `binary_data` parameter, if given.
    pub binary: Option<bool>,
    /// Its `classification` parameter (the classification extension): top N classes.
    pub classification: Option<usize>,
    /// Where to write it instead of the response (system shared memory).
    pub shared_memory: Option<ShmRef>,
}

impl InferRequest {
    /// Whether output `name` should be binary given the request: the output's
    /// `binary_data` parameter wins over the request-level `binary_data_output`.
    pub fn wants_binary(&self, name: &str) -> bool {
        self.outputs
            .iter()
            .find(|output| output.name == name)
            .and_then(|output| output.binary)
            .unwrap_or(self.binary_data_output)
    }
}

/// One output tensor of a response.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseOutput {
    /// Output name.
    pub name: String,
    /// Its value.
    pub tensor: Tensor,
    /// Whether to send it as binary data (BYTES that are not UTF-8 always are).
    pub binary: bool,
    /// Written to shared memory: the response gives only its name, type and shape.
    pub shared: bool,
}

/// A response body ready to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedResponse {
    /// JSON header followed by the binary outputs.
    pub body: Bytes,
    /// Length of the JSON header, for `Inference-Header-Content-Length`; `Some` iff
    /// any output is binary.
    pub header_len: Option<usize>,
}

/// Why a request body could not be decoded. All are client errors (HTTP 400).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CodecError {
    /// A parameter Trident does not implement (e.g. `classification`,
    /// `shared_memory_region`): refused rather than silently ignored.
    #[error("{at}: parameter '{name}' is not supported by Trident (supported here: {supported})")]
    UnsupportedParameter {
        /// Where: "request", "input 'x'", "output 'y'".
        at: String,
        /// The parameter.
        name: String,
        /// What is supported at that level.
        supported: String,
    },
    /// `Inference-Header-Content-Length` larger than the body.
    #[error(
        "Inference-Header-Content-Length is {header_len} but the request body has only {body_len} bytes"
    )]
    HeaderTooLong {
        /// The header's value.
        header_len: usize,
        /// The body length.
        body_len: usize,
    },
    /// The sequence parameters do not make a sequence (`sequence_start` without an ID).
    #[error("request: {0}")]
    Sequence(#[from] trident_serve::sequence::FlagsError),
    /// `Inference-Header-Content-Length: 0`, Triton's raw binary request.
    #[error("Inference-Header-Content-Length is 0 (raw binary request): expected a JSON inference header, got none")]
    EmptyHeader,
    /// The header is not JSON, or not an inference request object.
    #[error("invalid inference request JSON: {0}")]
    InvalidJson(String),
    /// A required field is absent.
    #[error("{at}: missing required field '{field}'")]
    MissingField {
        /// Where: "input #2", ...
        at: String,
        /// The field.
        field: &'static str,
    },
    /// A field (or parameter) of the wrong JSON type.
    #[error("{at}: '{field}' must be {expected}, got {got}")]
    InvalidField {
        /// Where: "request", "input 'x'", "output 'y'", "input #2".
        at: String,
        /// The field, e.g. "shape" or "parameters.binary_data_size".
        field: &'static str,
        /// What it must be.
        expected: &'static str,
        /// What it was.
        got: String,
    },
    /// A `datatype` that is not a KServe v2 data type.
    #[error(
        "input '{input}': unknown datatype '{datatype}', expected one of {}",
        DATATYPE_NAMES
    )]
    UnknownDatatype {
        /// Input name.
        input: String,
        /// The datatype given.
        datatype: String,
    },
    /// A shape with a negative dimension.
    #[error("input '{input}': shape {shape:?} has a negative dimension, expected all dimensions >= 0")]
    NegativeShape {
        /// Input name.
        input: String,
        /// The shape given.
        shape: Vec<i64>,
    },
    /// Two inputs with the same name.
    #[error("input '{input}' appears more than once, expected unique input names")]
    DuplicateInput {
        /// Input name.
        input: String,
    },
    /// Two requested outputs with the same name.
    #[error("output '{output}' is requested more than once, expected unique output names")]
    DuplicateOutput {
        /// Output name.
        output: String,
    },
    /// An input with neither `data` nor `binary_data_size`.
    #[error("input '{input}' has neither 'data' nor a 'binary_data_size' parameter, expected exactly one")]
    MissingData {
        /// Input name.
        input: String,
    },
    /// An input with both `data` and `binary_data_size`.
    #[error("input '{input}' has both 'data' and a 'binary_data_size' parameter, expected exactly one")]
    ConflictingData {
        /// Input name.
        input: String,
    },
    /// `data` that is not an array.
    #[error("input '{input}': 'data' must be an array, got {got}")]
    DataNotArray {
        /// Input name.
        input: String,
        /// The JSON kind found.
        got: &'static str,
    },
    /// A `data` element of the wrong JSON type or out of the data type's range.
    #[error("input '{input}': element {index} of 'data': expected {expected} for {datatype}, got {got}")]
    InvalidElement {
        /// Input name.
        input: String,
        /// Row-major index of the element in the flattened data.
        index: usize,
        /// The input's datatype.
        datatype: DataType,
        /// What the element must be.
        expected: String,
        /// What it was.
        got: String,
    },
    /// `data` with a different number of elements than the shape.
    #[error("Unable to parse 'data': Shape does not match true shape of 'data' field (input '{input}': shape {shape:?} needs {expected} elements, got {got})")]
    ElementCount {
        /// Input name.
        input: String,
        /// The shape given.
        shape: Vec<i64>,
        /// Elements the shape needs.
        expected: usize,
        /// Elements in `data`.
        got: usize,
    },
    /// A `binary_data_size` reaching past the end of the body.
    #[error("input '{input}': binary_data_size is {size} bytes but only {available} bytes of the body remain at binary offset {offset}")]
    BinaryOutOfBounds {
        /// Input name.
        input: String,
        /// Its `binary_data_size`.
        size: u64,
        /// Where its part starts in the binary section.
        offset: usize,
        /// Bytes left from there.
        available: usize,
    },
    /// Binary data that no input claims.
    #[error("the inputs' binary_data_size parameters add up to {expected} bytes, but {got} bytes of binary data follow the JSON header")]
    TrailingBytes {
        /// Sum of the inputs' `binary_data_size`.
        expected: usize,
        /// Length of the binary section.
        got: usize,
    },
    /// Data that does not fit the input's datatype and shape (binary size mismatch,
    /// malformed BYTES, shape too large).
    #[error("input '{input}': {source}")]
    Tensor {
        /// Input name.
        input: String,
        /// What was wrong.
        source: TensorError,
    },
}

/// The data type names, for [`CodecError::UnknownDatatype`].
const DATATYPE_NAMES: &str =
    "BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FP16, FP32, FP64, BF16, BYTES";

/// Decodes an inference request body. `header_len` is the value of the
/// `Inference-Header-Content-Length` header (`None`: the whole body is JSON).
pub fn decode_request(body: Bytes, header_len: Option<usize>) -> Result<InferRequest, CodecError> {
    let json_len = match header_len {
        None => body.len(),
        Some(0) => return Err(CodecError::EmptyHeader),
        Some(n) if n > body.len() => {
            return Err(CodecError::HeaderTooLong {
                header_len: n,
                body_len: body.len(),
            })
        }
        Some(n) => n,
    };
    let raw: json::RawRequest =
        serde_json::from_slice(&body[..json_len]).map_err(|e| CodecError::InvalidJson(e.to_string()))?;

    let id = match raw.id {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(id),
        Some(other) => return Err(invalid("request".into(), "id", "a string", &other)),
    };
    // Request-level parameters Trident would otherwise ignore (`priority`, `timeout`,
    // `sequence_id`, ...) are refused, like unknown input and output parameters.
    let parameters = object(raw.parameters, || "request".into(), "parameters")?;
    only_known(
        &parameters,
        || "request".into(),
        &[
            "binary_data_output",
            "sequence_id",
            "sequence_start",
            "sequence_end",
        ],
    )?;
    let flag = |key: &'static str| match parameters.get(key) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(invalid("request".into(), key, "a boolean", other)),
    };
    let sequence_id = match parameters.get("sequence_id") {
        None => None,
        Some(Value::String(s)) => Some(CorrelationId::Str(s.clone())),
        Some(v) => Some(CorrelationId::U64(v.as_u64().ok_or_else(|| {
            invalid(
                "request".into(),
                "parameters.sequence_id",
                "an unsigned integer or a string",
                v,
            )
        })?)),
    };
    let sequence = SequenceFlags::new(sequence_id, flag("sequence_start")?, flag("sequence_end")?)
        .map_err(CodecError::Sequence)?;
    let binary_data_output = match parameters.get("binary_data_output") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(invalid(
                "request".into(),
                "parameters.binary_data_output",
                "a boolean",
                other,
            ))
        }
    };

    let mut parts = binary::Parts::new(body.slice(json_len..));
    let mut inputs = Vec::with_capacity(raw.inputs.len());
    let mut shared_inputs = Vec::new();
    for (index, input) in raw.inputs.into_iter().enumerate() {
        match decode_input(index, input, &mut parts)? {
            Input::Tensor(name, tensor) => inputs.push((name, tensor)),
            Input::Shared(shared) => shared_inputs.push(shared),
        }
    }
    parts.finish()?;
    let names = inputs
        .iter()
        .map(|(name, _)| name.as_str())
        .chain(shared_inputs.iter().map(|s| s.name.as_str()));
    if let Some(name) = duplicate(names) {
        return Err(CodecError::DuplicateInput {
            input: name.to_string(),
        });
    }

    let outputs = raw
        .outputs
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(index, output)| decode_output(index, output))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(name) = duplicate(outputs.iter().map(|output| output.name.as_str())) {
        return Err(CodecError::DuplicateOutput {
            output: name.to_string(),
        });
    }

    Ok(InferRequest {
        id,
        inputs,
        shared_inputs,
        outputs,
        binary_data_output,
        sequence,
    })
}

fn invalid(at: String, field: &'static str, expected: &'static str, got: &Value) -> CodecError {
    CodecError::InvalidField {
        at,
        field,
        expected,
        got: json::describe(got),
    }
}

/// An optional `parameters`-like object (absent or null: empty).
fn object(
    value: Option<Value>,
    at: impl FnOnce() -> String,
    field: &'static str,
) -> Result<Map<String, Value>, CodecError> {
    match value {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(map)) => Ok(map),
        Some(other) => Err(invalid(at(), field, "an object", &other)),
    }
}

/// The first name that occurs twice, if any (both wire formats' decoders use it).
pub(crate) fn duplicate<'a>(names: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let mut sorted: Vec<&str> = names.collect();
    sorted.sort_unstable();
    sorted
        .windows(2)
        .find(|pair| pair[0] == pair[1])
        .map(|pair| pair[0])
}

/// A decoded input: its tensor, or where in shared memory it is.
enum Input {
    Tensor(String, Tensor),
    Shared(SharedInput),
}

/// The shared memory parameters of an input or output, if it names a region.
fn shm_ref(parameters: &Map<String, Value>, at: impl Fn() -> String) -> Result<Option<ShmRef>, CodecError> {
    let uint = |key: &'static str| match parameters.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| invalid(at(), key, "a non-negative integer", v)),
    };
    let region = match parameters.get("shared_memory_region") {
        None => {
            if let Some(key) = ["shared_memory_offset", "shared_memory_byte_size"]
                .into_iter()
                .find(|k| parameters.contains_key(*k))
            {
                return Err(CodecError::InvalidField {
                    at: at(),
                    field: key,
                    expected: "given only with 'shared_memory_region'",
                    got: "no 'shared_memory_region'".into(),
                });
            }
            return Ok(None);
        }
        Some(Value::String(region)) => region.clone(),
        Some(other) => return Err(invalid(at(), "shared_memory_region", "a string", other)),
    };
    let byte_size = uint("shared_memory_byte_size")?.ok_or_else(|| CodecError::MissingField {
        at: at(),
        field: "parameters.shared_memory_byte_size",
    })?;
    Ok(Some(ShmRef {
        region,
        offset: uint("shared_memory_offset")?.unwrap_or(0),
        byte_size,
    }))
}

/// Shared memory parameter names, accepted on inputs and outputs (HTTP and gRPC).
pub(crate) const SHM_PARAMETERS: [&str; 3] = [
    "shared_memory_region",
    "shared_memory_offset",
    "shared_memory_byte_size",
];

fn decode_input(
    index: usize,
    input: json::RawInput<'_>,
    parts: &mut binary::Parts,
) -> Result<Input, CodecError> {
    let name = match input.name {
        Some(Value::String(name)) => name,
        Some(other) => return Err(invalid(format!("input #{index}"), "name", "a string", &other)),
        None => {
            return Err(CodecError::MissingField {
                at: format!("input #{index}"),
                field: "name",
            })
        }
    };
    let at = || format!("input '{name}'");
    let missing = |field| CodecError::MissingField { at: at(), field };

    let dtype: DataType = match input.datatype {
        Some(Value::String(s)) => s.parse().map_err(|_| CodecError::UnknownDatatype {
            input: name.clone(),
            datatype: s,
        })?,
        Some(other) => return Err(invalid(at(), "datatype", "a string", &other)),
        None => return Err(missing("datatype")),
    };

    let shape_value = input.shape.ok_or_else(|| missing("shape"))?;
    let shape: Vec<i64> = shape_value
        .as_array()
        .and_then(|dims| dims.iter().map(Value::as_i64).collect())
        .ok_or_else(|| invalid(at(), "shape", "an array of integers", &shape_value))?;
    if shape.iter().any(|&d| d < 0) {
        return Err(CodecError::NegativeShape { input: name, shape });
    }
    let tensor_error = |name: &str, source| CodecError::Tensor {
        input: name.to_string(),
        source,
    };
    let count = element_count(&shape).map_err(|e| tensor_error(&name, e))?;

    let parameters = object(input.parameters, at, "parameters")?;
    only_known(
        &parameters,
        at,
        &[
            "binary_data_size",
            SHM_PARAMETERS[0],
            SHM_PARAMETERS[1],
            SHM_PARAMETERS[2],
        ],
    )?;
    if let Some(shared) = shm_ref(&parameters, at)? {
        if input.data.is_some() || parameters.contains_key("binary_data_size") {
            return Err(CodecError::ConflictingData { input: name });
        }
        return Ok(Input::Shared(SharedInput {
            name,
            dtype,
            shape,
            at: shared,
        }));
    }
    let binary_size = match parameters.get("binary_data_size") {
        None => None,
        Some(value) => Some(value.as_u64().ok_or_else(|| {
            invalid(
                at(),
                "parameters.binary_data_size",
                "a non-negative integer",
                value,
            )
        })?),
    };

    let tensor = match (input.data, binary_size) {
        (Some(_), Some(_)) => return Err(CodecError::ConflictingData { input: name }),
        (None, None) => return Err(CodecError::MissingData { input: name }),
        (None, Some(size)) => {
            let data = parts.take(&name, size)?;
            Tensor::new(dtype, shape, data).map_err(|e| tensor_error(&name, e))?
        }
        (Some(data), None) => {
            // Capacity for `data` parsed late (capped, as the visitor's: the count is not
            // checked yet).
            let reserve = dtype
                .size()
                .map_or(0, |size| size.saturating_mul(count).min(1 << 20));
            let typed = match data
                .collect(dtype, reserve)
                .map_err(|e| CodecError::InvalidJson(format!("input '{name}': 'data': {e}")))?
            {
                json::Collected::NotArray(got) => return Err(CodecError::DataNotArray { input: name, got }),
                json::Collected::Array(typed) => typed,
            };
            if let Some(error) = typed.error {
                return Err(CodecError::InvalidElement {
                    input: name,
                    index: error.index,
                    datatype: dtype,
                    expected: error.expected,
                    got: error.got,
                });
            }
            if typed.count != count {
                return Err(CodecError::ElementCount {
                    input: name,
                    shape,
                    expected: count,
                    got: typed.count,
                });
            }
            Tensor::new(dtype, shape, typed.buf.into()).map_err(|e| tensor_error(&name, e))?
        }
    };
    Ok(Input::Tensor(name, tensor))
}

/// Refuses parameters outside `known`.
fn only_known(
    parameters: &Map<String, Value>,
    at: impl Fn() -> String,
    known: &'static [&'static str],
) -> Result<(), CodecError> {
    match parameters.keys().find(|k| !known.contains(&k.as_str())) {
        Some(name) => Err(CodecError::UnsupportedParameter {
            at: at(),
            name: name.clone(),
            supported: if known.is_empty() {
                "none".into()
            } else {
                known.join(", ")
            },
        }),
        None => Ok(()),
    }
}

fn decode_output(index: usize, output: json::RawOutput) -> Result<RequestedOutput, CodecError> {
    let name = match output.name {
        Some(Value::String(name)) => name,
        Some(other) => return Err(invalid(format!("output #{index}"), "name", "a string", &other)),
        None => {
            return Err(CodecError::MissingField {
                at: format!("output #{index}"),
                field: "name",
            })
        }
    };
    let parameters = object(output.parameters, || format!("output '{name}'"), "parameters")?;
    only_known(
        &parameters,
        || format!("output '{name}'"),
        &[
            "binary_data",
            "classification",
            SHM_PARAMETERS[0],
            SHM_PARAMETERS[1],
            SHM_PARAMETERS[2],
        ],
    )?;
    let shared_memory = shm_ref(&parameters, || format!("output '{name}'"))?;
    let classification = match parameters.get("classification") {
        None => None,
        Some(Value::Number(n)) if n.as_u64().is_some_and(|k| k >= 1) => {
            Some(n.as_u64().expect("checked") as usize)
        }
        Some(other) => {
            return Err(invalid(
                format!("output '{name}'"),
                "parameters.classification",
                "a positive integer (the number of classes)",
                other,
            ))
        }
    };
    let binary = match parameters.get("binary_data") {
        None => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(other) => {
            return Err(invalid(
                format!("output '{name}'"),
                "parameters.binary_data",
                "a boolean",
                other,
            ))
        }
    };
    if shared_memory.is_some() && classification.is_some() {
        return Err(CodecError::InvalidField {
            at: format!("output '{name}'"),
            field: "parameters",
            expected: "not both 'shared_memory_region' and 'classification'",
            got: "both".into(),
        });
    }
    if shared_memory.is_some() && binary == Some(true) {
        return Err(CodecError::InvalidField {
            at: format!("output '{name}'"),
            field: "parameters",
            expected: "not both 'shared_memory_region' and 'binary_data'",
            got: "both".into(),
        });
    }
    Ok(RequestedOutput {
        name,
        binary,
        classification,
        shared_memory,
    })
}

/// Encodes an `$inference_response`: JSON header, then the binary outputs in output
/// order. Outputs marked `binary`, and BYTES outputs with non-UTF-8 elements, are
/// binary (`"parameters": {"binary_data_size": N}`); the rest carry a flat JSON `data`
/// array, non-finite floats as `"NaN"` / `"Infinity"` / `"-Infinity"` (see the module
/// documentation). `id` is written only when given.
pub fn encode_response(
    model_name: &str,
    model_version: &str,
    id: Option<&str>,
    outputs: &[ResponseOutput],
) -> EncodedResponse {
    let binary: Vec<bool> = outputs
        .iter()
        .map(|output| !output.shared && (output.binary || binary::must_be_binary(&output.tensor)))
        .collect();
    let binary_len: usize = outputs
        .iter()
        .zip(&binary)
        .filter(|(_, &is_binary)| is_binary)
        .map(|(output, _)| output.tensor.data().len())
        .sum();
    let json_estimate = 64
        + model_name.len()
        + model_version.len()
        + id.map_or(0, str::len)
        + outputs
            .iter()
            .zip(&binary)
            .map(|(output, &is_binary)| {
                let data = if is_binary {
                    0
                } else {
                    output.tensor.data().len() * 3
                };
                96 + output.name.len() + output.tensor.shape().len() * 8 + data
            })
            .sum::<usize>();
    let mut buf = Vec::with_capacity(json_estimate + binary_len);

    buf.extend_from_slice(b"{\"model_name\":");
    json::write_str(&mut buf, model_name);
    buf.extend_from_slice(b",\"model_version\":");
    json::write_str(&mut buf, model_version);
    if let Some(id) = id {
        buf.extend_from_slice(b",\"id\":");
        json::write_str(&mut buf, id);
    }
    buf.extend_from_slice(b",\"outputs\":[");
    for (i, (output, &is_binary)) in outputs.iter().zip(&binary).enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        buf.extend_from_slice(b"{\"name\":");
        json::write_str(&mut buf, &output.name);
        buf.extend_from_slice(b",\"datatype\":\"");
        buf.extend_from_slice(output.tensor.dtype().as_str().as_bytes());
        buf.extend_from_slice(b"\",\"shape\":[");
        for (d, &dim) in output.tensor.shape().iter().enumerate() {
            if d > 0 {
                buf.push(b',');
            }
            json::write_i64(&mut buf, dim);
        }
        buf.push(b']');
        if output.shared {
            buf.push(b'}');
        } else if is_binary {
            buf.extend_from_slice(b",\"parameters\":{\"binary_data_size\":");
            json::write_i64(&mut buf, output.tensor.data().len() as i64);
            buf.extend_from_slice(b"}}");
        } else {
            buf.extend_from_slice(b",\"data\":");
            json::write_data(&mut buf, &output.tensor);
            buf.push(b'}');
        }
    }
    buf.extend_from_slice(b"]}");

    let json_len = buf.len();
    for (output, &is_binary) in outputs.iter().zip(&binary) {
        if is_binary {
            buf.extend_from_slice(output.tensor.data());
        }
    }
    EncodedResponse {
        body: Bytes::from(buf),
        header_len: binary.contains(&true).then_some(json_len),
    }
}

#[cfg(test)]
mod tests;
