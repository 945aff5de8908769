"""Peak-RSS growth of `trident serve` for one large JSON inference body, in both field
orders. Starts the given binary on a copy of the fixture model
`simple`, sends a ~60 MB body of FP32 data that decodes fully and is then refused
(shape mismatch), and reads VmHWM before and after.

    python3 benches/json_body_memory.py [path/to/trident ...]
"""

from __future__ import annotations

import http.client
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def vm_hwm(pid: int) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", text).group(1)) * 1024


def body(order: str, n: int = 15_000_000) -> bytes:
    data = b'"data":[' + b"0.5," * (n - 1) + b"0.5]"
    datatype = b'"datatype":"FP32"'
    fields = [datatype, data] if order == "datatype_first" else [data, datatype]
    return b'{"inputs":[{"name":"INPUT0","shape":[1,%d],' % n + b",".join(fields) + b"}]}"


def measure(binary: str, order: str) -> tuple[int, int]:
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        shutil.copytree(ROOT / "tests/fixtures/models/simple", repo / "simple")
        proc = subprocess.Popen(
            [binary, "serve", "--model-repository", str(repo), "--http-address", "127.0.0.1",
             "--http-port", "0", "--metrics-port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={"TRIDENT_LOG": "info", "NO_COLOR": "1", "PATH": "/usr/bin:/bin"},
        )
        port = None
        for line in proc.stdout:
            m = re.search(rb"HTTP service listening on [0-9.]+:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        time.sleep(0.5)
        payload = body(order)
        before = vm_hwm(proc.pid)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        conn.request("POST", "/v2/models/simple/infer", body=payload, headers={"Content-Type": "application/json"})
        status = conn.getresponse().status
        after = vm_hwm(proc.pid)
        proc.terminate()
        proc.wait()
        assert status == 400, status
        return len(payload), after - before


def main() -> None:
    binaries = sys.argv[1:] or [str(ROOT / "target/release/trident")]
    print("| binary | field order | body MiB | peak RSS growth MiB | growth / body |")
    print("|---|---|---|---|---|")
    for binary in binaries:
        for order in ("datatype_first", "data_first"):
            size, growth = measure(binary, order)
            print(f"| {binary} | {order} | {size / 2**20:.1f} | {growth / 2**20:.0f} | {growth / size:.2f}x |")


if __name__ == "__main__":
    main()
