#!/usr/bin/env bash
# Serving benchmark: perf_analyzer 2.51 against trident serve and against
# the onnxruntime-in-Python peer, same models, same session. Not a test.
#
#   PA_DIR=/work/bench benches/serve_bench.sh [OUT_DIR]
#
# PA_DIR holds perf_analyzer and palibs/ (libb64, libcudart) (perf_analyzer from the tritonclient wheel,
# its libraries from nvidia-pytriton; docs/PERFORMANCE.md says how).
# Writes one perf_analyzer CSV per run into OUT_DIR (default /tmp/bench_out) and prints a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
PA_DIR=${PA_DIR:-/work/bench}
OUT=${1:-/tmp/bench_out}
REPO=/tmp/bench_repo
ENGINE=${ENGINE:-ort}
mkdir -p "$OUT"
python3 benches/make_bench_repo.py "$REPO" >/dev/null
cargo build --release -p trident-cli --features ort 2>/dev/null
BIN=${CARGO_TARGET_DIR:-target}/release/trident

pa() {  # pa NAME PORT MODEL CONCURRENCY [extra...]
  local name=$1 port=$2 model=$3 conc=$4; shift 4
  # Trident's latency histograms, scraped around the run: their difference gives the
  # server-side p50/p99 of this run alone (benches/summarize.py).
  [ "$port" = 18100 ] && curl -s 127.0.0.1:18102/metrics > "$OUT/$name.before"
  LD_LIBRARY_PATH=$PA_DIR/palibs "$PA_DIR/perf_analyzer" -m "$model" -u "127.0.0.1:$port" -i http \
    --concurrency-range "$conc" --measurement-mode count_windows --measurement-request-count 1500 \
    --stability-percentage 15 --max-trials 10 -f "$OUT/$name.csv" "$@" > "$OUT/$name.log" 2>&1 \
    || { echo "perf_analyzer $name failed:"; tail -5 "$OUT/$name.log"; }
  [ "$port" = 18100 ] && curl -s 127.0.0.1:18102/metrics > "$OUT/$name.after"
  return 0
}

"$BIN" serve --model-repository "$REPO" --http-address 127.0.0.1 --http-port 18100 --metrics-port 18102 \
  --onnx-engine "$ENGINE" > "$OUT/trident.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
sleep 2
for c in 1 4 16; do
  pa "trident_digits_nobatch_c$c" 18100 digits_nobatch $c
  pa "trident_digits_c$c" 18100 digits $c
  pa "trident_mlp_batched_c$c" 18100 mlp_batched $c
  pa "trident_mlp_nobatch_c$c" 18100 mlp_nobatch $c
done
kill -TERM $SERVER; wait $SERVER || true

for model in digits_nobatch mlp_nobatch; do
  python3 benches/peers/ort_kserve_server.py --repo "$REPO" --model $model --port 18500 > "$OUT/peer_$model.log" 2>&1 &
  PEER=$!
  sleep 2
  for c in 1 4 16; do
    pa "peer_${model}_c$c" 18500 $model $c
  done
  kill $PEER; wait $PEER 2>/dev/null || true
done
trap - EXIT
python3 benches/summarize.py "$OUT"
