"""Request bodies for the deployment benchmark: 256 VADER texts (a seeded sample of the
four ground-truth files, tab-separated `id, score, text`) in perf_analyzer's --input-data
format, one text per request (`TEXT`, BYTES [1]). Both servers get the same file.

    python3 benches/deploy/make_texts.py data/vader OUT.json
"""

import json
import random
import sys
from pathlib import Path

texts = []
for f in sorted(Path(sys.argv[1]).glob("*_GroundTruth.txt")):
    for line in f.read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and parts[2].strip():
            texts.append(parts[2].strip())
random.Random(18).shuffle(texts)
data = [{"TEXT": {"content": [t], "shape": [1]}} for t in texts[:256]]
Path(sys.argv[2]).write_text(json.dumps({"data": data}))
print(f"{len(data)} texts, median {sorted(len(t) for t in texts[:256])[128]} characters")
