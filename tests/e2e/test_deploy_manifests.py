"""deploy/: the Kubernetes, KServe and container manifests, checked offline.

(a) Every YAML object under deploy/ validates against the official Kubernetes JSON
    schemas (bundled by the kubernetes-validate package, strict: unknown fields fail) or,
    for KServe's ClusterServingRuntime and InferenceService, against the openAPIV3Schema
    of KServe's CRDs vendored in deploy/schemas/ (made strict the same way).
(b) Every `trident serve` argument in the manifests and the Dockerfile is a flag (and a
    value) that `trident serve --help` of $TRIDENT_BIN accepts; ports, probes, Services
    and annotations agree with each other.
(c) deploy/check_image_layout.sh assembles the image's files and runs them; each
    manifest's container arguments are run against the real binary and every probe they
    declare (httpGet, grpc) must answer as the kubelet expects.

No network: the schemas are files, the servers listen on 127.0.0.1.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import tomllib
from functools import lru_cache
from pathlib import Path

import jsonschema
import pytest
import yaml

from conftest import ANSI, LISTENING, REPO_ROOT, trident_bin

DEPLOY = REPO_ROOT / "deploy"
SCHEMAS = DEPLOY / "schemas"
SIMPLE_MODEL = REPO_ROOT / "tests" / "e2e" / "official" / "models" / "simple"
MANIFESTS = sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))

# Kubernetes versions the plain manifests must be valid for: the oldest they claim
# (deployment.yaml: gRPC probes need 1.27, `preStop.sleep` 1.30) and the newest bundled.
OLDEST_KUBERNETES = "1.30"

KSERVE_SCHEMAS = {
    ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"): "kserve-clusterservingruntime-v1alpha1.json",
    ("serving.kserve.io/v1beta1", "InferenceService"): "kserve-inferenceservice-v1beta1.json",
}
# kserve pkg/constants: InferenceServiceProtocol.
KSERVE_PROTOCOLS = {"v1", "v2", "grpc-v1", "grpc-v2"}
# trident serve's port flags and their defaults (Triton's).
PORT_FLAGS = {"--http-port": 8000, "--grpc-port": 8001, "--metrics-port": 8002}
ORT_SO = "libonnxruntime.so.1.32.0"


# -- loading ----------------------------------------------------------------------------


def objects() -> list[tuple[str, dict]]:
    """(file relative to deploy/, object) for every YAML document under deploy/."""
    out = []
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((str(path.relative_to(DEPLOY)), doc))
    return out


def object_id(item: tuple[str, dict]) -> str:
    file, obj = item
    return f"{file}:{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


OBJECTS = objects()


def containers(obj: dict) -> list[dict]:
    """The containers of a Deployment's pod template or of a ServingRuntime."""
    spec = obj.get("spec", {})
    if obj["kind"] in ("ClusterServingRuntime", "ServingRuntime"):
        return spec.get("containers", [])
    if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return spec.get("template", {}).get("spec", {}).get("containers", [])
    if obj["kind"] == "Pod":
        return spec.get("containers", [])
    return []


def trident_containers() -> list[tuple[str, dict, dict]]:
    """(id, object, container) for every container whose arguments start with `serve`."""
    out = []
    for file, obj in OBJECTS:
        for c in containers(obj):
            if c.get("args", [])[:1] == ["serve"] and not c.get("command"):
                out.append((f"{object_id((file, obj))}:{c['name']}", obj, c))
    return out


TRIDENT_CONTAINERS = trident_containers()


