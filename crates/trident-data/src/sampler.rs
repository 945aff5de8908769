//! Which examples make up each minibatch of an epoch.

use crate::rng::SplitMix64;

/// The example indices of one epoch, split into batches.
#[derive(Debug, Clone, PartialEq)]
pub struct EpochPlan {
    batches: Vec<Vec<usize>>,
    /// Per batch, its share of the global batch across data-parallel ranks (empty: 1).
    weights: Vec<f32>,
}

impl EpochPlan {
    /// Plans epoch `epoch` of a dataset of `len` examples: a Fisher–Yates shuffle seeded
    /// by (seed, epoch) when `shuffle`, then consecutive batches of `batch_size`; the last
    /// partial batch is kept unless `drop_last`.
    pub fn new(len: usize, batch_size: usize, shuffle: bool, seed: u64, epoch: u64, drop_last: bool) -> Self {
        assert!(batch_size > 0, "batch_size must be > 0");
        let mut order: Vec<usize> = (0..len).collect();
        if shuffle {
            let mut rng = SplitMix64::from_parts(&[seed, epoch]);
            for i in (1..len).rev() {
                order.swap(i, rng.below(i as u64 + 1) as usize);
            }
        }
        let mut batches: Vec<Vec<usize>> = order.chunks(batch_size).map(<[usize]>::to_vec).collect();
        if drop_last && batches.last().is_some_and(|b| b.len() < batch_size) {
            batches.pop();
        }
        EpochPlan {
            batches,
            weights: Vec::new(),
        }
    }

    /// Rank `rank`'s part of epoch `epoch` when `world` data-parallel ranks each take
    /// batches of `batch_size`: the plan of one process with batches of
    /// `world × batch_size` (same seed, same shuffle), each global batch split into `world`
    /// contiguous parts by `trident_dist`'s shard rule (the first `len % world` parts one
    /// example longer). So `world` ranks see exactly the batches one process would, the
    /// parts never overlap and together cover the epoch. A last global batch smaller than
    /// `world` is dropped (some rank would get nothing). Each batch's [`EpochPlan::weight`]
    /// is its share of the global batch.
    #[allow(clippy::too_many_arguments)]
    pub fn sharded(
        len: usize,
        batch_size: usize,
        shuffle: bool,
        seed: u64,
        epoch: u64,
        drop_last: bool,
        rank: usize,
        world: usize,
    ) -> Self {
        assert!(world >= 1 && rank < world, "rank {rank} of {world}");
        let global = EpochPlan::new(len, batch_size * world, shuffle, seed, epoch, drop_last);
        let (mut batches, mut weights) = (Vec::new(), Vec::new());
        for g in global.batches.into_iter().filter(|g| g.len() >= world) {
            let (base, extra) = (g.len() / world, g.len() % world);
            let start = rank * base + rank.min(extra);
            let part = g[start..start + base + usize::from(rank < extra)].to_vec();
            weights.push(part.len() as f32 / g.len() as f32);
            batches.push(part);
        }
        EpochPlan { batches, weights }
    }

    /// Batches `rank`, `rank + world`, … of this plan.
    pub fn strided(self, rank: usize, world: usize) -> Self {
        EpochPlan {
            batches: self
                .batches
                .into_iter()
                .skip(rank)
                .step_by(world.max(1))
                .collect(),
            weights: Vec::new(),
        }
    }

    /// Batch `i`'s share of its global batch (1 without data parallelism): the factor
    /// that turns this rank's mean-loss gradient into its part of the global mean.
    pub fn weight(&self, i: usize) -> f32 {
        self.weights.get(i).copied().unwrap_or(1.0)
    }

    /// Number of batches.
    pub fn len(&self) -> usize {
        self.batches.len()
    }

