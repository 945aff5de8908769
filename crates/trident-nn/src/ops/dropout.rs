//! Seeded dropout, and the per-element mask fused kernels share with it.

use crate::kernel::for_rows;
use candle_core::{bail, Result, Tensor};

/// Inverted dropout with a mask drawn from `seed` (one draw per element): the same seed
/// gives the same mask, so a resumed run drops exactly what an uninterrupted one would.
pub fn dropout(x: &Tensor, p: f32, seed: u64) -> Result<Tensor> {
    if p <= 0.0 {
        return Ok(x.clone());
    }
    if p >= 1.0 {
        return x.zeros_like();
    }
    let Some(m) = DropMask::new("dropout", p, seed)? else {
        return Ok(x.clone());
    };
    let mut mask = vec![0f32; x.elem_count()];
    for_rows(&mut mask, 4096, |c, block| {
        block
            .iter_mut()
            .enumerate()
            .for_each(|(j, v)| *v = m.scale(c * 4096 + j))
    });
    let mask = Tensor::from_vec(mask, x.shape(), x.device())?;
    x * mask
}

/// A dropout mask drawn per element from a seed (one SplitMix64 draw per element index),
/// so fused kernels (attention, add + layer norm) drop exactly what [`dropout`] drops on a
/// tensor of the same shape, and can draw the mask again in their backward pass instead
/// of storing it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DropMask {
    /// 1 / (1 - p): the scale of kept elements.
    keep: f32,
    /// Draws (upper 32 bits) below this are dropped.
    threshold: u64,
    seed: u64,
}

impl DropMask {
    /// The mask for probability `p` (None when `p` is 0); `p` outside [0, 1) is an error
    /// naming `what`.
    pub(crate) fn new(what: &str, p: f32, seed: u64) -> Result<Option<Self>> {
        if !(0.0..1.0).contains(&p) {
            bail!("{what}: dropout {p} is outside [0, 1)")
        }
        Ok((p > 0.0).then(|| DropMask {
            keep: 1.0 / (1.0 - p),
            threshold: (p as f64 * (1u64 << 32) as f64) as u64,
            seed,
        }))
    }

    /// [`new`](Self::new) for an optional (p, seed).
    pub(crate) fn from_option(what: &str, dropout: Option<(f32, u64)>) -> Result<Option<Self>> {
        match dropout {
            Some((p, seed)) => Self::new(what, p, seed),
            None => Ok(None),
        }
    }

    /// The multiplier of element `index`: 1 / (1 - p) if kept, else 0.
    #[inline]
    pub(crate) fn scale(&self, index: usize) -> f32 {
        let draw = splitmix(self.seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)) >> 32;
        if draw >= self.threshold {
            self.keep
        } else {
            0.0
        }
    }
}

/// A strong 64-bit mix of a counter: the first output of trident-data's SplitMix64
/// seeded with it (the generator the data order and augmentation use).
pub fn splitmix(z: u64) -> u64 {
    trident_data::rng::SplitMix64::new(z).next_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    use candle_core::Device;

    #[test]
    fn dropout_is_reproducible_and_scaled() {
        let x = Tensor::ones(10_000, candle_core::DType::F32, &Device::Cpu).unwrap();
        let a = dropout(&x, 0.25, 42).unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(a, dropout(&x, 0.25, 42).unwrap().to_vec1::<f32>().unwrap());
        assert_ne!(a, dropout(&x, 0.25, 43).unwrap().to_vec1::<f32>().unwrap());
        let dropped = a.iter().filter(|&&v| v == 0.0).count() as f32 / 10_000.0;
        assert!((dropped - 0.25).abs() < 0.02, "dropped {dropped}");
        assert!(a.iter().all(|&v| v == 0.0 || (v - 4.0 / 3.0).abs() < 1e-6));
    }
}
