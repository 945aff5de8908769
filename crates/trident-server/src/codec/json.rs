//! The JSON half of the codec: the request header's shape (deserialised without a
//! `serde_json::Value` tree for tensor `data`) and the writer for response `data`.
//!
//! Tensor `data` is flattened while it is parsed, its elements converted straight into
//! the tensor's little-endian bytes as they stream past. That needs the `datatype`, so
//! when `data` comes first in the input object, its JSON text is kept as a borrowed
//! slice of the body and parsed the same way once the type is known: either way the
//! only copy of the elements is the tensor itself.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::ser::{CompactFormatter, Formatter};
use serde_json::value::RawValue;
use serde_json::Value;
use trident_core::{DataType, Tensor};

use super::binary::bytes_iter;

const VEC_WRITE: &str = "writing to a Vec<u8> cannot fail";

/// The request header as sent; fields are checked (with tensor names in the errors) by
/// `decode_request`, so most are kept as loose JSON values here.
#[derive(Deserialize)]
pub(super) struct RawRequest<'a> {
    #[serde(default)]
    pub id: Option<Value>,
    #[serde(default)]
    pub parameters: Option<Value>,
    #[serde(borrow)]
    pub inputs: Vec<RawInput<'a>>,
    #[serde(default)]
    pub outputs: Option<Vec<RawOutput>>,
}

/// One `$request_output`.
#[derive(Deserialize)]
pub(super) struct RawOutput {
    #[serde(default)]
    pub name: Option<Value>,
    #[serde(default)]
    pub parameters: Option<Value>,
}

/// One `$request_input`, its `data` already flattened (or, when it came before the
/// `datatype`, its JSON text).
#[derive(Default)]
pub(super) struct RawInput<'a> {
    pub name: Option<Value>,
    pub shape: Option<Value>,
    pub datatype: Option<Value>,
    pub parameters: Option<Value>,
    pub data: Option<Data<'a>>,
}

/// An input's `data` field.
pub(super) enum Data<'a> {
    /// Parsed with the datatype known.
    Parsed(Collected),
    /// Seen before the datatype: its text, parsed by [`Data::collect`].
    Unparsed(&'a RawValue),
}

impl Data<'_> {
    /// The flattened elements as `dtype`; `count` is the element count the shape declares.
    pub fn collect(self, dtype: DataType, count: usize) -> Result<Collected, serde_json::Error> {
        match self {
            Data::Parsed(collected) => Ok(collected),
            Data::Unparsed(raw) => {
                let reserve = dtype
                    .size()
                    .map_or(0, |size| size.saturating_mul(count).min(RESERVE_CAP));
                let mut de = serde_json::Deserializer::from_str(raw.get());
                DataSeed { dtype, reserve }.deserialize(&mut de)
            }
        }
    }
}

/// What an input's `data` field held.
pub(super) enum Collected {
    /// Not an array; the JSON kind found ("a number", "null", ...).
    NotArray(&'static str),
    /// An array (possibly nested), flattened.
    Array(Typed),
}

/// Elements converted to a data type's binary layout.
pub(super) struct Typed {
    pub dtype: DataType,
    pub buf: Vec<u8>,
    /// Elements seen (including any after the first bad one).
    pub count: usize,
    /// The first element that could not be converted.
    pub error: Option<ElementError>,
}

/// A JSON element that does not fit the data type.
pub(super) struct ElementError {
    pub index: usize,
    pub expected: String,
    pub got: String,
}

impl Typed {
    fn new(dtype: DataType) -> Self {
        Typed {
            dtype,
            buf: Vec::new(),
            count: 0,
            error: None,
        }
    }

    fn push(&mut self, scalar: &Scalar<'_>) {
        if self.error.is_none() && encode_scalar(self.dtype, scalar, &mut self.buf).is_err() {
            self.error = Some(ElementError {
                index: self.count,
                expected: expected(self.dtype),
                got: scalar.describe(),
            });
        }
        self.count += 1;
    }
}

/// One leaf of a `data` array.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Scalar<'s> {
    Bool(bool),
    U(u64),
    I(i64),
    F(f64),
    Str(Cow<'s, str>),
    /// A JSON value that is never a tensor element: "null" or "an object".
    Other(&'static str),
}

impl Scalar<'_> {
    fn describe(&self) -> String {
        match self {
            Scalar::Bool(b) => format!("boolean {b}"),
            Scalar::U(u) => format!("number {u}"),
            Scalar::I(i) => format!("number {i}"),
            Scalar::F(f) => format!("number {f:?}"),
            Scalar::Str(s) => format!("string {:?}", truncate(s)),
            Scalar::Other(kind) => (*kind).to_string(),
        }
    }
}

/// At most 40 characters of `s`, with an ellipsis when cut.
pub(super) fn truncate(s: &str) -> Cow<'_, str> {
    match s.char_indices().nth(40) {
        Some((at, _)) => Cow::Owned(format!("{}…", &s[..at])),
        None => Cow::Borrowed(s),
    }
}