def dockerfile_instruction(name: str) -> list[str]:
    """The values of one Dockerfile instruction (continuation lines joined)."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    return [m.group(1).strip() for m in re.finditer(rf"^{name}\s+(.*)$", text, re.M)]


# -- (a) schemas ------------------------------------------------------------------------


def test_manifests_exist():
    names = {str(p.relative_to(DEPLOY)) for p in MANIFESTS}
    assert {
        "kserve/cluster-serving-runtime.yaml",
        "kserve/inference-service.yaml",
        "kubernetes/deployment.yaml",
    } <= names, names
    kinds = {o["kind"] for _, o in OBJECTS}
    assert {"ClusterServingRuntime", "InferenceService", "Deployment", "Service"} <= kinds


@lru_cache
def kubernetes_versions() -> list[str]:
    kv = pytest.importorskip("kubernetes_validate.utils", reason="pip install kubernetes-validate")
    available = sorted({v.rsplit(".", 1)[0] for v in kv.all_versions()}, key=lambda v: tuple(map(int, v.split("."))))
    oldest = next((v for v in available if tuple(map(int, v.split("."))) >= tuple(map(int, OLDEST_KUBERNETES.split(".")))), available[0])
    return sorted({oldest, available[-1]})


def strict(schema):
    """A CRD schema where objects with listed properties reject unknown ones, as the API
    server's strict field validation does (x-kubernetes-preserve-unknown-fields stays open)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: strict(v) for k, v in out["properties"].items()}
        if "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    for key in ("items", "additionalProperties", "not"):
        if isinstance(out.get(key), dict):
            out[key] = strict(out[key])
    for key in ("allOf", "anyOf", "oneOf"):
        if isinstance(out.get(key), list):
            out[key] = strict(out[key])
    return out


@lru_cache
def kserve_validator(file: str) -> jsonschema.Draft7Validator:
    schema = strict(json.loads((SCHEMAS / file).read_text()))
    return jsonschema.Draft7Validator(schema)


def errors_of(validator, obj) -> list[str]:
    return [
        f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    ]


@pytest.mark.parametrize("item", OBJECTS, ids=object_id)
def test_object_validates_against_its_schema(item):
    file, obj = item
    assert isinstance(obj.get("apiVersion"), str) and isinstance(obj.get("kind"), str), f"{file}: {obj}"
    kv = pytest.importorskip("kubernetes_validate.utils", reason="pip install kubernetes-validate")
    key = (obj["apiVersion"], obj["kind"])
    if key in KSERVE_SCHEMAS:
        errors = errors_of(kserve_validator(KSERVE_SCHEMAS[key]), obj)
        assert not errors, f"{object_id(item)} does not match KServe's CRD schema:\n" + "\n".join(errors)
        # The CRD leaves metadata open; check it as Kubernetes' ObjectMeta.
        for version in kubernetes_versions():
            kv.validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]}, version, strict=True)
        return
    for version in kubernetes_versions():
        try:
            kv.validate(obj, version, strict=True)
        except kv.SchemaNotFoundError as e:
            pytest.fail(f"{object_id(item)}: {e.message}; add its schema under deploy/schemas/")
        except kv.ValidationError as e:
            path = ".".join(map(str, e.path))
            pytest.fail(f"{object_id(item)} is not a valid Kubernetes {version} object: {path}: {e.message}")


def test_strict_validation_catches_typos():
    """The checks above would notice a misspelt field, in Kubernetes and KServe objects."""
    kv = pytest.importorskip("kubernetes_validate.utils", reason="pip install kubernetes-validate")
    deployment = next(o for _, o in OBJECTS if o["kind"] == "Deployment")
    bad = json.loads(json.dumps(deployment))
    c = bad["spec"]["template"]["spec"]["containers"][0]
    c["readinesProbe"] = c.pop("readinessProbe")
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, kubernetes_versions()[-1], strict=True)
    runtime = next(o for _, o in OBJECTS if o["kind"] == "ClusterServingRuntime")
    bad = json.loads(json.dumps(runtime))
    bad["spec"]["containers"][0]["readinesProbe"] = bad["spec"]["containers"][0].pop("readinessProbe")
    bad["spec"]["supportedModelFormats"][0]["autoselect"] = True
    errors = errors_of(kserve_validator(KSERVE_SCHEMAS[(runtime["apiVersion"], runtime["kind"])]), bad)
    assert any("readinesProbe" in e for e in errors) and any("autoselect" in e for e in errors), errors


def test_vendored_kserve_schemas_say_where_they_come_from():
    for file in KSERVE_SCHEMAS.values():
        schema = json.loads((SCHEMAS / file).read_text())
        assert schema.get("x-vendored-from", "").startswith("kserve/kserve@"), file
        assert schema["properties"]["kind"]["type"] == "string"


# -- (b) flags --------------------------------------------------------------------------


