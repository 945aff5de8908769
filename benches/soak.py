"""Soak test of `trident serve`: a mixed valid/invalid load at a fixed rate
for a fixed time, sampling the server's RSS, open file descriptors and threads. Flat
is the goal: a leak shows as a slope.

    python3 benches/soak.py --binary target/release/trident --minutes 10 --rate 100

The mix, drawn in a fixed seeded order (one request each, round robin over kinds):
valid JSON inference (simple), valid binary inference through a dynamic batcher
(simple_batched), unknown model, invalid JSON, wrong shape, non-UTF-8 BYTES
(strings_batched), Content-Length over the limit, a malformed request head, a
connection closed after half a request, 405, bad percent-encoding, and a metrics
scrape. Writes samples to <out>/samples.csv and prints a summary table.
"""

from __future__ import annotations

import argparse
import csv
import http.client
import json
import random
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ["simple", "simple_batched", "strings_batched"]


def proc_sample(pid: int) -> dict:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) // 1024
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))
    fds = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    return {"rss_mib": rss, "fds": fds, "threads": threads}


def simple_json(batch: int = 1) -> bytes:
    data = list(range(16 * batch))
    return json.dumps(
        {"inputs": [{"name": n, "shape": [batch, 16], "datatype": "INT32", "data": data} for n in ("INPUT0", "INPUT1")]}
    ).encode()


