"""The gRPC front end, system shared memory, sequence batching and load overrides,
driven with NVIDIA's tritonclient (gRPC and HTTP) against the real binary."""

from __future__ import annotations

import base64
import queue
import shutil
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from conftest import FIXTURE_MODELS, TridentServer

OFFICIAL_MODELS = Path(__file__).resolve().parent / "official" / "models"


def simple_inputs(batch=1, client=grpcclient):
    a = np.arange(16 * batch, dtype=np.int32).reshape(batch, 16)
    b = np.ones((batch, 16), dtype=np.int32)
    inputs = [client.InferInput("INPUT0", [batch, 16], "INT32"), client.InferInput("INPUT1", [batch, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return a, b, inputs


# -- the service ------------------------------------------------------------------------


def test_health_metadata_config_and_statistics_agree_with_http(server, gclient, client):
    assert gclient.is_server_live() and gclient.is_server_ready()
    assert gclient.is_model_ready("simple")
    assert not gclient.is_model_ready("no_such_model"), "unknown models are not ready (no error), as Triton"
    meta = gclient.get_server_metadata(as_json=True)
    assert meta["name"] == "triton"
    assert set(meta["extensions"]) == set(client.get_server_metadata()["extensions"])
    assert {"system_shared_memory", "sequence", "statistics"} <= set(meta["extensions"])
    gmeta = gclient.get_model_metadata("simple", as_json=True)
    hmeta = client.get_model_metadata("simple")
    assert gmeta["inputs"] == [{**i, "shape": [str(d) for d in i["shape"]]} for i in hmeta["inputs"]]
    cfg = gclient.get_model_config("simple", as_json=True)["config"]
    assert cfg["name"] == "simple" and int(cfg["max_batch_size"]) == client.get_model_config("simple")["max_batch_size"]

    before = gclient.get_inference_statistics("simple", as_json=True)["model_stats"][0]
    _, _, inputs = simple_inputs()
    gclient.infer("simple", inputs)
    _, _, hinputs = simple_inputs(client=httpclient)
    client.infer("simple", hinputs)
    after = gclient.get_inference_statistics("simple", as_json=True)["model_stats"][0]
    count = lambda s: int(s["inference_stats"]["success"].get("count", 0))  # noqa: E731
    assert count(after) - count(before) == 2, "gRPC and HTTP requests land in the same statistics"


def test_infer_raw_and_typed_contents(gclient):
    a, b, inputs = simple_inputs(batch=3)
    result = gclient.infer("simple", inputs, request_id="req-7")
    assert result.get_response().id == "req-7"
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    only = gclient.infer("simple", inputs, outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    assert only.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(only.as_numpy("OUTPUT1"), a - b)


def test_errors_have_triton_texts_and_grpc_codes(gclient):
    _, _, inputs = simple_inputs()
    with pytest.raises(InferenceServerException) as e:
        gclient.infer("wrong_model_name", inputs)
    assert e.value.status() == "StatusCode.NOT_FOUND"
    assert "Request for unknown model: 'wrong_model_name' is not found" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        gclient.infer("simple", inputs, model_version="7")
    assert e.value.status() == "StatusCode.NOT_FOUND" and "version 7 is not found" in e.value.message()
    bad = grpcclient.InferInput("INPUT0", [1, 8], "INT32")
    bad.set_data_from_numpy(np.zeros((1, 8), np.int32))
    with pytest.raises(InferenceServerException) as e:
        gclient.infer("simple", [bad, inputs[1]])
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [1,8]" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        gclient.infer("simple", [inputs[0]])
    assert "expected 2 inputs but got 1 inputs for model 'simple'" in e.value.message()
    assert "missing required input(s) ['INPUT1']" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        gclient.infer("simple", inputs, parameters={"custom_knob": 3})
    assert "parameter 'custom_knob' is not supported" in e.value.message(), "refused, never ignored"
    with pytest.raises(InferenceServerException) as e:
        gclient.update_log_settings({"log_verbose_level": 1})
    assert e.value.status() == "StatusCode.UNIMPLEMENTED"
    assert gclient.get_log_settings(as_json=True)["settings"]["log_format"]["string_param"] == "default"
    with pytest.raises(InferenceServerException) as e:
        gclient.get_trace_settings()
    assert e.value.status() == "StatusCode.UNIMPLEMENTED"
    # The server keeps serving after all of these.
    gclient.infer("simple", inputs)


def test_stream_answers_errors_in_stream_and_keeps_going(gclient):
    results: queue.Queue = queue.Queue()
    gclient.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        _, _, inputs = simple_inputs()
        gclient.async_stream_infer("simple", inputs, request_id="ok-1")
        gclient.async_stream_infer("wrong_model_name", inputs, request_id="bad-2")
        gclient.async_stream_infer("simple", inputs, request_id="ok-3")
        got = [results.get(timeout=30) for _ in range(3)]
    finally:
        gclient.stop_stream()
    errors = [e for _, e in got if e is not None]
    oks = sorted(r.get_response().id for r, e in got if e is None)
    assert oks == ["ok-1", "ok-3"]
    assert len(errors) == 1 and "Request for unknown model" in errors[0].message()


def test_messages_larger_than_grpc_default_4mib(gclient):
    """tonic's default limit is 4 MiB a message; tritonclient allows INT32_MAX, so does
    Trident: a 6 MiB string goes in and comes back."""
    big = np.array([[b"x" * (6 << 20)]], dtype=np.object_)
    text = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
    text.set_data_from_numpy(big)
    echoed = gclient.infer("strings_batched", [text]).as_numpy("ECHO")
    assert echoed.shape == (1, 1) and len(echoed[0][0]) == 6 << 20


def test_compressed_requests_and_responses(start_server):
    srv = start_server(["--grpc-infer-response-compression-level", "high"], models=["simple"])
    c = srv.grpc_client()
    a, b, inputs = simple_inputs(2)
    for algorithm in ("gzip", "deflate"):
        r = c.infer("simple", inputs, compression_algorithm=algorithm)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
    c.close()


def test_grpc_health_protocol(server):
    """grpc.health.v1.Health/Check, as grpc_health_probe and Kubernetes gRPC probes call it
    (messages written by hand: HealthCheckRequest{service=1}, HealthCheckResponse{status=1})."""
    import grpc

    channel = grpc.insecure_channel(server.grpc_url)
    check = channel.unary_unary("/grpc.health.v1.Health/Check")
    for service in (b"", b"inference.GRPCInferenceService"):
        request = (b"\x0a" + bytes([len(service)]) + service) if service else b""
        assert check(request, timeout=10) == b"\x08\x01", f"SERVING for {service!r}"
    with pytest.raises(grpc.RpcError) as e:
        check(b"\x0a\x07nothing", timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    channel.close()


# -- system shared memory ----------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_shared_memory_round_trip_and_errors(server, protocol):
    c = server.grpc_client() if protocol == "grpc" else server.client()
    mod = grpcclient if protocol == "grpc" else httpclient
    tag = uuid.uuid4().hex[:8]
    key_in, key_out = f"/trident_in_{tag}", f"/trident_out_{tag}"
    h_in = shm.create_shared_memory_region(f"in_{tag}", key_in, 128)
    h_out = shm.create_shared_memory_region(f"out_{tag}", key_out, 128)
    try:
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        b = np.full((1, 16), 5, dtype=np.int32)
        shm.set_shared_memory_region(h_in, [a, b])
        c.register_system_shared_memory(f"in_{tag}", key_in, 128)
        c.register_system_shared_memory(f"out_{tag}", key_out, 128)
        with pytest.raises(InferenceServerException) as e:
            c.register_system_shared_memory(f"in_{tag}", key_in, 128)
        assert f"shared memory region 'in_{tag}' already in manager" in e.value.message()
        inputs = [mod.InferInput("INPUT0", [1, 16], "INT32"), mod.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_shared_memory(f"in_{tag}", 64)
        inputs[1].set_shared_memory(f"in_{tag}", 64, offset=64)
        outputs = [mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory(f"out_{tag}", 64)
        outputs[1].set_shared_memory(f"out_{tag}", 64, offset=64)
        result = c.infer("simple", inputs, outputs=outputs)
        # The response names the output, its type and shape; the data is in the region
        # (over gRPC its raw contents entry is empty, as Triton's).
        meta = result.get_output("OUTPUT0")
        if protocol == "http":
            assert meta["datatype"] == "INT32" and meta["shape"] == [1, 16]
            assert "data" not in meta and "parameters" not in meta, "the data is in the region only"
        else:
            assert meta.datatype == "INT32" and list(meta.shape) == [1, 16]
            assert result.get_response().raw_output_contents[0] == b""
        out0 = shm.get_contents_as_numpy(h_out, np.int32, [1, 16], offset=0)
        out1 = shm.get_contents_as_numpy(h_out, np.int32, [1, 16], offset=64)
        np.testing.assert_array_equal(out0, a + b)
        np.testing.assert_array_equal(out1, a - b)

        # Out of bounds: the region is 128 bytes.
        inputs[1].set_shared_memory(f"in_{tag}", 64, offset=100)
        with pytest.raises(InferenceServerException) as e:
            c.infer("simple", inputs, outputs=outputs)
        assert f"Invalid offset + byte size for shared memory region: 'in_{tag}'" in e.value.message()
        inputs[1].set_shared_memory("no_such_region", 64)
        with pytest.raises(InferenceServerException) as e:
            c.infer("simple", inputs, outputs=outputs)
        assert "Unable to find shared memory region: 'no_such_region'" in e.value.message()
        # A too small output region.
        inputs[1].set_shared_memory(f"in_{tag}", 64, offset=64)
        outputs[0].set_shared_memory(f"out_{tag}", 32)
        with pytest.raises(InferenceServerException) as e:
            c.infer("simple", inputs, outputs=outputs)
        assert "(32 bytes) should be at least 64 bytes to hold the results" in e.value.message()

        status = c.get_system_shared_memory_status(f"in_{tag}", **({"as_json": True} if protocol == "grpc" else {}))
        assert str(status).count(key_in) == 1
        c.unregister_system_shared_memory(f"in_{tag}")
        c.unregister_system_shared_memory(f"in_{tag}")  # unknown names: success, as Triton
        with pytest.raises(InferenceServerException) as e:
            c.get_system_shared_memory_status(f"in_{tag}")
        assert f"Unable to find system shared memory region: 'in_{tag}'" in e.value.message()
        with pytest.raises(InferenceServerException) as e:
            c.register_cuda_shared_memory("gpu", b"\0" * 64, 0, 64)
        assert "GPUs not supported" in e.value.message()
        c.unregister_cuda_shared_memory()
    finally:
        c.unregister_system_shared_memory(f"out_{tag}")
        c.unregister_system_shared_memory(f"in_{tag}")
        shm.destroy_shared_memory_region(h_in)
        shm.destroy_shared_memory_region(h_out)
        c.close()


def test_shared_memory_of_a_missing_object_is_refused(gclient):
    with pytest.raises(InferenceServerException) as e:
        gclient.register_system_shared_memory("ghost", "/trident_no_such_object_x", 64)
    assert "Unable to open shared memory region: '/trident_no_such_object_x'" in e.value.message()


# -- sequences ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sequences(tmp_path_factory):
    repo = tmp_path_factory.mktemp("seq") / "models"
    repo.mkdir()
    for m in ("simple_sequence", "simple_string_dyna_sequence", "simple_dyna_sequence"):
        shutil.copytree(OFFICIAL_MODELS / m, repo / m)
    # A short idle timeout, to see a sequence released.
    cfg = repo / "simple_sequence" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace("sequence_batching {", "sequence_batching {\n  max_sequence_idle_microseconds: 300000"))
    srv = TridentServer(repo)
    srv.wait_started()
    yield srv
    assert srv.stop() == 0, srv.log(last=60)


def seq_infer(c, model, value, seq, start=False, end=False, mod=grpcclient):
    inp = mod.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[value]], np.int32))
    r = c.infer(model, [inp], sequence_id=seq, sequence_start=start, sequence_end=end)
    return int(r.as_numpy("OUTPUT")[0][0])


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_sequence_errors_have_triton_texts(sequences, protocol):
    mod = grpcclient if protocol == "grpc" else httpclient
    c = sequences.grpc_client() if protocol == "grpc" else sequences.client()
    inp = mod.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[1]], np.int32))
    with pytest.raises(InferenceServerException) as e:
        c.infer("simple_sequence", [inp])
    assert "inference request to model 'simple_sequence' must specify a non-zero or non-empty correlation ID" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        c.infer("simple_sequence", [inp], sequence_id=37469245)
    assert (
        "inference request for sequence 37469245 to model 'simple_sequence' must specify the START flag on the first request of the sequence"
        in e.value.message()
    )
    two = mod.InferInput("INPUT", [2, 1], "INT32")
    two.set_data_from_numpy(np.array([[1], [2]], np.int32))
    with pytest.raises(InferenceServerException) as e:
        c.infer("simple_sequence", [two], sequence_id=5, sequence_start=True)
    assert "must specify batch-size 1 due to requirements of sequence batcher" in e.value.message()
    c.close()


