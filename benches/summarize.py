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


def main(out: Path) -> None:
    print("| run | conc | infer/s | client p50 ms | client p99 ms | server request µs | overhead µs | queue µs | compute infer µs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for f in sorted(out.glob("*.csv")):
        with f.open() as fh:
            r = next(csv.DictReader(fh))
        m = SERVER.findall(f.with_suffix(".log").read_text())
        server = [int(x) for x in m[-1]] if m else None
        cols = [f"{server[i]}" for i in (0, 1, 2, 4)] if server else ["–"] * 4
        print(f"| {f.stem} | {r['Concurrency']} | {float(r['Inferences/Second']):.0f} | "
              f"{float(r['p50 latency']) / 1000:.3f} | {float(r['p99 latency']) / 1000:.3f} | " + " | ".join(cols) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
