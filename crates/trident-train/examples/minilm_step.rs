//! One MiniLM + classification-head training step at batch 16 × sequence 64, timed per phase
//! (forward, backward, optimizer). The PyTorch peer is `benches/peers/torch_minilm_step.py`;
//! both use the same weights, token ids and labels. Not a test: run it on a quiet machine.
//!
//!     cargo run --release -p trident-train --example minilm_step -- data/minilm 10
//!     ADAMW=unfused cargo run …   # candle-nn's AdamW op chain instead of the fused pass
//!     PRECISION=bf16 cargo run …  # bf16 mixed precision (`trident_nn::bf16::autocast`)
//!     BATCH=64 cargo run …        # another batch size (sequence stays 64)
//!
//! The last line also gives the process's peak resident memory (VmHWM).

use candle_core::{Device, Tensor};
use std::time::Instant;
use trident_nn::bert::{load_bert_weights, BertClassifier, BertConfig, Pooling, TextBatch};
use trident_nn::{ops, Ctx, Params};
use trident_train::optim::{Optimizer, OptimizerConfig};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(args.get(1).map(String::as_str).unwrap_or("data/minilm"));
    let steps: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(10);
    let batch: usize = std::env::var("BATCH").map_or(Ok(16), |v| v.parse())?;
    let seq = 64usize;
    let bf16 = std::env::var("PRECISION").is_ok_and(|v| v == "bf16");
    let _autocast = trident_nn::bf16::autocast(bf16);
    eprintln!(
        "precision: {}",
        if bf16 {
            format!("bf16 mixed ({})", trident_nn::bf16::mixed_precision())
        } else {
            "f32".into()
        }
    );
    trident_nn::runtime::keep_freed_memory();
    eprintln!("GEMM: {}", trident_nn::blas::backend());
    let mut config = BertConfig::read(&dir.join("config.json"))?;
    // A training step as the PyTorch script runs it: train mode, dropout off.
    config.hidden_dropout_prob = 0.0;
    config.attention_probs_dropout_prob = 0.0;
    let params = Params::new();
    let model = BertClassifier::new(
        &params.builder(0, Some(load_bert_weights(&dir)?)),
        &config,
        3,
        Pooling::Cls,
    )?;
    // The same ids and labels as the PyTorch script.
    let ids: Vec<u32> = (0..batch * seq)
        .map(|k| ((k / seq) * 131 + (k % seq) * 17) as u32 % 28000 + 1000)
        .collect();
    let b = TextBatch::new(ids, vec![0; batch * seq], vec![1; batch * seq], batch, seq)?;
    let labels = Tensor::from_iter((0..batch as u32).map(|i| i % 3), &Device::Cpu)?;
    let trainable = params.trainable();
    // ADAMW=unfused: candle-nn's chain of tensor ops instead of the fused pass.
    let fused = std::env::var("ADAMW").map_or(true, |v| v != "unfused");
    eprintln!(
        "AdamW: {}",
        if fused {
            "fused"
        } else {
            "unfused (candle-nn's ops)"
        }
    );
    let mut opt = Optimizer::new(OptimizerConfig::Adamw {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        fused,
    });
    let (mut fw, mut bw, mut op) = (Vec::new(), Vec::new(), Vec::new());
    let mut g: Vec<Vec<f32>> = trainable.iter().map(|p| vec![0f32; p.var.elem_count()]).collect();
    for step in 0..steps + 1 {
        let t0 = Instant::now();
        params.begin_step();
        let logits = model.forward(&b, &Ctx::train(0, step as u64))?;
        let loss = ops::cross_entropy(&logits, &labels)?;
        let t1 = Instant::now();
        let grads = loss.backward()?;
        // Into buffers kept across steps, as the trainer does.
        for (g, p) in g.iter_mut().zip(&trainable) {
            params.gradient_into(&grads, p, g, false)?;
        }
        let t2 = Instant::now();
        opt.step(&trainable, &g, 2e-5)?;
        let t3 = Instant::now();
        eprintln!(
            "step {step}: loss {:.6}  forward {:.0} ms  backward {:.0} ms  optimizer {:.0} ms",
            loss.to_scalar::<f32>()?,
            ms(t1 - t0),
            ms(t2 - t1),
            ms(t3 - t2)
        );
        if step > 0 {
            // step 0 warms caches and allocators
            fw.push(ms(t1 - t0));
            bw.push(ms(t2 - t1));
            op.push(ms(t3 - t2));
        }
    }
    let (f, b_, o) = (median(&mut fw), median(&mut bw), median(&mut op));
    let peak = trident_train::monitor::peak_rss_bytes().unwrap_or(0) as f64 / (1 << 20) as f64;
    println!(
        "trident median over {steps} steps: forward {f:.0} ms  backward {b_:.0} ms  optimizer {o:.0} ms  step {:.0} ms  batch {batch}  peak RSS {peak:.0} MiB",
        f + b_ + o
    );
    Ok(())
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
