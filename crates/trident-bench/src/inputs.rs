//! Request bodies, prepared before the load starts so that sending costs the generator
//! no encoding: from a JSON file in perf_analyzer's `--input-data` format, or random or
//! zero data shaped from the model's metadata; in KServe JSON or with the binary tensor
//! extension.

use crate::client::{Body, ModelInfo, TensorInfo};
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;
use trident_core::config::pb;
use trident_data::rng::SplitMix64;

/// Where input values come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// Uniform random values (floats in [0, 1), integers in [0, 100), 8-letter strings).
    Random,
    /// Zeros (empty strings for BYTES).
    Zero,
    /// perf_analyzer's JSON: `{"data": [{"INPUT0": [..] | {"content": [..], "shape": [..]}}, ..]}`;
    /// requests cycle through the entries.
    File(std::path::PathBuf),
}

impl Source {
    /// `--input-data`: `random`, `zero`, or a file path.
    pub fn parse(s: &str) -> Self {
        match s {
            "random" => Source::Random,
            "zero" => Source::Zero,
            path => Source::File(path.into()),
        }
    }
}

/// How tensors travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Encoding {
    /// Values in the JSON body.
    Json,
    /// The binary tensor extension: a JSON header, then raw little-endian bytes.
    Binary,
}

/// Each request's tensors: (shape, values) per input, in the model's order.
type Entries = Vec<Vec<(Vec<i64>, Values)>>;

/// One input tensor's values.
#[derive(Debug, Clone, PartialEq)]
enum Values {
    Numbers(Vec<f64>),
    Strings(Vec<String>),
}

impl Values {
    fn len(&self) -> usize {
        match self {
            Values::Numbers(v) => v.len(),
            Values::Strings(v) => v.len(),
        }
    }
}

/// The prepared bodies (at least one) for `model`, `batch` rows per request. `shapes`
/// fixes variable dimensions by input name (`--shape NAME:d1,d2`, without the batch).
pub fn prepare(
    model: &ModelInfo,
    source: &Source,
    encoding: Encoding,
    batch: u64,
    shapes: &HashMap<String, Vec<i64>>,
) -> Result<Vec<Body>> {
    if model.inputs.is_empty() {
        bail!("model `{}` declares no inputs", model.name)
    }
    let batching = model.max_batch_size > 0;
    if batch == 0 || (batching && batch > model.max_batch_size) || (!batching && batch != 1) {
        bail!(
            "--batch-size {batch}: model `{}` takes {}",
            model.name,
            if batching {
                format!("1..={} per request", model.max_batch_size)
            } else {
                "no batch dimension (use 1)".into()
            }
        )
    }
    for name in shapes.keys() {
        if !model.inputs.iter().any(|t| &t.name == name) {
            bail!("--shape {name}: model `{}` has no input of that name", model.name)
        }
    }
    // Full shapes of each input: batch first for batching models, variable dims from --shape.
    let full_shape_of = |t: &TensorInfo| full_shape(t, batching, batch, shapes.get(&t.name));
    let entries: Entries = match source {
        Source::File(path) => from_file(path, model, &full_shape_of, batching, batch)?,
        Source::Random | Source::Zero => {
            let full_shapes: Vec<Vec<i64>> = model.inputs.iter().map(full_shape_of).collect::<Result<_>>()?;
            let mut rng = SplitMix64::new(0x5EED);
            let random = matches!(source, Source::Random);
            vec![model
                .inputs
                .iter()
                .zip(&full_shapes)
                .map(|(t, shape)| {
                    let n = shape.iter().product::<i64>() as usize;
                    (shape.clone(), generated(t, n, random, &mut rng))
                })
                .collect()]
        }
    };
    entries
        .into_iter()
        .map(|tensors| encode(model, &tensors, encoding))
        .collect()
}

