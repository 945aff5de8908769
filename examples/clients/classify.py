#!/usr/bin/env python3
"""Classify texts or images with a model `trident package` made, through NVIDIA's
tritonclient, unchanged: BYTES in (text, or the PNG/JPEG file's bytes), the top class of
`probabilities` out via Triton's classification extension ("score:index:label").

    python examples/clients/classify.py --url 127.0.0.1:8000 -m sentiment "Covid cases are increasing fast!"
    python examples/clients/classify.py -m fashion shoe.png

One JSON line per input, like `trident predict`.
"""

import argparse
import json
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="127.0.0.1:8000")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-k", "--classes", type=int, default=1, help="top classes to return")
    ap.add_argument("inputs", nargs="+", help="texts, or PNG/JPEG files for an image model")
    args = ap.parse_args()

    client = httpclient.InferenceServerClient(args.url)
    name = client.get_model_metadata(args.model)["inputs"][0]["name"]
    image = name == "IMAGE"
    data = [Path(i).read_bytes() if image else i.encode() for i in args.inputs]
    inp = httpclient.InferInput(name, [len(data), 1], "BYTES")
    inp.set_data_from_numpy(np.array([[d] for d in data], dtype=object))
    out = httpclient.InferRequestedOutput("probabilities", class_count=args.classes)
    result = client.infer(args.model, [inp], outputs=[out]).as_numpy("probabilities")
    for given, row in zip(args.inputs, result):
        top = [e.decode().split(":", 2) for e in row]
        score, _, label = top[0]
        line = {"file" if image else "text": given, "label": label, "score": round(float(score), 4)}
        if args.classes > 1:
            line["top"] = {lab: round(float(s), 4) for s, _, lab in top}
        print(json.dumps(line))


if __name__ == "__main__":
    main()
