#!/usr/bin/env bash
# The results table for the MiniLM fine-tune: examples/sentiment/train.toml in four
# configurations, each run by `trident train` and profiled over optimizer steps 6..35
# (the first five warm up; the run stops after step 35):
#   baseline  num_workers = 0, candle-nn's AdamW op chain (fused = false), f32
#   workers   + num_workers = 1 (the example's setting)
#   fused     + fused AdamW (the default)
#   bf16      + precision = "bf16"
# Prints one row per configuration from <run>/profile/report.json: median step, examples
# per second at batch 16, peak RSS, the speed-up over the baseline.
#   benches/minilm_table.sh [OUT_DIR]      (needs data/vader, data/minilm, a release build)
set -euo pipefail
out=${1:-/tmp/minilm-table}
bin=${TRIDENT:-target/release/trident}
base=examples/sentiment/train.toml
mkdir -p "$out"
variant() { # name, extra sed expression
  sed -e "s|^dir = .*|dir = \"$out/$1\"|" -e "$2" "$base" > "$out/$1.toml"
}
unfused='s/^\[train.optimizer\]$/[train.optimizer]\nfused = false/'
variant baseline "s/^num_workers = 1$/num_workers = 0/; $unfused"
variant workers "$unfused"
variant fused ''
variant bf16 's/^\[train\]$/[train]\nprecision = "bf16"/'
for v in baseline workers fused bf16; do
  rm -rf "${out:?}/$v"
  "$bin" train --config "$out/$v.toml" --profile-steps 6..35 --stop-after-steps 35 > "$out/$v.log" 2>&1
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
base = None
print("| configuration | median step | examples/s | peak RSS | speed-up |")
print("|---|---|---|---|---|")
for v in ["baseline", "workers", "fused", "bf16"]:
    r = json.load(open(f"{out}/{v}/profile/report.json"))
    step = r["median_step_ms"]
    base = base or step
    rss = r["monitor"]["peak_rss"] / 2**20
    print(f"| {v} | {step:.0f} ms | {16e3 / step:.1f} | {rss:.0f} MiB | {base / step:.2f}x |")
PY
