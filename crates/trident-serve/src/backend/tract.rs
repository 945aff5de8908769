//! ONNX through tract: pure Rust, always built, the fallback when ONNX Runtime is absent.
//!
//! The model is decluttered and optimised once with its batch/sequence dimensions left
//! symbolic, so one plan serves every request shape. Each instance owns a tract
//! `SimpleState` (spawned afresh for every run where recurrent nodes would otherwise carry
//! their state from one request into the next) and, when it may use more than one thread, a private rayon pool that
//! is installed only around its own runs (tract's executor is otherwise global).

use super::{Backend, BackendError, LoadOptions, Model, ModelInstance, ModelIo, TensorSpec};
use std::path::Path;
use std::sync::Arc;
use tract_linalg::multithread::{multithread_tract_scope, Executor};
use tract_onnx::prelude::{self as tp, Framework, InferenceModelExt, IntoRunnable};
use trident_core::tensor::{bytes_elements, encode_bytes_elements};
use trident_core::{DataType, Tensor};

type Plan = Arc<tp::TypedRunnableModel>;

/// The tract ONNX backend.
#[derive(Debug, Default)]
pub struct TractBackend;

impl Backend for TractBackend {
    fn name(&self) -> &'static str {
        "tract"
    }

    fn load(&self, path: &Path, options: &LoadOptions) -> Result<Box<dyn Model>, BackendError> {
        let load_err = |e: tp::TractError| BackendError::Load {
            path: path.display().to_string(),
            message: format!("{e:#}"),
        };
        let typed = tract_onnx::onnx()
            .with_ignore_value_info(false)
            .model_for_path(path)
            .and_then(|m| m.into_typed())
            .map_err(load_err)?;
        let io = model_io(&typed)?;
        let plan = typed
            .into_optimized()
            .and_then(|m| m.into_runnable())
            .map_err(load_err)?;
        Ok(Box::new(TractModel {
            plan,
            io,
            threads: options.threads_per_instance,
        }))
    }
}

fn model_io(model: &tp::TypedModel) -> Result<ModelIo, BackendError> {
    let spec = |name: String, fact: &tp::TypedFact| -> Result<TensorSpec, BackendError> {
        let dtype = from_tract(fact.datum_type).ok_or_else(|| BackendError::UnsupportedType {
            backend: "tract",
            dtype: format!("{:?}", fact.datum_type),
            tensor: name.clone(),
        })?;
        let shape = fact.shape.dims().iter().map(|d| d.to_i64().ok()).collect();
        Ok(TensorSpec { name, dtype, shape })
    };
    let internal = |e: tp::TractError| BackendError::Execute(e.to_string());
    let mut io = ModelIo::default();
    for &outlet in model.input_outlets().map_err(internal)? {
        let name = model.node(outlet.node).name.clone();
        io.inputs
            .push(spec(name, model.outlet_fact(outlet).map_err(internal)?)?);
    }
    for &outlet in model.output_outlets().map_err(internal)? {
        let name = model
            .outlet_label(outlet)
            .map(str::to_string)
            .unwrap_or_else(|| model.node(outlet.node).name.clone());
        io.outputs
            .push(spec(name, model.outlet_fact(outlet).map_err(internal)?)?);
    }
    Ok(io)
}

fn from_tract(dt: tp::DatumType) -> Option<DataType> {
    use tp::DatumType as T;
    Some(match dt {
        T::Bool => DataType::Bool,
        T::U8 => DataType::U8,
        T::U16 => DataType::U16,
        T::U32 => DataType::U32,
        T::U64 => DataType::U64,
        T::I8 => DataType::I8,
        T::I16 => DataType::I16,
        T::I32 => DataType::I32,
        T::I64 => DataType::I64,
        T::F16 => DataType::F16,
        T::F32 => DataType::F32,
        T::F64 => DataType::F64,
        T::String => DataType::Bytes,
        _ => return None,
    })
}

fn to_tract(dt: DataType) -> Option<tp::DatumType> {
    use tp::DatumType as T;
    Some(match dt {
        DataType::Bool => T::Bool,
        DataType::U8 => T::U8,
        DataType::U16 => T::U16,
        DataType::U32 => T::U32,
        DataType::U64 => T::U64,
        DataType::I8 => T::I8,
        DataType::I16 => T::I16,
        DataType::I32 => T::I32,
        DataType::I64 => T::I64,
        DataType::F16 => T::F16,
        DataType::F32 => T::F32,
        DataType::F64 => T::F64,
        DataType::Bytes => T::String,
        DataType::Bf16 => return None,
    })
}

struct TractModel {
    plan: Plan,
    io: ModelIo,
    threads: usize,
}

