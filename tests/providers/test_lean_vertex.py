"""The vertex provider over the lean wire (``runner/providers/vertex.py`` on ``lean_http.py``, Google's tokens from
``google_tokens.py``) against the SDK paths it replaces online (google-genai in Vertex mode, ``AsyncAnthropicVertex``),
both sent to one scripted server: the same method, path, query, auth and content headers and JSON body for each
request of both families, the same completion for an answer, the same error for each error answer; the quota project;
a token that expires mid-run refreshed once, off the event loop, for many requests in flight; the hosts both SDKs
pick for a location; the SDKs kept where a proxy applies; and the strict simulated server's Vertex routes taking
every lean request.

The credentials are a service-account key file (a fresh RSA key) whose token endpoint is a second scripted server
answering one fixed token, so that the two paths' ``Authorization`` headers can be compared byte for byte; nothing
connects anywhere but 127.0.0.1 (``_local_only``, shared with tests/providers/test_vertex.py)."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from runner.errors import AuthError, BadRequest, ProviderError, QuotaExceeded, RateLimited, TransientError
from runner.providers import capabilities
from runner.providers.base import CacheMarks, Completion, ProviderSettings
from runner.providers.records import LEAN_WIRE
from runner.providers.vertex import VertexProvider
from runner.providers.vertex_wire import default_root
from simserver import start_server
from tests.helpers import headers_of, provider_outcome, scripted_server
from tests.providers.test_lean_gemini import ANSWER, MESSAGES, RETRY, camel, described, status_body
from tests.providers.test_vertex import _local_only, credentials_file, private_key  # noqa: F401  (fixtures)

PROJECT, LOCATION = "sim-project", "us-east5"
GEMINI, CLAUDE = "gemini-2.5-flash", "claude-haiku-4-5@20251001"
TOKEN = "ya29.fixed-test-token"
QUOTA = "billing-project"
MESSAGE = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
           "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"}, {"type": "text", "text": "C"}],
           "stop_reason": "end_turn", "stop_sequence": None,
           "usage": {"input_tokens": 12, "output_tokens": 3, "cache_read_input_tokens": 4,
                     "cache_creation_input_tokens": 2}}
#: Gemini's parameter sets whose bodies both paths must write alike (model, params)
GEMINI_CASES: list[tuple[str, dict[str, Any]]] = [
    (GEMINI, {"max_tokens": 5, "temperature": 0}),
    ("gemini-2.0-flash", {"max_tokens": 50, "temperature": 0.5, "top_p": 0.9, "stop": ["\n\n"], "seed": 3,
              "presence_penalty": 0.1, "frequency_penalty": 0.2, "response_format": {"type": "json_object"}}),
    (GEMINI, {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {
        "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}},
        "reasoning": {"budget_tokens": 512}}),
    (GEMINI, {"reasoning": {"effort": "none"}, "cached_content": "cachedContents/abc", "cached_messages": 1}),
    (GEMINI, {"max_tokens": 5, "cached_content": f"projects/{PROJECT}/locations/{LOCATION}/cachedContents/xyz",
              "cached_messages": 1}),
    ("gemini-3-pro-preview", {"reasoning": {"effort": "low"}}),
]
#: Claude's (model, params, whether the messages are marked for the prompt cache)
CLAUDE_CASES: list[tuple[str, dict[str, Any], bool]] = [
    (CLAUDE, {"max_tokens": 5, "temperature": 0.2, "stop": ["\n"]}, False),
    (CLAUDE, {"top_p": 0.9}, True),
    ("claude-sonnet-4-5@20250929", {"reasoning": {"budget_tokens": 1024}, "max_tokens": 2048}, False),
    ("claude-opus-4-6", {"reasoning": {"effort": "low"}, "max_tokens": 2048}, False),
    ("claude-sonnet-4-6", {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {
        "type": "object", "properties": {"letter": {"type": "string"}}, "required": ["letter"],
        "additionalProperties": False}}}}, False),
]


class SDKVertex(VertexProvider):
    """The vertex provider as it was before the lean wire: google-genai and AsyncAnthropicVertex."""

    lean_wire: ClassVar[bool] = False


@pytest.fixture(autouse=True)
def _no_settings_of_the_user(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GOOGLE_CLOUD_QUOTA_PROJECT", "GOOGLE_VERTEX_BASE_URL", "GOOGLE_API_USE_CLIENT_CERTIFICATE",
                 "HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY",
                 "no_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def token_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, private_key: str  # noqa: F811
                       ) -> AsyncIterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Google's token endpoint as a scripted server answering :data:`TOKEN` (the answer may be changed), named by
    the credentials file GOOGLE_APPLICATION_CREDENTIALS points to; yields the answer and the requests it got."""
    async with scripted_server() as (url, answer, seen):
        answer.update(status=200, body=json.dumps({"access_token": TOKEN, "expires_in": 3600,
                                                   "token_type": "Bearer"}).encode())
        path = credentials_file(tmp_path, url + "/token", private_key)
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
        yield answer, seen


