//! The Open MPI backend (feature `mpi`): one rank per process, started by `mpirun`.
//!
//! Every collective is a non-blocking MPI collective (`MPI_Iallreduce`, …) polled until it
//! completes or the timeout passes; the `mpi` crate initialises MPI and gives the handles,
//! the calls go through its raw bindings because its request scopes cannot abandon a
//! request. Alongside each collective every rank sends every other a small *arrival note*
//! (sequence number, collective, length): on a timeout the ranks whose note has not come
//! are the ones named, and a note that disagrees names a mismatched call.
//!
//! MPI cannot cancel a collective that is under way, and it may still write into the
//! caller's buffer, so a timeout or a mismatch cannot be returned as an error: the rank
//! prints the error and calls `MPI_Abort`, which makes `mpirun` stop every rank.

use crate::{check_root, check_shard, shard_range, Buf, BufMut, Communicator, DistError, ReduceOp, Result};
use mpi::ffi;
use mpi::traits::{AsRaw, Communicator as _};
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const NOTE_TAG: c_int = 0x7d15;

/// This process's rank in `MPI_COMM_WORLD`.
pub struct Mpi {
    _universe: mpi::environment::Universe,
    comm: ffi::MPI_Comm,
    rank: usize,
    world: usize,
    timeout: Duration,
    seq: AtomicU64,
    /// MPI is initialised `Serialized`: one call at a time. Holds the send and receive
    /// staging buffers, reused from call to call.
    calls: Mutex<(Vec<f32>, Vec<f32>)>,
}

// SAFETY: the raw communicator handle is only used under `calls`, and MPI was initialised
// with MPI_THREAD_SERIALIZED, which allows calls from any thread one at a time.
unsafe impl Send for Mpi {}
unsafe impl Sync for Mpi {}

fn code(op: &str) -> u64 {
    match op {
        "all_reduce" => 1,
        "reduce_scatter" => 2,
        "all_gather" => 3,
        "broadcast" => 4,
        "barrier" => 5,
        _ => 6,
    }
}

fn name(code: u64) -> &'static str {
    [
        "?",
        "all_reduce",
        "reduce_scatter",
        "all_gather",
        "broadcast",
        "barrier",
        "all_gather_u64",
    ]
    .get(code as usize)
    .copied()
    .unwrap_or("?")
}

fn count(n: usize) -> Result<c_int> {
    c_int::try_from(n).map_err(|_| DistError::Invalid(format!("a buffer of {n} values is too large for MPI")))
}

/// Every rank's shard of `len` values ([`shard_range`]) as MPI counts and displacements.
fn shards(len: usize, world: usize) -> Result<(Vec<c_int>, Vec<c_int>)> {
    (0..world)
        .map(|q| {
            let r = shard_range(len, world, q);
            Ok((count(r.len())?, count(r.start)?))
        })
        .collect::<Result<Vec<_>>>()
        .map(|v| v.into_iter().unzip())
}

