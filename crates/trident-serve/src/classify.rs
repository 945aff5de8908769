//! Triton's classification extension: an output's top N classes per row as BYTES
//! `"value:index[:label]"`, sorted by value (largest first, ties by index), values written
//! as C++'s `std::to_string` writes them (floats with six decimals) — the strings
//! Triton's server returns.

use trident_core::tensor::encode_bytes_elements;
use trident_core::{DataType, Tensor};

/// The top `k` classes of each of `rows` rows (`None`: the model does not batch; the
/// whole tensor is one row). Labels come from the output's `label_filename`.
pub fn top_k(
    t: &Tensor,
    k: usize,
    rows: Option<usize>,
    labels: Option<&[String]>,
) -> Result<Tensor, ClassifyError> {
    let values = as_f64(t)?;
    let n_rows = rows.unwrap_or(1).max(1);
    let per_row = values.len() / n_rows;
    if per_row == 0 || values.len() % n_rows != 0 {
        return Err(ClassifyError::Shape {
            shape: t.shape().to_vec(),
        });
    }
    let k = k.min(per_row);
    let float = matches!(
        t.dtype(),
        DataType::F16 | DataType::Bf16 | DataType::F32 | DataType::F64
    );
    let mut strings = Vec::with_capacity(n_rows * k);
    for row in values.chunks(per_row) {
        let mut idx: Vec<usize> = (0..per_row).collect();
        idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        for &i in &idx[..k] {
            let v = if float {
                format!("{:.6}", row[i])
            } else {
                format!("{}", row[i] as i64)
            };
            let mut s = format!("{v}:{i}");
            if let Some(label) = labels.and_then(|l| l.get(i)) {
                s.push(':');
                s.push_str(label);
            }
            strings.push(s);
        }
    }
    let shape = match rows {
        Some(r) => vec![r as i64, k as i64],
        None => vec![k as i64],
    };
    Tensor::new(
        DataType::Bytes,
        shape,
        encode_bytes_elements(strings.iter().map(|s| s.as_bytes())),
    )
    .map_err(|e| ClassifyError::Tensor(e.to_string()))
}

/// Why an output cannot be classified (the request asked for classification of an
/// output that does not hold class scores).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClassifyError {
    /// The output is not numeric.
    #[error("classification needs a numeric output, not {dtype}")]
    NotNumeric {
        /// The output's type.
        dtype: DataType,
    },
    /// The output's elements do not split into the batch's rows.
    #[error("cannot classify a tensor of shape {shape:?}")]
    Shape {
        /// The output's shape.
        shape: Vec<i64>,
    },
    /// The classes could not be written as a tensor.
    #[error("{0}")]
    Tensor(String),
}

fn as_f64(t: &Tensor) -> Result<Vec<f64>, ClassifyError> {
    let b = t.data();
    macro_rules! read {
        ($ty:ty, $n:expr) => {
            b.chunks_exact($n)
                .map(|c| <$ty>::from_le_bytes(c.try_into().expect("chunk size")) as f64)
                .collect()
        };
    }
    Ok(match t.dtype() {
        DataType::F32 => read!(f32, 4),
        DataType::F64 => read!(f64, 8),
        DataType::I8 => read!(i8, 1),
        DataType::I16 => read!(i16, 2),
        DataType::I32 => read!(i32, 4),
        DataType::I64 => read!(i64, 8),
        DataType::U8 => read!(u8, 1),
        DataType::U16 => read!(u16, 2),
        DataType::U32 => read!(u32, 4),
        DataType::U64 => read!(u64, 8),
        DataType::F16 => b
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect(),
        DataType::Bf16 => b
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64())
            .collect(),
        dtype => return Err(ClassifyError::NotNumeric { dtype }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(t: &Tensor) -> Vec<String> {
        trident_core::tensor::bytes_elements(t.data())
            .unwrap()
            .into_iter()
            .map(|e| String::from_utf8(e.to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn top_classes_per_row_with_labels_like_triton() {
        let t = Tensor::from_f32(vec![2, 3], &[0.1, 0.7, 0.2, 0.5, 0.25, 0.25]).unwrap();
        let labels: Vec<String> = ["cat", "dog", "bird"].map(String::from).to_vec();
        let out = top_k(&t, 2, Some(2), Some(&labels)).unwrap();
        assert_eq!(out.shape(), &[2, 2]);
        assert_eq!(
            strings(&out),
            [
                "0.700000:1:dog",
                "0.200000:2:bird",
                "0.500000:0:cat",
                "0.250000:1:dog"
            ]
        );
        // More classes than there are: all of them; no labels: value:index.
        let out = top_k(&t, 9, Some(2), None).unwrap();
        assert_eq!(out.shape(), &[2, 3]);
        assert_eq!(strings(&out)[..3], ["0.700000:1", "0.200000:2", "0.100000:0"]);
        // A model without batching: one row, shape [k].
        let t = Tensor::from_i64(vec![3], &[4, -2, 9]).unwrap();
        let out = top_k(&t, 1, None, None).unwrap();
        assert_eq!(
            (out.shape(), strings(&out)),
            (&[1i64][..], vec!["9:2".to_string()])
        );
    }
}
