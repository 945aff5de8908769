#!/usr/bin/env bash
# The largest MiniLM training batch (sequence 64, multiples of 8) whose process peak RSS
# stays within a memory budget, in f32 and in bf16 mixed precision: a bisection over
# `minilm_step` runs (one warm-up step and one measured step each; the peak is VmHWM).
#   benches/batch_budget.sh BUDGET_MIB [HI]     (HI: the largest batch tried, default 512)
set -euo pipefail
budget=$1; hi0=${2:-512}
bin=${MINILM_STEP:-target/release/examples/minilm_step}
peak() { # precision batch → peak RSS in MiB
  PRECISION=$1 BATCH=$2 "$bin" data/minilm 1 2>/dev/null | sed -n 's/.*peak RSS \([0-9]*\) MiB.*/\1/p'
}
for p in f32 bf16; do
  lo=0; hi=$((hi0 / 8))   # in units of 8; lo fits (0 trivially), hi+1 does not (assumed)
  while [ "$lo" -lt "$hi" ]; do
    mid=$(((lo + hi + 1) / 2))
    mib=$(peak "$p" $((mid * 8)))
    echo "  $p batch $((mid * 8)): peak $mib MiB" >&2
    if [ "$mib" -le "$budget" ]; then lo=$mid; else hi=$((mid - 1)); fi
  done
  echo "$p: largest batch within $budget MiB: $((lo * 8))"
done
