"""PyTorch's equivalent of examples/autoencoder/fashion-{dense,conv}.toml: the same network
layer for layer (dense 784-512-256-32-256-512-784 with ReLU; conv: two 3x3 stride-2
convolutions of 32 and 64 channels, a 32-wide linear code, nearest 2x upsampling and 3x3
convolutions back; sigmoid output), mean squared error, AdamW (lr 1e-3, no weight decay),
batch 128, on the 54,000 training images a 10 % validation split leaves (not the same
images or order: only the time is compared).

Prints the seconds of each epoch's training pass and examples per second, like
benches/autoencoder_epochs.sh reads Trident's metrics.jsonl. Threads: TORCH_THREADS
(default 2, the cores of the machines we run on); COMPILE=1 uses torch.compile.

    python3 benches/peers/torch_autoencoder.py dense|conv [epochs]
"""

import gzip
import os
import sys
import time

import numpy as np
import torch
from torch import nn


def images(path):
    raw = gzip.open(path).read()
    n, h, w = (int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(3))
    return np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(n, 1, h, w).astype(np.float32) / 255.0


def dense():
    sizes = [784, 512, 256, 32]
    enc, dec = [], []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        enc += [nn.Linear(a, b)] + ([nn.ReLU()] if i < 2 else [])
    up = sizes[::-1]
    for i, (a, b) in enumerate(zip(up, up[1:])):
        dec += [nn.Linear(a, b)] + ([nn.ReLU()] if i < 2 else [])
    return nn.Sequential(nn.Flatten(), *enc, *dec, nn.Sigmoid(), nn.Unflatten(1, (1, 28, 28)))


def conv():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, 2, 1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, 2, 1), nn.ReLU(),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 32),
        nn.Linear(32, 64 * 7 * 7), nn.ReLU(), nn.Unflatten(1, (64, 7, 7)),
        nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(64, 32, 3, 1, 1), nn.ReLU(),
        nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(32, 1, 3, 1, 1), nn.Sigmoid(),
    )


def main():
    kind = sys.argv[1]
    epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    torch.set_num_threads(int(os.environ.get("TORCH_THREADS", "2")))
    torch.manual_seed(0)
    x = torch.from_numpy(images("data/fashion-mnist/train-images-idx3-ubyte.gz")[:54000].copy())
    net = dense() if kind == "dense" else conv()
    params = sum(p.numel() for p in net.parameters())
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.0)
    step_net = torch.compile(net) if os.environ.get("COMPILE") == "1" else net
    for epoch in range(epochs):
        t0 = time.perf_counter()
        order = torch.randperm(len(x))
        total = 0.0
        for start in range(0, len(x), 128):
            b = x[order[start:start + 128]]
            loss = nn.functional.mse_loss(step_net(b), b)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(b)
        secs = time.perf_counter() - t0
        print(f"{kind:5s} pytorch {torch.__version__}{' compiled' if os.environ.get('COMPILE') == '1' else ''}  "
              f"{params} params  epoch {epoch + 1}  {secs:.2f} s  {len(x) / secs:,.0f} ex/s  loss {total / len(x):.4f}")


if __name__ == "__main__":
    main()
