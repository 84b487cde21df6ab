"""The lean wire (``runner/providers/lean_http.py``) against the OpenAI SDK path it replaces for ``sim``,
``openai-compatible``, ``ollama`` and ``vllm``: both are run against the same server answering the same way, and
must give the same completion or raise the same error class with the same message, status, error class and wait.

Two servers: the simulated one (its faults: 401, 429 with retry-after, insufficient quota, 500, 503, a malformed
body, a hang, a strict refusal, rate-limit headers) and a scripted aiohttp app in the test that answers every
request with one given status, body and headers (each status the mapping knows, JSON and non-JSON bodies)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest

from runner.errors import ModelSetupError, ProviderError, RateLimited, TransientError
from runner.providers.base import Completion, ProviderSettings
from runner.providers.openai_chat import OpenAIChatProvider
from runner.providers.openai_servers import OpenAICompatibleProvider, SimProvider
from runner.providers.presets import PRESETS
from simserver import SimConfig, start_server
from tests.helpers import scripted_server

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Which number is 2 plus one?"}]
PARAMS: dict[str, Any] = {"max_tokens": 5, "temperature": 0}


class SDKSim(SimProvider):
    """The simulated server's provider as it was before the lean wire: through the OpenAI SDK."""

    lean_wire: ClassVar[bool] = False


def both(url: str, timeout: float = 60.0) -> tuple[SimProvider, SimProvider]:
    settings = ProviderSettings(base_url=url, timeout=timeout)
    return SimProvider(settings), SDKSim(settings)


async def outcome(provider: OpenAIChatProvider, call: str = "execute", *args: Any) -> Completion | ProviderError:
    """What one call gives: its completion, or the runner's error it raised."""
    await provider.start()
    try:
        if call == "execute":
            return await provider.execute("gpt-test", MESSAGES, {**PARAMS, **(args[0] if args else {})})
        if call == "probe":
            await provider.probe(*args)
            raise AssertionError("the probe passed")
        return await provider.loglikelihood("gpt-test", [("The capital of France is", " Paris")])
    except ProviderError as exc:
        return exc
    finally:
        await provider.aclose()


def described(error: Any) -> tuple[Any, ...]:
    assert isinstance(error, ProviderError), error
    return (type(error).__name__, str(error), error.status, error.error_class, getattr(error, "retry_after", None))


def test_every_openai_format_provider_takes_the_lean_wire_and_only_the_local_ones_ignore_a_proxy() -> None:
    from runner.providers.azure_openai import AzureOpenAIProvider
    from runner.providers.openai_servers import _CompatibleEndpoint

    assert OpenAIChatProvider.lean_wire and AzureOpenAIProvider.lean_wire
    assert all(PRESETS[name].lean_wire for name in PRESETS)
    assert SimProvider.local_server and _CompatibleEndpoint.local_server
    assert PRESETS["ollama"].local_server and PRESETS["vllm"].local_server
    assert not OpenAIChatProvider.local_server and not AzureOpenAIProvider.local_server
    assert not any(PRESETS[name].local_server for name in ("openrouter", "together", "groq", "deepseek", "mistral",
                                                           "fireworks"))


async def test_an_answer_is_the_same_completion_and_sends_no_sdk_client() -> None:
    async with await start_server(SimConfig(rpm=6000, tpm=1_000_000)) as srv:
        lean, sdk = both(srv.url)
        got, expected = await outcome(lean), await outcome(sdk)
        assert lean._client is None  # nothing asked for the SDK: it was never built
        stats = srv.stats()
    assert isinstance(got, Completion) and isinstance(expected, Completion)
    assert (got.text, got.input_tokens, got.output_tokens, got.finish_reason) == \
        (expected.text, expected.input_tokens, expected.output_tokens, expected.finish_reason)
    assert got.text and got.input_tokens > 0
    assert {k: v for k, v in got.raw.items() if k not in ("id", "created")} == \
        {k: v for k, v in expected.raw.items() if k not in ("id", "created")}
    # the rate-limit headers are read as the SDK path reads them (the limits, the remaining counts, the resets)
    assert got.rate is not None and set(got.rate) == {"requests", "tokens"}
    assert got.rate["requests"].limit == expected.rate["requests"].limit == 6000
    assert got.rate["tokens"].limit == 1_000_000
    assert 5990 <= got.rate["requests"].remaining < 6000 and got.rate["requests"].reset is not None
    assert stats["by_status"].get("200") == 2