@pytest.fixture
async def scripted(token_server: Any) -> AsyncIterator[tuple[str, dict[str, Any], list[dict[str, Any]]]]:
    async with scripted_server() as served:
        yield served


def settings(url: str | None, **more: Any) -> ProviderSettings:
    return ProviderSettings.model_validate({"base_url": url, "timeout": 10, "project": PROJECT,
                                            "location": LOCATION, **more})


def both(url: str) -> tuple[VertexProvider, VertexProvider]:
    return VertexProvider(settings(url)), SDKVertex(settings(url))


async def outcome(provider: VertexProvider, model: str, params: dict[str, Any],
                  messages: list[dict[str, Any]] | None = None) -> Completion | ProviderError:
    return await provider_outcome(provider, model, messages or MESSAGES, params)  # type: ignore[no-any-return]


def same_request(lean: dict[str, Any], sdk: dict[str, Any], quota: str | None) -> None:
    """Method, path with its query, the auth and content headers: byte for byte."""
    assert (lean["method"], lean["path"]) == (sdk["method"], sdk["path"])
    lean_headers, sdk_headers = headers_of(lean), headers_of(sdk)
    for name in ("authorization", "x-goog-user-project", "content-type"):
        if name != "content-type" or sdk["body"]:  # (google-genai names a type for a GET's empty body too)
            assert lean_headers.get(name) == sdk_headers.get(name), name
    assert lean_headers["authorization"] == f"Bearer {TOKEN}"
    assert lean_headers.get("x-goog-user-project") == quota


# -- requests and answers -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("quota", [None, QUOTA])
async def test_each_gemini_request_is_google_genais_own_and_its_answer_the_same_completion(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch,
        quota: str | None) -> None:
    if quota:  # google.auth.default() gives the credentials this quota project, which google-genai sends
        monkeypatch.setenv("GOOGLE_CLOUD_QUOTA_PROJECT", quota)
    url, answer, seen = scripted
    answer.update(status=200, body=json.dumps(ANSWER).encode())
    for model, params in GEMINI_CASES:
        seen.clear()
        lean, sdk = both(url)
        got, expected = await outcome(lean, model, params), await outcome(sdk, model, params)
        assert isinstance(got, Completion) and isinstance(expected, Completion), (got, expected)
        lean_sent, sdk_sent = seen
        same_request(lean_sent, sdk_sent, quota)
        assert lean_sent["path"] == (f"/v1/projects/{PROJECT}/locations/{LOCATION}/publishers/google/models/"
                                     f"{model}:generateContent")
        assert headers_of(lean_sent)["x-server-timeout"] == headers_of(sdk_sent)["x-server-timeout"] == "10"
        assert json.loads(lean_sent["body"]) == camel(json.loads(sdk_sent["body"])), params
        for field in ("text", "thinking", "finish_reason", "input_tokens", "output_tokens", "cached_tokens",
                      "reasoning_tokens", "tier"):
            assert getattr(got, field) == getattr(expected, field), field
    assert (got.text, got.thinking, got.output_tokens) == ("4", "thinking...", 8)
    assert got.raw == ANSWER, "the answer's own JSON is kept (the SDK's adds its own fields)"


