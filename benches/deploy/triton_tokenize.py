"""Triton python-backend tokenizer step (the common way Triton users tokenise today, as in
Gladiaio's MiniLM ensemble): Hugging Face `tokenizers` from the checkpoint's
tokenizer.json, special tokens added, truncation to `max_length` (the parameter), padding
to the longest text of the batch Triton hands over. TEXT BYTES [batch, 1] in; INT64
input_ids, attention_mask, token_type_ids out.
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        here = os.path.dirname(os.path.abspath(__file__))
        self.tok = Tokenizer.from_file(os.path.join(here, "tokenizer.json"))
        max_length = int(config["parameters"]["max_length"]["string_value"])
        self.tok.enable_truncation(max_length)
        self.tok.no_padding()

    def execute(self, requests):
        texts, sizes = [], []
        for r in requests:
            arr = pb_utils.get_input_tensor_by_name(r, "TEXT").as_numpy().reshape(-1)
            texts.extend(t.decode("utf-8") for t in arr)
            sizes.append(len(arr))
        encs = self.tok.encode_batch(texts)
        responses, start = [], 0
        for size in sizes:
            part = encs[start : start + size]
            start += size
            n = max(len(e.ids) for e in part)
            ids = np.zeros((size, n), dtype=np.int64)
            mask = np.zeros((size, n), dtype=np.int64)
            for i, e in enumerate(part):
                ids[i, : len(e.ids)] = e.ids
                mask[i, : len(e.ids)] = 1
            out = [
                pb_utils.Tensor("input_ids", ids),
                pb_utils.Tensor("attention_mask", mask),
                pb_utils.Tensor("token_type_ids", np.zeros_like(ids)),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=out))
        return responses
