#!/usr/bin/env bash
# One-class anomaly detection on Fashion-MNIST, each class in turn the normal one:
# trains examples/autoencoder/fashion-one-class.toml with `normal` set to that class and
# prints its test ROC-AUC beside PCA(16)'s.
#   examples/autoencoder/one_class.sh [trident binary (default: trident)] [extra train flags…]
set -euo pipefail
bin=${1:-trident}
shift || true
classes=("T-shirt/top" "Trouser" "Pullover" "Dress" "Coat" "Sandal" "Shirt" "Sneaker" "Bag" "Ankle boot")
pca=(0.897 0.983 0.880 0.922 0.879 0.877 0.822 0.983 0.810 0.963)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sum=0
printf '%-12s %8s %8s\n' class AUROC PCA16
for i in "${!classes[@]}"; do
  c=${classes[$i]}
  sed "s|^normal = .*|normal = [\"$c\"]|; s|^dir = .*|dir = \"runs/ae-one-class-$i\"|" \
    examples/autoencoder/fashion-one-class.toml > "$tmp/c$i.toml"
  rm -rf "runs/ae-one-class-$i"  # a fresh run each time
  "$bin" train --config "$tmp/c$i.toml" "$@" > "$tmp/log$i" 2>&1 || { cat "$tmp/log$i"; exit 1; }
  auc=$(python3 -c "import json;print(json.load(open('runs/ae-one-class-$i/test/metrics.json'))['reconstruction']['anomaly']['auroc'])")
  sum=$(python3 -c "print($sum + $auc)")
  printf '%-12s %8.4f %8s\n' "$c" "$auc" "${pca[$i]}"
done
printf '%-12s %8.4f %8s\n' mean "$(python3 -c "print($sum / 10)")" 0.902
