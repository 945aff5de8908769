#!/usr/bin/env bash
# Test accuracy of each tabular example over seeds 0..N-1 (each seed is another stratified
# split and initialisation), and of variants of it: the figures in docs/RESULTS.md.
#
#   examples/tabular/seeds.sh [N] [variant]   # variant: as-is (default), raw, softmax, drop, protocol
#
# raw: scaling = "none" (what standardisation buys); softmax: no hidden layer; drop:
# rows with a missing value left out instead of imputed (penguins only has any); protocol:
# the reference protocol of examples/tabular/reference.py (softmax regression, 500
# full-batch steps of plain gradient descent at lr 0.5).
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-10}
variant=${2:-as-is}
bin=${TRIDENT_BIN:-trident}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for name in wine breast_cancer penguins; do
  accs=()
  for seed in $(seq 0 $((n - 1))); do
    cfg="$work/$name-$seed.toml"
    sed -e "s/^seed = 0/seed = $seed/" -e "s|^dir = .*|dir = \"$work/$name-$seed\"|" "examples/tabular/$name.toml" > "$cfg"
    case $variant in
      raw) sed -i 's/^scaling = .*/scaling = "none"/' "$cfg" ;;
      softmax) sed -i 's/^hidden = .*/hidden = []/' "$cfg" ;;
      drop) sed -i 's/^missing = .*/missing = "drop"/' "$cfg" ;;
      protocol)
        sed -i -e 's/^hidden = .*/hidden = []/' -e 's/^dropout = .*//' -e 's/^batch_size = .*/batch_size = 100000/' \
          -e 's/^epochs = .*/epochs = 500/' -e 's/^lr = .*/lr = 0.5/' -e 's/^log_every = .*/log_every = 100/' \
          -e 's/^name = "adamw"/name = "sgd"/' "$cfg" ;;
      as-is) ;;
      *) echo "unknown variant $variant" >&2; exit 2 ;;
    esac
    "$bin" train --config "$cfg" >/dev/null 2>"$work/log" || { cat "$work/log" >&2; exit 1; }
    accs+=("$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['report']['accuracy'])" "$work/$name-$seed/test/metrics.json")")
  done
  python3 - "$name" "$variant" "${accs[@]}" <<'PY'
import sys, statistics
name, variant, accs = sys.argv[1], sys.argv[2], [float(a) for a in sys.argv[3:]]
print(f"{name:14s} {variant:8s} seeds {len(accs):2d}  mean {statistics.mean(accs):.4f}  min {min(accs):.4f}  max {max(accs):.4f}  "
      f"all: {' '.join(f'{a:.3f}' for a in accs)}")
PY
done
