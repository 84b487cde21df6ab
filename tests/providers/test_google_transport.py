"""google-auth's token requests over ``runner/providers/google_transport.py`` (``TokenRequest``) against
google-auth's own ``requests`` transport, which it replaces for Vertex's credentials: a service account's JWT grant at
the simulated server's token endpoint and at a scripted one (the same request, the same token, the same refusal),
the transport's failures as google-auth's ``TransportError`` naming the host (refused, silent, too large an answer,
a certificate no bundle vouches for), the URLs left to ``requests`` (a proxy, a certificate variable), and a Vertex
probe and request that never import ``requests``. Nothing connects anywhere but 127.0.0.1 (``_local_only``)."""

from __future__ import annotations

import datetime
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
from google.auth import exceptions
from google.auth.transport.requests import Request as RequestsTransport

from runner.providers.google_transport import MAX_ANSWER_BYTES, TokenRequest, needs_requests
from simserver import start_server
from simserver.vertex import token_valid
from tests.helpers import free_port, headers_of, scripted_server
from tests.providers.test_vertex import _local_only, credentials_file, private_key  # noqa: F401  (fixtures)

SCOPE = "https://www.googleapis.com/auth/cloud-platform"
PROXY_VARIABLES = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY",
                   "no_proxy", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR")


