//! The in-process backend: the conformance suite for 1–4 ranks, and the failure cases:
//! a rank that never arrives, leaves, panics, aborts, or calls something else.

use std::time::{Duration, Instant};
use trident_dist::{check_same, conformance, Communicator, DistError, Local, ReduceOp};

/// Runs `f(rank, comm)` on one thread per rank; each thread's result, by rank.
fn on_ranks<T: Send>(world: usize, timeout: Duration, f: impl Fn(&Local) -> T + Sync) -> Vec<T> {
    let group = Local::group(world, timeout);
    std::thread::scope(|s| {
        let handles: Vec<_> = group
            .into_iter()
            .map(|c| {
                let f = &f;
                s.spawn(move || f(&c))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn conformance_for_one_to_four_ranks() {
    for world in 1..=4 {
        for (r, res) in on_ranks(world, Duration::from_secs(30), |c| conformance::run(c))
            .into_iter()
            .enumerate()
        {
            assert_eq!(res, Ok(()), "world {world}, rank {r}");
        }
    }
}

#[test]
fn a_rank_that_never_arrives_is_named_within_the_timeout() {
    let t0 = Instant::now();
    let res = on_ranks(3, Duration::from_millis(300), |c| {
        if c.rank() == 2 {
            // Busy elsewhere (not gone): holds its Local without calling the collective.
            std::thread::sleep(Duration::from_millis(900));
            return None;
        }
        let mut buf = [1f32; 8];
        Some(c.all_reduce((&mut buf[..]).into(), ReduceOp::Sum))
    });
    assert!(t0.elapsed() < Duration::from_secs(5));
    for r in [0, 1] {
        match &res[r] {
            Some(Err(DistError::Timeout { missing, rank, .. })) => {
                assert_eq!(missing, &[2], "rank {r}");
                let msg = res[r].as_ref().unwrap().as_ref().unwrap_err().to_string();
                assert!(msg.contains("rank 2"), "{msg}");
                assert!(*rank == r || *rank < 2, "{rank}");
            }
            other => panic!("rank {r}: {other:?}"),
        }
    }
}

#[test]
fn a_rank_that_leaves_or_panics_fails_the_others_at_once() {
    let t0 = Instant::now();
    let res = on_ranks(3, Duration::from_secs(60), |c| {
        if c.rank() == 1 {
            return None; // returns: its Local is dropped, it leaves the group
        }
        let mut buf = [1f32; 8];
        Some(c.all_reduce((&mut buf[..]).into(), ReduceOp::Sum))
    });
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "no wait for the 60 s timeout"
    );
    for r in [0, 2] {
        match &res[r] {
            Some(Err(DistError::PeerFailed { rank: 1, reason })) => {
                assert!(reason.contains("left"), "{reason}")
            }
            other => panic!("rank {r}: {other:?}"),
        }
    }

    let group = Local::group(2, Duration::from_secs(60));
    let t0 = Instant::now();
    let errs: Vec<String> = std::thread::scope(|s| {
        let mut it = group.into_iter();
        let (a, b) = (it.next().unwrap(), it.next().unwrap());
        let h = s.spawn(move || {
            let _c = b;
            panic!("replica 1 broke");
        });
        let mut buf = [1f32; 4];
        let e = a.all_reduce((&mut buf[..]).into(), ReduceOp::Sum).unwrap_err();
        assert!(h.join().is_err());
        vec![e.to_string()]
    });
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert!(
        errs[0].contains("rank 1") && errs[0].contains("panicked"),
        "{errs:?}"
    );
}

#[test]
fn abort_and_mismatched_calls_are_reported_to_every_rank() {
    let res = on_ranks(2, Duration::from_secs(60), |c| {
        if c.rank() == 0 {
            c.abort("loss became NaN");
        }
        c.barrier()
    });
    for r in &res {
        assert!(
            matches!(r, Err(DistError::PeerFailed { rank: 0, reason }) if reason.contains("NaN")),
            "{r:?}"
        );
    }

    let res = on_ranks(2, Duration::from_secs(60), |c| {
        let mut buf = vec![1f32; 4 + c.rank()];
        c.all_reduce((&mut buf[..]).into(), ReduceOp::Sum)
    });
    let msgs: Vec<String> = res.iter().map(|r| r.as_ref().unwrap_err().to_string()).collect();
    assert!(
        msgs.iter()
            .any(|m| m.contains("rank 0") && m.contains("rank 1") && m.contains("4") && m.contains("5")),
        "{msgs:?}"
    );
    assert!(
        res.iter().all(|r| matches!(r, Err(DistError::Mismatch { .. }))),
        "{res:?}"
    );
}

#[test]
fn check_same_names_the_rank_whose_configuration_differs() {
    let res = on_ranks(3, Duration::from_secs(60), |c| {
        check_same(c, "config", if c.rank() == 2 { 0xbad } else { 0x600d })
    });
    for r in &res {
        let msg = r.as_ref().unwrap_err().to_string();
        assert!(msg.contains("rank 2 has 0000000000000bad"), "{msg}");
    }
    let ok = on_ranks(2, Duration::from_secs(60), |c| check_same(c, "config", 7));
    assert!(ok.iter().all(|r| r.is_ok()));
}

/// Hundreds of collectives back to back, of every kind and random sizes (the same sequence
/// on every rank), on 3 ranks: rounds never mix, slots are never overwritten while read.
#[test]
fn back_to_back_collectives_of_random_kinds_and_sizes() {
    let res = on_ranks(3, Duration::from_secs(60), |c| -> Result<(), String> {
        let (r, w) = (c.rank(), c.world_size());
        let mut s = 12345u64;
        let mut next = |m: u64| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 33) % m
        };
        for round in 0..400 {
            let len = next(300) as usize;
            let v = |q: usize, i: usize| (q * 31 + i * 7 + round) as f32 % 97.0;
            let mine: Vec<f32> = (0..len).map(|i| v(r, i)).collect();
            match next(4) {
                0 => {
                    let mut b = mine.clone();
                    c.all_reduce((&mut b[..]).into(), ReduceOp::Sum)
                        .map_err(|e| e.to_string())?;
                    for (i, x) in b.iter().enumerate() {
                        let want: f32 = (0..w).map(|q| v(q, i)).sum();
                        if *x != want {
                            return Err(format!("round {round}: all_reduce[{i}] {x} != {want}"));
                        }
                    }
                }
                1 => {
                    let sh = trident_dist::shard_range(len, w, r);
                    let mut out = vec![0f32; sh.len()];
                    c.reduce_scatter((&mine[..]).into(), (&mut out[..]).into(), ReduceOp::Mean)
                        .map_err(|e| e.to_string())?;
                    for (k, x) in out.iter().enumerate() {
                        let i = sh.start + k;
                        let want = (0..w).map(|q| v(q, i)).sum::<f32>() / w as f32;
                        if *x != want {
                            return Err(format!("round {round}: reduce_scatter[{i}] {x} != {want}"));
                        }
                    }
                }
                2 => {
                    let sh = trident_dist::shard_range(len, w, r);
                    let mut out = vec![0f32; len];
                    let full: Vec<f32> = (0..len).map(|i| v(0, i)).collect();
                    c.all_gather((&full[sh]).into(), (&mut out[..]).into())
                        .map_err(|e| e.to_string())?;
                    if out != full {
                        return Err(format!("round {round}: all_gather"));
                    }
                }
                _ => {
                    let root = next(w as u64) as usize;
                    let mut b = mine.clone();
                    c.broadcast((&mut b[..]).into(), root)
                        .map_err(|e| e.to_string())?;
                    if b != (0..len).map(|i| v(root, i)).collect::<Vec<_>>() {
                        return Err(format!("round {round}: broadcast from {root}"));
                    }
                }
            }
        }
        Ok(())
    });
    for (r, x) in res.iter().enumerate() {
        assert_eq!(x, &Ok(()), "rank {r}");
    }
}
