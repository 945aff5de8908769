"""Triton python-backend model that runs `model.onnx` beside it with onnxruntime.

The `tritonserver` of nvidia-pytriton 0.7.0 has no native onnxruntime backend, only the
python backend, so this is how Triton serves an ONNX model on these machines. With
dynamic batching Triton hands `execute` several requests: their rows are concatenated,
run in one `session.run`, and split back.
"""

import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        here = os.path.dirname(os.path.abspath(__file__))
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(os.environ.get("PEER_THREADS", "2"))
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            os.path.join(here, "model.onnx"), options, providers=["CPUExecutionProvider"]
        )
        self.inputs = [i["name"] for i in config["input"]]
        self.outputs = [o["name"] for o in config["output"]]

    def execute(self, requests):
        arrays = [[pb_utils.get_input_tensor_by_name(r, n).as_numpy() for n in self.inputs] for r in requests]
        sizes = [a[0].shape[0] for a in arrays]
        feeds = {n: np.concatenate([a[i] for a in arrays]) for i, n in enumerate(self.inputs)}
        results = self.session.run(self.outputs, feeds)
        responses, start = [], 0
        for size in sizes:
            tensors = [pb_utils.Tensor(n, r[start : start + size]) for n, r in zip(self.outputs, results)]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            start += size
        return responses