def test_sequence_is_released_after_idle_timeout_and_end(sequences):
    c = sequences.grpc_client()
    assert seq_infer(c, "simple_sequence", 4, 77, start=True) == 5
    assert seq_infer(c, "simple_sequence", 4, 77) == 4
    time.sleep(0.6)  # idle limit 0.3 s
    with pytest.raises(InferenceServerException) as e:
        seq_infer(c, "simple_sequence", 4, 77)
    assert "must specify the START flag" in e.value.message()
    assert seq_infer(c, "simple_sequence", 2, 77, start=True, end=True) == 3
    with pytest.raises(InferenceServerException):
        seq_infer(c, "simple_sequence", 4, 77)  # ended
    c.close()


def test_implicit_state_accumulates_per_sequence_interleaved(sequences):
    """Two sequences interleaved on one stream keep separate state (string CORRIDs)."""
    c = sequences.grpc_client()
    results: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        values = [3, 4, 5]
        for i, v in enumerate(values):
            for sid in ("1111", "2222"):
                inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                inp.set_data_from_numpy(np.array([[v * (2 if sid == "2222" else 1)]], np.int32))
                c.async_stream_infer(
                    "simple_string_dyna_sequence",
                    [inp],
                    request_id=f"{sid}_{i}",
                    sequence_id=sid,
                    sequence_start=i == 0,
                    sequence_end=i == len(values) - 1,
                )
        got = {}
        for _ in range(6):
            r, e = results.get(timeout=30)
            assert e is None, e
            got[r.get_response().id] = int(r.as_numpy("OUTPUT")[0][0])
    finally:
        c.stop_stream()
        c.close()
    # Accumulator: 3, 7, 12 (+1111 at END); doubled sequence: 6, 14, 24 (+2222 at END).
    assert [got[f"1111_{i}"] for i in range(3)] == [3, 7, 12 + 1111]
    assert [got[f"2222_{i}"] for i in range(3)] == [6, 14, 24 + 2222]


