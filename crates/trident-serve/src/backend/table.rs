//! `backend: "table"`: a table row's cells in, one tensor per feature column, and the
//! FP32 `features` the model was trained on out, encoded natively with the training run's
//! own encoder (`trident_data::table::Encoder`: numeric columns scaled with the training
//! rows' statistics, categorical columns one-hot over the training levels, missing values
//! imputed or refused as training did).
//!
//! The version directory holds `encoder.json` (written by `trident package`). Inputs are
//! named after the encoder's columns, one element per row: a numeric column is `TYPE_FP32`
//! (NaN is a missing value), a categorical column `TYPE_STRING` (an empty string or `NA`
//! is missing; a level not seen in training gives all zeros, as in training). The output
//! is the config's first output (default `features`, `[width]`).

use super::{Backend, BackendError, LoadOptions, Model, ModelInstance, ModelIo, TensorSpec};
use std::path::Path;
use std::sync::Arc;
use trident_core::{DataType, Tensor};
use trident_data::table::{cell, ColumnCode, Encoder};

/// The native table pre-processing backend.
pub struct TableBackend;

struct Loaded {
    encoder: Encoder,
    output: String,
    io: ModelIo,
}

impl Backend for TableBackend {
    fn name(&self) -> &'static str {
        "table"
    }

    fn load(&self, path: &Path, options: &LoadOptions) -> Result<Box<dyn Model>, BackendError> {
        let err = |message: String| BackendError::Load {
            path: path.display().to_string(),
            message,
        };
        let bytes = std::fs::read(path).map_err(|e| err(e.to_string()))?;
        let encoder: Encoder =
            serde_json::from_slice(&bytes).map_err(|e| err(format!("not a Trident table encoder: {e}")))?;
        let output = options
            .config
            .output
            .first()
            .map_or("features".to_string(), |o| o.name.clone());
        let inputs = encoder
            .columns
            .iter()
            .map(|c| match c {
                ColumnCode::Numeric { name, .. } => TensorSpec {
                    name: name.clone(),
                    dtype: DataType::F32,
                    shape: vec![None, Some(1)],
                },
                ColumnCode::Categorical { name, .. } => TensorSpec {
                    name: name.clone(),
                    dtype: DataType::Bytes,
                    shape: vec![None, Some(1)],
                },
            })
            .collect();
        let io = ModelIo {
            inputs,
            outputs: vec![TensorSpec {
                name: output.clone(),
                dtype: DataType::F32,
                shape: vec![None, Some(encoder.width() as i64)],
            }],
        };
        Ok(Box::new(Arc::new(Loaded { encoder, output, io })))
    }
}

impl Model for Arc<Loaded> {
    fn io(&self) -> &ModelIo {
        &self.io
    }
    fn instance(&self) -> Result<Box<dyn ModelInstance>, BackendError> {
        Ok(Box::new(self.clone()))
    }
    /// Categorical cells must be UTF-8 text.
    fn check_input(&self, name: &str, tensor: &Tensor) -> Result<(), BackendError> {
        super::check_utf8("the table backend", name, tensor)
    }
}

/// One column's cells as text (`None`: missing), numbers printed exactly.
fn column_cells(name: &str, t: &Tensor) -> Result<Vec<Option<String>>, BackendError> {
    let bad = |m: String| BackendError::InvalidInput(format!("input '{name}': {m}"));
    match t.dtype() {
        DataType::F32 => Ok(t
            .to_f32()
            .ok_or_else(|| bad("not FP32".into()))?
            .into_iter()
            .map(|v| (!v.is_nan()).then(|| v.to_string()))
            .collect()),
        DataType::Bytes => trident_core::tensor::bytes_elements(t.data())
            .map_err(|e| bad(e.to_string()))?
            .into_iter()
            .map(|e| Ok(cell(std::str::from_utf8(e).map_err(|_| bad("not UTF-8".into()))?)))
            .collect(),
        other => Err(bad(format!("type {other:?}: FP32 or BYTES"))),
    }
}

impl ModelInstance for Arc<Loaded> {
    fn execute(&mut self, inputs: Vec<(String, Tensor)>) -> Result<Vec<(String, Tensor)>, BackendError> {
        let names = self.encoder.column_names();
        let mut columns = Vec::with_capacity(names.len());
        for name in &names {
            let (_, t) = inputs
                .iter()
                .find(|(n, _)| n == name)
                .ok_or_else(|| BackendError::InvalidInput(format!("input '{name}' missing")))?;
            columns.push(column_cells(name, t)?);
        }
        let rows = columns.first().map_or(0, Vec::len);
        if let Some((name, c)) = names.iter().zip(&columns).find(|(_, c)| c.len() != rows) {
            return Err(BackendError::InvalidInput(format!(
                "input '{name}' has {} rows, input '{}' {rows}",
                c.len(),
                names[0]
            )));
        }
        let mut out = Vec::with_capacity(rows * self.encoder.width());
        for r in 0..rows {
            let cells: Vec<Option<&str>> = columns.iter().map(|c| c[r].as_deref()).collect();
            let encoded = self
                .encoder
                .encode(&cells, &mut out)
                .map_err(|m| BackendError::InvalidInput(format!("row {r}: {m}")))?;
            if encoded.is_none() {
                let missing: Vec<&str> = names
                    .iter()
                    .zip(&cells)
                    .filter(|(_, c)| c.is_none())
                    .map(|(n, _)| *n)
                    .collect();
                return Err(BackendError::InvalidInput(format!(
                    "row {r}: {missing:?} missing; the model was trained dropping rows with missing \
                     values, so it has nothing to put in their place"
                )));
            }
        }
        let shape = vec![rows as i64, self.encoder.width() as i64];
        let t = Tensor::from_f32(shape, &out).map_err(|e| BackendError::Execute(e.to_string()))?;
        Ok(vec![(self.output.clone(), t)])
    }
}
