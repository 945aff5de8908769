//! Collective communication for data-parallel training (DP-1, DP-2).
//!
//! [`Communicator`] is what the trainer sees: rank, world size and the collectives
//! (all-reduce, reduce-scatter, all-gather, broadcast, barrier) on f32 and bf16 buffers,
//! every one bounded by a timeout. Two backends:
//! - [`Local`]: replicas as threads of one process, exchanging through shared memory;
//! - `Mpi` (cargo feature `mpi`): processes, on one machine or many, through Open MPI.
//!
//! Buffers of any length work with any world size: sharded collectives split a buffer of
//! `n` values by [`shard_range`] (the first `n % world` ranks take one value more).
//! bf16 buffers are summed in f32 and rounded once at the end.
//!
//! Failures never hang: a rank that does not arrive within the timeout, that leaves the
//! group, or that calls a different collective makes the others fail with an error naming
//! it ([`DistError`]).

pub mod conformance;
mod local;
#[cfg(feature = "mpi")]
mod mpi_backend;

pub use half::bf16;
pub use local::Local;
#[cfg(feature = "mpi")]
pub use mpi_backend::Mpi;

use std::ops::Range;
use std::time::Duration;

/// How values from the ranks combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Element-wise sum divided by the world size.
    Mean,
}

/// A read-only buffer: f32 or bf16.
#[derive(Debug, Clone, Copy)]
pub enum Buf<'a> {
    /// f32 values.
    F32(&'a [f32]),
    /// bf16 values (summed in f32).
    Bf16(&'a [bf16]),
}

/// A writable buffer: f32 or bf16.
#[derive(Debug)]
pub enum BufMut<'a> {
    /// f32 values.
    F32(&'a mut [f32]),
    /// bf16 values (summed in f32).
    Bf16(&'a mut [bf16]),
}

impl<'a> From<&'a [f32]> for Buf<'a> {
    fn from(v: &'a [f32]) -> Self {
        Buf::F32(v)
    }
}
impl<'a> From<&'a [bf16]> for Buf<'a> {
    fn from(v: &'a [bf16]) -> Self {
        Buf::Bf16(v)
    }
}
impl<'a> From<&'a mut [f32]> for BufMut<'a> {
    fn from(v: &'a mut [f32]) -> Self {
        BufMut::F32(v)
    }
}
impl<'a> From<&'a mut [bf16]> for BufMut<'a> {
    fn from(v: &'a mut [bf16]) -> Self {
        BufMut::Bf16(v)
    }
}

impl Buf<'_> {
    /// Values held.
    pub fn len(&self) -> usize {
        match self {
            Buf::F32(v) => v.len(),
            Buf::Bf16(v) => v.len(),
        }
    }
    /// Whether it holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// `"f32"` or `"bf16"`.
    pub fn dtype(&self) -> &'static str {
        match self {
            Buf::F32(_) => "f32",
            Buf::Bf16(_) => "bf16",
        }
    }
    /// Writes the values, widened to f32, into `out` (same length).
    pub fn widen_into(&self, out: &mut [f32]) {
        match self {
            Buf::F32(v) => out.copy_from_slice(v),
            Buf::Bf16(v) => out.iter_mut().zip(v.iter()).for_each(|(o, x)| *o = x.to_f32()),
        }
    }
}

impl BufMut<'_> {
    /// A read-only view.
    pub fn as_buf(&self) -> Buf<'_> {
        match self {
            BufMut::F32(v) => Buf::F32(v),
            BufMut::Bf16(v) => Buf::Bf16(v),
        }
    }
    /// Values held.
    pub fn len(&self) -> usize {
        self.as_buf().len()
    }
    /// Whether it holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Stores f32 values (rounded to nearest-even for bf16) from `src` into
    /// `self[at..at + src.len()]`.
    pub fn store(&mut self, at: usize, src: &[f32]) {
        match self {
            BufMut::F32(v) => v[at..at + src.len()].copy_from_slice(src),
            BufMut::Bf16(v) => v[at..at + src.len()]
                .iter_mut()
                .zip(src)
                .for_each(|(o, x)| *o = bf16::from_f32(*x)),
        }
    }
}

/// The part of a buffer of `len` values that `rank` of `world` owns in sharded
/// collectives: contiguous, the first `len % world` ranks one value longer.
pub fn shard_range(len: usize, world: usize, rank: usize) -> Range<usize> {
    let (base, extra) = (len / world, len % world);
    let start = rank * base + rank.min(extra);
    start..start + base + usize::from(rank < extra)
}

/// Refuses, before any communication, a shard of `got` values for `rank` of `world` where
/// [`shard_range`]`(total, world, rank)` holds another number: `reduce_scatter`'s output
/// or `all_gather`'s input. Returns the rank's range.
pub(crate) fn check_shard(
    op: &str,
    rank: usize,
    world: usize,
    total: usize,
    got: usize,
) -> Result<Range<usize>> {
    let mine = shard_range(total, world, rank);
    if got != mine.len() {
        return Err(DistError::Invalid(format!(
            "{op}: rank {rank}'s shard of {total} values over {world} ranks holds {}, the call gives {got}",
            mine.len()
        )));
    }
    Ok(mine)
}

/// Refuses a broadcast root outside the group.
pub(crate) fn check_root(root: usize, world: usize) -> Result<()> {
    if root >= world {
        return Err(DistError::Invalid(format!(
            "broadcast: root {root} is not a rank of a group of {world}"
        )));
    }
    Ok(())
}

