"""End-to-end fixtures: start the real `trident serve` binary on a temporary copy of
tests/fixtures/models and talk to it with NVIDIA's `tritonclient[http]`.

The binary is $TRIDENT_BIN, default target/debug/trident under the repository root.
Build it first (`cargo build -p trident-cli`).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import tritonclient.http as httpclient

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURE_MODELS = REPO_ROOT / "tests" / "fixtures" / "models"

LISTENING = re.compile(r"(HTTP|gRPC|metrics) service listening on ([0-9.]+):(\d+)")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

STARTUP_TIMEOUT_S = 60.0
SHUTDOWN_TIMEOUT_S = 10.0

# Models of the fixture repository that must be READY after `--load-model '*'`, and
# those that must fail to load.
READY_MODELS = [
    "simple",
    "simple_batched",
    "mlp",
    "seq_identity",
    "versioned",
    "latest_only",
    "noconfig",
    "nobatch",
    "queue_limited",
    "strings_batched",
]
FAILING_MODELS = ["typo", "broken"]

# A model directory placed *next to* the repository (outside it), which a server with a
# path-traversal bug could be tricked into reading. Its config carries this marker.
OUTSIDE_MODEL = "outside_model"
OUTSIDE_MARKER = "SECRET_OUTSIDE_7f3a9c"


def _flag_off(args: list[str], flag: str) -> bool:
    """Whether `flag false` is among the arguments."""
    return any(a == flag and b == "false" for a, b in zip(args, args[1:]))


def trident_bin() -> Path:
    env = os.environ.get("TRIDENT_BIN")
    path = Path(env) if env else REPO_ROOT / "target" / "debug" / "trident"
    if not path.is_absolute():
        path = REPO_ROOT / path
    return path


class TridentServer:
    """A running `trident serve` process with its log (stdout and stderr, merged)."""

    _all: list["TridentServer"] = []

    def __init__(
        self,
        repository: Path,
        extra_args: list[str] = (),
        load: str | None = "*",
        https: bool = False,
        ca: Path | None = None,
    ):
        # With https, raw requests go over TLS trusting `ca` (the server's HTTP port
        # serves HTTPS only).
        self.https, self.ca = https, ca
        binary = trident_bin()
        if not binary.exists():
            raise RuntimeError(
                f"trident binary not found at {binary}; build it with "
                "`cargo build -p trident-cli` or set TRIDENT_BIN"
            )
        self.repository = repository
        # Defaults the caller's extra_args may replace (a flag is given once).
        defaults = {
            "--http-address": "127.0.0.1",
            "--http-port": "0",
            "--metrics-port": "0",
            "--grpc-address": "127.0.0.1",
            "--grpc-port": "0",
        }
        self.args = [
            str(binary),
            "serve",
            "--model-repository",
            str(repository),
            *[x for flag, value in defaults.items() if flag not in extra_args for x in (flag, value)],
            # load=None: the caller picks the control mode in extra_args.
            *(["--model-control-mode", "explicit", "--load-model", load] if load is not None else []),
            *extra_args,
        ]
        self.lines: list[str] = []
        self.ports: dict[str, int] = {}
        self._cond = threading.Condition()
        env = dict(os.environ)
        env.setdefault("NO_COLOR", "1")
        env.setdefault("TRIDENT_LOG", "info")  # the listening lines are INFO
        self.proc = subprocess.Popen(
            self.args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(repository.parent),
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        TridentServer._all.append(self)
        self.exit_code: int | None = None

    # -- log ---------------------------------------------------------------------

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            line = ANSI.sub("", raw.decode("utf-8", "replace").rstrip("\n"))
            with self._cond:
                self.lines.append(line)
                m = LISTENING.search(line)
                if m:
                    self.ports[m.group(1)] = int(m.group(3))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def log(self, last: int | None = None) -> str:
        with self._cond:
            lines = self.lines if last is None else self.lines[-last:]
            return "\n".join(lines)

    def wait_log(self, needle: str, timeout: float = 10.0) -> bool:
        """Whether `needle` appears in the log within `timeout` seconds. The server may
        answer a request before its log line about it has reached the reader thread, so a
        test that checks the log right after an answer waits for the line."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not any(needle in line for line in self.lines):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.2))
            return True

    # -- start / stop ------------------------------------------------------------

    def wait_started(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            expected = {"HTTP", "metrics"}
            if not _flag_off(self.args, "--allow-grpc"):
                expected.add("gRPC")
            if _flag_off(self.args, "--allow-metrics"):
                expected.discard("metrics")
            while not expected <= self.ports.keys():
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"trident exited with {self.proc.returncode} before listening:\n"
                        + "\n".join(self.lines)
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(
                        "trident did not report its HTTP and metrics ports within "
                        f"{timeout}s:\n" + "\n".join(self.lines)
                    )
                self._cond.wait(min(left, 0.2))
        while True:
            try:
                status, _, _ = self.request("GET", "/v2/health/live", timeout=2)
                if status == 200:
                    self.check_engine()
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "GET /v2/health/live never answered 200:\n" + self.log()
                )
            time.sleep(0.05)

    def check_engine(self) -> None:
        """With TRIDENT_ONNX_ENGINE=tract|ort, every model must have loaded on that engine."""
        wanted = os.environ.get("TRIDENT_ONNX_ENGINE")
        if wanted not in ("tract", "ort"):
            return
        name = {"tract": "tract", "ort": "onnxruntime"}[wanted]
        with self._cond:
            engines = set(re.findall(r"loading with (\w+)", "\n".join(self.lines)))
        # Trident's own native backends (pre-processing, repeat) run on no ONNX engine.
        engines -= {"tokenizer", "image", "table", "repeat"}
        # Empty when nothing is loaded at start (explicit mode without --load-model).
        assert engines <= {name}, f"expected every model on {name}, log shows {engines}"

    def wait_models(self, ready: list[str], failing: list[str], timeout: float) -> None:
        """Waits until `ready` models are ready and `failing` ones are UNAVAILABLE."""
        deadline = time.monotonic() + timeout
        client = self.client()
        try:
            while time.monotonic() < deadline:
                try:
                    if all(client.is_model_ready(m) for m in ready):
                        index = client.get_model_repository_index()
                        states = {}
                        for entry in index:
                            states.setdefault(entry.get("name"), set()).add(
                                entry.get("state")
                            )
                        if all(states.get(m) == {"UNAVAILABLE"} for m in failing):
                            return
                except Exception:  # noqa: BLE001 - keep polling until the deadline
                    pass
                time.sleep(0.1)
        finally:
            client.close()
        # Do not raise: the individual tests report precisely what is missing.

    def stop(self, timeout: float = SHUTDOWN_TIMEOUT_S) -> int | None:
        """SIGTERM, then wait; returns the exit code, or None if it had to be killed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self._reader.join(timeout=2)
                self.exit_code = None
                return None
        self._reader.join(timeout=2)
        self.exit_code = self.proc.returncode
        return self.exit_code

    # -- talking to it -----------------------------------------------------------

    @property
    def http_port(self) -> int:
        return self.ports["HTTP"]

    @property
    def metrics_port(self) -> int:
        return self.ports["metrics"]

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_port(self) -> int:
        return self.ports["gRPC"]

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def grpc_client(self, **kwargs):
        import tritonclient.grpc as grpcclient

        return grpcclient.InferenceServerClient(url=self.grpc_url, **kwargs)

    def client(self, concurrency: int = 1) -> httpclient.InferenceServerClient:
        return httpclient.InferenceServerClient(
            url=self.url,
            concurrency=concurrency,
            connection_timeout=30.0,
            network_timeout=30.0,
        )

    def request(
        self,
        method: str,
        path: str,
        body: bytes | str | dict | list | None = None,
        headers: dict | None = None,
        port: int | None = None,
        timeout: float = 30,
    ) -> tuple[int, dict, bytes]:
        """A raw HTTP request; `path` is sent exactly as given (no normalisation)."""
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        if self.https and port in (None, self.http_port):
            import ssl

            context = ssl.create_default_context(cafile=str(self.ca) if self.ca else None)
            conn = http.client.HTTPSConnection("localhost", self.http_port, timeout=timeout, context=context)
        else:
            conn = http.client.HTTPConnection("127.0.0.1", port or self.http_port, timeout=timeout)
        try:
            hdrs = {"Content-Type": "application/json"} if body is not None else {}
            hdrs.update(headers or {})
            conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
        finally:
            conn.close()

    def metrics(self) -> str:
        status, _, body = self.request("GET", "/metrics", port=self.metrics_port)
        assert status == 200, f"GET /metrics: {status} {body[:500]!r}"
        return body.decode()


def copy_repository(dest_root: Path) -> Path:
    """Copies the fixture repository to dest_root/models and places a loadable model
    directory outside it (dest_root/outside_model) for the path-traversal tests."""
    repo = dest_root / "models"
    shutil.copytree(FIXTURE_MODELS, repo)
    outside = dest_root / OUTSIDE_MODEL
    shutil.copytree(FIXTURE_MODELS / "nobatch" / "1", outside / "1")
    config = (FIXTURE_MODELS / "nobatch" / "config.pbtxt").read_text()
    config = "\n".join(line for line in config.splitlines() if not line.startswith("name:"))
    config += (
        '\nparameters { key: "marker" value: { string_value: "%s" } }\n' % OUTSIDE_MARKER
    )
    (outside / "config.pbtxt").write_text(config)
    return repo


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> TridentServer:
    repo = copy_repository(tmp_path_factory.mktemp("trident"))
    srv = TridentServer(repo)
    try:
        srv.wait_started()
        srv.wait_models(READY_MODELS, FAILING_MODELS, timeout=STARTUP_TIMEOUT_S)
    except BaseException:
        srv.stop()
        raise
    yield srv
    code = srv.stop()
    assert code == 0, (
        f"trident did not shut down gracefully on SIGTERM within {SHUTDOWN_TIMEOUT_S}s "
        f"(exit code {code}; None = had to be killed):\n{srv.log(last=80)}"
    )


@pytest.fixture
def client(server):
    c = server.client()
    yield c
    c.close()


@pytest.fixture
def gclient(server):
    c = server.grpc_client()
    yield c
    c.close()


@pytest.fixture
def start_server(tmp_path_factory):
    """Factory for extra servers in a single test; each is stopped (and its graceful
    exit asserted) at the end of that test."""
    started: list[TridentServer] = []

    def start(extra_args: list[str], load: str | None = "*", models: list[str] | None = None, **kwargs):
        root = tmp_path_factory.mktemp("trident-extra")
        repo = root / "models"
        if models is None:
            shutil.copytree(FIXTURE_MODELS, repo)
        else:
            for m in models:
                shutil.copytree(FIXTURE_MODELS / m, repo / m)
        srv = TridentServer(repo, extra_args=extra_args, load=load, **kwargs)
        started.append(srv)
        srv.wait_started()
        return srv

    yield start
    for srv in started:
        code = srv.stop()
        assert code == 0, f"extra server exit code {code}:\n{srv.log(last=80)}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Attach the tail of every running server's log to a failing test's report."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for i, srv in enumerate(TridentServer._all):
            report.sections.append(
                (f"trident server {i} log (last 60 lines)", srv.log(last=60))
            )
