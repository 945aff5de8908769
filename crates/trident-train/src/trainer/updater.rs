//! The optimizer side of a training step: gradients gathered and summed over a group of
//! micro-batches, exchanged between data-parallel ranks, averaged and clipped, then one
//! update at the schedule's learning rate, by the optimizer or by ZeRO-1's sharded one.
//!
//! A task with two models (a GAN's generator and discriminator) keeps one [`Updater`] per
//! model; each checkpoints its own optimizer state.

use super::{human_bytes, TrainConfig, TrainError};
use crate::ddp::{DataParallel, Zero1};
use crate::optim::{clip_coefficient, Optimizer, Schedule};
use candle_core::backprop::GradStore;
use trident_nn::{Param, Params};

/// Accumulated gradients of one parameter set and what updates it.
pub struct Updater {
    params: Vec<Param>,
    acc: Vec<Vec<f32>>,
    /// The flattened buffer the data-parallel all-reduce reuses.
    flat: Vec<f32>,
    optimizer: Optimizer,
    /// ZeRO-1: this rank keeps only its shard of the optimizer state.
    zero: Option<Zero1>,
    schedule: Schedule,
    max_grad_norm: Option<f64>,
    /// The global gradient norm before clipping of the last update, when it clipped.
    norm: Option<f64>,
    /// Micro-batches gathered since the last update.
    gathered: u64,
}

impl Updater {
    /// An updater of `store`'s trainable parameters over `total_steps` optimizer steps, with
    /// `config`'s optimizer, schedule and clipping; ZeRO-1 when `dp` asks for it.
    pub fn new(
        store: &Params,
        config: &TrainConfig,
        total_steps: u64,
        dp: Option<&DataParallel>,
        progress: bool,
    ) -> Result<Self, TrainError> {
        Self::of(store.trainable(), config, total_steps, dp, progress)
    }

    /// An updater of `params` (one group of a model's parameters, such as a GAN's
    /// generator; the others get updaters of their own).
    pub fn of(
        params: Vec<Param>,
        config: &TrainConfig,
        total_steps: u64,
        dp: Option<&DataParallel>,
        progress: bool,
    ) -> Result<Self, TrainError> {
        if params.is_empty() {
            return Err(TrainError::Invalid(
                "the model has no trainable parameters".into(),
            ));
        }
        let zero = match dp {
            Some(d) if d.zero => {
                let z = Zero1::new(&params, d, &config.optimizer)?;
                if progress {
                    let full = z.unsharded_state_bytes();
                    eprintln!(
                        "ZeRO-1: rank {} updates {} of {} parameter values; optimizer state {} on this rank, {} unsharded ({:.1} %)",
                        d.rank(),
                        z.shard_len(),
                        z.total_len(),
                        human_bytes(z.state_bytes()),
                        human_bytes(full),
                        100.0 * z.state_bytes() as f64 / full.max(1) as f64
                    );
                }
                Some(z)
            }
            _ => None,
        };
        Ok(Updater {
            acc: params.iter().map(|p| vec![0f32; p.var.elem_count()]).collect(),
            params,
            flat: Vec::new(),
            optimizer: Optimizer::new(config.optimizer.clone()),
            zero,
            schedule: Schedule {
                lr: config.lr,
                warmup: config.warmup_steps,
                total: total_steps,
                decay: config.decay,
            },
            max_grad_norm: config.max_grad_norm,
            norm: None,
            gathered: 0,
        })
    }

    /// Adds one micro-batch's gradients (the first of a group overwrites the sums).
    pub fn gather(&mut self, store: &Params, grads: &GradStore) -> Result<(), TrainError> {
        let add = self.gathered > 0;
        for (a, p) in self.acc.iter_mut().zip(&self.params) {
            store.gradient_into(grads, p, a, add)?;
        }
        self.gathered += 1;
        Ok(())
    }

    /// The parameters it updates.
    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// Micro-batches gathered since the last update.
    pub fn gathered(&self) -> u64 {
        self.gathered
    }

    /// Sums the gathered gradients over the ranks (with ZeRO-1, each rank receives the sum
    /// of its own shard only).
    pub fn exchange(&mut self, d: &DataParallel) -> Result<(), TrainError> {
        match self.zero.as_mut() {
            Some(z) => z.reduce_scatter(d, &mut self.acc),
            None => d.all_reduce_grads(&mut self.acc, &mut self.flat),
        }
    }

    /// The learning rate of optimizer step `step` (0-based).
    pub fn lr(&self, step: u64) -> f64 {
        self.schedule.lr(step)
    }

