#!/usr/bin/env bash
# The Fashion-MNIST GAN examples (examples/gan/fashion-{dcgan,wgan,wgan-gp}.toml) in Trident beside
# PyTorch's equivalent (benches/peers/torch_gan.py), on the same number of batches, in
# interleaved rounds on this machine.
#
#   benches/gan_epochs.sh [rounds] [batches] [dcgan|wgan|wgan-gp …]   # TRIDENT_BIN: the binary (default trident),
#                                             # or several, space-separated, run in turn
#   PRECISION=bf16 benches/gan_epochs.sh …   # both sides in bf16 mixed precision (Trident's
#                                             # precision = "bf16", PyTorch's autocast)
#   TRIDENT_BIN="old/trident new/trident" PEER=none benches/gan_epochs.sh 6 60 wgan
#                                             # an A/B of Trident builds, interleaved, no PyTorch
#
# Trident runs one epoch of `batches` batches (data.max_train, no [gan] judge) and its
# figure is that epoch's `epoch_seconds` in metrics.jsonl (the training pass; the sample
# grid and checkpoint after it are not counted); PyTorch's is its loop over as many
# batches after 5 warm-up batches.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
batches=${2:-100}
shift 2 || true
kinds=("${@:-dcgan}")
bin=${TRIDENT_BIN:-trident}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) (family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs)), $(nproc) cores; $(date -u '+%F %H:%M UTC')"
for r in $(seq 1 "$rounds"); do
  for kind in "${kinds[@]}"; do
    bs=$(sed -n 's/^batch_size = //p' "examples/gan/fashion-$kind.toml")
    # One epoch of `batches` batches, without the judge.
    sed -e "s|^dir = .*|dir = \"$work/$kind-$r\"|" \
        -e "s|^val_fraction = .*|val_fraction = 0.0\nmax_train = $((batches * bs))|" \
        -e '/^\[gan\]/,$d' "examples/gan/fashion-$kind.toml" > "$work/$kind.toml"
    if [ "${PRECISION:-f32}" = bf16 ]; then
      sed -i 's/^\[train\]$/[train]\nprecision = "bf16"/' "$work/$kind.toml"
    fi
    for b in $bin; do
      rm -rf "$work/$kind-$r"
      "$b" train --config "$work/$kind.toml" --epochs 1 >/dev/null 2>"$work/log" || { cat "$work/log" >&2; exit 1; }
      python3 - "$work/$kind-$r" "$kind" "$batches" "$bs" "$b" <<'PY'
import json, sys
run, kind, batches, bs, b = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
r = [json.loads(l) for l in open(f"{run}/metrics.jsonl")][0]
print(f"{kind:7s} trident ({b})  {batches} batches of {bs}  {r['epoch_seconds']:.2f} s  {r['examples_per_second']:,.0f} ex/s")
PY
    done
    if [ "${PEER:-torch}" != none ]; then
      python3 benches/peers/torch_gan.py "$kind" "$batches" | tail -1
    fi
  done
done