def batched_binary() -> tuple[bytes, int]:
    header = json.dumps(
        {
            "inputs": [
                {"name": n, "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}}
                for n in ("INPUT0", "INPUT1")
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    return header + struct.pack("<16f", *range(16)) * 2, len(header)


def bad_strings() -> tuple[bytes, int]:
    element = b"\xff\xfe not utf-8"
    header = json.dumps(
        {"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "parameters": {"binary_data_size": 4 + len(element)}}]}
    ).encode()
    return header + struct.pack("<I", len(element)) + element, len(header)


def http_request(port, method, path, body=None, headers=None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def raw(port, data: bytes, read: bool = True) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(data)
        if not read:
            return 0
        got = s.recv(4096)
        return int(got.split()[1]) if got.startswith(b"HTTP/1.1 ") else -1


def kinds(http_port: int, metrics_port: int):
    binary, binary_len = batched_binary()
    strings, strings_len = bad_strings()
    return [
        ("valid_json", 200, lambda: http_request(http_port, "POST", "/v2/models/simple/infer", simple_json(2))),
        (
            "valid_binary_batched",
            200,
            lambda: http_request(
                http_port, "POST", "/v2/models/simple_batched/infer", binary,
                {"Inference-Header-Content-Length": str(binary_len)},
            ),
        ),
        ("unknown_model", 404, lambda: http_request(http_port, "POST", "/v2/models/nope/infer", simple_json())),
        ("invalid_json", 400, lambda: http_request(http_port, "POST", "/v2/models/simple/infer", b"{not json")),
        (
            "wrong_shape",
            400,
            lambda: http_request(http_port, "POST", "/v2/models/simple/infer", simple_json().replace(b"[1, 16]", b"[2, 8]")),
        ),
        (
            "non_utf8_bytes",
            400,
            lambda: http_request(
                http_port, "POST", "/v2/models/strings_batched/infer", strings,
                {"Inference-Header-Content-Length": str(strings_len)},
            ),
        ),
        (
            "content_length_over_limit",
            413,
            lambda: raw(http_port, b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n"),
        ),
        ("malformed_head", 400, lambda: raw(http_port, b"GET /v2 HTTP/1.1\r\nHost x\r\n\r\n")),
        (
            "half_request_then_close",
            0,
            lambda: raw(http_port, b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{\"in", read=False),
        ),
        ("method_not_allowed", 405, lambda: http_request(http_port, "GET", "/v2/models/simple/infer")),
        ("bad_percent_encoding", 400, lambda: http_request(http_port, "GET", "/v2/models/%ff%fe/ready")),
        ("metrics_scrape", 200, lambda: http_request(metrics_port, "GET", "/metrics")),
    ]


def start(binary: str, repo: Path) -> tuple[subprocess.Popen, int, int]:
    proc = subprocess.Popen(
        [binary, "serve", "--model-repository", str(repo), "--http-address", "127.0.0.1",
         "--http-port", "0", "--metrics-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={"TRIDENT_LOG": "warn,trident=info", "NO_COLOR": "1", "PATH": "/usr/bin:/bin"},
    )
    ports = {}
    for line in proc.stdout:
        m = re.search(rb"(HTTP|metrics) service listening on [0-9.]+:(\d+)", line)
        if m:
            ports[m.group(1).decode()] = int(m.group(2))
        if len(ports) == 2:
            break
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    return proc, ports["HTTP"], ports["metrics"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=str(ROOT / "target/release/trident"))
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--rate", type=float, default=100, help="requests per second")
    ap.add_argument("--sample-secs", type=float, default=10)
    ap.add_argument("--out", default=str(ROOT / "runs/soak"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        for m in MODELS:
            shutil.copytree(ROOT / "tests/fixtures/models" / m, repo / m)
        proc, http_port, metrics_port = start(args.binary, repo)
        time.sleep(1)
        table = kinds(http_port, metrics_port)
        rng = random.Random(17)
        order = [i for i in range(len(table))]
        counts: Counter = Counter()
        wrong: Counter = Counter()
        lock = threading.Lock()
        stop = time.monotonic() + args.minutes * 60
        interval = 1.0 / args.rate
        next_at = [time.monotonic()]
        seq = [0]

        def worker():
            while True:
                with lock:
                    at = next_at[0]
                    next_at[0] += interval
                    if seq[0] % len(order) == 0:
                        rng.shuffle(order)
                    kind = order[seq[0] % len(order)]
                    seq[0] += 1
                if at > stop:
                    return
                delay = at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                name, want, call = table[kind]
                try:
                    got = call()
                except OSError as e:
                    got = f"error {type(e).__name__}"
                with lock:
                    counts[name] += 1
                    if got != want:
                        wrong[(name, got)] += 1

        workers = [threading.Thread(target=worker, daemon=True) for _ in range(8)]
        started = time.monotonic()
        for w in workers:
            w.start()
        samples = []
        while any(w.is_alive() for w in workers):
            s = proc_sample(proc.pid)
            s["t_s"] = round(time.monotonic() - started, 1)
            with lock:
                s["requests"] = sum(counts.values())
            samples.append(s)
            print(f"t={s['t_s']:7.1f}s requests={s['requests']:8d} rss={s['rss_mib']} MiB fds={s['fds']} threads={s['threads']}", flush=True)
            time.sleep(args.sample_secs)
        s = proc_sample(proc.pid)
        s["t_s"] = round(time.monotonic() - started, 1)
        s["requests"] = sum(counts.values())
        samples.append(s)
        proc.terminate()
        proc.wait(timeout=60)
    with open(out / "samples.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["t_s", "requests", "rss_mib", "fds", "threads"])
        w.writeheader()
        w.writerows(samples)
    warm = samples[min(3, len(samples) - 1)]
    last = samples[-1]
    print()
    print("| measure | after warm-up (t=%.0fs) | end (t=%.0fs) | max |" % (warm["t_s"], last["t_s"]))
    print("|---|---|---|---|")
    for key in ("rss_mib", "fds", "threads"):
        print(f"| {key} | {warm[key]} | {last[key]} | {max(s[key] for s in samples)} |")
    total = sum(counts.values())
    elapsed = last["t_s"]
    print(f"\n{total} requests in {args.minutes * 60:.0f} s ({total / (args.minutes * 60):.1f}/s); by kind: {dict(counts)}")
    print(f"unexpected answers: {dict(wrong) or 'none'}")


if __name__ == "__main__":
    main()
