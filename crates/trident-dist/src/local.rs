//! The in-process backend: the ranks are threads of one process, exchanging through
//! shared memory.
//!
//! Each collective is a *round*. A rank copies its input into its own slot (widening bf16
//! to f32), marks itself arrived and waits, bounded by the timeout, for the others. Then
//! each rank reduces only its own shard of every slot, in rank order (so every rank gets
//! bit-identical sums whatever the thread timing), and after a second meeting copies the
//! reduced shards out: a reduce-scatter followed by an all-gather, over memory. A round
//! ends when every rank has left it; only then may a slot be written again.
//!
//! The slots belong to the group, not to the callers, so a rank that gives up (timeout,
//! failure of another rank) can return while others still read: nothing dangles. A failure
//! poisons the group; every later collective fails at once with the same error.

use crate::{check_root, check_shard, shard_range, Buf, BufMut, Communicator, DistError, ReduceOp, Result};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One rank of an in-process group; make a group with [`Local::group`] and move one
/// `Local` to each replica's thread.
pub struct Local {
    rank: usize,
    shared: Arc<Shared>,
    seq: AtomicU64,
    /// The staging buffer between rounds (swapped with the slot's), so no round allocates.
    spare: Mutex<Vec<f32>>,
}

struct Shared {
    world: usize,
    timeout: Duration,
    st: Mutex<State>,
    cv: Condvar,
    slots: Vec<Slot>,
}

/// A rank's buffers in the group. `input`: its staged input, written only by its rank
/// between the end of the previous round and its own arrival, read by every rank between
/// everyone's arrival and the end of the round. `shard`: its reduced shard, written only by
/// its rank between everyone's arrival and its second meeting, read by every rank after
/// the second meeting. The state mutex orders these phases.
struct Slot {
    input: UnsafeCell<Vec<f32>>,
    shard: UnsafeCell<Vec<f32>>,
}

// SAFETY: access is ordered by the rounds as described on `Slot`.
unsafe impl Sync for Slot {}

#[derive(Debug, Clone, PartialEq)]
struct Desc {
    op: &'static str,
    len: usize,
    dtype: &'static str,
    arg: String,
}

struct State {
    round: u64,
    desc: Option<(usize, Desc)>,
    arrived: Vec<bool>,
    n_arrived: usize,
    n_reduced: usize,
    departed: Vec<bool>,
    n_departed: usize,
    left: Vec<bool>,
    failed: Option<DistError>,
    values: Vec<u64>,
}

