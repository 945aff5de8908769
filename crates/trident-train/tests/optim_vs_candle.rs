//! The fused AdamW against candle-nn's AdamW (a chain of tensor operations) over five steps
//! on parameters of several shapes with changing learning rates: the unfused path
//! (`fused = false`) must give candle-nn's bits exactly, the fused pass the same values
//! within 1e-6. The unfused state also survives a checkpoint round trip.

use candle_core::{Device, Tensor, Var};
use candle_nn::Optimizer as _;
use trident_nn::{Init, Params};
use trident_train::optim::{Optimizer, OptimizerConfig};

const SHAPES: [&[usize]; 3] = [&[37], &[16, 33], &[3, 5, 70]];

fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0
        })
        .collect()
}

fn params() -> Params {
    let p = Params::new();
    let b = p.builder(3, None);
    for (i, s) in SHAPES.iter().enumerate() {
        b.get(s.to_vec(), &format!("w{i}"), Init::Normal(0.5)).unwrap();
    }
    p
}

fn grads(step: u64) -> Vec<Vec<f32>> {
    SHAPES
        .iter()
        .enumerate()
        .map(|(i, s)| noise(s.iter().product(), 100 * step + i as u64))
        .collect()
}

fn values(p: &Params) -> Vec<Vec<f32>> {
    p.trainable()
        .iter()
        .map(|q| q.var.as_tensor().flatten_all().unwrap().to_vec1().unwrap())
        .collect()
}

fn adamw(fused: bool) -> OptimizerConfig {
    OptimizerConfig::Adamw {
        beta1: 0.9,
        beta2: 0.98,
        eps: 1e-6,
        weight_decay: 0.05,
        fused,
    }
}

const LRS: [f64; 5] = [1e-3, 3e-3, 2e-3, 1e-3, 5e-4];

/// candle-nn's AdamW on copies of the same initial weights.
fn candle_nn_run() -> Vec<Vec<f32>> {
    let p = params();
    let vars: Vec<Var> = p
        .trainable()
        .iter()
        .map(|q| Var::from_tensor(&q.var.as_tensor().copy().unwrap()).unwrap())
        .collect();
    let mut opt = candle_nn::AdamW::new(
        vars.clone(),
        candle_nn::ParamsAdamW {
            lr: LRS[0],
            beta1: 0.9,
            beta2: 0.98,
            eps: 1e-6,
            weight_decay: 0.05,
        },
    )
    .unwrap();
    for (step, lr) in LRS.iter().enumerate() {
        let mut store = candle_core::backprop::GradStore::default();
        for (v, g) in vars.iter().zip(grads(step as u64)) {
            store.insert(
                v.as_tensor(),
                Tensor::from_vec(g, v.shape(), &Device::Cpu).unwrap(),
            );
        }
        opt.set_learning_rate(*lr);
        opt.step(&store).unwrap();
    }
    vars.iter()
        .map(|v| v.as_tensor().flatten_all().unwrap().to_vec1().unwrap())
        .collect()
}

fn ours(fused: bool, checkpoint_after: Option<usize>) -> Vec<Vec<f32>> {
    let p = params();
    let mut opt = Optimizer::new(adamw(fused));
    for (step, lr) in LRS.iter().enumerate() {
        opt.step(&p.trainable(), &grads(step as u64), *lr).unwrap();
        if checkpoint_after == Some(step) {
            // What a checkpoint keeps, loaded into a fresh optimizer.
            let state = opt.state_tensors().unwrap();
            opt = Optimizer::new(adamw(fused));
            opt.load_state(&state, step as u64 + 1).unwrap();
        }
    }
    values(&p)
}

#[test]
fn fused_adamw_matches_candle_nn() {
    let reference = candle_nn_run();
    assert_eq!(
        ours(false, None),
        reference,
        "the unfused path differs from candle-nn"
    );
    assert_eq!(ours(false, Some(1)), reference, "unfused, resumed from its state");
    for (got, want) in ours(true, None).iter().zip(&reference) {
        let d = trident_nn::math::max_abs_diff(got, want);
        assert!(d <= 1e-6, "fused vs candle-nn: max difference {d}");
    }
    assert_eq!(
        ours(true, Some(2)),
        ours(true, None),
        "fused, resumed from its state"
    );
}

#[test]
fn a_scaled_step_is_the_step_on_gradients_scaled_first_to_the_bit() {
    // Gradient clipping's coefficient applied as the optimizer reads the gradients (fused
    // AdamW in its pass, the others from a scaled copy) against scaling them in place first,
    // for every optimizer kind; and scale 1 is the plain step.
    let sgd = OptimizerConfig::Sgd {
        momentum: 0.9,
        weight_decay: 0.01,
        nesterov: false,
    };
    for config in [adamw(true), adamw(false), sgd] {
        let run = |scaled_inside: bool, scale: f32| {
            let p = params();
            let mut opt = Optimizer::new(config.clone());
            for (step, lr) in LRS.iter().enumerate() {
                let mut g = grads(step as u64);
                if scaled_inside {
                    opt.step_scaled(&p.trainable(), &g, *lr, scale).unwrap();
                } else {
                    g.iter_mut().for_each(|g| g.iter_mut().for_each(|x| *x *= scale));
                    opt.step(&p.trainable(), &g, *lr).unwrap();
                }
            }
            values(&p)
        };
        let bits = |v: Vec<Vec<f32>>| v.concat().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(run(true, 0.37)), bits(run(false, 0.37)), "{config:?}");
        assert_eq!(bits(run(true, 1.0)), bits(run(false, 1.0)), "{config:?}");
        assert_ne!(
            bits(run(true, 0.37)),
            bits(run(true, 1.0)),
            "{config:?}: the scale is used"
        );
    }
}
