"""PyTorch's convolutions (oneDNN on CPU) on the shapes of
crates/trident-nn/examples/conv_bench.rs: forward, then forward + backward (input and weight
gradients) minus forward, medians of 15 runs after one warm-up, 2 threads.

    OMP_NUM_THREADS=2 python benches/peers/torch_conv.py
"""
import statistics
import time

import torch

torch.set_num_threads(2)
SHAPES = [  # name, input, output channels, kernel, stride, padding, transposed
    ("CNN conv1", (64, 1, 28, 28), 32, 3, 1, 1, False),
    ("CNN conv2", (64, 32, 14, 14), 64, 3, 1, 1, False),
    ("GAN critic conv1", (128, 1, 28, 28), 64, 4, 2, 1, False),
    ("GAN critic conv2", (128, 64, 14, 14), 128, 4, 2, 1, False),
    ("GAN generator up1 (transposed)", (128, 128, 7, 7), 64, 4, 2, 1, True),
    ("GAN generator up2 (transposed)", (128, 64, 14, 14), 1, 4, 2, 1, True),
    ("conv autoencoder down1 1→32 @28", (128, 1, 28, 28), 32, 3, 2, 1, False),
    ("conv autoencoder down2 32→64 @14", (128, 32, 14, 14), 64, 3, 2, 1, False),
    ("conv autoencoder up1 64→32 @14", (128, 64, 14, 14), 32, 3, 1, 1, False),
    ("conv autoencoder up2 32→1 @28", (128, 32, 28, 28), 1, 3, 1, 1, False),
    ("EfficientNet 1x1 expand 40→240 @14", (32, 40, 14, 14), 240, 1, 1, 0, False),
    ("EfficientNet 1x1 project 480→80 @7", (32, 480, 7, 7), 80, 1, 1, 0, False),
    ("EfficientNet 1x1 head 320→1280 @4", (32, 320, 4, 4), 1280, 1, 1, 0, False),
    ("EfficientNet stem 3→32 k3 s2 @112", (32, 3, 112, 112), 32, 3, 2, 0, False),
]


def median_ms(f):
    f()
    times = []
    for _ in range(15):
        t = time.perf_counter()
        f()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


for name, (b, c, h, w), o, k, s, p, transposed in SHAPES:
    x = torch.randn(b, c, h, w, requires_grad=True)
    if transposed:
        wt = (torch.randn(c, o, k, k) * 0.1).requires_grad_()
        flop = 2.0 * b * c * o * k * k * h * w
        op = torch.nn.functional.conv_transpose2d
    else:
        wt = (torch.randn(o, c, k, k) * 0.1).requires_grad_()
        oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        flop = 2.0 * b * o * c * k * k * oh * ow
        op = torch.nn.functional.conv2d

    def fwd():
        with torch.no_grad():
            op(x, wt, stride=s, padding=p)

    def both():
        x.grad = wt.grad = None
        op(x, wt, stride=s, padding=p).sum().backward()

    f, fb = median_ms(fwd), median_ms(both)
    bw = fb - f
    print(f"{name:36} forward {f:7.2f} ms {flop / f / 1e6:6.1f} GFLOP/s | "
          f"backward {bw:7.2f} ms {2 * flop / bw / 1e6:6.1f} GFLOP/s")