/// A short description of a JSON value for error messages.
pub(super) fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {:?}", truncate(s)),
        Value::Array(_) => truncate(&value.to_string()).into_owned(),
        Value::Object(_) => "an object".to_string(),
    }
}

/// What a JSON element must be for `dtype`.
fn expected(dtype: DataType) -> String {
    use DataType::*;
    let range = |min: i128, max: i128| format!("an integer in [{min}, {max}]");
    match dtype {
        Bool => "a boolean".to_string(),
        U8 => range(0, u8::MAX.into()),
        U16 => range(0, u16::MAX.into()),
        U32 => range(0, u32::MAX.into()),
        U64 => range(0, u64::MAX.into()),
        I8 => range(i8::MIN.into(), i8::MAX.into()),
        I16 => range(i16::MIN.into(), i16::MAX.into()),
        I32 => range(i32::MIN.into(), i32::MAX.into()),
        I64 => range(i64::MIN.into(), i64::MAX.into()),
        F16 | Bf16 | F32 | F64 => r#"a number in range (or "NaN", "Infinity", "-Infinity")"#.to_string(),
        Bytes => "a string".to_string(),
    }
}

/// An integer element: JSON numbers written as integers only (`1.0` is refused, as
/// Triton does).
fn int<T: TryFrom<i128>>(scalar: &Scalar<'_>) -> Result<T, ()> {
    let wide = match *scalar {
        Scalar::U(u) => i128::from(u),
        Scalar::I(i) => i128::from(i),
        _ => return Err(()),
    };
    T::try_from(wide).map_err(|_| ())
}

/// A floating-point element: any JSON number, or the strings the encoder writes for
/// non-finite values.
fn float(scalar: &Scalar<'_>) -> Result<f64, ()> {
    match scalar {
        Scalar::U(u) => Ok(*u as f64),
        Scalar::I(i) => Ok(*i as f64),
        Scalar::F(f) => Ok(*f),
        Scalar::Str(s) => match s.as_ref() {
            "NaN" => Ok(f64::NAN),
            "Infinity" => Ok(f64::INFINITY),
            "-Infinity" => Ok(f64::NEG_INFINITY),
            _ => Err(()),
        },
        _ => Err(()),
    }
}

/// Narrows `wide` to a float type, refusing finite values that would overflow.
fn narrow<T>(wide: f64, convert: impl Fn(f64) -> T, is_finite: impl Fn(&T) -> bool) -> Result<T, ()> {
    let narrow = convert(wide);
    if wide.is_finite() && !is_finite(&narrow) {
        return Err(());
    }
    Ok(narrow)
}

/// Appends `scalar` to `buf` in `dtype`'s binary layout.
fn encode_scalar(dtype: DataType, scalar: &Scalar<'_>, buf: &mut Vec<u8>) -> Result<(), ()> {
    use DataType::*;
    match dtype {
        Bool => match scalar {
            Scalar::Bool(b) => buf.push(u8::from(*b)),
            _ => return Err(()),
        },
        U8 => buf.push(int::<u8>(scalar)?),
        U16 => buf.extend_from_slice(&int::<u16>(scalar)?.to_le_bytes()),
        U32 => buf.extend_from_slice(&int::<u32>(scalar)?.to_le_bytes()),
        U64 => buf.extend_from_slice(&int::<u64>(scalar)?.to_le_bytes()),
        I8 => buf.extend_from_slice(&int::<i8>(scalar)?.to_le_bytes()),
        I16 => buf.extend_from_slice(&int::<i16>(scalar)?.to_le_bytes()),
        I32 => buf.extend_from_slice(&int::<i32>(scalar)?.to_le_bytes()),
        I64 => buf.extend_from_slice(&int::<i64>(scalar)?.to_le_bytes()),
        F16 => {
            let v = narrow(float(scalar)?, half::f16::from_f64, |h| h.is_finite())?;
            buf.extend_from_slice(&v.to_le_bytes());
        }
        Bf16 => {
            let v = narrow(float(scalar)?, half::bf16::from_f64, |h| h.is_finite())?;
            buf.extend_from_slice(&v.to_le_bytes());
        }
        F32 => {
            let v = narrow(float(scalar)?, |f| f as f32, |f| f.is_finite())?;
            buf.extend_from_slice(&v.to_le_bytes());
        }
        F64 => buf.extend_from_slice(&float(scalar)?.to_le_bytes()),
        Bytes => match scalar {
            Scalar::Str(s) => {
                let len = u32::try_from(s.len()).map_err(|_| ())?;
                buf.extend_from_slice(&len.to_le_bytes());
                buf.extend_from_slice(s.as_bytes());
            }
            _ => return Err(()),
        },
    }
    Ok(())
}

