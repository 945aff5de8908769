"""Summarises the perf_analyzer runs written by serve_bench.sh into a Markdown table.

Client figures (throughput, p50/p99) come from each run's CSV; the server-side breakdown
(averages: request = overhead + queue + compute input/infer/output) from perf_analyzer's
log, which reads it from the server's statistics API (absent for the Python peer).
"""

import csv
import re
import sys
from pathlib import Path

SERVER = re.compile(
    r"Avg request latency: (\d+) usec \(overhead (\d+) usec \+ queue (\d+) usec \+ "
    r"compute input (\d+) usec \+ compute infer (\d+) usec \+ compute output (\d+) usec\)"
)


def buckets(text: str, metric: str, model: str) -> list[tuple[float, float]]:
    pattern = rf'^{metric}_bucket{{model="{model}",version="1",le="([^"]+)"}} (\S+)$'
    return [(float(le), float(v)) for le, v in re.findall(pattern, text, re.M)]


def quantile(q: float, before: list, after: list) -> float:
    """histogram_quantile over the difference of two cumulative scrapes (linear within a bucket)."""
    diff = [(le, a - b) for (le, a), (_, b) in zip(after, before)]
    total = diff[-1][1]
    if total <= 0:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for le, cumulative in diff:
        if cumulative >= rank:
            if le == float("inf"):
                return lower
            return lower + (le - lower) * (rank - below) / max(cumulative - below, 1e-9)
        lower, below = le, cumulative
    return lower


def server_percentiles(f: Path, model: str) -> str:
    before, after = f.with_suffix(".before"), f.with_suffix(".after")
    if not (before.exists() and after.exists()):
        return "– | –"
    b, a = before.read_text(), after.read_text()
    m = "trident_request_overhead_us"
    return f"{quantile(0.5, buckets(b, m, model), buckets(a, m, model)):.0f} | {quantile(0.99, buckets(b, m, model), buckets(a, m, model)):.0f}"


def main(out: Path) -> None:
    print("| run | conc | infer/s | client p50 ms | client p99 ms | server request µs | overhead µs | queue µs | compute infer µs | overhead* p50 µs | overhead* p99 µs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for f in sorted(out.glob("*.csv")):
        with f.open() as fh:
            r = next(csv.DictReader(fh))
        m = SERVER.findall(f.with_suffix(".log").read_text())
        server = [int(x) for x in m[-1]] if m else None
        cols = [f"{server[i]}" for i in (0, 1, 2, 4)] if server else ["–"] * 4
        model = re.sub(r"^(trident|peer)_|_c\d+$", "", f.stem)
        print(f"| {f.stem} | {r['Concurrency']} | {float(r['Inferences/Second']):.0f} | "
              f"{float(r['p50 latency']) / 1000:.3f} | {float(r['p99 latency']) / 1000:.3f} | " + " | ".join(cols)
              + f" | {server_percentiles(f, model)} |")
    print("\n*overhead = request duration − compute_infer of its execution, per request, from "
          "trident_request_overhead_us (bucket width 10 µs up to 100 µs)")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
