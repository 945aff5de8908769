#!/usr/bin/env bash
# The throughput table: the MiniLM fine-tune (examples/sentiment/train.toml, bf16,
# fused AdamW) with a global batch of 16, as
#   one      1 process × 2 threads, batch 16
#   threads  --data-parallel 2 (2 replicas × 1 thread, batch 8 each)
#   threads-zero   the same with --zero 1
#   mpi      mpirun -np 2 --dist mpi (2 processes × 1 thread, batch 8 each)
#   mpi-zero       the same with --zero 1
# each profiled over optimizer steps 6..25 (rank 0's phases; the run stops after 25).
# Prints median step, examples/s, the comm phase, and the peak RSS of each process.
#   benches/dp_table.sh [OUT_DIR]   (needs data/vader, data/minilm, a release build with --features ort,mpi)
set -euo pipefail
out=${1:-/tmp/dp-table}
bin=${TRIDENT:-$PWD/target/release/trident}
base=examples/sentiment/train.toml
mkdir -p "$out"
variant() { # name, batch
  sed -e "s|^dir = .*|dir = \"$out/$1\"|" -e "s/^batch_size = 16$/batch_size = $2/" \
      -e 's/^\[train\]$/[train]\nprecision = "bf16"/' "$base" > "$out/$1.toml"
  rm -rf "${out:?}/$1"
}
steps=(--profile-steps 6..25 --stop-after-steps 25)
rss="%M"
variant one 16
/usr/bin/time -f "rss_kib $rss" "$bin" train --config "$out/one.toml" "${steps[@]}" > "$out/one.log" 2>&1
variant threads 8
/usr/bin/time -f "rss_kib $rss" "$bin" train --config "$out/threads.toml" --data-parallel 2 "${steps[@]}" > "$out/threads.log" 2>&1
variant threads-zero 8
/usr/bin/time -f "rss_kib $rss" "$bin" train --config "$out/threads-zero.toml" --data-parallel 2 --zero 1 "${steps[@]}" > "$out/threads-zero.log" 2>&1
for z in "" "--zero 1"; do
  name=mpi${z:+-zero}
  variant "$name" 8
  # shellcheck disable=SC2086
  mpirun --allow-run-as-root --oversubscribe -np 2 /usr/bin/time -f "rss_kib $rss" \
    "$bin" train --config "$out/$name.toml" --dist mpi $z "${steps[@]}" > "$out/$name.log" 2>&1
done
python3 - "$out" <<'PY'
import json, re, sys
out = sys.argv[1]
print("| configuration | median step | examples/s | comm (median) | peak RSS per process | optimizer state per rank |")
print("|---|---|---|---|---|---|")
base = None
for v in ["one", "threads", "threads-zero", "mpi", "mpi-zero"]:
    r = json.load(open(f"{out}/{v}/profile/report.json"))
    step = r["median_step_ms"]
    base = base or step
    comm = next(p["median_ms"] for p in r["phases"] if p["phase"] == "comm")
    log = open(f"{out}/{v}.log").read()
    rss = ", ".join(f"{int(k) / 1024:.0f} MiB" for k in re.findall(r"rss_kib (\d+)", log))
    z = re.search(r"optimizer state (.*?) on this rank, (.*?) unsharded", log)
    state = f"{z.group(1)} (of {z.group(2)})" if z else "whole"
    print(f"| {v} | {step:.0f} ms | {16e3 / step:.1f} | {comm:.1f} ms | {rss} | {state} |")
PY
