//! Unit and property tests of the codec.

use super::*;
use proptest::prelude::*;
use serde_json::json;
use trident_core::tensor::encode_bytes_elements;

// ---- helpers --------------------------------------------------------------------------

/// A request body: JSON header followed by binary parts.
fn body(header: &Value, parts: &[&[u8]]) -> (Bytes, Option<usize>) {
    let mut buf = serde_json::to_vec(header).unwrap();
    let json_len = buf.len();
    for part in parts {
        buf.extend_from_slice(part);
    }
    (buf.into(), (!parts.is_empty()).then_some(json_len))
}

fn decode(header: Value) -> Result<InferRequest, CodecError> {
    let (body, header_len) = body(&header, &[]);
    decode_request(body, header_len)
}

fn decode_bin(header: Value, parts: &[&[u8]]) -> Result<InferRequest, CodecError> {
    let (body, header_len) = body(&header, parts);
    decode_request(body, header_len)
}

fn input(name: &str, datatype: &str, shape: Value, data: Value) -> Value {
    json!({"name": name, "datatype": datatype, "shape": shape, "data": data})
}

fn single(input: Value) -> Result<Tensor, CodecError> {
    decode(json!({ "inputs": [input] })).map(|mut r| r.inputs.remove(0).1)
}

fn err(input: Value) -> CodecError {
    single(input).unwrap_err()
}

/// Decodes a response by turning its outputs into the inputs of a request.
fn response_as_inputs(response: &EncodedResponse) -> Vec<(String, Tensor)> {
    let json_len = response.header_len.unwrap_or(response.body.len());
    let header: Value = serde_json::from_slice(&response.body[..json_len]).unwrap();
    let mut buf = serde_json::to_vec(&json!({ "inputs": header["outputs"] })).unwrap();
    let request_json_len = buf.len();
    buf.extend_from_slice(&response.body[json_len..]);
    let header_len = response.header_len.map(|_| request_json_len);
    decode_request(buf.into(), header_len).unwrap().inputs
}

fn outputs(tensors: &[(&str, Tensor)], binary: bool) -> Vec<ResponseOutput> {
    tensors
        .iter()
        .map(|(name, tensor)| ResponseOutput {
            name: name.to_string(),
            tensor: tensor.clone(),
            binary,
            shared: false,
        })
        .collect()
}

fn le<T, const N: usize>(values: &[T], to_le: impl Fn(&T) -> [u8; N]) -> Bytes {
    values.iter().flat_map(to_le).collect::<Vec<u8>>().into()
}

/// A tensor of each data type, with edge values.
fn sample(dtype: DataType) -> Tensor {
    use DataType::*;
    let data = match dtype {
        Bool => bytes::Bytes::from(vec![1, 0, 1, 1]),
        U8 => bytes::Bytes::from(vec![0, 255, 7, 128]),
        U16 => le(&[0u16, u16::MAX, 300, 1], |v| v.to_le_bytes()),
        U32 => le(&[0u32, u32::MAX, 70000, 1], |v| v.to_le_bytes()),
        U64 => le(&[0u64, u64::MAX, 1 << 53, 1], |v| v.to_le_bytes()),
        I8 => le(&[i8::MIN, i8::MAX, -1, 0], |v| v.to_le_bytes()),
        I16 => le(&[i16::MIN, i16::MAX, -1, 0], |v| v.to_le_bytes()),
        I32 => le(&[i32::MIN, i32::MAX, -1, 0], |v| v.to_le_bytes()),
        I64 => le(&[i64::MIN, i64::MAX, -1, 0], |v| v.to_le_bytes()),
        F16 => le(&[0.5, -2.0, 65504.0, 0.1].map(half::f16::from_f32), |v| {
            v.to_le_bytes()
        }),
        Bf16 => le(&[0.5, -2.0, 3.0e38, 0.1].map(half::bf16::from_f32), |v| {
            v.to_le_bytes()
        }),
        F32 => le(&[0.1f32, -1.5e-7, f32::MAX, f32::MIN_POSITIVE], |v| {
            v.to_le_bytes()
        }),
        F64 => le(&[0.1f64, -2.5, 1e10, std::f64::consts::PI], |v| v.to_le_bytes()),
        Bytes => encode_bytes_elements(["", "hello", "ünï \"q\"\n", "x"]),
    };
    Tensor::new(dtype, vec![2, 2], data).unwrap()
}

// ---- round trips ------------------------------------------------------------------------

#[test]
fn every_dtype_round_trips_as_json() {
    for dtype in DataType::ALL {
        let tensor = sample(dtype);
        let response = encode_response("m", "1", None, &outputs(&[("out", tensor.clone())], false));
        assert_eq!(response.header_len, None, "{dtype}");
        let header: Value = serde_json::from_slice(&response.body).unwrap();
        let data = header["outputs"][0]["data"].as_array().unwrap();
        assert_eq!(data.len(), 4, "{dtype}: data is a flat array");
        assert!(data.iter().all(|v| !v.is_array()), "{dtype}");
        assert_eq!(
            response_as_inputs(&response),
            vec![("out".to_string(), tensor)],
            "{dtype}"
        );
    }
}