// ---- deserialisation of `$request_input` -------------------------------------------

enum InputField {
    Name,
    Shape,
    Datatype,
    Parameters,
    Data,
    Other,
}

impl<'de> Deserialize<'de> for InputField {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FieldVisitor;
        impl Visitor<'_> for FieldVisitor {
            type Value = InputField;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<InputField, E> {
                Ok(match v {
                    "name" => InputField::Name,
                    "shape" => InputField::Shape,
                    "datatype" => InputField::Datatype,
                    "parameters" => InputField::Parameters,
                    "data" => InputField::Data,
                    _ => InputField::Other,
                })
            }
        }
        deserializer.deserialize_identifier(FieldVisitor)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for RawInput<'a> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(InputVisitor(std::marker::PhantomData))
    }
}

struct InputVisitor<'a>(std::marker::PhantomData<&'a ()>);

fn set_once<'de, A: MapAccess<'de>>(
    slot: &mut Option<Value>,
    map: &mut A,
    field: &'static str,
) -> Result<(), A::Error> {
    if slot.is_some() {
        return Err(de::Error::duplicate_field(field));
    }
    *slot = Some(map.next_value()?);
    Ok(())
}

impl<'de: 'a, 'a> Visitor<'de> for InputVisitor<'a> {
    type Value = RawInput<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an input tensor object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawInput<'a>, A::Error> {
        let mut input = RawInput::default();
        while let Some(field) = map.next_key::<InputField>()? {
            match field {
                InputField::Name => set_once(&mut input.name, &mut map, "name")?,
                InputField::Shape => set_once(&mut input.shape, &mut map, "shape")?,
                InputField::Datatype => set_once(&mut input.datatype, &mut map, "datatype")?,
                InputField::Parameters => set_once(&mut input.parameters, &mut map, "parameters")?,
                InputField::Data => {
                    if input.data.is_some() {
                        return Err(de::Error::duplicate_field("data"));
                    }
                    input.data = Some(match input.dtype() {
                        Some(dtype) => {
                            let reserve = input.reserve(dtype);
                            Data::Parsed(map.next_value_seed(DataSeed { dtype, reserve })?)
                        }
                        None => Data::Unparsed(map.next_value::<&'a RawValue>()?),
                    });
                }
                InputField::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(input)
    }
}

impl RawInput<'_> {
    /// The datatype, if it has been seen and is one.
    pub fn dtype(&self) -> Option<DataType> {
        match &self.datatype {
            Some(Value::String(s)) => s.parse().ok(),
            _ => None,
        }
    }

    /// Bytes to reserve for this input's elements as `dtype`, from its shape.
    pub fn reserve(&self, dtype: DataType) -> usize {
        match (dtype.size(), &self.shape) {
            (Some(size), Some(Value::Array(dims))) => byte_len(size, dims),
            _ => 0,
        }
    }
}

/// Most bytes reserved for an input's elements before they are counted: a bogus shape
/// must not make us allocate much before the element count is checked.
const RESERVE_CAP: usize = 1 << 20;

/// Bytes to reserve for fixed-size data of `dims` (as declared, so capped).
fn byte_len(size: usize, dims: &[Value]) -> usize {
    dims.iter()
        .try_fold(size, |acc, dim| {
            acc.checked_mul(usize::try_from(dim.as_u64()?).ok()?)
        })
        .map_or(0, |len| len.min(RESERVE_CAP))
}

/// Deserialises an input's `data` field into a [`Collected`].
struct DataSeed {
    dtype: DataType,
    /// Capacity to reserve for converted elements.
    reserve: usize,
}

