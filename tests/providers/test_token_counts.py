"""The providers' token-counting endpoints (runner/providers/token_counts.py) against the simulated server: each
provider's count of a prompt equals the input tokens its model route then bills for it (Anthropic on both its
paths, Gemini, Claude and Gemini on Vertex, Claude on Bedrock), what is asked leaves out what is not counted, the
strict server takes every body, and a count endpoint that fails raises the runner's error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runner.errors import BadRequest, TransientError
from runner.providers.anthropic_messages import AnthropicProvider
from runner.providers.base import Provider, ProviderSettings
from runner.providers.bedrock import BedrockProvider
from runner.providers.gemini import GeminiProvider
from runner.providers.openai_servers import SimProvider
from runner.providers.token_counts import count_key
from runner.providers.vertex import VertexProvider
from simserver import SimServer, start_server
from tests.helpers import isolated_aws
from tests.providers.test_vertex import _local_only, credentials_file, private_key  # noqa: F401 - fixtures

#: prompts whose mapping differs between formats: several system messages (joined), an assistant turn, non-ASCII
PROMPTS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "How many legs has a spider?"}],
    [{"role": "system", "content": "Answer with one letter."}, {"role": "system", "content": "Be brief."},
     {"role": "user", "content": "Which colour is the sky?\nA. green\nB. blue\nAnswer:"}],
    [{"role": "user", "content": "Say a word."}, {"role": "assistant", "content": "Word."},
     {"role": "user", "content": "新しい言葉を一つ " * 40}],
]

#: each provider, the model asked, and its settings beyond the server's address
CASES = {
    "anthropic": ("claude-haiku-4-5", {}),
    "anthropic-sdk": ("claude-haiku-4-5", {}),
    "gemini": ("gemini-2.0-flash", {}),
    "vertex-claude": ("claude-3-5-haiku@20241022", {"project": "sim-project", "location": "us-east5"}),
    "vertex-gemini": ("gemini-2.0-flash", {"project": "sim-project", "location": "us-east5"}),
    "bedrock-claude": ("us.anthropic.claude-3-5-haiku-20241022-v1:0", {}),
}


@pytest.fixture
async def srv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, private_key: str):  # noqa: F811 - the fixture
    async with await start_server() as server:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        monkeypatch.setenv("GEMINI_API_KEY", "test-key")
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS",
                           str(credentials_file(tmp_path, server.root_url + "/token", private_key)))
        isolated_aws(monkeypatch, tmp_path, "AKIDSIMULATEDCOUNTS")
        yield server


def provider_of(case: str, url: str, monkeypatch: pytest.MonkeyPatch) -> Provider:
    settings = ProviderSettings.model_validate({"base_url": url, "timeout": 5, **CASES[case][1]})
    if case == "anthropic-sdk":  # the SDK's path (where a proxy applies), not the lean wire
        monkeypatch.setattr(AnthropicProvider, "lean_wire", False)
    kind = case.split("-")[0]
    return {"anthropic": AnthropicProvider, "gemini": GeminiProvider, "vertex": VertexProvider,
            "bedrock": BedrockProvider}[kind](settings)


@pytest.mark.parametrize("case", list(CASES))
async def test_a_count_equals_the_input_tokens_the_server_then_bills(case: str, srv: SimServer,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    model = CASES[case][0]
    provider = provider_of(case, srv.root_url, monkeypatch)
    await provider.start()
    try:
        for messages in PROMPTS:
            params: dict[str, Any] = {"max_tokens": 8, "temperature": 0}
            request = provider.count_request(model, messages, params)
            assert request is not None
            json.dumps(request)  # JSON data: what the engine hashes into the key it stores the count under
            counted = await provider.count_tokens(model, request)
            billed = (await provider.execute(model, messages, params)).input_tokens
            assert counted == billed > 0, (case, messages)
    finally:
        await provider.aclose()
    stats = srv.stats()
    assert stats["count_tokens"]["received"] == len(PROMPTS)
    assert set(stats["count_tokens"]["by_digest"]) <= set(stats["completed_by_digest"]), "the same prompts"
    assert stats["received"] == len(PROMPTS), "count requests are not model requests"


def test_what_is_counted_leaves_out_what_is_not() -> None:
    """Two requests that differ only in what counts for nothing (sampling, the output cap, a seed) ask the same
    count, and share its key; another prompt or another model does not."""
    messages = PROMPTS[1]
    for provider, model in ((AnthropicProvider(ProviderSettings()), "claude-haiku-4-5"),
                            (GeminiProvider(ProviderSettings()), "gemini-2.0-flash"),
                            (BedrockProvider(ProviderSettings()), "anthropic.claude-3-5-haiku-20241022-v1:0")):
        one = provider.count_request(model, messages, {"max_tokens": 8, "temperature": 0})
        other = provider.count_request(model, messages, {"max_tokens": 8, "temperature": 1, "top_p": 0.5})
        assert one is not None and one == other
        assert "temperature" not in json.dumps(one) and "top_p" not in json.dumps(one)
        key = count_key(provider.name, None, model, one)
        assert key == count_key(provider.name, None, model, other)
        assert key != count_key(provider.name, None, model + "-x", one)
        assert key != count_key(provider.name, "http://127.0.0.1:1", model, one), "another server counts apart"
        changed = provider.count_request(model, [*messages[:-1], {"role": "user", "content": "Other?"}], {})
        assert changed is not None and count_key(provider.name, None, model, changed) != key
    anthropic = AnthropicProvider(ProviderSettings()).count_request("claude-haiku-4-5", messages, {"max_tokens": 8})
    assert set(anthropic) == {"model", "system", "messages"}, "no max_tokens: the endpoint refuses it"


def test_providers_without_a_count_endpoint_ask_nothing() -> None:
    """Bedrock's Converse models keep the byte bound; OpenAI's and the simulated server's counts are tiktoken's
    and the server's rule, with no call."""
    assert BedrockProvider(ProviderSettings()).count_request("amazon.nova-pro-v1:0", PROMPTS[0], {}) is None
    assert SimProvider(ProviderSettings()).count_request("gpt-test", PROMPTS[0], {}) is None


async def test_a_count_endpoint_that_fails_raises_the_runners_error(srv: SimServer,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    srv.configure(count_tokens=False)
    for case in ("anthropic", "gemini"):
        provider = provider_of(case, srv.root_url, monkeypatch)
        await provider.start()
        model = CASES[case][0]
        try:
            with pytest.raises(TransientError, match="server error 500"):
                await provider.count_tokens(model, provider.count_request(model, PROMPTS[0], {}) or {})
        finally:
            await provider.aclose()


async def test_the_strict_server_refuses_what_the_count_endpoint_does_not_take(srv: SimServer) -> None:
    """A Messages field the count endpoint has no place for (``max_tokens``) is refused, as the real one refuses
    it (the anthropic SDK's MessageCountTokensParams), so a request that passes here is one the API takes."""
    provider = AnthropicProvider(ProviderSettings(base_url=srv.root_url, timeout=5))
    await provider.start()
    try:
        request = {**(provider.count_request("claude-haiku-4-5", PROMPTS[0], {}) or {}), "max_tokens": 5}
        with pytest.raises(BadRequest, match="max_tokens: Extra inputs are not permitted"):
            await provider.count_tokens("claude-haiku-4-5", request)
    finally:
        await provider.aclose()
