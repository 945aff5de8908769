"""A trained EfficientNet-Lite0 run's batch norms: running statistics against the batch's.

    pip install torch safetensors
    python3 examples/transfer/bn_stats.py runs/transfer-scratch-10

Runs the checkpoint (`<run>/last/model.safetensors`) in PyTorch (the network of
crates/trident-nn/tests/fixtures/make_efficientnet_reference.py) on the first 256
Fashion-MNIST test images, upsampled 4x, in batches of 32: the accuracy with the running
statistics (evaluation mode) and with each batch's own (training mode), then per batch
norm the batch's mean and variance on the first batch against the running ones. A
variance ratio far from 1 means the running statistics do not describe the network
(docs/RESULTS.md, transfer learning).
"""

import gzip
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "crates", "trident-nn", "tests", "fixtures"))
import make_efficientnet_reference as ref  # noqa: E402


def idx(path, offset):
    return np.frombuffer(gzip.open(path).read(), np.uint8, offset=offset)


def main():
    run = sys.argv[1]
    sd = load_file(os.path.join(run, "last", "model.safetensors"))
    sd["_fc.weight"], sd["_fc.bias"] = sd["head.weight"], sd["head.bias"]
    data = os.path.join(ROOT, "data", "fashion-mnist")
    images = idx(os.path.join(data, "t10k-images-idx3-ubyte.gz"), 16).reshape(-1, 1, 28, 28)[:256] / 255.0
    labels = idx(os.path.join(data, "t10k-labels-idx1-ubyte.gz"), 8)[:256]
    x = F.interpolate(torch.tensor(images, dtype=torch.float32).repeat(1, 3, 1, 1), scale_factor=4, mode="nearest")

    for training in (False, True):
        def bn(h, s, p, training=training):
            return F.batch_norm(h, s[p + ".running_mean"].clone(), s[p + ".running_var"].clone(),
                                s[p + ".weight"], s[p + ".bias"], training=training, eps=1e-3)
        ref.bn = bn
        with torch.no_grad():
            preds = torch.cat([ref.forward(sd, x[i:i + 32]).argmax(1) for i in range(0, 256, 32)]).numpy()
        mode = "batch statistics  " if training else "running statistics"
        print(f"{mode}: accuracy {(preds == labels).mean():.3f}, predictions per class {np.bincount(preds, minlength=10)}")

    rows = []

    def compare(h, s, p):
        m, v = h.mean((0, 2, 3)), h.var((0, 2, 3))
        ratio = v / s[p + ".running_var"]
        rows.append((p, float((m - s[p + ".running_mean"]).abs().mean()), float(ratio.mean()),
                     float(ratio.min()), float(ratio.max())))
        return F.batch_norm(h, None, None, s[p + ".weight"], s[p + ".bias"], training=True, eps=1e-3)

    ref.bn = compare
    with torch.no_grad():
        ref.forward(sd, x[:32])
    print(f"{'batch norm':24} {'|mean - running|':>17} {'var / running var: mean':>24} {'min':>7} {'max':>7}")
    for p, dm, r, lo, hi in rows:
        print(f"{p:24} {dm:17.4f} {r:24.3f} {lo:7.3f} {hi:7.3f}")


if __name__ == "__main__":
    main()
