//! Which examples make up each minibatch of an epoch.

use crate::rng::SplitMix64;

/// The example indices of one epoch, split into batches.
#[derive(Debug, Clone, PartialEq)]
pub struct EpochPlan {
    batches: Vec<Vec<usize>>,
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
        EpochPlan { batches }
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
}