@pytest.mark.parametrize("quota", [None, QUOTA])
async def test_each_claude_request_is_anthropic_vertexs_own_and_its_answer_the_same_completion(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch,
        quota: str | None) -> None:
    if quota:  # AsyncAnthropicVertex sends no quota project, whatever the credentials say: neither does the wire
        monkeypatch.setenv("GOOGLE_CLOUD_QUOTA_PROJECT", quota)
    url, answer, seen = scripted
    answer.update(status=200, body=json.dumps(MESSAGE).encode())
    for model, asked, marked in CLAUDE_CASES:
        seen.clear()
        params = capabilities.shape("anthropic", model.replace("@", "-"), asked).params
        lean, sdk = both(url)
        messages = MESSAGES
        if marked:
            messages, params = lean.mark_prompt_cache(model, MESSAGES, params,
                                                      CacheMarks(cuts=((0, len("Be brief.")),), group="g"))
        got, expected = await outcome(lean, model, params, messages), await outcome(sdk, model, params, messages)
        assert isinstance(got, Completion) and isinstance(expected, Completion), (got, expected)
        lean_sent, sdk_sent = seen
        same_request(lean_sent, sdk_sent, None)
        assert lean_sent["path"] == (f"/v1/projects/{PROJECT}/locations/{LOCATION}/publishers/anthropic/models/"
                                     f"{model}:rawPredict")
        body = json.loads(lean_sent["body"])
        assert body == json.loads(sdk_sent["body"]), (model, params)
        assert body["anthropic_version"] == "vertex-2023-10-16" and "model" not in body
        for field in ("text", "thinking", "finish_reason", "input_tokens", "output_tokens", "cached_tokens",
                      "cache_write_tokens", "rate", "raw"):
            assert getattr(got, field) == getattr(expected, field), field
    assert (got.text, got.thinking, got.input_tokens) == ("C", "hmm", 18)


async def test_the_probe_asks_the_publisher_model_as_google_genai_did(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOOGLE_CLOUD_QUOTA_PROJECT", QUOTA)
    url, answer, seen = scripted
    answer.update(status=200, body=b'{"name": "publishers/google/models/x"}')
    for provider in both(url):
        await provider.start()
        try:
            await provider.probe(GEMINI)
            await provider.probe(CLAUDE)
        finally:
            await provider.aclose()
    lean_gemini, lean_claude, sdk_gemini, sdk_claude = seen
    same_request(lean_gemini, sdk_gemini, QUOTA)
    same_request(lean_claude, sdk_claude, QUOTA)
    assert [r["path"] for r in seen] == [f"/v1/publishers/google/models/{GEMINI}",
                                         "/v1/publishers/anthropic/models/claude-haiku-4-5"] * 2
    assert all(r["method"] == "GET" and r["body"] == b"" for r in seen)


def claude_error(kind: str, message: str) -> bytes:
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()


UNAUTHENTICATED = status_body(401, "UNAUTHENTICATED", "Request had invalid authentication credentials.")
ERRORS: list[tuple[int, bytes, dict[str, str]]] = [
    (400, status_body(400, "INVALID_ARGUMENT", 'Unknown name "foo"'), {}),
    (400, claude_error("invalid_request_error", "max_tokens: Field required"), {}),
    (401, UNAUTHENTICATED, {}),
    (403, status_body(403, "PERMISSION_DENIED", "Permission 'aiplatform.endpoints.predict' denied"), {}),
    (404, status_body(404, "NOT_FOUND", "Publisher Model `x` was not found"), {}),
    (408, status_body(408, "DEADLINE_EXCEEDED", "slow"), {}),
    (429, status_body(429, "RESOURCE_EXHAUSTED", "Quota exceeded", RETRY), {}),
    (429, status_body(429, "RESOURCE_EXHAUSTED", "Quota exceeded"), {"retry-after": "2"}),
    (429, claude_error("rate_limit_error", "slow down"), {"retry-after-ms": "1500"}),
    (500, status_body(500, "INTERNAL", "oops"), {}),
    (502, b"<html>bad gateway</html>", {}),
    (503, status_body(503, "UNAVAILABLE", "overloaded"), {}),
    (529, claude_error("overloaded_error", "Overloaded"), {}),
]


@pytest.mark.parametrize("model", [GEMINI, CLAUDE])
@pytest.mark.parametrize(("code", "body", "headers"), ERRORS)
async def test_each_error_answer_is_the_same_error_on_both_paths(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]], model: str, code: int, body: bytes,
        headers: dict[str, str]) -> None:
    url, answer, _ = scripted
    answer.update(status=code, body=body, headers=headers)
    if not body.startswith(b"{"):
        answer["content_type"] = "text/html"
    lean, sdk = both(url)
    got, expected = await outcome(lean, model, {"max_tokens": 5}), await outcome(sdk, model, {"max_tokens": 5})
    assert described(got) == described(expected)
    assert TOKEN not in str(got)
    if code in (401, 403):
        assert isinstance(got, AuthError) and "GOOGLE_APPLICATION_CREDENTIALS" in str(got)
    elif code == 429:
        assert isinstance(got, RateLimited | QuotaExceeded) and got.retry_after in (13.0, 2.0, 1.5, None)
    elif code >= 500 or code == 408:
        assert isinstance(got, TransientError) and got.status == code
    else:
        assert isinstance(got, BadRequest)


