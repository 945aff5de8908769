//! ONNX through ONNX Runtime, the fast path (cargo feature `ort`).
//!
//! The library is loaded at run time (`ort`'s `load-dynamic`) from `ORT_DYLIB_PATH` or
//! from the `onnxruntime` Python package's `capi/` folder: the PyPI wheel ships only a
//! versioned `libonnxruntime.so.1.x`, which `ort` would not find by itself (and would
//! panic on first use). Every instance owns its own session with `threads` intra-op
//! threads and one inter-op thread, so instances × threads stays within the cores.

use super::{Backend, BackendError, LoadOptions, Model, ModelInstance, ModelIo, TensorSpec};
use ort::session::Session;
use ort::value::{DynValue, TensorElementType, ValueType};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use trident_core::tensor::{bytes_elements, encode_bytes_elements};
use trident_core::{DataType, Tensor};

/// The ONNX Runtime backend.
pub struct OrtBackend {
    env: ort::environment::Environment,
    library: PathBuf,
}

/// The process-wide ONNX Runtime backend, loaded on first use; the error says why the
/// library could not be found or loaded.
pub fn shared() -> Result<Arc<dyn Backend>, BackendError> {
    static SHARED: OnceLock<Result<Arc<dyn Backend>, String>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            let library = locate_library()?;
            let env = ort::init_from(&library)
                .map_err(|e| format!("cannot load {}: {e}", library.display()))?
                .with_name("trident")
                // No usage telemetry: a server sends nothing anywhere unasked (ONNX
                // Runtime 1.32 otherwise keeps a database under $HOME/.cache).
                .with_telemetry(false)
                .build()
                .map_err(|e| format!("cannot create an ONNX Runtime environment: {e}"))?;
            tracing::info!("ONNX Runtime loaded from {}", library.display());
            Ok(Arc::new(OrtBackend { env, library }) as Arc<dyn Backend>)
        })
        .clone()
        .map_err(|why| BackendError::Unavailable {
            engine: "onnxruntime",
            why,
        })
}

/// `ORT_DYLIB_PATH`; else `libonnxruntime.so*` in the `onnxruntime` Python package,
/// found by looking where pip puts it ([`trident_data::python::package_dirs`]: the active virtual environment,
/// the user's site, the site of each `python3` on `PATH`, the system's), or in a system
/// library folder; only if none has it, by asking `python3` (150–350 ms: a cold start of
/// the interpreter and the package's import, once most of the server's start-up).
fn locate_library() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("ORT_DYLIB_PATH") {
        return Ok(path.into());
    }
    match find_library() {
        Some(found) => Ok(found),
        None => ask_python(),
    }
}

/// `onnxruntime/capi` under a folder of Python packages.
fn capi(packages: PathBuf) -> PathBuf {
    packages.join("onnxruntime").join("capi")
}

/// The library in the first folder of [`trident_data::python::package_dirs`] or of the system's library
/// folders that has one.
fn find_library() -> Option<PathBuf> {
    let system = [
        "/usr/local/lib",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
    ];
    trident_data::python::package_dirs()
        .into_iter()
        .map(capi)
        .chain(system.map(PathBuf::from))
        .find_map(|dir| newest_library(&dir))
}

/// Where `python3` imports `onnxruntime` from.
fn ask_python() -> Result<PathBuf, String> {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import onnxruntime, os; print(os.path.dirname(os.path.dirname(onnxruntime.__file__)))",
        ])
        .output()
        .map_err(|e| {
            format!("ORT_DYLIB_PATH is not set, no libonnxruntime.so* was found, and python3 could not be run: {e}")
        })?;
    if !out.status.success() {
        return Err(
            "ORT_DYLIB_PATH is not set and no libonnxruntime.so* was found: install the onnxruntime \
             Python package (pip install onnxruntime) or set ORT_DYLIB_PATH to the library"
                .into(),
        );
    }
    let dir = capi(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
    newest_library(&dir).ok_or_else(|| format!("no libonnxruntime.so* in {}", dir.display()))
}

/// The `libonnxruntime.so*` in `dir` with the highest version (`libonnxruntime.so.1.32.0`
/// before `libonnxruntime.so.1.9.0`; the unversioned name last), if any.
fn newest_library(dir: &Path) -> Option<PathBuf> {
    let version = |p: &PathBuf| -> Vec<u64> {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        name.trim_start_matches("libonnxruntime.so")
            .split('.')
            .filter_map(|part| part.parse().ok())
            .collect()
    };
    trident_data::python::entries_named(dir, "libonnxruntime.so")
        .into_iter()
        .filter(|p| p.is_file())
        .max_by_key(version)
}