async def test_every_parameter_is_sent_as_the_strict_server_accepts_it() -> None:
    params = {"max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "presence_penalty": 0.1, "frequency_penalty": 0.2,
              "stop": ["\n\n"], "seed": 3, "logprobs": True, "response_format": {"type": "json_object"}}
    async with await start_server() as srv:
        got, expected = await outcome(SimProvider(ProviderSettings(base_url=srv.url)), "execute", params), \
            await outcome(SDKSim(ProviderSettings(base_url=srv.url)), "execute", params)
        assert srv.stats()["by_status"].get("200") == 2
    assert isinstance(got, Completion) and isinstance(expected, Completion) and got.text == expected.text


@pytest.mark.parametrize(("fault", "config"), [
    ("401", {"fault_401": 1.0}),
    ("429", {"fault_429": 1.0, "retry_after": 0.7}),
    ("quota", {"fault_quota": 1.0}),
    ("500", {"fault_500": 1.0}),
    ("503", {"fault_503": 1.0}),
    ("malformed", {"fault_malformed": 1.0}),
    ("filter", {"fault_filter": 1.0}),
    ("refusal", {"fault_refusal": 1.0}),
])
async def test_a_simulated_fault_is_the_same_error_on_both_paths(fault: str, config: dict[str, Any]) -> None:
    async with await start_server(SimConfig(**config)) as srv:
        lean, sdk = both(srv.url)
        got, expected = await outcome(lean), await outcome(sdk)
    assert described(got) == described(expected)
    if fault == "429":
        assert isinstance(got, RateLimited) and got.retry_after == pytest.approx(0.7)
    if fault == "malformed":
        assert got.error_class == "malformed_response"


async def test_a_request_the_strict_server_refuses_is_the_same_bad_request() -> None:
    async with await start_server() as srv:
        lean, sdk = both(srv.url)
        got, expected = await outcome(lean, "execute", {"max_tokens": 0}), \
            await outcome(sdk, "execute", {"max_tokens": 0})
    assert described(got) == described(expected)
    assert got.status == 400 and "max_tokens" in str(got)


async def test_a_timeout_is_the_same_transient_error() -> None:
    async with await start_server(SimConfig(fault_timeout=1.0, hang_seconds=3)) as srv:
        lean, sdk = both(srv.url, timeout=0.3)
        got, expected = await outcome(lean), await outcome(sdk)
    assert described(got) == described(expected)
    assert isinstance(got, TransientError) and got.error_class == "timeout" and "timed out after 0.3 s" in str(got)


async def test_a_server_that_is_not_there_is_the_same_connection_error() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    lean, sdk = both(url)
    got, expected = await outcome(lean), await outcome(sdk)
    assert described(got) == described(expected)
    assert got.error_class == "connection"


async def test_scoring_errors_are_the_same_on_both_paths() -> None:
    async with await start_server(SimConfig(fault_429=1.0, retry_after=0.25)) as srv:
        lean, sdk = both(srv.url)
        assert described(await outcome(lean, "score")) == described(await outcome(sdk, "score"))


async def test_probing_an_unknown_model_is_the_same_setup_error() -> None:
    async with await start_server(SimConfig(models="known-model")) as srv:
        messages = []
        for provider in both(srv.url):
            await provider.start()
            try:
                await provider.probe("known-model")
                with pytest.raises(ModelSetupError) as unknown:
                    await provider.probe("other/model")
                messages.append(str(unknown.value))
            finally:
                await provider.aclose()
    assert messages[0] == messages[1] and "is not a model" in messages[0] and "other/model" in messages[0]


# -- a scripted server: any status, any body ----------------------------------------------------------------------

@pytest.fixture
async def scripted() -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """A server answering every request with ``answer["status"]``, ``["body"]`` (bytes) and ``["headers"]``
    (``tests/helpers.scripted_server``), at its ``/v1``."""
    async with scripted_server() as (url, answer, _):
        yield f"{url}/v1", answer


def error_json(message: str, kind: str = "invalid_request_error", code: str | None = None,
               param: str | None = None) -> bytes:
    import json

    return json.dumps({"error": {"message": message, "type": kind, "code": code, "param": param}}).encode()