@pytest.mark.parametrize("model", [GEMINI, CLAUDE])
@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b'{"content": 3}', b"{}"])
async def test_a_malformed_answer_is_the_same_error(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]], model: str, body: bytes) -> None:
    url, answer, _ = scripted
    answer.update(status=200, body=body)
    lean, sdk = both(url)
    got, expected = await outcome(lean, model, {"max_tokens": 5}), await outcome(sdk, model, {"max_tokens": 5})
    assert described(got) == described(expected)
    assert isinstance(got, TransientError) and got.error_class == "malformed_response"


async def test_refused_credentials_are_the_same_error_before_any_request(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]],
        token_server: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
    url, answer, seen = scripted
    token_answer, _ = token_server
    token_answer.update(status=400, body=b'{"error": "invalid_grant", "error_description": "Token has been revoked."}')
    for model in (GEMINI, CLAUDE):
        lean, sdk = both(url)
        got, expected = await outcome(lean, model, {"max_tokens": 5}), await outcome(sdk, model, {"max_tokens": 5})
        assert described(got) == described(expected)
        assert isinstance(got, AuthError) and str(got).startswith(f"vertex:{model}: Google refused to refresh")
    assert seen == []


# -- Google's tokens ----------------------------------------------------------------------------------------------

async def test_a_token_about_to_expire_is_refreshed_once_off_the_loop_for_every_request_in_flight(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]],
        token_server: tuple[dict[str, Any], list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch) -> None:
    from runner.providers import google_tokens

    url, answer, seen = scripted
    token_answer, token_requests = token_server
    answer.update(status=200, body=json.dumps({**ANSWER, **MESSAGE}).encode())
    threads = []
    refresh = google_tokens._refresh

    def recorded(credentials: Any) -> None:
        threads.append(threading.current_thread())
        refresh(credentials)

    monkeypatch.setattr(google_tokens, "_refresh", recorded)
    provider = VertexProvider(settings(url))
    await provider.start()
    try:
        assert token_requests == []  # loaded, not yet fetched
        await provider.execute(GEMINI, MESSAGES, {"max_tokens": 5})
        await provider.execute(CLAUDE, MESSAGES, {"max_tokens": 5})
        assert len(token_requests) == 1
        # a minute left: inside google-auth's refresh threshold (a few minutes), so stale for the next request
        assert provider.credentials is not None
        provider.credentials.expiry = (datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
                                       + datetime.timedelta(minutes=1))
        token_answer["body"] = json.dumps({"access_token": "ya29.second", "expires_in": 3600,
                                           "token_type": "Bearer"}).encode()
        seen.clear()
        results = await asyncio.gather(*(provider.execute(GEMINI if i % 2 else CLAUDE, MESSAGES, {"max_tokens": 5})
                                          for i in range(24)))
        assert all(isinstance(result, Completion) for result in results)
    finally:
        await provider.aclose()
    assert len(token_requests) == 2, "one refresh for all 24 requests"
    assert {headers_of(request)["authorization"] for request in seen} == {"Bearer ya29.second"}
    assert len(seen) == 24 and provider.tokens is not None and provider.tokens.refreshes == 2
    assert threads and all(thread is not threading.main_thread() for thread in threads)


