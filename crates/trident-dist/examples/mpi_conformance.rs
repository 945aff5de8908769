//! The conformance suite on Open MPI, one rank per process:
//!   mpirun --allow-run-as-root --oversubscribe -np 3 target/debug/examples/mpi_conformance
//! Failure drills (each must end the job with an error naming the rank, within the timeout):
//!   mpi_conformance --timeout 3 --hang 1       rank 1 stops calling collectives
//!   mpi_conformance --timeout 3 --mismatch 1   rank 1 all-reduces a different length
//!   mpi_conformance --timeout 3 --die 1        rank 1 exits without a word

use std::time::Duration;
use trident_dist::{conformance, Communicator, Mpi, ReduceOp};

fn flag(args: &[String], name: &str) -> Option<f64> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let timeout = Duration::from_secs_f64(flag(&args, "--timeout").unwrap_or(60.0));
    let comm = Mpi::init(timeout).expect("MPI starts");
    let r = comm.rank();
    if let Err(e) = conformance::run(&comm) {
        eprintln!("rank {r}: conformance failed: {e}");
        std::process::exit(1);
    }
    println!("rank {r} of {}: conformance passed", comm.world_size());
    let drill = |name: &str| flag(&args, name).map(|v| v as usize) == Some(r);
    if drill("--hang") {
        std::thread::sleep(timeout * 4);
        return;
    }
    if drill("--die") {
        std::process::exit(0);
    }
    let len = if drill("--mismatch") { 5 } else { 4 };
    let mut buf = vec![1f32; len];
    comm.all_reduce((&mut buf[..]).into(), ReduceOp::Sum)
        .expect("aborts instead of returning an error");
    println!("rank {r}: drill all_reduce returned {buf:?}");
}
