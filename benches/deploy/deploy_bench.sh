#!/usr/bin/env bash
# Deployment benchmark, not a test: the fine-tuned MiniLM of runs/sentiment served
# text in -> label out, by
#   (a) trident serve: `trident package` (native tokenizer backend + exported ONNX on ONNX
#       Runtime) in three variants: portable fp32, ort-fused fp32, ort-fused int8;
#   (b) NVIDIA Triton 2.51 (the tritonserver binary of nvidia-pytriton 0.7.0) the way its
#       users serve it today: an ensemble of a Python-backend tokenizer step
#       (benches/deploy/triton_tokenize.py, HF tokenizers) and the graph torch.onnx.export
#       writes from the same checkpoint (benches/deploy/torch_export.py), run by onnxruntime
#       inside the Python backend (benches/peers/triton_ort_model.py: that package has no
#       native onnxruntime backend);
# with the same load generator (`trident bench`, binary tensors, 256 VADER texts) at each
# concurrency, one instance and 2 intra-op threads everywhere. Then the graphs alone on ORT.
#
#   PEERS=/work/peers TORCH_PY=/work/venv-torch/bin/python benches/deploy/deploy_bench.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PEERS=${PEERS:-/work/peers}
TORCH_PY=${TORCH_PY:-/work/venv-torch/bin/python}
CKPT=${CKPT:-runs/sentiment/best}
OUT=${1:-/tmp/deploy_out}
CONCS=${CONCS:-"1 2 4 8 16"}
WINDOW=${WINDOW:-3000}
mkdir -p "$OUT"
TS_DIR=$PEERS/venv_trt/lib/python3.11/site-packages/pytriton/tritonserver
cp -n "$TS_DIR/python_backend_stubs/3.11/triton_python_backend_stub" "$TS_DIR/backends/python/" 2>/dev/null || true

cargo build --release -p trident-cli --features ort
BIN=${CARGO_TARGET_DIR:-target}/release/trident
python3 benches/deploy/make_texts.py data/vader "$OUT/texts.json"

# (a) Trident's packages.
rm -rf "$OUT/trident" && mkdir -p "$OUT/trident"
"$BIN" package --model "$CKPT" --repository "$OUT/trident" --name portable
"$BIN" package --model "$CKPT" --repository "$OUT/trident" --name fused --flavour ort-fused
"$BIN" package --model "$CKPT" --repository "$OUT/trident" --name int8 --flavour ort-fused --precision int8

# (b) Triton's repository.
T=$OUT/triton
rm -rf "$T" && mkdir -p "$T/tokenize/1" "$T/torch_onnx/1" "$T/sentiment/1"
cp benches/deploy/triton_tokenize.py "$T/tokenize/1/model.py"
cp "$CKPT/tokenizer.json" "$T/tokenize/1/"
cp benches/peers/triton_ort_model.py "$T/torch_onnx/1/model.py"
"$TORCH_PY" benches/deploy/torch_export.py "$CKPT" "$T/torch_onnx/1/model.onnx" "$OUT/trident/portable_onnx/1/model.onnx"
python3 - "$T" "$CKPT" <<'PY'
import json, sys
t, ckpt = sys.argv[1], sys.argv[2]
card = json.load(open(f"{ckpt}/trident.json"))
k, max_len = len(card["classes"]), card["input"]["max_len"]
labels = "\n".join(card["classes"]) + "\n"
batching = "max_batch_size: 32\ndynamic_batching { max_queue_delay_microseconds: 2000 }\n"
cpu = "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
ids = "\n".join(f'  {{ name: "{n}" data_type: TYPE_INT64 dims: [ -1 ] }},' for n in ["input_ids", "attention_mask", "token_type_ids"]).rstrip(",")
outs = f'  {{ name: "logits" data_type: TYPE_FP32 dims: [ {k} ] label_filename: "labels.txt" }},\n  {{ name: "probabilities" data_type: TYPE_FP32 dims: [ {k} ] label_filename: "labels.txt" }}'
open(f"{t}/tokenize/config.pbtxt", "w").write(
    f'name: "tokenize"\nbackend: "python"\n{batching}{cpu}input [ {{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }} ]\noutput [\n{ids}\n]\n'
    f'parameters {{ key: "max_length" value {{ string_value: "{max_len}" }} }}\n')
