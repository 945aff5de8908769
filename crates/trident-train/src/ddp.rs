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

use crate::error::TrainError;
use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
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
    /// ZeRO stage 1: shard the optimizer state ([`Zero1`]).
    pub zero: bool,
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

/// Collectives and tensor reads fail alike as a [`TrainError`].
type Result<T> = std::result::Result<T, TrainError>;

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
                    .all_reduce((&mut grads[b.start][..]).into(), ReduceOp::Sum)?;
                continue;
            }
            flat.clear();
            for g in &grads[b.clone()] {
                flat.extend_from_slice(g);
            }
            self.comm.all_reduce((&mut flat[..]).into(), ReduceOp::Sum)?;
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
        Ok(self.comm.all_reduce(values.into(), ReduceOp::Sum)?)
    }

    /// Makes every rank's parameters and buffers (all f32 tensors) rank 0's.
    pub fn broadcast_params(&self, params: &Params) -> Result<()> {
        for p in params.all() {
            if p.var.dtype() != candle_core::DType::F32 {
                continue;
            }
            let mut v = p.var.as_tensor().flatten_all()?.to_vec1::<f32>()?;
            self.comm.broadcast((&mut v[..]).into(), 0)?;
            trident_nn::ops::update_f32(p.var.as_tensor(), |w| w.copy_from_slice(&v))?;
        }
        Ok(())
    }

    /// Gives every replica rank 0's non-trainable tensors (batch norm's running statistics,
    /// frozen weights), packed into one broadcast. Each replica normalises over its own part
    /// of the batch (no SyncBatchNorm), so their running statistics drift apart; this runs
    /// before evaluation and before each checkpoint.
    pub fn broadcast_buffers(&self, params: &Params) -> Result<()> {
        let bufs: Vec<Param> = params
            .all()
            .into_iter()
            .filter(|p| !p.trainable && p.var.dtype() == candle_core::DType::F32)
            .collect();
        if bufs.is_empty() {
            return Ok(());
        }
        let mut flat = Vec::new();
        for p in &bufs {
            flat.extend(p.var.as_tensor().flatten_all()?.to_vec1::<f32>()?);
        }
        self.comm.broadcast((&mut flat[..]).into(), 0)?;
        let mut at = 0;
        for p in &bufs {
            let n = p.var.elem_count();
            trident_nn::ops::update_f32(p.var.as_tensor(), |w| w.copy_from_slice(&flat[at..at + n]))?;
            at += n;
        }
        Ok(())
    }

    /// Fails, naming the ranks, unless every rank passes the same `what` hash.
    pub fn check_same(&self, what: &str, value: u64) -> Result<()> {
        Ok(check_same(self.comm.as_ref(), what, value)?)
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

/// One gradient bucket under ZeRO-1: consecutive parameters, and this rank's part of them.
#[derive(Debug, Clone)]
struct ZeroBucket {
    /// Parameter indices.
    params: Range<usize>,
    /// Where the bucket starts in the flattened parameters.
    start: usize,
    /// Values in the bucket.
    len: usize,
    /// This rank's part, within the bucket.
    mine: Range<usize>,
}

/// ZeRO stage 1 (DP-2): the optimizer state is sharded across the ranks.
///
/// The trainable parameters, flattened in order, are cut into the gradient buckets; each
/// bucket is split among the ranks by [`trident_dist::shard_range`]. A step reduce-scatters
/// each bucket's gradients (each rank receives the sum of its part only), clips by the
/// global norm (one scalar all-reduce), runs the fused AdamW or SGD pass on its part with
/// its part of the moments, and all-gathers the updated part of each bucket back into
/// every replica. The update is element-wise, so this gives the same weights as unsharded
/// data parallelism, with 1/N of the optimizer state on each rank.
#[derive(Debug)]
pub struct Zero1 {
    config: OptimizerConfig,
    buckets: Vec<ZeroBucket>,
    /// Flattened start of each parameter (and the total at the end).
    offsets: Vec<usize>,
    names: Vec<String>,
    /// This rank's moments (AdamW: m and v; SGD with momentum: m).
    m: Vec<f32>,
    v: Vec<f32>,
    /// This rank's part of one bucket (gradients, then weights).
    part: Vec<f32>,
    /// One bucket's packing buffer.
    flat: Vec<f32>,
}

use crate::optim::OptimizerConfig;

impl Zero1 {
    /// Plans the shards of `params` (the trainable ones, in the optimizer's order) for
    /// this rank of `dp`. The fused AdamW, SGD and RMSprop shard.
    pub fn new(params: &[Param], dp: &DataParallel, config: &OptimizerConfig) -> Result<Self> {
        if matches!(config, OptimizerConfig::Adamw { fused: false, .. }) {
            return Err(TrainError::Invalid(
                "ZeRO-1 shards the fused AdamW (or SGD); remove `fused = false`".into(),
            ));
        }
        let sizes: Vec<usize> = params.iter().map(|p| p.var.elem_count()).collect();
        let mut offsets = vec![0];
        for n in &sizes {
            offsets.push(offsets.last().unwrap() + n);
        }
        let bytes = (dp.bucket_mb * (1 << 20) as f64) as usize;
        let (rank, world) = (dp.rank(), dp.world());
        let buckets: Vec<ZeroBucket> = buckets(&sizes, bytes.max(4))
            .into_iter()
            .map(|b| {
                let (start, end) = (offsets[b.start], offsets[b.end]);
                let len = end - start;
                ZeroBucket {
                    params: b,
                    start,
                    len,
                    mine: trident_dist::shard_range(len, world, rank),
                }
            })
            .collect();
        let shard: usize = buckets.iter().map(|b| b.mine.len()).sum();
        let (m, v) = match config {
            OptimizerConfig::Adamw { .. } => (vec![0.0; shard], vec![0.0; shard]),
            OptimizerConfig::Sgd { momentum, .. } if *momentum > 0.0 => (vec![0.0; shard], Vec::new()),
            OptimizerConfig::Sgd { .. } => (Vec::new(), Vec::new()),
            OptimizerConfig::Rmsprop { momentum, .. } if *momentum > 0.0 => {
                (vec![0.0; shard], vec![0.0; shard])
            }
            OptimizerConfig::Rmsprop { .. } => (Vec::new(), vec![0.0; shard]),
        };
        Ok(Zero1 {
            config: config.clone(),
            buckets,
            offsets,
            names: params.iter().map(|p| p.name.clone()).collect(),
            m,
            v,
            part: Vec::new(),
            flat: Vec::new(),
        })
    }

    /// Values of the flattened parameters this rank updates.
    pub fn shard_len(&self) -> usize {
        self.buckets.iter().map(|b| b.mine.len()).sum()
    }

    /// All trainable values.
    pub fn total_len(&self) -> usize {
        *self.offsets.last().unwrap()
    }

    /// Bytes of optimizer state this rank holds.
    pub fn state_bytes(&self) -> usize {
        4 * (self.m.len() + self.v.len())
    }

    /// Bytes of optimizer state one unsharded replica holds.
    pub fn unsharded_state_bytes(&self) -> usize {
        let moments = usize::from(!self.m.is_empty()) + usize::from(!self.v.is_empty());
        4 * moments * self.total_len()
    }

    /// This rank's parts as ranges of the flattened parameters, in storage order.
    pub fn ranges(&self) -> Vec<Range<usize>> {
        self.buckets
            .iter()
            .map(|b| b.start + b.mine.start..b.start + b.mine.end)
            .collect()
    }

    /// Sums the ranks' gradients `acc` (one per parameter) and leaves the sums of this
    /// rank's part in place in `acc` (the rest of `acc` is stale from here on).
    pub fn reduce_scatter(&mut self, dp: &DataParallel, acc: &mut [Vec<f32>]) -> Result<()> {
        for b in &self.buckets {
            self.part.resize(b.mine.len(), 0.0);
            if b.params.len() == 1 {
                let g = &acc[b.params.start];
                dp.comm
                    .reduce_scatter((&g[..]).into(), (&mut self.part[..]).into(), ReduceOp::Sum)?;
            } else {
                self.flat.clear();
                for g in &acc[b.params.clone()] {
                    self.flat.extend_from_slice(g);
                }
                dp.comm.reduce_scatter(
                    (&self.flat[..]).into(),
                    (&mut self.part[..]).into(),
                    ReduceOp::Sum,
                )?;
            }
            let global = b.start + b.mine.start..b.start + b.mine.end;
            let part = &self.part;
            Self::pieces(&self.offsets, b, global, |p, src, dst| {
                acc[p][src].copy_from_slice(&part[dst]);
            });
        }
        Ok(())
    }

    /// Calls `f(parameter index, range within it)` for each piece of the gradients that
    /// belongs to this rank's part.
    fn each_mine(&self, mut f: impl FnMut(usize, Range<usize>)) {
        for b in &self.buckets {
            let global = b.start + b.mine.start..b.start + b.mine.end;
            Self::pieces(&self.offsets, b, global, |p, src, _| f(p, src));
        }
    }

    /// Multiplies this rank's part of the gradients by `c` (gradient accumulation's mean).
    pub fn scale(&self, acc: &mut [Vec<f32>], c: f32) {
        self.each_mine(|p, r| crate::optim::scale(&mut acc[p][r], c));
    }

    /// The global gradient norm over every rank's part and the factor that clips it to
    /// `max_norm`, as [`crate::optim::clip_coefficient`] gives them for whole gradients;
    /// [`step`](Self::step) applies the factor.
    pub fn clip_coefficient(&self, dp: &DataParallel, acc: &[Vec<f32>], max_norm: f64) -> Result<(f64, f32)> {
        let mut local = 0f64;
        self.each_mine(|p, r| local += crate::optim::sum_squares(&acc[p][r]));
        // f64 through an f32 collective: high and low parts.
        let hi = local as f32;
        let mut parts = [hi, (local - hi as f64) as f32];
        dp.sum(&mut parts)?;
        let norm = (parts[0] as f64 + parts[1] as f64).sqrt();
        Ok((norm, crate::optim::clip_factor(norm, max_norm)))
    }

    /// Calls `f(param index, range within the parameter, range within `part`)` for each
    /// parameter piece of flattened range `global`.
    fn pieces(
        offsets: &[usize],
        b: &ZeroBucket,
        global: Range<usize>,
        mut f: impl FnMut(usize, Range<usize>, Range<usize>),
    ) {
        for p in b.params.clone() {
            let (ps, pe) = (offsets[p], offsets[p + 1]);
            let (s, e) = (global.start.max(ps), global.end.min(pe));
            if s < e {
                f(p, s - ps..e - ps, s - global.start..e - global.start);
            }
        }
    }

    /// Optimizer step `t` (1-based) at `lr`: this rank updates its part of the weights in
    /// place from its part of `acc` times `scale` (clipping's coefficient) and its moments,
    /// then every replica receives every updated part, bucket by bucket.
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &mut self,
        dp: &DataParallel,
        params: &[Param],
        acc: &[Vec<f32>],
        lr: f64,
        t: u64,
        scale: f32,
    ) -> Result<()> {
        let mut at = 0;
        for b in &self.buckets {
            let global = b.start + b.mine.start..b.start + b.mine.end;
            self.part.resize(b.mine.len(), 0.0);
            let (m, v, part, config) = (&mut self.m, &mut self.v, &mut self.part, &self.config);
            let mut err = Ok(());
            Self::pieces(&self.offsets, b, global, |p, src, dst| {
                if err.is_err() {
                    return;
                }
                let (g, at) = (&acc[p][src.clone()], at + dst.start);
                err = trident_nn::ops::update_f32(params[p].var.as_tensor(), |w| {
                    let w = &mut w[src.clone()];
                    let n = w.len();
                    let v = if v.is_empty() {
                        &mut [][..]
                    } else {
                        &mut v[at..at + n]
                    };
                    let m = if m.is_empty() {
                        &mut [][..]
                    } else {
                        &mut m[at..at + n]
                    };
                    config.update_slice(w, m, v, g, lr, t, scale);
                    part[dst.clone()].copy_from_slice(w);
                });
            });
            err?;
            self.flat.resize(b.len, 0.0);
            dp.comm
                .all_gather((&self.part[..]).into(), (&mut self.flat[..]).into())?;
            for p in b.params.clone() {
                let (s, e) = (self.offsets[p] - b.start, self.offsets[p + 1] - b.start);
                trident_nn::ops::update_f32(params[p].var.as_tensor(), |v| {
                    v.copy_from_slice(&self.flat[s..e])
                })?;
            }
            at += b.mine.len();
        }
        Ok(())
    }

    /// The shard file of `rank` of `world` in a checkpoint directory.
    pub fn shard_file(rank: usize, world: usize) -> String {
        format!("optimizer-shard-{rank:03}-of-{world:03}.safetensors")
    }

    /// Writes this rank's part of the optimizer state into `dir` (synced): its moments and
    /// the flattened ranges they cover.
    pub fn save_shard(&self, dir: &Path, rank: usize, world: usize) -> Result<()> {
        let ranges: Vec<i64> = self
            .ranges()
            .iter()
            .flat_map(|r| [r.start as i64, r.end as i64])
            .collect();
        let n = ranges.len() / 2;
        let mut t: HashMap<String, Tensor> = HashMap::new();
        t.insert("ranges".into(), Tensor::from_vec(ranges, (n, 2), &Device::Cpu)?);
        t.insert(
            "total".into(),
            Tensor::new(&[self.total_len() as i64], &Device::Cpu)?,
        );
        if !self.m.is_empty() {
            t.insert(
                "m".into(),
                Tensor::from_slice(&self.m, self.m.len(), &Device::Cpu)?,
            );
        }
        if !self.v.is_empty() {
            t.insert(
                "v".into(),
                Tensor::from_slice(&self.v, self.v.len(), &Device::Cpu)?,
            );
        }
        let f = dir.join(Self::shard_file(rank, world));
        candle_core::safetensors::save(&t, &f)?;
        std::fs::File::open(&f)
            .and_then(|f| f.sync_all())
            .map_err(|source| TrainError::Io {
                path: f.clone(),
                source,
            })
    }

    /// Restores this rank's part of the optimizer state from checkpoint `dir`, written by
    /// any number of ranks (shard files) or by an unsharded run (`optimizer.safetensors`).
    pub fn load(&mut self, dir: &Path) -> Result<()> {
        let flat = FlatState::read(dir, &self.names, &self.offsets)?;
        let mut at = 0;
        for r in self.ranges() {
            let n = r.len();
            if !self.m.is_empty() {
                flat.copy(&flat.m, r.clone(), &mut self.m[at..at + n], "m")?;
            }
            if !self.v.is_empty() {
                flat.copy(&flat.v, r.clone(), &mut self.v[at..at + n], "v")?;
            }
            at += n;
        }
        Ok(())
    }
}

