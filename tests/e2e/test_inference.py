"""Inference through tritonclient (JSON and binary tensors) and raw HTTP JSON."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient

from conftest import FIXTURE_MODELS, REPO_ROOT

RNG = np.random.default_rng(42)


def simple_inputs(batch: int, binary: bool):
    a = RNG.integers(-(2**20), 2**20, (batch, 16), dtype=np.int32)
    b = RNG.integers(-(2**20), 2**20, (batch, 16), dtype=np.int32)
    inputs = [
        httpclient.InferInput("INPUT0", [batch, 16], "INT32"),
        httpclient.InferInput("INPUT1", [batch, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    return a, b, inputs


def test_server_metadata_and_health(client):
    meta = client.get_server_metadata()
    assert isinstance(meta.get("name"), str) and meta["name"]
    assert isinstance(meta.get("version"), str) and meta["version"]
    extensions = set(meta.get("extensions", []))
    for ext in ("binary_tensor_data", "model_configuration", "statistics", "model_repository"):
        assert ext in extensions, f"{ext!r} missing from extensions {sorted(extensions)}"
    assert client.is_server_live() is True
    assert client.is_server_ready() is True


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_simple_add_sub(client, batch, binary):
    a, b, inputs = simple_inputs(batch, binary)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary),
    ]
    result = client.infer("simple", inputs, outputs=outputs)
    out0 = result.as_numpy("OUTPUT0")
    out1 = result.as_numpy("OUTPUT1")
    assert out0.dtype == np.int32 and out1.dtype == np.int32
    assert out0.shape == (batch, 16) and out1.shape == (batch, 16)
    np.testing.assert_array_equal(out0, a + b)
    np.testing.assert_array_equal(out1, a - b)

    response = result.get_response()
    assert response["model_name"] == "simple"
    assert response.get("model_version", "1") == "1"
    by_name = {o["name"]: o for o in response["outputs"]}
    assert set(by_name) == {"OUTPUT0", "OUTPUT1"}
    for o in by_name.values():
        assert o["datatype"] == "INT32"
        assert o["shape"] == [batch, 16]
        if binary:
            assert "data" not in o
            assert o["parameters"]["binary_data_size"] == batch * 16 * 4
        else:
            assert "data" in o and len(o["data"]) == batch * 16


def test_simple_default_outputs_binary_inputs(client):
    """No outputs requested: every output comes back (JSON by default in Triton)."""
    a, b, inputs = simple_inputs(2, binary=True)
    result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_simple_only_requested_output(client, binary):
    a, b, inputs = simple_inputs(3, binary)
    result = client.infer(
        "simple",
        inputs,
        outputs=[httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary)],
    )
    names = [o["name"] for o in result.get_response()["outputs"]]
    assert names == ["OUTPUT1"]
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_mlp_matches_onnxruntime(client):
    sess = ort.InferenceSession(
        str(FIXTURE_MODELS / "mlp" / "1" / "model.onnx"),
        providers=["CPUExecutionProvider"],
    )
    for batch in (1, 7, 32):
        x = RNG.standard_normal((batch, 16)).astype(np.float32)
        (expected,) = sess.run(["y"], {"x": x})
        inp = httpclient.InferInput("x", [batch, 16], "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        result = client.infer(
            "mlp", [inp], outputs=[httpclient.InferRequestedOutput("y", binary_data=True)]
        )
        y = result.as_numpy("y")
        assert y.dtype == np.float32 and y.shape == (batch, 4)
        np.testing.assert_allclose(y, expected, atol=1e-5, rtol=0)


def test_reference_file_matches_server(client):
    """tests/fixtures/models_reference.json (used by the Rust tests) agrees with the
    served models."""
    ref = json.loads((REPO_ROOT / "tests" / "fixtures" / "models_reference.json").read_text())
    np_types = {"FP32": np.float32, "INT32": np.int32}
    checked = 0
    for model in ("mlp", "simple"):
        assert ref[model], f"no reference cases for {model}"
        for case in ref[model]:
            inputs = []
            for name, t in case["inputs"].items():
                arr = np.asarray(t["data"], dtype=np_types[t["datatype"]]).reshape(t["shape"])
                inp = httpclient.InferInput(name, t["shape"], t["datatype"])
                inp.set_data_from_numpy(arr, binary_data=False)
                inputs.append(inp)
            result = client.infer(model, inputs)
            for name, t in case["outputs"].items():
                want = np.asarray(t["data"], dtype=np_types[t["datatype"]]).reshape(t["shape"])
                got = result.as_numpy(name)
                assert got is not None, f"{model}: output {name} missing"
                if t["datatype"] == "FP32":
                    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
                else:
                    np.testing.assert_array_equal(got, want)
                checked += 1
    assert checked == 2 * 1 + 2 * 2


@pytest.mark.parametrize("nested", [True, False], ids=["nested", "flat"])
def test_raw_json_nested_and_flat_data(server, nested):
    a = np.arange(32, dtype=np.int32).reshape(2, 16) - 7
    b = (np.arange(32, dtype=np.int32).reshape(2, 16) * 3) % 11
    enc = (lambda x: x.tolist()) if nested else (lambda x: x.reshape(-1).tolist())
    body = {
        "inputs": [
            {"name": "INPUT0", "shape": [2, 16], "datatype": "INT32", "data": enc(a)},
            {"name": "INPUT1", "shape": [2, 16], "datatype": "INT32", "data": enc(b)},
        ]
    }
    status, headers, data = server.request("POST", "/v2/models/simple/infer", body)
    assert status == 200, data[:500]
    resp = json.loads(data)
    outs = {o["name"]: o for o in resp["outputs"]}
    for name, want in (("OUTPUT0", a + b), ("OUTPUT1", a - b)):
        o = outs[name]
        assert o["datatype"] == "INT32"
        assert o["shape"] == [2, 16]
        got = np.asarray(o["data"], dtype=np.int64).reshape(2, 16)
        np.testing.assert_array_equal(got, want)


def test_raw_json_request_id_echoed(server):
    body = {
        "id": "req-42",
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [2] * 16},
        ],
    }
    status, _, data = server.request("POST", "/v2/models/simple/versions/1/infer", body)
    assert status == 200, data[:500]
    resp = json.loads(data)
    assert resp["id"] == "req-42"
    outs = {o["name"]: o["data"] for o in resp["outputs"]}
    assert outs["OUTPUT0"] == [3] * 16
    assert outs["OUTPUT1"] == [-1] * 16


@pytest.mark.parametrize("shape", [(1, 1), (1, 5), (2, 7), (4, 3)])
def test_seq_identity_variable_dims(client, shape):
    x = RNG.standard_normal(shape).astype(np.float32)
    inp = httpclient.InferInput("x", list(shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    result = client.infer("seq_identity", [inp])
    y = result.as_numpy("y")
    assert y.shape == shape
    np.testing.assert_array_equal(y, x * np.float32(2))


def test_nobatch(client):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    inp = httpclient.InferInput("x", [2, 3], "FP32")
    inp.set_data_from_numpy(x, binary_data=False)
    result = client.infer("nobatch", [inp])
    np.testing.assert_array_equal(result.as_numpy("y"), x + 1)
