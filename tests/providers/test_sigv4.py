"""bedrock's SigV4 signing (``runner/providers/sigv4.py``, through ``bedrock_wire.AwsSigner``) against botocore's own
``SigV4Auth`` and AWS's published example, and the environment's keys (``aws_sessions.environment_credentials``)
against what botocore's credential chain answers: the same headers and the same signature for the same request at
the same time; the same keys, or botocore's chain asked. test_lean_bedrock.py's signature checks (a server's
recomputation with ``SigV4Auth``) run with both sources of credentials too (its ``credentials_from``). Nothing
connects anywhere but 127.0.0.1."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runner.providers.aws_sessions import environment_credentials
from runner.providers.bedrock_wire import AwsSigner, converse_path, invoke_path, lookup_path
from runner.providers.sigv4 import SigV4, canonical_path, canonical_query
from tests.helpers import isolated_aws, sim_stats, submit_lines, write_job, write_rows
from tests.providers.test_lean_bedrock import ACCESS_KEY, CLAUDE, CONVERSE, PROFILE_ARN, REGION, SECRET
from tests.providers.test_vertex import _local_only  # noqa: F401  (an autouse fixture)

ROOT = Path(__file__).resolve().parents[2]
HOST = "bedrock-runtime.us-east-1.amazonaws.com"
#: the time both signers sign at
AT = datetime.datetime(2026, 12, 1, 9, 30, 15, tzinfo=datetime.UTC)
BODY = json.dumps({"messages": [{"role": "user", "content": [{"text": "Réponds: 2+2?"}]}],
                  "inferenceConfig": {"maxTokens": 5}}).encode()


@pytest.fixture(autouse=True)
def _aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolated_aws(monkeypatch, tmp_path, ACCESS_KEY, SECRET, region=REGION)
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


def by_botocore(credentials: Any, method: str, url: str, headers: dict[str, str], body: bytes,
                at: datetime.datetime = AT, service: str = "bedrock", region: str = REGION) -> dict[str, str]:
    """botocore's ``SigV4Auth`` headers for the request at ``at``, without those given."""
    from unittest import mock

    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest

    request = AWSRequest(method=method, url=url, data=body, headers=dict(headers))
    with mock.patch("botocore.auth.get_current_datetime", return_value=at.replace(tzinfo=None)):
        SigV4Auth(credentials, service, region).add_auth(request)
    given_names = {name.lower() for name in headers}
    return {name: value for name, value in request.headers.items() if name.lower() not in given_names}


def test_awss_published_example_is_signed_as_aws_and_botocore_sign_it() -> None:
    """AWS's SigV4 test suite's ``get-vanilla`` request (its example keys, 2015-08-30T12:36:00Z), whose published
    signature is 5fa00fa3... (the suite's get-vanilla.authz, in botocore's and the AWS SDKs' tests)."""
    from botocore.credentials import ReadOnlyCredentials

    keys = ReadOnlyCredentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", None)
    at = datetime.datetime(2015, 8, 30, 12, 36, tzinfo=datetime.UTC)
    headers = {"Host": "example.amazonaws.com"}
    ours = SigV4("us-east-1", "service").headers(keys, "GET", "/", "", headers, b"", at.timestamp())
    assert ours == {"X-Amz-Date": "20150830T123600Z", "Authorization": (
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        "SignedHeaders=host;x-amz-date, "
        "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31")}
    assert ours == by_botocore(keys, "GET", "https://example.amazonaws.com/", headers, b"", at, "service",
                               "us-east-1")


@pytest.mark.parametrize("token", [None, "simulated-session-token"])
@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", converse_path(CONVERSE), BODY),
    ("POST", converse_path(PROFILE_ARN), BODY),  # ':' and '/' quoted in the path, so quoted again when signed
    ("POST", invoke_path(CLAUDE), BODY),  # ':' kept in the path
    ("GET", lookup_path(PROFILE_ARN, profile=True), b""),  # no body, so no Content-Type signed
    ("GET", lookup_path(CONVERSE, profile=False), b""),
])
async def test_the_wires_requests_are_signed_as_botocore_signs_them(monkeypatch: pytest.MonkeyPatch,
                                                                   token: str | None, method: str, path: str,
                                                                   body: bytes) -> None:
    import time

    from botocore.credentials import Credentials

    monkeypatch.setattr(time, "time", lambda: AT.timestamp())
    credentials = Credentials(ACCESS_KEY, SECRET, token)
    url = f"https://{HOST}{path}"
    ours = await AwsSigner(credentials, REGION).headers(method, url, body, HOST)
    given = {"Content-Type": "application/json", "Host": HOST} if body else {"Host": HOST}
    assert ours == by_botocore(credentials, method, url, given, body)
    assert set(ours) == {"X-Amz-Date", "Authorization"} | ({"X-Amz-Security-Token"} if token else set())
    assert ours["X-Amz-Date"] == "20261201T093015Z" and ours.get("X-Amz-Security-Token") == token
    signed = "content-type;host;x-amz-date" if body else "host;x-amz-date"
    assert f"SignedHeaders={signed}{';x-amz-security-token' if token else ''}," in ours["Authorization"]
    assert SECRET not in json.dumps(ours)


