#!/usr/bin/env python3
"""Classify five handwritten digits with the `digits` model served by Trident (or Triton).

    trident serve --model-repository examples/model_repository
    pip install "tritonclient[http]" numpy
    python examples/model_repository/client.py            # --url 127.0.0.1:8000

The images and their true labels come from digits_sample.json (written by
make_digits.py from the held-out test split, five different digits).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="127.0.0.1:8000", help="HTTP host:port")
    parser.add_argument("--model", default="digits")
    args = parser.parse_args()

    sample = json.loads((HERE / "digits_sample.json").read_text())
    pixels = np.asarray(sample["pixels"], dtype=np.float32)  # [5, 64], values 0..16
    labels = sample["labels"]

    client = httpclient.InferenceServerClient(url=args.url)
    if not client.is_model_ready(args.model):
        print(f"model {args.model!r} is not ready on {args.url}", file=sys.stderr)
        return 1

    inp = httpclient.InferInput("pixels", list(pixels.shape), "FP32")
    inp.set_data_from_numpy(pixels, binary_data=True)
    out = httpclient.InferRequestedOutput("probabilities", binary_data=True)
    result = client.infer(args.model, inputs=[inp], outputs=[out])
    probs = result.as_numpy("probabilities")  # [5, 10]

    correct = 0
    for i, (p, label) in enumerate(zip(probs, labels)):
        pred = int(np.argmax(p))
        correct += pred == label
        image = pixels[i].reshape(8, 8)
        art = "\n".join(
            "    " + "".join(" .:-=+*#%@"[min(9, int(v * 10 / 17))] * 2 for v in row)
            for row in image
        )
        print(f"digit {i}: predicted {pred} (p={p[pred]:.3f}), true {label}")
        print(art)
    print(f"{correct}/{len(labels)} correct")
    return 0


if __name__ == "__main__":
    sys.exit(main())
