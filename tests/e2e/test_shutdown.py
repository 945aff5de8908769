"""Graceful shutdown: on SIGTERM the server stops accepting connections, finishes the
requests it has already received, and exits 0."""

from __future__ import annotations

import http.client
import json
import select
import signal
import socket
import time

import numpy as np

MODEL = "simple_batched"  # max_queue_delay 200 ms: a lone request waits in the queue


def connection_refused(port: int, timeout: float) -> bool:
    """Whether a new connection to `port` is refused (or dropped unanswered) within
    `timeout` seconds of trying."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=1)
        except OSError:
            return True
        with sock:
            # Accepted by the kernel just before the listener closed: a request on it
            # must not be served.
            try:
                sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
                if not sock.recv(1):
                    return True
            except OSError:
                return True
        time.sleep(0.01)
    return False


def test_sigterm_drains_in_flight_request(start_server):
    srv = start_server([], load=MODEL, models=[MODEL])
    srv.wait_models([MODEL], [], timeout=30)

    rng = np.random.default_rng(15)
    a = rng.standard_normal((1, 16)).astype(np.float32)
    b = rng.standard_normal((1, 16)).astype(np.float32)
    body = json.dumps(
        {
            "inputs": [
                {"name": n, "shape": [1, 16], "datatype": "FP32", "data": v.ravel().tolist()}
                for n, v in (("INPUT0", a), ("INPUT1", b))
            ]
        }
    )
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=30)
    try:
        conn.request(
            "POST", f"/v2/models/{MODEL}/infer", body=body,
            headers={"Content-Type": "application/json"},
        )
        time.sleep(0.05)
        readable, _, _ = select.select([conn.sock], [], [], 0)
        assert not readable, "answered within 50 ms: the request never waited in the queue"
        srv.proc.send_signal(signal.SIGTERM)

        # The listener closes at once, while the queued request is still being served.
        assert srv.wait_log("shutting down", timeout=5), srv.log(last=20)
        assert connection_refused(srv.http_port, timeout=1), (
            "a new connection was still served after SIGTERM:\n" + srv.log(last=20)
        )
        if srv.proc.poll() is not None:
            # On a slow machine the checks above can outlast the queue delay: the server
            # then has answered and exited, and the answer must be waiting on the socket
            # (a server that quit without answering leaves nothing, or a reset).
            readable, _, _ = select.select([conn.sock], [], [], 0)
            answered = bool(readable) and conn.sock.recv(1, socket.MSG_PEEK) != b""
            assert answered, "exited without answering the in-flight request:\n" + srv.log(last=20)

        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    assert resp.status == 200, f"in-flight request got {resp.status}: {data[:500]!r}"
    outs = {o["name"]: o for o in json.loads(data)["outputs"]}
    for name, expected in (("OUTPUT0", a + b), ("OUTPUT1", a - b)):
        assert outs[name]["shape"] == [1, 16], outs[name]
        np.testing.assert_array_equal(
            np.asarray(outs[name]["data"], dtype=np.float32).reshape(1, 16), expected
        )

    try:
        code = srv.proc.wait(timeout=10)
    except Exception:  # noqa: BLE001 - the fixture kills it
        raise AssertionError("no exit within 10 s of SIGTERM:\n" + srv.log(last=40))
    assert code == 0, f"exit code {code}:\n{srv.log(last=40)}"