#[test]
fn every_dtype_round_trips_as_binary() {
    for dtype in DataType::ALL {
        let tensor = sample(dtype);
        let response = encode_response("m", "1", None, &outputs(&[("out", tensor.clone())], true));
        let json_len = response.header_len.expect("binary output");
        assert_eq!(&response.body[json_len..], &tensor.data()[..], "{dtype}");
        let header: Value = serde_json::from_slice(&response.body[..json_len]).unwrap();
        assert_eq!(
            header["outputs"][0]["parameters"]["binary_data_size"],
            json!(tensor.data().len()),
            "{dtype}"
        );
        assert!(header["outputs"][0].get("data").is_none());
        assert_eq!(
            response_as_inputs(&response),
            vec![("out".to_string(), tensor)],
            "{dtype}"
        );
    }
}

#[test]
fn every_dtype_decodes_from_request_json() {
    let cases = [
        ("BOOL", json!([true, false]), vec![1u8, 0]),
        ("UINT8", json!([0, 255]), vec![0, 255]),
        ("UINT16", json!([1, 65535]), vec![1, 0, 255, 255]),
        ("UINT32", json!([1, 2]), vec![1, 0, 0, 0, 2, 0, 0, 0]),
        (
            "UINT64",
            json!([1, u64::MAX]),
            [1u64.to_le_bytes(), u64::MAX.to_le_bytes()].concat(),
        ),
        ("INT8", json!([-128, 127]), vec![0x80, 0x7f]),
        ("INT16", json!([-1, 2]), vec![255, 255, 2, 0]),
        ("INT32", json!([-1, 2]), vec![255, 255, 255, 255, 2, 0, 0, 0]),
        (
            "INT64",
            json!([i64::MIN, 2]),
            [i64::MIN.to_le_bytes(), 2i64.to_le_bytes()].concat(),
        ),
        (
            "FP16",
            json!([1, -0.5]),
            [
                half::f16::ONE.to_le_bytes(),
                half::f16::from_f32(-0.5).to_le_bytes(),
            ]
            .concat(),
        ),
        (
            "BF16",
            json!([1, 2.5]),
            [
                half::bf16::ONE.to_le_bytes(),
                half::bf16::from_f32(2.5).to_le_bytes(),
            ]
            .concat(),
        ),
        (
            "FP32",
            json!([1, 0.25]),
            [1f32.to_le_bytes(), 0.25f32.to_le_bytes()].concat(),
        ),
        (
            "FP64",
            json!([-3, 0.1]),
            [(-3f64).to_le_bytes(), 0.1f64.to_le_bytes()].concat(),
        ),
        (
            "BYTES",
            json!(["", "é"]),
            encode_bytes_elements(["", "é"]).to_vec(),
        ),
    ];
    for (datatype, data, bytes) in cases {
        let tensor = single(input("x", datatype, json!([2]), data)).unwrap();
        assert_eq!(tensor.dtype().as_str(), datatype);
        assert_eq!(tensor.shape(), &[2]);
        assert_eq!(&tensor.data()[..], &bytes[..], "{datatype}");
    }
}

#[test]
fn nested_and_flat_data_give_the_same_tensor() {
    let flat = single(input("x", "INT32", json!([2, 2]), json!([1, 2, 3, 4]))).unwrap();
    let nested = single(input("x", "INT32", json!([2, 2]), json!([[1, 2], [3, 4]]))).unwrap();
    let ragged = single(input("x", "INT32", json!([2, 2]), json!([[1], [[2, 3]], 4]))).unwrap();
    assert_eq!(flat, nested);
    assert_eq!(flat, ragged);
    // `datatype` after `data`: elements are held and converted afterwards.
    let late = r#"{"inputs":[{"name":"x","shape":[2,2],"data":[[1,2],[3,4]],"datatype":"INT32"}]}"#;
    let late = decode_request(Bytes::from(late), None).unwrap();
    assert_eq!(late.inputs[0].1, flat);
    let late_bytes = r#"{"inputs":[{"data":["a\n",["b"]],"name":"s","shape":[2],"datatype":"BYTES"}]}"#;
    let late_bytes = decode_request(Bytes::from(late_bytes), None).unwrap();
    assert_eq!(
        late_bytes.inputs[0].1.data(),
        &encode_bytes_elements(["a\n", "b"])
    );
}

#[test]
fn non_finite_floats_are_json_strings_and_read_back() {
    let f32s = Tensor::from_f32(vec![3], &[f32::NAN, f32::INFINITY, f32::NEG_INFINITY]).unwrap();
    let f16s = Tensor::new(
        DataType::F16,
        vec![2],
        le(&[half::f16::NAN, half::f16::NEG_INFINITY], |v| v.to_le_bytes()),
    )
    .unwrap();
    let response = encode_response(
        "m",
        "1",
        None,
        &outputs(&[("a", f32s.clone()), ("b", f16s.clone())], false),
    );
    let header: Value = serde_json::from_slice(&response.body).unwrap();
    assert_eq!(
        header["outputs"][0]["data"],
        json!(["NaN", "Infinity", "-Infinity"])
    );
    assert_eq!(header["outputs"][1]["data"], json!(["NaN", "-Infinity"]));
    assert_eq!(
        response_as_inputs(&response),
        vec![("a".to_string(), f32s), ("b".to_string(), f16s)]
    );
}

