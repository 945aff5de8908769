//! Tensor payloads as they travel through the server: a data type, a shape and the
//! raw little-endian, row-major bytes (BYTES elements length-prefixed), exactly the
//! layout of Triton's binary tensor extension. Keeping one layout end to end means a
//! binary request is never re-encoded between the socket and the backend, and batching
//! is a byte concatenation along the first dimension.

use crate::DataType;
use bytes::{Bytes, BytesMut};

/// A tensor whose bytes have been checked against its shape and data type.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    dtype: DataType,
    shape: Vec<i64>,
    data: Bytes,
}

/// Why bytes could not form a tensor of the given type and shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TensorError {
    /// A dimension was negative.
    #[error("shape {shape:?} has a negative dimension")]
    NegativeDim {
        /// The offending shape.
        shape: Vec<i64>,
    },
    /// The element count overflowed usize.
    #[error("shape {shape:?} is too large")]
    TooLarge {
        /// The offending shape.
        shape: Vec<i64>,
    },
    /// Fixed-size data whose byte length does not match the shape.
    #[error("expected {expected} bytes for {dtype} shape {shape:?}, got {got}")]
    ByteSize {
        /// Element type.
        dtype: DataType,
        /// Declared shape.
        shape: Vec<i64>,
        /// Bytes the shape needs.
        expected: usize,
        /// Bytes received.
        got: usize,
    },
    /// BYTES data that is not a whole sequence of length-prefixed elements.
    #[error("BYTES data is malformed: {0}")]
    MalformedBytes(String),
    /// BYTES data holding a different number of elements than the shape.
    #[error("expected {expected} BYTES elements for shape {shape:?}, got {got}")]
    ElementCount {
        /// Declared shape.
        shape: Vec<i64>,
        /// Elements the shape needs.
        expected: usize,
        /// Elements found.
        got: usize,
    },
}

/// Number of elements of a shape, rejecting negative dimensions and overflow.
pub fn element_count(shape: &[i64]) -> Result<usize, TensorError> {
    shape.iter().try_fold(1usize, |acc, &d| {
        let d = usize::try_from(d).map_err(|_| TensorError::NegativeDim {
            shape: shape.to_vec(),
        })?;
        acc.checked_mul(d).ok_or_else(|| TensorError::TooLarge {
            shape: shape.to_vec(),
        })
    })
}

/// Splits Triton-serialised BYTES data into its elements.
pub fn bytes_elements(data: &[u8]) -> Result<Vec<&[u8]>, TensorError> {
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        let (len, tail) = rest.split_first_chunk::<4>().ok_or_else(|| {
            TensorError::MalformedBytes(format!(
                "{} trailing bytes, shorter than a length prefix",
                rest.len()
            ))
        })?;
        let len = u32::from_le_bytes(*len) as usize;
        if tail.len() < len {
            return Err(TensorError::MalformedBytes(format!(
                "element {} declares {len} bytes but only {} remain",
                out.len(),
                tail.len()
            )));
        }
        out.push(&tail[..len]);
        rest = &tail[len..];
    }
    Ok(out)
}

/// Serialises byte strings in Triton's BYTES layout.
pub fn encode_bytes_elements<I, B>(items: I) -> Bytes
where
    I: IntoIterator<Item = B>,
    B: AsRef<[u8]>,
{
    let mut out = BytesMut::new();
    for item in items {
        let item = item.as_ref();
        out.extend_from_slice(&(item.len() as u32).to_le_bytes());
        out.extend_from_slice(item);
    }
    out.freeze()
}

impl Tensor {
    /// Checks `data` against `dtype` and `shape`.
    pub fn new(dtype: DataType, shape: Vec<i64>, data: Bytes) -> Result<Self, TensorError> {
        let count = element_count(&shape)?;
        match dtype.size() {
            Some(size) => {
                let expected = count
                    .checked_mul(size)
                    .ok_or_else(|| TensorError::TooLarge { shape: shape.clone() })?;
                if expected != data.len() {
                    return Err(TensorError::ByteSize {
                        dtype,
                        shape,
                        expected,
                        got: data.len(),
                    });
                }
            }
            None => {
                let got = bytes_elements(&data)?.len();
                if got != count {
                    return Err(TensorError::ElementCount {
                        shape,
                        expected: count,
                        got,
                    });
                }
            }
        }
        Ok(Tensor { dtype, shape, data })
    }

    /// An FP32 tensor from values (convenience for tests and backends).
    pub fn from_f32(shape: Vec<i64>, values: &[f32]) -> Result<Self, TensorError> {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::new(DataType::F32, shape, data.into())
    }

    /// An INT64 tensor from values.
    pub fn from_i64(shape: Vec<i64>, values: &[i64]) -> Result<Self, TensorError> {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::new(DataType::I64, shape, data.into())
    }

