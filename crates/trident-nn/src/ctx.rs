//! What a forward pass is given besides its input. Its own module, below [`crate::layers`]
//! (which re-exports it) and the custom-layer registry, because both take it.

use crate::ops;

/// What a forward pass needs besides its input: training or evaluation, and the seed of
/// this step's dropout masks (derived from the run seed and the step number, so a resumed
/// run draws the same masks as an uninterrupted one).
#[derive(Debug, Clone, Copy)]
pub struct Ctx {
    /// Dropout active, batch norm on batch statistics.
    pub train: bool,
    /// Seed of this step's random draws.
    pub seed: u64,
}

impl Ctx {
    /// Evaluation: no dropout, batch norm on running statistics.
    pub fn eval() -> Self {
        Ctx {
            train: false,
            seed: 0,
        }
    }

    /// Training step `step` of a run seeded with `seed`.
    pub fn train(seed: u64, step: u64) -> Self {
        Ctx {
            train: true,
            seed: ops::splitmix(seed ^ ops::splitmix(step)),
        }
    }
}