def test_sequence_id_on_a_model_without_sequence_batching_is_refused(gclient):
    _, _, inputs = simple_inputs()
    with pytest.raises(InferenceServerException) as e:
        gclient.infer("simple", inputs, sequence_id=3, sequence_start=True)
    assert "has no sequence_batching" in e.value.message()


# -- decoupled models ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def decoupled(tmp_path_factory):
    """repeat_int32 (Triton's example decoupled model, on Trident's `repeat` backend, one
    instance) beside `simple`."""
    repo = tmp_path_factory.mktemp("decoupled") / "models"
    repo.mkdir()
    for m in ("repeat_int32", "simple"):
        shutil.copytree(OFFICIAL_MODELS / m, repo / m)
    srv = TridentServer(repo)
    srv.wait_started()
    yield srv
    assert srv.stop() == 0, srv.log(last=60)


def repeat_inputs(values, delays, wait=0):
    arrays = [
        ("IN", np.array(values, np.int32), "INT32"),
        ("DELAY", np.array(delays, np.uint32), "UINT32"),
        ("WAIT", np.array([wait], np.uint32), "UINT32"),
    ]
    inputs = []
    for name, a, dt in arrays:
        inputs.append(grpcclient.InferInput(name, list(a.shape), dt))
        inputs[-1].set_data_from_numpy(a)
    return inputs


