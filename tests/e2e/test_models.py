"""Model metadata, configuration, auto-completion, versions and the repository API."""

from __future__ import annotations

import shutil
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import FIXTURE_MODELS


def infer_fp32(client, model, x, version="", input_name="x", output_name="y"):
    inp = httpclient.InferInput(input_name, list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    result = client.infer(model, [inp], model_version=version)
    return result.as_numpy(output_name), result.get_response()


def wait_for(predicate, timeout=10.0, interval=0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


# -- metadata and config ---------------------------------------------------------------


@pytest.mark.parametrize("version", ["", "1"], ids=["latest", "v1"])
def test_simple_metadata(client, version):
    meta = client.get_model_metadata("simple", model_version=version)
    assert meta["name"] == "simple"
    assert "1" in meta["versions"]
    assert meta.get("platform") == "onnxruntime_onnx"
    inputs = {t["name"]: t for t in meta["inputs"]}
    outputs = {t["name"]: t for t in meta["outputs"]}
    assert set(inputs) == {"INPUT0", "INPUT1"}
    assert set(outputs) == {"OUTPUT0", "OUTPUT1"}
    for t in [*inputs.values(), *outputs.values()]:
        assert t["datatype"] == "INT32"
        assert t["shape"] == [-1, 16]


def test_metadata_shapes_of_other_models(client):
    def shapes(model):
        meta = client.get_model_metadata(model)
        return (
            {t["name"]: (t["datatype"], t["shape"]) for t in meta["inputs"]},
            {t["name"]: (t["datatype"], t["shape"]) for t in meta["outputs"]},
        )

    assert shapes("nobatch") == ({"x": ("FP32", [2, 3])}, {"y": ("FP32", [2, 3])})
    assert shapes("seq_identity") == ({"x": ("FP32", [-1, -1])}, {"y": ("FP32", [-1, -1])})
    assert shapes("mlp") == ({"x": ("FP32", [-1, 16])}, {"y": ("FP32", [-1, 4])})


def test_simple_config(client):
    config = client.get_model_config("simple")
    assert config["name"] == "simple"
    assert config["max_batch_size"] == 8
    inputs = {t["name"]: t for t in config["input"]}
    outputs = {t["name"]: t for t in config["output"]}
    assert set(inputs) == {"INPUT0", "INPUT1"}
    assert set(outputs) == {"OUTPUT0", "OUTPUT1"}
    for t in [*inputs.values(), *outputs.values()]:
        assert t["data_type"] == "TYPE_INT32"
        assert t["dims"] == [16]
    # Same answer with an explicit version.
    assert client.get_model_config("simple", model_version="1")["max_batch_size"] == 8


def test_batched_config_reports_scheduling(client):
    config = client.get_model_config("simple_batched")
    assert config["max_batch_size"] == 8
    db = config["dynamic_batching"]
    assert [int(x) for x in db["preferred_batch_size"]] == [4, 8]
    assert int(db["max_queue_delay_microseconds"]) == 200000
    groups = config["instance_group"]
    assert len(groups) == 1 and groups[0]["count"] == 1 and groups[0]["kind"] == "KIND_CPU"

    mlp = client.get_model_config("mlp")
    assert mlp["max_batch_size"] == 32
    assert sum(g["count"] for g in mlp["instance_group"]) == 2


def test_noconfig_autocomplete(client):
    config = client.get_model_config("noconfig")
    assert config["name"] == "noconfig"
    assert config["max_batch_size"] == 4
    inputs = {t["name"]: t for t in config["input"]}
    outputs = {t["name"]: t for t in config["output"]}
    assert set(inputs) == {"x"} and set(outputs) == {"y"}
    assert inputs["x"]["data_type"] == "TYPE_FP32" and inputs["x"]["dims"] == [3]
    assert outputs["y"]["data_type"] == "TYPE_FP32" and outputs["y"]["dims"] == [3]

    meta = client.get_model_metadata("noconfig")
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("x", "FP32", [-1, 3])
    ]
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["outputs"]] == [
        ("y", "FP32", [-1, 3])
    ]

    x = np.array([[1.5, -2.0, 0.25], [3.0, 0.0, -7.5]], dtype=np.float32)
    y, _ = infer_fp32(client, "noconfig", x)
    np.testing.assert_array_equal(y, -x)


# -- versions ----------------------------------------------------------------------------


def test_versioned_all_versions(client):
    x = np.array([[0.5, -1.0], [10.0, 2.25]], dtype=np.float32)
    for v in (1, 2, 3):
        assert client.is_model_ready("versioned", str(v)) is True, f"version {v}"
        y, resp = infer_fp32(client, "versioned", x, version=str(v))
        np.testing.assert_array_equal(y, x + np.float32(v))
        assert resp.get("model_version") == str(v)
    meta = client.get_model_metadata("versioned")
    assert sorted(meta["versions"], key=int) == ["1", "2", "3"]
    # No version: the latest (3).
    y, _ = infer_fp32(client, "versioned", x)
    np.testing.assert_array_equal(y, x + np.float32(3))
    assert client.is_model_ready("versioned", "4") is False


