"""Writes benches/peers/minilm_inputs.json: 32 tweets of VADER's ground truth tokenized with
all-MiniLM-L6-v2's tokenizer, padded to 64 tokens, in perf_analyzer's --input-data format
(`trident bench` reads the same). Needs `tokenizers` (pip) and scripts/fetch-data.sh's data.

    python benches/peers/make_minilm_inputs.py data/minilm/tokenizer.json data/vader/tweets_GroundTruth.txt
"""

import json
import sys
from pathlib import Path

from tokenizers import Tokenizer

SEQ, COUNT = 64, 32

tok = Tokenizer.from_file(sys.argv[1])
tok.enable_truncation(SEQ)
tok.enable_padding(length=SEQ)
lines = Path(sys.argv[2]).read_text(encoding="utf-8").splitlines()[:COUNT]
rows = []
for line in lines:
    enc = tok.encode(line.split("\t")[2])
    rows.append(
        {
            "input_ids": {"content": enc.ids, "shape": [SEQ]},
            "attention_mask": {"content": enc.attention_mask, "shape": [SEQ]},
            "token_type_ids": {"content": enc.type_ids, "shape": [SEQ]},
        }
    )
out = Path(__file__).with_name("minilm_inputs.json")
out.write_text(json.dumps({"data": rows}, separators=(",", ":")))
print(f"wrote {out}: {len(rows)} requests of {SEQ} tokens")
