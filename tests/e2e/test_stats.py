"""Dynamic batching, the statistics extension and Prometheus metrics."""

from __future__ import annotations

import re
import time

import numpy as np
import tritonclient.http as httpclient

DURATION_KEYS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


def model_stat(client, model, version="1"):
    stats = client.get_inference_statistics(model)
    entries = [s for s in stats["model_stats"] if s["name"] == model]
    assert entries, stats
    match = [s for s in entries if s.get("version") == version]
    assert len(match) == 1, entries
    return match[0]


def batch_counts(stat) -> dict[int, int]:
    """{batch_size: number of executions} from batch_stats."""
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stat["batch_stats"]}


def simple_request(client, batch, seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(-1000, 1000, (batch, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, (batch, 16), dtype=np.int32)
    inputs = [
        httpclient.InferInput("INPUT0", [batch, 16], "INT32"),
        httpclient.InferInput("INPUT1", [batch, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a, binary_data=True)
    inputs[1].set_data_from_numpy(b, binary_data=True)
    result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


# -- dynamic batching -------------------------------------------------------------------


def test_dynamic_batching_merges_concurrent_requests(server):
    client = server.client(concurrency=8)
    try:
        before = model_stat(client, "simple_batched")
        rng = np.random.default_rng(7)
        pending = []
        for i in range(8):
            a = rng.standard_normal((1, 16)).astype(np.float32)
            b = rng.standard_normal((1, 16)).astype(np.float32)
            inputs = [
                httpclient.InferInput("INPUT0", [1, 16], "FP32"),
                httpclient.InferInput("INPUT1", [1, 16], "FP32"),
            ]
            inputs[0].set_data_from_numpy(a, binary_data=True)
            inputs[1].set_data_from_numpy(b, binary_data=True)
            pending.append((a, b, client.async_infer("simple_batched", inputs, request_id=str(i))))
        for a, b, req in pending:
            result = req.get_result()
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
            assert result.as_numpy("OUTPUT0").shape == (1, 16)
        after = model_stat(client, "simple_batched")
    finally:
        client.close()

    inferences = int(after["inference_count"]) - int(before["inference_count"])
    executions = int(after["execution_count"]) - int(before["execution_count"])
    assert inferences == 8, (before, after)
    assert 1 <= executions < 8, f"{executions} executions for 8 requests: nothing was merged"
    merged = {
        size: n - batch_counts(before).get(size, 0)
        for size, n in batch_counts(after).items()
    }
    assert any(size > 1 and n > 0 for size, n in merged.items()), after["batch_stats"]
    assert sum(size * n for size, n in merged.items()) == 8, merged
    assert int(after["inference_stats"]["success"]["count"]) - int(
        before["inference_stats"]["success"]["count"]
    ) == 8


# -- statistics ------------------------------------------------------------------------


def test_statistics_shape_and_counts(client):
    before = model_stat(client, "simple")
    batches = [1, 2, 3]
    for i, batch in enumerate(batches):
        simple_request(client, batch, seed=100 + i)
    after = model_stat(client, "simple")

    assert after["name"] == "simple"
    assert after["version"] == "1"
    for key in ("inference_count", "execution_count", "last_inference"):
        assert isinstance(after[key], int), (key, after[key])
    now_ms = time.time() * 1000
    assert abs(after["last_inference"] - now_ms) < 60_000, after["last_inference"]

    stats = after["inference_stats"]
    for key in DURATION_KEYS:
        assert set(("count", "ns")) <= set(stats[key]), (key, stats[key])
        assert isinstance(stats[key]["count"], int) and isinstance(stats[key]["ns"], int)
    assert isinstance(after["batch_stats"], list)
    for entry in after["batch_stats"]:
        assert isinstance(entry["batch_size"], int)
        for key in ("compute_input", "compute_infer", "compute_output"):
            assert set(("count", "ns")) <= set(entry[key]), entry

    def delta(path):
        x, y = before, after
        for p in path:
            x, y = x[p], y[p]
        return int(y) - int(x)

    n = len(batches)
    assert delta(["inference_stats", "success", "count"]) == n
    assert delta(["inference_stats", "success", "ns"]) > 0
    assert delta(["inference_stats", "queue", "count"]) == n
    assert delta(["inference_stats", "compute_infer", "count"]) == n
    assert delta(["inference_stats", "compute_infer", "ns"]) > 0
    assert delta(["inference_stats", "compute_input", "count"]) == n
    assert delta(["inference_stats", "compute_output", "count"]) == n
    assert delta(["inference_stats", "fail", "count"]) == 0
    assert delta(["inference_count"]) == sum(batches)
    # No dynamic batching on `simple`: one execution per request.
    assert delta(["execution_count"]) == n
    bc_before, bc_after = batch_counts(before), batch_counts(after)
    for batch in batches:
        assert bc_after.get(batch, 0) - bc_before.get(batch, 0) == 1, after["batch_stats"]


def test_statistics_endpoints(server):
    import json

    status, _, body = server.request("GET", "/v2/models/simple/versions/1/stats")
    assert status == 200, body[:300]
    stats = json.loads(body)["model_stats"]
    assert [(s["name"], s["version"]) for s in stats] == [("simple", "1")]

    status, _, body = server.request("GET", "/v2/models/stats")
    assert status == 200, body[:300]
    names = {s["name"] for s in json.loads(body)["model_stats"]}
    assert {"simple", "mlp", "simple_batched"} <= names, names

    status, _, body = server.request("GET", "/v2/models/versioned/stats")
    assert status == 200, body[:300]
    versions = sorted(s["version"] for s in json.loads(body)["model_stats"])
    assert versions == ["1", "2", "3"]


# -- metrics -----------------------------------------------------------------------------

METRIC_NAMES = [
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
    "nv_inference_pending_request_count",
]


def metric_value(text: str, name: str, model: str, version: str = "1") -> float | None:
    pattern = re.compile(
        r"^" + re.escape(name) + r"\{([^}]*)\}\s+([-+0-9.eE]+|NaN|[+-]?Inf)\s*(\d+)?$",
        re.M,
    )
    for labels, value, _ts in pattern.findall(text):
        parsed = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if parsed.get("model") == model and parsed.get("version") == version:
            return float(value)
    return None


def test_metrics(server, client):
    before = server.metrics()
    n = 4
    for i in range(n):
        simple_request(client, 2, seed=200 + i)
    text = server.metrics()

    key = 'nv_inference_request_success{model="simple",version="1"}'
    assert key in text, "\n".join(l for l in text.splitlines() if "request_success" in l)

    success = metric_value(text, "nv_inference_request_success", "simple")
    success_before = metric_value(before, "nv_inference_request_success", "simple") or 0
    assert success is not None and success >= n
    assert success - success_before >= n, (success_before, success)

    for name in METRIC_NAMES:
        value = metric_value(text, name, "simple")
        assert value is not None, f"no {name}{{model=\"simple\",version=\"1\"}} sample"
        assert re.search(r"^# TYPE " + re.escape(name) + r" (counter|gauge)$", text, re.M), (
            f"no '# TYPE {name}' line"
        )

    count = metric_value(text, "nv_inference_count", "simple")
    count_before = metric_value(before, "nv_inference_count", "simple") or 0
    assert count - count_before >= 2 * n
    exec_before = metric_value(before, "nv_inference_exec_count", "simple") or 0
    assert metric_value(text, "nv_inference_exec_count", "simple") - exec_before >= n
    assert metric_value(text, "nv_inference_request_duration_us", "simple") > 0
    assert metric_value(text, "nv_inference_pending_request_count", "simple") == 0
    # The counters agree with the statistics extension.
    stat = model_stat(client, "simple")
    assert success == stat["inference_stats"]["success"]["count"]


def test_latency_histograms(server, client):
    """trident_request_{duration,overhead}_us: Prometheus histograms whose count equals
    the successful requests in the statistics API, with cumulative buckets."""
    for i in range(3):
        simple_request(client, 1, seed=300 + i)
    text = server.metrics()
    success = model_stat(client, "simple")["inference_stats"]["success"]["count"]
    labels = 'model="simple",version="1"'
    for name in ("trident_request_duration_us", "trident_request_overhead_us"):
        assert re.search(rf"^# TYPE {name} histogram$", text, re.M), f"no histogram {name}"
        buckets = [
            (le, float(v))
            for le, v in re.findall(rf'^{name}_bucket\{{{labels},le="([^"]+)"\}} (\S+)$', text, re.M)
        ]
        assert buckets and buckets[-1][0] == "+Inf", buckets
        counts = [v for _, v in buckets]
        assert counts == sorted(counts), f"{name} buckets are not cumulative: {counts}"
        total = float(re.search(rf"^{name}_count\{{{labels}\}} (\S+)$", text, re.M).group(1))
        assert total == counts[-1] == success, (total, counts[-1], success)
        assert float(re.search(rf"^{name}_sum\{{{labels}\}} (\S+)$", text, re.M).group(1)) > 0
