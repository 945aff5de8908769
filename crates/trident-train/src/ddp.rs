//! Data parallelism (DP-1): the pieces the trainer uses when it is one rank of several.
//!
//! Each rank holds a full replica and trains on its part of every global batch
//! ([`trident_data::DataLoader::sharded`]). Its micro-batch loss is scaled by the part's
//! share of the global batch, so after the gradients are summed across ranks every rank
//! holds the gradient of the global batch's mean loss — what one process with the whole
//! batch would compute — and the same optimizer step keeps the replicas identical.
//!
//! Gradients are summed in buckets of about [`DataParallel::bucket_mb`] MiB (PyTorch's
//! DDP uses 25 MB): consecutive parameters are packed into one buffer per collective, so
//! small tensors do not each pay a collective's latency. candle's backward pass returns
//! all gradients at once, so the exchange runs right after it, not overlapped with it.

use candle_core::Result;
use std::ops::Range;
use std::sync::Arc;
use trident_dist::{check_same, Communicator, ReduceOp};
use trident_nn::{Param, Params};

/// One rank's view of a data-parallel run.
#[derive(Clone)]
pub struct DataParallel {
    /// The group.
    pub comm: Arc<dyn Communicator>,
    /// Gradient bucket size in MiB.
    pub bucket_mb: f64,
}

impl std::fmt::Debug for DataParallel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DataParallel(rank {} of {}, {}, buckets {} MiB)",
            self.comm.rank(),
            self.comm.world_size(),
            self.comm.backend(),
            self.bucket_mb
        )
    }
}

fn dist_err(e: trident_dist::DistError) -> candle_core::Error {
    candle_core::Error::Msg(e.to_string())
}

/// Consecutive parameter groups of at most `bytes` (a larger parameter is a bucket alone).
pub fn buckets(sizes: &[usize], bytes: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut held) = (0, 0usize);
    for (i, &n) in sizes.iter().enumerate() {
        let b = 4 * n;
        if i > start && held + b > bytes {
            out.push(start..i);
            start = i;
            held = 0;
        }
        held += b;
    }
    if start < sizes.len() {
        out.push(start..sizes.len());
    }
    out
}

impl DataParallel {
    /// This rank.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Ranks in the group.
    pub fn world(&self) -> usize {
        self.comm.world_size()
    }

    /// Sums every rank's gradients into each rank's `grads`, bucket by bucket; `flat` is
    /// the reusable packing buffer.
    pub fn all_reduce_grads(&self, grads: &mut [Vec<f32>], flat: &mut Vec<f32>) -> Result<()> {
        let sizes: Vec<usize> = grads.iter().map(Vec::len).collect();
        let bytes = (self.bucket_mb * (1 << 20) as f64) as usize;
        for b in buckets(&sizes, bytes.max(4)) {
            if b.len() == 1 {
                self.comm
                    .all_reduce((&mut grads[b.start][..]).into(), ReduceOp::Sum)
                    .map_err(dist_err)?;
                continue;
            }
            flat.clear();
            for g in &grads[b.clone()] {
                flat.extend_from_slice(g);
            }
            self.comm
                .all_reduce((&mut flat[..]).into(), ReduceOp::Sum)
                .map_err(dist_err)?;
            let mut at = 0;
            for g in &mut grads[b] {
                let n = g.len();
                g.copy_from_slice(&flat[at..at + n]);
                at += n;
            }
        }
        Ok(())
    }

    /// Sums small per-step figures (losses, counts, flags) across ranks.
    pub fn sum(&self, values: &mut [f32]) -> Result<()> {
        self.comm
            .all_reduce(values.into(), ReduceOp::Sum)
            .map_err(dist_err)
    }

    /// Makes every rank's parameters and buffers (all f32 tensors) rank 0's.
    pub fn broadcast_params(&self, params: &Params) -> Result<()> {
        for p in params.all() {
            if p.var.dtype() != candle_core::DType::F32 {
                continue;
            }
            let mut v = p.var.as_tensor().flatten_all()?.to_vec1::<f32>()?;
            self.comm.broadcast((&mut v[..]).into(), 0).map_err(dist_err)?;
            trident_nn::ops::update_f32(p.var.as_tensor(), |w| w.copy_from_slice(&v))?;
        }
        Ok(())
    }

    /// Fails, naming the ranks, unless every rank passes the same `what` hash.
    pub fn check_same(&self, what: &str, value: u64) -> Result<()> {
        check_same(self.comm.as_ref(), what, value).map_err(dist_err)
    }

    /// Fails unless every replica's weights are bit-identical (checked before each
    /// checkpoint: replicas that drifted apart would make the checkpoint a lie).
    pub fn check_replicas(&self, params: &Params) -> Result<()> {
        self.check_same("the replicas' weights (checksum)", checksum(&params.all())?)
    }
}

/// FNV-1a over names, shapes and the bits of every f32 value.
pub fn checksum(params: &[Param]) -> Result<u64> {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    };
    for p in params {
        eat(p.name.as_bytes());
        for d in p.var.dims() {
            eat(&d.to_le_bytes());
        }
        if p.var.dtype() == candle_core::DType::F32 {
            for v in p.var.as_tensor().flatten_all()?.to_vec1::<f32>()? {
                eat(&v.to_le_bytes());
            }
        }
    }
    Ok(h)
}

/// FNV-1a over parameter names, shapes and trainability: equal on every rank of a
/// correctly started run.
pub fn shapes_hash(params: &Params) -> u64 {
    let text: String = params
        .all()
        .iter()
        .map(|p| format!("{}{:?}{};", p.name, p.var.dims(), p.trainable))
        .collect();
    trident_nn::params::name_hash(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_pack_consecutive_parameters_up_to_the_size() {
        // 4 bytes a value; 40-byte buckets.
        assert_eq!(buckets(&[3, 4, 2, 20, 1, 1], 40), [0..3, 3..4, 4..6]);
        assert_eq!(buckets(&[3, 4, 4], 40), [0..2, 2..3]);
        assert_eq!(buckets(&[], 40), Vec::<Range<usize>>::new());
        assert_eq!(buckets(&[100], 4), vec![Range { start: 0, end: 1 }]);
    }
}
