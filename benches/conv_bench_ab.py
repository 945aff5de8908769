#!/usr/bin/env python3
"""Interleaved rounds of `conv_bench` builds (crates/trident-nn/examples/conv_bench.rs).

    PRECISION=bf16 RUNS=31 python3 benches/conv_bench_ab.py ROUNDS ONLY BIN...

Runs each binary in turn, ROUNDS times, with `ONLY` (a shape-name filter; '' for all) and
`RUNS` passed through, and prints per shape and pass (forward, backward with both gradients,
the input gradient alone, the weight gradient alone) the fastest and the median of the
rounds' medians for each binary (– where a build does not print that pass). One run's
median moves by tens of per cent on a noisy VM; the rounds show by how much.
"""
import collections
import os
import re
import statistics
import subprocess
import sys

rounds, only, bins = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
res = collections.defaultdict(list)
env = dict(os.environ, ONLY=only, RUNS=os.environ.get("RUNS", "31"))
for _ in range(rounds):
    for b in bins:
        out = subprocess.run([b], env=env, capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            m = re.match(
                r"(.+?)\s+forward\s+([\d.]+) ms.*backward\s+([\d.]+) ms"
                r"(?:.*input gradient alone\s+([\d.]+) ms)?(?:.*weight gradient alone\s+([\d.]+) ms)?",
                line,
            )
            if m:
                for what, v in (("fwd", m.group(2)), ("bwd", m.group(3)), ("dx", m.group(4)), ("dw", m.group(5))):
                    if v:
                        res[(m.group(1).strip(), what, b)].append(float(v))
for name, what in sorted({(k[0], k[1]) for k in res}):
    cells = [
        f"{b}: min {min(v):6.2f} med {statistics.median(v):6.2f}" if v else f"{b}: –"
        for b in bins
        for v in [res[(name, what, b)]]
    ]
    print(f"{name:34s} {what:4s}  " + "  ".join(cells))
