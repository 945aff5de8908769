"""Images that are expensive to load: 640x480 RGB JPEGs of noise (quality 90), dark or
light, resized by the loader to 32x32. Decoding dominates a small CNN's step, so a run
with loader.num_workers = 0 is data-bound: the profiler's data-bound demonstration.

    python3 benches/profile_demo/make_jpegs.py /tmp/demo-data    # 1,400 files, 288 MB
    trident train --config benches/profile_demo/data.toml --profile
"""
import os
import random
import sys

from PIL import Image

out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/demo-data"
random.seed(0)
for split, n in [("train", 1200), ("test", 200)]:
    for c in ["dark", "light"]:
        os.makedirs(f"{out}/{split}/{c}", exist_ok=True)
    for i in range(n):
        c = "dark" if i % 2 == 0 else "light"
        base = 60 if c == "dark" else 190
        img = Image.effect_noise((640, 480), 60).point(lambda v: max(0, min(255, v - 128 + base))).convert("RGB")
        img.save(f"{out}/{split}/{c}/{i}.jpg", quality=90)
print(f"wrote {out}/train and {out}/test")
