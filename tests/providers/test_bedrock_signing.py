"""bedrock's SigV4 headers (``runner/providers/bedrock_wire.py``: ``AwsSigner``): botocore's ``SigV4Auth`` signs a
plain request object (``_Signable``, its headers in a dict) exactly as it signs its own ``AWSRequest``, the same
header names and values for every kind of request the runner sends; the process checks that once on its first
request and signs botocore's own object wherever the two differ or the plain one fails. test_lean_bedrock.py checks
the signatures as a server receives them, recomputed with botocore's signer. Nothing connects anywhere."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from botocore.credentials import Credentials

from runner.providers import bedrock_wire
from runner.providers.bedrock_wire import AwsSigner, converse_path, invoke_path, lookup_path
from tests.providers.test_lean_bedrock import ACCESS_KEY, CLAUDE, PROFILE_ARN, REGION, SECRET

HOST = f"bedrock-runtime.{REGION}.amazonaws.com"
BODY = b'{"messages": [{"role": "user", "content": [{"text": "R\\u00e9ponds: 2+2?"}]}]}'
#: (method, path, body) of each kind of request: Converse, a cross-region profile's ARN quoted into the path,
#: Claude's InvokeModel, the probe's lookup (no body)
REQUESTS = [("POST", converse_path("amazon.nova-pro-v1:0"), BODY), ("POST", converse_path(PROFILE_ARN), BODY),
            ("POST", invoke_path(CLAUDE), BODY), ("GET", lookup_path("amazon.nova-pro-v1:0", profile=False), b"")]


@pytest.fixture(autouse=True)
def _unchecked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts as a process whose first request has not been signed yet."""
    monkeypatch.setattr(bedrock_wire, "_LIGHT", bedrock_wire._Light())


def _signer(token: str | None) -> AwsSigner:
    return AwsSigner(Credentials(ACCESS_KEY, SECRET, token), REGION)


async def _both_ways(signer: AwsSigner, method: str, path: str, body: bytes) -> tuple[dict[str, str], dict[str, str]]:
    """The headers of one request signed on the plain object and on botocore's own, in the same second."""
    url = f"https://{HOST}{path}"
    for _ in range(5):
        bedrock_wire._LIGHT.usable = True
        light = await signer.headers(method, url, body, HOST)
        bedrock_wire._LIGHT.usable = False
        own = await signer.headers(method, url, body, HOST)
        if light["X-Amz-Date"] == own["X-Amz-Date"]:
            return light, own
    raise AssertionError("five pairs of signatures fell in different seconds")


@pytest.mark.parametrize("token", [None, "session-token-of-a-role"])
@pytest.mark.parametrize(("method", "path", "body"), REQUESTS)
def test_the_plain_request_is_signed_as_botocores_own(token: str | None, method: str, path: str, body: bytes) -> None:
    light, own = asyncio.run(_both_ways(_signer(token), method, path, body))
    assert light == own
    assert set(own) == {"X-Amz-Date", "Authorization"} | ({"X-Amz-Security-Token"} if token else set())
    signed = own["Authorization"].split("SignedHeaders=")[1].split(",")[0].split(";")
    assert signed == (["content-type"] if body else []) + ["host", "x-amz-date"] + \
        (["x-amz-security-token"] if token else [])


def test_the_first_request_checks_the_plain_request_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from botocore.auth import SigV4Auth

    calls: list[str] = []
    sign = SigV4Auth.add_auth

    def counted(self: Any, request: Any) -> None:
        calls.append(type(request).__name__)
        sign(self, request)

    monkeypatch.setattr(SigV4Auth, "add_auth", counted)
    signer = _signer(None)
    url = f"https://{HOST}{REQUESTS[0][1]}"
    for _ in range(3):
        asyncio.run(signer.headers("POST", url, BODY, HOST))
    assert bedrock_wire._LIGHT.usable is True
    assert calls == ["AWSRequest", "_Signable", "_Signable", "_Signable", "_Signable"]


def test_a_botocore_that_reads_more_of_its_request_gets_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A botocore whose signer reads what the plain object lacks (here: ``stream_output``) signs botocore's own
    object for the whole process, and the request is signed as before."""
    from botocore.auth import SigV4Auth

    canonical = SigV4Auth.canonical_request

    def reading_more(self: Any, request: Any) -> str:
        request.stream_output  # noqa: B018  (AWSRequest has it; _Signable has not)
        return canonical(self, request)  # type: ignore[no-any-return]

    monkeypatch.setattr(SigV4Auth, "canonical_request", reading_more)
    signer = _signer(None)
    url = f"https://{HOST}{REQUESTS[0][1]}"
    headers = asyncio.run(signer.headers("POST", url, BODY, HOST))
    assert bedrock_wire._LIGHT.usable is False
    assert headers["Authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/")


def test_a_botocore_that_signs_the_plain_request_otherwise_gets_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the two signatures differ (here: a signer that reads the body through ``AWSRequest.data``, which the
    plain object lacks, so it signs no body for it), botocore's own object is signed for the whole process."""
    from botocore.auth import SigV4Auth

    payload = SigV4Auth.payload

    def through_data(self: Any, request: Any) -> str:
        if not hasattr(request, "data"):
            request = type("Bodiless", (), {"body": b"", "url": request.url, "context": request.context})()
        return payload(self, request)  # type: ignore[no-any-return]

    monkeypatch.setattr(SigV4Auth, "payload", through_data)
    signer = _signer(None)
    asyncio.run(signer.headers("POST", f"https://{HOST}{REQUESTS[0][1]}", BODY, HOST))
    assert bedrock_wire._LIGHT.usable is False
