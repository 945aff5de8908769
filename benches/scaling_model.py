#!/usr/bin/env python3
"""Predicts the data-parallel step time on N machines from measured pieces.

    step(N) = compute + exchange(N)
    exchange(N) = buckets * latency + 2 (N - 1) / N * gradient_bytes / bandwidth

(ring all-reduce, as MPI and NCCL use for large buffers; each machine sends and receives
2 (N-1)/N of the buffer). Not overlapped with the backward pass (candle returns every
gradient at once), so exchange adds to compute. ZeRO-1 moves the same bytes
(reduce-scatter + all-gather = one all-reduce) and so predicts the same.

    benches/scaling_model.py COMPUTE_MS GRAD_MIB BANDWIDTH_GBPS [LATENCY_MS] [BUCKET_MIB]

Check against one machine: with the in-process backend's measured bandwidth the model
predicts the `comm` phase of `--data-parallel 2` (benches/dp_table.sh).
"""
import math
import sys

compute = float(sys.argv[1])
grad_mib = float(sys.argv[2])
bw = float(sys.argv[3]) * 1e9
latency = float(sys.argv[4]) if len(sys.argv) > 4 else 0.05
bucket = float(sys.argv[5]) if len(sys.argv) > 5 else 25.0
buckets = math.ceil(grad_mib / bucket)
nbytes = grad_mib * 2**20
print(f"compute {compute:.0f} ms, gradients {grad_mib:.1f} MiB in {buckets} buckets, "
      f"{bw / 1e9:.2f} GB/s, {latency} ms per collective")
print("| machines | exchange | step | examples/s (relative) | scaling efficiency |")
print("|---|---|---|---|---|")
for n in [1, 2, 4, 8, 16]:
    ex = 0.0 if n == 1 else buckets * latency + 2 * (n - 1) / n * nbytes / bw * 1e3
    step = compute + ex
    print(f"| {n} | {ex:.0f} ms | {step:.0f} ms | {n * compute / step:.2f}x | {compute / step:.0%} |")