impl Mpi {
    /// Initialises MPI (once per process); fails when MPI cannot start.
    pub fn init(timeout: Duration) -> Result<Mpi> {
        let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Serialized)
            .ok_or_else(|| DistError::Backend("MPI is already initialised in this process".into()))?;
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        let comm = world.as_raw();
        Ok(Mpi {
            _universe: universe,
            comm,
            rank,
            world: size,
            timeout,
            seq: AtomicU64::new(0),
            calls: Mutex::new((Vec::new(), Vec::new())),
        })
    }

    /// Prints `e` and stops the whole job.
    fn die(&self, e: &DistError) -> ! {
        // One write: several ranks die at once, and mpirun merges their stderr, so a
        // message written in pieces would interleave with the others'.
        use std::io::Write;
        let _ = std::io::stderr().write_all(format!("trident: {e}\n").as_bytes());
        // SAFETY: a plain MPI call on a valid communicator; it does not return.
        unsafe {
            ffi::MPI_Abort(self.comm, 3);
        }
        std::process::exit(3)
    }

    /// Runs one collective started by `start` (which fills in the request), with arrival
    /// notes, until it completes; aborts the job on a timeout or a mismatched call.
    fn run(
        &self,
        op: &'static str,
        len: usize,
        start: impl FnOnce(*mut ffi::MPI_Request) -> c_int,
    ) -> Result<()> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let (r, w) = (self.rank, self.world);
        let note: [u64; 3] = [seq, code(op), len as u64];
        let mut got = vec![[0u64; 3]; w];
        // SAFETY: the note buffers live until every request is complete (or the job aborts);
        // handles come from MPI itself.
        unsafe {
            let null = ffi::RSMPI_REQUEST_NULL;
            let mut sends = vec![null; w];
            let mut recvs = vec![null; w];
            for q in (0..w).filter(|&q| q != r) {
                ffi::MPI_Isend(
                    note.as_ptr() as *const c_void,
                    3,
                    ffi::RSMPI_UINT64_T,
                    q as c_int,
                    NOTE_TAG,
                    self.comm,
                    &mut sends[q],
                );
                ffi::MPI_Irecv(
                    got[q].as_mut_ptr() as *mut c_void,
                    3,
                    ffi::RSMPI_UINT64_T,
                    q as c_int,
                    NOTE_TAG,
                    self.comm,
                    &mut recvs[q],
                );
            }
            let mut req = null;
            let rc = start(&mut req);
            if rc != 0 {
                return Err(DistError::Backend(format!("{op}: MPI error code {rc}")));
            }
            let deadline = Instant::now() + self.timeout;
            let mut arrived: Vec<bool> = (0..w).map(|q| q == r).collect();
            let mut spins = 0u32;
            loop {
                for q in 0..w {
                    if !arrived[q] {
                        let mut flag = 0;
                        ffi::MPI_Test(&mut recvs[q], &mut flag, ffi::RSMPI_STATUS_IGNORE);
                        if flag != 0 {
                            arrived[q] = true;
                            if got[q] != note {
                                self.die(&DistError::Mismatch {
                                    seq,
                                    detail: format!(
                                        "rank {q} called {} of {} values as its collective #{}, rank {r} {} of {len} values as #{seq}",
                                        name(got[q][1]),
                                        got[q][2],
                                        got[q][0],
                                        op
                                    ),
                                });
                            }
                        }
                    }
                }
                let mut done = 0;
                ffi::MPI_Test(&mut req, &mut done, ffi::RSMPI_STATUS_IGNORE);
                if done != 0 && arrived.iter().all(|a| *a) {
                    break;
                }
                if Instant::now() >= deadline {
                    self.die(&DistError::Timeout {
                        rank: r,
                        op: op.into(),
                        seq,
                        missing: (0..w).filter(|&q| !arrived[q]).collect(),
                        after: self.timeout,
                    });
                }
                // Spin briefly (a collective usually completes in microseconds), then back off.
                spins += 1;
                if spins < 2000 {
                    std::hint::spin_loop();
                } else {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
            for q in (0..w).filter(|&q| q != r) {
                ffi::MPI_Wait(&mut sends[q], ffi::RSMPI_STATUS_IGNORE);
            }
        }
        Ok(())
    }

    fn finish_reduce(&self, sum: &mut [f32], op: ReduceOp) {
        if op == ReduceOp::Mean {
            let n = self.world as f32;
            sum.iter_mut().for_each(|v| *v /= n);
        }
    }
}

impl Communicator for Mpi {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn backend(&self) -> &'static str {
        "mpi"
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn all_reduce(&self, mut buf: BufMut<'_>, op: ReduceOp) -> Result<()> {
        let len = buf.len();
        let n = count(len)?;
        let mut staging = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        let (send, sum) = &mut *staging;
        send.resize(len, 0.0);
        sum.resize(len, 0.0);
        buf.as_buf().widen_into(send);
        // SAFETY: both buffers hold `len` f32 values and outlive the request (`run` waits).
        self.run("all_reduce", len, |req| unsafe {
            ffi::MPI_Iallreduce(
                send.as_ptr() as *const c_void,
                sum.as_mut_ptr() as *mut c_void,
                n,
                ffi::RSMPI_FLOAT,
                ffi::RSMPI_SUM,
                self.comm,
                req,
            )
        })?;
        self.finish_reduce(sum, op);
        buf.store(0, sum);
        Ok(())
    }

