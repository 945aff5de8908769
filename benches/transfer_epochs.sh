#!/usr/bin/env bash
# The transfer-learning example (examples/transfer/fashion-finetune.toml: EfficientNet-Lite0
# on 100 Fashion-MNIST images per class at 112 px, batch 32) in Trident beside PyTorch's
# equivalent (benches/peers/torch_transfer.py), per arm (fine-tune, linear probe, from
# scratch), in interleaved rounds on this machine.
#
#   benches/transfer_epochs.sh [rounds] [arms …]   # TRIDENT_BIN: the binary (default trident)
#
# Trident trains two epochs and its figure is the second's `epoch_seconds` in
# metrics.jsonl (the training pass; validation and checkpoints are not counted); the test
# part is cut to 64 images so that its evaluation does not dominate the run. PyTorch's
# figure is its loop over as many batches after 3 warm-up steps.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
shift || true
arms=("${@:-finetune}")
bin=${TRIDENT_BIN:-trident}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) (family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs)), $(nproc) cores; $(date -u '+%F %H:%M UTC')"
python3 - "$work" <<'PY'
import gzip, sys
src, dst = "data/fashion-mnist/t10k-", sys.argv[1] + "/t10k-"
for name, header, size in (("images-idx3-ubyte.gz", 16, 784), ("labels-idx1-ubyte.gz", 8, 1)):
    raw = bytearray(gzip.open(src + name).read())
    raw[4:8] = (64).to_bytes(4, "big")
    open(dst + name, "wb").write(gzip.compress(bytes(raw[:header + 64 * size])))
PY
for r in $(seq 1 "$rounds"); do
  for arm in "${arms[@]}"; do
    case $arm in
      finetune) edit='' ;;
      probe) edit='s/^mode = .*/mode = "probe"/; s/^lr = .*/lr = 1e-2/' ;;
      scratch) edit='/^pretrained = /d' ;;
      *) echo "unknown arm $arm (finetune, probe, scratch)" >&2; exit 2 ;;
    esac
    sed -e "s|^dir = .*|dir = \"$work/$arm-$r\"|; s|^test_images = .*|test_images = \"$work/t10k-images-idx3-ubyte.gz\"|" \
        -e "s|^test_labels = .*|test_labels = \"$work/t10k-labels-idx1-ubyte.gz\"|; $edit" \
        examples/transfer/fashion-finetune.toml > "$work/$arm.toml"
    "$bin" train --config "$work/$arm.toml" --epochs 2 >/dev/null 2>"$work/log" || { cat "$work/log" >&2; exit 1; }
    batches=$(python3 - "$work/$arm-$r" "$arm" <<'PY'
import json, math, sys
run, arm = sys.argv[1], sys.argv[2]
r = [json.loads(l) for l in open(f"{run}/metrics.jsonl")][1]
n = round(r["examples_per_second"] * r["epoch_seconds"])
print(f"{arm:8s} trident  {n} images  {r['epoch_seconds']:.2f} s  {r['examples_per_second']:,.1f} ex/s", file=sys.stderr)
print(math.ceil(n / 32))
PY
)
    python3 benches/peers/torch_transfer.py "$arm" "$batches" | tail -1
  done
done
