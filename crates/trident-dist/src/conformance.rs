//! The conformance suite every [`Communicator`] backend must pass: every collective, f32
//! and bf16, with lengths that do not divide by the world size (0, 1, world ± 1, primes).
//! Each rank runs [`run`] on its own communicator; the values are small integers, exact in
//! f32 and bf16, so every backend's sums are exact whatever its summation order.

use crate::{bf16, shard_range, Communicator, ReduceOp};

/// The lengths tried for a group of `world` ranks.
pub fn lengths(world: usize) -> Vec<usize> {
    let mut v = vec![0, 1, 2, 3, world.saturating_sub(1), world, world + 1, 1000, 4099];
    v.sort_unstable();
    v.dedup();
    v
}

/// Rank `r`'s value at index `i`.
fn value(r: usize, i: usize) -> f32 {
    ((r * 7 + i * 3) % 17) as f32 - 8.0
}

fn expected(world: usize, i: usize, op: ReduceOp) -> f32 {
    let sum: f32 = (0..world).map(|r| value(r, i)).sum();
    match op {
        ReduceOp::Sum => sum,
        ReduceOp::Mean => sum / world as f32,
    }
}

fn check<T: PartialEq + std::fmt::Debug>(what: &str, got: &[T], want: &[T]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} values, expected {}", got.len(), want.len()));
    }
    match got.iter().zip(want).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what}: value {i} is {:?}, expected {:?}",
            got[i], want[i]
        )),
    }
}

/// Runs every check on `comm`; the first failure, described.
pub fn run(comm: &dyn Communicator) -> Result<(), String> {
    let (r, w) = (comm.rank(), comm.world_size());
    fn e(what: &str) -> impl Fn(crate::DistError) -> String + '_ {
        move |err| format!("{what}: {err}")
    }
    if r >= w {
        return Err(format!("rank {r} outside a world of {w}"));
    }
    comm.barrier().map_err(e("barrier"))?;
    let ranks = comm
        .all_gather_u64(r as u64 * 10 + 1)
        .map_err(e("all_gather_u64"))?;
    check(
        "all_gather_u64",
        &ranks,
        &(0..w as u64).map(|q| q * 10 + 1).collect::<Vec<_>>(),
    )?;
    for len in lengths(w) {
        let mine: Vec<f32> = (0..len).map(|i| value(r, i)).collect();
        for op in [ReduceOp::Sum, ReduceOp::Mean] {
            let want: Vec<f32> = (0..len).map(|i| expected(w, i, op)).collect();
            let what = format!("all_reduce {op:?} f32 len {len}");
            let mut buf = mine.clone();
            comm.all_reduce((&mut buf[..]).into(), op).map_err(e(&what))?;
            check(&what, &buf, &want)?;

            let what = format!("all_reduce {op:?} bf16 len {len}");
            let mut buf: Vec<bf16> = mine.iter().map(|&v| bf16::from_f32(v)).collect();
            comm.all_reduce((&mut buf[..]).into(), op).map_err(e(&what))?;
            let want16: Vec<bf16> = want.iter().map(|&v| bf16::from_f32(v)).collect();
            check(&what, &buf, &want16)?;

            let shard = shard_range(len, w, r);
            let what = format!("reduce_scatter {op:?} f32 len {len}");
            let mut out = vec![f32::NAN; shard.len()];
            comm.reduce_scatter((&mine[..]).into(), (&mut out[..]).into(), op)
                .map_err(e(&what))?;
            check(&what, &out, &want[shard.clone()])?;

            let what = format!("reduce_scatter {op:?} bf16 len {len}");
            let mine16: Vec<bf16> = mine.iter().map(|&v| bf16::from_f32(v)).collect();
            let mut out = vec![bf16::NAN; shard.len()];
            comm.reduce_scatter((&mine16[..]).into(), (&mut out[..]).into(), op)
                .map_err(e(&what))?;
            check(&what, &out, &want16[shard])?;
        }
        // all_gather: each rank gives its shard of the sequence 0..len.
        let full: Vec<f32> = (0..len).map(|i| i as f32).collect();
        let shard = shard_range(len, w, r);
        let what = format!("all_gather f32 len {len}");
        let mut out = vec![f32::NAN; len];
        comm.all_gather((&full[shard.clone()]).into(), (&mut out[..]).into())
            .map_err(e(&what))?;
        check(&what, &out, &full)?;
        let what = format!("all_gather bf16 len {len}");
        let full16: Vec<bf16> = full.iter().map(|&v| bf16::from_f32(v)).collect();
        let mut out = vec![bf16::NAN; len];
        comm.all_gather((&full16[shard]).into(), (&mut out[..]).into())
            .map_err(e(&what))?;
        check(&what, &out, &full16)?;
        // broadcast from every root.
        for root in 0..w {
            let what = format!("broadcast f32 len {len} from {root}");
            let mut buf = mine.clone();
            comm.broadcast((&mut buf[..]).into(), root).map_err(e(&what))?;
            check(&what, &buf, &(0..len).map(|i| value(root, i)).collect::<Vec<_>>())?;
            let what = format!("broadcast bf16 len {len} from {root}");
            let mut buf: Vec<bf16> = mine.iter().map(|&v| bf16::from_f32(v)).collect();
            comm.broadcast((&mut buf[..]).into(), root).map_err(e(&what))?;
            let want: Vec<bf16> = (0..len).map(|i| bf16::from_f32(value(root, i))).collect();
            check(&what, &buf, &want)?;
        }
    }
    // Wrong calls are refused before any communication, naming the sizes.
    let mut small = [0f32; 1];
    if w > 1 {
        let err = comm
            .reduce_scatter(
                (&[0f32; 4 * 8][..]).into(),
                (&mut small[..]).into(),
                ReduceOp::Sum,
            )
            .map(|_| ())
            .err();
        if !matches!(err, Some(crate::DistError::Invalid(_))) {
            return Err(format!("reduce_scatter into a wrong-sized shard gave {err:?}"));
        }
    }
    let err = comm.broadcast((&mut small[..]).into(), w).err();
    if !matches!(err, Some(crate::DistError::Invalid(_))) {
        return Err(format!("broadcast from rank {w} gave {err:?}"));
    }
    comm.barrier().map_err(e("final barrier"))
}
