#!/usr/bin/env bash
# The breast-cancer anomaly example over splits 0..N-1 (`[run] seed`): the autoencoder's
# test ROC-AUC per seed and the mean, to set beside examples/autoencoder/reference.py N.
#   examples/autoencoder/seeds.sh [N] [trident binary (default: trident)]
set -euo pipefail
n=${1:-10}
bin=${2:-trident}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
all=()
for s in $(seq 0 $((n - 1))); do
  sed "s|^seed = .*|seed = $s|; s|^dir = .*|dir = \"$tmp/run$s\"|" \
    examples/autoencoder/breast_cancer.toml > "$tmp/c.toml"
  "$bin" train --config "$tmp/c.toml" > "$tmp/log" 2>&1 || { cat "$tmp/log"; exit 1; }
  all+=("$(python3 -c "import json;print(round(json.load(open('$tmp/run$s/test/metrics.json'))['reconstruction']['anomaly']['auroc'], 4))")")
done
python3 -c "
v = [float(x) for x in '${all[*]}'.split()]
print(f'autoencoder  seeds {len(v):2d}  mean {sum(v)/len(v):.4f}  min {min(v):.4f}  max {max(v):.4f}  all: ' + ' '.join(f'{a:.3f}' for a in v))
"