def final_flag(result):
    return result.get_response().parameters["triton_final_response"].bool_param


def test_decoupled_responses_stream_interleaved_with_final_flags(decoupled):
    """Two requests on one instance (WAIT 0 frees it at once): their responses interleave
    by time; each data response says it is not final, and the empty final response comes
    only where the request asks for it. A plain model in the same stream is final at once."""
    results: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(decoupled.grpc_url) as c:
        c.start_stream(callback=lambda result, error: results.put((result, error)))
        c.async_stream_infer("repeat_int32", repeat_inputs([1, 2, 3], [200, 200, 200]), request_id="a", enable_empty_final_response=True)
        c.async_stream_infer("repeat_int32", repeat_inputs([10, 11], [100, 200]), request_id="b")
        _, _, inputs = simple_inputs()
        c.async_stream_infer("simple", inputs, request_id="plain")
        got = [results.get(timeout=30) for _ in range(7)]
        time.sleep(0.3)
        assert results.empty(), "b did not ask for an empty final response"
        c.stop_stream()
    assert all(e is None for _, e in got), [str(e) for _, e in got if e]
    seen = [(r.get_response().id, None if r.as_numpy("OUT") is None else int(r.as_numpy("OUT")[0]), final_flag(r)) for r, _ in got]
    assert seen[0] == ("plain", None, True), seen
    assert [x for x in seen if x[0] != "plain"] == [
        ("b", 10, False),
        ("a", 1, False),
        ("b", 11, False),
        ("a", 2, False),
        ("a", 3, False),
        ("a", None, True),
    ], seen
    idx = [int(r.as_numpy("IDX")[0]) for r, _ in got if r.get_response().id == "a" and r.as_numpy("IDX") is not None]
    assert idx == [0, 1, 2]
    plain = next(r for r, _ in got if r.get_response().id == "plain")
    assert final_flag(plain) and plain.as_numpy("OUTPUT0") is not None


