"""bedrock's requests signed by awscrt (``runner/providers/bedrock_wire.py``: ``AwsSigner``, ``crt``): AWS's own SigV4
signer in C, which botocore signs with when installed as ``botocore[crt]``, gives the same headers and the same
signature as botocore's ``SigV4Auth`` for the same request at the same time; a run signs every request with it, and
where awscrt cannot be imported botocore signs every request and the run completes. test_lean_bedrock.py's
signature checks run with either signer too (its ``signed_by``). Nothing connects anywhere but 127.0.0.1."""

from __future__ import annotations

import datetime
import functools
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from runner.providers import bedrock_wire
from runner.providers.bedrock_wire import AwsSigner, converse_path, invoke_path, lookup_path
from tests.helpers import isolated_aws, sim_stats, submit_lines, write_job, write_rows
from tests.providers.test_lean_bedrock import (
    ACCESS_KEY,
    CLAUDE,
    CONVERSE,
    PROFILE_ARN,
    REGION,
    SECRET,
)
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


@pytest.fixture
def awscrt_at(monkeypatch: pytest.MonkeyPatch) -> None:
    """awscrt's signing configurations made with the date :data:`AT`; botocore's clock stopped at it."""
    import botocore.auth

    modules = bedrock_wire.crt()
    assert modules is not None, "awscrt is in the bedrock extra"
    auth, http = modules
    dated = types.SimpleNamespace(**{**vars(auth), "AwsSigningConfig": functools.partial(auth.AwsSigningConfig,
                                                                                         date=AT)})
    monkeypatch.setattr(bedrock_wire, "crt", lambda: (dated, http))
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *args, **kwargs: AT.replace(tzinfo=None))


async def signed_both_ways(monkeypatch: pytest.MonkeyPatch, signer: AwsSigner, method: str, url: str, body: bytes
                           ) -> tuple[dict[str, str], dict[str, str]]:
    """The headers ``signer`` gives for one request: awscrt's, then botocore's (awscrt set aside)."""
    by_crt = await signer.headers(method, url, body, HOST)
    with monkeypatch.context() as patched:
        patched.setattr(bedrock_wire, "crt", lambda: None)
        by_botocore = await signer.headers(method, url, body, HOST)
    return by_crt, by_botocore


@pytest.mark.usefixtures("awscrt_at")
@pytest.mark.parametrize("token", [None, "simulated-session-token"])
@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", converse_path(CONVERSE), BODY),
    ("POST", converse_path(PROFILE_ARN), BODY),  # ':' and '/' quoted in the path, so quoted again when signed
    ("POST", invoke_path(CLAUDE), BODY),  # ':' kept in the path
    ("GET", lookup_path(PROFILE_ARN, profile=True), b""),  # no body, so no Content-Type signed
    ("GET", lookup_path(CONVERSE, profile=False), b""),
])
async def test_awscrt_signs_as_botocore_signs_at_the_same_time(monkeypatch: pytest.MonkeyPatch, token: str | None,
                                                               method: str, path: str, body: bytes) -> None:
    from botocore.credentials import Credentials

    signer = AwsSigner(Credentials(ACCESS_KEY, SECRET, token), REGION)
    by_crt, by_botocore = await signed_both_ways(monkeypatch, signer, method, f"https://{HOST}{path}", body)
    assert by_crt == by_botocore
    assert set(by_crt) == {"X-Amz-Date", "Authorization"} | ({"X-Amz-Security-Token"} if token else set())
    assert by_crt["X-Amz-Date"] == "20261201T093015Z" and by_crt.get("X-Amz-Security-Token") == token
    signed = "content-type;host;x-amz-date" if body else "host;x-amz-date"
    assert f"SignedHeaders={signed}{';x-amz-security-token' if token else ''}," in by_crt["Authorization"]
    assert SECRET not in json.dumps(by_crt)


@pytest.mark.usefixtures("awscrt_at")
async def test_awscrt_signs_with_the_credentials_of_the_moment(monkeypatch: pytest.MonkeyPatch) -> None:
    """One signing configuration for each distinct credentials botocore hands over: changed ones (a refresh) sign
    with the new key at once."""
    from botocore.credentials import Credentials

    credentials = Credentials(ACCESS_KEY, SECRET, None)
    signer = AwsSigner(credentials, REGION)
    url = f"https://{HOST}{converse_path(CONVERSE)}"
    first, _ = await signed_both_ways(monkeypatch, signer, "POST", url, BODY)
    assert (await signer.headers("POST", url, BODY, HOST)) == first
    credentials.access_key, credentials.token = "AKIDREFRESHED", "new-token"
    by_crt, by_botocore = await signed_both_ways(monkeypatch, signer, "POST", url, BODY)
    assert by_crt == by_botocore and "Credential=AKIDREFRESHED/" in by_crt["Authorization"]
    assert by_crt["X-Amz-Security-Token"] == "new-token"


def run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=env)


#: counts botocore's signatures in a process of its own (its SigV4Auth.add_auth, wrapped)
COUNT_BOTOCORE = ("import botocore.auth\n"
                  "botocore_signed = []\n"
                  "_add_auth = botocore.auth.SigV4Auth.add_auth\n"
                  "def _counted(self, request):\n"
                  "    botocore_signed.append(request.method)\n"
                  "    return _add_auth(self, request)\n"
                  "botocore.auth.SigV4Auth.add_auth = _counted\n")


@pytest.mark.parametrize("awscrt", [True, False])
def test_a_run_signs_every_request_with_awscrt_or_where_it_cannot_be_imported_with_botocore(
        tmp_path: Path, sim_server: str, awscrt: bool) -> None:
    """``runner submit`` of a job of both of bedrock's families: every request and the probes' lookups signed by
    awscrt (botocore's ``SigV4Auth`` never called); in a process where awscrt cannot be imported (as where it is not
    installed), every one by botocore, and the run completes alike."""
    root = sim_server.removesuffix("/v1")
    dataset = write_rows(tmp_path / "rows.jsonl", 4)
    job = write_job(tmp_path / "job.yaml", dataset, models=["bedrock:amazon.nova-pro-v1:0", f"bedrock:{CLAUDE}"],
                    extra=f"providers: {{bedrock: {{base_url: '{root}'}}}}")
    code = ("import sys\n"
            + ("" if awscrt else "sys.modules['awscrt'] = None  # as where it is not installed: its import fails\n")
            + COUNT_BOTOCORE + "from runner.providers import bedrock_wire\n"
            + submit_lines(job, tmp_path / "s.sqlite") +
            "print('RESULT', exit_code, bedrock_wire.crt() is not None, len(botocore_signed), flush=True)\n")
    done = run_python(code, env={**os.environ})
    result = [line.split() for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert result and result[0][:3] == ["RESULT", "0", str(awscrt)], done.stdout + done.stderr
    assert "completed" in done.stdout
    stats = sim_stats(sim_server)["by_route"]
    sent = stats["bedrock-converse"] + stats["bedrock-invoke"]
    assert sent == 8
    if awscrt:
        assert result[0][3] == "0"  # not one request signed by botocore
    else:
        assert int(result[0][3]) >= sent  # every request (and the probes' lookups) signed by botocore
