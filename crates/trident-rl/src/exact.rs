//! Floats in checkpoints as their bit patterns: JSON's decimal floats do not always parse
//! back to the same bits (serde_json's fast parser can miss by an ulp), and an exact resume
//! needs the same bits.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One f64.
pub mod f64_bits {
    use super::*;
    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        v.to_bits().serialize(s)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(f64::from_bits(u64::deserialize(d)?))
    }
}

/// A vector of f64.
pub mod vec_f64 {
    use super::*;
    pub fn serialize<S: Serializer>(v: &[f64], s: S) -> Result<S::Ok, S::Error> {
        v.iter().map(|x| x.to_bits()).collect::<Vec<_>>().serialize(s)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
        Ok(Vec::<u64>::deserialize(d)?
            .into_iter()
            .map(f64::from_bits)
            .collect())
    }
}

/// A vector of f32.
pub mod vec_f32 {
    use super::*;
    pub fn serialize<S: Serializer>(v: &[f32], s: S) -> Result<S::Ok, S::Error> {
        v.iter().map(|x| x.to_bits()).collect::<Vec<_>>().serialize(s)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f32>, D::Error> {
        Ok(Vec::<u32>::deserialize(d)?
            .into_iter()
            .map(f32::from_bits)
            .collect())
    }
}

/// An optional array of f64 (an environment's state).
pub mod opt_f64s {
    use super::*;
    pub fn serialize<S: Serializer, const N: usize>(v: &Option<[f64; N]>, s: S) -> Result<S::Ok, S::Error> {
        v.map(|a| a.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
            .serialize(s)
    }
    pub fn deserialize<'de, D: Deserializer<'de>, const N: usize>(
        d: D,
    ) -> Result<Option<[f64; N]>, D::Error> {
        let Some(bits) = Option::<Vec<u64>>::deserialize(d)? else {
            return Ok(None);
        };
        let n = bits.len();
        let a: [u64; N] = bits
            .try_into()
            .map_err(|_| serde::de::Error::custom(format!("{n} values where {N} were expected")))?;
        Ok(Some(a.map(f64::from_bits)))
    }
}