def test_decoupled_errors_and_empty_requests_in_stream(decoupled):
    results: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(decoupled.grpc_url) as c:
        c.start_stream(callback=lambda result, error: results.put((result, error)))
        c.async_stream_infer("repeat_int32", repeat_inputs([1, 2], [0]), request_id="mismatch")
        c.async_stream_infer("repeat_int32", repeat_inputs([], [], wait=0), request_id="none", enable_empty_final_response=True)
        got = [results.get(timeout=30) for _ in range(2)]
        c.async_stream_infer("repeat_int32", repeat_inputs([5], [0]), request_id="after")
        after, error = results.get(timeout=30)
        c.stop_stream()
    errors = [e for _, e in got if e is not None]
    assert len(errors) == 1 and "expected IN and DELAY shape to match, got [2] and [1]" in errors[0].message()
    (empty,) = [r for r, e in got if e is None]
    assert empty.get_response().id == "none" and final_flag(empty) and empty.as_numpy("OUT") is None
    assert error is None and int(after.as_numpy("OUT")[0]) == 5, "the stream keeps going"


def test_decoupled_models_are_refused_outside_streams_with_tritons_texts(decoupled):
    with grpcclient.InferenceServerClient(decoupled.grpc_url) as c:
        with pytest.raises(InferenceServerException) as e:
            c.infer("repeat_int32", repeat_inputs([1], [0]))
        assert e.value.status() == "StatusCode.UNIMPLEMENTED"
        assert e.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"
    inputs = []
    for name, a, dt in [("IN", np.array([1], np.int32), "INT32"), ("DELAY", np.array([0], np.uint32), "UINT32"), ("WAIT", np.array([0], np.uint32), "UINT32")]:
        inputs.append(httpclient.InferInput(name, [1], dt))
        inputs[-1].set_data_from_numpy(a)
    with httpclient.InferenceServerClient(decoupled.url) as h:
        with pytest.raises(InferenceServerException) as e:
            h.infer("repeat_int32", inputs)
        assert e.value.message() == "HTTP end point doesn't support models with decoupled transaction policy"
        assert str(e.value.status()) == "501"
        assert h.is_model_ready("repeat_int32"), "the refusal leaves the model serving"
        cfg = h.get_model_config("repeat_int32")
        assert cfg["model_transaction_policy"] == {"decoupled": True}
    assert "model_transaction_policy" not in decoupled.log(), "no warning names the decoupled policy: it is implemented"