#[test]
fn non_utf8_bytes_are_forced_binary() {
    let raw = Tensor::new(
        DataType::Bytes,
        vec![2],
        encode_bytes_elements([&b"\xff\xfe"[..], b"ok"]),
    )
    .unwrap();
    let text = Tensor::new(DataType::Bytes, vec![1], encode_bytes_elements(["ok"])).unwrap();
    let response = encode_response(
        "m",
        "1",
        None,
        &outputs(&[("raw", raw.clone()), ("text", text.clone())], false),
    );
    let json_len = response.header_len.expect("forced binary");
    let header: Value = serde_json::from_slice(&response.body[..json_len]).unwrap();
    assert_eq!(
        header["outputs"][0]["parameters"]["binary_data_size"],
        json!(raw.data().len())
    );
    assert_eq!(header["outputs"][1]["data"], json!(["ok"]));
    assert_eq!(
        response_as_inputs(&response),
        vec![("raw".to_string(), raw), ("text".to_string(), text)]
    );
}

#[test]
fn response_json_layout() {
    let t = Tensor::from_f32(vec![1, 2], &[1.0, 0.5]).unwrap();
    let response = encode_response(
        "my\"model",
        "3",
        Some("42"),
        &outputs(&[("out", t.clone())], false),
    );
    assert_eq!(
        std::str::from_utf8(&response.body).unwrap(),
        r#"{"model_name":"my\"model","model_version":"3","id":"42","outputs":[{"name":"out","datatype":"FP32","shape":[1,2],"data":[1.0,0.5]}]}"#
    );
    let response = encode_response("m", "1", None, &outputs(&[("out", t)], true));
    let json_len = response.header_len.unwrap();
    assert_eq!(
        std::str::from_utf8(&response.body[..json_len]).unwrap(),
        r#"{"model_name":"m","model_version":"1","outputs":[{"name":"out","datatype":"FP32","shape":[1,2],"parameters":{"binary_data_size":8}}]}"#
    );
    assert_eq!(response.body.len(), json_len + 8);
    let empty = encode_response("m", "1", None, &[]);
    assert_eq!(
        &empty.body[..],
        br#"{"model_name":"m","model_version":"1","outputs":[]}"#
    );
}

#[test]
fn mixed_outputs_append_binary_parts_in_order() {
    let a = Tensor::from_i64(vec![2], &[1, 2]).unwrap();
    let b = Tensor::from_f32(vec![1], &[3.0]).unwrap();
    let c = Tensor::new(DataType::U8, vec![3], Bytes::from_static(&[7, 8, 9])).unwrap();
    let outs = vec![
        ResponseOutput {
            name: "a".into(),
            tensor: a.clone(),
            binary: true,
            shared: false,
        },
        ResponseOutput {
            name: "b".into(),
            tensor: b.clone(),
            binary: false,
            shared: false,
        },
        ResponseOutput {
            name: "c".into(),
            tensor: c.clone(),
            binary: true,
            shared: false,
        },
    ];
    let response = encode_response("m", "1", Some("x"), &outs);
    let json_len = response.header_len.unwrap();
    assert_eq!(
        &response.body[json_len..],
        &[&a.data()[..], &c.data()[..]].concat()[..]
    );
    let decoded = response_as_inputs(&response);
    assert_eq!(decoded, vec![("a".into(), a), ("b".into(), b), ("c".into(), c)]);
}

// ---- requests ---------------------------------------------------------------------------

#[test]
fn triton_binary_example_decodes_zero_copy() {
    let header = json!({
        "model_name": "mymodel",
        "inputs": [
            {"name": "input0", "shape": [2, 2], "datatype": "UINT32", "parameters": {"binary_data_size": 16}},
            {"name": "input1", "shape": [3], "datatype": "BOOL", "parameters": {"binary_data_size": 3}}
        ],
        "outputs": [{"name": "output0", "parameters": {"binary_data": true}}]
    });
    let uints: Vec<u8> = [1u32, 2, 3, 4].iter().flat_map(|v| v.to_le_bytes()).collect();
    let (body, header_len) = body(&header, &[&uints, &[1, 0, 1]]);
    let json_len = header_len.unwrap();
    let request = decode_request(body.clone(), header_len).unwrap();
    assert_eq!(request.id, None);
    assert_eq!(request.inputs[0].0, "input0");
    assert_eq!(
        request.inputs[0].1,
        Tensor::new(DataType::U32, vec![2, 2], uints.into()).unwrap()
    );
    assert_eq!(&request.inputs[1].1.data()[..], &[1, 0, 1]);
    // Zero copy: the tensors point into the body.
    assert_eq!(request.inputs[0].1.data().as_ptr(), body[json_len..].as_ptr());
    assert_eq!(
        request.inputs[1].1.data().as_ptr(),
        body[json_len + 16..].as_ptr()
    );
    assert_eq!(
        request.outputs,
        vec![RequestedOutput {
            name: "output0".into(),
            binary: Some(true),
            classification: None,
            shared_memory: None,
        }]
    );
    assert!(request.wants_binary("output0"));
    assert!(!request.wants_binary("other"));
}