open(f"{t}/torch_onnx/config.pbtxt", "w").write(
    f'name: "torch_onnx"\nbackend: "python"\n{batching}{cpu}input [\n{ids}\n]\noutput [\n{outs}\n]\n')
for d in ["torch_onnx", "sentiment"]:
    open(f"{t}/{d}/labels.txt", "w").write(labels)
m = lambda names: ", ".join(f'{{ key: "{n}" value: "{n}" }}' for n in names)
tok = ["input_ids", "attention_mask", "token_type_ids"]
open(f"{t}/sentiment/config.pbtxt", "w").write(
    f'name: "sentiment"\nplatform: "ensemble"\nmax_batch_size: 32\n'
    f'input [ {{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }} ]\noutput [\n{outs}\n]\n'
    f'ensemble_scheduling {{ step [\n'
    f'  {{ model_name: "tokenize" model_version: -1 input_map [ {m(["TEXT"])} ] output_map [ {m(tok)} ] }},\n'
    f'  {{ model_name: "torch_onnx" model_version: -1 input_map [ {m(tok)} ] output_map [ {m(["logits", "probabilities"])} ] }}\n] }}\n')
PY

wait_ready() { for _ in $(seq 1 240); do curl -sf -o /dev/null "$1" && return 0; sleep 0.5; done; echo "not ready: $1"; return 1; }

bench() {  # bench NAME PORT MODEL
  for c in $CONCS; do
    "$BIN" bench -u "127.0.0.1:$2" -m "$3" --input-data "$OUT/texts.json" --encoding binary \
      --concurrency-range "$c:$c" --measurement-interval "$WINDOW" --warmup 1 --max-trials 4 \
      -f "$OUT/$1_c$c.csv" --json "$OUT/$1_c$c.json" > "$OUT/$1_c$c.log" 2>&1 \
      || { echo "bench $1 c$c failed:"; tail -5 "$OUT/$1_c$c.log"; }
  done
}

"$BIN" serve --model-repository "$OUT/trident" --http-address 127.0.0.1 --http-port 18100 --metrics-port 18102 \
  > "$OUT/trident.log" 2>&1 &
pid=$!
wait_ready http://127.0.0.1:18100/v2/health/ready
for m in portable fused int8; do bench "trident_$m" 18100 "$m"; done
kill -TERM $pid; wait $pid || true

PATH=$PEERS/venv_trt/bin:$PATH PEER_THREADS=2 "$TS_DIR/bin/tritonserver" --model-repository="$T" \
  --backend-directory="$TS_DIR/backends" --cache-directory="$TS_DIR/caches" \
  --http-address=127.0.0.1 --grpc-address=127.0.0.1 --metrics-address=127.0.0.1 \
  --http-port 18200 --grpc-port 18201 --metrics-port 18202 > "$OUT/triton.log" 2>&1 &
pid=$!
wait_ready http://127.0.0.1:18200/v2/health/ready
bench triton 18200 sentiment
kill -TERM $pid; wait $pid || true

"$PEERS/venv_trt/bin/python" benches/deploy/ort_alone.py \
  "trident-portable=$OUT/trident/portable_onnx/1/model.onnx" \
  "trident-ort-fused=$OUT/trident/fused_onnx/1/model.onnx" \
  "trident-ort-fused-int8=$OUT/trident/int8_onnx/1/model.onnx" \
  "torch.onnx.export=$T/torch_onnx/1/model.onnx" \
  --tokenizer "$CKPT/tokenizer.json" --texts "$OUT/texts.json" | tee "$OUT/ort_alone.txt"
python3 benches/deploy/summarize.py "$OUT"
