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

mod common;

use candle_core::{Device, Tensor};
use trident_nn::bert::{load_bert_weights, BertClassifier, BertConfig, Pooling, TextBatch};
use trident_nn::{ops, Ctx, Params};
use trident_train::optim::{Optimizer, OptimizerConfig};

fn main() -> anyhow::Result<()> {
    // As `trident` runs (CANDLE_NUM_THREADS=2 or more to compare), the loop on the pool.
    trident_nn::runtime::candle_on_one_thread();
    trident_nn::runtime::keep_freed_memory();
    trident_nn::runtime::on_pool(run)
}

fn run() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(args.get(1).map(String::as_str).unwrap_or("data/minilm"));
    let steps: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(10);
    let batch: usize = std::env::var("BATCH").map_or(Ok(16), |v| v.parse())?;
    let seq = 64usize;
    let _precision = common::precision_from_env();
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
    let mut g: Vec<Vec<f32>> = trainable.iter().map(|p| vec![0f32; p.var.elem_count()]).collect();
    common::run("trident", steps, batch, |step, clock| {
        params.begin_step();
        let logits = model.forward(&b, &Ctx::train(0, step as u64))?;
        let loss = ops::cross_entropy(&logits, &labels)?;
        clock.mark();
        let grads = loss.backward()?;
        // Into buffers kept across steps, as the trainer does.
        for (g, p) in g.iter_mut().zip(&trainable) {
            params.gradient_into(&grads, p, g, false)?;
        }
        clock.mark();
        opt.step(&trainable, &g, 2e-5)?;
        clock.mark();
        Ok(loss.to_scalar::<f32>()?)
    })
}
