"""PyTorch's GEMM on MiniLM's FFN shape, the peer of `examples/gemm_layouts.rs`.

    OMP_NUM_THREADS=2 python benches/peers/torch_gemm.py
"""
import time

import torch

torch.set_num_threads(2)
m, k, n = 1024, 384, 1536
x, w = torch.randn(m, k), torch.randn(n, k)
x @ w.T  # warm-up
times = []
for _ in range(15):
    t = time.perf_counter()
    x @ w.T
    times.append(time.perf_counter() - t)
med = sorted(times)[len(times) // 2]
print(f"torch {torch.__version__} x @ w.T median {med * 1e3:.2f} ms  {2 * m * k * n / med / 1e9:.1f} GFLOP/s")