/// Optimizer moments over the flattened parameters, as pieces `(start, values)`.
struct FlatState {
    m: Vec<(usize, Vec<f32>)>,
    v: Vec<(usize, Vec<f32>)>,
    origin: String,
}

impl FlatState {
    /// Reads the shard files of `dir`, or its unsharded `optimizer.safetensors` (laid out
    /// by `names` at `offsets`).
    fn read(dir: &Path, names: &[String], offsets: &[usize]) -> Result<Self> {
        let total = *offsets.last().unwrap();
        let mut shards: Vec<_> = std::fs::read_dir(dir)
            .map_err(|source| TrainError::Io {
                path: dir.into(),
                source,
            })?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("optimizer-shard-"))
            })
            .collect();
        shards.sort();
        let mut s = FlatState {
            m: Vec::new(),
            v: Vec::new(),
            origin: format!("{} ({} shard files)", dir.display(), shards.len()),
        };
        if shards.is_empty() {
            s.origin = dir.join("optimizer.safetensors").display().to_string();
            let f = dir.join("optimizer.safetensors");
            let t = candle_core::safetensors::load(&f, &Device::Cpu)
                .map_err(|e| TrainError::Invalid(format!("{}: {e}", f.display())))?;
            for (i, name) in names.iter().enumerate() {
                for (key, out) in [("m", &mut s.m), ("v", &mut s.v)] {
                    if let Some(x) = t.get(&format!("{key}.{name}")) {
                        out.push((offsets[i], x.flatten_all()?.to_vec1::<f32>()?));
                    }
                }
            }
            return Ok(s);
        }
        for f in &shards {
            let t = candle_core::safetensors::load(f, &Device::Cpu)
                .map_err(|e| TrainError::Invalid(format!("{}: {e}", f.display())))?;
            let bad = |what: &str| TrainError::Invalid(format!("{}: {what}", f.display()));
            let t_total = t
                .get("total")
                .ok_or_else(|| bad("no `total`"))?
                .to_vec1::<i64>()?;
            if t_total != [total as i64] {
                return Err(bad(&format!(
                    "written for {} parameter values, this model has {total}",
                    t_total.first().copied().unwrap_or(-1)
                )));
            }
            let ranges = t
                .get("ranges")
                .ok_or_else(|| bad("no `ranges`"))?
                .to_vec2::<i64>()?;
            for (key, out) in [("m", &mut s.m), ("v", &mut s.v)] {
                let Some(x) = t.get(key) else { continue };
                let x = x.to_vec1::<f32>()?;
                let mut at = 0;
                for r in &ranges {
                    let (a, b) = (r[0] as usize, r[1] as usize);
                    out.push((a, x[at..at + (b - a)].to_vec()));
                    at += b - a;
                }
            }
        }
        Ok(s)
    }

    /// Fills `dst` with the values of flattened range `r`; every value must be found.
    fn copy(&self, pieces: &[(usize, Vec<f32>)], r: Range<usize>, dst: &mut [f32], what: &str) -> Result<()> {
        let mut filled = 0;
        for (start, vals) in pieces {
            let (s, e) = (r.start.max(*start), r.end.min(start + vals.len()));
            if s < e {
                dst[s - r.start..e - r.start].copy_from_slice(&vals[s - start..e - start]);
                filled += e - s;
            }
        }
        if filled != r.len() {
            return Err(TrainError::Invalid(format!(
                "{}: optimizer state `{what}` covers {filled} of the {} values of range {:?} (a shard file is missing?)",
                self.origin,
                r.len(),
                r
            )));
        }
        Ok(())
    }
}

/// The unsharded optimizer state (`m.<name>`, `v.<name>`) of a checkpoint written with
/// ZeRO-1, for a run without it.
pub fn unshard_state(dir: &Path, params: &[Param]) -> Result<HashMap<String, Tensor>> {
    let names: Vec<String> = params.iter().map(|p| p.name.clone()).collect();
    let mut offsets = vec![0];
    for p in params {
        offsets.push(offsets.last().unwrap() + p.var.elem_count());
    }
    let flat = FlatState::read(dir, &names, &offsets)?;
    let mut out = HashMap::new();
    for (i, name) in names.iter().enumerate() {
        let r = offsets[i]..offsets[i + 1];
        for (key, pieces) in [("m", &flat.m), ("v", &flat.v)] {
            if pieces.is_empty() {
                continue;
            }
            let mut v = vec![0f32; r.len()];
            flat.copy(pieces, r.clone(), &mut v, key)?;
            out.insert(
                format!("{key}.{name}"),
                Tensor::from_vec(v, r.len(), &Device::Cpu)?,
            );
        }
    }
    Ok(out)
}
