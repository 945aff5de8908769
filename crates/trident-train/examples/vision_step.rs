//! One training step of the Fashion-MNIST CNN or ViT (`examples/fashion/cnn.toml`,
//! `vit.toml`: the same sizes and dropout) at batch 64, timed per phase (forward, backward,
//! AdamW), on fixed pseudo-random images. The PyTorch peer is
//! `benches/peers/torch_vision_step.py` (the same networks, eager or `torch.compile`). Not
//! a test: run it on a quiet machine.
//!
//!     cargo run --release -p trident-train --example vision_step -- cnn 20
//!     cargo run --release -p trident-train --example vision_step -- vit 20
//!     PRECISION=bf16 cargo run …  # bf16 mixed precision (`trident_nn::bf16::autocast`)
//!     BATCH=256 cargo run …       # another batch size
//!
//! Lines are those of `minilm_step` (`step N: loss … forward F ms backward B ms optimizer O
//! ms`), so `benches/step_ab.sh` interleaves both with their peers; the last line gives the
//! process's peak resident memory (VmHWM).

mod common;

use candle_core::{Device, Tensor};
use trident_nn::vision::{Cnn, Vit, VitConfig};
use trident_nn::{ops, Ctx, Params};
use trident_train::optim::{Optimizer, OptimizerConfig};

enum Net {
    Cnn(Cnn),
    Vit(Vit),
}

fn main() -> anyhow::Result<()> {
    // As `trident` runs (CANDLE_NUM_THREADS=2 or more to compare), the loop on the pool.
    trident_nn::runtime::candle_on_one_thread();
    trident_nn::runtime::keep_freed_memory();
    trident_nn::runtime::on_pool(run)
}

fn run() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let kind = args.get(1).map(String::as_str).unwrap_or("cnn");
    let steps: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(20);
    let batch: usize = std::env::var("BATCH").map_or(Ok(64), |v| v.parse())?;
    let _precision = common::precision_from_env();
    let params = Params::new();
    let pb = params.builder(0, None);
    let net = match kind {
        "cnn" => Net::Cnn(Cnn::new(&pb, 1, 28, 32, 10, 0.25)?),
        "vit" => Net::Vit(Vit::new(
            &pb,
            &VitConfig {
                image_size: 28,
                channels: 1,
                patch_size: 4,
                hidden: 64,
                layers: 4,
                heads: 4,
                mlp: 128,
                dropout: 0.1,
            },
            10,
        )?),
        other => anyhow::bail!("unknown network {other:?}: cnn or vit"),
    };
    // The same images and labels as the PyTorch script: a fixed pattern, not data.
    let pixels: Vec<f32> = (0..batch * 28 * 28)
        .map(|k| ((k * 7919) % 1013) as f32 / 1013.0 - 0.5)
        .collect();
    let x = Tensor::from_vec(pixels, (batch, 1, 28, 28), &Device::Cpu)?;
    let labels = Tensor::from_iter((0..batch as u32).map(|i| i % 10), &Device::Cpu)?;
    let trainable = params.trainable();
    let n_params: usize = trainable.iter().map(|p| p.var.elem_count()).sum();
    eprintln!("{n_params} parameters, batch {batch}");
    let mut opt = Optimizer::new(OptimizerConfig::Adamw {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        fused: true,
    });
    let mut g: Vec<Vec<f32>> = trainable.iter().map(|p| vec![0f32; p.var.elem_count()]).collect();
    common::run(&format!("trident {kind}"), steps, batch, |step, clock| {
        params.begin_step();
        let ctx = Ctx::train(0, step as u64);
        let logits = match &net {
            Net::Cnn(m) => m.forward(&x, &ctx)?,
            Net::Vit(m) => m.forward(&x, &ctx)?,
        };
        let loss = ops::cross_entropy(&logits, &labels)?;
        clock.mark();
        let grads = loss.backward()?;
        for (g, p) in g.iter_mut().zip(&trainable) {
            params.gradient_into(&grads, p, g, false)?;
        }
        clock.mark();
        opt.step(&trainable, &g, 1e-3)?;
        clock.mark();
        Ok(loss.to_scalar::<f32>()?)
    })
}