impl Backend for OrtBackend {
    fn name(&self) -> &'static str {
        "onnxruntime"
    }

    fn load(&self, path: &Path, options: &LoadOptions) -> Result<Box<dyn Model>, BackendError> {
        let load_err = |message: String| BackendError::Load {
            path: path.display().to_string(),
            message,
        };
        let bytes = std::fs::read(path).map_err(|e| load_err(e.to_string()))?;
        let model = OrtModel {
            bytes: Arc::new(bytes),
            threads: options.threads_per_instance,
            env: self.env.clone(),
            io: ModelIo::default(),
        };
        let session = model.session().map_err(|e| load_err(e.to_string()))?;
        let io = ModelIo {
            inputs: session
                .inputs()
                .iter()
                .map(|o| spec(o.name(), o.dtype()))
                .collect::<Result<_, _>>()?,
            outputs: session
                .outputs()
                .iter()
                .map(|o| spec(o.name(), o.dtype()))
                .collect::<Result<_, _>>()?,
        };
        tracing::debug!(
            "{} loaded with ONNX Runtime from {}",
            path.display(),
            self.library.display()
        );
        Ok(Box::new(OrtModel { io, ..model }))
    }
}

fn spec(name: &str, ty: &ValueType) -> Result<TensorSpec, BackendError> {
    let unsupported = || BackendError::UnsupportedType {
        backend: "onnxruntime",
        dtype: format!("{ty:?}"),
        tensor: name.to_string(),
    };
    let (Some(elem), Some(shape)) = (ty.tensor_type(), ty.tensor_shape()) else {
        return Err(unsupported());
    };
    let dtype = from_ort(elem).ok_or_else(unsupported)?;
    let shape = shape.iter().map(|&d| (d >= 0).then_some(d)).collect();
    Ok(TensorSpec {
        name: name.to_string(),
        dtype,
        shape,
    })
}

fn from_ort(t: TensorElementType) -> Option<DataType> {
    use TensorElementType as E;
    Some(match t {
        E::Bool => DataType::Bool,
        E::Uint8 => DataType::U8,
        E::Uint16 => DataType::U16,
        E::Uint32 => DataType::U32,
        E::Uint64 => DataType::U64,
        E::Int8 => DataType::I8,
        E::Int16 => DataType::I16,
        E::Int32 => DataType::I32,
        E::Int64 => DataType::I64,
        E::Float16 => DataType::F16,
        E::Float32 => DataType::F32,
        E::Float64 => DataType::F64,
        E::Bfloat16 => DataType::Bf16,
        E::String => DataType::Bytes,
        _ => return None,
    })
}

struct OrtModel {
    bytes: Arc<Vec<u8>>,
    threads: usize,
    env: ort::environment::Environment,
    io: ModelIo,
}

impl OrtModel {
    fn session(&self) -> Result<Session, ort::Error> {
        let builder = Session::builder(&self.env)?;
        let builder = builder
            .with_intra_threads(self.threads)
            .map_err(|e| ort::Error::new(e.to_string()))?;
        let mut builder = builder
            .with_inter_threads(1)
            .map_err(|e| ort::Error::new(e.to_string()))?;
        builder.commit_from_memory(&self.bytes)
    }
}

impl Model for OrtModel {
    fn io(&self) -> &ModelIo {
        &self.io
    }

    fn check_input(&self, name: &str, tensor: &Tensor) -> Result<(), BackendError> {
        super::check_utf8("ONNX Runtime", name, tensor)
    }

    fn instance(&self) -> Result<Box<dyn ModelInstance>, BackendError> {
        let session = self.session().map_err(|e| BackendError::Execute(e.to_string()))?;
        let outputs = self.io.outputs.iter().map(|s| s.name.clone()).collect();
        Ok(Box::new(OrtInstance { session, outputs }))
    }
}

struct OrtInstance {
    session: Session,
    outputs: Vec<String>,
}

impl ModelInstance for OrtInstance {
    fn execute(&mut self, inputs: Vec<(String, Tensor)>) -> Result<Vec<(String, Tensor)>, BackendError> {
        let values = inputs
            .iter()
            .map(|(name, t)| Ok((name.clone(), to_ort(name, t)?)))
            .collect::<Result<Vec<(String, DynValue)>, BackendError>>()?;
        let results = self
            .session
            .run(values)
            .map_err(|e| BackendError::Execute(e.to_string()))?;
        self.outputs
            .iter()
            .map(|name| {
                let value = results.get(name).ok_or_else(|| {
                    BackendError::Execute(format!("ONNX Runtime returned no output '{name}'"))
                })?;
                Ok((name.clone(), from_ort_value(name, value)?))
            })
            .collect()
    }
}

