//! Data parallelism in one process: one replica of the model per thread, each with a
//! thread pool of its own (the cores shared out), talking over a local group of
//! [`trident_dist::Local`] communicators, each training on its shard through
//! [`Trainer::fit`] with its [`DataParallel`](crate::ddp::DataParallel) rank.

use crate::ddp::DataParallel;
use crate::trainer::{FitSummary, TrainError, TrainStep, Trainer};
use std::sync::Arc;
use trident_data::{DataLoader, Dataset};
use trident_dist::Communicator;

/// Trains one replica per model in `models` on threads of this process; returns replica
/// 0's summary and model. `dp` makes each replica's data-parallel rank of its
/// communicator. Replica 0 prints progress and is profiled; the others are quiet. Where a
/// replica fails, the error is its own, not the failure its peers see of it.
pub fn fit_on_threads<S, D, V>(
    trainer: &Trainer,
    models: Vec<S>,
    train: &DataLoader<D, S::Batch>,
    val: Option<&DataLoader<V, S::Batch>>,
    (resume, data_hash): (bool, &str),
    dp: &(dyn Fn(Arc<dyn Communicator>) -> DataParallel + Sync),
) -> Result<(FitSummary, S), TrainError>
where
    S: TrainStep + Send + Sync,
    D: Dataset + 'static,
    V: Dataset + 'static,
{
    let n = models.len();
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let threads = (cores / n.max(1)).max(1);
    let group = trident_dist::Local::group(n, trident_dist::default_timeout());
    let results: Vec<(Result<FitSummary, TrainError>, S)> = std::thread::scope(|s| {
        let handles: Vec<_> = group
            .into_iter()
            .zip(models)
            .enumerate()
            .map(|(r, (comm, m))| {
                let comm: Arc<dyn Communicator> = Arc::new(comm);
                let mut t = trainer.clone();
                t.data_parallel = Some(dp(comm.clone()));
                if r > 0 {
                    t.progress = false;
                    t.profile = None;
                }
                let shard = train.sharded(r, n);
                std::thread::Builder::new()
                    .name(format!("replica-{r}"))
                    .spawn_scoped(s, move || {
                        let res = fit_replica(r, threads, || t.fit(&m, &shard, val, resume, data_hash));
                        if let Err(e) = &res {
                            comm.abort(&e.to_string());
                        }
                        (res, m)
                    })
                    .expect("spawn replica thread")
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(r, h)| h.join().unwrap_or_else(|_| panic!("replica {r} panicked")))
            .collect()
    });
    root_cause(results)
}

/// Replica 0's result, or the first error that is not a rank's report of another rank's
/// failure (the root cause), else the first error.
fn root_cause<S>(results: Vec<(Result<FitSummary, TrainError>, S)>) -> Result<(FitSummary, S), TrainError> {
    let peer = |e: &TrainError| matches!(e, TrainError::Dist(trident_dist::DistError::PeerFailed { .. }));
    let failed = |(r, _): &(Result<FitSummary, TrainError>, S)| r.as_ref().err().map(|e| !peer(e));
    let root = results
        .iter()
        .position(|x| failed(x) == Some(true))
        .or_else(|| results.iter().position(|x| failed(x).is_some()));
    let (first, model) = match root {
        Some(i) => results.into_iter().nth(i).expect("the failed replica"),
        None => results.into_iter().next().expect("replica 0"),
    };
    Ok((first?, model))
}

/// Runs replica `r`'s training `fit` on a thread pool of its own, `threads` threads named
/// after it. One profile describes replica 0: the others' threads record nothing.
fn fit_replica<T>(
    r: usize,
    threads: usize,
    fit: impl FnOnce() -> Result<T, TrainError> + Send,
) -> Result<T, TrainError>
where
    T: Send,
{
    if r > 0 {
        trident_nn::trace::mute_this_thread();
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("replica-{r}-{i}"))
        .start_handler(move |_| {
            if r > 0 {
                trident_nn::trace::mute_this_thread();
            }
        })
        .build()
        .map_err(|e| TrainError::Invalid(format!("replica {r}: thread pool: {e}")))?;
    pool.install(fit)
}
