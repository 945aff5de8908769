"""PyTorch's equivalent of examples/transfer/fashion-finetune.toml's training pass: the same
EfficientNet-Lite0 (the network of crates/trident-nn/tests/fixtures/make_efficientnet_reference.py
as trainable modules: ReLU6, TensorFlow "SAME" padding, batch norm eps 1e-3 and momentum
0.01), its ImageNet weights from data/efficientnet-lite0 (scripts/fetch-data.sh
efficientnet), a new 1280 -> 10 classifier after dropout 0.2; grey 28 px Fashion-MNIST
images repeated to RGB and upsampled 4x (nearest) to 112 px; AdamW lr 1e-3, weight decay
0.01, batch 32. Modes: finetune (every weight trains, batch norms on batch statistics),
probe (the pretrained network frozen in evaluation mode, only the classifier trains) and
scratch (finetune from a fresh initialisation, batch norm momentum 0.1); eval (the pretrained
network in evaluation mode under torch.no_grad(), batches of EVAL_BATCH images, default 200,
as the example's eval_batch_size: what Trident's report calls the batched test-set evaluation).

Prints the seconds and images per second of `batches` training steps after 3 warm-up
steps, as benches/transfer_epochs.sh reads Trident's epoch. Threads: TORCH_THREADS
(default 2); COMPILE=1 compiles the network with torch.compile.

    python3 benches/peers/torch_transfer.py finetune|probe|scratch|eval [batches]
"""

import gzip
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
STAGES = [(3, 1, 1, 32, 16, 1), (3, 2, 6, 16, 24, 2), (5, 2, 6, 24, 40, 2), (3, 2, 6, 40, 80, 3),
          (5, 1, 6, 80, 112, 3), (5, 2, 6, 112, 192, 4), (3, 1, 6, 192, 320, 1)]


class SameConv(nn.Conv2d):
    """TensorFlow's "SAME" padding: the odd pixel at the bottom and right."""

    def forward(self, x):
        h, w = x.shape[2:]
        k, s = self.kernel_size[0], self.stride[0]
        ph = max((math.ceil(h / s) - 1) * s + k - h, 0)
        pw = max((math.ceil(w / s) - 1) * s + k - w, 0)
        return super().forward(F.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2)))


def bn(c, momentum):
    return nn.BatchNorm2d(c, eps=1e-3, momentum=momentum)


class Block(nn.Module):
    def __init__(self, k, s, e, cin, cout, momentum):
        super().__init__()
        mid = cin * e
        self.expand = nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), bn(mid, momentum), nn.ReLU6()) if e != 1 else None
        self.dw = nn.Sequential(SameConv(mid, mid, k, s, groups=mid, bias=False), bn(mid, momentum), nn.ReLU6())
        self.project = nn.Sequential(nn.Conv2d(mid, cout, 1, bias=False), bn(cout, momentum))
        self.residual = s == 1 and cin == cout

    def forward(self, x):
        h = self.expand(x) if self.expand is not None else x
        h = self.project(self.dw(h))
        return h + x if self.residual else h


class Lite0(nn.Module):
    def __init__(self, momentum):
        super().__init__()
        self.stem = nn.Sequential(SameConv(3, 32, 3, 2, bias=False), bn(32, momentum), nn.ReLU6())
        blocks = []
        for k, s, e, cin, cout, r in STAGES:
            for j in range(r):
                blocks.append(Block(k, s if j == 0 else 1, e, cin if j == 0 else cout, cout, momentum))
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(nn.Conv2d(320, 1280, 1, bias=False), bn(1280, momentum), nn.ReLU6())
        self.drop = nn.Dropout(0.2)
        self.fc = nn.Linear(1280, 10)

    def features(self, x):
        x = x * 255.0 / 128.0 - 127.0 / 128.0
        return self.head(self.blocks(self.stem(x))).mean((2, 3))

    def forward(self, x):
        return self.fc(self.drop(self.features(x)))

    def load_pth(self, sd):
        """The .pth's names (efficientnet_pytorch's) onto these modules, in order."""
        names = ["_conv_stem", "_bn0"]
        i = 0
        for _, _, e, _, _, r in STAGES:
            for _ in range(r):
                p = f"_blocks.{i}."
                names += ([p + "_expand_conv", p + "_bn0"] if e != 1 else []) + [
                    p + "_depthwise_conv", p + "_bn1", p + "_project_conv", p + "_bn2"]
                i += 1
        names += ["_conv_head", "_bn1"]
        mods = [m for m in self.modules() if isinstance(m, (nn.Conv2d, nn.BatchNorm2d))]
        assert len(mods) == len(names), (len(mods), len(names))
        for m, n in zip(mods, names):
            for key in ("weight", "bias", "running_mean", "running_var"):
                if hasattr(m, key) and getattr(m, key) is not None and n + "." + key in sd:
                    getattr(m, key).data.copy_(sd[n + "." + key])


def idx(path, offset):
    return np.frombuffer(gzip.open(path).read(), np.uint8, offset=offset)


def main():
    mode = sys.argv[1]
    batches = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    torch.set_num_threads(int(os.environ.get("TORCH_THREADS", "2")))
    torch.manual_seed(0)
    data = os.path.join(ROOT, "data", "fashion-mnist")
    images = idx(os.path.join(data, "train-images-idx3-ubyte.gz"), 16).reshape(-1, 1, 28, 28)[:1000]
    labels = torch.tensor(idx(os.path.join(data, "train-labels-idx1-ubyte.gz"), 8)[:1000].astype(np.int64))
    x = torch.tensor(images, dtype=torch.float32) / 255.0
    net = Lite0(0.1 if mode == "scratch" else 0.01)
    if mode != "scratch":
        sd = torch.load(os.path.join(ROOT, "data", "efficientnet-lite0", "efficientnet-lite0-57934424.pth"),
                        map_location="cpu", weights_only=False)
        net.load_pth(sd)
    params = net.fc.parameters() if mode == "probe" else net.parameters()
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
    if mode == "probe":
        net.eval()
        for p in net.parameters():
            p.requires_grad_(False)
        for p in net.fc.parameters():
            p.requires_grad_(True)
        net.drop.train()
    else:
        net.train()
    if mode == "eval":
        net.eval()
    step = torch.compile(net) if os.environ.get("COMPILE") == "1" else net
    bs = int(os.environ.get("EVAL_BATCH", "200")) if mode == "eval" else 32

    def images(t):
        i = (t * bs) % len(x)
        return i, F.interpolate(x[i:i + bs].repeat(1, 3, 1, 1), scale_factor=4, mode="nearest")

    def train(n):
        for t in range(n):
            i, xb = images(t)
            loss = F.cross_entropy(step(xb), labels[i:i + bs])
            opt.zero_grad()
            loss.backward()
            opt.step()

    def evaluate(n):
        with torch.no_grad():
            for t in range(n):
                step(images(t)[1]).argmax(1)

    run = evaluate if mode == "eval" else train
    run(3)  # warm-up (and compilation)
    t0 = time.perf_counter()
    run(batches)
    secs = time.perf_counter() - t0
    print(f"{mode:8s} pytorch {torch.__version__}{' compiled' if os.environ.get('COMPILE') == '1' else ''}  "
          f"{batches} batches of {bs}  {secs:.2f} s  {batches * bs / secs:,.0f} ex/s")


if __name__ == "__main__":
    main()
