"""NVIDIA's perf_analyzer against `trident serve` over gRPC (and HTTP with shared
memory), where perf_analyzer is installed: $PERF_ANALYZER (its libraries in
$PERF_ANALYZER_LIBS, see ../shared/PEERS.md section C) or `perf_analyzer` on PATH.
Skipped with a message otherwise."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import TridentServer

OFFICIAL_MODELS = Path(__file__).resolve().parent / "official" / "models"


def perf_analyzer() -> str | None:
    return os.environ.get("PERF_ANALYZER") or shutil.which("perf_analyzer")


pytestmark = pytest.mark.skipif(
    perf_analyzer() is None,
    reason="perf_analyzer is not installed (set PERF_ANALYZER; ../shared/PEERS.md section C)",
)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repo = tmp_path_factory.mktemp("pa") / "models"
    repo.mkdir()
    for m in ("simple", "simple_sequence"):
        shutil.copytree(OFFICIAL_MODELS / m, repo / m)
    srv = TridentServer(repo)
    srv.wait_started()
    yield srv
    assert srv.stop() == 0, srv.log(last=40)


@pytest.mark.parametrize(
    "model,protocol,extra",
    [
        ("simple", "grpc", []),
        ("simple", "grpc", ["--streaming"]),
        ("simple", "grpc", ["--async"]),
        ("simple", "grpc", ["--shared-memory", "system"]),
        ("simple", "http", ["--shared-memory", "system"]),
        ("simple_sequence", "grpc", []),
        ("simple_sequence", "grpc", ["--streaming"]),
    ],
)
def test_perf_analyzer_runs_without_errors(served, model, protocol, extra):
    url = served.grpc_url if protocol == "grpc" else served.url
    env = dict(os.environ)
    if os.environ.get("PERF_ANALYZER_LIBS"):
        env["LD_LIBRARY_PATH"] = os.environ["PERF_ANALYZER_LIBS"]
    proc = subprocess.run(
        [perf_analyzer(), "-m", model, "-i", protocol, "-u", url, *extra,
         "--concurrency-range", "2", "--measurement-interval", "1000", "-s", "50", "--max-trials", "6"],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Throughput:" in out and "error" not in out.lower(), out[-3000:]