def test_a_client_that_leaves_mid_stream_does_not_stop_the_server(decoupled):
    """The stream closes while responses are still due: the model's response thread sees
    it and stops; the server serves the next client."""
    c = grpcclient.InferenceServerClient(decoupled.grpc_url)
    c.start_stream(callback=lambda result, error: None)
    c.async_stream_infer("repeat_int32", repeat_inputs(list(range(50)), [20] * 50))
    time.sleep(0.2)
    c.stop_stream(cancel_requests=True)
    c.close()
    results: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(decoupled.grpc_url) as c:
        c.start_stream(callback=lambda result, error: results.put((result, error)))
        c.async_stream_infer("repeat_int32", repeat_inputs([7, 8], [0, 0]))
        got = [results.get(timeout=30) for _ in range(2)]
        c.stop_stream()
    assert [int(r.as_numpy("OUT")[0]) for r, _ in got] == [7, 8]


# -- load overrides ----------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_load_with_config_override_and_files(start_server, protocol):
    srv = start_server(["--model-control-mode", "explicit"], load=None, models=["simple", "mlp"])
    c = srv.grpc_client() if protocol == "grpc" else srv.client()
    as_json = {"as_json": True} if protocol == "grpc" else {}
    cfg = lambda m: c.get_model_config(m, **as_json)  # noqa: E731
    c.load_model("simple", config='{"max_batch_size": "4"}')
    mbs = cfg("simple")["config"]["max_batch_size"] if protocol == "grpc" else cfg("simple")["max_batch_size"]
    assert int(mbs) == 4, "the override replaced config.pbtxt"
    with pytest.raises(InferenceServerException) as e:
        c.load_model("simple", config='{"max_batch_size": 16, "no_such_field": 1}')
    assert "failed to load 'simple'" in e.value.message() and "Invalid config override" in e.value.message()
    assert c.is_model_ready("simple"), "a failed override keeps the loaded version serving"
    assert srv.wait_log("Invalid config override"), srv.log(last=20)
    # A model delivered entirely by the request, as a fresh directory.
    onnx_bytes = (FIXTURE_MODELS / "mlp" / "1" / "model.onnx").read_bytes()
    mlp_config = (FIXTURE_MODELS / "mlp" / "config.pbtxt").read_text()
    assert "max_batch_size" in mlp_config
    c.load_model("brand_new", config='{"name": "brand_new", "platform": "onnxruntime_onnx", "max_batch_size": 8}', files={"file:1/model.onnx": onnx_bytes})
    assert c.is_model_ready("brand_new")
    mod = grpcclient if protocol == "grpc" else httpclient
    x = mod.InferInput("x", [2, 16], "FP32")
    x.set_data_from_numpy(np.ones((2, 16), np.float32))
    assert c.infer("brand_new", [x]).as_numpy("y").shape == (2, 4)
    assert not (srv.repository / "brand_new").exists(), "files are written outside the repository only"
    for bad in ("file:../escape.onnx", "file:/abs/model.onnx", "file:1/" + "A" * 256):
        with pytest.raises(InferenceServerException) as e:
            c.load_model("evil", config="{}", files={bad: b"x"})
        assert "failed to load 'evil'" in e.value.message(), (bad, e.value)
    assert not (srv.repository.parent / "escape.onnx").exists()
    with pytest.raises(InferenceServerException) as e:
        c.load_model("simple", files={"file:1/model.onnx": onnx_bytes})
    assert "failed to load" in e.value.message()
    c.unload_model("brand_new")
    assert not c.is_model_ready("brand_new")
    assert c.is_server_live()
    c.close()