#[test]
fn json_and_binary_inputs_mix() {
    let header = json!({"inputs": [
        {"name": "a", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 4}},
        input("b", "INT64", json!([1]), json!([5])),
        {"name": "c", "shape": [2], "datatype": "BYTES", "parameters": {"binary_data_size": 10}},
        {"name": "d", "shape": [0], "datatype": "FP32", "parameters": {"binary_data_size": 0}},
    ]});
    let strings = encode_bytes_elements(["hi", ""]);
    let request = decode_bin(header, &[&2f32.to_le_bytes(), &strings]).unwrap();
    let names: Vec<&str> = request.inputs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["a", "b", "c", "d"]);
    assert_eq!(request.inputs[0].1.to_f32().unwrap(), [2.0]);
    assert_eq!(request.inputs[1].1, Tensor::from_i64(vec![1], &[5]).unwrap());
    assert_eq!(request.inputs[2].1.data(), &strings);
    assert!(request.inputs[3].1.is_empty());
}

#[test]
fn request_fields_and_wants_binary() {
    let request = decode(json!({
        "id": "req-1",
        "parameters": {"binary_data_output": true},
        "inputs": [input("x", "FP32", json!([0]), json!([]))],
        "outputs": [{"name": "a", "parameters": {"binary_data": false}}, {"name": "b", "parameters": {"classification": 3}}]
    }))
    .unwrap();
    assert_eq!(request.id.as_deref(), Some("req-1"));
    assert!(request.binary_data_output);
    assert_eq!(
        request.outputs,
        vec![
            RequestedOutput {
                name: "a".into(),
                binary: Some(false),
                classification: None,
                shared_memory: None,
            },
            RequestedOutput {
                name: "b".into(),
                binary: None,
                classification: Some(3),
                shared_memory: None,
            }
        ]
    );
    assert!(!request.wants_binary("a"), "per-output binary_data wins");
    assert!(request.wants_binary("b"));
    assert!(request.wants_binary("unlisted"));

    let plain = decode(json!({"inputs": [input("x", "FP32", json!([1]), json!([1]))]})).unwrap();
    assert_eq!(
        (plain.id.as_deref(), plain.binary_data_output, plain.outputs.len()),
        (None, false, 0)
    );
    assert!(!plain.wants_binary("x"));
}

// ---- request errors ---------------------------------------------------------------------

/// The error's message mentions every one of `needles`.
fn assert_mentions(error: &CodecError, needles: &[&str]) {
    let message = error.to_string();
    for needle in needles {
        assert!(
            message.contains(needle),
            "{message:?} does not mention {needle:?}"
        );
    }
}

#[test]
fn header_length_errors() {
    let (body, _) = body(&json!({"inputs": []}), &[]);
    let len = body.len();
    let e = decode_request(body.clone(), Some(len + 1)).unwrap_err();
    assert_eq!(
        e,
        CodecError::HeaderTooLong {
            header_len: len + 1,
            body_len: len
        }
    );
    assert_mentions(&e, &[&(len + 1).to_string(), &len.to_string()]);
    assert_eq!(
        decode_request(body.clone(), Some(0)).unwrap_err(),
        CodecError::EmptyHeader
    );
    assert!(matches!(
        decode_request(body.clone(), Some(len - 1)),
        Err(CodecError::InvalidJson(_))
    ));
    assert!(matches!(
        decode_request(Bytes::from_static(b"{nope"), None),
        Err(CodecError::InvalidJson(_))
    ));
    assert!(matches!(
        decode_request(Bytes::new(), None),
        Err(CodecError::InvalidJson(_))
    ));
    assert!(matches!(
        decode_request(Bytes::from_static(b"[]"), None),
        Err(CodecError::InvalidJson(_))
    ));
    // Trailing non-JSON inside the declared header is refused too.
    let mut padded = body.to_vec();
    padded.extend_from_slice(b"xx");
    assert!(matches!(
        decode_request(padded.into(), Some(len + 2)),
        Err(CodecError::InvalidJson(_))
    ));
}

