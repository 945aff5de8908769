#!/usr/bin/env bash
# The variant search behind examples/forecast/airline.toml (docs/RESULTS.md): window 24 or
# 36, no hidden layer or 32 units, weight decay 0 or 0.1, each with normalize =
# "season-trend", trained on 1949–1954 and backtested on 1955–1957 (the first 108 months,
# test = 36: "val"), and trained on 1949–1957 and backtested on 1958–1960 (the anchor's
# split: "test"). Prints each run's backtest MAE per row (model, naive, seasonal naive, the
# normalisation's own forecast). The shipped settings are the best "val" model.
#   scripts/fetch-data.sh series && examples/forecast/airline_variants.sh   # TRIDENT_BIN: the binary
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${TRIDENT_BIN:-trident}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
head -109 data/series/airline.csv > "$out/airline108.csv"
for split in val test; do
  file=$PWD/data/series/airline.csv
  [ "$split" = val ] && file=$out/airline108.csv
  for window in 24 36; do
    for hidden in "[]" "[32]"; do
      for wd in 0.0 0.1; do
        name=$split-w$window-h$(tr -d '[]' <<<"$hidden")-wd$wd
        sed -e "s|^dir = .*|dir = \"$out/$name\"|; s|^file = .*|file = \"$file\"|; s|^window = .*|window = $window|" \
            -e "s|^hidden = .*|hidden = $hidden|; s|^weight_decay = .*|weight_decay = $wd|" \
            examples/forecast/airline.toml > "$out/$name.toml"
        "$bin" train --config "$out/$name.toml" > "$out/$name.log" 2>&1
        python3 - "$out/$name/test/metrics.json" "$name" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
print(sys.argv[2], "  ".join(f"{f['name']}={f['metrics']['mae']:.2f}" for f in m["backtest"]["forecasts"]))
PY
      done
    done
  done
done
