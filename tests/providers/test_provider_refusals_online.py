"""What a provider refuses online reaches the user in the provider's words, and what the strict simulated server
refuses is what a job would have been refused by the real API.

Requests here skip the runner's shaping on purpose (the job file's validation refuses them before sending): they
show what a user would read if a request the API refuses ever went out (an API that changed under the runner, a
model the capability table does not know yet), and that the simulated server refuses them as the real APIs do.
"""

from __future__ import annotations

from typing import Any

import pytest

from runner.errors import BadRequest
from runner.providers.base import ProviderSettings, provider_class
from simserver import SimConfig, start_server

MESSAGES = [{"role": "system", "content": "Answer with a letter."}, {"role": "user", "content": "A. x\nB. y"}]


pytestmark = pytest.mark.usefixtures("provider_keys")


async def _send(provider: str, model: str, params: dict[str, Any], **settings: Any) -> Any:
    """One request as given (not shaped) through the provider's SDK to the strict simulated server; the completion
    or the error raised."""
    async with await start_server(SimConfig()) as srv:
        base = srv.url if provider == "openai" else srv.root_url
        instance = provider_class(provider)(ProviderSettings(base_url=base, timeout=5, **settings))
        await instance.start()
        try:
            return await instance.execute(model, MESSAGES, params)
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            return exc
        finally:
            await instance.aclose()


@pytest.mark.parametrize(("provider", "model", "params", "settings", "said"), [
    # OpenAI's reasoning models take their default temperature only
    ("openai", "o3", {"temperature": 0.0, "max_tokens": 100}, {},
     "(param temperature): Unsupported value: 'temperature' does not support 0"),
    # the OpenAPI document: at most 4 stop sequences
    ("openai", "gpt-4o", {"stop": ["a", "b", "c", "d", "e"], "max_tokens": 10}, {}, "(param stop)"),
    # anthropic-version 2026-10-21 takes no sampling parameters
    ("anthropic", "claude-3-5-haiku-20241022", {"temperature": 0.0, "max_tokens": 10},
     {"api_version": "2026-10-21"}, "400 invalid_request_error: temperature"),
    # Claude takes temperature 0 to 1
    ("anthropic", "claude-3-5-haiku-20241022", {"temperature": 1.5, "max_tokens": 10}, {},
     "400 invalid_request_error: temperature"),
    # Gemini: at most 5 stop sequences
    ("gemini", "gemini-2.0-flash", {"stop": ["a", "b", "c", "d", "e", "f"], "max_tokens": 10}, {},
     "400 INVALID_ARGUMENT: "),
])
async def test_an_online_refusal_keeps_the_providers_words(provider, model, params, settings, said):
    outcome = await _send(provider, model, params, **settings)
    assert isinstance(outcome, BadRequest), outcome
    assert outcome.error_class == "bad_request" and outcome.status == 400
    assert f"{provider}" in str(outcome) and said in str(outcome), str(outcome)


async def test_a_model_that_always_thinks_is_asked_for_its_thinking_text():
    """Claude Fable thinks whatever the job says, and omits the thinking text unless asked for a summary: the runner
    asks, so the result line keeps it."""
    completion = await _send("anthropic", "claude-fable-5-2", {"max_tokens": 1100})
    assert not isinstance(completion, Exception), completion
    assert completion.text and completion.thinking
    assert completion.text not in ("", None) and completion.reasoning_tokens > 0
