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

use candle_core::{Device, Tensor};
use std::time::Instant;
use trident_nn::vision::{Cnn, Vit, VitConfig};
use trident_nn::{ops, Ctx, Params};
use trident_train::optim::{Optimizer, OptimizerConfig};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

enum Net {
    Cnn(Cnn),
    Vit(Vit),
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let kind = args.get(1).map(String::as_str).unwrap_or("cnn");
    let steps: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(20);
    let batch: usize = std::env::var("BATCH").map_or(Ok(64), |v| v.parse())?;
    let bf16 = std::env::var("PRECISION").is_ok_and(|v| v == "bf16");
    let _autocast = trident_nn::bf16::autocast(bf16);
    eprintln!(
        "{kind}, precision: {}",
        if bf16 {
            format!("bf16 mixed ({})", trident_nn::bf16::mixed_precision())
        } else {
            "f32".into()
        }
    );
    trident_nn::runtime::keep_freed_memory();
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
    let (mut fw, mut bw, mut op) = (Vec::new(), Vec::new(), Vec::new());
    let mut g: Vec<Vec<f32>> = trainable.iter().map(|p| vec![0f32; p.var.elem_count()]).collect();
    for step in 0..steps + 1 {
        let t0 = Instant::now();
        params.begin_step();
        let ctx = Ctx::train(0, step as u64);
        let logits = match &net {
            Net::Cnn(m) => m.forward(&x, &ctx)?,
            Net::Vit(m) => m.forward(&x, &ctx)?,
        };
        let loss = ops::cross_entropy(&logits, &labels)?;
        let t1 = Instant::now();
        let grads = loss.backward()?;
        for (g, p) in g.iter_mut().zip(&trainable) {
            params.gradient_into(&grads, p, g, false)?;
        }
        let t2 = Instant::now();
        opt.step(&trainable, &g, 1e-3)?;
        let t3 = Instant::now();
        eprintln!(
            "step {step}: loss {:.6}  forward {:.1} ms  backward {:.1} ms  optimizer {:.1} ms",
            loss.to_scalar::<f32>()?,
            ms(t1 - t0),
            ms(t2 - t1),
            ms(t3 - t2)
        );
        if step > 0 {
            fw.push(ms(t1 - t0));
            bw.push(ms(t2 - t1));
            op.push(ms(t3 - t2));
        }
    }
    let (f, b_, o) = (median(&mut fw), median(&mut bw), median(&mut op));
    let peak = trident_train::monitor::peak_rss_bytes().unwrap_or(0) as f64 / (1 << 20) as f64;
    println!(
        "trident {kind} median over {steps} steps: forward {f:.1} ms  backward {b_:.1} ms  optimizer {o:.1} ms  step {:.1} ms  batch {batch}  peak RSS {peak:.0} MiB",
        f + b_ + o
    );
    Ok(())
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