fn full_shape(t: &TensorInfo, batching: bool, batch: u64, given: Option<&Vec<i64>>) -> Result<Vec<i64>> {
    let declared = if batching && !t.shape.is_empty() {
        &t.shape[1..]
    } else {
        &t.shape[..]
    };
    let dims: Vec<i64> = match given {
        Some(g)
            if g.len() != declared.len()
                || g.iter()
                    .zip(declared)
                    .any(|(g, d)| *g < 1 || (*d != -1 && g != d)) =>
        {
            bail!(
                "--shape {}: {g:?} does not fit the declared shape {declared:?}",
                t.name
            )
        }
        Some(g) => g.clone(),
        None if declared.contains(&-1) => bail!(
            "input `{}` has variable dimensions {declared:?}: give them with --shape {}:<dims>",
            t.name,
            t.name
        ),
        None => declared.to_vec(),
    };
    Ok(if batching {
        std::iter::once(batch as i64).chain(dims).collect()
    } else {
        dims
    })
}

fn generated(t: &TensorInfo, n: usize, random: bool, rng: &mut SplitMix64) -> Values {
    if t.datatype == "BYTES" {
        return Values::Strings(
            (0..n)
                .map(|_| match random {
                    true => (0..8).map(|_| (b'a' + rng.below(26) as u8) as char).collect(),
                    false => String::new(),
                })
                .collect(),
        );
    }
    let float = matches!(t.datatype.as_str(), "FP16" | "FP32" | "FP64" | "BF16");
    Values::Numbers(
        (0..n)
            .map(|_| match (random, float, t.datatype.as_str()) {
                (false, _, _) => 0.0,
                (true, true, _) => (rng.next_u64() >> 40) as f64 / (1u64 << 24) as f64,
                (true, false, "BOOL") => rng.below(2) as f64,
                (true, false, _) => rng.below(100) as f64,
            })
            .collect(),
    )
}

fn from_file(
    path: &Path,
    model: &ModelInfo,
    full_shape_of: &dyn Fn(&TensorInfo) -> Result<Vec<i64>>,
    batching: bool,
    batch: u64,
) -> Result<Entries> {
    let text = std::fs::read_to_string(path).with_context(|| format!("--input-data {}", path.display()))?;
    let doc: Value = serde_json::from_str(&text)
        .with_context(|| format!("--input-data {}: not valid JSON", path.display()))?;
    let Some(data) = doc
        .get("data")
        .and_then(Value::as_array)
        .filter(|d| !d.is_empty())
    else {
        bail!(
            "--input-data {}: expected {{\"data\": [{{\"INPUT\": [...]}}, ...]}} with at least one entry",
            path.display()
        )
    };
    let mut out = Vec::new();
    for (i, entry) in data.iter().enumerate() {
        let at = |name: &str| format!("--input-data {}: entry {i}, input `{name}`", path.display());
        let mut tensors = Vec::new();
        for t in &model.inputs {
            let Some(v) = entry.get(&t.name) else {
                bail!("{}: missing", at(&t.name))
            };
            let (content, given_shape) = match v {
                Value::Object(o) => (
                    o.get("content")
                        .with_context(|| format!("{}: object without `content`", at(&t.name)))?,
                    o.get("shape").map(|s| {
                        s.as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(Value::as_i64)
                            .collect::<Vec<_>>()
                    }),
                ),
                other => (other, None),
            };
            let values = flatten(content, &t.datatype).with_context(|| at(&t.name))?;
            // An entry holds one row; the batch repeats it, as perf_analyzer does.
            let row_shape: Vec<i64> = match given_shape {
                Some(s) => s,
                None => {
                    let shape = full_shape_of(t).with_context(|| at(&t.name))?;
                    if batching {
                        shape[1..].to_vec()
                    } else {
                        shape
                    }
                }
            };
            let per_row = row_shape.iter().product::<i64>() as usize;
            if values.len() != per_row {
                bail!(
                    "{}: {} values, the shape {row_shape:?} needs {per_row}",
                    at(&t.name),
                    values.len()
                )
            }
            let (shape, values) = if batching {
                let s: Vec<i64> = std::iter::once(batch as i64).chain(row_shape).collect();
                (s, repeat(values, batch as usize))
            } else {
                (row_shape, values)
            };
            tensors.push((shape, values));
        }
        out.push(tensors);
    }
    Ok(out)
}

fn repeat(v: Values, times: usize) -> Values {
    match v {
        Values::Numbers(v) => Values::Numbers(v.iter().copied().cycle().take(v.len() * times).collect()),
        Values::Strings(v) => Values::Strings(v.iter().cloned().cycle().take(v.len() * times).collect()),
    }
}