/// Why a collective failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DistError {
    /// Some ranks did not reach the collective in time.
    #[error(
        "rank {rank}: {op} (collective #{seq}) timed out after {:.1} s waiting for rank{} {} \
         (a rank that died, hangs, or runs other code)",
        after.as_secs_f64(),
        if missing.len() == 1 { "" } else { "s" },
        join(missing)
    )]
    Timeout {
        /// The rank reporting.
        rank: usize,
        /// The collective.
        op: String,
        /// Its sequence number (collectives this rank had run before it).
        seq: u64,
        /// The ranks that had not arrived.
        missing: Vec<usize>,
        /// The timeout.
        after: Duration,
    },
    /// Another rank failed or left the group.
    #[error("rank {rank} failed: {reason}")]
    PeerFailed {
        /// The rank that failed.
        rank: usize,
        /// What it reported.
        reason: String,
    },
    /// Ranks called different collectives, or the same one with different sizes.
    #[error("collective #{seq}: ranks disagree: {detail}")]
    Mismatch {
        /// Sequence number.
        seq: u64,
        /// Which ranks called what.
        detail: String,
    },
    /// The call itself is wrong (buffer sizes, root).
    #[error("{0}")]
    Invalid(String),
    /// The transport failed.
    #[error("{0}")]
    Backend(String),
}

fn join(v: &[usize]) -> String {
    v.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(", ")
}

/// Result of a collective.
pub type Result<T> = std::result::Result<T, DistError>;

/// Collective communication among the `world_size()` ranks of a group. Every rank must
/// call the same collectives in the same order with matching sizes; each call returns
/// when this rank's part is done, or with an error within the timeout.
pub trait Communicator: Send + Sync {
    /// This rank, `0..world_size()`.
    fn rank(&self) -> usize;
    /// Ranks in the group.
    fn world_size(&self) -> usize;
    /// `"local"` or `"mpi"`.
    fn backend(&self) -> &'static str;
    /// How long a rank waits for the others before it fails.
    fn timeout(&self) -> Duration;
    /// Every rank's `buf` becomes the element-wise reduction of all of them.
    fn all_reduce(&self, buf: BufMut<'_>, op: ReduceOp) -> Result<()>;
    /// Reduces `input` (the same length on every rank) and leaves this rank's shard,
    /// [`shard_range`]`(input.len(), world, rank)`, in `out`.
    fn reduce_scatter(&self, input: Buf<'_>, out: BufMut<'_>, op: ReduceOp) -> Result<()>;
    /// Concatenates every rank's `shard` in rank order into `out`; rank `q`'s shard holds
    /// [`shard_range`]`(out.len(), world, q)`'s values (so shards may differ by one).
    fn all_gather(&self, shard: Buf<'_>, out: BufMut<'_>) -> Result<()>;
    /// Every rank's `buf` becomes rank `root`'s.
    fn broadcast(&self, buf: BufMut<'_>, root: usize) -> Result<()>;
    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<()>;
    /// Every rank's `value`, in rank order (to compare configurations and checksums).
    fn all_gather_u64(&self, value: u64) -> Result<Vec<u64>>;
    /// Tells the other ranks that this one has failed, so their pending and later
    /// collectives fail at once instead of timing out.
    fn abort(&self, reason: &str);
}

/// The default timeout: long enough for a slow step on a loaded machine, short enough that
/// a dead rank is noticed (`TRIDENT_DIST_TIMEOUT` seconds overrides it).
pub fn default_timeout() -> Duration {
    let secs = std::env::var("TRIDENT_DIST_TIMEOUT")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .unwrap_or(300.0);
    Duration::from_secs_f64(secs)
}

/// Checks that every rank passed the same `value` (a hash of its configuration and model
/// shapes); the error names the ranks that differ from rank 0.
pub fn check_same(comm: &dyn Communicator, what: &str, value: u64) -> Result<()> {
    let all = comm.all_gather_u64(value)?;
    let odd: Vec<String> = all
        .iter()
        .enumerate()
        .filter(|(_, v)| **v != all[0])
        .map(|(r, v)| format!("rank {r} has {v:016x}"))
        .collect();
    if odd.is_empty() {
        Ok(())
    } else {
        Err(DistError::Mismatch {
            seq: 0,
            detail: format!("{what} differs: rank 0 has {:016x}, {}", all[0], odd.join(", ")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_the_buffer_in_order_and_differ_by_at_most_one() {
        for len in [0, 1, 2, 7, 10, 1001] {
            for world in 1..=5 {
                let r: Vec<Range<usize>> = (0..world).map(|k| shard_range(len, world, k)).collect();
                assert_eq!(r[0].start, 0);
                assert_eq!(r[world - 1].end, len);
                for k in 1..world {
                    assert_eq!(r[k].start, r[k - 1].end);
                }
                let lens: Vec<usize> = r.iter().map(|x| x.len()).collect();
                assert!(lens.iter().max().unwrap() - lens.iter().min().unwrap() <= 1);
            }
        }
        assert_eq!(shard_range(10, 3, 0), 0..4);
        assert_eq!(shard_range(10, 3, 2), 7..10);
    }

    #[test]
    fn timeout_errors_name_the_missing_ranks() {
        let e = DistError::Timeout {
            rank: 0,
            op: "all_reduce".into(),
            seq: 4,
            missing: vec![2],
            after: Duration::from_secs(3),
        };
        let s = e.to_string();
        assert!(s.contains("waiting for rank 2 ") && s.contains("#4"), "{s}");
    }
}