@pytest.fixture(autouse=True)
def _no_proxy_or_certificates_of_the_user(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def service_account(tmp_path: Path, token_uri: str, key: str, email: str = "runner") -> Any:
    from google.oauth2 import service_account

    return service_account.Credentials.from_service_account_file(
        str(credentials_file(tmp_path, token_uri, key, email=email)), scopes=[SCOPE])


def refreshed(credentials: Any, transport: Any) -> Exception | None:
    """What a refresh over ``transport`` raised, or None."""
    try:
        credentials.refresh(transport)
    except exceptions.GoogleAuthError as exc:
        return exc
    return None


async def test_a_service_account_s_token_comes_from_the_simulated_servers_endpoint(tmp_path: Path,
                                                                                   private_key: str) -> None:  # noqa: F811
    async with await start_server() as srv:
        credentials = service_account(tmp_path, srv.root_url + "/token", private_key)
        assert await _in_thread(refreshed, credentials, TokenRequest()) is None
        assert token_valid(credentials.token) and not credentials.expired
        assert credentials.expiry > datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
        revoked = service_account(tmp_path, srv.root_url + "/token", private_key, email="revoked")
        got = await _in_thread(refreshed, revoked, TokenRequest())
        expected = await _in_thread(refreshed, revoked, RequestsTransport())
    assert isinstance(got, exceptions.RefreshError) and (type(got), str(got)) == (type(expected), str(expected))
    assert "invalid_grant" in str(got) and "PRIVATE KEY" not in str(got)


async def test_the_grant_is_the_one_requests_sends_and_its_answer_read_alike(tmp_path: Path,
                                                                             private_key: str) -> None:  # noqa: F811
    async with scripted_server() as (url, answer, seen):
        answer.update(status=200, body=json.dumps({"access_token": "ya29.scripted", "expires_in": 3600,
                                                   "token_type": "Bearer"}).encode())
        tokens = []
        for transport in (TokenRequest(), RequestsTransport()):
            credentials = service_account(tmp_path, url + "/token", private_key)
            assert await _in_thread(refreshed, credentials, transport) is None
            tokens.append(credentials.token)
        answer.update(status=400, body=b'{"error": "invalid_grant", "error_description": "Token has been revoked."}')
        refusals = [await _in_thread(refreshed, service_account(tmp_path, url + "/token", private_key), transport)
                    for transport in (TokenRequest(), RequestsTransport())]
    assert tokens == ["ya29.scripted"] * 2
    lean, sdk = seen[:2]
    assert (lean["method"], lean["path"]) == (sdk["method"], sdk["path"]) == ("POST", "/token")
    assert headers_of(lean)["content-type"] == headers_of(sdk)["content-type"] == "application/x-www-form-urlencoded"
    lean_form, sdk_form = (parse_qs(request["body"].decode()) for request in (lean, sdk))
    assert lean_form.keys() == sdk_form.keys() == {"grant_type", "assertion"}
    assert lean_form["grant_type"] == sdk_form["grant_type"] == ["urn:ietf:params:oauth:grant-type:jwt-bearer"]
    got, expected = refusals
    assert isinstance(got, exceptions.RefreshError) and (type(got), str(got)) == (type(expected), str(expected))


async def test_an_endpoint_that_refuses_or_never_answers_is_a_transport_error_naming_its_host() -> None:
    refused = await _in_thread(_ask, TokenRequest(), f"http://127.0.0.1:{free_port()}/token", None)
    assert isinstance(refused, exceptions.TransportError)
    assert str(refused) == "127.0.0.1 could not be reached (ConnectionRefusedError)"
    with socket.socket() as listener:  # accepts connections (the kernel's backlog) and never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        silent = await _in_thread(_ask, TokenRequest(), f"http://127.0.0.1:{listener.getsockname()[1]}/token", 0.3)
    assert isinstance(silent, exceptions.TransportError) and str(silent) == "127.0.0.1 could not be reached (timed out)"


async def test_an_answer_larger_than_a_token_s_is_refused() -> None:
    async with scripted_server() as (url, answer, _):
        answer.update(status=200, body=b"x" * (MAX_ANSWER_BYTES + 1))
        got = await _in_thread(_ask, TokenRequest(), url + "/token", None)
        answer.update(body=b"x" * MAX_ANSWER_BYTES)
        taken = await _in_thread(_ask, TokenRequest(), url + "/token", None)
    assert isinstance(got, exceptions.TransportError) and "answered more than" in str(got)
    assert not isinstance(taken, Exception) and taken.status == 200 and len(taken.data) == MAX_ANSWER_BYTES
    assert taken.headers["Content-Type"] == taken.headers["content-type"] == "application/json"


def test_a_certificate_no_bundle_vouches_for_is_refused_as_requests_refuses_it(tmp_path: Path) -> None:
    with _tls_server(tmp_path) as url:
        got, expected = _ask(TokenRequest(), url, 5), _ask(RequestsTransport(), url, 5)
    assert isinstance(got, exceptions.TransportError) and "SSLCertVerificationError" in str(got)
    assert isinstance(expected, exceptions.TransportError)


@pytest.mark.parametrize(("variables", "url", "reason"), [
    ({}, "https://oauth2.googleapis.com/token", None),
    ({}, "http://127.0.0.1:9/token", None),
    ({"HTTPS_PROXY": "http://127.0.0.1:9"}, "https://oauth2.googleapis.com/token", "a proxy applies to it"),
    ({"HTTPS_PROXY": "http://127.0.0.1:9", "NO_PROXY": "oauth2.googleapis.com"}, "https://oauth2.googleapis.com/token",
     None),
    ({"HTTP_PROXY": "http://127.0.0.1:9"}, "https://oauth2.googleapis.com/token", None),  # the other scheme's
    ({"ALL_PROXY": "http://127.0.0.1:9"}, "http://127.0.0.1:5/token", "a proxy applies to it"),
    ({"REQUESTS_CA_BUNDLE": "/etc/ca.pem"}, "https://oauth2.googleapis.com/token", "REQUESTS_CA_BUNDLE names its "
                                                                                  "certificates"),
    ({"CURL_CA_BUNDLE": "/etc/ca.pem"}, "https://oauth2.googleapis.com/token", "CURL_CA_BUNDLE names its certificates"),
    ({"SSL_CERT_FILE": "/etc/ca.pem"}, "https://oauth2.googleapis.com/token", "SSL_CERT_FILE names its certificates"),
    ({"SSL_CERT_DIR": "/etc/ssl"}, "https://oauth2.googleapis.com/token", "SSL_CERT_DIR names its certificates"),
    ({"REQUESTS_CA_BUNDLE": "/etc/ca.pem"}, "http://127.0.0.1:9/token", None),  # no certificate to check
])
def test_a_proxy_or_a_certificate_variable_leaves_the_request_to_requests(
        monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], url: str, reason: str | None) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert needs_requests(url) == reason


