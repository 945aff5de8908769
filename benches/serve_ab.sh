#!/usr/bin/env bash
# Interleaved A/B of two `trident` builds serving the same model: for each round, each build
# (in alternating order) serves examples/model_repository and the same load generator (build
# B's `trident bench`) sweeps concurrency 1 and 4 against it. Prints per-round rows and the
# medians of throughput and p50/p99 per build and level. Not a test.
#
#   benches/serve_ab.sh BIN_A BIN_B [ROUNDS] [MODEL]
set -euo pipefail
cd "$(dirname "$0")/.."
A=$1 B=$2 ROUNDS=${3:-5} MODEL=${4:-digits}
OUT=$(mktemp -d)
PORT=18190
run_one() {  # run_one LABEL BIN ROUND
  local label=$1 bin=$2 round=$3
  "$bin" serve --model-repository examples/model_repository --http-address 127.0.0.1 --http-port $PORT \
    --grpc-port 0 --metrics-port 0 > "$OUT/$label.$round.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do curl -sf 127.0.0.1:$PORT/v2/models/$MODEL/ready >/dev/null && break; sleep 0.1; done
  "$B" bench -u 127.0.0.1:$PORT -m "$MODEL" --concurrency-range 1:4:3 --measurement-interval 2000 \
    --warmup 1 --max-trials 6 -f "$OUT/$label.$round.csv" > "$OUT/$label.$round.bench" 2>&1
  kill $pid; wait $pid 2>/dev/null || true
}
for r in $(seq "$ROUNDS"); do
  if (( r % 2 )); then run_one A "$A" $r; run_one B "$B" $r; else run_one B "$B" $r; run_one A "$A" $r; fi
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import csv, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for label in "AB":
    for r in range(1, rounds + 1):
        for row in csv.DictReader(open(f"{out}/{label}.{r}.csv")):
            rows.setdefault((label, row["Concurrency"]), []).append(
                (float(row["Inferences/Second"]), float(row["p50 latency"]) / 1000, float(row["p99 latency"]) / 1000))
print("build concurrency  infer/s(median)  p50 ms  p99 ms  rounds")
for (label, conc), v in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    med = [statistics.median(x[i] for x in v) for i in range(3)]
    print(f"{label:5} {conc:>11}  {med[0]:15.0f}  {med[1]:6.3f}  {med[2]:6.3f}  {len(v)}")
for conc in sorted({c for _, c in rows}):
    a = statistics.median(x[0] for x in rows[("A", conc)]); b = statistics.median(x[0] for x in rows[("B", conc)])
    print(f"concurrency {conc}: B/A throughput {b / a:.3f}")
PY
