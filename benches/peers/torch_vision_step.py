"""PyTorch peer of crates/trident-train/examples/vision_step.rs: one training step of the
Fashion-MNIST CNN (421,738 parameters) or ViT (139,018) at batch 64 on 2 threads, forward /
backward / AdamW timed separately, on the same fixed images and labels. The networks are
Trident's (`trident_nn::vision`), layer for layer: the same sizes, dropout, norms and
parameter count (printed; checked against Trident's). Needs torch (not a CI dependency).

    python benches/peers/torch_vision_step.py cnn 20
    COMPILE=1 python …        # torch.compile (inductor) and fused AdamW, warmed up first
    PRECISION=bf16 python …   # forward under torch.autocast("cpu", dtype=torch.bfloat16)
    BATCH=256 python …        # another batch size

WARMUP untimed steps (default 3 compiled, 0 eager) run before the timed ones; the first
timed step is dropped from the medians as in the Rust program.
"""
import contextlib
import os
import resource
import statistics
import sys
import time

import torch
from torch import nn

torch.set_num_threads(2)
torch.manual_seed(0)
kind = sys.argv[1] if len(sys.argv) > 1 else "cnn"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
B = int(os.environ.get("BATCH", "64"))
bf16 = os.environ.get("PRECISION") == "bf16"
compiled = os.environ.get("COMPILE", "0") not in ("", "0")
warmup = int(os.environ.get("WARMUP", "3" if compiled else "0"))


class Cnn(nn.Module):
    """Two conv-BN-ReLU-pool blocks (3x3, no conv bias), fc 128, dropout, fc 10."""

    def __init__(self, width=32, dropout=0.25):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1, bias=False), nn.BatchNorm2d(2 * width), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(2 * width * 7 * 7, 128), nn.ReLU(), nn.Dropout(dropout), nn.Linear(128, 10),
        )

    def forward(self, x):
        return self.body(x)


class Block(nn.Module):
    """Pre-norm encoder layer: no attention dropout, hidden dropout after each sublayer."""

    def __init__(self, d, heads, mlp, dropout):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-6), nn.LayerNorm(d, eps=1e-6)
        self.attn = nn.MultiheadAttention(d, heads, dropout=0.0, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(d, mlp), nn.GELU(), nn.Linear(mlp, d))
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.drop(self.attn(h, h, h, need_weights=False)[0])
        return x + self.drop(self.ff(self.ln2(x)))


class Vit(nn.Module):
    """Patch 4 on 28x28, width 64, 4 layers, 4 heads, MLP 128, class token, dropout 0.1."""

    def __init__(self, d=64, layers=4, heads=4, mlp=128, patch=4, dropout=0.1):
        super().__init__()
        n = (28 // patch) ** 2
        self.patch = nn.Conv2d(1, d, patch, stride=patch)
        self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, n + 1, d) * 0.02)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*[Block(d, heads, mlp, dropout) for _ in range(layers)])
        self.norm = nn.LayerNorm(d, eps=1e-6)
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        p = self.patch(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(x.shape[0], -1, -1), p], 1) + self.pos
        h = self.blocks(self.drop(h))
        return self.head(self.norm(h[:, 0]))


model = {"cnn": Cnn, "vit": Vit}[kind]()
model.train()
n_params = sum(p.numel() for p in model.parameters())
want = {"cnn": 421738, "vit": 139018}[kind]
assert n_params == want, f"{kind}: {n_params} parameters, Trident's has {want}"
print(f"{kind}, precision: {'bf16 autocast' if bf16 else 'f32'}; "
      f"{'torch.compile (inductor), fused AdamW' if compiled else 'eager'}; {n_params} parameters, batch {B}", file=sys.stderr)
k = torch.arange(B * 28 * 28)
x = (((k * 7919) % 1013).float() / 1013.0 - 0.5).reshape(B, 1, 28, 28)
labels = torch.arange(B) % 10
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, fused=compiled)
run = torch.compile(model) if compiled else model
loss_fn = nn.CrossEntropyLoss()
fw, bw, op = [], [], []
t_warm = time.perf_counter()
for step in range(-warmup, steps + 1):
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
        loss = loss_fn(run(x), labels)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    opt.step()
    opt.zero_grad(set_to_none=True)
    t3 = time.perf_counter()
    if step < 0:
        if step == -1:
            print(f"warm-up ({warmup} steps, compilation included): {t3 - t_warm:.1f} s", file=sys.stderr)
        continue
    print(f"step {step}: loss {loss.item():.6f}  forward {(t1-t0)*1e3:.1f} ms  backward {(t2-t1)*1e3:.1f} ms  "
          f"optimizer {(t3-t2)*1e3:.1f} ms", file=sys.stderr)
    if step > 0:
        fw.append((t1 - t0) * 1e3); bw.append((t2 - t1) * 1e3); op.append((t3 - t2) * 1e3)
f, b, o = (statistics.median(v) for v in (fw, bw, op))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
mode = "compiled" if compiled else "eager"
print(f"pytorch {torch.__version__} {kind} {mode} median over {steps} steps: forward {f:.1f} ms  backward {b:.1f} ms  "
      f"optimizer {o:.1f} ms  step {f+b+o:.1f} ms  batch {B}  peak RSS {peak:.0f} MiB")
