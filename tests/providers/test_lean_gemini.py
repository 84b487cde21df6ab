"""The gemini provider over the lean wire (``runner/providers/gemini_wire.py`` on ``lean_http.py``) against the
google-genai SDK path it replaces online, both sent to one scripted server: the same URL, key header and body for
each request (the body also checked against the SDK's own pydantic types, which forbid unknown fields), the same
completion for an answer, the same error for each error answer. The strict simulated server's checks against the
published definitions run through the lean path in tests/providers/test_providers.py and tests/simserver/."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from runner.errors import (
    AuthError,
    BadRequest,
    FlexUnavailable,
    ProviderError,
    QuotaExceeded,
    RateLimited,
    TransientError,
)
from runner.providers.base import Completion, ProviderSettings
from runner.providers.gemini import GeminiProvider
from runner.providers.gemini_wire import request_body
from tests.helpers import scripted_server

MODEL = "gemini-2.5-flash"
KEY = "gemini-test-key"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Which number is 2 plus one?"},
            {"role": "assistant", "content": "3"}, {"role": "user", "content": "And 3 plus one?"}]
ANSWER = {"candidates": [{"content": {"parts": [{"text": "thinking...", "thought": True}, {"text": "4"}],
                                      "role": "model"}, "finishReason": "STOP", "index": 0}],
          "usageMetadata": {"promptTokenCount": 20, "candidatesTokenCount": 1, "thoughtsTokenCount": 7,
                            "cachedContentTokenCount": 4, "totalTokenCount": 28},
          "modelVersion": MODEL, "responseId": "r1"}
#: parameter sets whose bodies the two paths must write alike
PARAMS: list[dict[str, Any]] = [
    {"max_tokens": 5, "temperature": 0},
    {"max_tokens": 50, "temperature": 0.5, "top_p": 0.9, "stop": ["\n\n"], "seed": 3, "presence_penalty": 0.1,
     "frequency_penalty": 0.2, "response_format": {"type": "json_object"}, "service_tier": "flex"},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {
        "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}},
     "reasoning": {"budget_tokens": 512}, "service_tier": "priority"},
    {"reasoning": {"effort": "none"}, "cached_content": "cachedContents/abc", "cached_messages": 1},
    {"reasoning": {"effort": "low"}, "_model": "gemini-3-pro-preview"},
]


class SDKGemini(GeminiProvider):
    """The gemini provider as it was before the lean wire: through google-genai."""

    async def start(self) -> None:
        self.client = self._sdk_client()


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    for name in ("GOOGLE_API_KEY", "GOOGLE_GEMINI_BASE_URL", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def scripted() -> AsyncIterator[tuple[str, dict[str, Any], list[dict[str, Any]]]]:
    async with scripted_server() as served:
        yield served


async def outcome(provider: GeminiProvider, params: dict[str, Any], model: str = MODEL) -> Completion | ProviderError:
    await provider.start()
    try:
        return await provider.execute(model, MESSAGES, params)
    except ProviderError as exc:
        return exc
    finally:
        await provider.aclose()


def both(url: str) -> tuple[GeminiProvider, GeminiProvider]:
    settings = ProviderSettings(base_url=url, timeout=10)
    return GeminiProvider(settings), SDKGemini(settings)


def camel(value: Any) -> Any:
    """``value`` with its keys in lowerCamelCase: google-genai 3.6.1 writes ``thinkingConfig``'s fields under their
    proto names (``thinking_budget``), which the API's JSON parsing takes as it takes the lowerCamelCase JSON names
    the REST reference documents (and the lean wire sends); the published definitions give both
    (simserver/published/gemini_fields.json)."""
    if isinstance(value, list):
        return [camel(item) for item in value]
    if not isinstance(value, dict):
        return value
    return {key.split("_")[0] + "".join(part.title() for part in key.split("_")[1:]): camel(item)
            for key, item in value.items()}


def described(error: Any) -> tuple[Any, ...]:
    assert isinstance(error, ProviderError), error
    return (type(error).__name__, str(error), error.status, error.error_class, getattr(error, "retry_after", None))


async def test_each_request_is_the_sdks_own_and_its_answer_the_same_completion(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]]) -> None:
    url, answer, seen = scripted
    answer.update(status=200, body=json.dumps(ANSWER).encode(), headers={"x-gemini-service-tier": "priority"})
    for case in PARAMS:
        seen.clear()
        params = {k: v for k, v in case.items() if k != "_model"}
        model = case.get("_model", MODEL)
        lean, sdk = both(url)
        got, expected = await outcome(lean, params, model), await outcome(sdk, params, model)
        assert isinstance(got, Completion) and isinstance(expected, Completion), (got, expected)
        lean_sent, sdk_sent = seen
        assert lean_sent["method"] == sdk_sent["method"] == "POST"
        assert lean_sent["path"] == sdk_sent["path"] == f"/v1beta/models/{model}:generateContent"
        assert lean_sent["headers"]["x-goog-api-key"] == sdk_sent["headers"]["x-goog-api-key"] == KEY
        assert json.loads(lean_sent["body"]) == camel(json.loads(sdk_sent["body"])), params
        for field in ("text", "thinking", "finish_reason", "input_tokens", "output_tokens", "cached_tokens",
                      "reasoning_tokens", "tier"):
            assert getattr(got, field) == getattr(expected, field), field
    assert (got.text, got.thinking, got.output_tokens, got.reasoning_tokens, got.tier) == ("4", "thinking...", 8, 7,
                                                                                          "priority")
    assert got.raw == ANSWER, "the answer's own JSON is kept"


@pytest.mark.parametrize("case", PARAMS)
def test_the_lean_body_validates_against_the_sdks_request_types(case: dict[str, Any]) -> None:
    """google-genai's types forbid unknown fields (extra="forbid") and take the API's camelCase names: the body's
    contents are Contents, and its generationConfig with the fields beside it a GenerateContentConfig."""
    from google.genai import types

    params = {k: v for k, v in case.items() if k != "_model"}
    body = request_body(MESSAGES, params, case.get("_model", MODEL))
    assert set(body) <= {"contents", "systemInstruction", "generationConfig", "cachedContent", "serviceTier"}
    for content in body["contents"]:
        types.Content.model_validate(content)
    config = {**body["generationConfig"], **{k: body[k] for k in ("systemInstruction", "cachedContent", "serviceTier")
                                              if k in body}}
    parsed = types.GenerateContentConfig.model_validate(config)
    assert parsed.candidate_count == 1
    if params.get("max_tokens"):
        assert parsed.max_output_tokens == params["max_tokens"]


def status_body(code: int, status: str, message: str, details: list[dict[str, Any]] | None = None) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message, "status": status}
    if details is not None:
        error["details"] = details
    return json.dumps({"error": error}).encode()


RETRY = [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "13s"}]
DAILY = [{"@type": "type.googleapis.com/google.rpc.QuotaFailure",
          "violations": [{"quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]}]
BAD_KEY = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID"}]


@pytest.mark.parametrize(("code", "body", "headers", "kind"), [
    (400, status_body(400, "INVALID_ARGUMENT", 'Unknown name "foo"'), {}, BadRequest),
    (400, status_body(400, "INVALID_ARGUMENT", "API key not valid.", BAD_KEY), {}, AuthError),
    (403, status_body(403, "PERMISSION_DENIED", "no"), {}, AuthError),
    (404, status_body(404, "NOT_FOUND", "models/x is not found"), {}, BadRequest),
    (408, status_body(408, "DEADLINE_EXCEEDED", "slow"), {}, TransientError),
    (429, status_body(429, "RESOURCE_EXHAUSTED", "slow down", RETRY), {}, RateLimited),
    (429, status_body(429, "RESOURCE_EXHAUSTED", "slow down"), {"retry-after": "2"}, RateLimited),
    (429, status_body(429, "RESOURCE_EXHAUSTED", "daily", DAILY), {}, QuotaExceeded),
    (500, status_body(500, "INTERNAL", "oops"), {}, TransientError),
    (502, b"<html>bad gateway</html>", {}, TransientError),
    (503, status_body(503, "UNAVAILABLE", "overloaded"), {}, TransientError),
])
async def test_each_error_answer_is_the_same_error_on_both_paths(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]], code: int, body: bytes, headers: dict[str, str],
        kind: type[ProviderError]) -> None:
    url, answer, _ = scripted
    answer.update(status=code, body=body, headers=headers)
    if not body.startswith(b"{"):
        answer["content_type"] = "text/html"
    lean, sdk = both(url)
    got, expected = await outcome(lean, {"max_tokens": 5}), await outcome(sdk, {"max_tokens": 5})
    assert described(got) == described(expected)
    assert type(got) is kind and KEY not in str(got)
    if kind is RateLimited:
        assert got.retry_after == (13.0 if b"RetryInfo" in body else 2.0)
    if kind is AuthError:
        assert "GEMINI_API_KEY or GOOGLE_API_KEY" in str(got)
    # a flex request shed with a 503 is the flex tier's refusal on both paths
    if code == 503:
        lean, sdk = both(url)
        got, expected = await outcome(lean, {"service_tier": "flex"}), await outcome(sdk, {"service_tier": "flex"})
        assert described(got) == described(expected) and isinstance(got, FlexUnavailable)


async def test_a_lapsed_cached_content_is_sent_again_whole_on_both_paths(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]]) -> None:
    url, answer, seen = scripted
    answer.update(status=404, body=status_body(404, "NOT_FOUND", "CachedContent not found (or permission denied)"))
    params = {"max_tokens": 5, "cached_content": "cachedContents/gone", "cached_messages": 1}
    for provider in both(url):
        seen.clear()
        got = await outcome(provider, params)
        assert isinstance(got, BadRequest) and got.status == 404  # the whole request found the same 404 here
        first, again = (json.loads(request["body"]) for request in seen)
        assert first["cachedContent"] == "cachedContents/gone" and "cachedContent" not in again
        assert again["systemInstruction"] == {"parts": [{"text": "Be brief."}], "role": "user"}
        assert provider.prompt_gone("cachedContents/gone")


async def test_where_a_proxy_applies_the_sdk_sends_and_the_probe_goes_over_the_wire(
        monkeypatch: pytest.MonkeyPatch, scripted: tuple[str, dict[str, Any], list[dict[str, Any]]]) -> None:
    url, answer, seen = scripted
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "")
    provider = GeminiProvider(ProviderSettings(base_url="https://generativelanguage.example"))
    await provider.start()  # builds the SDK's client; sends nothing
    try:
        assert provider.wire is None and type(provider._client).__name__ == "Client"
    finally:
        await provider.aclose()
    monkeypatch.delenv("HTTPS_PROXY")
    answer.update(status=404, body=status_body(404, "NOT_FOUND", "models/nope is not found"))
    provider = GeminiProvider(ProviderSettings(base_url=url))
    await provider.start()
    try:
        assert provider.wire is not None
        with pytest.raises(Exception, match="is not a model .* knows .*NOT_FOUND"):
            await provider.probe("nope")
    finally:
        await provider.aclose()
    assert seen[-1]["method"] == "GET" and seen[-1]["path"] == "/v1beta/models/nope"
    assert provider._client is None, "the SDK was never needed"