    /// Element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// Shape.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// Raw bytes (little-endian, row-major; BYTES length-prefixed).
    pub fn data(&self) -> &Bytes {
        &self.data
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        element_count(&self.shape).expect("checked at construction")
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The same bytes viewed with another shape of equal element count (config `reshape`).
    pub fn reshape(self, shape: Vec<i64>) -> Result<Self, TensorError> {
        let (want, have) = (element_count(&shape)?, self.len());
        if want != have {
            return Err(TensorError::ElementCount {
                shape,
                expected: want,
                got: have,
            });
        }
        Ok(Tensor { shape, ..self })
    }

    /// Values of an FP32 tensor; `None` for other types.
    pub fn to_f32(&self) -> Option<Vec<f32>> {
        (self.dtype == DataType::F32).then(|| {
            self.data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        })
    }

    /// Concatenates tensors along the first dimension. All parts must share the data
    /// type and the trailing dimensions; the caller (the batcher) guarantees it.
    pub fn concat(parts: &[&Tensor]) -> Result<Tensor, TensorError> {
        let first = parts.first().expect("concat of at least one tensor");
        let mut shape = first.shape.clone();
        shape[0] = parts.iter().map(|t| t.shape[0]).sum();
        let mut data = BytesMut::with_capacity(parts.iter().map(|t| t.data.len()).sum());
        for part in parts {
            data.extend_from_slice(&part.data);
        }
        Tensor::new(first.dtype, shape, data.freeze())
    }

    /// Splits along the first dimension into pieces of `sizes` rows (they must sum to
    /// the first dimension). Fixed-size tensors are split without copying.
    pub fn split(&self, sizes: &[i64]) -> Result<Vec<Tensor>, TensorError> {
        let rows = *self.shape.first().unwrap_or(&0);
        if sizes.iter().sum::<i64>() != rows {
            return Err(TensorError::ElementCount {
                shape: self.shape.clone(),
                expected: sizes.iter().sum::<i64>() as usize,
                got: rows.max(0) as usize,
            });
        }
        let row_elems = element_count(&self.shape[1..])?;
        let offsets = self.row_offsets(rows as usize, row_elems)?;
        let mut out = Vec::with_capacity(sizes.len());
        let mut row = 0usize;
        for &n in sizes {
            let end = row + n as usize;
            let mut shape = self.shape.clone();
            shape[0] = n;
            let data = self.data.slice(offsets[row]..offsets[end]);
            out.push(Tensor::new(self.dtype, shape, data)?);
            row = end;
        }
        Ok(out)
    }

    /// Byte offset at which each row starts, plus the end offset.
    fn row_offsets(&self, rows: usize, row_elems: usize) -> Result<Vec<usize>, TensorError> {
        if let Some(size) = self.dtype.size() {
            return Ok((0..=rows).map(|r| r * row_elems * size).collect());
        }
        let mut offsets = vec![0];
        let mut offset = 0;
        let elems = bytes_elements(&self.data)?;
        for (i, e) in elems.iter().enumerate() {
            offset += 4 + e.len();
            if (i + 1) % row_elems.max(1) == 0 {
                offsets.push(offset);
            }
        }
        offsets.resize(rows + 1, offset);
        Ok(offsets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_wrong_byte_size() {
        let err = Tensor::new(DataType::F32, vec![2, 2], Bytes::from(vec![0u8; 12])).unwrap_err();
        assert_eq!(
            err,
            TensorError::ByteSize {
                dtype: DataType::F32,
                shape: vec![2, 2],
                expected: 16,
                got: 12
            }
        );
        assert!(matches!(
            Tensor::new(DataType::F32, vec![-1, 2], Bytes::new()),
            Err(TensorError::NegativeDim { .. })
        ));
    }

    #[test]
    fn bytes_elements_round_trip_and_reject_truncation() {
        let data = encode_bytes_elements(["a", "", "hello"]);
        assert_eq!(bytes_elements(&data).unwrap(), vec![&b"a"[..], b"", b"hello"]);
        assert!(bytes_elements(&data[..data.len() - 1]).is_err());
        assert!(bytes_elements(&[1, 0]).is_err());
        assert!(Tensor::new(DataType::Bytes, vec![2], data).is_err());
    }

    #[test]
    fn concat_then_split_is_identity() {
        let a = Tensor::from_f32(vec![1, 3], &[1., 2., 3.]).unwrap();
        let b = Tensor::from_f32(vec![2, 3], &[4., 5., 6., 7., 8., 9.]).unwrap();
        let joined = Tensor::concat(&[&a, &b]).unwrap();
        assert_eq!(joined.shape(), &[3, 3]);
        assert_eq!(joined.split(&[1, 2]).unwrap(), vec![a, b]);

        let s1 = Tensor::new(DataType::Bytes, vec![1, 2], encode_bytes_elements(["x", "yy"])).unwrap();
        let s2 = Tensor::new(DataType::Bytes, vec![1, 2], encode_bytes_elements(["", "zzz"])).unwrap();
        let joined = Tensor::concat(&[&s1, &s2]).unwrap();
        assert_eq!(joined.split(&[1, 1]).unwrap(), vec![s1, s2]);
    }
}
