#!/usr/bin/env bash
# An epoch of the Fashion-MNIST autoencoder examples (examples/autoencoder/fashion-{dense,conv}.toml)
# in Trident beside PyTorch's equivalent (benches/peers/torch_autoencoder.py), in
# interleaved rounds on this machine.
#
#   benches/autoencoder_epochs.sh [rounds] [dense|conv …]   # TRIDENT_BIN: the binary (default trident)
#
# Trident's figure is `epoch_seconds` of the second epoch in metrics.jsonl (the training
# pass, not its validation or checkpoint), PyTorch's its second epoch's loop.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
shift || true
kinds=("${@:-dense}")
bin=${TRIDENT_BIN:-trident}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) (family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs)), $(nproc) cores; $(date -u '+%F %H:%M UTC')"
for r in $(seq 1 "$rounds"); do
  for kind in "${kinds[@]}"; do
    sed -e "s|^dir = .*|dir = \"$work/$kind-$r\"|" "examples/autoencoder/fashion-$kind.toml" > "$work/$kind.toml"
    "$bin" train --config "$work/$kind.toml" --epochs 2 >/dev/null 2>"$work/log" || { cat "$work/log" >&2; exit 1; }
    python3 - "$work/$kind-$r" "$kind" <<'PY'
import json, sys
run, kind = sys.argv[1], sys.argv[2]
r = [json.loads(l) for l in open(f"{run}/metrics.jsonl")][1]
print(f"{kind:5s} trident  epoch 2  {r['epoch_seconds']:.2f} s  {r['examples_per_second']:,.0f} ex/s  loss {r['train_loss']:.4f}")
PY
    python3 benches/peers/torch_autoencoder.py "$kind" 2 | tail -1
  done
done
