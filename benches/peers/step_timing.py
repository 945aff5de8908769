"""What the PyTorch step peers (torch_minilm_step.py, torch_vision_step.py) share: the
mode from the environment and the timed loop whose lines benches/step_ab.sh reads.

PRECISION=bf16 runs the forward pass under torch.autocast("cpu", dtype=torch.bfloat16);
COMPILE=1 selects torch.compile (inductor) with AdamW(fused=True); WARMUP untimed steps
(default 3 compiled, 0 eager) run first, so no timed step includes compilation.
"""
import contextlib
import os
import resource
import statistics
import sys
import time

import torch

bf16 = os.environ.get("PRECISION") == "bf16"
compiled = os.environ.get("COMPILE", "0") not in ("", "0")
warmup = int(os.environ.get("WARMUP", "3" if compiled else "0"))


def describe():
    """The mode, as the first line of a run prints it."""
    return (f"precision: {'bf16 autocast' if bf16 else 'f32'}; "
            f"{'torch.compile (inductor), fused AdamW' if compiled else 'eager'}")


def run(label, steps, batch, forward, opt):
    """Runs WARMUP untimed steps, then steps 0..steps: `forward()` returns the loss (under
    autocast when PRECISION=bf16), then backward and `opt.step()`. Prints `step N: loss L
    forward F ms  backward B ms  optimizer O ms` per step and the medians of steps 1..steps
    (step 0 warms up) under `label`, with the batch and the peak RSS (ru_maxrss)."""
    phases = ([], [], [])
    t_warm = time.perf_counter()
    for step in range(-warmup, steps + 1):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            loss = forward()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        if step < 0:
            if step == -1:
                print(f"warm-up ({warmup} steps, compilation included): {t3 - t_warm:.1f} s", file=sys.stderr)
            continue
        ms = ((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3)
        print(f"step {step}: loss {loss.item():.6f}  forward {ms[0]:.1f} ms  backward {ms[1]:.1f} ms  "
              f"optimizer {ms[2]:.1f} ms", file=sys.stderr)
        if step > 0:
            for p, v in zip(phases, ms):
                p.append(v)
    f, b, o = (statistics.median(p) for p in phases)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    mode = "compiled" if compiled else "eager"
    print(f"pytorch {torch.__version__} {label}{mode} median over {steps} steps: forward {f:.1f} ms  "
          f"backward {b:.1f} ms  optimizer {o:.1f} ms  step {f+b+o:.1f} ms  batch {batch}  peak RSS {peak:.0f} MiB")
