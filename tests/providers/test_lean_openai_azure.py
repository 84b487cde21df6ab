"""``openai:`` and ``azure-openai:`` over the lean wire (``runner/providers/lean_http.py``) against the openai SDK
path they replace online (``AsyncOpenAI``, ``AsyncAzureOpenAI``), both sent to one scripted server: the same URL
(Azure's deployment path and ``api-version`` query), auth headers and body for each request (the body also checked
against the SDK's own ``CompletionCreateParams`` types), and the same error for each error answer (a refused key
naming its variable, Retry-After, the flex tier's "429 Resource Unavailable"). The strict simulated server's checks
against OpenAI's published OpenAPI document run through the lean path in tests/providers/test_providers.py and
tests/providers/test_azure_openai.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, ClassVar, get_type_hints

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
from runner.providers.azure_openai import AzureOpenAIProvider
from runner.providers.base import Completion, ProviderSettings
from runner.providers.openai_chat import OpenAIChatProvider
from tests.helpers import scripted_server

KEY = "sk-test-key"
VERSION = "2025-04-01-preview"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Which number is 2 plus one?"}]
ANSWER = {"id": "c1", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini", "service_tier": "flex",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "3"}, "finish_reason": "stop"}],
          "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13,
                    "prompt_tokens_details": {"cached_tokens": 4}}}
PARAMS: list[dict[str, Any]] = [
    {"max_tokens": 5, "temperature": 0},
    {"max_tokens": 50, "temperature": 0.5, "top_p": 0.9, "stop": ["\n\n"], "seed": 3, "presence_penalty": 0.1,
     "frequency_penalty": 0.2, "logprobs": True, "response_format": {"type": "json_object"}, "service_tier": "flex",
     "prompt_cache_key": "group-1"},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "strict": True, "schema": {
        "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
        "additionalProperties": False}}}, "reasoning": {"effort": "low"}, "service_tier": "priority"},
]


class SDKOpenAI(OpenAIChatProvider):
    lean_wire: ClassVar[bool] = False


class SDKAzure(AzureOpenAIProvider):
    lean_wire: ClassVar[bool] = False


@pytest.fixture(autouse=True)
def _environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "AZURE_OPENAI_API_KEY"):
        monkeypatch.setenv(name, KEY)
    monkeypatch.setenv("OPENAI_ORG_ID", "org-1")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-1")
    for name in ("OPENAI_BASE_URL", "OPENAI_CUSTOM_HEADERS", "AZURE_OPENAI_AD_TOKEN", "AZURE_OPENAI_ENDPOINT",
                 "OPENAI_API_VERSION", "HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY",
                 "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def scripted() -> AsyncIterator[tuple[str, dict[str, Any], list[dict[str, Any]]]]:
    async with scripted_server() as served:
        yield served


def both(kind: str, url: str) -> tuple[OpenAIChatProvider, OpenAIChatProvider]:
    if kind == "openai":
        settings = ProviderSettings(base_url=url + "/v1", timeout=10)
        return OpenAIChatProvider(settings), SDKOpenAI(settings)
    settings = ProviderSettings.model_validate({"base_url": url + "/openai", "api_version": VERSION, "timeout": 10})
    return AzureOpenAIProvider(settings), SDKAzure(settings)


async def outcome(provider: OpenAIChatProvider, params: dict[str, Any]) -> Completion | ProviderError:
    await provider.start()
    try:
        return await provider.execute("gpt-4o-mini", MESSAGES, params)
    except ProviderError as exc:
        return exc
    finally:
        await provider.aclose()


def described(error: Any) -> tuple[Any, ...]:
    assert isinstance(error, ProviderError), error
    return (type(error).__name__, str(error), error.status, error.error_class, getattr(error, "retry_after", None))


def lower(headers: dict[str, str]) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


@pytest.mark.parametrize("kind", ["openai", "azure-openai"])
async def test_each_request_is_the_sdks_own_and_its_answer_the_same_completion(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]], kind: str) -> None:
    url, answer, seen = scripted
    answer.update(status=200, body=json.dumps(ANSWER).encode(), headers={"x-ratelimit-remaining-requests": "99"})
    for params in PARAMS:
        seen.clear()
        lean, sdk = both(kind, url)
        got, expected = await outcome(lean, params), await outcome(sdk, params)
        assert isinstance(got, Completion) and isinstance(expected, Completion), (got, expected)
        lean_sent, sdk_sent = seen
        assert lean_sent["method"] == sdk_sent["method"] == "POST"
        assert lean_sent["path"] == sdk_sent["path"] == (
            "/v1/chat/completions" if kind == "openai"
            else f"/openai/deployments/gpt-4o-mini/chat/completions?api-version={VERSION}")
        assert json.loads(lean_sent["body"]) == json.loads(sdk_sent["body"]), params
        ours, theirs = lower(lean_sent["headers"]), lower(sdk_sent["headers"])
        auth = ("authorization", "openai-organization", "openai-project") if kind == "openai" else ("api-key",)
        assert {name: ours.get(name) for name in auth} == {name: theirs.get(name) for name in auth}
        assert (ours.get("authorization") or ours["api-key"]).endswith(KEY)
        assert ours["content-type"] == "application/json"
        for field in ("text", "finish_reason", "input_tokens", "output_tokens", "cached_tokens", "tier", "raw"):
            assert getattr(got, field) == getattr(expected, field), field
        assert got.rate == expected.rate
    assert (got.text, got.tier, got.cached_tokens) == ("3", "flex", 4)


@pytest.mark.parametrize("params", PARAMS)
def test_the_lean_body_validates_against_the_sdks_request_types(params: dict[str, Any]) -> None:
    """openai's ``CompletionCreateParamsNonStreaming`` (a TypedDict the SDK's ``create`` is typed by): every field of
    the body is one of its keys, and pydantic validates the body against it."""
    import pydantic
    from openai.types.chat import completion_create_params

    typed = completion_create_params.CompletionCreateParamsNonStreaming
    for provider in (OpenAIChatProvider(ProviderSettings()),
                     AzureOpenAIProvider(ProviderSettings.model_validate({"api_version": VERSION}))):
        body = provider.request_body("gpt-4o-mini", MESSAGES, params)
        assert set(body) <= set(get_type_hints(typed)), set(body) - set(get_type_hints(typed))
        pydantic.TypeAdapter(typed).validate_python(body)


def error_json(code: str | None, message: str, kind: str = "invalid_request_error") -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()


@pytest.mark.parametrize(("status", "body", "headers", "error"), [
    (400, error_json("unsupported_parameter", "Unsupported parameter: 'top_p'"), {}, BadRequest),
    (400, error_json("content_filter", "filtered"), {}, BadRequest),
    (401, error_json("invalid_api_key", "Incorrect API key provided: sk-te***key"), {}, AuthError),
    (403, error_json(None, "forbidden"), {}, AuthError),
    (404, error_json("DeploymentNotFound", "The API deployment for this resource does not exist."), {}, BadRequest),
    (429, error_json("rate_limit_exceeded", "slow down", "requests"), {"retry-after": "2"}, RateLimited),
    (429, error_json("rate_limit_exceeded", "slow down", "requests"), {"retry-after-ms": "1500"}, RateLimited),
    (429, error_json("insufficient_quota", "You exceeded your current quota", "insufficient_quota"), {},
     QuotaExceeded),
    (429, error_json("resource_unavailable", "Resource Unavailable"), {}, FlexUnavailable),
    (500, b"Internal Server Error", {}, TransientError),
    (503, error_json(None, "overloaded", "server_error"), {}, TransientError),
])
@pytest.mark.parametrize("kind", ["openai", "azure-openai"])
async def test_each_error_answer_is_the_same_error_on_both_paths(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]], kind: str, status: int, body: bytes,
        headers: dict[str, str], error: type[ProviderError]) -> None:
    url, answer, _ = scripted
    answer.update(status=status, body=body, headers=headers)
    if not body.startswith(b"{"):
        answer["content_type"] = "text/plain"
    lean, sdk = both(kind, url)
    got, expected = await outcome(lean, {"max_tokens": 5}), await outcome(sdk, {"max_tokens": 5})
    assert described(got) == described(expected)
    assert type(got) is error and KEY not in str(got) and "sk-te" not in str(got)
    if error is AuthError:
        assert ("OPENAI_API_KEY" if kind == "openai" else "the variable AZURE_OPENAI_API_KEY") in str(got)
    if error is RateLimited:
        assert got.retry_after == (2.0 if "retry-after" in headers else 1.5)


async def test_an_entra_token_is_asked_for_each_request_and_sent_as_the_sdk_sends_it(
        scripted: tuple[str, dict[str, Any], list[dict[str, Any]]]) -> None:
    url, answer, seen = scripted
    answer.update(status=200, body=json.dumps(ANSWER).encode())
    tokens = iter(["token-1", "token-2", "token-3", "token-4"])

    async def token() -> str:
        return next(tokens)

    from runner.providers.lean_http import LeanWire

    for provider in both("azure-openai", url):
        # as start() sets them up with auth: entra, DefaultAzureCredential's token provider replaced
        provider.options.auth = "entra"
        provider.token_provider = token
        if provider.lean_wire:
            provider.wire = LeanWire(url + "/openai", "", 10, headers={}, error_of=provider._status_error)
        else:
            provider.client = provider._sdk_client()
        try:
            for _ in range(2):
                assert isinstance(await provider.execute("gpt-4o-mini", MESSAGES, {"max_tokens": 5}), Completion)
        finally:
            await provider.aclose()
    assert [lower(request["headers"]).get("authorization") for request in seen] == \
        ["Bearer token-1", "Bearer token-2", "Bearer token-3", "Bearer token-4"]
    assert not any("api-key" in lower(request["headers"]) for request in seen)


@pytest.mark.parametrize("kind", ["openai", "azure-openai"])
@pytest.mark.parametrize("variable", ["HTTPS_PROXY", "OPENAI_CUSTOM_HEADERS"])
async def test_where_a_proxy_or_custom_headers_apply_the_sdk_sends(monkeypatch: pytest.MonkeyPatch, kind: str,
                                                                   variable: str) -> None:
    settings = {"base_url": "https://api.example/v1"} if kind == "openai" else \
        {"base_url": "https://resource.example/openai", "api_version": VERSION}
    provider = (OpenAIChatProvider if kind == "openai" else AzureOpenAIProvider)(
        ProviderSettings.model_validate(settings))
    await provider.start()
    assert provider.wire is not None and provider._client is None
    await provider.aclose()
    monkeypatch.setenv(variable, "http://127.0.0.1:9" if variable == "HTTPS_PROXY" else "X-Extra: 1")
    monkeypatch.setenv("NO_PROXY", "")
    await provider.start()  # builds the SDK's client; sends nothing
    try:
        assert provider.wire is None and provider._client is not None
    finally:
        await provider.aclose()
