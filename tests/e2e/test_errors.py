"""Error handling: status codes, `{"error": "..."}` bodies, and that bad requests leave
the server healthy. Also request-body limits and path traversal."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import OUTSIDE_MARKER, OUTSIDE_MODEL

INFER = "/v2/models/simple/infer"


def tensor(name, shape, datatype="INT32", data=None):
    n = int(np.prod(shape))
    if data is None:
        data = [1.5] * n if datatype.startswith("FP") else list(range(n))
    return {"name": name, "shape": list(shape), "datatype": datatype, "data": data}


def good_body(batch=1):
    return {
        "inputs": [
            tensor("INPUT0", [batch, 16]),
            tensor("INPUT1", [batch, 16]),
        ]
    }


def error_message(status, body) -> str:
    """Asserts `body` is a JSON `{"error": "<non-empty>"}` object; returns the message."""
    try:
        obj = json.loads(body)
    except ValueError:
        pytest.fail(f"HTTP {status}: error body is not JSON: {body[:300]!r}")
    assert isinstance(obj, dict) and isinstance(obj.get("error"), str), obj
    assert obj["error"].strip(), obj
    return obj["error"]


def expect_400(server, body, headers=None, mentions=()):
    status, _, data = server.request("POST", INFER, body, headers=headers)
    assert status == 400, f"expected 400, got {status}: {data[:500]!r}"
    msg = error_message(status, data)
    for word in mentions:
        assert word in msg, f"{word!r} not in error message {msg!r}"
    return msg


def assert_simple_works(server):
    status, _, data = server.request("POST", INFER, good_body(2))
    assert status == 200, data[:500]
    outs = {o["name"]: o["data"] for o in json.loads(data)["outputs"]}
    expected = list(range(32))
    assert outs["OUTPUT0"] == [2 * v for v in expected]
    assert outs["OUTPUT1"] == [0] * 32


# -- unknown model -----------------------------------------------------------------------


def test_unknown_model(server, client):
    status, _, data = server.request("GET", "/v2/models/nope")
    assert status == 404, f"{status}: {data[:300]!r}"
    error_message(status, data)

    status, _, data = server.request("GET", "/v2/models/nope/ready")
    assert status in (400, 404), status
    assert client.is_model_ready("nope") is False

    status, _, data = server.request("POST", "/v2/models/nope/infer", good_body())
    assert status in (400, 404), f"{status}: {data[:300]!r}"
    assert "nope" in error_message(status, data)

    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(np.zeros((1, 16), dtype=np.int32))
    with pytest.raises(InferenceServerException) as err:
        client.infer("nope", inputs)
    assert "nope" in str(err.value)

    with pytest.raises(InferenceServerException):
        client.get_model_metadata("nope")


def test_unknown_version(server):
    status, _, data = server.request("POST", "/v2/models/simple/versions/7/infer", good_body())
    assert status in (400, 404), f"{status}: {data[:300]!r}"
    error_message(status, data)


# -- invalid inference requests ------------------------------------------------------------


def test_wrong_datatype(server):
    body = good_body()
    body["inputs"][0] = tensor("INPUT0", [1, 16], "FP32")
    expect_400(server, body, mentions=["INPUT0"])


def test_wrong_datatype_via_client(client):
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "FP32"),
        httpclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(np.zeros((1, 16), dtype=np.float32), binary_data=True)
    inputs[1].set_data_from_numpy(np.zeros((1, 16), dtype=np.int32), binary_data=True)
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple", inputs)
    assert "INPUT0" in str(err.value)


def test_wrong_shape(server):
    body = good_body()
    body["inputs"][0] = tensor("INPUT0", [1, 15])
    expect_400(server, body, mentions=["INPUT0"])


def test_batch_too_large(server):
    expect_400(server, good_body(batch=9))


def test_missing_input(server):
    body = good_body()
    del body["inputs"][1]
    expect_400(server, body, mentions=["INPUT1"])


def test_unknown_input(server):
    body = good_body()
    body["inputs"].append(tensor("INPUT2", [1, 16]))
    expect_400(server, body, mentions=["INPUT2"])


def test_unknown_requested_output(server):
    body = good_body()
    body["outputs"] = [{"name": "OUTPUT9"}]
    expect_400(server, body, mentions=["OUTPUT9"])


@pytest.mark.parametrize(
    "raw",
    [
        b'{"inputs": [',
        b"not json at all",
        b'{"inputs": "INPUT0"}',
        b"",
    ],
    ids=["truncated", "garbage", "wrong-type", "empty"],
)
def test_malformed_json(server, raw):
    expect_400(server, raw)


@pytest.mark.parametrize("count", [15, 17, 0])
def test_element_count_mismatch(server, count):
    body = good_body()
    body["inputs"][0]["data"] = list(range(count))
    expect_400(server, body)


def test_json_value_not_representable(server):
    body = good_body()
    body["inputs"][0]["data"] = ["a"] * 16
    expect_400(server, body)


def binary_request(declared_sizes, payload_len, header_len_delta=0):
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "shape": [1, 16],
                "datatype": "INT32",
                "parameters": {"binary_data_size": declared_sizes[0]},
            },
            {
                "name": "INPUT1",
                "shape": [1, 16],
                "datatype": "INT32",
                "parameters": {"binary_data_size": declared_sizes[1]},
            },
        ]
    }
    head = json.dumps(header).encode()
    payload = np.arange(payload_len // 4, dtype="<i4").tobytes()
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(head) + header_len_delta),
    }
    return head + payload, headers


def test_binary_good_request(server):
    body, headers = binary_request([64, 64], 128)
    status, _, data = server.request("POST", INFER, body, headers=headers)
    assert status == 200, data[:500]
    outs = {o["name"]: o for o in json.loads(data)["outputs"]}
    assert outs["OUTPUT0"]["data"] == [i + (i + 16) for i in range(16)]
    assert outs["OUTPUT1"]["data"] == [-16] * 16


def test_binary_header_length_beyond_body(server):
    body, headers = binary_request([64, 64], 128)
    headers["Inference-Header-Content-Length"] = str(len(body) + 100)
    expect_400(server, body, headers=headers)


def test_binary_data_size_beyond_body(server):
    body, headers = binary_request([64, 64], 96)
    expect_400(server, body, headers=headers)


def test_binary_data_size_wrong_for_shape(server):
    body, headers = binary_request([60, 68], 128)
    expect_400(server, body, headers=headers, mentions=["INPUT0"])


def test_binary_header_not_json(server):
    body = b"\x00\x01garbage" + bytes(128)
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": "10",
    }
    expect_400(server, body, headers=headers)


def test_server_healthy_after_errors(server, client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("simple")
    assert_simple_works(server)


# -- request body limit ------------------------------------------------------------------


def test_request_body_limit(start_server):
    srv = start_server(["--http-max-body-bytes", "1024"], load="simple", models=["simple"])
    small = json.dumps(good_body()).encode()
    assert len(small) < 1024
    srv.wait_models(["simple"], [], timeout=30)
    # The limit must not reject ordinary requests.
    status, _, data = srv.request("POST", INFER, small)
    assert status == 200, data[:500]

    big = json.dumps(good_body(batch=8)).encode()
    assert 1024 < len(big) < 8192
    status, _, data = srv.request("POST", INFER, big)
    assert status == 413, f"{status}: {data[:300]!r}"

    # And it keeps serving afterwards.
    status, _, data = srv.request("POST", INFER, small)
    assert status == 200, data[:500]


# -- path traversal ----------------------------------------------------------------------


TRAVERSALS = [
    ("GET", "/v2/models/..%2F..%2Fetc/config"),
    ("GET", "/v2/models/..%2F..%2Fetc%2Fpasswd"),
    ("POST", "/v2/repository/models/..%2Fx/load"),
    ("GET", f"/v2/models/..%2F{OUTSIDE_MODEL}/config"),
    ("GET", f"/v2/models/%2E%2E%2F{OUTSIDE_MODEL}"),
    ("POST", f"/v2/repository/models/..%2F{OUTSIDE_MODEL}/load"),
    ("POST", f"/v2/repository/models/%2E%2E%2F{OUTSIDE_MODEL}/load"),
    ("POST", f"/v2/repository/models/..%5C{OUTSIDE_MODEL}/load"),
    ("POST", f"/v2/repository/models/%2Ftmp%2F{OUTSIDE_MODEL}/load"),
    ("GET", f"/v2/models/..%2F{OUTSIDE_MODEL}/ready"),
]


@pytest.mark.parametrize("method,path", TRAVERSALS)
def test_path_traversal_rejected(server, method, path):
    status, _, data = server.request(method, path, b"{}" if method == "POST" else None)
    assert 400 <= status < 500, f"{method} {path}: {status} {data[:300]!r}"
    assert OUTSIDE_MARKER.encode() not in data
    assert b"root:" not in data


def test_path_traversal_loaded_nothing(server, client):
    """After the traversal attempts, no model from outside the repository is loaded."""
    names = {e["name"] for e in client.get_model_repository_index()}
    assert not any(OUTSIDE_MODEL in n or ".." in n or "/" in n for n in names), names
    status, _, data = server.request("GET", "/v2/models/stats")
    assert status == 200, data[:300]
    assert OUTSIDE_MODEL.encode() not in data
    # The outside directory is a valid model: the server really would have loaded it.
    assert (server.repository.parent / OUTSIDE_MODEL / "config.pbtxt").exists()


# -- overload (429) ----------------------------------------------------------------------

QUEUE_LIMITED = "queue_limited"  # max_queue_size 2, one instance, a few ms per request
SLOW_WIDTH, SLOW_LAYERS = 256, 20  # as in tests/fixtures/make_models.py


def queue_limited_expected(x: np.ndarray) -> np.ndarray:
    """What queue_limited computes (see slow_chain_graph in make_models.py)."""
    n = SLOW_WIDTH
    a = np.linspace(-1.0, 1.0, n, dtype=np.float32).reshape(n, 1)
    b = np.linspace(0.5, 3.0, n, dtype=np.float32).reshape(1, n)
    w = (np.sin(a * b) / np.float32(16)).astype(np.float32)
    h = x.astype(np.float32)[:, None, :] + w  # [batch, 256 rows, 256]
    for _ in range(SLOW_LAYERS):
        h = np.tanh(h @ w)
    return h.mean(axis=1)


def queue_limited_stats(server) -> dict:
    status, _, body = server.request("GET", f"/v2/models/{QUEUE_LIMITED}/versions/1/stats")
    assert status == 200, body[:300]
    (entry,) = json.loads(body)["model_stats"]
    return entry["inference_stats"]


def burst(server, inputs: list[np.ndarray]) -> list[tuple[int, bytes]]:
    """Sends one request per input at the same moment (one connection and thread each,
    released together by a barrier); returns (status, body) in input order."""
    import http.client
    import threading

    path = f"/v2/models/{QUEUE_LIMITED}/infer"
    bodies = [
        json.dumps({"inputs": [tensor("x", [1, SLOW_WIDTH], "FP32", x.ravel().tolist())]})
        for x in inputs
    ]
    conns = [
        http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30) for _ in inputs
    ]
    for c in conns:
        c.connect()
    barrier = threading.Barrier(len(inputs))
    results: list = [None] * len(inputs)

    def send(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            conns[i].request(
                "POST", path, body=bodies[i], headers={"Content-Type": "application/json"}
            )
            resp = conns[i].getresponse()
            results[i] = (resp.status, resp.read())
        except Exception as e:  # noqa: BLE001 - reported by the caller
            results[i] = (None, repr(e).encode())
        finally:
            conns[i].close()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def test_overload_returns_429(server):
    """32 simultaneous requests to a model whose queue holds 2 (queued or executing):
    the excess is refused with 429, the rest are answered correctly, every refusal is
    counted as a failure, and the model keeps serving."""
    before = queue_limited_stats(server)
    rng = np.random.default_rng(429)
    statuses: list[int] = []
    # A burst virtually always overflows the queue; allow up to 3 in case a loaded
    # machine happens to serialise one.
    for _ in range(3):
        inputs = [rng.standard_normal((1, SLOW_WIDTH)).astype(np.float32) for _ in range(32)]
        for x, (status, data) in zip(inputs, burst(server, inputs)):
            assert status in (200, 429), f"expected 200 or 429, got {status}: {data[:300]!r}"
            statuses.append(status)
            if status == 429:
                msg = error_message(status, data)
                assert "overloaded" in msg and "max_queue_size" in msg, msg
                assert QUEUE_LIMITED in msg, msg
            else:
                (out,) = json.loads(data)["outputs"]
                assert out["name"] == "y" and out["shape"] == [1, SLOW_WIDTH], out
                got = np.asarray(out["data"], dtype=np.float32).reshape(1, SLOW_WIDTH)
                np.testing.assert_allclose(got, queue_limited_expected(x), rtol=1e-4, atol=1e-4)
        if 429 in statuses and 200 in statuses:
            break
    ok, refused = statuses.count(200), statuses.count(429)
    assert refused >= 1, f"no 429 in {len(statuses)} requests: the queue bound is not enforced"
    assert ok >= 1, f"every one of {len(statuses)} requests was refused"

    # Still serving normally.
    x = rng.standard_normal((1, SLOW_WIDTH)).astype(np.float32)
    body = {"inputs": [tensor("x", [1, SLOW_WIDTH], "FP32", x.ravel().tolist())]}
    status, _, data = server.request("POST", f"/v2/models/{QUEUE_LIMITED}/infer", body)
    assert status == 200, data[:500]
    (out,) = json.loads(data)["outputs"]
    np.testing.assert_allclose(
        np.asarray(out["data"], dtype=np.float32).reshape(1, SLOW_WIDTH),
        queue_limited_expected(x),
        rtol=1e-4,
        atol=1e-4,
    )

    # Refused requests are failures in the statistics extension, as in Triton.
    after = queue_limited_stats(server)
    assert after["fail"]["count"] - before["fail"]["count"] == refused, (before, after)
    assert after["success"]["count"] - before["success"]["count"] == ok + 1, (before, after)


def _simple_inputs():
    inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(np.ones((1, 16), dtype=np.int32), binary_data=True)
    return inputs


@pytest.mark.parametrize(
    "kwargs, parameter",
    [
        ({"priority": 1}, "priority"),
        ({"timeout": 1000}, "timeout"),
    ],
)
def test_unimplemented_parameters_are_refused(client, kwargs, parameter):
    """Features Trident does not implement yet are refused by name, never ignored."""
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple", _simple_inputs(), **kwargs)
    assert f"parameter '{parameter}' is not supported" in str(err.value), str(err.value)
    assert client.infer("simple", _simple_inputs()).as_numpy("OUTPUT0").tolist() == [[2] * 16]


def test_classification_extension_on_a_model_without_labels(client):
    """class_count: the top classes as Triton writes them, "value:index" without labels
    (ties in index order); the plain output is unchanged for a request without it."""
    out = [httpclient.InferRequestedOutput("OUTPUT0", class_count=3)]
    got = client.infer("simple", _simple_inputs(), outputs=out).as_numpy("OUTPUT0")
    assert got.shape == (1, 3)
    assert [e.decode() for e in got[0]] == ["2:0", "2:1", "2:2"]
    assert client.infer("simple", _simple_inputs()).as_numpy("OUTPUT0").tolist() == [[2] * 16]


def test_responses_are_compressed_when_accepted_and_large_enough(server):
    """Accept-Encoding is honoured for responses of 1 KiB or more (smaller ones cost more
    to compress than they save and go as they are); a q of 0 refuses a coding."""
    import gzip
    import zlib

    def infer(rows, accept=None):
        body = {"inputs": [
            {"name": n, "datatype": "INT32", "shape": [rows, 16], "data": [100_000 + i for i in range(16 * rows)]}
            for n in ("INPUT0", "INPUT1")
        ]}
        headers = {"Accept-Encoding": accept} if accept else {}
        status, hdrs, data = server.request("POST", "/v2/models/simple/infer", body, headers=headers)
        assert status == 200, data
        return {k.lower(): v for k, v in hdrs.items()}, data

    _, plain = infer(8)
    assert len(plain) >= 1024, f"the batch-8 answer ({len(plain)} bytes) must be large enough to be compressed"
    hdrs, data = infer(8, "gzip")
    assert hdrs.get("content-encoding") == "gzip" and gzip.decompress(data) == plain
    hdrs, data = infer(8, "gzip;q=0, deflate")
    assert hdrs.get("content-encoding") == "deflate" and zlib.decompress(data) == plain
    hdrs, data = infer(8, "gzip; q=0.0")
    assert "content-encoding" not in hdrs and data == plain
    _, small_plain = infer(1)
    assert len(small_plain) < 1024
    hdrs, data = infer(1, "gzip")
    assert "content-encoding" not in hdrs and data == small_plain


def test_compressed_bodies_and_unknown_encodings(server, client):
    """gzip and deflate request bodies are decompressed (tritonclient's compression flags),
    responses compressed when accepted; another encoding, or a body that is not what its
    encoding says, is refused by name."""
    for algorithm in ("gzip", "deflate"):
        r = client.infer(
            "simple",
            _simple_inputs(),
            request_compression_algorithm=algorithm,
            response_compression_algorithm=algorithm,
        )
        assert r.as_numpy("OUTPUT0") is not None
    body = b'{"inputs": []}'
    status, _, data = server.request("POST", "/v2/models/simple/infer", body, headers={"Content-Encoding": "br"})
    assert status == 400 and b"Content-Encoding 'br' is not supported" in data, data
    status, _, data = server.request("POST", "/v2/models/simple/infer", body, headers={"Content-Encoding": "gzip"})
    assert status == 400 and b"not valid gzip data" in data, data
    import gzip

    bomb = gzip.compress(b" " * (80 << 20))  # 80 MiB of spaces: over the 64 MiB body limit
    status, _, data = server.request("POST", "/v2/models/simple/infer", bomb, headers={"Content-Encoding": "gzip"})
    assert status == 413 and b"decompressed request body exceeds" in data, data
