//! Triton / KServe v2 tensor data types.

use std::fmt;
use std::str::FromStr;

/// A tensor element type, named as in the KServe v2 protocol (`"FP32"`) and as in
/// Triton's `config.pbtxt` (`TYPE_FP32`; BYTES is `TYPE_STRING` there).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum DataType {
    Bool,
    U8,
    U16,
    U32,
    U64,
    I8,
    I16,
    I32,
    I64,
    F16,
    F32,
    F64,
    Bf16,
    /// Variable-length byte strings, each serialised as a little-endian u32 length
    /// followed by the bytes (Triton's wire and in-memory form).
    Bytes,
}

impl DataType {
    /// Every data type, in protocol order.
    pub const ALL: [DataType; 14] = [
        Self::Bool,
        Self::U8,
        Self::U16,
        Self::U32,
        Self::U64,
        Self::I8,
        Self::I16,
        Self::I32,
        Self::I64,
        Self::F16,
        Self::F32,
        Self::F64,
        Self::Bf16,
        Self::Bytes,
    ];

    /// Size of one element in bytes; `None` for the variable-length BYTES type.
    pub fn size(self) -> Option<usize> {
        use DataType::*;
        Some(match self {
            Bool | U8 | I8 => 1,
            U16 | I16 | F16 | Bf16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 => 8,
            Bytes => return None,
        })
    }

    /// The KServe v2 name (`"FP32"`, `"BYTES"`).
    pub fn as_str(self) -> &'static str {
        use DataType::*;
        match self {
            Bool => "BOOL",
            U8 => "UINT8",
            U16 => "UINT16",
            U32 => "UINT32",
            U64 => "UINT64",
            I8 => "INT8",
            I16 => "INT16",
            I32 => "INT32",
            I64 => "INT64",
            F16 => "FP16",
            F32 => "FP32",
            F64 => "FP64",
            Bf16 => "BF16",
            Bytes => "BYTES",
        }
    }

    /// The `config.pbtxt` enum name (`"TYPE_FP32"`, `"TYPE_STRING"`).
    pub fn config_name(self) -> String {
        match self {
            DataType::Bytes => "TYPE_STRING".to_string(),
            other => format!("TYPE_{}", other.as_str()),
        }
    }

    /// Parses a `config.pbtxt` enum name; `None` for `TYPE_INVALID` or unknown names.
    pub fn from_config_name(name: &str) -> Option<Self> {
        match name.strip_prefix("TYPE_")? {
            "STRING" => Some(DataType::Bytes),
            rest => rest.parse().ok(),
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The protocol name was not one of the KServe v2 data types.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown datatype '{0}'")]
pub struct UnknownDataType(pub String);

impl FromStr for DataType {
    type Err = UnknownDataType;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DataType::ALL
            .into_iter()
            .find(|d| d.as_str() == s)
            .ok_or_else(|| UnknownDataType(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DataType::ALL {
            assert_eq!(d.as_str().parse::<DataType>().unwrap(), d);
            assert_eq!(DataType::from_config_name(&d.config_name()), Some(d));
        }
        assert_eq!(DataType::from_config_name("TYPE_STRING"), Some(DataType::Bytes));
        assert_eq!(DataType::from_config_name("TYPE_INVALID"), None);
        assert!("FLOAT".parse::<DataType>().is_err());
    }
}