impl<'de> DeserializeSeed<'de> for DataSeed {
    type Value = Collected;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Collected, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for DataSeed {
    type Value = Collected;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tensor data")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Collected, A::Error> {
        let mut typed = Typed::new(self.dtype);
        typed.buf.reserve(self.reserve);
        while seq.next_element_seed(ElementSeed(&mut typed))?.is_some() {}
        Ok(Collected::Array(typed))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Collected, E> {
        Ok(Collected::NotArray("a boolean"))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Collected, E> {
        Ok(Collected::NotArray("a number"))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Collected, E> {
        Ok(Collected::NotArray("a number"))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Collected, E> {
        Ok(Collected::NotArray("a number"))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Collected, E> {
        Ok(Collected::NotArray("a string"))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Collected, E> {
        Ok(Collected::NotArray("null"))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Collected, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Collected::NotArray("an object"))
    }
}

/// Deserialises one element of a `data` array (flattening nested arrays) into its
/// typed buffer.
struct ElementSeed<'s>(&'s mut Typed);

impl<'de> DeserializeSeed<'de> for ElementSeed<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ElementSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a tensor element")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let sink = self.0;
        while seq.next_element_seed(ElementSeed(&mut *sink))?.is_some() {}
        Ok(())
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.0.push(&Scalar::Bool(v));
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.0.push(&Scalar::I(v));
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.0.push(&Scalar::U(v));
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.0.push(&Scalar::F(v));
        Ok(())
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.0.push(&Scalar::Str(Cow::Borrowed(v)));
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.0.push(&Scalar::Other("null"));
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        self.0.push(&Scalar::Other("an object"));
        Ok(())
    }
}

// ---- response writing ---------------------------------------------------------------

/// Writes `s` as an escaped JSON string.
pub(super) fn write_str(buf: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(&mut *buf, s).expect(VEC_WRITE);
}

/// Writes an integer.
pub(super) fn write_i64(buf: &mut Vec<u8>, v: i64) {
    CompactFormatter.write_i64(buf, v).expect(VEC_WRITE);
}

/// Writes a float; non-finite values (which JSON cannot hold) as the strings `"NaN"`,
/// `"Infinity"` and `"-Infinity"`, which the decoder accepts back.
fn write_float(buf: &mut Vec<u8>, v: f64, single: bool) {
    if v.is_nan() {
        buf.extend_from_slice(b"\"NaN\"");
    } else if v.is_infinite() {
        buf.extend_from_slice(if v > 0.0 {
            b"\"Infinity\""
        } else {
            b"\"-Infinity\""
        });
    } else if single {
        // Shortest representation that reads back as the same f32.
        CompactFormatter.write_f32(buf, v as f32).expect(VEC_WRITE);
    } else {
        CompactFormatter.write_f64(buf, v).expect(VEC_WRITE);
    }
}

/// Writes each `N`-byte element of `data`, comma separated.
fn write_elements<const N: usize>(
    buf: &mut Vec<u8>,
    data: &[u8],
    mut write: impl FnMut(&mut Vec<u8>, [u8; N]),
) {
    for (i, chunk) in data.chunks_exact(N).enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        write(buf, chunk.try_into().expect("chunks_exact yields N bytes"));
    }
}

/// Writes a tensor's elements as a flat JSON array. BYTES elements must be UTF-8 (the
/// caller sends tensors with other BYTES elements as binary).
pub(super) fn write_data(buf: &mut Vec<u8>, tensor: &Tensor) {
    use DataType::*;
    let data = tensor.data();
    let mut f = CompactFormatter;
    buf.push(b'[');
    match tensor.dtype() {
        Bool => write_elements::<1>(buf, data, |b, [v]| f.write_bool(b, v != 0).expect(VEC_WRITE)),
        U8 => write_elements::<1>(buf, data, |b, [v]| f.write_u8(b, v).expect(VEC_WRITE)),
        U16 => write_elements::<2>(buf, data, |b, c| {
            f.write_u16(b, u16::from_le_bytes(c)).expect(VEC_WRITE)
        }),
        U32 => write_elements::<4>(buf, data, |b, c| {
            f.write_u32(b, u32::from_le_bytes(c)).expect(VEC_WRITE)
        }),
        U64 => write_elements::<8>(buf, data, |b, c| {
            f.write_u64(b, u64::from_le_bytes(c)).expect(VEC_WRITE)
        }),
        I8 => write_elements::<1>(buf, data, |b, c| {
            f.write_i8(b, i8::from_le_bytes(c)).expect(VEC_WRITE)
        }),
        I16 => write_elements::<2>(buf, data, |b, c| {
            f.write_i16(b, i16::from_le_bytes(c)).expect(VEC_WRITE)
        }),
        I32 => write_elements::<4>(buf, data, |b, c| {
            f.write_i32(b, i32::from_le_bytes(c)).expect(VEC_WRITE)
        }),
        I64 => write_elements::<8>(buf, data, |b, c| {
            f.write_i64(b, i64::from_le_bytes(c)).expect(VEC_WRITE)
        }),
        F16 => write_elements::<2>(buf, data, |b, c| {
            write_float(b, half::f16::from_le_bytes(c).to_f64(), true)
        }),
        Bf16 => write_elements::<2>(buf, data, |b, c| {
            write_float(b, half::bf16::from_le_bytes(c).to_f64(), true)
        }),
        F32 => write_elements::<4>(buf, data, |b, c| {
            write_float(b, f32::from_le_bytes(c).into(), true)
        }),
        F64 => write_elements::<8>(buf, data, |b, c| write_float(b, f64::from_le_bytes(c), false)),
        Bytes => {
            for (i, element) in bytes_iter(data).enumerate() {
                if i > 0 {
                    buf.push(b',');
                }
                let s = std::str::from_utf8(element).expect("caller checked BYTES are UTF-8");
                write_str(buf, s);
            }
        }
    }
    buf.push(b']');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(dtype: DataType, scalar: Scalar<'_>) -> Option<Vec<u8>> {
        let mut buf = Vec::new();
        encode_scalar(dtype, &scalar, &mut buf).ok().map(|()| buf)
    }

    #[test]
    fn integer_ranges_are_enforced() {
        assert_eq!(encode(DataType::U8, Scalar::U(255)), Some(vec![255]));
        assert_eq!(encode(DataType::U8, Scalar::U(256)), None);
        assert_eq!(encode(DataType::U64, Scalar::I(-1)), None);
        assert_eq!(encode(DataType::U64, Scalar::U(u64::MAX)), Some(vec![255; 8]));
        assert_eq!(encode(DataType::I8, Scalar::I(-128)), Some(vec![0x80]));
        assert_eq!(encode(DataType::I8, Scalar::I(-129)), None);
        assert_eq!(encode(DataType::I64, Scalar::U(u64::MAX)), None);
        assert_eq!(encode(DataType::I32, Scalar::F(1.0)), None);
        assert_eq!(encode(DataType::I32, Scalar::Bool(true)), None);
    }

    #[test]
    fn floats_accept_numbers_and_non_finite_names() {
        assert_eq!(
            encode(DataType::F32, Scalar::U(3)),
            Some(3f32.to_le_bytes().to_vec())
        );
        assert_eq!(
            encode(DataType::F32, Scalar::I(-3)),
            Some((-3f32).to_le_bytes().to_vec())
        );
        assert_eq!(
            encode(DataType::F32, Scalar::Str("-Infinity".into())),
            Some(f32::NEG_INFINITY.to_le_bytes().to_vec())
        );
        assert_eq!(encode(DataType::F32, Scalar::F(1e39)), None, "overflows FP32");
        assert_eq!(encode(DataType::F16, Scalar::F(1e5)), None, "overflows FP16");
        assert!(encode(DataType::Bf16, Scalar::F(1e5)).is_some(), "fits BF16");
        assert_eq!(encode(DataType::F64, Scalar::Str("nan".into())), None);
        assert_eq!(encode(DataType::F64, Scalar::Other("null")), None);
    }

    #[test]
    fn reservation_follows_the_shape_but_is_capped() {
        let dims = |v: Value| v.as_array().unwrap().clone();
        assert_eq!(byte_len(4, &dims(serde_json::json!([2, 3]))), 24);
        assert_eq!(byte_len(4, &dims(serde_json::json!([]))), 4);
        assert_eq!(byte_len(4, &dims(serde_json::json!([-1, 3]))), 0);
        assert_eq!(byte_len(8, &dims(serde_json::json!([1.5]))), 0);
        assert_eq!(byte_len(8, &dims(serde_json::json!([u64::MAX, 2]))), 0);
        assert_eq!(byte_len(8, &dims(serde_json::json!([1_000_000_000]))), 1 << 20);
    }

    #[test]
    fn descriptions_are_short_and_typed() {
        assert_eq!(Scalar::F(1.0).describe(), "number 1.0");
        assert_eq!(Scalar::Bool(true).describe(), "boolean true");
        let long = "x".repeat(100);
        assert_eq!(
            Scalar::Str(long.as_str().into()).describe().chars().count(),
            40 + 1 + 9
        );
        assert_eq!(expected(DataType::U8), "an integer in [0, 255]");
    }
}
