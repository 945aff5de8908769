"""Summarises benches/grpc/grpc_bench.sh: perf_analyzer CSVs -> a markdown table.

overhead p50 = p50 latency - (server compute input + infer + output): everything a
request spends outside the model (client, loopback, protocol, server queueing and
framing), as perf_analyzer's own server statistics split it."""

import csv
import sys
from pathlib import Path

out = Path(sys.argv[1])
rows = []
for name in ("trident_grpc", "triton_grpc", "trident_http", "triton_http"):
    path = out / f"{name}.csv"
    if not path.exists():
        print(f"missing {path}")
        continue
    for r in csv.DictReader(path.open()):
        compute = sum(float(r[k]) for k in ("Server Compute Input", "Server Compute Infer", "Server Compute Output"))
        rows.append(
            (
                name.split("_")[0],
                name.split("_")[1],
                int(r["Concurrency"]),
                float(r["Inferences/Second"]),
                float(r["p50 latency"]),
                float(r["p99 latency"]),
                compute,
                float(r["p50 latency"]) - compute,
            )
        )
print("| server | protocol | concurrency | infer/s | p50 µs | p99 µs | server compute µs | overhead p50 µs |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for s, p, c, t, p50, p99, comp, ovh in rows:
    print(f"| {s} | {p} | {c} | {t:.0f} | {p50:.0f} | {p99:.0f} | {comp:.0f} | {ovh:.0f} |")
by = {(s, p, c): t for s, p, c, t, *_ in rows}
print()
for p in ("grpc", "http"):
    for c in sorted({c for _, q, c, *_ in rows if q == p}):
        a, b = by.get(("trident", p, c)), by.get(("triton", p, c))
        if a and b:
            print(f"{p} concurrency {c}: Trident / Triton throughput = {a / b:.2f}x")