/// Copies little-endian bytes into a typed vector (x86-64 and aarch64 are little-endian).
fn typed<T: Copy + Default>(bytes: &[u8]) -> Vec<T> {
    let n = bytes.len() / std::mem::size_of::<T>();
    let mut v = vec![T::default(); n];
    // SAFETY: `v` has room for exactly `bytes.len()` bytes and T is plain old data
    // (callers never instantiate this with bool).
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr().cast::<u8>(), bytes.len()) };
    v
}

fn as_bytes<T: Copy>(values: &[T]) -> bytes::Bytes {
    // SAFETY: viewing initialised plain-old-data values as bytes.
    let raw =
        unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values)) };
    bytes::Bytes::copy_from_slice(raw)
}

macro_rules! numeric_types {
    ($m:ident, $($args:tt)*) => {
        $m!($($args)*;
            U8 => u8, U16 => u16, U32 => u32, U64 => u64, I8 => i8, I16 => i16, I32 => i32,
            I64 => i64, F16 => half::f16, F32 => f32, F64 => f64, Bf16 => half::bf16)
    };
}

fn to_ort(name: &str, t: &Tensor) -> Result<DynValue, BackendError> {
    let err = |e: ort::Error| BackendError::Execute(format!("input '{name}': {e}"));
    let shape: Vec<i64> = t.shape().to_vec();
    macro_rules! build {
        ($t:expr, $shape:expr; $($variant:ident => $ty:ty),*) => {
            match $t.dtype() {
                $(DataType::$variant => ort::value::Tensor::from_array(($shape, typed::<$ty>($t.data()))).map(|v| v.into_dyn()),)*
                DataType::Bool => ort::value::Tensor::from_array(($shape, $t.data().iter().map(|&b| b != 0).collect::<Vec<bool>>())).map(|v| v.into_dyn()),
                DataType::Bytes => {
                    let elements = bytes_elements($t.data())
                        .map_err(|e| BackendError::Execute(format!("input '{name}': {e}")))?;
                    return strings::to_ort(&$shape, &elements)
                        .map_err(|e| BackendError::Execute(format!("input '{name}': {e}")));
                }
            }
        };
    }
    numeric_types!(build, t, shape).map_err(err)
}

fn from_ort_value(name: &str, value: &DynValue) -> Result<Tensor, BackendError> {
    let err = |e: ort::Error| BackendError::Execute(format!("output '{name}': {e}"));
    let ty = value.dtype();
    let elem = ty
        .tensor_type()
        .and_then(from_ort)
        .ok_or_else(|| BackendError::UnsupportedType {
            backend: "onnxruntime",
            dtype: format!("{ty:?}"),
            tensor: name.to_string(),
        })?;
    macro_rules! extract {
        ($v:expr; $($variant:ident => $ty:ty),*) => {
            match elem {
                $(DataType::$variant => { let (s, d) = $v.try_extract_tensor::<$ty>().map_err(err)?; (s.to_vec(), as_bytes(d)) })*
                DataType::Bool => {
                    let (s, d) = $v.try_extract_tensor::<bool>().map_err(err)?;
                    (s.to_vec(), d.iter().map(|&b| u8::from(b)).collect::<Vec<u8>>().into())
                }
                DataType::Bytes => {
                    let elements = strings::from_ort($v)
                        .map_err(|e| BackendError::Execute(format!("output '{name}': {e}")))?;
                    ($v.shape().to_vec(), encode_bytes_elements(elements))
                }
            }
        };
    }
    let (shape, data): (Vec<i64>, bytes::Bytes) = numeric_types!(extract, value);
    Tensor::new(elem, shape, data).map_err(|e| BackendError::Execute(format!("output '{name}': {e}")))
}

/// ONNX string tensors byte for byte. ort's own string helpers go through C strings
/// and `String` (`FillStringTensor`, UTF-8 checks), which truncate or refuse elements
/// with NUL bytes or non-UTF-8 bytes; Triton's BYTES are arbitrary bytes, and ONNX
/// Runtime's strings are `std::string`s that hold any bytes. So elements are written
/// with `GetResizedStringTensorElementBuffer` and read with `GetStringTensorContent`,
/// both length-delimited.
mod strings {
    use ort::value::DynValue;
    use ort::AsPointer;
    use std::ptr::{self, NonNull};

