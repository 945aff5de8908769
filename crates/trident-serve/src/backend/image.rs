//! `backend: "image"`: PNG or JPEG bytes in, the normalised `[channels, height, width]`
//! FP32 tensor the model was trained on out, decoded natively on the instance thread with
//! the training data's own decoder (`trident_data::folder`: bilinear resize to
//! height × width, grey or RGB planes in [0, 1], then `(x − mean) / std`).
//!
//! Parameters: `height` and `width` (required), `channels` (1 or 3, default 3), `mean`
//! (default 0) and `std` (default 1). The version directory needs no file. The input is the
//! config's first input (default `IMAGE`, `TYPE_STRING`, one image per row), the output its
//! first output (default `pixel_values`).

use super::{Backend, BackendError, LoadOptions, Model, ModelInstance, ModelIo, TensorSpec};
use std::path::Path;
use std::sync::Arc;
use trident_core::{DataType, Tensor};

/// The native image pre-processing backend.
pub struct ImageBackend;

struct Loaded {
    channels: usize,
    size: (usize, usize),
    mean: f32,
    std: f32,
    input: String,
    output: String,
    io: ModelIo,
}

impl Backend for ImageBackend {
    fn name(&self) -> &'static str {
        "image"
    }

    fn load(&self, path: &Path, options: &LoadOptions) -> Result<Box<dyn Model>, BackendError> {
        let err = |message: String| BackendError::Load {
            path: path.parent().unwrap_or(path).display().to_string(),
            message,
        };
        let need = |key: &str| -> Result<usize, BackendError> {
            let v: usize = options.parsed(key, 0).map_err(|e| err(e.to_string()))?;
            if v == 0 {
                return Err(err(format!(
                    "parameter '{key}' (pixels, at least 1) is required by the image backend"
                )));
            }
            Ok(v)
        };
        let (height, width) = (need("height")?, need("width")?);
        let channels: usize = options.parsed("channels", 3).map_err(|e| err(e.to_string()))?;
        if channels != 1 && channels != 3 {
            return Err(err(format!(
                "parameter 'channels' = {channels}: 1 (grey) or 3 (RGB)"
            )));
        }
        let mean: f32 = options.parsed("mean", 0.0).map_err(|e| err(e.to_string()))?;
        let std: f32 = options.parsed("std", 1.0).map_err(|e| err(e.to_string()))?;
        if !(std.is_finite() && std > 0.0 && mean.is_finite()) {
            return Err(err(format!(
                "parameters 'mean' = {mean}, 'std' = {std}: finite, std > 0"
            )));
        }
        let c = &options.config;
        let input = c.input.first().map_or("IMAGE".to_string(), |i| i.name.clone());
        let output = c
            .output
            .first()
            .map_or("pixel_values".to_string(), |o| o.name.clone());
        let io = ModelIo {
            inputs: vec![TensorSpec {
                name: input.clone(),
                dtype: DataType::Bytes,
                shape: vec![None, Some(1)],
            }],
            outputs: vec![TensorSpec {
                name: output.clone(),
                dtype: DataType::F32,
                shape: vec![
                    None,
                    Some(channels as i64),
                    Some(height as i64),
                    Some(width as i64),
                ],
            }],
        };
        Ok(Box::new(Arc::new(Loaded {
            channels,
            size: (height, width),
            mean,
            std,
            input,
            output,
            io,
        })))
    }
}

/// PNG and JPEG signatures.
fn looks_like_image(b: &[u8]) -> bool {
    b.starts_with(b"\x89PNG\r\n\x1a\n") || b.starts_with(&[0xFF, 0xD8, 0xFF])
}

impl Model for Arc<Loaded> {
    fn io(&self) -> &ModelIo {
        &self.io
    }
    fn instance(&self) -> Result<Box<dyn ModelInstance>, BackendError> {
        Ok(Box::new(self.clone()))
    }
    /// Refuses bytes that are not PNG or JPEG before they join a batch; damaged images
    /// with a valid signature are refused when decoded.
    fn check_input(&self, name: &str, tensor: &Tensor) -> Result<(), BackendError> {
        let elements = trident_core::tensor::bytes_elements(tensor.data())
            .map_err(|e| BackendError::InvalidInput(format!("input '{name}': {e}")))?;
        match elements.iter().position(|e| !looks_like_image(e)) {
            Some(i) => Err(BackendError::InvalidInput(format!(
                "input '{name}': element {i} is not a PNG or JPEG image"
            ))),
            None => Ok(()),
        }
    }
}

impl ModelInstance for Arc<Loaded> {
    fn execute(&mut self, inputs: Vec<(String, Tensor)>) -> Result<Vec<(String, Tensor)>, BackendError> {
        let elements = super::bytes_input(&inputs, &self.input)?;
        let (h, w) = self.size;
        let mut out = Vec::with_capacity(elements.len() * self.channels * h * w);
        for (i, e) in elements.iter().enumerate() {
            let mut px =
                trident_data::folder::decode_image_bytes(e, self.channels, self.size).map_err(|m| {
                    BackendError::InvalidInput(format!(
                        "input '{}': element {i} cannot be decoded as an image: {m}",
                        self.input
                    ))
                })?;
            trident_data::transform::normalize(&mut px, self.mean, self.std);
            out.extend(px);
        }
        let shape = vec![elements.len() as i64, self.channels as i64, h as i64, w as i64];
        let t = Tensor::from_f32(shape, &out).map_err(|e| BackendError::Execute(e.to_string()))?;
        Ok(vec![(self.output.clone(), t)])
    }
}