#: what a path or a query may be made of: letters, percent-escapes, the separators, dots, the kept marks
_PIECES = ["a", "Z", "9", "%3A", "%2F", "%25", "/", "//", ".", "..", "-", "_", "~", ":", "@", "+"]
_SEED = 20261201


def test_any_path_query_header_and_body_are_signed_as_botocore_signs_them() -> None:
    """Paths with dot segments, doubled slashes, escapes and trailing slashes; queries unsorted, repeated, without
    ``=``; a header's runs of spaces; 400 requests drawn with a fixed seed: the canonical forms botocore makes, so
    the same signature."""
    import random
    from urllib.parse import quote

    from botocore.credentials import ReadOnlyCredentials
    from botocore.utils import normalize_url_path

    draw = random.Random(_SEED)
    for case in range(400):
        path = "/" + "".join(draw.choices(_PIECES, k=draw.randrange(13))).lstrip("/")
        query = "&".join(draw.choice(["a", "b", "B", "x-y", "%20"]) + draw.choice(["", "=", "=1", "=2", "=%2F", "=a=b"])
                         for _ in range(draw.randrange(5)))
        header = draw.choice(["", "v", "  spaced   out  value ", "a,b"])
        keys = ReadOnlyCredentials(ACCESS_KEY, SECRET, draw.choice([None, "t/k+n="]))
        body = draw.choice([b"", b"{}", BODY])
        headers = {"Host": HOST, "X-Custom": header}
        url = f"https://{HOST}{path}" + (f"?{query}" if query else "")
        ours = SigV4(REGION, "bedrock").headers(keys, "POST", path, query, headers, body, AT.timestamp())
        assert ours == by_botocore(keys, "POST", url, headers, body), f"seed {_SEED}, case {case}: {url}"
        assert canonical_path(path) == quote(normalize_url_path(path), safe="/~"), f"seed {_SEED}, case {case}"


def test_canonical_forms_of_the_edges() -> None:
    assert canonical_path("") == "/"
    assert canonical_path("/a/./b/../c//d/") == "/a/c/d/"
    assert canonical_path("/..") == "/"
    assert canonical_path("/model/a%3Ab/converse") == "/model/a%253Ab/converse"
    assert canonical_query("") == ""
    assert canonical_query("b=2&a=1&a=0&c") == "a=0&a=1&b=2&c="


