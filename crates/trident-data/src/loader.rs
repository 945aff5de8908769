//! The data loader: minibatches of a [`Dataset`] assembled by a collate function, on
//! `num_workers` background threads with bounded prefetching, delivered in order.
//!
//! Worker `w` builds batches `w, w + n, w + 2n, ...` and sends each into its own channel
//! of capacity `prefetch`; the iterator reads the channels round-robin, so batches come
//! out in plan order whatever the workers' speed, and at most `n × prefetch` batches are
//! ever buffered. Dropping the iterator closes the channels and the workers stop.

use crate::sampler::EpochPlan;
use crate::{DataError, Dataset};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

/// How to batch and load.
#[derive(Debug, Clone, PartialEq)]
pub struct LoaderConfig {
    /// Examples per batch.
    pub batch_size: usize,
    /// Reshuffle every epoch (seeded by `seed` and the epoch number).
    pub shuffle: bool,
    /// Seed of the shuffle.
    pub seed: u64,
    /// Drop a last, partial batch.
    pub drop_last: bool,
    /// Background threads; 0 loads on the caller's thread.
    pub num_workers: usize,
    /// Batches each worker may have ready ahead of the consumer.
    pub prefetch: usize,
}

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig {
            batch_size: 32,
            shuffle: true,
            seed: 0,
            drop_last: false,
            num_workers: 0,
            prefetch: 2,
        }
    }
}

/// Turns the items of one batch (in plan order) into a batch.
pub type Collate<I, B> = dyn Fn(Vec<I>) -> Result<B, DataError> + Send + Sync;

/// Which part of each epoch's plan a loader delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// Every batch.
    Whole,
    /// Data-parallel training, (rank, world): this rank's part of each global batch.
    Sharded(usize, usize),
    /// Data-parallel evaluation, (rank, world): every world-th batch from `rank` on.
    Strided(usize, usize),
}

/// Batches a dataset, epoch by epoch.
pub struct DataLoader<D: Dataset, B> {
    dataset: Arc<D>,
    collate: Arc<Collate<D::Item, B>>,
    config: LoaderConfig,
    part: Part,
}

impl<D: Dataset + 'static, B: Send + 'static> DataLoader<D, B> {
    /// A loader over `dataset` using `collate`.
    pub fn new(
        dataset: Arc<D>,
        config: LoaderConfig,
        collate: impl Fn(Vec<D::Item>) -> Result<B, DataError> + Send + Sync + 'static,
    ) -> Self {
        DataLoader {
            dataset,
            collate: Arc::new(collate),
            config,
            part: Part::Whole,
        }
    }

    /// The same data and collate function, delivering `part` (whole for one rank).
    fn with_part(&self, part: Part, world: usize) -> Self {
        DataLoader {
            dataset: self.dataset.clone(),
            collate: self.collate.clone(),
            config: self.config.clone(),
            part: if world > 1 { part } else { Part::Whole },
        }
    }

    /// The same data for rank `rank` of `world` evaluating together: batches `rank`,
    /// `rank + world`, … of the plan (the batches themselves unchanged), so the ranks
    /// share the work of one pass and together see every example once.
    pub fn strided(&self, rank: usize, world: usize) -> Self {
        self.with_part(Part::Strided(rank, world), world)
    }

    /// The same data for rank `rank` of `world` data-parallel ranks: each global batch
    /// (`world × batch_size` examples, planned as one process would) split among the
    /// ranks ([`EpochPlan::sharded`]). Shares the dataset and collate function.
    pub fn sharded(&self, rank: usize, world: usize) -> Self {
        self.with_part(Part::Sharded(rank, world), world)
    }

    /// (rank, world) when sharded.
    pub fn shard(&self) -> Option<(usize, usize)> {
        match self.part {
            Part::Sharded(rank, world) => Some((rank, world)),
            _ => None,
        }
    }

    /// Batches per epoch.
    pub fn batches_per_epoch(&self) -> usize {
        self.plan(0).len()
    }

    fn plan(&self, epoch: u64) -> EpochPlan {
        let c = &self.config;
        let len = self.dataset.len();
        let whole = || EpochPlan::new(len, c.batch_size, c.shuffle, c.seed, epoch, c.drop_last);
        match self.part {
            Part::Whole => whole(),
            Part::Strided(rank, world) => whole().strided(rank, world),
            Part::Sharded(rank, world) => EpochPlan::sharded(
                len,
                c.batch_size,
                c.shuffle,
                c.seed,
                epoch,
                c.drop_last,
                rank,
                world,
            ),
        }
    }

    /// The batches of `epoch`.
    pub fn epoch(&self, epoch: u64) -> Batches<B> {
        self.epoch_from(epoch, 0)
    }