fn flatten(v: &Value, datatype: &str) -> Result<Values> {
    fn walk(v: &Value, nums: &mut Vec<f64>, strs: &mut Vec<String>) -> Result<()> {
        match v {
            Value::Array(a) => a.iter().try_for_each(|x| walk(x, nums, strs)),
            Value::Number(n) => {
                nums.push(n.as_f64().context("number out of range")?);
                Ok(())
            }
            Value::Bool(b) => {
                nums.push(*b as u8 as f64);
                Ok(())
            }
            Value::String(s) => {
                strs.push(s.clone());
                Ok(())
            }
            other => bail!("unexpected value {other}"),
        }
    }
    let (mut nums, mut strs) = (Vec::new(), Vec::new());
    walk(v, &mut nums, &mut strs)?;
    match (datatype == "BYTES", nums.is_empty(), strs.is_empty()) {
        (true, true, _) => Ok(Values::Strings(strs)),
        (false, _, true) => Ok(Values::Numbers(nums)),
        (true, false, _) => bail!("a BYTES input holds numbers"),
        (false, _, false) => bail!("a {datatype} input holds strings"),
    }
}

fn encode(model: &ModelInfo, tensors: &[(Vec<i64>, Values)], encoding: Encoding) -> Result<Body> {
    let mut raw = Vec::new();
    // Binary: each input's byte range in `raw`, for the gRPC form of the same request.
    let mut ranges = Vec::new();
    let inputs: Vec<Value> = model
        .inputs
        .iter()
        .zip(tensors)
        .map(|(t, (shape, values))| {
            Ok(match encoding {
                Encoding::Json => json!({
                    "name": t.name, "shape": shape, "datatype": t.datatype, "data": json_data(&t.datatype, values),
                }),
                Encoding::Binary => {
                    let before = raw.len();
                    write_binary(&t.datatype, values, &mut raw)?;
                    ranges.push(before..raw.len());
                    json!({
                        "name": t.name, "shape": shape, "datatype": t.datatype,
                        "parameters": {"binary_data_size": raw.len() - before},
                    })
                }
            })
        })
        .collect::<Result<_>>()?;
    let mut header = json!({ "inputs": inputs });
    if encoding == Encoding::Binary {
        header["parameters"] = json!({ "binary_data_output": true });
    }
    let mut bytes = serde_json::to_vec(&header)?;
    let header_length = (encoding == Encoding::Binary).then_some(bytes.len());
    bytes.extend_from_slice(&raw);
    let bytes = Bytes::from(bytes);
    // The gRPC request: the same tensors as raw_input_contents, slices of the body.
    let grpc = header_length.map(|json_len| pb::ModelInferRequest {
        model_name: model.name.clone(),
        inputs: model
            .inputs
            .iter()
            .zip(tensors)
            .map(|(t, (shape, _))| pb::model_infer_request::InferInputTensor {
                name: t.name.clone(),
                datatype: t.datatype.clone(),
                shape: shape.clone(),
                ..Default::default()
            })
            .collect(),
        raw_input_contents: ranges
            .iter()
            .map(|r| bytes.slice(json_len + r.start..json_len + r.end))
            .collect(),
        ..Default::default()
    });
    Ok(Body {
        bytes,
        header_length,
        grpc,
    })
}

/// Values as JSON: integers for integer types and booleans for BOOL (a server may refuse
/// `1.0` for an INT32 tensor), numbers for floating-point types.
fn json_data(datatype: &str, v: &Values) -> Value {
    match (v, datatype) {
        (Values::Strings(s), _) => json!(s),
        (Values::Numbers(n), "BOOL") => json!(n.iter().map(|v| *v != 0.0).collect::<Vec<_>>()),
        (Values::Numbers(n), "FP16" | "FP32" | "FP64" | "BF16") => json!(n),
        (Values::Numbers(n), _) => json!(n.iter().map(|v| *v as i64).collect::<Vec<_>>()),
    }
}