    /// Whether the epoch has no batch.
    pub fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    /// Indices of batch `i`.
    pub fn batch(&self, i: usize) -> &[usize] {
        &self.batches[i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn covers_every_example_once_and_is_reproducible() {
        let plan = EpochPlan::new(103, 10, true, 42, 0, false);
        assert_eq!(plan.len(), 11);
        let mut all: Vec<usize> = (0..plan.len()).flat_map(|i| plan.batch(i).to_vec()).collect();
        assert_ne!(all, (0..103).collect::<Vec<_>>(), "shuffled");
        all.sort_unstable();
        assert_eq!(all, (0..103).collect::<Vec<_>>());
        assert_eq!(
            plan,
            EpochPlan::new(103, 10, true, 42, 0, false),
            "same seed and epoch, same plan"
        );
        assert_ne!(
            plan,
            EpochPlan::new(103, 10, true, 42, 1, false),
            "each epoch reshuffles"
        );
        assert_ne!(plan, EpochPlan::new(103, 10, true, 43, 0, false));
    }

    #[test]
    fn shards_split_the_single_process_batches_without_overlap() {
        // 103 examples, 3 ranks × 10: the one-process plan has batches of 30.
        let one = EpochPlan::new(103, 30, true, 7, 2, false);
        let parts: Vec<EpochPlan> = (0..3)
            .map(|r| EpochPlan::sharded(103, 10, true, 7, 2, false, r, 3))
            .collect();
        assert!(parts.iter().all(|p| p.len() == one.len()));
        for i in 0..one.len() {
            let joined: Vec<usize> = parts.iter().flat_map(|p| p.batch(i).to_vec()).collect();
            assert_eq!(
                joined,
                one.batch(i),
                "global batch {i} is the ranks' parts in order"
            );
            let w: f32 = parts.iter().map(|p| p.weight(i)).sum();
            assert!((w - 1.0).abs() < 1e-6);
        }
        // The last global batch has 13: parts of 5, 4, 4.
        let last = one.len() - 1;
        assert_eq!(
            parts.iter().map(|p| p.batch(last).len()).collect::<Vec<_>>(),
            [5, 4, 4]
        );
        assert_eq!(parts[0].weight(last), 5.0 / 13.0);
        assert_eq!(parts[1].weight(0), 1.0 / 3.0);
        // Another epoch reshuffles; a global remainder smaller than the world is dropped.
        assert_ne!(
            EpochPlan::sharded(103, 10, true, 7, 3, false, 0, 3).batch(0),
            parts[0].batch(0)
        );
        let tiny = EpochPlan::sharded(31, 10, false, 0, 0, false, 2, 3);
        assert_eq!(tiny.len(), 1, "the 1 example left over is dropped");
        assert_eq!(tiny.batch(0), &(20..30).collect::<Vec<_>>()[..]);
        assert_eq!(EpochPlan::new(5, 2, false, 0, 0, false).weight(0), 1.0);
        // Evaluation: every world-th batch, unchanged.
        let all = EpochPlan::new(25, 4, false, 0, 0, false);
        let mine = all.clone().strided(1, 3);
        assert_eq!(mine.len(), 2);
        assert_eq!((mine.batch(0), mine.batch(1)), (all.batch(1), all.batch(4)));
    }

    #[test]
    fn drop_last_and_no_shuffle() {
        let plan = EpochPlan::new(25, 10, false, 0, 0, true);
        assert_eq!(plan.len(), 2);
        assert_eq!(plan.batch(1), &(10..20).collect::<Vec<_>>()[..]);
    }
}

/// Splits `0..len` into seeded, disjoint train / validation / test index sets with the
/// given validation and test fractions (each rounded down, train takes the rest).
pub fn split_indices(len: usize, val: f64, test: f64, seed: u64) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
    let mut idx: Vec<usize> = (0..len).collect();
    let mut rng = crate::rng::SplitMix64::from_parts(&[seed, 0x5EED_5B17]);
    for i in (1..len).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        idx.swap(i, j);
    }
    let n_val = (len as f64 * val).floor() as usize;
    let n_test = (len as f64 * test).floor() as usize;
    let test_set = idx.split_off(len - n_test);
    let val_set = idx.split_off(len - n_test - n_val);
    (idx, val_set, test_set)
}