#[test]
fn binary_part_errors() {
    let header = json!({"inputs": [
        {"name": "a", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}},
        {"name": "b", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}},
    ]});
    let e = decode_bin(header.clone(), &[&[0; 12]]).unwrap_err();
    assert_eq!(
        e,
        CodecError::BinaryOutOfBounds {
            input: "b".into(),
            size: 8,
            offset: 8,
            available: 4
        }
    );
    assert_mentions(&e, &["'b'", "8", "4"]);
    // No Inference-Header-Content-Length at all: no binary section.
    let e = decode(header.clone()).unwrap_err();
    assert!(matches!(e, CodecError::BinaryOutOfBounds { ref input, available: 0, .. } if input == "a"));

    let e = decode_bin(header.clone(), &[&[0; 17]]).unwrap_err();
    assert_eq!(
        e,
        CodecError::TrailingBytes {
            expected: 16,
            got: 17
        }
    );
    assert_mentions(&e, &["16", "17"]);

    let e = decode_bin(
        json!({"inputs": [input("x", "INT8", json!([1]), json!([1]))]}),
        &[&[0]],
    )
    .unwrap_err();
    assert_eq!(e, CodecError::TrailingBytes { expected: 0, got: 1 });

    // A size that does not fit the shape.
    let wrong = json!({"inputs": [{"name": "w", "shape": [2, 2], "datatype": "UINT32", "parameters": {"binary_data_size": 8}}]});
    let e = decode_bin(wrong, &[&[0; 8]]).unwrap_err();
    assert!(
        matches!(&e, CodecError::Tensor { input, source: TensorError::ByteSize { expected: 16, got: 8, .. } } if input == "w")
    );
    assert_mentions(&e, &["'w'", "16", "8"]);
    // Malformed BYTES.
    let bytes = json!({"inputs": [{"name": "s", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 4}}]});
    let e = decode_bin(bytes, &[&[9, 0, 0, 0]]).unwrap_err();
    assert!(
        matches!(&e, CodecError::Tensor { input, source: TensorError::MalformedBytes(_) } if input == "s")
    );

    let bad_size = json!({"inputs": [{"name": "z", "shape": [1], "datatype": "INT8", "parameters": {"binary_data_size": -1}}]});
    let e = decode_bin(bad_size, &[&[0]]).unwrap_err();
    assert!(matches!(
        &e,
        CodecError::InvalidField {
            field: "parameters.binary_data_size",
            ..
        }
    ));
    assert_mentions(&e, &["'z'", "-1"]);
}

#[test]
fn data_presence_errors() {
    let neither = json!({"name": "n", "shape": [1], "datatype": "INT8"});
    assert_eq!(err(neither), CodecError::MissingData { input: "n".into() });
    let both = json!({"name": "b", "shape": [1], "datatype": "INT8", "data": [1], "parameters": {"binary_data_size": 1}});
    let e = decode_bin(json!({"inputs": [both]}), &[&[1]]).unwrap_err();
    assert_eq!(e, CodecError::ConflictingData { input: "b".into() });
    assert_mentions(&e, &["'b'"]);
    let e = err(input("s", "INT8", json!([1]), json!(5)));
    assert_eq!(
        e,
        CodecError::DataNotArray {
            input: "s".into(),
            got: "a number"
        }
    );
    assert_eq!(
        err(input("s", "INT8", json!([1]), json!(null))),
        CodecError::DataNotArray {
            input: "s".into(),
            got: "null"
        }
    );
    assert_eq!(
        err(input("s", "INT8", json!([1]), json!({"a": 1}))),
        CodecError::DataNotArray {
            input: "s".into(),
            got: "an object"
        }
    );
}

#[test]
fn element_count_errors() {
    let e = err(input("x", "FP32", json!([2, 2]), json!([1, 2, 3])));
    assert_eq!(
        e,
        CodecError::ElementCount {
            input: "x".into(),
            shape: vec![2, 2],
            expected: 4,
            got: 3
        }
    );
    assert_mentions(&e, &["'x'", "4", "3"]);
    let e = err(input("x", "BYTES", json!([1]), json!([["a"], "b"])));
    assert_eq!(
        e,
        CodecError::ElementCount {
            input: "x".into(),
            shape: vec![1],
            expected: 1,
            got: 2
        }
    );
    assert!(single(input("x", "FP32", json!([0, 3]), json!([[]])))
        .unwrap()
        .is_empty());
}

#[test]
fn element_type_and_range_errors() {
    let cases = [
        ("INT32", json!([1, 1.5]), 1, "number 1.5"),
        ("INT32", json!([1.0]), 0, "number 1.0"),
        ("INT32", json!([2147483648u64]), 0, "number 2147483648"),
        ("UINT8", json!([[1], [300]]), 1, "number 300"),
        ("UINT8", json!([-1]), 0, "number -1"),
        ("UINT64", json!([-1]), 0, "number -1"),
        ("INT64", json!([u64::MAX]), 0, "number 18446744073709551615"),
        ("BOOL", json!([true, 1]), 1, "number 1"),
        ("FP32", json!(["abc"]), 0, "string \"abc\""),
        ("FP32", json!([1e39]), 0, "number 1e39"),
        ("FP16", json!([0, 1e6]), 1, "number 1000000.0"),
        ("FP64", json!([true]), 0, "boolean true"),
        ("BYTES", json!(["a", 5]), 1, "number 5"),
        ("INT8", json!([null]), 0, "null"),
        ("INT8", json!([1, {"a": 1}]), 1, "an object"),
    ];
    for (datatype, data, index, got) in cases {
        let e = err(input(
            "t",
            datatype,
            json!([data.as_array().unwrap().len()]),
            data.clone(),
        ));
        match &e {
            CodecError::InvalidElement {
                input,
                index: i,
                datatype: d,
                got: g,
                ..
            } => {
                assert_eq!((input.as_str(), *i, d.as_str()), ("t", index, datatype), "{data}");
                assert!(g.contains(got), "{g:?} vs {got:?}");
            }
            other => panic!("{datatype} {data}: {other:?}"),
        }
        assert_mentions(&e, &["'t'", &format!("element {index}"), datatype]);
    }
    let e = err(input("u", "UINT8", json!([1]), json!([256])));
    assert_mentions(&e, &["'u'", "[0, 255]", "256"]);
}