impl Local {
    /// `world` connected ranks (0..world), each failing a collective after `timeout`.
    pub fn group(world: usize, timeout: Duration) -> Vec<Local> {
        assert!(world >= 1, "a group needs at least one rank");
        let shared = Arc::new(Shared {
            world,
            timeout,
            st: Mutex::new(State {
                round: 0,
                desc: None,
                arrived: vec![false; world],
                n_arrived: 0,
                n_reduced: 0,
                departed: vec![false; world],
                n_departed: 0,
                left: vec![false; world],
                failed: None,
                values: vec![0; world],
            }),
            cv: Condvar::new(),
            slots: (0..world)
                .map(|_| Slot {
                    input: UnsafeCell::new(Vec::new()),
                    shard: UnsafeCell::new(Vec::new()),
                })
                .collect(),
        });
        (0..world)
            .map(|rank| Local {
                rank,
                shared: shared.clone(),
                seq: AtomicU64::new(0),
                spare: Mutex::new(Vec::new()),
            })
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits (bounded by the timeout) until `done`; `missing` names the ranks being waited
    /// for. A failure of the group, or a needed rank leaving it, ends the wait with an error.
    fn wait<'a>(
        &self,
        mut st: MutexGuard<'a, State>,
        op: &'static str,
        done: impl Fn(&State) -> bool,
        missing: impl Fn(&State) -> Vec<usize>,
    ) -> Result<MutexGuard<'a, State>> {
        let deadline = Instant::now() + self.shared.timeout;
        loop {
            if let Some(e) = &st.failed {
                return Err(e.clone());
            }
            if done(&st) {
                return Ok(st);
            }
            if let Some(q) = missing(&st).into_iter().find(|&q| st.left[q]) {
                let e = DistError::PeerFailed {
                    rank: q,
                    reason: format!("it left the group before {op} (collective #{})", self.seq()),
                };
                st.failed = Some(e.clone());
                self.shared.cv.notify_all();
                return Err(e);
            }
            let now = Instant::now();
            if now >= deadline {
                let e = DistError::Timeout {
                    rank: self.rank,
                    op: op.into(),
                    seq: self.seq(),
                    missing: missing(&st),
                    after: self.shared.timeout,
                };
                st.failed = Some(e.clone());
                self.shared.cv.notify_all();
                return Err(e);
            }
            st = self
                .shared
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn seq(&self) -> u64 {
        self.seq.load(Ordering::Relaxed)
    }

    /// Stages `buf` (widened to f32) in this rank's spare buffer, outside any round.
    fn staged(&self, buf: Option<Buf<'_>>) -> Vec<f32> {
        let mut v = std::mem::take(&mut *self.spare.lock().unwrap_or_else(|e| e.into_inner()));
        v.clear();
        if let Some(b) = buf {
            v.resize(b.len(), 0.0);
            b.widen_into(&mut v);
        }
        v
    }

    /// Runs one round with `staged` as this rank's input (and `value` for u64 gathers):
    /// `reduce` runs once all have arrived (reading every input, writing this rank's
    /// shard), `gather` once all have reduced (reading every shard).
    #[allow(clippy::type_complexity)]
    fn round(
        &self,
        desc: Desc,
        mut staged: Vec<f32>,
        value: u64,
        reduce: impl FnOnce(&[&Vec<f32>], &mut Vec<f32>, &[u64]) -> Result<()>,
        gather: Option<Box<dyn FnOnce(&[&Vec<f32>]) + '_>>,
    ) -> Result<()> {
        let (r, w, op) = (self.rank, self.shared.world, desc.op);
        let seq = self.seq();
        let mut st = self.wait(
            self.lock(),
            op,
            |s| s.round == seq,
            |s| (0..w).filter(|&q| !s.departed[q]).collect(),
        )?;
        match &st.desc {
            None => st.desc = Some((r, desc)),
            Some((q, d)) if *d != desc => {
                let e = DistError::Mismatch {
                    seq,
                    detail: format!(
                        "rank {q} called {} of {} {} values{}, rank {r} called {} of {} {} values{}",
                        d.op, d.len, d.dtype, d.arg, desc.op, desc.len, desc.dtype, desc.arg
                    ),
                };
                st.failed = Some(e.clone());
                self.shared.cv.notify_all();
                return Err(e);
            }
            Some(_) => {}
        }
        let slot = &self.shared.slots[r];
        // SAFETY: see `Slot`: the previous round has ended and this rank has not arrived.
        std::mem::swap(unsafe { &mut *slot.input.get() }, &mut staged);
        *self.spare.lock().unwrap_or_else(|e| e.into_inner()) = staged;
        st.values[r] = value;
        st.arrived[r] = true;
        st.n_arrived += 1;
        self.shared.cv.notify_all();
        let st = self.wait(
            st,
            op,
            |s| s.n_arrived == w,
            |s| (0..w).filter(|&q| !s.arrived[q]).collect(),
        )?;
        let values = st.values.clone();
        drop(st);
        // SAFETY: every rank has arrived: inputs are read-only until the round ends, and
        // only this rank writes its shard until the second meeting.
        let inputs: Vec<&Vec<f32>> = self
            .shared
            .slots
            .iter()
            .map(|s| unsafe { &*s.input.get() })
            .collect();
        let reduced = reduce(&inputs, unsafe { &mut *slot.shard.get() }, &values);
        let mut st = self.lock();
        if let Some(gather) = gather {
            st.n_reduced += 1;
            self.shared.cv.notify_all();
            st = self.wait(st, op, |s| s.n_reduced == w, |_| Vec::new())?;
            drop(st);
            // SAFETY: every rank has written its shard; shards are read-only until the
            // round ends.
            let shards: Vec<&Vec<f32>> = self
                .shared
                .slots
                .iter()
                .map(|s| unsafe { &*s.shard.get() })
                .collect();
            gather(&shards);
            st = self.lock();
        }
        st.departed[r] = true;
        st.n_departed += 1;
        if st.n_departed == w {
            st.round += 1;
            st.desc = None;
            st.arrived.iter_mut().for_each(|a| *a = false);
            st.departed.iter_mut().for_each(|a| *a = false);
            st.n_arrived = 0;
            st.n_reduced = 0;
            st.n_departed = 0;
        }
        self.shared.cv.notify_all();
        drop(st);
        self.seq.fetch_add(1, Ordering::Relaxed);
        reduced
    }
}

/// `inputs[0][range] ⊕ inputs[1][range] ⊕ …` in rank order, into `acc` (its capacity
/// reused from round to round).
fn reduce_range_into(inputs: &[&Vec<f32>], range: std::ops::Range<usize>, op: ReduceOp, acc: &mut Vec<f32>) {
    acc.clear();
    acc.extend_from_slice(&inputs[0][range.clone()]);
    for s in &inputs[1..] {
        acc.iter_mut().zip(&s[range.clone()]).for_each(|(a, b)| *a += b);
    }
    if op == ReduceOp::Mean {
        let n = inputs.len() as f32;
        acc.iter_mut().for_each(|a| *a /= n);
    }
}

fn op_name(op: ReduceOp) -> String {
    format!(" ({op:?})")
}

impl Communicator for Local {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.world
    }

