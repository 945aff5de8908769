"""NVIDIA's official Python client examples (tests/e2e/official, copied unchanged from
triton-inference-server/client r24.10), run against `trident serve` exactly as Triton's
own QA runs them (qa/L0_http, qa/L0_grpc): the example must exit 0 and, where it
prints one, print its PASS line.

The model repository is tests/e2e/official/models: Triton's example models rebuilt as
ONNX (make_models.py, MODELS.md); simple_string_dyna_sequence, a C++ test backend in
Triton, is an ONNX model with implicit state here; repeat_int32 runs on Trident's native
`repeat` backend, as on Triton's. The CUDA shared-memory examples are skipped (no GPU).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TridentServer

OFFICIAL = Path(__file__).resolve().parent / "official"
MODELS = OFFICIAL / "models"
TIMEOUT_S = 120

# Needs a GPU and cuda-python: not runnable on a CPU machine.
CUDA = pytest.mark.skip(reason="CUDA shared memory needs a GPU and cuda-python")


def _repository(tmp: Path, without: tuple[str, ...] = ()) -> Path:
    """The examples' repository; `without` drops models, as qa/L0_http's lacks
    simple_int8 (its model-control example counts 7 models, L0_grpc's counts 8) and
    neither has repeat_int32."""
    repo = tmp / "models"
    shutil.copytree(MODELS, repo, ignore=lambda d, names: [n for n in names if Path(d) == MODELS and n in without])
    return repo


@pytest.fixture(scope="module")
def official(tmp_path_factory):
    srv = TridentServer(
        _repository(tmp_path_factory.mktemp("official")),
        extra_args=["--grpc-infer-response-compression-level", "high"],
    )
    try:
        srv.wait_started()
    except BaseException:
        srv.stop()
        raise
    yield srv
    assert srv.stop() == 0, srv.log(last=60)


def run_example(script: str, args: list[str], expect_pass: str | None) -> None:
    proc = subprocess.run(
        [sys.executable, str(OFFICIAL / script), *args],
        cwd=OFFICIAL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{script} {args} exited {proc.returncode}:\n{out[-4000:]}"
    if expect_pass is not None:
        passes = [line for line in proc.stdout.splitlines() if "PASS" in line]
        assert passes == [expect_pass], f"{script}: expected exactly {expect_pass!r}, got {passes}:\n{out[-4000:]}"


HTTP_EXAMPLES = [
    ("simple_http_health_metadata.py", [], None),
    ("simple_http_infer_client.py", [], None),
    ("simple_http_infer_client.py", ["--request-compression-algorithm", "gzip", "--response-compression-algorithm", "gzip"], None),
    ("simple_http_infer_client.py", ["--request-compression-algorithm", "deflate", "--response-compression-algorithm", "deflate"], None),
    ("simple_http_aio_infer_client.py", [], "PASS: infer"),
    ("simple_http_async_infer_client.py", [], None),
    ("simple_http_string_infer_client.py", [], "PASS: string"),
    ("simple_http_shm_client.py", [], "PASS: system shared memory"),
    ("simple_http_shm_string_client.py", [], "PASS: system shared memory"),
    ("reuse_infer_objects_client.py", ["-i", "HTTP"], None),
    ("simple_http_sequence_sync_infer_client.py", [], "PASS: Sequence"),
    ("simple_http_sequence_sync_infer_client.py", ["-d"], "PASS: Sequence"),
    pytest.param("simple_http_cudashm_client.py", [], "PASS: cuda shared memory", marks=CUDA),
]

GRPC_EXAMPLES = [
    ("simple_grpc_health_metadata.py", [], None),
    ("simple_grpc_infer_client.py", [], "PASS: infer"),
    ("simple_grpc_infer_client.py", ["-C", "deflate"], "PASS: infer"),
    ("simple_grpc_infer_client.py", ["-C", "gzip"], "PASS: infer"),
    ("simple_grpc_aio_infer_client.py", [], "PASS: grpc aio infer"),
    ("simple_grpc_async_infer_client.py", [], "PASS: Async infer"),
    ("simple_grpc_keepalive_client.py", [], "PASS: KeepAlive"),
    ("simple_grpc_custom_args_client.py", [], "PASS: CustomArgs"),
    ("simple_grpc_string_infer_client.py", [], "PASS: string"),
    ("simple_grpc_shm_client.py", [], "PASS: system shared memory"),
    ("simple_grpc_shm_string_client.py", [], "PASS: system shared memory"),
    ("grpc_client.py", [], "PASS"),
    ("grpc_explicit_byte_content_client.py", [], "PASS: explicit string"),
    ("grpc_explicit_int_content_client.py", [], "PASS: explicit int"),
    ("grpc_explicit_int8_content_client.py", [], "PASS: explicit int8"),
    ("reuse_infer_objects_client.py", ["-i", "gRPC"], None),
    ("simple_grpc_sequence_sync_infer_client.py", [], "PASS: Sequence"),
    ("simple_grpc_sequence_sync_infer_client.py", ["-d"], "PASS: Sequence"),
    ("simple_grpc_sequence_stream_infer_client.py", [], "PASS: Sequence"),
    ("simple_grpc_sequence_stream_infer_client.py", ["-d"], "PASS: Sequence"),
    ("simple_grpc_aio_sequence_stream_infer_client.py", [], "PASS: grpc aio sequence stream"),
    ("simple_grpc_aio_sequence_stream_infer_client.py", ["-d"], "PASS: grpc aio sequence stream"),
    pytest.param("simple_grpc_cudashm_client.py", [], "PASS: cudashm", marks=CUDA),
    ("simple_grpc_custom_repeat.py", [], "PASS: Decoupled API"),
]


@pytest.mark.parametrize("script,args,expect", HTTP_EXAMPLES)
def test_http_example(official, script, args, expect):
    run_example(script, ["-u", official.url, *args], expect)


@pytest.mark.parametrize("script,args,expect", GRPC_EXAMPLES)
def test_grpc_example(official, script, args, expect):
    run_example(script, ["-u", official.grpc_url, *args], expect)


IMAGE = ["-m", "inception_graphdef", "-s", "INCEPTION", "-c", "1", "-b", "1", "vulture.jpeg"]


@pytest.mark.parametrize(
    "script,args",
    [
        ("grpc_image_client.py", []),
        ("grpc_image_client.py", ["-a"]),
        ("grpc_image_client.py", ["--streaming"]),
        ("image_client.py", ["-i", "grpc"]),
        ("image_client.py", ["-i", "grpc", "-a"]),
        ("image_client.py", ["-i", "grpc", "--streaming"]),
    ],
)
def test_image_client_classifies_through_labels(official, script, args):
    """Triton's QA check: exactly one VULTURE line (classification extension + labels)."""
    pytest.importorskip("PIL", reason="the image examples need Pillow")
    proc = subprocess.run(
        [sys.executable, str(OFFICIAL / script), "-u", official.grpc_url, *args, *IMAGE],
        cwd=OFFICIAL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert proc.stdout.count("VULTURE") == 1, out[-4000:]


def test_http_image_client(official):
    pytest.importorskip("PIL", reason="the image examples need Pillow")
    pytest.importorskip("attrdict", reason="image_client.py's HTTP path imports attrdict")
    proc = subprocess.run(
        [sys.executable, str(OFFICIAL / "image_client.py"), "-u", official.url, *IMAGE],
        cwd=OFFICIAL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0 and proc.stdout.count("VULTURE") == 1, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "script,without,protocol",
    [
        ("simple_http_model_control.py", ("simple_int8", "repeat_int32"), "http"),
        ("simple_grpc_model_control.py", ("repeat_int32",), "grpc"),
    ],
)
def test_model_control_example(tmp_path, script, without, protocol):
    repo = _repository(tmp_path, without)
    srv = TridentServer(repo, load=None, extra_args=["--model-control-mode", "explicit"])
    try:
        srv.wait_started()
        url = srv.url if protocol == "http" else srv.grpc_url
        run_example(script, ["-u", url], "PASS: model control")
        assert srv.wait_log("Invalid config override"), "Triton's QA greps the server log for this"
    finally:
        assert srv.stop() == 0, srv.log(last=60)
