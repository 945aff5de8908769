//! Which backend serves a configuration. Triton's `platform: "onnxruntime_onnx"` and
//! `backend: "onnxruntime"` pick ONNX Runtime when it is built in (cargo feature `ort`)
//! and its library can be found, else tract, with a log line saying so. The parameter
//! `trident.onnx_engine` (`ort` | `tract`) forces one. An engine left out of the build
//! (cargo features `ort`, `tract`) is refused by name when a model asks for it.

use crate::backend::image::ImageBackend;
use crate::backend::repeat::RepeatBackend;
use crate::backend::table::TableBackend;
use crate::backend::tokenizer::TokenizerBackend;
use crate::backend::{ort_engine, tract_engine, Backend, BackendError};
use std::sync::{Arc, OnceLock};
use trident_core::config::ModelConfig;

/// The chosen backend.
pub(super) struct Engine {
    pub backend: Arc<dyn Backend>,
}

const ONNX_PLATFORMS: &[&str] = &["", "onnxruntime_onnx"];
const ONNX_BACKENDS: &[&str] = &["", "onnxruntime"];

/// Server-wide choice of ONNX engine (`--onnx-engine`); a model's
/// `trident.onnx_engine` parameter overrides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnnxEngine {
    /// ONNX Runtime when available, else tract.
    #[default]
    Auto,
    /// ONNX Runtime, or fail to load.
    Ort,
    /// tract.
    Tract,
}

pub(super) fn select(config: &ModelConfig, default: OnnxEngine) -> Result<Engine, String> {
    // Trident's native pre-processing backends.
    if config.platform.is_empty() {
        match config.backend.as_str() {
            "tokenizer" => return Ok(native(&TOKENIZER, || Arc::new(TokenizerBackend))),
            "image" => return Ok(native(&IMAGE, || Arc::new(ImageBackend))),
            "table" => return Ok(native(&TABLE, || Arc::new(TableBackend))),
            "repeat" => return Ok(native(&REPEAT, || Arc::new(RepeatBackend))),
            _ => {}
        }
    }
    if !ONNX_PLATFORMS.contains(&config.platform.as_str())
        || !ONNX_BACKENDS.contains(&config.backend.as_str())
    {
        return Err(format!(
            "platform '{}' / backend '{}' is not supported: Trident serves ONNX models \
             (platform \"onnxruntime_onnx\" or backend \"onnxruntime\"), ensembles (platform \"ensemble\") \
             its own pre-processing (backend \"tokenizer\", \"image\" or \"table\") and Triton's example \
             decoupled backend (backend \"repeat\")",
            config.platform, config.backend
        ));
    }
    let forced = config
        .parameters
        .get("trident.onnx_engine")
        .map(|p| p.string_value.as_str());
    let server_default = match default {
        OnnxEngine::Auto => None,
        OnnxEngine::Ort => Some("ort"),
        OnnxEngine::Tract => Some("tract"),
    };
    match forced.or(server_default) {
        Some("tract") => onnx(tract_engine()).map_err(|e| format!("the tract engine was asked for: {e}")),
        Some("ort") => onnx(ort_engine()).map_err(|e| format!("the ort engine was asked for: {e}")),
        Some(other) => Err(format!(
            "parameter trident.onnx_engine must be \"ort\" or \"tract\", got \"{other}\""
        )),
        None => onnx(ort_engine()).or_else(|reason| {
            let engine = onnx(tract_engine()).map_err(|no_tract| {
                format!("no ONNX engine is available: ONNX Runtime: {reason}; tract: {no_tract}")
            })?;
            static ONCE: OnceLock<()> = OnceLock::new();
            ONCE.get_or_init(|| {
                tracing::warn!("ONNX Runtime is not available ({reason}); ONNX models run on tract")
            });
            Ok(engine)
        }),
    }
}

static TOKENIZER: OnceLock<Arc<dyn Backend>> = OnceLock::new();
static IMAGE: OnceLock<Arc<dyn Backend>> = OnceLock::new();
static TABLE: OnceLock<Arc<dyn Backend>> = OnceLock::new();
static REPEAT: OnceLock<Arc<dyn Backend>> = OnceLock::new();

fn native(cell: &'static OnceLock<Arc<dyn Backend>>, make: fn() -> Arc<dyn Backend>) -> Engine {
    Engine {
        backend: cell.get_or_init(make).clone(),
    }
}

/// The file a backend reads from each version directory when `default_model_filename`
/// is not set.
pub(super) fn default_filename(config: &ModelConfig) -> &'static str {
    match (config.platform.as_str(), config.backend.as_str()) {
        ("", "tokenizer") => "tokenizer.json",
        ("", "table") => "encoder.json",
        ("", "image") | ("", "repeat") => "",
        _ => "model.onnx",
    }
}

fn onnx(backend: Result<Arc<dyn Backend>, BackendError>) -> Result<Engine, String> {
    backend
        .map(|backend| Engine { backend })
        .map_err(|e| e.to_string())
}