impl Model for TractModel {
    fn io(&self) -> &ModelIo {
        &self.io
    }

    fn check_input(&self, name: &str, tensor: &Tensor) -> Result<(), BackendError> {
        super::check_utf8("tract", name, tensor)
    }

    fn instance(&self) -> Result<Box<dyn ModelInstance>, BackendError> {
        let state = self
            .plan
            .spawn()
            .map_err(|e| BackendError::Execute(e.to_string()))?;
        let executor = if self.threads > 1 {
            Executor::multithread_with_name(self.threads, "tract-instance")
        } else {
            Executor::SingleThread
        };
        // Recurrent nodes (tract's Scan, GruSeq) keep their last state in the session and
        // seed the next run with it — tract's streaming semantics, which would make each
        // request's answer depend on the one before. A request stands alone here.
        let fresh_state_per_run = state.op_states.iter().any(Option::is_some);
        Ok(Box::new(TractInstance {
            state,
            plan: self.plan.clone(),
            fresh_state_per_run,
            executor,
            input_names: self.io.inputs.iter().map(|s| s.name.clone()).collect(),
            output_names: self.io.outputs.iter().map(|s| s.name.clone()).collect(),
        }))
    }
}

struct TractInstance {
    state: tp::TypedSimpleState,
    plan: Plan,
    /// Spawn a new state for every run: the plan has ops that carry state between runs.
    fresh_state_per_run: bool,
    executor: Executor,
    input_names: Vec<String>,
    output_names: Vec<String>,
}

impl ModelInstance for TractInstance {
    fn execute(&mut self, inputs: Vec<(String, Tensor)>) -> Result<Vec<(String, Tensor)>, BackendError> {
        let mut ordered = tp::TVec::new();
        for name in &self.input_names {
            let (_, tensor) = inputs.iter().find(|(n, _)| n == name).ok_or_else(|| {
                BackendError::Execute(format!("tract needs every input; '{name}' is missing"))
            })?;
            ordered.push(tp::TValue::from_const(Arc::new(to_tract_tensor(name, tensor)?)));
        }
        if self.fresh_state_per_run {
            self.state = self
                .plan
                .spawn()
                .map_err(|e| BackendError::Execute(e.to_string()))?;
        }
        let state = &mut self.state;
        let outputs = multithread_tract_scope(self.executor.clone(), || state.run(ordered))
            .map_err(|e| BackendError::Execute(format!("{e:#}")))?;
        self.output_names
            .iter()
            .zip(outputs)
            .map(|(name, value)| Ok((name.clone(), from_tract_tensor(name, &value)?)))
            .collect()
    }
}

fn to_tract_tensor(name: &str, t: &Tensor) -> Result<tp::Tensor, BackendError> {
    let unsupported = || BackendError::UnsupportedType {
        backend: "tract",
        dtype: t.dtype().to_string(),
        tensor: name.to_string(),
    };
    let dt = to_tract(t.dtype()).ok_or_else(unsupported)?;
    let shape: Vec<usize> = t.shape().iter().map(|&d| d as usize).collect();
    if t.dtype() == DataType::Bytes {
        let strings = bytes_elements(t.data())
            .map_err(|e| BackendError::Execute(e.to_string()))?
            .into_iter()
            .map(|b| String::from_utf8(b.to_vec()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| BackendError::Execute(format!("input '{name}': tract needs UTF-8 strings")))?;
        return tp::tract_ndarray::ArrayD::from_shape_vec(shape, strings)
            .map(tp::Tensor::from)
            .map_err(|e| BackendError::Execute(format!("input '{name}': {e}")));
    }
    // SAFETY: `Tensor` guarantees `data` holds exactly shape-product elements of `dt`'s
    // size, and every fixed-size datum type here is plain old data.
    unsafe { tp::Tensor::from_raw_dt(dt, &shape, t.data()) }.map_err(|e| BackendError::Execute(e.to_string()))
}

fn from_tract_tensor(name: &str, value: &tp::TValue) -> Result<Tensor, BackendError> {
    let dtype = from_tract(value.datum_type()).ok_or_else(|| BackendError::UnsupportedType {
        backend: "tract",
        dtype: format!("{:?}", value.datum_type()),
        tensor: name.to_string(),
    })?;
    let shape = value.shape().iter().map(|&d| d as i64).collect();
    let data = if dtype == DataType::Bytes {
        let strings = value
            .to_plain_array_view::<String>()
            .map_err(|e| BackendError::Execute(e.to_string()))?;
        encode_bytes_elements(strings.iter())
    } else {
        bytes::Bytes::copy_from_slice(value.as_bytes())
    };
    Tensor::new(dtype, shape, data).map_err(|e| BackendError::Execute(format!("output '{name}': {e}")))
}
