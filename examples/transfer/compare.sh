#!/usr/bin/env bash
# Transfer learning on Fashion-MNIST with 10 and 100 training images per class: the same
# EfficientNet-Lite0 fine-tuned from its ImageNet weights, as a linear probe on them
# (frozen, only the new classifier trains, lr 1e-2), and from scratch — each from
# examples/transfer/fashion-finetune.toml with only those keys changed; the test
# accuracy on the 10,000 test images of each.
#   scripts/fetch-data.sh fashion efficientnet
#   examples/transfer/compare.sh [trident binary (default: trident)] [sizes (default: "10 100")]
# KEEP=1 keeps each arm's finished run (one with test/metrics.json) instead of training it
# again: an interrupted comparison goes on where it stopped. ARMS picks arms (default
# "finetune probe scratch").
set -euo pipefail
bin=${1:-trident}
sizes=${2:-10 100}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
base=examples/transfer/fashion-finetune.toml
printf '%-10s %-10s %9s %9s %10s\n' per_class arm accuracy macro-F1 'epoch (s)'
for n in $sizes; do
  for arm in ${ARMS:-finetune probe scratch}; do
    run="runs/transfer-$arm-$n"
    case $arm in
      finetune) edit='' ;;
      probe) edit='s/^mode = .*/mode = "probe"/; s/^lr = .*/lr = 1e-2/' ;;
      scratch) edit='/^pretrained = /d' ;;
    esac
    sed -e "s|^dir = .*|dir = \"$run\"|; s/^per_class = .*/per_class = $n/; $edit" "$base" > "$tmp/$arm-$n.toml"
    if [[ ${KEEP:-0} != 1 || ! -f $run/test/metrics.json ]]; then
      rm -rf "$run"  # a fresh run
      "$bin" train --config "$tmp/$arm-$n.toml" > "$tmp/log" 2>&1 || { cat "$tmp/log"; exit 1; }
    fi
    python3 - "$run" "$n" "$arm" <<'PY'
import json, sys, statistics
run, n, arm = sys.argv[1:]
m = json.load(open(f"{run}/test/metrics.json"))["report"]
epochs = [json.loads(l)["epoch_seconds"] for l in open(f"{run}/metrics.jsonl")]
print(f"{n:<10} {arm:<10} {m['accuracy']:9.4f} {m['macro_f1']:9.4f} {statistics.median(epochs):10.1f}")
PY
  done
done