async def test_refreshed_credentials_and_a_new_day_sign_with_their_own_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The signing key is derived once per secret and day: changed credentials (a refresh) and the next day each
    sign as botocore signs them at once."""
    import time

    from botocore.credentials import Credentials

    credentials = Credentials(ACCESS_KEY, SECRET, None)
    signer = AwsSigner(credentials, REGION)
    url = f"https://{HOST}{converse_path(CONVERSE)}"
    given = {"Content-Type": "application/json", "Host": HOST}
    for at, access, secret in [(AT, ACCESS_KEY, SECRET), (AT, "AKIDREFRESHED", "refreshed-secret"),
                               (AT + datetime.timedelta(days=1), "AKIDREFRESHED", "refreshed-secret"),
                               (AT + datetime.timedelta(days=1), ACCESS_KEY, SECRET)]:
        monkeypatch.setattr(time, "time", lambda at=at: at.timestamp())
        credentials.access_key, credentials.secret_key = access, secret
        assert await signer.headers("POST", url, BODY, HOST) == by_botocore(credentials, "POST", url, given, BODY, at)


# -- the environment's keys -------------------------------------------------------------------------------------

@pytest.mark.parametrize("variables", [
    {},
    {"AWS_SESSION_TOKEN": "session-token"},
    {"AWS_SECURITY_TOKEN": "security-token"},
    {"AWS_SECURITY_TOKEN": "security-token", "AWS_SESSION_TOKEN": "session-token"},  # botocore's order: security
    {"AWS_SECURITY_TOKEN": "", "AWS_SESSION_TOKEN": "session-token"},
    {"AWS_SESSION_TOKEN": ""},
    {"AWS_ACCOUNT_ID": "123456789012"},
])
def test_the_environments_keys_are_the_ones_botocores_chain_answers(monkeypatch: pytest.MonkeyPatch,
                                                                   variables: dict[str, str]) -> None:
    import botocore.session

    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    ours = environment_credentials(None)
    assert ours is not None
    theirs = botocore.session.Session().get_credentials()
    assert theirs.method == "env"
    frozen = theirs.get_frozen_credentials()
    assert (ours.access_key, ours.secret_key, ours.token) == (frozen.access_key, frozen.secret_key, frozen.token)
    assert ours.get_frozen_credentials() is ours
    assert SECRET not in repr(ours) and ACCESS_KEY not in repr(ours)


def write_profile(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shared credentials file with a profile ``team`` of other keys."""
    path = folder / "aws-credentials"
    path.write_text("[team]\naws_access_key_id = AKIDPROFILE\naws_secret_access_key = profile-secret\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(path))


@pytest.mark.parametrize("case", ["named profile", "AWS_PROFILE", "no access key", "empty secret", "expiring"])
def test_the_environment_is_left_to_botocore_where_it_is_not_the_chains_whole_answer(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, case: str) -> None:
    """A profile named (the job's or AWS_PROFILE: the provider hands it to botocore's session, whose chain then
    leaves the environment out), no access key, an empty secret (botocore's error names the variable), an expiry
    (botocore re-reads the variables): botocore's chain is asked, and the provider signs with what it answers."""
    from botocore.exceptions import PartialCredentialsError

    from runner.providers.base import ProviderSettings
    from runner.providers.bedrock import BedrockProvider

    write_profile(tmp_path, monkeypatch)
    options: dict[str, Any] = {}
    if case == "named profile":
        options = {"profile": "team"}
    elif case == "AWS_PROFILE":
        monkeypatch.setenv("AWS_PROFILE", "team")
    elif case == "no access key":
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    elif case == "empty secret":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "")
    else:
        monkeypatch.setenv("AWS_CREDENTIAL_EXPIRATION", "2099-01-01T00:00:00Z")
    provider = BedrockProvider(ProviderSettings.model_validate(options))
    assert environment_credentials(provider.profile) is None
    if case == "empty secret":
        with pytest.raises(PartialCredentialsError, match="AWS_SECRET_ACCESS_KEY"):
            provider._credentials()
        return
    found = provider._credentials()
    if case == "no access key":
        assert found is None  # no file's default profile, no metadata: the chain found nothing
        return
    frozen = found.get_frozen_credentials()
    expected = {"named profile": "AKIDPROFILE", "AWS_PROFILE": "AKIDPROFILE", "expiring": ACCESS_KEY}[case]
    assert frozen.access_key == expected


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ})


@pytest.mark.parametrize("source", ["environment", "profile"])
def test_a_run_with_the_environments_keys_never_imports_botocore(tmp_path: Path, sim_server: str,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 source: str) -> None:
    """``runner submit`` of a job of both of bedrock's families, its probes' lookups and every request signed and
    accepted by the simulated server: with the keys in the environment, the process never imports botocore (nor
    awscrt, which botocore imports wherever it is installed); with a profile (AWS_PROFILE), botocore's chain hands
    over the profile's keys, and the run completes alike."""
    if source == "profile":
        path = tmp_path / "aws-credentials"
        path.write_text(f"[team]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET}\n")
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(path))
        monkeypatch.setenv("AWS_PROFILE", "team")
    root = sim_server.removesuffix("/v1")
    dataset = write_rows(tmp_path / "rows.jsonl", 4)
    job = write_job(tmp_path / "job.yaml", dataset, models=["bedrock:amazon.nova-pro-v1:0", f"bedrock:{CLAUDE}"],
                    extra=f"providers: {{bedrock: {{base_url: '{root}'}}}}")
    code = ("import sys\n" + submit_lines(job, tmp_path / "s.sqlite") +
            "print('RESULT', exit_code, sorted({name.split('.')[0] for name in sys.modules}\n"
            "      & {'botocore', 'boto3', 'awscrt'}), flush=True)\n")
    done = run_python(code)
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert result and result[0].startswith("RESULT 0 "), done.stdout + done.stderr
    imported = result[0].removeprefix("RESULT 0 ")
    if source == "environment":
        assert imported == "[]"
    else:
        assert "'botocore'" in imported and "'boto3'" not in imported
    assert "completed" in done.stdout
    stats = sim_stats(sim_server)["by_route"]
    assert stats["bedrock-converse"] + stats["bedrock-invoke"] == 8