    /// Averages the gathered gradients over their micro-batches, clips them and takes
    /// optimizer step `step` (0-based, the number of updates before this one); returns
    /// its learning rate.
    pub fn update(&mut self, dp: Option<&DataParallel>, step: u64) -> Result<f64, TrainError> {
        let lr = self.schedule.lr(step);
        let n = self.gathered;
        match (self.zero.as_mut(), dp) {
            (Some(z), Some(d)) => {
                if n > 1 {
                    z.scale(&mut self.acc, 1.0 / n as f32);
                }
                // Clipping's coefficient, applied as the shard's update reads the gradients.
                let mut scale = 1.0;
                if let Some(max) = self.max_grad_norm {
                    let (norm, coef) = z.clip_coefficient(d, &self.acc, max)?;
                    self.norm = Some(norm);
                    scale = coef;
                }
                z.step(d, &self.params, &self.acc, lr, step + 1, scale)?;
            }
            _ => {
                if n > 1 {
                    let scale = 1.0 / n as f32;
                    self.acc.iter_mut().for_each(|a| crate::optim::scale(a, scale));
                }
                // Clipping's coefficient, applied as the optimizer reads the gradients.
                let mut scale = 1.0;
                if let Some(max) = self.max_grad_norm {
                    let (norm, coef) = clip_coefficient(&self.acc, max);
                    self.norm = Some(norm);
                    scale = coef;
                }
                self.optimizer.step_scaled(&self.params, &self.acc, lr, scale)?;
            }
        }
        self.gathered = 0;
        Ok(lr)
    }

    /// The global norm of the averaged gradients before clipping, of the last update, when
    /// the run clips (`max_grad_norm`; the norm costs a pass over the gradients, so it is
    /// not computed otherwise).
    pub fn grad_norm(&self) -> Option<f64> {
        self.norm
    }

    /// The optimizer (its state is checkpointed unless ZeRO-1 shards it).
    pub fn optimizer(&self) -> &Optimizer {
        &self.optimizer
    }

    /// Mutable, to load a checkpoint's state.
    pub fn optimizer_mut(&mut self) -> &mut Optimizer {
        &mut self.optimizer
    }

    /// ZeRO-1's sharded state, when it is on.
    pub fn zero(&self) -> Option<&Zero1> {
        self.zero.as_ref()
    }

    /// Mutable, to load a checkpoint's shard.
    pub fn zero_mut(&mut self) -> Option<&mut Zero1> {
        self.zero.as_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optim::OptimizerConfig;
    use trident_nn::Init;
    use trident_nn::{Device, Tensor};

    fn config(max_grad_norm: Option<f64>) -> TrainConfig {
        let mut c: TrainConfig = serde_json::from_str(r#"{"epochs": 1, "lr": 0.5}"#).unwrap();
        c.optimizer = OptimizerConfig::Sgd {
            momentum: 0.0,
            weight_decay: 0.0,
            nesterov: false,
        };
        c.max_grad_norm = max_grad_norm;
        c
    }

    /// A micro-batch whose loss is Σ wᵢ·gᵢ: its gradient is `g`.
    fn gather(u: &mut Updater, store: &Params, w: &Tensor, g: &[f32]) {
        store.begin_step();
        let g = Tensor::new(g, &Device::Cpu).unwrap();
        let grads = (w * g).unwrap().sum_all().unwrap().backward().unwrap();
        u.gather(store, &grads).unwrap();
    }

    #[test]
    fn a_group_of_micro_batches_takes_one_step_on_their_mean_gradient() {
        let store = Params::new();
        let w = store.builder(0, None).get(3, "w", Init::Ones).unwrap();
        let mut u = Updater::new(&store, &config(None), 10, None, false).unwrap();
        gather(&mut u, &store, &w, &[1.0, 2.0, 3.0]);
        gather(&mut u, &store, &w, &[3.0, 2.0, 1.0]);
        assert_eq!(u.gathered(), 2);
        assert_eq!(u.update(None, 0).unwrap(), 0.5);
        assert_eq!(u.gathered(), 0);
        // w − 0.5 · mean(g) = 1 − 0.5 · 2 = 0 everywhere.
        assert_eq!(w.to_vec1::<f32>().unwrap(), [0.0, 0.0, 0.0]);
        // The next group overwrites the sums rather than adding to the last one's.
        gather(&mut u, &store, &w, &[2.0, 0.0, 0.0]);
        u.update(None, 1).unwrap();
        assert_eq!(w.to_vec1::<f32>().unwrap(), [-1.0, 0.0, 0.0]);
    }

    #[test]
    fn the_averaged_gradient_is_clipped_to_the_global_norm() {
        let store = Params::new();
        let w = store.builder(0, None).get(2, "w", Init::Zeros).unwrap();
        let mut u = Updater::new(&store, &config(Some(1.0)), 10, None, false).unwrap();
        gather(&mut u, &store, &w, &[6.0, 8.0]);
        gather(&mut u, &store, &w, &[6.0, 8.0]);
        assert_eq!(u.grad_norm(), None);
        u.update(None, 0).unwrap();
        // mean (6, 8) has norm 10, clipped to 1: (0.6, 0.8); times lr 0.5.
        assert_eq!(u.grad_norm(), Some(10.0));
        let got = w.to_vec1::<f32>().unwrap();
        assert!(
            (got[0] + 0.3).abs() < 1e-6 && (got[1] + 0.4).abs() < 1e-6,
            "{got:?}"
        );
    }

    #[test]
    fn a_model_without_trainable_parameters_is_refused() {
        let store = Params::new();
        let err = Updater::new(&store, &config(None), 1, None, false).err().unwrap();
        assert!(err.to_string().contains("no trainable parameters"), "{err}");
    }
}
