#!/usr/bin/env bash
# Interleaved step-time comparison of training-step programs on a noisy machine.
#   benches/step_ab.sh ROUNDS STEPS PROGRAM...
# Runs `PROGRAM data/minilm STEPS` for each PROGRAM in turn, ROUNDS times; pools the steps
# after each run's first (warm-up) and prints, per program, the fastest, 25th percentile
# and median of forward + backward + optimizer, and the forward / backward medians.
# Programs print lines `step N: loss L  forward F ms  backward B ms  optimizer O ms`, as
# crates/trident-train/examples/minilm_step.rs and benches/peers/torch_minilm_step.py do.
# PyTorch as a program: a two-line wrapper running
#   OMP_NUM_THREADS=2 python benches/peers/torch_minilm_step.py "$@"
set -euo pipefail
rounds=$1; steps=$2; shift 2
data=${DATA:-data/minilm}
res=$(mktemp)
trap 'rm -f "$res"' EXIT
for _ in $(seq "$rounds"); do
  for b in "$@"; do
    RUST_BACKTRACE=0 "$b" "$data" "$steps" 2>&1 | grep '^step' | tail -n +2 |
      awk -v b="$(basename "$b")" '{print b, $6 + $9 + $12, $6, $9}' >> "$res"
  done
done
python3 - "$res" <<'PY'
import collections, statistics as st, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    b, t, f, w = line.split()
    d[b].append((float(t), float(f), float(w)))
for b, v in d.items():
    t, f, w = ([x[i] for x in v] for i in range(3))
    print(f"{b}: n={len(t)} step fastest {min(t):.0f} p25 {st.quantiles(t, n=4)[0]:.0f} "
          f"median {st.median(t):.0f} | forward median {st.median(f):.0f} | backward median {st.median(w):.0f} ms")
PY
