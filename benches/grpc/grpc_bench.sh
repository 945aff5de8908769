#!/usr/bin/env bash
# gRPC vs HTTP, Trident vs Triton 2.51. Not a test.
#
#   PEERS=/work/peers benches/grpc/grpc_bench.sh [OUT_DIR]
#
# Model: Triton's `simple` example (INT32[16] add/sub, batch 1 requests), so the numbers
# are the serving path, not a network: Trident runs it as ONNX on ONNX Runtime
# (tests/e2e/official/models/simple); Triton 2.51 (the tritonserver binary of the PyPI
# package nvidia-pytriton 0.7.0, which has only the python backend) runs it as
# benches/grpc/triton_simple_model.py. Load: NVIDIA's perf_analyzer 2.51 (PEERS.md C),
# the same flags for both servers, concurrency 1, 4, 16, count windows of 1000 requests.
# Every server gets the same cores (taskset), and perf_analyzer the rest.
# Writes perf_analyzer CSVs to OUT_DIR (default /tmp/grpc_bench) and prints a summary.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PEERS=${PEERS:-/work/peers}
OUT=${1:-/tmp/grpc_bench}
SERVER_CPUS=${SERVER_CPUS:-0}      # cores of the server under test
CLIENT_CPUS=${CLIENT_CPUS:-1}      # cores of perf_analyzer
COUNT=${COUNT:-1000}
mkdir -p "$OUT"

TS=$PEERS/venv_trt/lib/python3.11/site-packages/pytriton/tritonserver
[ -x "$TS/bin/tritonserver" ] || { echo "Triton 2.51 not set up: see benches/peers/peers_bench.sh"; exit 1; }
cp -n "$TS/python_backend_stubs/3.11/triton_python_backend_stub" "$TS/backends/python/" 2>/dev/null || true
PA_DIR=$PEERS/pa
if [ ! -x "$PA_DIR/perf_analyzer" ]; then
  mkdir -p "$PA_DIR" && cd "$PA_DIR"
  pip download -q --no-deps -d dl6 tritonclient==2.51.0
  unzip -o -q dl6/tritonclient-2.51.0-py3-none-manylinux1_x86_64.whl -d tc251
  cp tc251/tritonclient-2.51.0.data/data/bin/perf_analyzer .
  L=$PEERS/venv_trt/lib/python3.11/site-packages/nvidia_pytriton.libs; mkdir -p palibs
  ln -sf "$L"/libb64-*.so.0d palibs/libb64.so.0d
  ln -sf "$L"/libcudart-*.so.12* palibs/libcudart.so.12
  cd "$ROOT"
fi
PA=(env LD_LIBRARY_PATH="$PA_DIR/palibs" taskset -c "$CLIENT_CPUS" "$PA_DIR/perf_analyzer")

# Triton's repository: the same interface, python backend.
TRT_REPO=$OUT/triton_repo
rm -rf "$TRT_REPO" && mkdir -p "$TRT_REPO/simple/1"
cp "$ROOT/benches/grpc/triton_simple_model.py" "$TRT_REPO/simple/1/model.py"
sed -e 's/platform: "onnxruntime_onnx"/backend: "python"/' "$ROOT/tests/e2e/official/models/simple/config.pbtxt" \
  > "$TRT_REPO/simple/config.pbtxt"
echo 'instance_group [ { count: 1 kind: KIND_CPU } ]' >> "$TRT_REPO/simple/config.pbtxt"
TRI_REPO=$OUT/trident_repo
rm -rf "$TRI_REPO" && mkdir -p "$TRI_REPO" && cp -r "$ROOT/tests/e2e/official/models/simple" "$TRI_REPO/"

cargo build --release -p trident-cli --features ort
BIN=${CARGO_TARGET_DIR:-target}/release/trident

wait_ready() { for _ in $(seq 1 240); do curl -sf -o /dev/null "$1" && return 0; sleep 0.5; done; echo "not ready: $1"; return 1; }

run_pa() {  # run_pa NAME PROTOCOL URL
  "${PA[@]}" -m simple -i "$2" -u "$3" --concurrency-range 1:16:3 --measurement-mode count_windows \
    --measurement-request-count "$COUNT" -s 50 --percentile 50 -f "$OUT/$1.csv" > "$OUT/$1.log" 2>&1 \
    || { echo "perf_analyzer $1 failed:"; tail -5 "$OUT/$1.log"; }
}

# ---- Trident ----
taskset -c "$SERVER_CPUS" "$BIN" serve --model-repository "$TRI_REPO" --http-address 127.0.0.1 --grpc-address 127.0.0.1 \
  --http-port 28000 --grpc-port 28001 --metrics-port 28002 --cores 1 > "$OUT/trident.log" 2>&1 &
TRIDENT=$!
wait_ready http://127.0.0.1:28000/v2/health/ready
run_pa trident_grpc grpc 127.0.0.1:28001
run_pa trident_http http 127.0.0.1:28000
kill -TERM $TRIDENT; wait $TRIDENT || true

# ---- Triton 2.51 ----
PATH=$PEERS/venv_trt/bin:$PATH taskset -c "$SERVER_CPUS" "$TS/bin/tritonserver" --model-repository="$TRT_REPO" \
  --backend-directory="$TS/backends" --cache-directory="$TS/caches" \
  --http-address=127.0.0.1 --grpc-address=127.0.0.1 --metrics-address=127.0.0.1 \
  --http-port 18000 --grpc-port 18001 --metrics-port 18002 > "$OUT/triton.log" 2>&1 &
TRITON=$!
wait_ready http://127.0.0.1:18000/v2/health/ready
run_pa triton_grpc grpc 127.0.0.1:18001
run_pa triton_http http 127.0.0.1:18000
kill -TERM $TRITON; wait $TRITON || true

python3 "$ROOT/benches/grpc/summarize.py" "$OUT"