def test_http_load_file_parameters_are_base64(start_server):
    srv = start_server(["--model-control-mode", "explicit"], load=None, models=["simple"])
    onnx_bytes = (FIXTURE_MODELS / "simple" / "1" / "model.onnx").read_bytes()
    body = {
        "parameters": {
            "config": '{"name": "raw_simple", "platform": "onnxruntime_onnx", "max_batch_size": 8}',
            "file:1/model.onnx": base64.b64encode(onnx_bytes).decode(),
        }
    }
    status, _, data = srv.request("POST", "/v2/repository/models/raw_simple/load", body)
    assert status == 200, data
    status, _, _ = srv.request("GET", "/v2/models/raw_simple/ready")
    assert status == 200
    status, _, data = srv.request("POST", "/v2/repository/models/raw_simple/load", {"parameters": {"priority": "1"}})
    assert status == 400 and b"unrecognized load parameter 'priority'" in data


# -- SageMaker ---------------------------------------------------------------------------


def test_sagemaker_ping_and_invocations(start_server, monkeypatch):
    """SageMaker's Triton contract: /ping, /invocations with JSON or binary+json bodies
    (framed by the content type's json-header-size, as SageMaker drops custom headers)."""
    monkeypatch.setenv("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME", "simple")
    monkeypatch.setenv("SAGEMAKER_BIND_TO_PORT", "0")
    srv = start_server(
        ["--allow-sagemaker", "true", "--allow-grpc", "false", "--allow-metrics", "false"],
        load=None,
        models=["simple", "mlp"],
    )
    assert "SageMaker mode" in srv.log()
    status, _, _ = srv.request("GET", "/ping")
    assert status == 200
    a = list(range(16))
    body = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": a},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
        ]
    }
    status, headers, data = srv.request("POST", "/invocations", body)
    assert status == 200, data
    import json

    out = {o["name"]: o["data"] for o in json.loads(data)["outputs"]}
    assert out["OUTPUT0"] == [x + 1 for x in a]
    # Binary inputs and outputs.
    header = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "parameters": {"binary_data_size": 64}},
                {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "parameters": {"binary_data_size": 64}},
            ],
            "outputs": [{"name": "OUTPUT1", "parameters": {"binary_data": True}}],
        }
    ).encode()
    raw = np.arange(16, dtype=np.int32).tobytes() + np.full(16, 2, np.int32).tobytes()
    ctype = f"application/vnd.sagemaker-triton.binary+json;json-header-size={len(header)}"
    status, headers, data = srv.request("POST", "/invocations", header + raw, headers={"Content-Type": ctype})
    assert status == 200, data
    assert headers["content-type"].startswith("application/vnd.sagemaker-triton.binary+json;json-header-size=")
    n = int(headers["content-type"].split("json-header-size=")[1])
    assert json.loads(data[:n])["outputs"][0]["name"] == "OUTPUT1"
    np.testing.assert_array_equal(np.frombuffer(data[n:], np.int32), np.arange(16) - 2)
    # Only the default model is loaded (explicit mode), as Triton's SageMaker server does.
    status, _, _ = srv.request("GET", "/v2/models/mlp/ready")
    assert status != 200


# -- single-port mode --------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_single_port_serves_rest_and_grpc_on_one_port(start_server):
    port = _free_port()
    srv = start_server(
        ["--http-port", str(port), "--grpc-port", str(port), "--allow-metrics", "false"],
        models=["simple"],
    )
    assert srv.http_port == port and srv.grpc_port == port, srv.log()
    a, b, inputs = simple_inputs(2)
    g = srv.grpc_client()
    np.testing.assert_array_equal(g.infer("simple", inputs).as_numpy("OUTPUT0"), a + b)
    results: queue.Queue = queue.Queue()
    g.start_stream(callback=lambda result, error: results.put((result, error)))
    g.async_stream_infer("simple", inputs, request_id="s1")
    r, e = results.get(timeout=30)
    g.stop_stream()
    assert e is None and r.get_response().id == "s1"
    g.close()
    h = srv.client()
    _, _, hinputs = simple_inputs(2, client=httpclient)
    np.testing.assert_array_equal(h.infer("simple", hinputs).as_numpy("OUTPUT1"), a - b)
    assert h.is_server_ready()
    h.close()
