//! The binary half of the codec (Triton's binary tensor data extension): cutting the
//! bytes after the JSON header into per-input parts without copying, and deciding
//! which response outputs must travel as binary.

use bytes::Bytes;
use trident_core::{DataType, Tensor};

use super::CodecError;

/// The binary section of a request body (everything after the JSON header), handed out
/// in order to the inputs that carry `binary_data_size`.
pub(super) struct Parts {
    data: Bytes,
    offset: usize,
}

impl Parts {
    pub fn new(data: Bytes) -> Self {
        Parts { data, offset: 0 }
    }

    /// The next `size` bytes, for `input`: a zero-copy slice of the body.
    pub fn take(&mut self, input: &str, size: u64) -> Result<Bytes, CodecError> {
        let available = self.data.len() - self.offset;
        match usize::try_from(size) {
            Ok(len) if len <= available => {
                let part = self.data.slice(self.offset..self.offset + len);
                self.offset += len;
                Ok(part)
            }
            _ => Err(CodecError::BinaryOutOfBounds {
                input: input.to_string(),
                size,
                offset: self.offset,
                available,
            }),
        }
    }

    /// Checks that every byte was claimed by some input.
    pub fn finish(self) -> Result<(), CodecError> {
        if self.offset != self.data.len() {
            return Err(CodecError::TrailingBytes {
                expected: self.offset,
                got: self.data.len(),
            });
        }
        Ok(())
    }
}

/// The elements of BYTES data (u32 LE length + bytes each), without allocating. Stops
/// at the first malformed element; tensors are validated at construction, so that
/// only happens for data that did not come from a [`Tensor`].
pub(super) fn bytes_iter(mut data: &[u8]) -> impl Iterator<Item = &[u8]> {
    std::iter::from_fn(move || {
        let (len, rest) = data.split_first_chunk::<4>()?;
        let len = u32::from_le_bytes(*len) as usize;
        if rest.len() < len {
            return None;
        }
        let (element, rest) = rest.split_at(len);
        data = rest;
        Some(element)
    })
}

/// Whether `tensor` cannot be written as JSON: BYTES with an element that is not
/// UTF-8 (a JSON string could only carry it lossily).
pub(super) fn must_be_binary(tensor: &Tensor) -> bool {
    tensor.dtype() == DataType::Bytes
        && bytes_iter(tensor.data()).any(|element| std::str::from_utf8(element).is_err())
}

#[cfg(test)]
mod tests {
    use super::*;
    use trident_core::tensor::encode_bytes_elements;

    #[test]
    fn parts_are_cut_in_order_and_checked() {
        let mut parts = Parts::new(Bytes::from_static(b"abcdef"));
        assert_eq!(&parts.take("a", 2).unwrap()[..], b"ab");
        assert_eq!(&parts.take("b", 0).unwrap()[..], b"");
        let err = parts.take("c", 5).unwrap_err();
        assert_eq!(
            err,
            CodecError::BinaryOutOfBounds {
                input: "c".into(),
                size: 5,
                offset: 2,
                available: 4
            }
        );
        assert!(parts.take("c", u64::MAX).is_err());
        assert_eq!(&parts.take("c", 3).unwrap()[..], b"cde");
        assert_eq!(
            parts.finish(),
            Err(CodecError::TrailingBytes { expected: 5, got: 6 })
        );
    }

    #[test]
    fn bytes_iter_matches_core_and_utf8_check() {
        let data = encode_bytes_elements(["", "héllo", "x"]);
        assert_eq!(
            bytes_iter(&data).collect::<Vec<_>>(),
            vec![&b""[..], "héllo".as_bytes(), b"x"]
        );
        assert_eq!(bytes_iter(&data[..data.len() - 1]).count(), 2);
        let ok = Tensor::new(DataType::Bytes, vec![3], data).unwrap();
        assert!(!must_be_binary(&ok));
        let bad = Tensor::new(
            DataType::Bytes,
            vec![2],
            encode_bytes_elements([&b"ok"[..], b"\xff"]),
        )
        .unwrap();
        assert!(must_be_binary(&bad));
        assert!(!must_be_binary(&Tensor::from_f32(vec![1], &[1.0]).unwrap()));
    }
}
