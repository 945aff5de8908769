"""Summarizes benches/peers/peers_bench.sh: per model, batching variant and encoding, each
server's best throughput with p99 within the bound, and its p50 at concurrency 1, with the
ratios Trident / peer (medians over rounds when there are several).

    python3 benches/peers/summarize_peers.py OUT_DIR [--mlp-p99-ms 10] [--minilm-p99-ms 150]
"""

import argparse
import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

NAME = re.compile(r"^(trident|triton|torchserve)_(mlp|minilm)_(nobatch|batched)_(json|binary)_r(\d+)$")


def load(out: Path):
    runs = defaultdict(list)  # (server, model, variant, encoding) -> [report per round]
    for path in sorted(out.glob("*.json")):
        m = NAME.match(path.stem)
        if not m:
            continue
        server, model, variant, enc, _round = m.groups()
        runs[(server, model, variant, enc)].append(json.loads(path.read_text()))
    return runs


def best_within(report, bound_us):
    ok = [r for r in report["rows"] if r["latency"]["p99_us"] <= bound_us and r["latency"]["errors"] == 0]
    if not ok:
        return None
    return max(ok, key=lambda r: r["inferences_per_s"])


def c1(report):
    return next((r for r in report["rows"] if r["level"] == 1), None)


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--mlp-p99-ms", type=float, default=10.0)
    ap.add_argument("--minilm-p99-ms", type=float, default=150.0)
    a = ap.parse_args()
    bounds = {"mlp": a.mlp_p99_ms * 1000, "minilm": a.minilm_p99_ms * 1000}
    runs = load(a.out)

    print("## every level (first round)\n")
    print("| server | model | batching | encoding | concurrency | infer/s | p50 ms | p99 ms | stable |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in sorted(runs):
        rep = runs[key][0]
        for r in rep["rows"]:
            lat = r["latency"]
            print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {r['level']:.0f} | {r['inferences_per_s']:.1f} "
                  f"| {lat['p50_us'] / 1000:.2f} | {lat['p99_us'] / 1000:.2f} | {'yes' if r['stable'] else 'no'} |")

    print("\n## summary (medians over rounds)\n")
    print("| model | batching | encoding | server | infer/s within p99 bound | at concurrency | p50 ms at c1 "
          "| throughput Trident/peer | p50 Trident/peer |")
    print("|---|---|---|---|---|---|---|---|---|")
    for model in ("mlp", "minilm"):
        for variant in ("nobatch", "batched"):
            for enc in ("json", "binary"):
                rows = {}
                for server in ("trident", "triton", "torchserve"):
                    reps = runs.get((server, model, variant, enc))
                    if not reps:
                        continue
                    best = [best_within(r, bounds[model]) for r in reps]
                    thr = med([b["inferences_per_s"] if b else 0.0 for b in best])
                    at = med([b["level"] for b in best if b])
                    p50 = med([row["latency"]["p50_us"] / 1000 for row in map(c1, reps) if row])
                    rows[server] = (thr, at, p50)
                if "trident" not in rows:
                    continue
                t_thr, _, t_p50 = rows["trident"]
                for server, (thr, at, p50) in rows.items():
                    ratio_t = f"{t_thr / thr:.2f}x" if server != "trident" and thr else "–"
                    ratio_p = f"{t_p50 / p50:.2f}x" if server != "trident" and p50 and t_p50 else "–"
                    at_s = f"{at:.0f}" if at else "–"
                    p50_s = f"{p50:.2f}" if p50 else "–"
                    print(f"| {model} (p99 ≤ {bounds[model] / 1000:.0f} ms) | {variant} | {enc} | {server} "
                          f"| {thr:.1f} | {at_s} | {p50_s} | {ratio_t} | {ratio_p} |")


if __name__ == "__main__":
    main()