#[test]
fn header_field_errors() {
    let e = err(input("x", "FLOAT", json!([1]), json!([1])));
    assert_eq!(
        e,
        CodecError::UnknownDatatype {
            input: "x".into(),
            datatype: "FLOAT".into()
        }
    );
    assert_mentions(&e, &["'x'", "FLOAT", "FP32"]);
    let e = err(input("x", "FP32", json!([-1, 2]), json!([1])));
    assert_eq!(
        e,
        CodecError::NegativeShape {
            input: "x".into(),
            shape: vec![-1, 2]
        }
    );
    assert_mentions(&e, &["'x'", "[-1, 2]"]);
    let e = err(input("x", "FP32", json!([1.5]), json!([1])));
    assert!(matches!(&e, CodecError::InvalidField { field: "shape", .. }));
    assert_mentions(&e, &["'x'", "[1.5]"]);
    let e = err(input("x", "FP32", json!([i64::MAX, i64::MAX]), json!([1])));
    assert!(matches!(
        &e,
        CodecError::Tensor {
            source: TensorError::TooLarge { .. },
            ..
        }
    ));
    let e = err(json!({"name": "x", "datatype": "FP32", "data": [1]}));
    assert_eq!(
        e,
        CodecError::MissingField {
            at: "input 'x'".into(),
            field: "shape"
        }
    );
    let e = err(json!({"shape": [1], "datatype": "FP32", "data": [1]}));
    assert_eq!(
        e,
        CodecError::MissingField {
            at: "input #0".into(),
            field: "name"
        }
    );
    let e = err(json!({"name": 3, "shape": [1], "datatype": "FP32", "data": [1]}));
    assert_mentions(&e, &["input #0", "name", "number 3"]);
    let e = err(json!({"name": "x", "shape": [1], "datatype": 5, "data": [1]}));
    assert_mentions(&e, &["'x'", "datatype", "number 5"]);
    let e = err(json!({"name": "x", "shape": [1], "datatype": "FP32", "data": [1], "parameters": []}));
    assert_mentions(&e, &["'x'", "parameters", "an object"]);

    let dup = r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1],"data":[2]}]}"#;
    assert!(matches!(
        decode_request(Bytes::from(dup), None),
        Err(CodecError::InvalidJson(_))
    ));
    assert!(matches!(decode(json!({})), Err(CodecError::InvalidJson(_))));
    assert!(matches!(
        decode(json!({"inputs": [5]})),
        Err(CodecError::InvalidJson(_))
    ));
}

#[test]
fn request_level_errors() {
    let x = || input("x", "INT8", json!([1]), json!([1]));
    let e = decode(json!({"inputs": [x(), input("y", "INT8", json!([1]), json!([1])), x()]})).unwrap_err();
    assert_eq!(e, CodecError::DuplicateInput { input: "x".into() });
    assert_mentions(&e, &["'x'"]);
    let e = decode(json!({"inputs": [x()], "outputs": [{"name": "o"}, {"name": "o"}]})).unwrap_err();
    assert_eq!(e, CodecError::DuplicateOutput { output: "o".into() });
    let e =
        decode(json!({"inputs": [x()], "outputs": [{"name": "o", "parameters": {"binary_data": "yes"}}]}))
            .unwrap_err();
    assert_mentions(&e, &["output 'o'", "binary_data", "string \"yes\""]);
    let e = decode(json!({"inputs": [x()], "outputs": [{"parameters": {}}]})).unwrap_err();
    assert_eq!(
        e,
        CodecError::MissingField {
            at: "output #0".into(),
            field: "name"
        }
    );
    let e = decode(json!({"inputs": [x()], "parameters": {"binary_data_output": 1}})).unwrap_err();
    assert_mentions(&e, &["request", "binary_data_output", "a boolean", "number 1"]);
    let e = decode(json!({"inputs": [x()], "parameters": "p"})).unwrap_err();
    assert_mentions(&e, &["request", "parameters"]);
    let e = decode(json!({"inputs": [x()], "id": 42})).unwrap_err();
    assert_mentions(&e, &["request", "id", "a string", "number 42"]);
}

#[test]
fn datatype_names_list_is_complete() {
    let names: Vec<&str> = DataType::ALL.iter().map(|d| d.as_str()).collect();
    assert_eq!(DATATYPE_NAMES, names.join(", "));
}

// ---- properties -------------------------------------------------------------------------

