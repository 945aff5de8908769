"""Cold start, not a test: a server started from nothing on the digits
model of examples/model_repository, timed from the exec to its first answer.

    python3 benches/cold_start.py trident [BIN]        # default target/release/trident
    PEERS=/work/peers python3 benches/cold_start.py triton
    PEERS=/work/peers python3 benches/cold_start.py torchserve
    STARTS=10 python3 benches/cold_start.py …          # starts per server (default 10)

Each start runs in a fresh environment holding only PATH and HOME (no ORT_DYLIB_PATH, no
TRIDENT_* variables; the peers' venvs are put first on PATH). The clock polls every 2 ms:
`GET /v2/health/ready` for "ready" (Trident and Triton), then the first inference,
`POST /v2/models/digits/infer` with the first image of digits_sample.json, for "first
answer"; TorchServe has no model-ready probe of that kind, so its infer is polled until
it answers 200. The peers run the same ONNX file through onnxruntime (Triton 2.51's
python backend with benches/peers/triton_ort_model.py, TorchServe 0.12 with
benches/peers/torchserve_ort_handler.py), set up by benches/peers/peers_bench.sh's venvs
(venv_trt, venv_ts) under PEERS; the model folders are written to a temporary folder.
"""
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.join(ROOT, "examples", "model_repository")
server = sys.argv[1] if len(sys.argv) > 1 else "trident"
starts = int(os.environ.get("STARTS", "10"))
peers = os.environ.get("PEERS", "/work/peers")
sample = json.load(open(os.path.join(REPO, "digits_sample.json")))["pixels"][0]
BODY = json.dumps({"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": sample}]})
ONNX = os.path.join(REPO, "digits", "1", "model.onnx")
IO = {"name": "digits", "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}],
      "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]}]}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, body=None):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        c.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, data
    except OSError:
        return None, b""


def triton_repo(tmp):
    d = os.path.join(tmp, "triton", "digits")
    os.makedirs(os.path.join(d, "1"))
    shutil.copy(ONNX, os.path.join(d, "1", "model.onnx"))
    shutil.copy(os.path.join(ROOT, "benches", "peers", "triton_ort_model.py"), os.path.join(d, "1", "model.py"))
    with open(os.path.join(d, "config.pbtxt"), "w") as f:
        f.write('name: "digits"\nbackend: "python"\nmax_batch_size: 64\n'
                'input [ { name: "pixels" data_type: TYPE_FP32 dims: [ 64 ] } ]\n'
                'output [ { name: "probabilities" data_type: TYPE_FP32 dims: [ 10 ] } ]\n'
                'instance_group [ { count: 1 kind: KIND_CPU } ]\n')
    return os.path.dirname(d)


def torchserve_store(tmp):
    src = os.path.join(tmp, "ts_src")
    os.makedirs(src)
    shutil.copy(ONNX, os.path.join(src, "model.onnx"))
    with open(os.path.join(src, "meta.json"), "w") as f:
        json.dump(IO, f)
    store = os.path.join(tmp, "ts_store")
    os.makedirs(store)
    subprocess.run([os.path.join(peers, "venv_ts", "bin", "torch-model-archiver"), "--model-name", "digits",
                    "--version", "1.0", "--handler", os.path.join(ROOT, "benches", "peers", "torchserve_ort_handler.py"),
                    "--extra-files", f"{src}/model.onnx,{src}/meta.json", "--export-path", store, "-f"], check=True)
    return store


def launch(tmp, port):
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")}
    if server == "trident":
        binary = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "target", "release", "trident")
        cmd = [binary, "serve", "--model-repository", REPO, "--http-address", "127.0.0.1", "--http-port", str(port),
               "--metrics-port", str(free_port()), "--grpc-port", str(free_port())]
        return cmd, env, True
    if server == "triton":
        ts = os.path.join(peers, "venv_trt", "lib", "python3.11", "site-packages", "pytriton", "tritonserver")
        env["PATH"] = os.path.join(peers, "venv_trt", "bin") + ":" + env["PATH"]
        cmd = [os.path.join(ts, "bin", "tritonserver"), f"--model-repository={tmp}/triton",
               f"--backend-directory={ts}/backends", f"--cache-directory={ts}/caches",
               "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
               f"--http-port={port}", f"--grpc-port={free_port()}", f"--metrics-port={free_port()}"]
        return cmd, env, True
    if server == "torchserve":
        env["PATH"] = os.path.join(peers, "venv_ts", "bin") + ":" + env["PATH"]
        cfg = os.path.join(tmp, "ts_config.properties")
        with open(cfg, "w") as f:
            f.write(f"inference_address=http://127.0.0.1:{port}\nmanagement_address=http://127.0.0.1:{free_port()}\n"
                    f"metrics_address=http://127.0.0.1:{free_port()}\ndisable_token_authorization=true\n"
                    "default_workers_per_model=1\nload_models=all\n")
        cmd = [os.path.join(peers, "venv_ts", "bin", "torchserve"), "--start", "--foreground", "--ncs",
               "--model-store", os.path.join(tmp, "ts_store"), "--ts-config", cfg, "--disable-token-auth"]
        return cmd, env, False
    sys.exit(f"unknown server {server!r}: trident, triton or torchserve")


tmp = tempfile.mkdtemp(prefix="cold_start_")
if server == "triton":
    triton_repo(tmp)
if server == "torchserve":
    torchserve_store(tmp)
ready, first = [], []
try:
    for i in range(starts):
        port = free_port()
        cmd, env, has_ready = launch(tmp, port)
        t0 = time.perf_counter()
        log = open(os.path.join(tmp, "server.log"), "w")
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp, start_new_session=True)
        try:
            t_ready = None
            while time.perf_counter() - t0 < 120:
                if p.poll() is not None:
                    tail = open(os.path.join(tmp, "server.log")).read()[-2000:]
                    sys.exit(f"{server} exited with {p.returncode}: {' '.join(cmd)}\n{tail}")
                if has_ready and t_ready is None:
                    if request(port, "GET", "/v2/health/ready")[0] == 200:
                        t_ready = time.perf_counter()
                    else:
                        time.sleep(0.002)
                        continue
                status, _ = request(port, "POST", "/v2/models/digits/infer", BODY)
                if status == 200:
                    t_first = time.perf_counter()
                    break
                time.sleep(0.002)
            else:
                sys.exit(f"{server}: no answer within 120 s")
            if t_ready is not None:
                ready.append((t_ready - t0) * 1e3)
            first.append((t_first - t0) * 1e3)
            shown = f"ready after {ready[-1]:.0f} ms, " if t_ready is not None else ""
            print(f"{server} start {i + 1}: {shown}first answer after {first[-1]:.0f} ms", flush=True)
        finally:
            try:
                os.killpg(p.pid, 15)
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait()
            except ProcessLookupError:
                pass
            log.close()
            if server == "torchserve":
                # TorchServe refuses to start while its pid file is there, and a killed
                # foreground server leaves it behind.
                try:
                    os.remove(os.path.join(tempfile.gettempdir(), ".model_server.pid"))
                except FileNotFoundError:
                    pass
            time.sleep(0.5)
finally:
    shutil.rmtree(tmp, ignore_errors=True)
line = f"{server}: median over {starts} starts: "
if ready:
    line += f"ready {statistics.median(ready):.0f} ms, "
print(line + f"first answer {statistics.median(first):.0f} ms (fastest {min(first):.0f}, slowest {max(first):.0f})")