async def test_the_probe_s_provider_and_the_run_s_share_the_credentials_and_their_token(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]],
        token_server: tuple[dict[str, Any], list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """runner submit's providers (the probe's, then the run's) load the credentials once and fetch one token
    (google_tokens.default_credentials), as long as nothing they come from changes; another key file is loaded."""
    url, answer, seen = scripted
    _, token_requests = token_server
    answer.update(status=200, body=json.dumps(ANSWER).encode())
    probed, run = VertexProvider(settings(url)), VertexProvider(settings(url))
    for provider in (probed, run):
        await provider.start()
    try:
        await probed.probe(GEMINI)
        await run.execute(GEMINI, MESSAGES, {"max_tokens": 5})
    finally:
        for provider in (probed, run):
            await provider.aclose()
    assert run.credentials is probed.credentials and len(token_requests) == 1 and len(seen) == 2
    key = json.loads(Path(os.environ["GOOGLE_APPLICATION_CREDENTIALS"]).read_text())
    other = tmp_path / "other-key.json"
    other.write_text(json.dumps({**key, "client_email": "other@sim-project.iam.gserviceaccount.com"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(other))
    changed = VertexProvider(settings(url))
    assert isinstance(await outcome(changed, GEMINI, {"max_tokens": 5}), Completion)
    assert changed.credentials is not run.credentials and len(token_requests) == 2
    assert changed.credentials.service_account_email.startswith("other@")  # type: ignore[union-attr]


def test_gcloud_s_application_default_file_is_loaded_again_once_it_changes(tmp_path: Path) -> None:
    """Credentials from ``gcloud auth application-default login``'s file (in CLOUDSDK_CONFIG, which _local_only
    points into tmp_path) are loaded once while the file stays the same, and again once gcloud rewrites it."""
    from runner.providers.google_tokens import default_credentials

    adc = tmp_path / "gcloud" / "application_default_credentials.json"
    adc.parent.mkdir(exist_ok=True)

    def login(refresh_token: str, mtime_ns: int) -> None:
        adc.write_text(json.dumps({"type": "authorized_user", "client_id": "id.apps.googleusercontent.com",
                                   "client_secret": "simulated", "refresh_token": refresh_token}))
        os.utime(adc, ns=(mtime_ns, mtime_ns))

    login("first-login", 10**18)
    first = default_credentials(["https://www.googleapis.com/auth/cloud-platform"])
    assert default_credentials(["https://www.googleapis.com/auth/cloud-platform"]) is first
    login("second-login", 10**18 + 10**9)
    second = default_credentials(["https://www.googleapis.com/auth/cloud-platform"])
    assert second is not first and second.refresh_token == "second-login"  # type: ignore[attr-defined]


async def test_nothing_of_the_credentials_is_in_the_settings_or_an_error(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]]) -> None:
    url, answer, _ = scripted
    answer.update(status=401, body=UNAUTHENTICATED)
    provider = VertexProvider(settings(url))
    got = await outcome(provider, GEMINI, {"max_tokens": 5})
    assert isinstance(got, AuthError)
    dumped = provider.settings.model_dump_json()
    for text in (str(got), dumped, repr(provider.tokens), provider.where):
        assert TOKEN not in text and "PRIVATE KEY" not in text


# -- where the wire goes, and where the SDKs stay ------------------------------------------------------------------

@pytest.mark.parametrize("location", ["global", "us", "eu", "us-east5", "europe-west4"])
async def test_the_host_of_a_location_is_the_one_both_sdks_pick(token_server: Any, location: str) -> None:
    import anthropic
    from google import genai

    provider = VertexProvider(settings(None, location=location))
    await provider.start()  # the wires, no request
    try:
        assert provider.gemini.wire is not None and provider.claude.wire is not None
        client = genai.Client(vertexai=True, project=PROJECT, location=location, credentials=provider.credentials)
        sdk_root = str(client._api_client._http_options.base_url).rstrip("/")
        assert default_root(location) == sdk_root
        assert f"https://{provider.gemini.wire.host}" == sdk_root and provider.gemini.wire.prefix == "/v1"
        claude = anthropic.AsyncAnthropicVertex(region=location, project_id=PROJECT, access_token="x")
        assert str(claude.base_url).rstrip("/") == f"{sdk_root}/v1" == (
            f"https://{provider.claude.wire.host}{provider.claude.wire.prefix}")
        assert provider.where == f"vertex at {sdk_root.removeprefix('https://')}"
        assert provider.sent_with(GEMINI) == provider.sent_with(CLAUDE) == LEAN_WIRE
        assert provider.sent_with(GEMINI, batch=True) != LEAN_WIRE
    finally:
        await provider.aclose()


@pytest.mark.parametrize(("variables", "gemini_sdk", "claude_sdk"), [
    ({"HTTPS_PROXY": "http://127.0.0.1:9"}, True, True),
    ({"HTTPS_PROXY": "http://127.0.0.1:9", "NO_PROXY": "us-east5-aiplatform.googleapis.com"}, False, False),
    ({"HTTP_PROXY": "http://127.0.0.1:9"}, False, False),  # a proxy for the other scheme
    ({"GOOGLE_API_USE_CLIENT_CERTIFICATE": "true"}, True, False),  # only google-genai presents one
    ({}, False, False),
])
async def test_where_a_proxy_applies_the_sdks_are_kept(token_server: Any, monkeypatch: pytest.MonkeyPatch,
                                                       variables: dict[str, str], gemini_sdk: bool,
                                                       claude_sdk: bool) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    provider = VertexProvider(settings(None))
    await provider.start()  # builds clients or wires; sends nothing
    try:
        assert (provider.gemini.wire is None) is gemini_sdk
        assert (type(provider.gemini._client).__name__ == "Client") is gemini_sdk
        assert (provider.claude.wire is None) is claude_sdk
        assert provider.claude._client is None  # Claude's SDK client waits for its first use either way
    finally:
        await provider.aclose()


async def test_with_a_batch_folder_google_genai_is_built_at_start_and_requests_still_go_over_the_wire(
        token_server: Any) -> None:
    """Batch prediction reads google-genai's client without awaiting: built by start (in a worker thread) where
    the job may send batches; the online requests still take the wire."""
    provider = VertexProvider(settings(None, batch_folder="gs://bucket/runs"))
    await provider.start()
    try:
        assert type(provider.gemini._client).__name__ == "Client"
        assert provider.gemini.wire is not None and provider.claude.wire is not None
        assert provider.sent_with(GEMINI) == LEAN_WIRE
    finally:
        await provider.aclose()


# -- the strict simulated server ------------------------------------------------------------------------------------

async def test_the_strict_servers_vertex_routes_take_every_lean_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                        private_key: str) -> None:  # noqa: F811
    """simserver/vertex.py checks each Gemini body against generativelanguage's published fields and each Claude
    body against the SDK's types, Vertex's own rules and the capability table: a field sent wrongly is a 400."""
    async with await start_server() as srv:
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS",
                           str(credentials_file(tmp_path, srv.root_url + "/token", private_key)))
        provider = VertexProvider(settings(srv.root_url))
        await provider.start()
        try:
            for model, params in GEMINI_CASES:
                if "cached_content" not in params:
                    assert isinstance(await provider.execute(model, MESSAGES, params), Completion)
            for model, asked, marked in CLAUDE_CASES:
                params = capabilities.shape("anthropic", model.replace("@", "-"), asked).params
                messages = MESSAGES
                if marked:
                    messages, params = provider.mark_prompt_cache(model, MESSAGES, params,
                                                                  CacheMarks(cuts=((0, 9),), group="g"))
                assert (await provider.execute(model, messages, params)).text
            await provider.probe(GEMINI)
        finally:
            await provider.aclose()
        stats = srv.stats()
    assert provider.gemini._client is None and provider.claude._client is None, "no SDK was needed"
    assert stats["by_status"] == {"200": 9}  # (the probe's lookup is not a model request)
    assert stats["by_route"]["vertex-gemini"] == 4 and stats["by_route"]["vertex-anthropic"] == 5
