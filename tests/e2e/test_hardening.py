"""Hardening: no client can hurt another, nothing hangs, nothing leaks (issue 17).

Each test is one finding of an attack on the release build, replayed against the real
server, mostly over raw sockets where the exact bytes matter."""

from __future__ import annotations

import concurrent.futures
import json
import re
import shutil
import signal
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import FIXTURE_MODELS


def error_of(status: int, body: bytes) -> str:
    """The message of a `{"error": "..."}` body (failing the test if it is not one)."""
    try:
        obj = json.loads(body)
    except ValueError:
        pytest.fail(f"HTTP {status}: error body is not JSON: {body[:300]!r}")
    assert isinstance(obj, dict) and isinstance(obj.get("error"), str) and obj["error"].strip(), obj
    return obj["error"]


def connect(port: int, timeout: float = 10) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_response(sock: socket.socket, timeout: float = 10) -> tuple[int, dict, bytes]:
    """Reads one HTTP/1.1 response with a Content-Length (or up to EOF)."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a full response head: {data[:200]!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(body) < n:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    else:
        while chunk := sock.recv(65536):
            body += chunk
    return status, headers, body


def raw(port: int, data: bytes, timeout: float = 10) -> tuple[int, dict, bytes]:
    with connect(port, timeout) as sock:
        sock.sendall(data)
        return read_response(sock, timeout)


def closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """Whether the server closes `sock` within `seconds`; also what it sent first."""
    sock.settimeout(0.2)
    got = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            return True, got
        if not chunk:
            return True, got
        got += chunk
    return False, got


def simple_body(batch: int = 1) -> bytes:
    data = list(range(16 * batch))
    return json.dumps(
        {
            "inputs": [
                {"name": n, "shape": [batch, 16], "datatype": "INT32", "data": data}
                for n in ("INPUT0", "INPUT1")
            ]
        }
    ).encode()


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


def assert_serves(srv) -> None:
    status, _, body = raw(srv.http_port, post("/v2/models/simple/infer", simple_body()), timeout=10)
    assert status == 200, body[:300]


# -- 1. one bad request never fails the requests batched with it ---------------------------


def strings_input(values: list[bytes]) -> httpclient.InferInput:
    arr = np.array(values, dtype=np.object_).reshape(len(values), 1)
    inp = httpclient.InferInput("TEXT", list(arr.shape), "BYTES")
    inp.set_data_from_numpy(arr, binary_data=True)
    return inp


def test_non_utf8_strings_fail_alone_and_as_the_clients_error(server):
    """Three concurrent requests reach a dynamic batcher that waits 300 ms, so they would
    merge; the one with bytes that are not UTF-8 gets a 400 naming the input, and the
    others get their own strings back."""
    requests = [[b"hello", b"world"], [b"\xff\xfe bad"], [b"caf\xc3\xa9"]]

    def one(values):
        client = server.client()
        try:
            result = client.infer("strings_batched", [strings_input(values)])
            return ("ok", [v for v in result.as_numpy("ECHO").ravel()])
        except InferenceServerException as e:
            return ("error", (e.status(), e.message()))
        finally:
            client.close()

    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        results = list(pool.map(one, requests))
    assert results[0] == ("ok", [b"hello", b"world"]), results
    assert results[2] == ("ok", ["café".encode()]), results
    kind, (status, message) = results[1]
    assert kind == "error", results
    assert str(status) == "400", results[1]
    assert "TEXT" in message and "UTF-8" in message, message
    assert "ERROR" not in "\n".join(
        line for line in server.log().splitlines() if "UTF-8" in line
    ), "a client's bad strings were logged as a server error"


# -- 2. SIGTERM finishes within the drain time, whatever clients hold open -------------------


@pytest.mark.parametrize("flags", [[], ["--exit-timeout-secs", "2"]], ids=["defaults", "exit_timeout_2"])
def test_sigterm_completes_despite_half_sent_requests(start_server, flags):
    """Connections still sending a request are dropped at once (they hold nothing in
    flight); with the defaults (30 s drain) the exit is as prompt as with 2 s."""
    srv = start_server(flags, load="simple", models=["simple"])
    srv.wait_models(["simple"], [], timeout=30)
    holders = []
    # Half a head on the HTTP port, a head and half a body on both ports, and an idle
    # keep-alive connection that has been answered once.
    s = connect(srv.http_port)
    s.sendall(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Le")
    holders.append(s)
    for port in (srv.http_port, srv.metrics_port):
        s = connect(port)
        s.sendall(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"in")
        holders.append(s)
    s = connect(srv.metrics_port)
    s.sendall(b"GET /metr")
    holders.append(s)
    s = connect(srv.http_port)
    s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_response(s)[0] == 200
    holders.append(s)
    time.sleep(0.3)
    started = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    try:
        code = srv.proc.wait(timeout=8)
    except Exception:  # noqa: BLE001 - reported below
        code = None
    elapsed = time.monotonic() - started
    for s in holders:
        s.close()
    assert code == 0, f"exit code {code} after {elapsed:.1f} s:\n{srv.log(last=30)}"
    assert elapsed < 4, f"took {elapsed:.1f} s ({flags}):\n{srv.log(last=30)}"


# -- 3. timeouts and the connection cap --------------------------------------------------------


def test_trickled_header_is_cut_off(start_server):
    srv = start_server(["--http-header-timeout-secs", "1.5"], load="simple", models=["simple"])
    head = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100
    with connect(srv.http_port) as sock:
        started = time.monotonic()
        closed = False
        got = b""
        for byte in head:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            done, got = closed_within(sock, 0.1)
            if done:
                closed = True
                break
        elapsed = time.monotonic() - started
    assert closed, "a header trickled one byte per 0.1 s was still being read after 10 s"
    assert elapsed < 5, f"closed only after {elapsed:.1f} s with --http-header-timeout-secs 1.5"
    if got:
        status = int(got.split()[1])
        assert status == 408, got[:200]
        error_of(status, got.partition(b"\r\n\r\n")[2])
    assert_serves(srv)


def test_a_silent_connection_is_closed_after_the_header_timeout(start_server):
    srv = start_server(["--http-header-timeout-secs", "1"], load="simple", models=["simple"])
    with connect(srv.http_port) as sock:
        closed, _ = closed_within(sock, 4)
    assert closed, "a connection that sent nothing was kept open"


def test_body_must_arrive_within_the_body_timeout(start_server):
    srv = start_server(["--http-body-timeout-secs", "1"], load="simple", models=["simple"])
    with connect(srv.http_port) as sock:
        sock.sendall(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{\"inp")
        started = time.monotonic()
        status, _, body = read_response(sock, timeout=5)
    assert status == 408, body[:300]
    assert "body" in error_of(status, body)
    assert time.monotonic() - started < 4
    assert_serves(srv)


def test_idle_keepalive_connection_is_closed(start_server):
    srv = start_server(["--http-keepalive-timeout-secs", "1"], load="simple", models=["simple"])
    with connect(srv.http_port) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock)[0] == 200
        closed, _ = closed_within(sock, 4)
    assert closed, "an idle keep-alive connection was kept past --http-keepalive-timeout-secs"


def test_huge_content_length_is_refused_up_front(server):
    started = time.monotonic()
    with connect(server.http_port) as sock:
        sock.sendall(
            b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000000000000\r\n\r\n"
        )
        status, _, body = read_response(sock, timeout=5)
    assert status == 413, body[:300]
    assert "1000000000000" in error_of(status, body)
    assert time.monotonic() - started < 3


def test_stalled_clients_do_not_lock_others_out(server):
    """300 connections that each send half a header: a well-behaved client is still
    answered at once."""
    stalled = []
    try:
        for _ in range(300):
            s = connect(server.http_port)
            s.sendall(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-")
            stalled.append(s)
        started = time.monotonic()
        assert_serves(server)
        assert time.monotonic() - started < 2
    finally:
        for s in stalled:
            s.close()


def test_connection_cap_refuses_clearly_and_recovers(start_server):
    srv = start_server(["--http-max-connections", "20"], load="simple", models=["simple"])
    held = [connect(srv.http_port) for _ in range(20)]
    try:
        # The server takes the held connections from its backlog as it gets to them, and a
        # connection of the start-up checks may still count for a moment (then a held one
        # is the one refused): hold one more each time a request still gets through.
        deadline = time.monotonic() + 10
        while True:
            status, headers, body = raw(srv.http_port, post("/v2/models/simple/infer", simple_body()))
            if status != 200 or time.monotonic() > deadline:
                break
            held.append(connect(srv.http_port))
            time.sleep(0.1)
        assert status == 503, body[:300]
        assert "connections" in error_of(status, body)
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 5
    while True:
        try:
            assert_serves(srv)
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


# -- 4. a JSON body costs at most a few times its size, in any field order ------------------------


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.parametrize("order", ["datatype_first", "data_first"])
def test_large_json_body_memory_is_bounded(start_server, order):
    srv = start_server([], load="simple", models=["simple"])
    srv.wait_models(["simple"], [], timeout=30)
    assert_serves(srv)
    n = 15_000_000  # "0.5," four bytes each: a 60 MB body, under the 64 MiB limit
    data = b"[" + b"0.5," * (n - 1) + b"0.5]"
    fields = [b'"datatype":"FP32"', b'"data":' + data]
    if order == "data_first":
        fields.reverse()
    body = (
        b'{"inputs":[{"name":"INPUT0","shape":[1,%d],' % n + b",".join(fields) + b"}]}"
    )
    assert len(body) < 64 << 20
    before = peak_rss(srv.proc.pid)
    status, _, reply = raw(srv.http_port, post("/v2/models/simple/infer", body), timeout=60)
    # The tensor does not fit the model (INT32 [batch, 16]): refused after decoding.
    assert status == 400, reply[:300]
    growth = peak_rss(srv.proc.pid) - before
    assert growth <= 3 * len(body), (
        f"peak RSS grew by {growth / 2**20:.0f} MiB for a {len(body) / 2**20:.0f} MiB body "
        f"({growth / len(body):.1f}x, {order})"
    )
    assert_serves(srv)


# -- 5. every error answer is {"error": ...} ---------------------------------------------------------


def test_error_bodies_are_json(start_server):
    srv = start_server(["--http-max-body-bytes", "1000"], load="simple", models=["simple"])
    port = srv.http_port
    cases = {
        "413 by Content-Length": (413, post("/v2/models/simple/infer", b"x" * 2000)),
        "413 chunked": (
            413,
            b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"7d0\r\n" + b"x" * 2000 + b"\r\n0\r\n\r\n",
        ),
        "bad chunked encoding": (
            400,
            b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
        ),
        "bad percent-encoding": (400, b"GET /v2/models/%ff%fe/ready HTTP/1.1\r\nHost: x\r\n\r\n"),
        "405": (405, b"GET /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\n\r\n"),
        "414 (ours)": (414, b"GET /v2/models/" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"),
        "431 (ours)": (431, b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n"),
        "431 (hyper's)": (431, b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 1_000_000 + b"\r\n\r\n"),
        "malformed head": (400, b"GET /v2 HTTP/1.1\r\nHost x\r\n\r\n"),
        "404": (404, b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"),
    }
    for what, (want, request) in cases.items():
        try:
            status, headers, body = raw(port, request)
        except ConnectionError as e:
            pytest.fail(f"{what}: {e}")
        assert status == want, f"{what}: {status} {body[:300]!r}"
        assert headers.get("content-type", "").startswith("application/json"), (what, headers)
        error_of(status, body)
    assert_serves(srv)


# -- 6. no server paths in what clients see ------------------------------------------------------------


def test_no_absolute_paths_reach_clients(server):
    root = str(server.repository.resolve())
    status, _, body = server.request("POST", "/v2/repository/index", b"{}")
    assert status == 200
    assert root not in body.decode(), body.decode()
    reasons = {e["name"]: e.get("reason", "") for e in json.loads(body)}
    assert "broken/1/model.onnx" in reasons["broken"], reasons["broken"]
    status, _, body = server.request("POST", "/v2/models/broken/infer", simple_body())
    assert status == 503, body[:300]
    message = error_of(status, body)
    assert root not in message and "/tmp" not in message, message


# -- 7. metric labels are escaped --------------------------------------------------------------------


SAMPLE = re.compile(
    r'^[a-zA-Z_:][a-zA-Z0-9_:]*\{([a-zA-Z_][a-zA-Z0-9_]*="(?:\\.|[^"\\\n])*")(,[a-zA-Z_][a-zA-Z0-9_]*="(?:\\.|[^"\\\n])*")*\} \S+$'
)


def test_model_names_cannot_inject_metrics(start_server):
    evil = 'evil"\nnv_inference_count{model="forged",version="1"} 999\n#'
    srv = start_server([], load="nobatch", models=["nobatch"])
    srv.wait_models(["nobatch"], [], timeout=30)
    shutil.copytree(FIXTURE_MODELS / "nobatch" / "1", srv.repository / evil / "1")
    client = srv.client()
    client.load_model(evil)
    assert client.is_model_ready(evil)
    client.close()
    text = srv.metrics()
    assert "evil" in text
    for line in text.splitlines():
        if line and not line.startswith("#"):
            assert SAMPLE.match(line), f"not a well-formed sample: {line!r}"
    assert 'model="forged"' not in text


# -- 8. a failed reload keeps the loaded model serving --------------------------------------------------


def infer_nobatch(client) -> np.ndarray:
    x = np.ones((2, 3), dtype=np.float32)
    inp = httpclient.InferInput("x", [2, 3], "FP32")
    inp.set_data_from_numpy(x)
    return client.infer("nobatch", [inp]).as_numpy("y")


@pytest.mark.parametrize("damage", ["config", "model"])
def test_failed_explicit_reload_keeps_serving(start_server, damage):
    srv = start_server([], load="nobatch", models=["nobatch"])
    srv.wait_models(["nobatch"], [], timeout=30)
    client = srv.client()
    np.testing.assert_array_equal(infer_nobatch(client), np.full((2, 3), 2, np.float32))
    target = srv.repository / "nobatch" / ("config.pbtxt" if damage == "config" else "1/model.onnx")
    original = target.read_bytes()
    target.write_bytes(b"max_bach_size: [ oops\n" if damage == "config" else b"not onnx")
    with pytest.raises(InferenceServerException) as err:
        client.load_model("nobatch")
    assert "keep" in str(err.value), str(err.value)
    assert client.is_model_ready("nobatch")
    np.testing.assert_array_equal(infer_nobatch(client), np.full((2, 3), 2, np.float32))
    entries = [e for e in client.get_model_repository_index() if e["name"] == "nobatch"]
    assert any(e.get("state") == "READY" for e in entries), entries
    target.write_bytes(original)
    client.load_model("nobatch")
    np.testing.assert_array_equal(infer_nobatch(client), np.full((2, 3), 2, np.float32))
    client.close()


def test_failed_poll_reload_keeps_serving(start_server):
    srv = start_server(
        ["--model-control-mode", "poll", "--repository-poll-secs", "1"], load=None, models=["nobatch"]
    )
    srv.wait_models(["nobatch"], [], timeout=30)
    client = srv.client()
    (srv.repository / "nobatch" / "1" / "model.onnx").write_bytes(b"garbage, not onnx")
    assert srv.wait_log("reload failed", timeout=10), srv.log(last=20)
    assert client.is_model_ready("nobatch")
    np.testing.assert_array_equal(infer_nobatch(client), np.full((2, 3), 2, np.float32))
    client.close()
