//! `backend: "tokenizer"`: BYTES text in, INT64 (or INT32) `input_ids`, `attention_mask`
//! and `token_type_ids` out, tokenised natively on the instance thread with the rule
//! training used (`trident_data::tokenize`: special tokens, `max_length`, refuse or cut,
//! `[PAD]` padding). A step of an ensemble in front of the ONNX model; no Python.
//!
//! The version directory holds `tokenizer.json`. Parameters: `max_length` (default 512),
//! `truncation` (`true` cuts longer texts keeping `[SEP]`; default `false` refuses them with
//! a 400), `padding` (`longest` in the batch, the default, or `max_length`, which lets the
//! next model merge requests of any length). The input is the config's first input
//! (default `TEXT`, `TYPE_STRING`, one text per row); outputs are those of the config
//! among the three names (default all three, `TYPE_INT64`).

use super::{check_utf8, Backend, BackendError, LoadOptions, Model, ModelInstance, ModelIo, TensorSpec};
use std::path::Path;
use std::sync::Arc;
use trident_core::config;
use trident_core::{DataType, Tensor};
use trident_data::tokenize::{EncodeError, LengthRule, Tokenizer};

/// The native tokenizer backend.
pub struct TokenizerBackend;

/// The outputs a tokenizer model can have.
pub const OUTPUTS: [&str; 3] = ["input_ids", "attention_mask", "token_type_ids"];

struct Loaded {
    tokenizer: Arc<Tokenizer>,
    rule: LengthRule,
    fixed: bool,
    input: String,
    /// (role in OUTPUTS, name, dtype).
    outputs: Vec<(usize, String, DataType)>,
    io: ModelIo,
}

fn load_error(path: &Path, message: impl Into<String>) -> BackendError {
    BackendError::Load {
        path: path.display().to_string(),
        message: message.into(),
    }
}

impl Backend for TokenizerBackend {
    fn name(&self) -> &'static str {
        "tokenizer"
    }

    fn load(&self, path: &Path, options: &LoadOptions) -> Result<Box<dyn Model>, BackendError> {
        let err = |m: String| load_error(path, m);
        let tokenizer = Tokenizer::from_file(path).map_err(|e| load_error(path, e))?;
        let max_len: usize = options
            .parsed("max_length", 512)
            .map_err(|e| err(e.to_string()))?;
        if max_len == 0 {
            return Err(err("parameter 'max_length' must be at least 1".into()));
        }
        let truncate: bool = options
            .parsed("truncation", false)
            .map_err(|e| err(e.to_string()))?;
        let fixed = match options.parameter("padding").map(str::trim) {
            None | Some("longest") => false,
            Some("max_length") => true,
            Some(other) => {
                return Err(err(format!(
                    "parameter 'padding' = \"{other}\": expected \"longest\" or \"max_length\""
                )))
            }
        };
        let c = &options.config;
        if c.input.len() > 1 {
            return Err(err(format!(
                "a tokenizer model has one input (the text), the config declares {}",
                c.input.len()
            )));
        }
        let input = c.input.first().map_or("TEXT".to_string(), |i| i.name.clone());
        let outputs: Vec<(usize, String, DataType)> = if c.output.is_empty() {
            OUTPUTS
                .iter()
                .enumerate()
                .map(|(i, n)| (i, n.to_string(), DataType::I64))
                .collect()
        } else {
            c.output
                .iter()
                .map(|o| {
                    let role = OUTPUTS.iter().position(|n| *n == o.name).ok_or_else(|| {
                        err(format!(
                            "output '{}': a tokenizer's outputs are named {}",
                            o.name,
                            OUTPUTS.join(", ")
                        ))
                    })?;
                    let dtype = config::data_type(o.data_type).unwrap_or(DataType::I64);
                    if !matches!(dtype, DataType::I64 | DataType::I32) {
                        return Err(err(format!(
                            "output '{}': TYPE_INT64 or TYPE_INT32, not {dtype}",
                            o.name
                        )));
                    }
                    Ok((role, o.name.clone(), dtype))
                })
                .collect::<Result<_, _>>()?
        };
        let io = ModelIo {
            inputs: vec![TensorSpec {
                name: input.clone(),
                dtype: DataType::Bytes,
                shape: vec![None, Some(1)],
            }],
            outputs: outputs
                .iter()
                .map(|(_, name, dtype)| TensorSpec {
                    name: name.clone(),
                    dtype: *dtype,
                    shape: vec![None, fixed.then_some(max_len as i64)],
                })
                .collect(),
        };
        Ok(Box::new(Arc::new(Loaded {
            tokenizer: Arc::new(tokenizer),
            rule: LengthRule { max_len, truncate },
            fixed,
            input,
            outputs,
            io,
        })))
    }
}

impl Model for Arc<Loaded> {
    fn io(&self) -> &ModelIo {
        &self.io
    }
    fn instance(&self) -> Result<Box<dyn ModelInstance>, BackendError> {
        Ok(Box::new(self.clone()))
    }
    fn check_input(&self, name: &str, tensor: &Tensor) -> Result<(), BackendError> {
        check_utf8("the tokenizer", name, tensor)
    }
}

impl ModelInstance for Arc<Loaded> {
    fn execute(&mut self, inputs: Vec<(String, Tensor)>) -> Result<Vec<(String, Tensor)>, BackendError> {
        let elements = super::bytes_input(&inputs, &self.input)?;
        let mut seqs = Vec::with_capacity(elements.len());
        for (i, e) in elements.iter().enumerate() {
            let s = std::str::from_utf8(e).map_err(|_| {
                BackendError::InvalidInput(format!("input '{}': element {i} is not valid UTF-8", self.input))
            })?;
            let ids = self
                .tokenizer
                .encode_within(s, self.rule)
                .map_err(|e| {
                    BackendError::InvalidInput(match e {
                        EncodeError::TooLong { tokens, max_len } => format!(
                            "input '{}': text {i} has {tokens} tokens, more than the model's max_length {max_len} \
                             (its parameter truncation \"true\" would cut it)",
                            self.input
                        ),
                        e => format!("input '{}': text {i}: {e}", self.input),
                    })
                })?;
            seqs.push(ids);
        }
        let p = self.tokenizer.pad(&seqs, self.fixed.then_some(self.rule.max_len));
        let shape = vec![p.rows as i64, p.len as i64];
        let zeros = vec![0u32; p.ids.len()];
        self.outputs
            .iter()
            .map(|(role, name, dtype)| {
                let values = [&p.ids, &p.mask, &zeros][*role];
                let t = match dtype {
                    DataType::I32 => {
                        let v: Vec<u8> = values.iter().flat_map(|&x| (x as i32).to_le_bytes()).collect();
                        Tensor::new(DataType::I32, shape.clone(), v.into())
                    }
                    _ => Tensor::from_i64(
                        shape.clone(),
                        &values.iter().map(|&x| x as i64).collect::<Vec<_>>(),
                    ),
                };
                t.map(|t| (name.clone(), t))
                    .map_err(|e| BackendError::Execute(e.to_string()))
            })
            .collect()
    }
}