/// A tensor of FP32 (any bits, NaN payloads included), INT64 or BYTES (any bytes).
fn arb_tensor() -> impl Strategy<Value = Tensor> {
    let dims = prop_oneof![
        (0usize..12).prop_map(|n| vec![n as i64]),
        (0usize..4, 0usize..4).prop_map(|(a, b)| vec![a as i64, b as i64]),
    ];
    (dims, 0..3u8).prop_flat_map(|(shape, kind)| {
        let n = shape.iter().product::<i64>() as usize;
        match kind {
            0 => proptest::collection::vec(any::<u32>(), n)
                .prop_map(move |v| {
                    let data: Vec<u8> = v.iter().flat_map(|b| b.to_le_bytes()).collect();
                    Tensor::new(DataType::F32, shape.clone(), data.into()).unwrap()
                })
                .boxed(),
            1 => proptest::collection::vec(any::<i64>(), n)
                .prop_map(move |v| Tensor::from_i64(shape.clone(), &v).unwrap())
                .boxed(),
            _ => proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..6), n)
                .prop_map(move |v| {
                    Tensor::new(DataType::Bytes, shape.clone(), encode_bytes_elements(v)).unwrap()
                })
                .boxed(),
        }
    })
}

/// Like [`arb_tensor`] but JSON-representable losslessly: finite FP32, UTF-8 BYTES.
fn arb_json_tensor() -> impl Strategy<Value = Tensor> {
    (0usize..10, 0..3u8).prop_flat_map(|(n, kind)| {
        let shape = vec![n as i64];
        match kind {
            0 => proptest::collection::vec(any::<f32>().prop_filter("finite", |f| f.is_finite()), n)
                .prop_map(move |v| Tensor::from_f32(shape.clone(), &v).unwrap())
                .boxed(),
            1 => proptest::collection::vec(any::<i64>(), n)
                .prop_map(move |v| Tensor::from_i64(shape.clone(), &v).unwrap())
                .boxed(),
            _ => proptest::collection::vec(".{0,5}", n)
                .prop_map(move |v| {
                    Tensor::new(DataType::Bytes, shape.clone(), encode_bytes_elements(v)).unwrap()
                })
                .boxed(),
        }
    })
}

fn valid_binary_request() -> Vec<u8> {
    let header = json!({
        "id": "1",
        "parameters": {"binary_data_output": true},
        "inputs": [
            {"name": "a", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}},
            input("b", "BYTES", json!([2]), json!(["x", "yz"])),
            {"name": "c", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 7}},
        ],
        "outputs": [{"name": "o", "parameters": {"binary_data": false}}]
    });
    let (body, _) = body(&header, &[&[0; 8], &encode_bytes_elements(["abc"])]);
    body.to_vec()
}

proptest! {
    #[test]
    fn decode_never_panics_on_random_bytes(
        data in proptest::collection::vec(any::<u8>(), 0..256),
        header_len in proptest::option::of(0usize..300),
    ) {
        let _ = decode_request(data.into(), header_len);
    }

    #[test]
    fn decode_never_panics_on_mutated_requests(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
        header_len in proptest::option::of(0usize..400),
    ) {
        let mut body = valid_binary_request();
        for (at, byte) in edits {
            let i = at.index(body.len());
            body[i] = byte;
        }
        if truncate {
            body.truncate(cut.index(body.len() + 1));
        }
        let _ = decode_request(body.into(), header_len);
    }

    #[test]
    fn binary_responses_round_trip(
        tensors in proptest::collection::vec(arb_tensor(), 0..4),
        binary in proptest::collection::vec(any::<bool>(), 4),
    ) {
        let outs: Vec<ResponseOutput> = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| ResponseOutput {
                name: format!("out{i}"),
                tensor: t.clone(),
                // All binary in half of the runs, mixed otherwise (NaN payloads and
                // infinities only survive as binary).
                binary: binary[i] || binary[3] || t.to_f32().is_some_and(|v| v.iter().any(|f| !f.is_finite())),
                shared: false,
            })
            .collect();
        let response = encode_response("m", "1", Some("id"), &outs);
        let decoded = response_as_inputs(&response);
        let expected: Vec<(String, Tensor)> = outs.into_iter().map(|o| (o.name, o.tensor)).collect();
        prop_assert_eq!(decoded, expected);
    }

    #[test]
    fn json_responses_round_trip(tensors in proptest::collection::vec(arb_json_tensor(), 1..4)) {
        let outs: Vec<ResponseOutput> = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| ResponseOutput { name: format!("out{i}"), tensor: t.clone(), binary: false, shared: false })
            .collect();
        let response = encode_response("m", "1", None, &outs);
        prop_assert_eq!(response.header_len, None);
        let decoded = response_as_inputs(&response);
        let expected: Vec<(String, Tensor)> = outs.into_iter().map(|o| (o.name, o.tensor)).collect();
        prop_assert_eq!(decoded, expected);
    }
}