@lru_cache
def serve_flags() -> dict[str, dict]:
    """`trident serve --help`: flag -> {"value": takes a value, "choices": [...] or None}."""
    binary = trident_bin()
    if not binary.exists():
        pytest.skip(f"trident binary not found at {binary}; build it with `cargo build -p trident-cli` or set TRIDENT_BIN")
    out = subprocess.run([str(binary), "serve", "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    flags: dict[str, dict] = {}
    current = None
    for line in out.stdout.splitlines():
        m = re.match(r"^\s{2,}(?:-\w, )?(--[a-z0-9][a-z0-9-]*)(?:[ =]<([^>]+)>)?", line)
        if m:
            current = m.group(1)
            flags[current] = {"value": m.group(2) is not None, "choices": None}
        if current:
            c = re.search(r"\[possible values: ([^\]]+)\]", line)
            if c:
                flags[current]["choices"] = [v.strip() for v in c.group(1).split(",")]
    assert "--model-repository" in flags and "--http-port" in flags, out.stdout
    return flags


def serve_pairs(args: list[str]) -> list[tuple[str, str | None]]:
    """`serve --a=1 --b 2 --c` -> [("--a", "1"), ("--b", "2"), ("--c", None)], checked
    against `trident serve --help` (an unknown flag, a missing value or a bad choice fail)."""
    assert args[:1] == ["serve"], f"the image's ENTRYPOINT is trident; arguments must start with `serve`: {args}"
    flags = serve_flags()
    pairs: list[tuple[str, str | None]] = []
    rest = list(args[1:])
    while rest:
        arg = rest.pop(0)
        assert arg.startswith("--"), f"`{arg}`: trident serve takes no positional arguments ({args})"
        name, eq, value = arg.partition("=")
        assert name in flags, f"`trident serve --help` has no {name} (from {args})"
        if flags[name]["value"]:
            if not eq:
                assert rest and not rest[0].startswith("--"), f"{name} needs a value ({args})"
                value = rest.pop(0)
            choices = flags[name]["choices"]
            assert choices is None or value in choices, f"{name}={value}: not one of {choices}"
            pairs.append((name, value))
        else:
            assert not eq, f"{name} takes no value ({args})"
            pairs.append((name, None))
    return pairs


def parse_serve_args(args: list[str]) -> dict[str, list[str]]:
    """flag -> its values, in order (empty for a switch)."""
    parsed: dict[str, list[str]] = {}
    for name, value in serve_pairs(args):
        parsed.setdefault(name, [])
        if value is not None:
            parsed[name].append(value)
    return parsed


def listen_ports(parsed: dict[str, list[str]]) -> dict[str, int]:
    """The ports a `trident serve` with these flags listens on: http / grpc / metrics."""
    ports = {}
    for flag, default in PORT_FLAGS.items():
        ports[flag[2:-5]] = int(parsed.get(flag, [default])[-1])
    if parsed.get("--allow-grpc", ["true"])[-1] == "false":
        ports.pop("grpc")
    if parsed.get("--allow-metrics", ["true"])[-1] == "false":
        ports.pop("metrics")
    return ports


def test_manifests_run_trident_serve():
    assert TRIDENT_CONTAINERS, "no container runs `trident serve`"
    ids = [i for i, _, _ in TRIDENT_CONTAINERS]
    assert any("trident-single-port" in i for i in ids), ids


@pytest.mark.parametrize("entry", TRIDENT_CONTAINERS, ids=lambda e: e[0])
def test_container_args_are_trident_serve_flags(entry):
    _, _, container = entry
    parsed = parse_serve_args(container["args"])
    assert "--model-repository" in parsed, container["args"]


def test_dockerfile_cmd_and_entrypoint():
    (entrypoint,) = dockerfile_instruction("ENTRYPOINT")
    assert json.loads(entrypoint) == ["/usr/local/bin/trident"], "exec form: trident is PID 1 and gets SIGTERM"
    cmd = json.loads(dockerfile_instruction("CMD")[-1])
    assert parse_serve_args(cmd)["--model-repository"] == ["/models"]
    # SageMaker's `docker run IMAGE serve` replaces CMD with ["serve"] alone: trident serve
    # then finds /opt/ml/model and $SAGEMAKER_BIND_TO_PORT itself (not checked here).
    labels = " ".join(dockerfile_instruction("LABEL"))
    assert "com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true" in labels
    exposed = {int(p) for e in dockerfile_instruction("EXPOSE") for p in e.split()}
    assert {8000, 8001, 8002, 8080} <= exposed
    froms = dockerfile_instruction("FROM")
    assert froms[-1].split()[0].startswith("gcr.io/distroless/cc-debian12"), froms
    env = " ".join(dockerfile_instruction("ENV"))
    assert "ORT_DYLIB_PATH=/opt/trident/lib/libonnxruntime.so.${ORT_VERSION}" in env
    (ort_version,) = {a.split("=", 1)[1] for a in dockerfile_instruction("ARG") if a.startswith("ORT_VERSION=")}
    assert ORT_SO == f"libonnxruntime.so.{ort_version}"
    assert f"ORT_VERSION={ort_version}" in (DEPLOY / "check_image_layout.sh").read_text()
    assert "--features ort" in " ".join(dockerfile_instruction("RUN"))


def version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def test_dockerfile_rust_is_new_enough_for_the_locked_crates():
    """The builder's Rust is at least every locked crate's `rust-version` (read from the
    crates' sources in Cargo's registry; crates not unpacked there are not checked)."""
    (rust,) = {a.split("=", 1)[1] for a in dockerfile_instruction("ARG") if a.startswith("RUST_VERSION=")}
    home = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo"))
    sources = list((home / "registry" / "src").glob("*"))
    lock = tomllib.loads((REPO_ROOT / "Cargo.lock").read_text())
    needs = []
    for package in lock["package"]:
        if not package.get("source", "").startswith("registry+"):
            continue
        for src in sources:
            manifest = src / f"{package['name']}-{package['version']}" / "Cargo.toml"
            if manifest.exists():
                declared = tomllib.loads(manifest.read_text()).get("package", {}).get("rust-version")
                if isinstance(declared, str):
                    needs.append((version_tuple(declared), f"{package['name']} {package['version']}"))
                break
    if not needs:
        pytest.skip(f"no crate sources under {home / 'registry' / 'src'} (run cargo fetch)")
    highest = max(needs)
    assert version_tuple(rust) >= highest[0], (
        f"deploy/Dockerfile builds with Rust {rust}; {highest[1]} needs {'.'.join(map(str, highest[0]))}"
    )


def port_number(container: dict, port) -> int:
    if isinstance(port, int):
        return port
    named = {p["name"]: p["containerPort"] for p in container.get("ports", []) if "name" in p}
    assert port in named, f"probe port {port!r} is not a named port of {container['name']}"
    return named[port]


def probes(container: dict) -> list[tuple[str, dict]]:
    return [(k, container[k]) for k in ("startupProbe", "readinessProbe", "livenessProbe") if k in container]


@pytest.mark.parametrize("entry", TRIDENT_CONTAINERS, ids=lambda e: e[0])
def test_ports_and_probes_match_the_arguments(entry):
    name, obj, container = entry
    ports = listen_ports(parse_serve_args(container["args"]))
    for p in container.get("ports", []):
        assert p["containerPort"] in ports.values(), f"{name}: port {p} is not one trident listens on ({ports})"
    assert probes(container), f"{name} declares no probe"
    for kind, probe in probes(container):
        if "httpGet" in probe:
            assert probe["httpGet"]["path"] in ("/v2/health/ready", "/v2/health/live"), probe
            port = port_number(container, probe["httpGet"]["port"])
            assert port == ports["http"], f"{name} {kind} on {port}; HTTP is on {ports['http']}"
        elif "grpc" in probe:
            port = port_number(container, probe["grpc"]["port"])
            assert port == ports.get("grpc"), f"{name} {kind} on {port}; gRPC is on {ports.get('grpc')}"
        else:
            pytest.fail(f"{name} {kind}: use httpGet or grpc ({probe})")
    annotations = obj["spec"].get("annotations", {}) if obj["kind"] == "ClusterServingRuntime" else (
        obj["spec"]["template"]["metadata"].get("annotations", {})
    )
    for key in ("prometheus.kserve.io/port", "prometheus.io/port"):
        if key in annotations:
            assert int(annotations[key]) == ports["metrics"], f"{name}: {key}={annotations[key]}, metrics on {ports['metrics']}"
    for key in ("prometheus.kserve.io/path", "prometheus.io/path"):
        if key in annotations:
            assert annotations[key] == "/metrics"


def test_kserve_runtimes():
    runtimes = {o["metadata"]["name"]: o for _, o in OBJECTS if o["kind"] == "ClusterServingRuntime"}
    assert {"trident", "trident-single-port"} <= runtimes.keys()
    for name, rt in runtimes.items():
        spec = rt["spec"]
        assert set(spec["protocolVersions"]) <= KSERVE_PROTOCOLS, spec["protocolVersions"]
        formats = {(f["name"], f.get("version")) for f in spec["supportedModelFormats"]}
        assert {("onnx", "1"), ("triton", "2")} <= formats, formats
        (c,) = spec["containers"]
        assert c["name"] == "kserve-container", "KServe finds the model server by this name"
        parsed = parse_serve_args(c["args"])
        assert parsed["--model-repository"] == ["/mnt/models"], "the storage initializer fills /mnt/models"
        ports = listen_ports(parsed)
        # Knative (Serverless mode, KServe's default): at most one port, http1 or h2c.
        assert len(c.get("ports", [])) <= 1, f"{name}: Knative allows one container port"
        for p in c.get("ports", []):
            assert p.get("name") in ("http1", "h2c"), p
            assert p["containerPort"] == ports["http"]
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0 and sc["allowPrivilegeEscalation"] is False
        assert "resources" in c
    auto = runtimes["trident"]["spec"]
    assert all(f.get("autoSelect") for f in auto["supportedModelFormats"])
    assert auto["protocolVersions"] == ["v2", "grpc-v2"]
    single = runtimes["trident-single-port"]["spec"]["containers"][0]
    ports = listen_ports(parse_serve_args(single["args"]))
    assert ports["http"] == ports["grpc"] == 8080, f"single-port: --grpc-port equal to --http-port ({ports})"
    assert [p["name"] for p in single["ports"]] == ["h2c"], "gRPC through Knative needs the port named h2c"


def test_inference_services_name_a_runtime_that_serves_them():
    runtimes = {o["metadata"]["name"]: o["spec"] for _, o in OBJECTS if o["kind"] == "ClusterServingRuntime"}
    services = [o for _, o in OBJECTS if o["kind"] == "InferenceService"]
    assert any(s["metadata"]["name"] == "sentiment" for s in services)
    for isvc in services:
        model = isvc["spec"]["predictor"]["model"]
        runtime = runtimes.get(model["runtime"])
        assert runtime is not None, f"{isvc['metadata']['name']}: no runtime {model['runtime']} in deploy/kserve"
        assert model["protocolVersion"] in runtime["protocolVersions"]
        assert model["modelFormat"]["name"] in {f["name"] for f in runtime["supportedModelFormats"]}
        assert re.match(r"^(s3|gs|https?|pvc|oci|hf)://", model["storageUri"]), model["storageUri"]


def test_kubernetes_deployment_and_service_agree():
    deployment = next(o for _, o in OBJECTS if o["kind"] == "Deployment")
    service = next(o for _, o in OBJECTS if o["kind"] == "Service")
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    (c,) = pod["spec"]["containers"]
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert named == {"http": 8000, "grpc": 8001, "metrics": 8002}, named
    for p in service["spec"]["ports"]:
        assert p["targetPort"] in named or p["targetPort"] in named.values(), p
    assert {p["port"] for p in service["spec"]["ports"]} == {8000, 8001, 8002}
    assert any("grpc" in p for _, p in probes(c)), "a gRPC probe example (grpc.health.v1)"
    parsed = parse_serve_args(c["args"])
    exit_timeout = int(parsed.get("--exit-timeout-secs", ["30"])[-1])
    pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert grace > exit_timeout + pre_stop, f"SIGKILL at {grace}s would cut the {exit_timeout}s drain"
    security = {**pod["spec"].get("securityContext", {}), **c.get("securityContext", {})}
    assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
    assert security["allowPrivilegeEscalation"] is False
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == parsed["--model-repository"][-1])
    assert any(v["name"] == mount["name"] for v in pod["spec"]["volumes"])


# -- (c) running it ---------------------------------------------------------------------


def test_image_layout():
    """deploy/check_image_layout.sh with the debug binary, bundling the libraries
    distroless lacks exactly as deploy/Dockerfile does."""
    out = run_layout_check("--bundle-extra-libs")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "PASS: image layout" in out.stdout


def test_binary_needs_only_distroless_libraries():
    """The image would need no bundled libraries at all."""
    out = run_layout_check()
    if out.returncode == 1 and "would be missing from the image" in out.stderr:
        extra = re.findall(r"^  trident: (\S+)", out.stdout, re.M)
        pytest.xfail(
            f"trident links {', '.join(extra)} (plotters' `ttf` feature -> font-kit -> fontconfig, "
            "for training plots); deploy/Dockerfile bundles them into /opt/trident/lib meanwhile"
        )
    assert out.returncode == 0, out.stdout + out.stderr


def run_layout_check(*flags: str) -> subprocess.CompletedProcess:
    binary = trident_bin()
    if not binary.exists():
        pytest.skip(f"trident binary not found at {binary}")
    if not shutil.which("ldd") or not shutil.which("curl"):
        pytest.skip("check_image_layout.sh needs ldd and curl")
    out = subprocess.run(
        ["bash", str(DEPLOY / "check_image_layout.sh"), *flags, str(binary)],
        capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL,
    )
    if out.returncode == 77:
        pytest.skip(f"no ONNX Runtime library for the layout check: {out.stdout.strip()}")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ManifestServer:
    """`trident serve` with a manifest container's own arguments: the repository is a
    copy of the `simple` model and each port is swapped for a free one (equal ports stay
    equal, so single-port mode stays single-port)."""

    def __init__(self, container: dict, tmp: Path):
        parsed = parse_serve_args(container["args"])
        ports = {flag: int(parsed.get(flag, [d])[-1]) for flag, d in PORT_FLAGS.items()}
        self.mapping = {p: free_port() for p in set(ports.values())}
        repo = tmp / "models"
        shutil.copytree(SIMPLE_MODEL, repo / "simple")
        replaced = {*PORT_FLAGS, "--model-repository", "--http-address", "--grpc-address"}
        args = [
            name if value is None else f"{name}={value}"
            for name, value in serve_pairs(container["args"])
            if name not in replaced
        ]
        args += [f"{flag}={self.mapping[port]}" for flag, port in ports.items()]
        args += [f"--model-repository={repo}", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1"]
        self.args = [str(trident_bin()), "serve", *args]
        self.log_path = tmp / "server.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp)

    def log(self) -> str:
        return ANSI.sub("", self.log_path.read_text(errors="replace"))

    def port(self, manifest_port: int) -> int:
        return self.mapping[manifest_port]

    def wait_listening(self, timeout: float = 60) -> bool:
        """True once the HTTP listener is up; False if the process exited first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(m.group(1) == "HTTP" for m in LISTENING.finditer(self.log())):
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.1)
        raise AssertionError(f"no HTTP listener within {timeout}s:\n{self.log()}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def http_get(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


def grpc_health(port: int, service: str = "") -> int:
    """grpc.health.v1.Health/Check as the kubelet's gRPC probe sends it; the status enum
    (1 = SERVING). Hand-encoded protobuf: HealthCheckRequest{service}, -> {status}."""
    grpc = pytest.importorskip("grpc")
    request = b"" if not service else b"\x0a" + bytes([len(service)]) + service.encode()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        reply = check(request, timeout=5)
    # field 1, varint: b"\x08" + status; an empty message means status 0 (UNKNOWN).
    return reply[1] if reply[:1] == b"\x08" else 0


def probe_until_ok(server: ManifestServer, container: dict, kind: str, probe: dict, timeout: float = 30):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            if "httpGet" in probe:
                port = server.port(port_number(container, probe["httpGet"]["port"]))
                last = http_get(port, probe["httpGet"]["path"])
                if 200 <= last < 400:
                    return
            else:
                port = server.port(port_number(container, probe["grpc"]["port"]))
                last = grpc_health(port, probe["grpc"].get("service", ""))
                if last == 1:
                    return
        except Exception as e:  # noqa: BLE001 - keep probing until the deadline, like the kubelet
            last = repr(e)
        time.sleep(0.2)
    raise AssertionError(f"{kind} {probe} never succeeded (last: {last}):\n{server.log()}")


@pytest.mark.parametrize("entry", TRIDENT_CONTAINERS, ids=lambda e: e[0])
def test_probes_answer_on_the_real_server(entry, tmp_path):
    name, _, container = entry
    parsed = parse_serve_args(container["args"])
    ports = listen_ports(parsed)
    server = ManifestServer(container, tmp_path)
    try:
        assert server.wait_listening(), f"{name}: trident exited at start-up:\n{server.log()}"
        for kind, probe in probes(container):
            probe_until_ok(server, container, kind, probe)
        # Whatever the probes, HTTP and (when on) gRPC health both answer on their ports.
        assert http_get(server.port(ports["http"]), "/v2/health/ready") == 200
        if "grpc" in ports:
            assert grpc_health(server.port(ports["grpc"])) == 1, server.log()
        h2c = [p for p in container.get("ports", []) if p.get("name") == "h2c"]
        if h2c:
            # Knative speaks HTTP/2 without TLS ("prior knowledge") to an h2c port, for REST
            # and its probes too, not only for gRPC.
            if shutil.which("curl") is None:
                pytest.skip("curl is needed for the HTTP/2 prior-knowledge request")
            url = f"http://127.0.0.1:{server.port(h2c[0]['containerPort'])}/v2/health/ready"
            out = subprocess.run(
                ["curl", "-sS", "--http2-prior-knowledge", "-o", "/dev/null", "-w", "%{http_version} %{http_code}", url],
                capture_output=True, text=True, timeout=15,
            )
            assert out.stdout == "2 200", f"REST over h2c: {out.stdout} {out.stderr}\n{server.log()}"
    finally:
        rc = server.stop()
    assert rc == 0, f"exit status {rc} after SIGTERM:\n{server.log()}"


# -- SageMaker: `docker run IMAGE serve` ------------------------------------------------


def sagemaker_env(port: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "TRIDENT_MODEL_REPOSITORY"))}
    env.update(SAGEMAKER_BIND_TO_PORT=str(port), SAGEMAKER_TRITON_DEFAULT_MODEL_NAME="simple", NO_COLOR="1")
    return env


def test_sagemaker_serve_alone_looks_in_opt_ml_model():
    """`serve` with no flags (the image's CMD replaced by SageMaker) and
    SAGEMAKER_BIND_TO_PORT set takes /opt/ml/model as the repository."""
    if "--allow-sagemaker" not in serve_flags():
        pytest.skip("this trident has no SageMaker mode (--allow-sagemaker)")
    if Path("/opt/ml/model").exists():
        pytest.skip("/opt/ml/model exists on this machine; not touching it")
    out = subprocess.run(
        [str(trident_bin()), "serve"], env=sagemaker_env(free_port()),
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )
    assert out.returncode != 0 and "/opt/ml/model" in out.stderr, out.stdout + out.stderr


def test_sagemaker_ping_and_invocations(tmp_path):
    """SageMaker mode on a repository holding `simple` (what /opt/ml/model holds after
    SageMaker extracts model.tar.gz): GET /ping, POST /invocations, SIGTERM -> 0."""
    if "--allow-sagemaker" not in serve_flags():
        pytest.skip("this trident has no SageMaker mode (--allow-sagemaker)")
    repo = tmp_path / "model"
    shutil.copytree(SIMPLE_MODEL, repo / "simple")
    port = free_port()
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(trident_bin()), "serve", "--allow-sagemaker=true", f"--model-repository={repo}",
             "--http-address=127.0.0.1"],
            env=sagemaker_env(port), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp_path,
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if http_get(port, "/ping") == 200:
                        break
                except OSError:
                    pass
                assert proc.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, "GET /ping never answered 200:\n" + log_path.read_text()
                time.sleep(0.1)
            body = {
                "inputs": [
                    {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
                    {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
                ]
            }
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("POST", "/invocations", json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            conn.close()
            assert resp.status == 200, data
            outputs = {o["name"]: o["data"] for o in json.loads(data)["outputs"]}
            assert outputs["OUTPUT0"] == [i + 1 for i in range(16)]
            assert outputs["OUTPUT1"] == [i - 1 for i in range(16)]
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
    assert rc == 0, f"exit status {rc} after SIGTERM:\n{log_path.read_text()}"
