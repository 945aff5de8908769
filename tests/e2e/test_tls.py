"""TLS with generated certificates: Triton's gRPC SSL flags with tritonclient.grpc
`ssl=True` (server-only and mutual), and HTTPS (Trident's addition) with
tritonclient.http `ssl=True`."""

from __future__ import annotations

import ssl
import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import trustme
from tritonclient.utils import InferenceServerException

from conftest import TridentServer, trident_bin


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    client = ca.issue_cert("trident-test-client")
    ca.cert_pem.write_to_path(d / "ca.crt")
    server.private_key_pem.write_to_path(d / "server.key")
    server.cert_chain_pems[0].write_to_path(d / "server.crt")
    client.private_key_pem.write_to_path(d / "client.key")
    client.cert_chain_pems[0].write_to_path(d / "client.crt")
    other = trustme.CA().issue_cert("intruder")
    other.private_key_pem.write_to_path(d / "intruder.key")
    other.cert_chain_pems[0].write_to_path(d / "intruder.crt")
    return d


def simple_request(mod):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [mod.InferInput("INPUT0", [1, 16], "INT32"), mod.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(np.ones_like(a))
    return a, inputs


def test_grpc_and_https(start_server, certs):
    srv = start_server(
        [
            "--grpc-use-ssl", "true",
            "--grpc-server-cert", str(certs / "server.crt"),
            "--grpc-server-key", str(certs / "server.key"),
            "--http-use-ssl", "true",
            "--http-server-cert", str(certs / "server.crt"),
            "--http-server-key", str(certs / "server.key"),
        ],
        models=["simple"],
        https=True,
        ca=certs / "ca.crt",
    )
    assert "gRPC service listening on" in srv.log() and "(TLS)" in srv.log()
    g = grpcclient.InferenceServerClient(
        url=f"localhost:{srv.grpc_port}", ssl=True, root_certificates=str(certs / "ca.crt")
    )
    a, inputs = simple_request(grpcclient)
    np.testing.assert_array_equal(g.infer("simple", inputs).as_numpy("OUTPUT0"), a + 1)
    g.close()
    plain = grpcclient.InferenceServerClient(url=f"localhost:{srv.grpc_port}")
    with pytest.raises(InferenceServerException):
        plain.is_server_live(client_timeout=5)
    plain.close()

    h = httpclient.InferenceServerClient(
        url=f"localhost:{srv.http_port}",
        ssl=True,
        ssl_context_factory=lambda: ssl.create_default_context(cafile=str(certs / "ca.crt")),
    )
    a, inputs = simple_request(httpclient)
    np.testing.assert_array_equal(h.infer("simple", inputs).as_numpy("OUTPUT1"), a - 1)
    h.close()


def test_grpc_mutual_tls_refuses_clients_without_a_trusted_certificate(start_server, certs):
    srv = start_server(
        [
            "--grpc-use-ssl", "true",
            "--grpc-use-ssl-mutual", "true",
            "--grpc-server-cert", str(certs / "server.crt"),
            "--grpc-server-key", str(certs / "server.key"),
            "--grpc-root-cert", str(certs / "ca.crt"),
        ],
        models=["simple"],
    )
    url = f"localhost:{srv.grpc_port}"
    ok = grpcclient.InferenceServerClient(
        url=url,
        ssl=True,
        root_certificates=str(certs / "ca.crt"),
        private_key=str(certs / "client.key"),
        certificate_chain=str(certs / "client.crt"),
    )
    assert ok.is_server_live()
    ok.close()
    for key, chain in [(None, None), ("intruder.key", "intruder.crt")]:
        c = grpcclient.InferenceServerClient(
            url=url,
            ssl=True,
            root_certificates=str(certs / "ca.crt"),
            private_key=str(certs / key) if key else None,
            certificate_chain=str(certs / chain) if chain else None,
        )
        with pytest.raises(InferenceServerException):
            c.is_server_live(client_timeout=5)
        c.close()


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--grpc-use-ssl", "true"], "--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key"),
        (["--grpc-server-cert", "x.pem"], "need --grpc-use-ssl true"),
        (
            ["--http-use-ssl", "true", "--http-server-cert", "/nonexistent.pem", "--http-server-key", "/nonexistent.key"],
            "/nonexistent.pem",
        ),
        # Checked before any service starts: the server stops at once, naming the file.
        (
            ["--grpc-use-ssl", "true", "--grpc-server-cert", "/nonexistent.pem", "--grpc-server-key", "/nonexistent.key"],
            "/nonexistent.pem",
        ),
    ],
)
def test_tls_flag_mistakes_stop_the_server_with_a_reason(tmp_path, flags, message):
    (tmp_path / "models").mkdir()
    proc = subprocess.run(
        [str(trident_bin()), "serve", "--model-repository", str(tmp_path / "models"), "--http-port", "0",
         "--grpc-port", "0", "--metrics-port", "0", *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr, proc.stdout + proc.stderr
