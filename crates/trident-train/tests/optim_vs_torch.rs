//! Fused and unfused AdamW, SGD (momentum, Nesterov) and RMSprop against `torch.optim` over three
//! steps with the same gradients. Fixture: trident-nn/tests/fixtures/make_reference.py.

use candle_core::{Device, Tensor};
use std::collections::HashMap;
use trident_nn::{Init, Loaded, Params};
use trident_train::optim::{Optimizer, OptimizerConfig};

fn reference() -> HashMap<String, Tensor> {
    let f = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../trident-nn/tests/fixtures/optim_reference.safetensors");
    candle_core::safetensors::load(f, &Device::Cpu).unwrap()
}

#[test]
fn adamw_sgd_and_rmsprop_match_torch_optim_over_three_steps() {
    let r = reference();
    let v = |t: &Tensor| t.to_vec1::<f32>().unwrap();
    let adamw = |fused| OptimizerConfig::Adamw {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.1,
        fused,
    };
    let cases = [
        ("adamw", adamw(true), 0.01),
        ("adamw", adamw(false), 0.01),
        (
            "sgd",
            OptimizerConfig::Sgd {
                momentum: 0.9,
                weight_decay: 0.01,
                nesterov: false,
            },
            0.05,
        ),
        (
            "nesterov",
            OptimizerConfig::Sgd {
                momentum: 0.9,
                weight_decay: 0.0,
                nesterov: true,
            },
            0.05,
        ),
        (
            "rmsprop",
            OptimizerConfig::Rmsprop {
                alpha: 0.99,
                eps: 1e-8,
                weight_decay: 0.0,
                momentum: 0.0,
            },
            0.01,
        ),
        (
            "rmsprop_momentum",
            OptimizerConfig::Rmsprop {
                alpha: 0.9,
                eps: 1e-6,
                weight_decay: 0.01,
                momentum: 0.5,
            },
            0.01,
        ),
    ];
    for (name, config, lr) in cases {
        let params = Params::new();
        let mut w0 = HashMap::new();
        w0.insert("w".to_string(), r["w0"].clone());
        params
            .builder(0, Some(Loaded::from_tensors(w0, "w0")))
            .get(7, "w", Init::Zeros)
            .unwrap();
        let mut opt = Optimizer::new(config);
        for i in 0..3 {
            opt.step(&params.trainable(), &[v(&r[&format!("g{i}")])], lr)
                .unwrap();
        }
        let got = v(params.get("w").unwrap().var.as_tensor());
        let want = v(&r[&format!("{name}.w3")]);
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() < 1e-6, "{name}: {got:?} vs torch {want:?}");
        }
    }
}
