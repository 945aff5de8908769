#!/usr/bin/env bash
# First-request latency with and without `model_warmup`, not a test: the
# package of runs/sentiment served fresh each time, on each ONNX engine; times the
# server's start-to-ready and the first three requests (one VADER text each, curl).
#
#   benches/deploy/first_request.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/../.."
CKPT=${CKPT:-runs/sentiment/best}
OUT=${1:-/tmp/first_request}
BIN=${CARGO_TARGET_DIR:-target}/release/trident
rm -rf "$OUT" && mkdir -p "$OUT"
"$BIN" package --model "$CKPT" --repository "$OUT/with" --name s 2>/dev/null
"$BIN" package --model "$CKPT" --repository "$OUT/without" --name s 2>/dev/null
python3 - "$OUT/without" <<'PY'
import re, sys, pathlib
for f in pathlib.Path(sys.argv[1]).glob("*/config.pbtxt"):
    text = f.read_text()
    start = text.find("model_warmup [")
    if start >= 0:
        depth, i = 0, start
        while True:
            depth += {"[": 1, "]": -1}.get(text[i], 0)
            if text[i] == "]" and depth == 0:
                break
            i += 1
        f.write_text(text[:start] + text[i + 2:])
PY
body='{"inputs":[{"name":"TEXT","shape":[1,1],"datatype":"BYTES","data":["Covid cases are increasing fast, and the hospitals are full again!"]}]}'
for engine in ort tract; do
  for w in with without; do
    t0=$(date +%s.%N)
    "$BIN" serve --model-repository "$OUT/$w" --http-address 127.0.0.1 --http-port 18300 --metrics-port 18302 \
      --onnx-engine "$engine" > "$OUT/$engine-$w.log" 2>&1 &
    pid=$!
    until curl -sf -o /dev/null http://127.0.0.1:18300/v2/health/ready; do sleep 0.02; done
    t1=$(date +%s.%N)
    line="$engine $w warm-up: ready after $(python3 -c "print(f'{$t1 - $t0:.2f}')") s; requests (ms):"
    for k in 1 2 3; do
      ms=$(curl -s -o /dev/null -w "%{time_total}" -XPOST http://127.0.0.1:18300/v2/models/s/infer -d "$body")
      line+=" $(python3 -c "print(f'{$ms * 1000:.1f}')")"
    done
    echo "$line" | tee -a "$OUT/summary.txt"
    kill -TERM $pid; wait $pid || true
  done
done
