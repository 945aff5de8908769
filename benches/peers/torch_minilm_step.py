"""PyTorch peer of crates/trident-train/examples/minilm_step.rs: one MiniLM + head training
step at batch 16 x seq 64 on 2 threads, forward / backward / AdamW timed separately, with
the same weights, ids and labels. Needs torch and transformers (not a CI dependency).

    python benches/peers/torch_minilm_step.py data/minilm 10
    PRECISION=bf16 python …   # forward under torch.autocast("cpu", dtype=torch.bfloat16)
    BATCH=64 python …         # another batch size (sequence stays 64)
    COMPILE=1 python …        # torch.compile (inductor) and fused AdamW, warmed up first

COMPILE=1 is what a user after speed runs: the model through `torch.compile` (inductor's
C++/OpenMP code for CPU, forward and backward graphs) and `AdamW(fused=True)`. The
compilation happens in WARMUP untimed steps (default 3 compiled, 0 eager) before the
steps printed, so no timed step includes it. The last line also gives the process's peak
resident memory (ru_maxrss).
"""
import contextlib
import os
import resource
import statistics
import sys
import time

import torch
from transformers import BertConfig, BertForSequenceClassification
from safetensors.torch import load_file

torch.set_num_threads(2)
d = sys.argv[1] if len(sys.argv) > 1 else "data/minilm"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
cfg = BertConfig.from_pretrained(d, num_labels=3)
cfg.hidden_dropout_prob = 0.0
cfg.attention_probs_dropout_prob = 0.0
model = BertForSequenceClassification(cfg)
state = {("bert." + k if not k.startswith("bert.") else k): v for k, v in load_file(f"{d}/model.safetensors").items()}
missing, unexpected = model.load_state_dict(state, strict=False)
assert all(m.startswith("classifier") for m in missing), missing
model.train()
B, S = int(os.environ.get("BATCH", "16")), 64
bf16 = os.environ.get("PRECISION") == "bf16"
compiled = os.environ.get("COMPILE", "0") not in ("", "0")
warmup = int(os.environ.get("WARMUP", "3" if compiled else "0"))
print(f"precision: {'bf16 autocast' if bf16 else 'f32'}; {'torch.compile (inductor), fused AdamW' if compiled else 'eager'}", file=sys.stderr)
ids = torch.tensor([[((i * 131 + j * 17) % 28000) + 1000 for j in range(S)] for i in range(B)])
labels = torch.tensor([i % 3 for i in range(B)])
opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01, fused=compiled)
run = torch.compile(model) if compiled else model
mask, types = torch.ones_like(ids), torch.zeros_like(ids)
fw, bw, op = [], [], []
t_warm = time.perf_counter()
for step in range(-warmup, steps + 1):
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
        out = run(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)
    t1 = time.perf_counter()
    out.loss.backward()
    t2 = time.perf_counter()
    opt.step()
    opt.zero_grad(set_to_none=True)
    t3 = time.perf_counter()
    if step < 0:
        if step == -1:
            print(f"warm-up ({warmup} steps, compilation included): {t3 - t_warm:.1f} s", file=sys.stderr)
        continue
    print(f"step {step}: loss {out.loss.item():.6f}  forward {(t1-t0)*1e3:.0f} ms  backward {(t2-t1)*1e3:.0f} ms  optimizer {(t3-t2)*1e3:.0f} ms", file=sys.stderr)
    if step > 0:
        fw.append((t1 - t0) * 1e3); bw.append((t2 - t1) * 1e3); op.append((t3 - t2) * 1e3)
f, b, o = (statistics.median(x) for x in (fw, bw, op))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
mode = "compiled" if compiled else "eager"
print(f"pytorch {torch.__version__} {mode} median over {steps} steps: forward {f:.0f} ms  backward {b:.0f} ms  optimizer {o:.0f} ms  step {f+b+o:.0f} ms  batch {B}  peak RSS {peak:.0f} MiB")