    fn check(status: ort::sys::OrtStatusPtr) -> Result<(), String> {
        if status.0.is_null() {
            return Ok(());
        }
        let api = ort::api();
        // SAFETY: a non-null status from the C API; its message is a NUL-terminated
        // string owned by the status, copied before the status is released.
        let message = unsafe {
            let m = (api.GetErrorMessage)(status.0);
            let text = std::ffi::CStr::from_ptr(m).to_string_lossy().into_owned();
            (api.ReleaseStatus)(status.0);
            text
        };
        Err(message)
    }

    /// A string tensor of `shape` holding `elements` exactly.
    pub(super) fn to_ort(shape: &[i64], elements: &[&[u8]]) -> Result<DynValue, String> {
        let api = ort::api();
        let mut allocator = ort::memory::Allocator::default();
        let mut raw: *mut ort::sys::OrtValue = ptr::null_mut();
        // SAFETY: valid shape pointer and length; `raw` receives a new value on success.
        check(unsafe {
            (api.CreateTensorAsOrtValue)(
                allocator.ptr_mut(),
                shape.as_ptr(),
                shape.len(),
                ort::sys::ONNXTensorElementDataType::ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING,
                &mut raw,
            )
        })?;
        let raw = NonNull::new(raw).ok_or("ONNX Runtime returned no tensor")?;
        // SAFETY: `raw` is a tensor created with `allocator`; the value owns it from here
        // (released on drop, also on the error paths below).
        let mut value: DynValue = unsafe { DynValue::from_ptr(raw, Some(&allocator)) };
        for (index, element) in elements.iter().enumerate() {
            let mut buffer: *mut std::ffi::c_char = ptr::null_mut();
            // SAFETY: `index` is within the tensor (its element count is the shape's,
            // which the BYTES tensor matches); the buffer has `element.len()` bytes.
            unsafe {
                check((api.GetResizedStringTensorElementBuffer)(
                    value.ptr_mut(),
                    index,
                    element.len(),
                    &mut buffer,
                ))?;
                if !element.is_empty() {
                    ptr::copy_nonoverlapping(element.as_ptr(), buffer.cast::<u8>(), element.len());
                }
            }
        }
        Ok(value)
    }

    /// The elements of a string tensor, as bytes.
    pub(super) fn from_ort(value: &DynValue) -> Result<Vec<Vec<u8>>, String> {
        let api = ort::api();
        let count = match value.dtype() {
            ort::value::ValueType::Tensor { shape, .. } => shape.num_elements(),
            other => return Err(format!("expected a string tensor, got {other:?}")),
        };
        let mut total = 0usize;
        // SAFETY: a live string tensor; lengths and offsets are written into our buffers
        // of the sizes passed.
        let (data, mut offsets) = unsafe {
            check((api.GetStringTensorDataLength)(value.ptr(), &mut total))?;
            let mut data = vec![0u8; total];
            let mut offsets = vec![0usize; count + 1];
            check((api.GetStringTensorContent)(
                value.ptr(),
                data.as_mut_ptr().cast(),
                total,
                offsets.as_mut_ptr(),
                count,
            ))?;
            (data, offsets)
        };
        offsets[count] = total;
        offsets
            .windows(2)
            .map(|w| {
                data.get(w[0]..w[1])
                    .map(<[u8]>::to_vec)
                    .ok_or_else(|| "string offsets out of range".to_string())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_library_version_wins_and_other_files_do_not_count() {
        let dir = std::env::temp_dir().join(format!("trident-ort-lookup-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(newest_library(&dir), None, "an empty folder");
        for name in [
            "libonnxruntime.so",
            "libonnxruntime.so.1.9.0",
            "libonnxruntime.so.1.32.0",
            "libonnxruntime_providers_shared.so",
        ] {
            std::fs::write(dir.join(name), b"").unwrap();
        }
        // 1.32 is newer than 1.9, though it sorts before it as text.
        assert_eq!(newest_library(&dir), Some(dir.join("libonnxruntime.so.1.32.0")));
        assert_eq!(newest_library(&dir.join("missing")), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Looking in the package folders finds the library Python itself would load (where
    /// this machine has the onnxruntime package; CI installs it).
    #[test]
    fn the_lookup_without_python_finds_what_python_imports() {
        let Ok(asked) = ask_python() else {
            eprintln!("skipped: python3 has no onnxruntime package here");
            return;
        };
        let found = find_library().expect("the package python3 imports is in a folder searched");
        assert_eq!(
            std::fs::canonicalize(&found).unwrap(),
            std::fs::canonicalize(&asked).unwrap()
        );
        let dirs = trident_data::python::package_dirs();
        let unique: std::collections::HashSet<_> = dirs.iter().collect();
        assert_eq!(unique.len(), dirs.len(), "no folder searched twice");
    }
}
