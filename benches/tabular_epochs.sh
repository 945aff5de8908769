#!/usr/bin/env bash
# An epoch of each tabular example (examples/tabular/*.toml) in Trident beside PyTorch's
# equivalent (benches/peers/torch_tabular.py), in interleaved rounds on this machine.
#
#   benches/tabular_epochs.sh [rounds]      # TRIDENT_BIN: the binary (default trident)
#
# Trident's figure is the median of `epoch_seconds` in metrics.jsonl over epochs 2.. (the
# training pass of an epoch, not its checkpoint), PyTorch's the same span of its loop.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
bin=${TRIDENT_BIN:-trident}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) (family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs)), $(nproc) cores; $(date -u '+%F %H:%M UTC')"
for r in $(seq 1 "$rounds"); do
  for name in wine breast_cancer penguins; do
    sed -e "s|^dir = .*|dir = \"$work/$name-$r\"|" "examples/tabular/$name.toml" > "$work/$name.toml"
    start=$(date +%s.%N)
    "$bin" train --config "$work/$name.toml" >/dev/null 2>"$work/log" || { cat "$work/log" >&2; exit 1; }
    wall=$(echo "$(date +%s.%N) - $start" | bc)
    python3 - "$work/$name-$r" "$name" "$wall" <<'PY'
import json, statistics, sys
run, name, wall = sys.argv[1], sys.argv[2], float(sys.argv[3])
recs = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
secs = [r["epoch_seconds"] for r in recs[1:]]
n = recs[-1]["examples_per_second"] * recs[-1]["epoch_seconds"]
acc = json.load(open(f"{run}/test/metrics.json"))["report"]["accuracy"]
med = statistics.median(secs)
print(f"{name:14s} trident          epoch median {med * 1e3:.2f} ms  {n / med:,.0f} ex/s  "
      f"whole run {wall:.2f} s  test accuracy {acc:.4f}")
PY
  done
  python3 benches/peers/torch_tabular.py 0
done
