"""Exact input tokens from the providers' own token-counting endpoints: what each is asked, how its answer is read,
and the key a count is kept under in the store (``token_counts``, runner/engine/exact_counts.py asks and keeps).

Which endpoint counts what (each call costs nothing and has a rate limit of its own, apart from the model's):

- Anthropic (``anthropic:``): ``POST /v1/messages/count_tokens`` with the Messages body less what is not counted
  (``max_tokens``, ``stop_sequences``, the sampling fields: the fields of the anthropic SDK's
  ``MessageCountTokensParams`` are model, messages, system, thinking, output_config, tools, tool_choice), answered
  ``{"input_tokens": N}`` (docs.claude.com/en/api/messages-count-tokens and
  docs.claude.com/en/docs/build-with-claude/token-counting, which say the figure is an estimate that "may differ by a
  small amount" and may include tokens Anthropic adds and does not bill);
- Claude on Vertex: the same body, with ``anthropic_version`` and the model in it, at
  ``.../publishers/anthropic/models/count-tokens:rawPredict`` (cloud.google.com/vertex-ai/generative-ai/docs/
  partner-models/claude/count-tokens), where ``AsyncAnthropicVertex``'s ``messages.count_tokens`` sends it;
- Claude on Bedrock: the runtime's CountTokens (``POST /model/{modelId}/count-tokens``, botocore's bedrock-runtime
  service model 2023-09-30) with ``input.invokeModel.body`` the InvokeModel body, answered ``{"inputTokens": N}``
  ("the token count that would be charged if the same input were sent to the model", its documentation says);
- Gemini (``gemini:``): ``POST /v1beta/models/{model}:countTokens`` with a ``generateContentRequest`` (the form that
  carries a system instruction; ``contents`` alone would leave it out), answered ``{"totalTokens": N, ...}``
  (ai.google.dev/api/tokens#method:-models.counttokens);
- Gemini on Vertex: ``:countTokens`` on the publisher model with ``contents``, ``systemInstruction`` and
  ``generationConfig`` (cloud.google.com/vertex-ai/docs/reference/rest/v1/projects.locations.publishers.models/
  countTokens), through google-genai's ``models.count_tokens`` in Vertex mode.

google-genai's local tokenizer (``google.genai.local_tokenizer.LocalTokenizer``) would count Gemini prompts with no
call, but it downloads its SentencePiece model from the internet on first use (``_local_tokenizer_loader`` fetches it
from raw.githubusercontent.com), which the runner cannot rely on: it is not used. Anthropic publishes no tokenizer.

What is asked is a pure function of the request (the task's messages and parameters as keyed, never a prompt-cache
mark), so two requests that differ only in what is not counted (temperature, seed, max_tokens) share one count.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import TYPE_CHECKING, Any

from runner.errors import TransientError

#: what a budget reserves over a count Anthropic's endpoint gave (directly or on Vertex): the documents call that
#: count an estimate that "may differ by a small amount" and give no bound, so 2 % and 16 tokens more is this
#: project's allowance (a judgement, not a documented figure), that a bill a little over the count stays within the
#: reservation (ARCHITECTURE.md, invariant 3)
ESTIMATE_MARGIN = (0.02, 16)


def with_estimate_margin(counted: int) -> int:
    """The input tokens to reserve for a prompt an estimating endpoint counted ``counted``."""
    share, tokens = ESTIMATE_MARGIN
    return counted + math.ceil(counted * share) + tokens

if TYPE_CHECKING:
    from .anthropic_messages import AnthropicProvider

__all__ = ["MESSAGES_COUNTED", "count_key", "gemini_count_fields", "messages_count_request", "read_count"]

#: the fields of a Messages request that the count endpoint takes and counts, as ``request_of`` builds them
MESSAGES_COUNTED = ("system", "messages", "thinking", "output_config")

_canonical = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode


def count_key(provider: str, base_url: str | None, model: str, request: dict[str, Any]) -> str:
    """The key a count is stored under: SHA-256 of the canonical JSON of the provider, the server it asked (its base
    URL; none: the provider's own), the model and what was counted."""
    text = _canonical({"base_url": base_url or "", "model": model, "provider": provider, "request": request})
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def messages_count_request(messages_api: AnthropicProvider, model: str, messages: list[dict[str, Any]],
                           params: dict[str, Any], *, name: str | None = None) -> dict[str, Any]:
    """The count body of a Messages request for ``model`` (shaped under ``name``, the model's Claude name where it
    differs: Bedrock's ids): the request's counted fields and the model."""
    kwargs, _ = messages_api.request_of(messages, params, name or model)
    return {"model": model, **{field: kwargs[field] for field in MESSAGES_COUNTED if field in kwargs}}


def gemini_count_fields(messages: list[dict[str, Any]], params: dict[str, Any]) -> dict[str, Any]:
    """A generateContent request's counted fields as JSON, as ``GeminiProvider.request_of`` maps the messages: the
    system messages joined as ``systemInstruction``, the others as ``contents`` (an assistant's role ``model``), and
    the response schema where one is asked for (its tokens may be counted as input)."""
    system = "\n\n".join(m["content"] for m in messages if m.get("role") == "system")
    fields: dict[str, Any] = {
        "contents": [{"role": "model" if m["role"] == "assistant" else "user", "parts": [{"text": m["content"]}]}
                     for m in messages if m.get("role") != "system"]}
    if system:
        fields["systemInstruction"] = {"parts": [{"text": system}]}
    response_format = params.get("response_format") or {}
    if response_format.get("type") in ("json_object", "json_schema"):
        config: dict[str, Any] = {"responseMimeType": "application/json"}
        schema = (response_format.get("json_schema") or {}).get("schema")
        if schema is not None:
            config["responseJsonSchema"] = schema
        fields["generationConfig"] = config
    return fields


def read_count(body: Any, field: str, where: str) -> int:
    """The count in a count endpoint's answer (``field`` of its JSON object): a whole number of tokens, else the
    answer is malformed (a ``TransientError``)."""
    value = body.get(field) if isinstance(body, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TransientError(f"{where}: the token count's answer has no {field}", error_class="malformed_response")
    return value
