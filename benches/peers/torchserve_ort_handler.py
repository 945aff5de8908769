"""TorchServe handler that runs `model.onnx` with onnxruntime and speaks KServe v2 JSON.

TorchServe 0.12 routes `POST /v2/models/{name}/infer` to the handler with the raw request
body. Its own `kservev2` envelope keeps only the first request of a batch, so this handler
parses the v2 JSON itself: with TorchServe's batching (`batchSize` > 1) each request's rows
are concatenated, run in one `session.run`, and split back into one v2 response each.
"""

import json
import os

import numpy as np
import onnxruntime as ort

DTYPES = {"FP32": np.float32, "INT64": np.int64, "INT32": np.int32, "FP64": np.float64}


class OrtHandler:
    def initialize(self, context):
        model_dir = context.system_properties["model_dir"]
        meta = json.load(open(os.path.join(model_dir, "meta.json")))
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(os.environ.get("PEER_THREADS", "2"))
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            os.path.join(model_dir, "model.onnx"), options, providers=["CPUExecutionProvider"]
        )
        self.name = meta["name"]
        self.inputs = [i["name"] for i in meta["inputs"]]
        self.outputs = [o["name"] for o in meta["outputs"]]

    def handle(self, data, context):
        bodies = []
        for row in data:
            body = row.get("body") if row.get("body") is not None else row.get("data")
            if isinstance(body, (bytes, bytearray)):
                body = json.loads(body)
            bodies.append({t["name"]: t for t in body["inputs"]})
        arrays = [
            [np.asarray(b[n]["data"], DTYPES[b[n]["datatype"]]).reshape(b[n]["shape"]) for n in self.inputs]
            for b in bodies
        ]
        sizes = [a[0].shape[0] for a in arrays]
        feeds = {n: np.concatenate([a[i] for a in arrays]) for i, n in enumerate(self.inputs)}
        results = self.session.run(self.outputs, feeds)
        responses, start = [], 0
        for size in sizes:
            outputs = [
                {"name": n, "datatype": "FP32", "shape": list(r[start : start + size].shape),
                 "data": r[start : start + size].ravel().tolist()}
                for n, r in zip(self.outputs, results)
            ]
            responses.append({"model_name": self.name, "outputs": outputs})
            start += size
        return responses


_service = OrtHandler()


def handle(data, context):
    if not hasattr(_service, "session"):
        _service.initialize(context)
    if data is None:
        return None
    return _service.handle(data, context)