    /// The batches of `epoch` from batch `start` on: where a resumed run continues.
    pub fn epoch_from(&self, epoch: u64, start: usize) -> Batches<B> {
        let plan = Arc::new(self.plan(epoch));
        let total = plan.len();
        let workers = self.config.num_workers;
        if workers == 0 {
            let (dataset, collate, p) = (self.dataset.clone(), self.collate.clone(), plan.clone());
            let inline = Box::new(move |i: usize| build(&*dataset, &*collate, p.batch(i), epoch));
            return Batches {
                next: start,
                total,
                plan,
                source: Source::Inline(inline),
            };
        }
        let mut receivers = Vec::with_capacity(workers);
        let mut handles = Vec::with_capacity(workers);
        for w in 0..workers {
            let (tx, rx) = sync_channel(self.config.prefetch.max(1));
            let (dataset, collate, plan) = (self.dataset.clone(), self.collate.clone(), plan.clone());
            let handle = std::thread::Builder::new()
                .name(format!("data-worker-{w}"))
                .spawn(move || {
                    let mut i = start + w;
                    while i < total {
                        if tx
                            .send(build(&*dataset, &*collate, plan.batch(i), epoch))
                            .is_err()
                        {
                            return;
                        }
                        i += workers;
                    }
                })
                .expect("spawn data worker");
            receivers.push(rx);
            handles.push(handle);
        }
        Batches {
            next: start,
            total,
            plan,
            source: Source::Workers {
                receivers,
                start,
                _handles: handles,
            },
        }
    }
}

fn build<D: Dataset, B>(
    dataset: &D,
    collate: &Collate<D::Item, B>,
    indices: &[usize],
    epoch: u64,
) -> Result<B, DataError> {
    let items = indices
        .iter()
        .map(|&i| dataset.get_in_epoch(i, epoch))
        .collect::<Result<Vec<_>, _>>()?;
    collate(items)
}

type InlineFn<B> = Box<dyn FnMut(usize) -> Result<B, DataError> + Send>;

enum Source<B> {
    Inline(InlineFn<B>),
    Workers {
        receivers: Vec<Receiver<Result<B, DataError>>>,
        start: usize,
        _handles: Vec<JoinHandle<()>>,
    },
}

/// An epoch's batches, in order.
pub struct Batches<B> {
    next: usize,
    total: usize,
    plan: Arc<EpochPlan>,
    source: Source<B>,
}

impl<B> Batches<B> {
    /// Batch `i`'s share of its global batch ([`EpochPlan::weight`]; 1 unsharded).
    pub fn weight(&self, i: usize) -> f32 {
        self.plan.weight(i)
    }
}

impl<B> Iterator for Batches<B> {
    type Item = Result<B, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.total {
            return None;
        }
        let i = self.next;
        self.next += 1;
        Some(match &mut self.source {
            Source::Inline(build) => build(i),
            Source::Workers { receivers, start, .. } => {
                let worker = (i - *start) % receivers.len();
                receivers[worker]
                    .recv()
                    .unwrap_or_else(|_| Err(DataError::Batch(format!("data worker {worker} stopped"))))
            }
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.total.saturating_sub(self.next);
        (left, Some(left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    struct Numbers(usize);

    impl Dataset for Numbers {
        type Item = usize;
        fn len(&self) -> usize {
            self.0
        }
        fn get(&self, index: usize) -> Result<usize, DataError> {
            // Uneven work, so workers finish out of order.
            if index < 64 {
                std::thread::sleep(Duration::from_micros((index % 7) as u64 * 200));
            }
            if index == 9999 {
                return Err(DataError::Batch("bad example 9999".into()));
            }
            Ok(index)
        }
    }

    fn loader(workers: usize, len: usize) -> DataLoader<Numbers, Vec<usize>> {
        let config = LoaderConfig {
            batch_size: 4,
            seed: 3,
            num_workers: workers,
            ..Default::default()
        };
        DataLoader::new(Arc::new(Numbers(len)), config, Ok)
    }

    fn collect(b: Batches<Vec<usize>>) -> Vec<Vec<usize>> {
        b.map(Result::unwrap).collect()
    }

    #[test]
    fn workers_deliver_the_same_batches_in_the_same_order() {
        let inline = collect(loader(0, 50).epoch(2));
        assert_eq!(inline.len(), 13);
        for workers in [1, 2, 3] {
            assert_eq!(collect(loader(workers, 50).epoch(2)), inline, "{workers} workers");
        }
    }

    #[test]
    fn resuming_mid_epoch_gives_the_remaining_batches() {
        let full = collect(loader(2, 50).epoch(1));
        assert_eq!(collect(loader(2, 50).epoch_from(1, 5)), full[5..].to_vec());
        assert_eq!(collect(loader(0, 50).epoch_from(1, 5)), full[5..].to_vec());
    }

    #[test]
    fn errors_surface_in_place_and_dropping_stops_workers() {
        let l = loader(2, 10_000);
        let bad_batch = l.plan(0).batch(0).contains(&9999);
        let mut batches = l.epoch(0);
        let first = batches.next().unwrap();
        assert_eq!(first.is_err(), bad_batch);
        drop(batches); // must not hang: workers see closed channels
        let errors = l.epoch(0).filter(Result::is_err).count();
        assert_eq!(errors, 1, "exactly the batch holding example 9999 fails");
    }
}
