//! `model_warmup` (Triton's `ModelWarmup`): samples run on every instance before the
//! version is ready, so the first client request does not pay for lazy initialisation
//! (ONNX Runtime's first run, tract's plans for a new shape, page faults of the weights).
//!
//! Each sample's inputs are `zero_data`, `random_data` (seeded: floats in [0, 1),
//! integers 0 or 1, so token ids stay inside any vocabulary; BYTES fall back to zeros,
//! as in Triton) or `input_data_file` (raw row-major data of one row, in the model
//! directory's `warmup/` folder; BYTES as 4-byte little-endian lengths + bytes),
//! repeated `batch_size` times when the model batches, and run `count` times (at least
//! once).

use crate::{ConfigError, LoadError};
use std::path::Path;
use trident_core::config::{self, pb, ModelConfig};
use trident_core::{DataType, Tensor};

/// One warm-up request.
#[derive(Debug, Clone)]
pub struct WarmupSample {
    /// The sample's name (for errors).
    pub name: String,
    /// Inputs, batch dimension included.
    pub inputs: Vec<(String, Tensor)>,
    /// Executions per instance.
    pub count: u32,
}

/// The samples of `config`; `dir` is the model directory (for `input_data_file`).
pub fn samples(config: &ModelConfig, dir: &Path) -> Result<Vec<WarmupSample>, LoadError> {
    let batching = config.max_batch_size > 0;
    config
        .model_warmup
        .iter()
        .enumerate()
        .map(|(k, w)| {
            let name = if w.name.is_empty() {
                format!("#{}", k + 1)
            } else {
                w.name.clone()
            };
            let at = format!("model_warmup '{name}': ");
            if batching && (w.batch_size == 0 || w.batch_size as i32 > config.max_batch_size) {
                return Err(invalid(format!(
                    "{at}batch_size {} must be in 1..={}",
                    w.batch_size, config.max_batch_size
                )));
            }
            let mut names: Vec<&String> = w.inputs.keys().collect();
            names.sort();
            let inputs = names
                .into_iter()
                .map(|input| {
                    let spec = &w.inputs[input];
                    tensor(spec, batching.then_some(w.batch_size as usize), dir, k as u64)
                        .map(|t| (input.clone(), t))
                        .map_err(|e| e.within(&format!("{at}input '{input}': ")))
                })
                .collect::<Result<_, _>>()?;
            Ok(WarmupSample {
                name,
                inputs,
                count: w.count.max(1),
            })
        })
        .collect()
}

fn tensor(
    spec: &pb::model_warmup::Input,
    rows: Option<usize>,
    dir: &Path,
    seed: u64,
) -> Result<Tensor, LoadError> {
    use pb::model_warmup::input::InputDataType;
    let dtype = config::data_type(spec.data_type).ok_or_else(|| invalid("no valid data_type".into()))?;
    if spec.dims.iter().any(|&d| d < 0) {
        return Err(invalid(format!("dims {:?} must all be known (no -1)", spec.dims)));
    }
    let per_row: usize = spec.dims.iter().product::<i64>() as usize;
    let reps = rows.unwrap_or(1);
    let shape: Vec<i64> = rows
        .map(|r| r as i64)
        .into_iter()
        .chain(spec.dims.iter().copied())
        .collect();
    let width = dtype.size().unwrap_or(4); // BYTES: an empty element is 4 zero bytes
    let row: Vec<u8> = match &spec.input_data_type {
        Some(InputDataType::ZeroData(_)) | None => vec![0; per_row * width],
        Some(InputDataType::RandomData(_)) if dtype == DataType::Bytes => vec![0; per_row * width],
        Some(InputDataType::RandomData(_)) => random(dtype, per_row, seed),
        Some(InputDataType::InputDataFile(f)) => {
            let name = Path::new(f);
            if name.is_absolute()
                || name
                    .components()
                    .any(|c| !matches!(c, std::path::Component::Normal(_)))
            {
                return Err(invalid(format!(
                    "input_data_file '{f}' must name a file inside the warmup folder"
                )));
            }
            let file = dir.join("warmup").join(name);
            let bytes = std::fs::read(&file).map_err(|e| LoadError::Io {
                context: String::new(),
                path: file.clone(),
                source: std::sync::Arc::new(e),
            })?;
            let ok = match dtype {
                DataType::Bytes => {
                    trident_core::tensor::bytes_elements(&bytes).is_ok_and(|e| e.len() == per_row)
                }
                _ => bytes.len() == per_row * width,
            };
            if !ok {
                return Err(invalid(format!(
                    "{} does not hold {per_row} {dtype} elements",
                    file.display()
                )));
            }
            bytes
        }
    };
    let data: Vec<u8> = row.repeat(reps);
    Tensor::new(dtype, shape, data.into()).map_err(|e| invalid(e.to_string()))
}

/// An invalid `model_warmup`.
fn invalid(why: String) -> LoadError {
    ConfigError::new("model_warmup", why).into()
}

fn random(dtype: DataType, n: usize, seed: u64) -> Vec<u8> {
    let mut rng = trident_data::rng::SplitMix64::from_parts(&[seed, 0x3A2F_0005]);
    let mut out = Vec::with_capacity(n * dtype.size().unwrap_or(1));
    for _ in 0..n {
        let unit = rng.next_f32();
        match dtype {
            DataType::F32 => out.extend(unit.to_le_bytes()),
            DataType::F64 => out.extend(f64::from(unit).to_le_bytes()),
            DataType::F16 => out.extend(half::f16::from_f32(unit).to_le_bytes()),
            DataType::Bf16 => out.extend(half::bf16::from_f32(unit).to_le_bytes()),
            // Integers 0 or 1 (little-endian, any width); bool likewise.
            other => {
                let mut v = vec![0u8; other.size().unwrap_or(1)];
                v[0] = (rng.next_u64() & 1) as u8;
                out.extend(v);
            }
        }
    }
    out
}