/// Like [`split_indices`], but within each class: class `k`'s examples (those with
/// `labels[i] == k`) are shuffled by (seed, k) and split by the fractions (each rounded to
/// the nearest count, and never all of a class in the held-out sets), so every split keeps
/// the class proportions — scikit-learn's `train_test_split(stratify=y)`. The returned
/// index lists are sorted.
pub fn stratified_split(
    labels: &[usize],
    val: f64,
    test: f64,
    seed: u64,
) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
    let classes = labels.iter().max().map_or(0, |&m| m + 1);
    let mut by_class: Vec<Vec<usize>> = vec![Vec::new(); classes];
    for (i, &l) in labels.iter().enumerate() {
        by_class[l].push(i);
    }
    let (mut tr, mut va, mut te) = (Vec::new(), Vec::new(), Vec::new());
    for (k, mut idx) in by_class.into_iter().enumerate() {
        let mut rng = crate::rng::SplitMix64::from_parts(&[seed, 0x5742_A71F, k as u64]);
        for i in (1..idx.len()).rev() {
            idx.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let n = idx.len();
        let n_test = ((n as f64 * test).round() as usize).min(n.saturating_sub(1));
        let n_val = ((n as f64 * val).round() as usize).min(n.saturating_sub(1 + n_test));
        te.extend(idx.drain(n - n_test..));
        va.extend(idx.drain(n - n_test - n_val..));
        tr.extend(idx);
    }
    for s in [&mut tr, &mut va, &mut te] {
        s.sort_unstable();
    }
    (tr, va, te)
}

/// The examples of a dataset at chosen indices.
pub struct Subset<D> {
    inner: std::sync::Arc<D>,
    indices: Vec<usize>,
}

impl<D> Subset<D> {
    /// Examples `indices` of `inner`.
    pub fn new(inner: std::sync::Arc<D>, indices: Vec<usize>) -> Self {
        Subset { inner, indices }
    }

    /// The index in the underlying dataset of example `i`.
    pub fn inner_index(&self, i: usize) -> usize {
        self.indices[i]
    }
}

impl<D: crate::Dataset> crate::Dataset for Subset<D> {
    type Item = D::Item;
    fn len(&self) -> usize {
        self.indices.len()
    }
    fn get(&self, index: usize) -> Result<D::Item, crate::DataError> {
        self.inner.get(self.indices[index])
    }
    fn get_in_epoch(&self, index: usize, epoch: u64) -> Result<D::Item, crate::DataError> {
        self.inner.get_in_epoch(self.indices[index], epoch)
    }
}

#[cfg(test)]
mod split_tests {
    use super::*;

    #[test]
    fn splits_are_disjoint_complete_and_seeded() {
        let (a, b, c) = split_indices(103, 0.1, 0.2, 4);
        assert_eq!((a.len(), b.len(), c.len()), (73, 10, 20));
        let mut all: Vec<usize> = a.iter().chain(&b).chain(&c).copied().collect();
        all.sort();
        assert_eq!(all, (0..103).collect::<Vec<_>>());
        assert_eq!(split_indices(103, 0.1, 0.2, 4), (a.clone(), b, c));
        assert_ne!(split_indices(103, 0.1, 0.2, 5).0, a);
    }

    #[test]
    fn stratified_splits_keep_each_class_in_proportion() {
        // Three classes of different sizes, interleaved.
        let labels: Vec<usize> = (0..100)
            .map(|i| {
                if i % 10 == 9 {
                    2
                } else if i % 3 == 0 {
                    1
                } else {
                    0
                }
            })
            .collect();
        let count = |s: &[usize], k: usize| s.iter().filter(|&&i| labels[i] == k).count();
        let (a, b, c) = stratified_split(&labels, 0.1, 0.2, 3);
        let per = |s: &[usize]| (0..3).map(|k| count(s, k)).collect::<Vec<_>>();
        let total = per(&(0..100).collect::<Vec<_>>());
        assert_eq!(
            per(&c),
            total
                .iter()
                .map(|&n| (n as f64 * 0.2).round() as usize)
                .collect::<Vec<_>>()
        );
        assert_eq!(
            per(&b),
            total
                .iter()
                .map(|&n| (n as f64 * 0.1).round() as usize)
                .collect::<Vec<_>>()
        );
        let mut all: Vec<usize> = a.iter().chain(&b).chain(&c).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..100).collect::<Vec<_>>(), "disjoint and complete");
        assert_eq!(stratified_split(&labels, 0.1, 0.2, 3), (a.clone(), b, c.clone()));
        assert_ne!(
            stratified_split(&labels, 0.1, 0.2, 4).2,
            c,
            "another seed, another split"
        );
        // A class of one example stays in training.
        let (a, _, c) = stratified_split(&[0, 0, 0, 0, 1], 0.0, 0.5, 0);
        assert!(a.contains(&4) && c.len() == 2);
    }
}
