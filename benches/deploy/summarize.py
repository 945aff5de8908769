"""Summarizes benches/deploy/deploy_bench.sh: per server variant and concurrency the
throughput and latency percentiles, then the issue's goals — p50 at concurrency 1 against
Triton's, and the best throughput with p99 <= 50 ms against Triton's.

    python3 benches/deploy/summarize.py OUT_DIR [--p99-ms 50]
"""

import argparse
import json
import re
from pathlib import Path

NAME = re.compile(r"^(trident_\w+?|triton)_c(\d+)$")

ap = argparse.ArgumentParser()
ap.add_argument("out", type=Path)
ap.add_argument("--p99-ms", type=float, default=50.0)
a = ap.parse_args()
rows = {}
for path in sorted(a.out.glob("*.json")):
    m = NAME.match(path.stem)
    if not m:
        continue
    rep = json.loads(path.read_text())
    for r in rep["rows"]:
        rows.setdefault(m.group(1), {})[int(m.group(2))] = r

print("| server | concurrency | infer/s | p50 ms | p90 ms | p99 ms | errors |")
print("|---|---|---|---|---|---|---|")
for server in sorted(rows):
    for c in sorted(rows[server]):
        r = rows[server][c]
        lat = r["latency"]
        print(
            f"| {server} | {c} | {r['inferences_per_s']:.1f} | {lat['p50_us'] / 1e3:.2f} | "
            f"{lat['p90_us'] / 1e3:.2f} | {lat['p99_us'] / 1e3:.2f} | {lat['errors']} |"
        )


def best(server):
    ok = [r for r in rows.get(server, {}).values() if r["latency"]["p99_us"] <= a.p99_ms * 1e3 and r["latency"]["errors"] == 0]
    return max((r["inferences_per_s"] for r in ok), default=None)


def p50(server):
    r = rows.get(server, {}).get(1)
    return r["latency"]["p50_us"] / 1e3 if r else None


print(f"\n| server | p50 at c=1 ms | vs Triton | best infer/s with p99 <= {a.p99_ms:g} ms | vs Triton |")
print("|---|---|---|---|---|")
t50, tbest = p50("triton"), best("triton")
for server in sorted(rows):
    s50, sbest = p50(server), best(server)
    r50 = f"{s50 / t50:.2f}x" if s50 and t50 else "–"
    rb = f"{sbest / tbest:.2f}x" if sbest and tbest else "–"
    print(f"| {server} | {s50 or float('nan'):.2f} | {r50} | {sbest or float('nan'):.1f} | {rb} |")
