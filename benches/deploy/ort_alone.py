"""The three graphs of the deployment benchmark on ONNX Runtime alone (no server):
Trident's `portable` and `ort-fused` exports (fp32 and int8) and torch.onnx.export's, on
the same padded batches of real token ids; median of repeated runs, 2 intra-op threads.

    python3 benches/deploy/ort_alone.py NAME=FILE ... --tokenizer tokenizer.json --texts texts.json
"""

import argparse
import json
import statistics
import time

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

ap = argparse.ArgumentParser()
ap.add_argument("models", nargs="+")
ap.add_argument("--tokenizer", required=True)
ap.add_argument("--texts", required=True)
ap.add_argument("--repeats", type=int, default=30)
args = ap.parse_args()

tok = Tokenizer.from_file(args.tokenizer)
tok.enable_truncation(128)
texts = [d["TEXT"]["content"][0] for d in json.load(open(args.texts))["data"]]


def batch(n):
    encs = tok.encode_batch(texts[:n])
    s = max(len(e.ids) for e in encs)
    ids = np.zeros((n, s), np.int64)
    mask = np.zeros((n, s), np.int64)
    for i, e in enumerate(encs):
        ids[i, : len(e.ids)] = e.ids
        mask[i, : len(e.ids)] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


feeds = {1: batch(1), 32: batch(32)}
opts = ort.SessionOptions()
opts.intra_op_num_threads = 2
opts.inter_op_num_threads = 1
ref = None
print(f"ONNX Runtime {ort.__version__}; batch 1 = {feeds[1]['input_ids'].shape}, batch 32 = {feeds[32]['input_ids'].shape}")
for spec in args.models:
    name, path = spec.split("=", 1)
    s = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    row = [name]
    for b, f in feeds.items():
        for _ in range(3):
            out = s.run(["logits"], f)[0]
        times = []
        for _ in range(args.repeats if b == 1 else max(5, args.repeats // 4)):
            t = time.perf_counter()
            s.run(["logits"], f)
            times.append(time.perf_counter() - t)
        row.append(f"b{b} {statistics.median(times) * 1e3:.2f} ms")
        if b == 32:
            if ref is None:
                ref = out
            row.append(f"max|logits - first| {np.abs(out - ref).max():.1e}")
    print("  ".join(row))
