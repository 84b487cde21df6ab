"""The lean service-account grant (``runner/providers/google_service_account.py``) against google-auth itself: for the
same key file and scopes, at a frozen time, the token request (URL, body with the signed assertion, headers) equals
byte for byte the one ``google.auth.default``'s credentials send, both captured through one fake transport (RS256 is
RSASSA PKCS#1 v1.5, deterministic); the answer is read alike (token, expiry, ``expired`` around google-auth's refresh
threshold); each error answer and each transport error is the same exception, with the same message, after the same
retries; the quota project and the headers applied are google-auth's. Every case the grant does not replicate goes
through ``google.auth.default`` (its credentials, or its error). The memo of checked keys (``key_memo.py``): a key
is checked whole once, its digest remembered, and only those bytes skip the check later. And a refresh in a new
interpreter never imports google-auth's service-account, crypt or JWT modules, nor cryptography's x509.

Key files are made by ``bench/made_up_credentials.py`` (a fresh RSA key each); nothing connects anywhere."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import google.auth
import pytest
from google.auth import _exponential_backoff, _helpers, exceptions
from google.auth import transport as auth_transport

from bench.made_up_credentials import service_account
from runner.providers import google_tokens, key_memo
from runner.providers.google_service_account import ServiceAccountGrant, service_account_grant
from tests.providers.test_vertex import _local_only  # noqa: F401  (fixture)

SCOPE = "https://www.googleapis.com/auth/cloud-platform"
TOKEN_URI = "https://oauth2.googleapis.com/token"
FROZEN = datetime.datetime(2026, 3, 1, 12, 0, 0)
TOKEN = {"access_token": "ya29.frozen", "expires_in": 3600, "token_type": "Bearer"}


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One made-up service-account key file's contents (one RSA key for the module: made once)."""
    path = service_account(tmp_path_factory.mktemp("key"), TOKEN_URI)
    return json.loads(path.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


@pytest.fixture(autouse=True)
def _nothing_loaded_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """No credentials kept from another test (``google_tokens``' memo of the last loaded), none of the user's
    settings that change what google-auth loads."""
    google_tokens._LOADED.forget()
    for name in ("GOOGLE_CLOUD_QUOTA_PROJECT", "GCLOUD_PROJECT", "GOOGLE_API_USE_CLIENT_CERTIFICATE",
                 "GOOGLE_API_CERTIFICATE_CONFIG", "CLOUDSDK_CONTEXT_AWARE_USE_CLIENT_CERTIFICATE",
                 "CLOUDSDK_CONTEXT_AWARE_CERTIFICATE_CONFIG_FILE_PATH",
                 "GOOGLE_SDK_EXPERIMENTAL_PYTHON_REGIONAL_ACCESS_BOUNDARY_LOOKUP_ENABLED"):
        monkeypatch.delenv(name, raising=False)


class Answer(auth_transport.Response):  # type: ignore[misc]
    def __init__(self, status: int, data: bytes) -> None:
        self._status, self._data = status, data

    @property
    def status(self) -> int:
        return self._status

    @property
    def headers(self) -> dict[str, str]:
        return {"content-type": "application/json"}

    @property
    def data(self) -> bytes:
        return self._data


class FakeTransport(auth_transport.Request):  # type: ignore[misc]
    """A google-auth transport that notes each request whole and answers from a script (the last answer again
    once the script is spent); an exception in the script is raised instead."""

    def __init__(self, *script: tuple[int, bytes] | Exception) -> None:
        self.script = list(script)
        self.calls: list[dict[str, Any]] = []

    def __call__(self, url: str, method: str = "GET", body: bytes | None = None, headers: Any = None,
                 timeout: float | None = None, **kwargs: Any) -> Answer:
        self.calls.append({"url": url, "method": method, "body": body, "headers": dict(headers or {}),
                           "timeout": timeout, "kwargs": kwargs})
        step = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(step, Exception):
            raise step
        return Answer(*step)


def answered(body: dict[str, Any], status: int = 200) -> tuple[int, bytes]:
    return status, json.dumps(body).encode()


def use_key(folder: Path, monkeypatch: pytest.MonkeyPatch, info: dict[str, Any], name: str = "key.json") -> Path:
    path = folder / name
    path.write_text(json.dumps(info), encoding="utf-8")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    return path


def both(scopes: list[str]) -> tuple[ServiceAccountGrant, Any]:
    """The grant, and the credentials ``google.auth.default`` loads, for the same file and scopes."""
    ours = service_account_grant(scopes, google_tokens._gcloud_file())
    assert isinstance(ours, ServiceAccountGrant), "the grant declined a plain service-account key file"
    theirs = google.auth.default(scopes=scopes)[0]
    assert type(theirs).__module__ == "google.oauth2.service_account"
    return ours, theirs


def frozen_at(monkeypatch: pytest.MonkeyPatch, moment: datetime.datetime) -> None:
    """google-auth's clock (``_helpers.utcnow``, which both the grant and google-auth read) stopped at ``moment``."""
    monkeypatch.setattr(_helpers, "utcnow", lambda: moment)


def outcome(credentials: Any, transport: FakeTransport) -> tuple[Any, ...]:
    """What a refresh gave: the token and expiry, or the exception's type, message, arguments and retryability."""
    try:
        credentials.refresh(transport)
    except Exception as exc:  # noqa: BLE001  (any exception: google-auth's own, or a TypeError it lets through)
        return type(exc), str(exc), exc.args, getattr(exc, "retryable", None)
    return credentials.token, credentials.expiry


# -- the request ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("change", "scopes"), [
    ({}, [SCOPE]),
    ({"private_key_id": None}, [SCOPE]),  # no kid in the header
    ({}, [SCOPE, "https://www.googleapis.com/auth/devstorage.read_only"]),
    ({"token_uri": "https://token.example/oauth2/token"}, [SCOPE]),  # sent there; the audience stays Google's
    ({"client_email": "r\u00e9sum\u00e9@sim-project.iam.gserviceaccount.com", "private_key_id": ""}, [SCOPE]),
])
def test_the_token_request_is_google_auths_byte_for_byte(key_file: dict[str, Any], change: dict[str, Any],
                                                          scopes: list[str], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    info = {key: value for key, value in {**key_file, **change}.items() if value is not None}
    use_key(tmp_path, monkeypatch, info)
    frozen_at(monkeypatch, FROZEN)
    ours, theirs = both(scopes)
    assert ours.assertion() == theirs._make_authorization_grant_assertion()
    sent = []
    for credentials in (ours, theirs):
        transport = FakeTransport(answered(TOKEN))
        credentials.refresh(transport)
        sent.append(transport.calls)
    assert sent[0] == sent[1] and len(sent[0]) == 1
    call = sent[0][0]
    assert (call["method"], call["url"]) == ("POST", info["token_uri"])
    assert call["body"].startswith(b"assertion=") and call["body"].endswith(
        b"&grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer")
    assert call["headers"]["Content-Type"] == "application/x-www-form-urlencoded"
    assert call["headers"]["x-goog-api-client"].endswith("auth-request-type/at cred-type/sa")
    header, claims = (json.loads(_helpers.padded_urlsafe_b64decode(part))
                      for part in ours.assertion().split(b".")[:2])
    assert header == {"typ": "JWT", "alg": "RS256", **({"kid": info["private_key_id"]} if "private_key_id" in info
                                                       else {})}
    iat = _helpers.datetime_to_secs(FROZEN)
    assert claims == {"iat": iat, "exp": iat + 3600, "iss": info["client_email"],
                      "aud": "https://oauth2.googleapis.com/token", "scope": " ".join(scopes)}


# -- the answer ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("answer", [
    TOKEN,
    {"access_token": "ya29.string-seconds", "expires_in": "1799"},
    {"access_token": "ya29.no-expiry"},  # never expired, for google-auth
    {"access_token": "ya29.more", "expires_in": 60, "scope": SCOPE, "id_token": "x"},
])
def test_the_answer_is_read_and_expires_as_google_auth_reads_it(key_file: dict[str, Any], answer: dict[str, Any],
                                                                tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    use_key(tmp_path, monkeypatch, key_file)
    frozen_at(monkeypatch, FROZEN)
    ours, theirs = both([SCOPE])
    assert (ours.token, ours.expiry, ours.expired, ours.valid) == (theirs.token, theirs.expiry, theirs.expired,
                                                                  theirs.valid) == (None, None, False, False)
    got, expected = (outcome(credentials, FakeTransport(answered(answer))) for credentials in (ours, theirs))
    assert got == expected and got[0] == answer["access_token"]
    lifetime = int(answer.get("expires_in", 10**6))
    threshold = _helpers.REFRESH_THRESHOLD.total_seconds()
    for seconds in (0, lifetime - threshold - 1, lifetime - threshold, lifetime, lifetime + 1):
        frozen_at(monkeypatch, FROZEN + datetime.timedelta(seconds=seconds))
        assert (ours.expired, ours.valid, ours.token_state) == (theirs.expired, theirs.valid, theirs.token_state)
    if "expires_in" in answer:
        frozen_at(monkeypatch, FROZEN + datetime.timedelta(seconds=lifetime - threshold))
        assert ours.expired  # the threshold is google-auth's, a few minutes before the token's end


@pytest.mark.parametrize("script", [
    [answered({"error": "invalid_grant", "error_description": "Invalid JWT Signature."}, 400)],
    [answered({"error": "invalid_grant"}, 400)],
    [answered({"error": "server_error"}, 500)],  # retried: three attempts
    [answered({"error": "unavailable"}, 503), answered(TOKEN)],  # retried once, then the token
    [answered({"error": "temporarily_unavailable"}, 400), answered(TOKEN)],  # retried for its error's name
    [answered({"error_description": "internal_failure"}, 401)],
    [answered({"message": "no error field"}, 403)],
    [(429, b"Too many requests, plain text")],
    [(502, b"<html>bad gateway</html>")],
    [answered({"token_type": "Bearer"})],  # no access_token
    [(200, b"not json")],  # google-auth lets a TypeError through
    [answered({"access_token": "x", "expires_in": "soon"})],  # and a ValueError
    [answered(["error"], 400)],
    [exceptions.TransportError("token.example could not be reached (ConnectionRefusedError)")],  # not retried
])
def test_an_error_is_google_auths_own_after_the_same_retries(key_file: dict[str, Any], script: list[Any],
                                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_key(tmp_path, monkeypatch, key_file)
    frozen_at(monkeypatch, FROZEN)
    waits: list[float] = []
    monkeypatch.setattr(_exponential_backoff.time, "sleep", waits.append)  # google-auth's backoff, not slept
    ours, theirs = both([SCOPE])
    results, calls, slept = [], [], []
    for credentials in (ours, theirs):
        transport = FakeTransport(*script)
        waits.clear()
        results.append(outcome(credentials, transport))
        calls.append(transport.calls)
        slept.append(len(waits))
    assert results[0] == results[1]
    assert calls[0] == calls[1] and slept[0] == slept[1] == len(calls[0]) - 1
    assert "PRIVATE KEY" not in repr(results[0])


# -- quota project, project, headers -------------------------------------------------------------------------------

@pytest.mark.parametrize("quota", [None, "", "billing-project"])
def test_the_quota_project_and_the_headers_applied_are_google_auths(key_file: dict[str, Any], quota: str | None,
                                                                    tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    if quota is not None:
        monkeypatch.setenv("GOOGLE_CLOUD_QUOTA_PROJECT", quota)
    use_key(tmp_path, monkeypatch, {**key_file, "quota_project_id": "in-the-file"})  # which neither reads
    frozen_at(monkeypatch, FROZEN)
    ours, theirs = both([SCOPE])
    assert ours.quota_project_id == theirs.quota_project_id == (quota or None)
    assert ours.project_id == theirs.project_id == key_file["project_id"]
    assert ours.service_account_email == theirs.service_account_email
    assert ours.universe_domain == theirs.universe_domain == "googleapis.com"
    assert ours.requires_scopes is theirs.requires_scopes is False
    assert ours.get_cred_info() == theirs.get_cred_info()
    applied = []
    for credentials in (ours, theirs):
        headers = {"x-allowed-locations": "stale"}
        credentials.before_request(FakeTransport(answered(TOKEN)), "POST", "https://aiplatform.googleapis.com/v1/x",
                                   headers)
        applied.append(headers)
    assert applied[0] == applied[1] and applied[0]["authorization"] == "Bearer ya29.frozen"
    other = ours.with_quota_project("another")
    assert (other.quota_project_id, theirs.with_quota_project("another").quota_project_id) == ("another",) * 2
    assert isinstance(other, ServiceAccountGrant) and other.service_account_email == ours.service_account_email


def test_the_grant_is_what_default_credentials_gives_for_a_plain_key_file(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(service_account(tmp_path, TOKEN_URI)))
    called: list[Any] = []
    monkeypatch.setattr(google.auth, "default", lambda *args, **kwargs: called.append(kwargs))
    credentials = google_tokens.default_credentials([SCOPE])
    assert isinstance(credentials, ServiceAccountGrant) and called == []
    assert google_tokens.default_credentials([SCOPE]) is credentials  # loaded once while nothing changes


def test_google_cloud_storage_takes_the_grant_as_google_auths_credentials(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Vertex's batch staging hands the credentials to google-cloud-storage, which refuses what is not a google-auth
    ``Credentials`` and leaves scoped credentials as they are."""
    from google.cloud import storage

    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(service_account(tmp_path, TOKEN_URI)))
    credentials = google_tokens.default_credentials([SCOPE])
    client = storage.Client(project="sim-project", credentials=credentials)
    assert client._credentials is credentials


# -- what is left to google.auth.default ---------------------------------------------------------------------------

def _edit(**change: Any) -> Callable[[dict[str, Any], Path, pytest.MonkeyPatch], dict[str, Any]]:
    def edited(info: dict[str, Any], folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
        return {key: value for key, value in {**info, **change}.items() if value is not _GONE}
    return edited


def _env(name: str, value: str) -> Callable[[dict[str, Any], Path, pytest.MonkeyPatch], dict[str, Any]]:
    def setting(info: dict[str, Any], folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
        monkeypatch.setenv(name, value)
        return info
    return setting


def _private_key(kind: str) -> Callable[[dict[str, Any], Path, pytest.MonkeyPatch], dict[str, Any]]:
    def keyed(info: dict[str, Any], folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        if kind == "ec":
            pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        else:  # the file's RSA key, encrypted
            key = serialization.load_pem_private_key(info["private_key"].encode(), password=None)
            pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.BestAvailableEncryption(b"secret"))
        return {**info, "private_key": pem.decode()}
    return keyed


_GONE = object()
FALLBACKS: dict[str, Callable[[dict[str, Any], Path, pytest.MonkeyPatch], Any]] = {
    "authorized user": _edit(type="authorized_user", client_id="id", client_secret="s", refresh_token="r"),
    "impersonated": _edit(type="impersonated_service_account"),
    "another universe": _edit(universe_domain="example-universe.com"),
    "a null universe (self-signed JWT)": _edit(universe_domain=None),
    "a trust boundary": _edit(trust_boundary={"locations": ["us"], "encodedLocations": "0x1"}),
    "no client_email": _edit(client_email=_GONE),
    "no token_uri": _edit(token_uri=_GONE),
    "no private_key": _edit(private_key=_GONE),
    "a garbled private_key": _edit(private_key="-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n"),
    "an EC private key": _private_key("ec"),
    "an encrypted private key": _private_key("encrypted"),
    "a private_key_id not a string": _edit(private_key_id=12345),
    "no project id anywhere": _edit(project_id=_GONE),
    "regional access boundary lookup on": _env("GOOGLE_SDK_EXPERIMENTAL_PYTHON_REGIONAL_ACCESS_BOUNDARY_LOOKUP_ENABLED",
                                               "true"),
    "a client certificate": _env("GOOGLE_API_USE_CLIENT_CERTIFICATE", "true"),
    "a certificate config": _env("GOOGLE_API_CERTIFICATE_CONFIG", "/nowhere/certificate_config.json"),
    "gcloud's client certificate": _env("CLOUDSDK_CONTEXT_AWARE_USE_CLIENT_CERTIFICATE", "true"),
    "not a JSON object": lambda info, folder, monkeypatch: [info],
    "not JSON": lambda info, folder, monkeypatch: "{not json",
}


@pytest.mark.parametrize("case", list(FALLBACKS))
def test_every_other_case_goes_through_google_auth_default(case: str, key_file: dict[str, Any], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    content = FALLBACKS[case](dict(key_file), tmp_path, monkeypatch)
    path = tmp_path / "key.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    _falls_back([SCOPE], monkeypatch)


def test_gcloud_s_own_file_named_by_the_variable_goes_through_google_auth_default(
        key_file: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    adc = Path(google_tokens._gcloud_file())
    adc.parent.mkdir(parents=True, exist_ok=True)
    adc.write_text(json.dumps(key_file), encoding="utf-8")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    _falls_back([SCOPE], monkeypatch)


def test_a_missing_file_or_no_scopes_go_through_google_auth_default(key_file: dict[str, Any], tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    use_key(tmp_path, monkeypatch, key_file)
    _falls_back([], monkeypatch)
    google_tokens._LOADED.forget()
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-such-key.json"))
    _falls_back([SCOPE], monkeypatch)


@pytest.mark.parametrize("installed", ["2.55.9", "3.0.0", "not-a-version"])
def test_a_google_auth_other_than_the_ones_the_grant_follows_loads_the_credentials_itself(
        key_file: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, installed: str) -> None:
    """Older than the release the grant was read from, or a new major release (whose private helpers may differ)."""
    from google.auth import version

    use_key(tmp_path, monkeypatch, key_file)
    monkeypatch.setattr(version, "__version__", installed)
    _falls_back([SCOPE], monkeypatch)


def _falls_back(scopes: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The grant declines, and ``default_credentials`` gives exactly what ``google.auth.default`` gives: its
    credentials' type, or its error's type and message."""
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "")  # so that only the file can name a project
    assert service_account_grant(scopes, google_tokens._gcloud_file()) is None
    expected = _loaded(lambda: google.auth.default(scopes=scopes)[0])
    real, calls = google.auth.default, []

    def spied(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(google.auth, "default", spied)
    got = _loaded(lambda: google_tokens.default_credentials(scopes))
    assert calls == [{"scopes": scopes}]
    assert got == expected and "ServiceAccountGrant" not in got[0]


def _loaded(load: Callable[[], Any]) -> tuple[str, str]:
    try:
        credentials = load()
    except Exception as exc:  # noqa: BLE001  (whatever google-auth raises)
        return type(exc).__qualname__, str(exc)
    return type(credentials).__qualname__, type(credentials).__module__


# -- the memo of checked keys --------------------------------------------------------------------------------------

def _skips(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """What each load asked of cryptography's RSA check (``unsafe_skip_rsa_key_validation``)."""
    from cryptography.hazmat.primitives import serialization

    asked: list[bool] = []
    real = serialization.load_pem_private_key

    def spied(data: bytes, password: bytes | None, **kwargs: Any) -> Any:
        asked.append(kwargs.get("unsafe_skip_rsa_key_validation", False))
        return real(data, password, **kwargs)

    monkeypatch.setattr(serialization, "load_pem_private_key", spied)
    return asked


def test_a_key_is_checked_whole_once_and_only_its_very_bytes_skip_the_check_later(
        key_file: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_key(tmp_path, monkeypatch, key_file)
    asked = _skips(monkeypatch)
    first = service_account_grant([SCOPE], google_tokens._gcloud_file())
    second = service_account_grant([SCOPE], google_tokens._gcloud_file())
    assert first is not None and second is not None and asked == [False, True]
    memo = Path(os.environ["RUNNER_KEY_MEMO"])
    written = memo.read_text(encoding="utf-8")
    assert json.loads(written)["sha256"] == [key_memo.digest_of(key_file["private_key"].encode())]
    assert "PRIVATE KEY" not in written and key_file["client_email"] not in written  # only the digest
    frozen_at(monkeypatch, FROZEN)
    assert first.assertion() == second.assertion()  # the same key either way
    other = json.loads(service_account(tmp_path, TOKEN_URI).read_text(encoding="utf-8"))
    use_key(tmp_path, monkeypatch, other, "other.json")
    assert service_account_grant([SCOPE], google_tokens._gcloud_file()) is not None
    assert asked == [False, True, False], "a changed key is checked whole again"
    assert len(json.loads(memo.read_text(encoding="utf-8"))["sha256"]) == 2


def test_a_key_that_fails_the_check_is_not_remembered(key_file: dict[str, Any], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from cryptography.hazmat.primitives import serialization

    use_key(tmp_path, monkeypatch, key_file)

    def refused(data: bytes, password: bytes | None, **kwargs: Any) -> Any:
        raise ValueError("Invalid private key")

    monkeypatch.setattr(serialization, "load_pem_private_key", refused)
    assert service_account_grant([SCOPE], google_tokens._gcloud_file()) is None
    assert not Path(os.environ["RUNNER_KEY_MEMO"]).exists()


@pytest.mark.parametrize("memo", ["off", "a file/in a file.json", "unreadable.json"])
def test_no_memo_or_a_broken_one_only_costs_the_check(memo: str, key_file: dict[str, Any], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a file").write_text("not a folder", encoding="utf-8")
    (tmp_path / "unreadable.json").write_text("{broken", encoding="utf-8")
    monkeypatch.setenv("RUNNER_KEY_MEMO", memo if memo == "off" else str(tmp_path / memo))
    use_key(tmp_path, monkeypatch, key_file)
    asked = _skips(monkeypatch)
    assert service_account_grant([SCOPE], google_tokens._gcloud_file()) is not None
    assert asked == [False]
    if memo == "unreadable.json":  # rewritten whole, and read at the next load
        assert service_account_grant([SCOPE], google_tokens._gcloud_file()) is not None
        assert asked == [False, True]


# -- what is imported ----------------------------------------------------------------------------------------------

def test_a_refresh_never_imports_google_auths_service_account_crypt_or_jwt_modules(key_file: dict[str, Any],
                                                                                   tmp_path: Path) -> None:
    """In a new interpreter: credentials loaded by ``default_credentials`` and refreshed over a transport answering a
    token load no module of google.oauth2, google.auth.crypt, google.auth.jwt or cryptography.x509, and never call
    ``google.auth.default`` (``google.auth._default``, which defines it, is imported by the ``google.auth`` package
    itself: its module costs nothing of note)."""
    path = tmp_path / "key.json"
    path.write_text(json.dumps(key_file), encoding="utf-8")
    script = (
        "import json, sys\n"
        "import google.auth\n"
        "def refused(*args, **kwargs):\n"
        "    raise AssertionError('google.auth.default was called')\n"
        "google.auth.default = refused\n"
        "from google.auth import transport\n"
        "from runner.providers.google_tokens import default_credentials\n"
        "class Answer(transport.Response):\n"
        "    status, headers = 200, {}\n"
        "    data = json.dumps({'access_token': 'ya29.x', 'expires_in': 3600}).encode()\n"
        "credentials = default_credentials(['" + SCOPE + "'])\n"
        "credentials.refresh(lambda **request: Answer())\n"
        "assert credentials.token == 'ya29.x' and not credentials.expired\n"
        "print(type(credentials).__name__)\n"
        "print(sorted(name for name in sys.modules if name.startswith(('google.oauth2', 'google.auth.crypt',\n"
        "      'google.auth.jwt', 'cryptography.x509', 'google.auth.transport.requests', 'requests'))))\n")
    env = {name: value for name, value in os.environ.items() if not name.startswith(("GOOGLE_", "CLOUDSDK_"))}
    env.update(PYTHONPATH=str(Path(__file__).resolve().parents[2]), GOOGLE_APPLICATION_CREDENTIALS=str(path),
               CLOUDSDK_CONFIG=str(tmp_path / "gcloud"), NO_GCE_CHECK="true")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-2:] == ["ServiceAccountGrant", "[]"], done.stdout
