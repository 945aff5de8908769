#!/usr/bin/env bash
# Trident against PyTorch on whatever CPU this is, in one command: Trident's MiniLM, Fashion
# CNN and Fashion ViT training steps (f32 and bf16) against PyTorch with `torch.compile`
# (inductor, fused AdamW; bf16 autocast too where the CPU has AMX),
# interleaved by benches/step_ab.sh, and the ratio table docs/PERFORMANCE.md keeps per CPU.
#
#   benches/torch_steps.sh [ROUNDS]        # default 3 (MiniLM 8 steps a run, vision 20)
#
# Needs a release build of the two step programs, torch + transformers, and the data:
#   cargo build --release -p trident-train --example minilm_step --example vision_step
#   pip install torch transformers safetensors     # (+ mkl on Intel: Trident's GEMM there)
#   scripts/fetch-data.sh minilm fashion
# The first lines name the CPU and the instruction sets that decide the kernels (AVX2,
# AVX-512, AVX512-BF16, AMX) and the GEMM and bf16 kernels Trident picked.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
bins=target/release/examples
for b in minilm_step vision_step; do
  [ -x "$bins/$b" ] || { echo "no $bins/$b: cargo build --release -p trident-train --example $b" >&2; exit 2; }
done
python3 -c 'import torch, transformers' 2>/dev/null || { echo "needs torch and transformers (pip install torch transformers safetensors)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { [[ " $flags " == *" $1 "* ]] && echo yes || echo no; }
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) (family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs), model $(grep -m1 '^model[[:space:]]*:' /proc/cpuinfo | cut -d: -f2 | xargs)), $(nproc) cores; $(date -u '+%F %H:%M UTC')"
echo "AVX2 $(has avx2), AVX-512F $(has avx512f), AVX512-BF16 $(has avx512_bf16), AMX-BF16 $(has amx_bf16)"
amx=$(has amx_bf16)

# Two-line wrappers, one per program (step_ab.sh runs `PROGRAM DATA STEPS`).
wrap() { # name, command...
  local name=$1; shift
  printf '#!/bin/sh\nexec %s "$@"\n' "$*" > "$work/$name"
  chmod +x "$work/$name"
}
torch="env OMP_NUM_THREADS=2 COMPILE=1"
wrap trident_f32 "$PWD/$bins/minilm_step"
wrap trident_bf16 "env PRECISION=bf16 $PWD/$bins/minilm_step"
wrap compiled_f32 "$torch python3 $PWD/benches/peers/torch_minilm_step.py"
wrap vtrident_f32 "$PWD/$bins/vision_step"
wrap vtrident_bf16 "env PRECISION=bf16 $PWD/$bins/vision_step"
wrap vcompiled_f32 "$torch python3 $PWD/benches/peers/torch_vision_step.py"
minilm=("$work/trident_f32" "$work/trident_bf16" "$work/compiled_f32")
vision=("$work/vtrident_f32" "$work/vtrident_bf16" "$work/vcompiled_f32")
if [ "$amx" = yes ]; then
  wrap compiled_bf16 "env PRECISION=bf16 $torch python3 $PWD/benches/peers/torch_minilm_step.py"
  wrap vcompiled_bf16 "env PRECISION=bf16 $torch python3 $PWD/benches/peers/torch_vision_step.py"
  minilm+=("$work/compiled_bf16")
  vision+=("$work/vcompiled_bf16")
fi
"$bins/minilm_step" data/minilm 1 2>&1 | grep -E '^(GEMM|bf16)' || true

# Inductor's cache is not keyed by the instruction set PyTorch is held to: a fresh one.
export TORCHINDUCTOR_CACHE_DIR="$work/inductor"
run() { # step name, DATA, steps, programs...
  local name=$1 data=$2 steps=$3; shift 3
  echo "== $name ($rounds rounds × $steps steps, interleaved)"
  DATA=$data benches/step_ab.sh "$rounds" "$steps" "$@" | tee "$work/$name.txt"
}
run minilm data/minilm 8 "${minilm[@]}"
run cnn cnn 20 "${vision[@]}"
run vit vit 20 "${vision[@]}"

python3 - "$work" "$amx" <<'PY'
import re, sys
work, amx = sys.argv[1], sys.argv[2] == "yes"
print("\n`torch.compile` step median / Trident's (the issue's goal: >= 1.25x in f32 on every CPU)")
print("| step | Trident f32 | Trident bf16 | compiled f32 | compiled / Trident f32 | compiled f32 / Trident bf16 |"
      + (" compiled bf16 | compiled bf16 / Trident bf16 |" if amx else ""))
print("|---|---|---|---|---|---|" + ("---|---|" if amx else ""))
for name in ("minilm", "cnn", "vit"):
    med = {}
    for line in open(f"{work}/{name}.txt"):
        m = re.match(r"v?(\w+): n=\d+ step fastest \S+ p25 \S+ median (\S+)", line)
        if m:
            med[m.group(1)] = float(m.group(2))
    t32, t16, c32 = med["trident_f32"], med["trident_bf16"], med["compiled_f32"]
    row = f"| {name} | {t32:.0f} ms | {t16:.0f} ms | {c32:.0f} ms | **{c32 / t32:.2f}x** | {c32 / t16:.2f}x |"
    if amx:
        c16 = med["compiled_bf16"]
        row += f" {c16:.0f} ms | {c16 / t16:.2f}x |"
    print(row)
PY
