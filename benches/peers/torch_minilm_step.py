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
import os
import sys

import torch
from transformers import BertConfig, BertForSequenceClassification
from safetensors.torch import load_file

import step_timing

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
print(step_timing.describe(), file=sys.stderr)
ids = torch.tensor([[((i * 131 + j * 17) % 28000) + 1000 for j in range(S)] for i in range(B)])
labels = torch.tensor([i % 3 for i in range(B)])
opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01, fused=step_timing.compiled)
run = torch.compile(model) if step_timing.compiled else model
mask, types = torch.ones_like(ids), torch.zeros_like(ids)
step_timing.run("", steps, B, lambda: run(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels).loss, opt)