async def test_where_a_proxy_applies_the_token_request_goes_to_it_through_requests(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async with scripted_server() as (proxy, answer, seen):  # a proxy answering for the endpoint it is asked for
        answer.update(status=200, body=b'{"ok": true}')
        monkeypatch.setenv("HTTP_PROXY", proxy)
        got = await _in_thread(_ask, TokenRequest(), "http://token.example/token", 5)
    assert not isinstance(got, Exception) and got.status == 200 and json.loads(got.data) == {"ok": True}
    assert seen[0]["path"] == "http://token.example/token"  # the absolute form a proxy is asked in


def test_a_vertex_probe_and_request_never_import_requests(tmp_path: Path, private_key: str) -> None:  # noqa: F811
    """What ``runner submit`` runs before its first Gemini request on Vertex, in a new interpreter: the probe, then
    the run's start and one request, each of its own provider object."""
    script = (
        "import asyncio, os, sys\n"
        "from runner.providers.base import ProviderSettings\n"
        "from runner.providers.vertex import VertexProvider\n"
        "from simserver import start_server\n"
        "from tests.providers.test_vertex import credentials_file\n"
        "from pathlib import Path\n"
        "async def go():\n"
        "    async with await start_server() as srv:\n"
        "        path = credentials_file(Path('.'), srv.root_url + '/token', os.environ['KEY'])\n"
        "        os.environ['GOOGLE_APPLICATION_CREDENTIALS'] = str(path)\n"
        "        for _ in range(2):\n"
        "            provider = VertexProvider(ProviderSettings.model_validate({'base_url': srv.root_url,\n"
        "                'project': 'sim-project', 'location': 'us-east5'}))\n"
        "            await provider.start()\n"
        "            await provider.probe('gemini-2.0-flash')\n"
        "            await provider.execute('gemini-2.0-flash', [{'role': 'user', 'content': 'hi'}], {})\n"
        "            await provider.aclose()\n"
        "asyncio.run(go())\n"
        "print(sorted(name for name in ('requests', 'urllib3') if name in sys.modules))\n")
    env = {name: value for name, value in os.environ.items() if not name.startswith(("GOOGLE_", "CLOUDSDK_"))
           and name not in PROXY_VARIABLES}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[2]), KEY=private_key, NO_GCE_CHECK="true",
               CLOUDSDK_CONFIG=str(tmp_path / "gcloud"))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "[]", done.stdout


# -- helpers ---------------------------------------------------------------------------------------------------------

async def _in_thread(function: Any, *args: Any) -> Any:
    """``function(*args)`` in a worker thread (google-auth's requests block; the scripted servers run on this
    loop)."""
    import asyncio

    return await asyncio.to_thread(function, *args)


def _ask(transport: Any, url: str, timeout: float | None) -> Any:
    """A token endpoint's POST over ``transport``: its answer, or the ``TransportError`` it raised."""
    try:
        return transport(url, method="POST", body=b"grant_type=x",
                         headers={"Content-Type": "application/x-www-form-urlencoded"}, timeout=timeout)
    except exceptions.TransportError as exc:
        return exc


def _self_signed(folder: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
                   .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    cert, private = folder / "cert.pem", folder / "key.pem"
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return cert, private


class _tls_server:  # noqa: N801  (used as a context manager, like a function)
    """An https listener on 127.0.0.1 with a self-signed certificate, closing each connection after its handshake
    (no client that checks certificates gets that far)."""

    def __init__(self, folder: Path) -> None:
        cert, key = _self_signed(folder)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            try:
                with self.context.wrap_socket(connection, server_side=True):
                    pass
            except (OSError, ssl.SSLError):
                pass

    def __enter__(self) -> str:
        self.thread.start()
        return f"https://127.0.0.1:{self.listener.getsockname()[1]}/token"

    def __exit__(self, *exc: object) -> None:
        self.listener.close()
