"""Batch lines as the SDKs put them on the wire, beside the online request for the same model: the same shaped
parameters (``capabilities.shape``, thinking in the model's own form) and, for Anthropic, the same pinned
``anthropic-version``. Recorded by the capture server of ``tests/providers/test_request_shaping.py`` (not the simulated
server, so that none of its assumptions are in the loop)."""

from __future__ import annotations

from typing import Any

import pytest

from runner.providers.base import ProviderSettings, provider_class
from runner.providers.batching import BatchLine
from runner.providers.capabilities import ANTHROPIC_DEFAULT_VERSION, shape
from tests.providers.test_request_shaping import ANTHROPIC_ANSWER, GEMINI_ANSWER, MESSAGES, Capture, camel

pytestmark = pytest.mark.usefixtures("provider_keys")


async def online_and_batch(provider: str, model: str, params: dict[str, Any], answer: dict[str, Any]
                           ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the online request, the batch creation request) captured for one shaped request."""
    shaped = shape(provider, model, params)
    assert not shaped.problems, shaped.problems
    async with Capture(answer) as capture:
        instance: Any = provider_class(provider)(ProviderSettings(base_url=capture.url, timeout=5))
        await instance.start()
        try:
            await instance.execute(model, MESSAGES, shaped.params)
            try:
                await instance.batches().submit(model, [BatchLine("line-1", MESSAGES, shaped.params)], label="r/s")
            except Exception:  # noqa: BLE001 - the capture's answer is no batch; the request is what is looked at
                pass
        finally:
            await instance.aclose()
    online, batch = capture.requests
    return online, batch


@pytest.mark.parametrize(("model", "params"), [
    ("claude-opus-4-7", {"reasoning": {"effort": "high"}, "max_tokens": 2000}),  # adaptive thinking only
    ("claude-sonnet-4-5", {"reasoning": {"budget_tokens": 2000}, "max_tokens": 4000}),
    ("claude-3-5-haiku-20241022", {"temperature": 0, "top_p": 0.9, "max_tokens": 8, "stop": ["\n"]}),
])
async def test_an_anthropic_batch_line_is_the_online_request_with_the_pinned_version(model: str,
                                                                                      params: dict) -> None:
    online, batch = await online_and_batch("anthropic", model, params, ANTHROPIC_ANSWER)
    assert batch["path"] == "/v1/messages/batches"
    assert batch["headers"]["anthropic-version"] == online["headers"]["anthropic-version"] \
        == ANTHROPIC_DEFAULT_VERSION
    [line] = batch["body"]["requests"]
    assert line["params"] == online["body"]


@pytest.mark.parametrize(("model", "params"), [
    ("gemini-3-pro-preview", {"reasoning": {"effort": "low"}, "max_tokens": 50}),  # a thinking level
    ("gemini-2.5-flash", {"reasoning": {"budget_tokens": 0}, "temperature": 0.3, "max_tokens": 9}),
])
async def test_a_gemini_batch_line_is_the_online_request(model: str, params: dict) -> None:
    online, batch = await online_and_batch("gemini", model, params, GEMINI_ANSWER)
    [line] = batch["body"]["batch"]["inputConfig"]["requests"]["requests"]
    assert camel(line["request"]["generationConfig"]) == camel(online["body"]["generationConfig"])
    assert camel(line["request"]["contents"]) == camel(online["body"]["contents"])