fn write_binary(datatype: &str, values: &Values, out: &mut Vec<u8>) -> Result<()> {
    let Values::Numbers(n) = values else {
        let Values::Strings(s) = values else {
            unreachable!()
        };
        for s in s {
            out.extend_from_slice(&(s.len() as u32).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
        return Ok(());
    };
    for &v in n {
        match datatype {
            "FP32" => out.extend_from_slice(&(v as f32).to_le_bytes()),
            "FP64" => out.extend_from_slice(&v.to_le_bytes()),
            "INT8" => out.extend_from_slice(&(v as i8).to_le_bytes()),
            "INT16" => out.extend_from_slice(&(v as i16).to_le_bytes()),
            "INT32" => out.extend_from_slice(&(v as i32).to_le_bytes()),
            "INT64" => out.extend_from_slice(&(v as i64).to_le_bytes()),
            "UINT8" | "BOOL" => out.push(v as u8),
            "UINT16" => out.extend_from_slice(&(v as u16).to_le_bytes()),
            "UINT32" => out.extend_from_slice(&(v as u32).to_le_bytes()),
            "UINT64" => out.extend_from_slice(&(v as u64).to_le_bytes()),
            other => bail!("binary encoding of {other} is not supported; use --encoding json"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> ModelInfo {
        ModelInfo {
            name: "m".into(),
            inputs: vec![
                TensorInfo {
                    name: "A".into(),
                    datatype: "INT32".into(),
                    shape: vec![-1, 2],
                },
                TensorInfo {
                    name: "T".into(),
                    datatype: "BYTES".into(),
                    shape: vec![-1, -1],
                },
            ],
            outputs: vec![],
            max_batch_size: 8,
        }
    }

    #[test]
    fn bodies_from_a_file_in_json_and_binary() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("in.json");
        std::fs::write(
            &f,
            r#"{"data": [{"A": [1, 2], "T": {"content": ["hi"], "shape": [1]}}]}"#,
        )
        .unwrap();
        let src = Source::File(f.clone());
        let shapes = HashMap::new();
        let json_body = &prepare(&model(), &src, Encoding::Json, 2, &shapes).unwrap()[0];
        let v: Value = serde_json::from_slice(&json_body.bytes).unwrap();
        assert_eq!(v["inputs"][0]["shape"], json!([2, 2]));
        assert_eq!(v["inputs"][0]["data"], json!([1, 2, 1, 2]));
        assert_eq!(v["inputs"][1]["data"], json!(["hi", "hi"]));
        let bin = &prepare(&model(), &src, Encoding::Binary, 1, &shapes).unwrap()[0];
        let n = bin.header_length.unwrap();
        let header: Value = serde_json::from_slice(&bin.bytes[..n]).unwrap();
        assert_eq!(header["inputs"][0]["parameters"]["binary_data_size"], 8);
        assert_eq!(header["inputs"][1]["parameters"]["binary_data_size"], 6);
        assert_eq!(&bin.bytes[n..], &[1, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, b'h', b'i']);
    }

    #[test]
    fn bad_inputs_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("in.json");
        let shapes = HashMap::new();
        let err = |text: &str| {
            std::fs::write(&f, text).unwrap();
            prepare(&model(), &Source::File(f.clone()), Encoding::Json, 1, &shapes)
                .unwrap_err()
                .to_string()
        };
        assert!(err("{nope").contains("not valid JSON"));
        assert!(err(r#"{"data": []}"#).contains("at least one entry"));
        assert!(err(r#"{"data": [{"A": [1, 2]}]}"#).contains("entry 0, input `T`: missing"));
        let e = err(r#"{"data": [{"A": [1, 2, 3], "T": {"content": ["x"], "shape": [1]}}]}"#);
        assert!(e.contains("3 values, the shape [2] needs 2"), "{e}");
        // Random data needs the variable dimension fixed; batch limits are checked.
        let e = prepare(&model(), &Source::Random, Encoding::Json, 1, &shapes)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--shape T:<dims>"), "{e}");
        let shapes = HashMap::from([("T".to_string(), vec![3])]);
        let ok = prepare(&model(), &Source::Random, Encoding::Binary, 4, &shapes).unwrap();
        assert_eq!(ok.len(), 1);
        let e = prepare(&model(), &Source::Zero, Encoding::Json, 9, &shapes)
            .unwrap_err()
            .to_string();
        assert!(e.contains("1..=8"), "{e}");
    }
}
