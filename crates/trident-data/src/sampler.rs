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
