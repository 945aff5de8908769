"""Two exported text classifiers (the same checkpoint, two exports) side by side on
onnxruntime: median latency of alternating runs after warm-up, and the largest logit
difference between them.

    python benches/onnx_ab.py before.onnx after.onnx [threads]

Inputs are random token ids (no padding) at batch × sequence 1 × 64 and 8 × 128.
"""
import statistics as st
import sys
import time

import numpy as np
import onnxruntime as ort

a, b = sys.argv[1], sys.argv[2]
so = ort.SessionOptions()
so.intra_op_num_threads = int(sys.argv[3]) if len(sys.argv) > 3 else 2
sess = {p: ort.InferenceSession(p, so, providers=["CPUExecutionProvider"]) for p in (a, b)}
rng = np.random.default_rng(0)
for batch, seq in [(1, 64), (8, 128)]:
    x = {
        "input_ids": rng.integers(1000, 28000, (batch, seq)).astype(np.int64),
        "attention_mask": np.ones((batch, seq), np.int64),
        "token_type_ids": np.zeros((batch, seq), np.int64),
    }
    diff = np.abs(sess[a].run(None, x)[0] - sess[b].run(None, x)[0]).max()
    for s in sess.values():
        for _ in range(5):
            s.run(None, x)
    times = {p: [] for p in sess}
    for _ in range(60):
        for p, s in sess.items():
            t = time.perf_counter()
            s.run(None, x)
            times[p].append((time.perf_counter() - t) * 1e3)
    ma, mb = st.median(times[a]), st.median(times[b])
    print(f"b{batch} x s{seq}: {ma:.2f} ms -> {mb:.2f} ms ({ma / mb:.3f}x), max |logit difference| {diff:.2e}")
