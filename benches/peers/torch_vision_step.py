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
import os
import sys

import torch
from torch import nn

import step_timing

torch.set_num_threads(2)
torch.manual_seed(0)
kind = sys.argv[1] if len(sys.argv) > 1 else "cnn"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
B = int(os.environ.get("BATCH", "64"))


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
print(f"{kind}, {step_timing.describe()}; {n_params} parameters, batch {B}", file=sys.stderr)
k = torch.arange(B * 28 * 28)
x = (((k * 7919) % 1013).float() / 1013.0 - 0.5).reshape(B, 1, 28, 28)
labels = torch.arange(B) % 10
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, fused=step_timing.compiled)
run = torch.compile(model) if step_timing.compiled else model
loss_fn = nn.CrossEntropyLoss()
step_timing.run(f"{kind} ", steps, B, lambda: loss_fn(run(x), labels), opt)