#[test]
fn unimplemented_parameters_are_refused_not_ignored() {
    let decode = |json: &str| decode_request(bytes::Bytes::from(json.to_string()), None);
    let input = r#"{"name":"x","shape":[1],"datatype":"FP32","data":[1]"#;
    let err = decode(&format!(
        r#"{{"inputs":[{input},"parameters":{{"shared_memory_region":"r","shared_memory_byte_size":4}}}}]}}"#
    ))
    .unwrap_err();
    assert!(
        matches!(&err, CodecError::ConflictingData { .. }),
        "data and a region: {err}"
    );
    let err = decode(&format!(
        r#"{{"inputs":[{input},"parameters":{{"priority_boost":1}}}}]}}"#
    ))
    .unwrap_err();
    assert!(
        matches!(&err, CodecError::UnsupportedParameter { name, .. } if name == "priority_boost"),
        "{err}"
    );
    let err = decode(&format!(
        r#"{{"inputs":[{input}}}],"outputs":[{{"name":"y","parameters":{{"shared_memory_region":"r"}}}}]}}"#
    ))
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("output 'y': missing required field 'parameters.shared_memory_byte_size'"),
        "{err}"
    );
    let err = decode(&format!(
        r#"{{"inputs":[{input}}}],"outputs":[{{"name":"y","parameters":{{"shared_memory_region":"r","shared_memory_byte_size":8,"classification":2}}}}]}}"#
    ))
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("not both 'shared_memory_region' and 'classification'"),
        "{err}"
    );
    for bad in ["0", "-1", "1.5", "\"3\""] {
        let err = decode(&format!(
            r#"{{"inputs":[{input}}}],"outputs":[{{"name":"y","parameters":{{"classification":{bad}}}}}]}}"#
        ))
        .unwrap_err();
        assert!(
            err.to_string().contains("parameters.classification"),
            "{bad}: {err}"
        );
    }
    let ok = decode(&format!(
        r#"{{"inputs":[{input}}}],"outputs":[{{"name":"y","parameters":{{"binary_data":true}}}}]}}"#
    ))
    .unwrap();
    assert!(
        ok.wants_binary("y"),
        "the parameters Trident implements are still accepted"
    );
}

// ---- field order -------------------------------------------------------------------------

/// `json!` sorts keys, so the tests above send `data` before `datatype`; clients send
/// `datatype` first. Both orders must decode alike, errors included.
#[test]
fn data_before_or_after_datatype_decodes_alike() {
    let decode_text = |text: &str| decode_request(Bytes::from(text.to_string()), None);
    for (datatype, data) in [
        ("FP32", "[[1.5, -2], [3e3, \"NaN\"]]"),
        ("INT64", "[1, 2, 3, -4]"),
        ("BYTES", "[\"a\", \"\", \"é\", \"xyz\"]"),
        ("INT8", "[1, 2, 300, 4]"),
        ("BOOL", "[true, false, 1, true]"),
        ("FP16", "{\"not\": \"an array\"}"),
    ] {
        let first =
            format!(r#"{{"inputs":[{{"name":"x","shape":[2,2],"datatype":"{datatype}","data":{data}}}]}}"#);
        let last =
            format!(r#"{{"inputs":[{{"name":"x","data":{data},"shape":[2,2],"datatype":"{datatype}"}}]}}"#);
        assert_eq!(decode_text(&first), decode_text(&last), "{datatype} {data}");
    }
    let bad = r#"{"inputs":[{"name":"x","data":[1,2,3,4],"shape":[2,2],"datatype":"FP99"}]}"#;
    assert!(matches!(
        decode_text(bad),
        Err(CodecError::UnknownDatatype { .. })
    ));
}

#[test]
fn shared_memory_inputs_and_outputs_are_named_not_read() {
    let body = r#"{"inputs":[
        {"name":"a","shape":[1,16],"datatype":"INT32","parameters":{"shared_memory_region":"in","shared_memory_byte_size":64}},
        {"name":"b","shape":[1,16],"datatype":"INT32","parameters":{"shared_memory_region":"in","shared_memory_byte_size":64,"shared_memory_offset":64}}],
      "outputs":[{"name":"c","parameters":{"shared_memory_region":"out","shared_memory_byte_size":64,"binary_data":false}}]}"#;
    let r = decode_request(bytes::Bytes::from(body), None).unwrap();
    assert!(r.inputs.is_empty());
    assert_eq!(r.shared_inputs.len(), 2);
    assert_eq!(
        r.shared_inputs[1].at,
        ShmRef {
            region: "in".into(),
            offset: 64,
            byte_size: 64
        }
    );
    assert_eq!(r.shared_inputs[1].shape, vec![1, 16]);
    assert_eq!(
        r.outputs[0].shared_memory,
        Some(ShmRef {
            region: "out".into(),
            offset: 0,
            byte_size: 64
        })
    );
    let dup = r#"{"inputs":[
        {"name":"a","shape":[1],"datatype":"INT32","data":[1]},
        {"name":"a","shape":[1],"datatype":"INT32","parameters":{"shared_memory_region":"in","shared_memory_byte_size":4}}]}"#;
    let err = decode_request(bytes::Bytes::from(dup), None).unwrap_err();
    assert!(matches!(err, CodecError::DuplicateInput { .. }), "{err}");
}
