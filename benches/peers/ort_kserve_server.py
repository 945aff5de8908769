"""The peer for the serving benchmark: onnxruntime in Python behind a minimal KServe v2
HTTP server (stdlib ThreadingHTTPServer), enough for perf_analyzer: health, model
metadata, model config, and infer with JSON or binary FP32 tensors. No batching: each
request runs its own session.run, as a hand-written Flask/FastAPI wrapper would.

    python benches/peers/ort_kserve_server.py --repo /tmp/bench_repo --model mlp_nobatch --port 18500
"""

import argparse
import json
import re
import struct
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import onnxruntime as ort


def make_handler(name: str, session: ort.InferenceSession, max_batch: int):
    inputs = [{"name": i.name, "datatype": "FP32", "shape": [-1] + list(i.shape[1:])} for i in session.get_inputs()]
    outputs = [{"name": o.name, "datatype": "FP32", "shape": [-1] + list(o.shape[1:])} for o in session.get_outputs()]
    metadata = json.dumps({"name": name, "versions": ["1"], "platform": "onnxruntime_onnx",
                           "inputs": inputs, "outputs": outputs}).encode()
    config = json.dumps({
        "name": name, "platform": "onnxruntime_onnx", "max_batch_size": max_batch,
        "input": [{"name": i["name"], "data_type": "TYPE_FP32", "dims": i["shape"][1:]} for i in inputs],
        "output": [{"name": o["name"], "data_type": "TYPE_FP32", "dims": o["shape"][1:]} for o in outputs],
    }).encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Without this, headers and body leave in separate segments and Nagle + delayed
        # ACK add ~40 ms to every keep-alive response.
        disable_nagle_algorithm = True

        def log_message(self, *args):
            pass

        def send(self, code, body, headers=()):
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            for k, v in headers:
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            path = self.path.rstrip("/")
            if path in ("/v2/health/live", "/v2/health/ready", f"/v2/models/{name}/ready",
                        f"/v2/models/{name}/versions/1/ready"):
                return self.send(200, b"")
            if re.fullmatch(rf"/v2/models/{name}(/versions/1)?", path):
                return self.send(200, metadata)
            if re.fullmatch(rf"/v2/models/{name}(/versions/1)?/config", path):
                return self.send(200, config)
            if path == "/v2":
                return self.send(200, b'{"name":"ort-peer","version":"0","extensions":["binary_tensor_data"]}')
            self.send(404, b'{"error":"not found"}')

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            header_len = int(self.headers.get("Inference-Header-Content-Length", len(body)))
            request = json.loads(body[:header_len])
            offset, feeds = header_len, {}
            for inp in request["inputs"]:
                size = (inp.get("parameters") or {}).get("binary_data_size")
                if size is not None:
                    arr = np.frombuffer(body[offset:offset + size], dtype=np.float32)
                    offset += size
                else:
                    arr = np.asarray(inp["data"], dtype=np.float32)
                feeds[inp["name"]] = arr.reshape(inp["shape"])
            results = session.run(None, feeds)
            want_binary = any((o.get("parameters") or {}).get("binary_data") for o in request.get("outputs", []))
            outs, blobs = [], []
            for meta, value in zip(session.get_outputs(), results):
                out = {"name": meta.name, "datatype": "FP32", "shape": list(value.shape)}
                if want_binary:
                    blob = value.astype(np.float32).tobytes()
                    out["parameters"] = {"binary_data_size": len(blob)}
                    blobs.append(blob)
                else:
                    out["data"] = value.ravel().tolist()
                outs.append(out)
            head = json.dumps({"model_name": name, "model_version": "1", "outputs": outs}).encode()
            headers = [("Content-Type", "application/octet-stream"), ("Inference-Header-Content-Length", str(len(head)))] if want_binary else [("Content-Type", "application/json")]
            self.send(200, head + b"".join(blobs), headers)

    return Handler


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repo", type=Path, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--port", type=int, default=18500)
    p.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads")
    a = p.parse_args()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = a.threads
    opts.inter_op_num_threads = 1
    session = ort.InferenceSession(str(a.repo / a.model / "1" / "model.onnx"), opts)
    ThreadingHTTPServer.request_queue_size = 128  # the default backlog of 5 resets connections at c=16
    server = ThreadingHTTPServer(("127.0.0.1", a.port), make_handler(a.model, session, 32))
    print(f"ort peer serving {a.model} on 127.0.0.1:{a.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