    fn reduce_scatter(&self, input: Buf<'_>, mut out: BufMut<'_>, op: ReduceOp) -> Result<()> {
        let (r, w, len) = (self.rank, self.world, input.len());
        check_shard("reduce_scatter", r, w, len, out.len())?;
        let (counts, _) = shards(len, w)?;
        let mut staging = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        let (send, shard) = &mut *staging;
        send.resize(len, 0.0);
        shard.resize(out.len(), 0.0);
        input.widen_into(send);
        // SAFETY: `send` holds the sum of `counts`, `shard` this rank's count.
        self.run("reduce_scatter", len, |req| unsafe {
            ffi::MPI_Ireduce_scatter(
                send.as_ptr() as *const c_void,
                shard.as_mut_ptr() as *mut c_void,
                counts.as_ptr(),
                ffi::RSMPI_FLOAT,
                ffi::RSMPI_SUM,
                self.comm,
                req,
            )
        })?;
        self.finish_reduce(shard, op);
        out.store(0, shard);
        Ok(())
    }

    fn all_gather(&self, shard: Buf<'_>, mut out: BufMut<'_>) -> Result<()> {
        let (r, w, total) = (self.rank, self.world, out.len());
        check_shard("all_gather", r, w, total, shard.len())?;
        let (counts, displs) = shards(total, w)?;
        // bf16 travels as its 16 bits: gathering needs no arithmetic.
        let dtype = |b: &Buf<'_>| match b {
            Buf::F32(_) => unsafe { ffi::RSMPI_FLOAT },
            Buf::Bf16(_) => unsafe { ffi::RSMPI_UINT16_T },
        };
        let (sp, dt) = match shard {
            Buf::F32(v) => (v.as_ptr() as *const c_void, dtype(&shard)),
            Buf::Bf16(v) => (v.as_ptr() as *const c_void, dtype(&shard)),
        };
        if dtype(&out.as_buf()) != dt {
            return Err(DistError::Invalid(
                "all_gather: the shard and the output differ in type".into(),
            ));
        }
        let rp = match &mut out {
            BufMut::F32(v) => v.as_mut_ptr() as *mut c_void,
            BufMut::Bf16(v) => v.as_mut_ptr() as *mut c_void,
        };
        let _one = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        let mine = count(shard.len())?;
        // SAFETY: counts and displacements describe `out` exactly; buffers outlive the call.
        self.run("all_gather", total, |req| unsafe {
            ffi::MPI_Iallgatherv(
                sp,
                mine,
                dt,
                rp,
                counts.as_ptr(),
                displs.as_ptr(),
                dt,
                self.comm,
                req,
            )
        })
    }

    fn broadcast(&self, mut buf: BufMut<'_>, root: usize) -> Result<()> {
        check_root(root, self.world)?;
        let _one = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        let len = buf.len();
        let n = count(len)?;
        let (p, dt) = match &mut buf {
            BufMut::F32(v) => (v.as_mut_ptr() as *mut c_void, unsafe { ffi::RSMPI_FLOAT }),
            BufMut::Bf16(v) => (v.as_mut_ptr() as *mut c_void, unsafe { ffi::RSMPI_UINT16_T }),
        };
        // SAFETY: `buf` holds `len` values of the type and outlives the request.
        self.run("broadcast", len, |req| unsafe {
            ffi::MPI_Ibcast(p, n, dt, root as c_int, self.comm, req)
        })
    }

    fn barrier(&self) -> Result<()> {
        let _one = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: no buffers.
        self.run("barrier", 0, |req| unsafe { ffi::MPI_Ibarrier(self.comm, req) })
    }

    fn all_gather_u64(&self, value: u64) -> Result<Vec<u64>> {
        let _one = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = vec![0u64; self.world];
        // SAFETY: one u64 in, `world` out; both outlive the request.
        self.run("all_gather_u64", 1, |req| unsafe {
            ffi::MPI_Iallgather(
                &value as *const u64 as *const c_void,
                1,
                ffi::RSMPI_UINT64_T,
                out.as_mut_ptr() as *mut c_void,
                1,
                ffi::RSMPI_UINT64_T,
                self.comm,
                req,
            )
        })?;
        Ok(out)
    }

    fn abort(&self, reason: &str) {
        self.die(&DistError::PeerFailed {
            rank: self.rank,
            reason: reason.into(),
        })
    }
}