    fn backend(&self) -> &'static str {
        "local"
    }

    fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    fn all_reduce(&self, mut buf: BufMut<'_>, op: ReduceOp) -> Result<()> {
        let (r, w, len) = (self.rank, self.shared.world, buf.len());
        let desc = Desc {
            op: "all_reduce",
            len,
            dtype: buf.as_buf().dtype(),
            arg: op_name(op),
        };
        // Staging copies the input, so the buffer is free to receive the result.
        let staged = self.staged(Some(buf.as_buf()));
        let out = &mut buf;
        self.round(
            desc,
            staged,
            0,
            |inputs, shard, _| {
                reduce_range_into(inputs, shard_range(len, w, r), op, shard);
                Ok(())
            },
            Some(Box::new(move |shards: &[&Vec<f32>]| {
                for (q, s) in shards.iter().enumerate() {
                    out.store(shard_range(len, w, q).start, s);
                }
            })),
        )
    }

    fn reduce_scatter(&self, input: Buf<'_>, mut out: BufMut<'_>, op: ReduceOp) -> Result<()> {
        let (r, w, len) = (self.rank, self.shared.world, input.len());
        let mine = check_shard("reduce_scatter", r, w, len, out.len())?;
        let desc = Desc {
            op: "reduce_scatter",
            len,
            dtype: input.dtype(),
            arg: op_name(op),
        };
        self.round(
            desc,
            self.staged(Some(input)),
            0,
            |inputs, shard, _| {
                reduce_range_into(inputs, mine, op, shard);
                out.store(0, shard);
                Ok(())
            },
            None,
        )
    }

    fn all_gather(&self, shard: Buf<'_>, mut out: BufMut<'_>) -> Result<()> {
        let (r, w, total) = (self.rank, self.shared.world, out.len());
        check_shard("all_gather", r, w, total, shard.len())?;
        let desc = Desc {
            op: "all_gather",
            len: total,
            dtype: shard.dtype(),
            arg: String::new(),
        };
        self.round(
            desc,
            self.staged(Some(shard)),
            0,
            // Every rank checked its shard against the same total (the round's description),
            // so the shards fill `out` exactly.
            |inputs, _, _| {
                let mut at = 0;
                for s in inputs {
                    out.store(at, s);
                    at += s.len();
                }
                Ok(())
            },
            None,
        )
    }

    fn broadcast(&self, mut buf: BufMut<'_>, root: usize) -> Result<()> {
        let r = self.rank;
        check_root(root, self.shared.world)?;
        let desc = Desc {
            op: "broadcast",
            len: buf.len(),
            dtype: buf.as_buf().dtype(),
            arg: format!(" from rank {root}"),
        };
        let staged = self.staged((r == root).then(|| buf.as_buf()));
        self.round(
            desc,
            staged,
            0,
            |inputs, _, _| {
                if r != root {
                    buf.store(0, inputs[root]);
                }
                Ok(())
            },
            None,
        )
    }

    fn barrier(&self) -> Result<()> {
        let desc = Desc {
            op: "barrier",
            len: 0,
            dtype: "",
            arg: String::new(),
        };
        self.round(desc, self.staged(None), 0, |_, _, _| Ok(()), None)
    }

    fn all_gather_u64(&self, value: u64) -> Result<Vec<u64>> {
        let desc = Desc {
            op: "all_gather_u64",
            len: 1,
            dtype: "u64",
            arg: String::new(),
        };
        let mut got = Vec::new();
        self.round(
            desc,
            self.staged(None),
            value,
            |_, _, values| {
                got = values.to_vec();
                Ok(())
            },
            None,
        )?;
        Ok(got)
    }

    fn abort(&self, reason: &str) {
        let mut st = self.lock();
        if st.failed.is_none() {
            st.failed = Some(DistError::PeerFailed {
                rank: self.rank,
                reason: reason.into(),
            });
        }
        self.shared.cv.notify_all();
    }
}

impl Drop for Local {
    /// Leaving the group (a replica that returned or panicked) wakes the ranks waiting for
    /// this one, so they fail at once rather than at the timeout.
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        let mut st = self.lock();
        st.left[self.rank] = true;
        if panicking && st.failed.is_none() {
            st.failed = Some(DistError::PeerFailed {
                rank: self.rank,
                reason: "its thread panicked".into(),
            });
        }
        self.shared.cv.notify_all();
    }
}