@pytest.mark.parametrize(("status", "body", "headers"), [
    (400, error_json("Unsupported parameter: 'top_p'", param="top_p", code="unsupported_parameter"), {}),
    (400, error_json("blocked", code="content_filter"), {}),
    (400, error_json("blocked", code="content_policy_violation"), {}),
    (401, error_json("Incorrect API key provided: sk-abc***", code="invalid_api_key"), {}),
    (403, error_json("not allowed", kind="permission_error"), {}),
    (404, error_json("The model does not exist", code="model_not_found"), {}),
    (408, error_json("timeout"), {}),
    (409, error_json("conflict"), {}),
    (413, b"request entity too large", {}),
    (422, b'{"detail": [{"loc": ["body", "messages"], "msg": "field required"}]}', {}),
    (429, error_json("slow down", kind="requests", code="rate_limit_exceeded"), {"retry-after-ms": "1500"}),
    (429, error_json("slow down", kind="tokens"), {"retry-after": "2"}),
    (429, error_json("no credit", kind="insufficient_quota", code="insufficient_quota"), {}),
    (500, b"Internal Server Error", {}),
    (502, b"<html>bad gateway</html>", {}),
    (503, error_json("overloaded", kind="server_error"), {}),
    (418, b"", {}),
])
async def test_each_status_is_the_same_error_on_both_paths(scripted: tuple[str, dict[str, Any]], status: int,
                                                           body: bytes, headers: dict[str, str]) -> None:
    url, answer = scripted
    answer.update(status=status, body=body, headers=headers)
    if not body.startswith(b"{"):
        answer["content_type"] = "text/plain"
    lean, sdk = both(url)
    got, expected = await outcome(lean), await outcome(sdk)
    assert described(got) == described(expected)
    assert got.status == status or (status == 429 and got.error_class == "quota")
    assert "sk-abc" not in str(got)


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b'"text"', b"", b"{}", b'{"id": "x", "choices": null}'])
async def test_a_malformed_success_body_is_the_same_error(scripted: tuple[str, dict[str, Any]], body: bytes) -> None:
    url, answer = scripted
    answer.update(status=200, body=body)
    lean, sdk = both(url)
    got, expected = await outcome(lean), await outcome(sdk)
    assert described(got) == described(expected)
    assert isinstance(got, TransientError) and got.error_class == "malformed_response"


async def test_rate_limit_headers_of_any_server_are_read_alike(scripted: tuple[str, dict[str, Any]]) -> None:
    import json

    url, answer = scripted
    answer.update(status=200, body=json.dumps({
        "choices": [{"message": {"role": "assistant", "content": "B"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 1}}).encode(),
        headers={"X-RateLimit-Limit-Requests": "500", "x-ratelimit-remaining-requests": "499",
                 "x-ratelimit-reset-requests": "120ms", "x-ratelimit-limit-tokens": "30000",
                 "x-ratelimit-remaining-tokens": "29000", "x-ratelimit-reset-tokens": "6m0s"})
    lean, sdk = both(url)
    got, expected = await outcome(lean), await outcome(sdk)
    assert isinstance(got, Completion) and isinstance(expected, Completion)
    assert got.rate == expected.rate
    assert got.rate["requests"].limit == 500 and got.rate["tokens"].reset == pytest.approx(360.0)
    assert got.rate["requests"].reset == pytest.approx(0.12) and got.rate["requests"].remaining == 499


async def test_an_openai_compatible_endpoint_probes_its_models_list(scripted: tuple[str, dict[str, Any]]) -> None:
    import json

    url, answer = scripted
    answer.update(status=200, body=json.dumps({"object": "list", "data": [{"id": "a"}, {"id": "b"}]}).encode())
    provider = OpenAICompatibleProvider(ProviderSettings(), {"mine": ProviderSettings(base_url=url)})
    await provider.start()
    try:
        await provider.probe("mine/a")
        with pytest.raises(ModelSetupError, match=r"does not serve c \(it lists a, b\)"):
            await provider.probe("mine/c")
        answer.update(status=404, body=b"Not Found")
        with pytest.raises(ModelSetupError, match="has no models endpoint"):
            await provider.probe("mine/a")
    finally:
        await provider.aclose()
