//! All-reduce bandwidth against a local memcpy of the same size (the physical limit of one
//! machine's memory).
//!   cargo run --release -p trident-dist --example collective_bench [RANKS]        # in-process
//!   mpirun -np 2 target/release/examples/collective_bench --mpi                   # feature mpi
//! Prints, per buffer size, the median of 15 all-reduces (sum, f32 and bf16) as time and
//! algorithm bandwidth (buffer bytes / time), and the memcpy's.

use std::sync::Arc;
use std::time::{Duration, Instant};
use trident_dist::{bf16, Communicator, Local, ReduceOp};

const REPS: usize = 15;
const SIZES_MIB: [usize; 5] = [1, 4, 16, 64, 128];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median seconds of `f` over REPS runs after one warm-up, agreed by all ranks (max).
fn time(comm: &dyn Communicator, mut f: impl FnMut()) -> f64 {
    f();
    let mut t = Vec::new();
    for _ in 0..REPS {
        comm.barrier().unwrap();
        let t0 = Instant::now();
        f();
        t.push(t0.elapsed().as_secs_f64());
    }
    let mut m = [median(t) as f32];
    comm.all_reduce((&mut m[..]).into(), ReduceOp::Sum).unwrap();
    m[0] as f64 / comm.world_size() as f64
}

fn bench(comm: &dyn Communicator) {
    let lead = comm.rank() == 0;
    if lead {
        println!(
            "backend {}, {} ranks; median of {REPS}; GB/s = buffer bytes / time",
            comm.backend(),
            comm.world_size()
        );
        println!("| size | memcpy | all_reduce f32 | all_reduce bf16 |");
        println!("|---|---|---|---|");
    }
    for mib in SIZES_MIB {
        let n = mib << 18; // f32 values
        let src = vec![1.0f32; n];
        let mut dst = vec![0.0f32; n];
        let copy = time(comm, || dst.copy_from_slice(std::hint::black_box(&src)));
        let mut buf = vec![1.0f32; n];
        let f32s = time(comm, || {
            comm.all_reduce((&mut buf[..]).into(), ReduceOp::Sum).unwrap()
        });
        let mut half = vec![bf16::ONE; n];
        let bf16s = time(comm, || {
            comm.all_reduce((&mut half[..]).into(), ReduceOp::Sum).unwrap()
        });
        if lead {
            let gbs = |bytes: usize, s: f64| bytes as f64 / s / 1e9;
            println!(
                "| {mib} MiB f32 ({} MiB bf16) | {:.2} ms ({:.1} GB/s) | {:.2} ms ({:.1} GB/s) | {:.2} ms ({:.1} GB/s) |",
                mib / 2,
                copy * 1e3,
                gbs(4 * n, copy),
                f32s * 1e3,
                gbs(4 * n, f32s),
                bf16s * 1e3,
                gbs(2 * n, bf16s)
            );
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--mpi") {
        #[cfg(feature = "mpi")]
        {
            let comm = trident_dist::Mpi::init(Duration::from_secs(120)).unwrap();
            bench(&comm);
            return;
        }
        #[cfg(not(feature = "mpi"))]
        panic!("built without the `mpi` feature");
    }
    let ranks: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(2);
    let group: Vec<Arc<Local>> = Local::group(ranks, Duration::from_secs(120))
        .into_iter()
        .map(Arc::new)
        .collect();
    std::thread::scope(|s| {
        for c in &group {
            s.spawn(move || bench(c.as_ref()));
        }
    });
}