def test_latest_only_serves_newest(client):
    assert client.is_model_ready("latest_only") is True
    assert client.is_model_ready("latest_only", "2") is True
    assert client.is_model_ready("latest_only", "1") is False
    x = np.array([[1.0, 2.0]], dtype=np.float32)
    y, _ = infer_fp32(client, "latest_only", x)
    np.testing.assert_array_equal(y, x + np.float32(2))
    y, _ = infer_fp32(client, "latest_only", x, version="2")
    np.testing.assert_array_equal(y, x + np.float32(2))
    with pytest.raises(InferenceServerException):
        infer_fp32(client, "latest_only", x, version="1")
    meta = client.get_model_metadata("latest_only")
    assert meta["versions"] == ["2"]


# -- repository API ----------------------------------------------------------------------


def index_by_name(client):
    entries = client.get_model_repository_index()
    assert isinstance(entries, list)
    by_name: dict[str, list[dict]] = {}
    for e in entries:
        by_name.setdefault(e["name"], []).append(e)
    return by_name


def test_repository_index_reports_failures(client):
    by_name = index_by_name(client)
    for name in ("simple", "simple_batched", "mlp", "noconfig", "nobatch", "typo", "broken"):
        assert name in by_name, f"{name} missing from index {sorted(by_name)}"
    assert any(e.get("state") == "READY" for e in by_name["simple"])
    versioned_ready = {e.get("version") for e in by_name["versioned"] if e.get("state") == "READY"}
    assert versioned_ready in ({"1", "2", "3"}, {None}, {""}), by_name["versioned"]

    for name in ("typo", "broken"):
        entries = by_name[name]
        assert all(e.get("state") == "UNAVAILABLE" for e in entries), entries
        assert any(e.get("reason") for e in entries), entries
    typo_reason = " ".join(e.get("reason", "") for e in by_name["typo"])
    assert "config.pbtxt:2:" in typo_reason, typo_reason
    assert "max_bach_size" in typo_reason, typo_reason

    assert client.is_model_ready("typo") is False
    assert client.is_model_ready("broken") is False


def test_repository_index_ready_filter(server):
    import json

    status, _, body = server.request("POST", "/v2/repository/index", {"ready": True})
    assert status == 200, body[:500]
    entries = json.loads(body)
    names = {e["name"] for e in entries}
    assert "simple" in names
    assert "typo" not in names and "broken" not in names
    assert all(e.get("state") == "READY" for e in entries), entries


def test_server_still_serves_after_failed_models(client):
    a = np.full((1, 16), 5, dtype=np.int32)
    b = np.full((1, 16), 3, dtype=np.int32)
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "INT32"),
        httpclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


def test_typo_load_fails_with_reason(client):
    with pytest.raises(InferenceServerException) as err:
        client.load_model("typo")
    assert "max_bach_size" in str(err.value)
    assert client.is_model_ready("typo") is False
    assert client.is_server_live() is True


def test_unload_and_reload(client):
    x = np.ones((2, 3), dtype=np.float32)
    assert client.is_model_ready("nobatch") is True

    client.unload_model("nobatch")
    assert wait_for(lambda: not client.is_model_ready("nobatch")), "still ready after unload"
    with pytest.raises(InferenceServerException):
        infer_fp32(client, "nobatch", x)
    entries = index_by_name(client)["nobatch"]
    assert all(e.get("state") != "READY" for e in entries), entries
    # Other models are untouched.
    assert client.is_model_ready("simple") is True

    client.load_model("nobatch")
    assert wait_for(lambda: client.is_model_ready("nobatch")), "not ready after load"
    y, _ = infer_fp32(client, "nobatch", x)
    np.testing.assert_array_equal(y, x + 1)
    assert any(e.get("state") == "READY" for e in index_by_name(client)["nobatch"])


def _wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_poll_mode_loads_added_and_unloads_removed_models(start_server):
    """--model-control-mode poll: a model copied into the repository is loaded, one
    removed is unloaded, without a restart; the load/unload API is refused."""
    srv = start_server(["--model-control-mode", "poll", "--repository-poll-secs", "1"], load=None, models=["simple"])
    client = srv.client()
    names = lambda: {e["name"] for e in client.get_model_repository_index() if e.get("state") == "READY"}
    assert names() == {"simple"}
    shutil.copytree(FIXTURE_MODELS / "mlp", srv.repository / "mlp")
    assert _wait_for(lambda: client.is_model_ready("mlp")), srv.log(last=30)
    x = np.ones((1, 16), dtype=np.float32)
    inp = httpclient.InferInput("x", [1, 16], "FP32")
    inp.set_data_from_numpy(x)
    assert client.infer("mlp", [inp]).as_numpy("y").shape == (1, 4)
    shutil.rmtree(srv.repository / "mlp")
    assert _wait_for(lambda: names() == {"simple"}), srv.log(last=30)
    with pytest.raises(InferenceServerException) as err:
        client.load_model("simple")
    assert "explicit model load / unload is not allowed if polling is enabled" in str(err.value)
    assert "model control mode Poll" in str(err.value)
