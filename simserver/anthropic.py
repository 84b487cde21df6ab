"""Anthropic Messages as the simulated server speaks it: ``POST /v1/messages``, key in ``x-api-key`` (or
``Authorization: Bearer``), ``anthropic-ratelimit-*`` headers, errors as ``{"type": "error", ...}``."""

from __future__ import annotations

import base64
import hashlib
import math
import os
import time
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from .buckets import Blocked, Bucket
from .model_rules import facts
from .wire import (
    Ask,
    Invalid,
    Thought,
    WireFormat,
    joined,
    positive_int,
    response,
    retry_headers,
    seconds_text,
    strings,
)

__all__ = ["ANTHROPIC", "AnthropicFormat"]


def _rfc3339(wall: float) -> str:
    """Anthropic's reset format, whole seconds rounded up: "2025-01-08T21:24:00Z"."""
    return datetime.fromtimestamp(math.ceil(wall), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_anthropic(body: Any, request: web.Request) -> Ask:
    if not isinstance(body, dict):
        raise Invalid("The request body must be a JSON object.")
    for name in ("model", "max_tokens", "messages"):
        if body.get(name) is None:
            raise Invalid(f"{name}: Field required")
    model, max_tokens, turns = body["model"], body["max_tokens"], body["messages"]
    if not isinstance(model, str) or not model:
        raise Invalid("model: Input should be a valid string")
    if not positive_int(max_tokens):
        raise Invalid("max_tokens: Input should be an integer greater than or equal to 1")
    if not isinstance(turns, list) or not turns:
        raise Invalid("messages: at least one message is required")
    messages = []
    if (system := body.get("system")) is not None:
        text = system if isinstance(system, str) else joined(system, "text", "text")
        if text is None:
            raise Invalid("system: Input should be a valid string or a list of text blocks")
        messages.append({"role": "system", "content": text})
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or turn.get("role") not in ("user", "assistant"):
            raise Invalid(f"messages.{i}.role: Input should be 'user' or 'assistant'")
        content = turn.get("content")
        text = content if isinstance(content, str) else joined(content, "text", "text")
        if text is None:
            raise Invalid(f"messages.{i}.content: the simulated server accepts only a string or text blocks")
        messages.append({"role": turn["role"], "content": text})
    stop = body.get("stop_sequences")
    if stop is not None and not strings(stop):
        raise Invalid("stop_sequences: Input should be a valid list of strings")
    if body.get("stream"):
        raise Invalid("stream: the simulated server does not support streaming")
    ask = Ask(model, messages, body.get("temperature"), max_tokens, body.get("top_p"), stop or None, None)
    _read_thinking(body, ask)
    return ask


def _read_thinking(body: dict[str, Any], ask: Ask) -> None:
    """``thinking`` ({type: enabled, budget_tokens}, {type: adaptive} with ``output_config.effort``, or disabled;
    a model that always thinks thinks without it), its ``display`` ("summarized" returns the thinking text,
    "omitted" an empty one; the default is the model's), and ``output_config.format`` (or the beta's
    ``output_format``) ``{type: json_schema, schema}``."""
    rules = facts("anthropic", ask.model)
    thinking = body.get("thinking")
    output_config = body.get("output_config")
    if output_config is not None and not isinstance(output_config, dict):
        raise Invalid("output_config: Input should be a valid dictionary")
    output_config = output_config or {}
    if thinking is not None:
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        if kind not in ("enabled", "adaptive", "disabled"):
            raise Invalid("thinking: Input tag does not match any of the expected tags: 'enabled', 'adaptive', "
                          "'disabled'")
        if kind == "enabled" and not positive_int(thinking.get("budget_tokens")):
            raise Invalid("thinking.enabled.budget_tokens: Field required")
        display = thinking.get("display")
        if display not in (None, "summarized", "omitted"):
            raise Invalid(f"thinking.{kind}.display: Input should be 'summarized' or 'omitted'")
        ask.thinking = kind != "disabled"
        ask.budget = thinking.get("budget_tokens") if kind == "enabled" else None
    else:
        display = None
        ask.thinking = rules.get("reasoning") == "always"
    effort = output_config.get("effort")
    if effort is not None and effort not in ("low", "medium", "high", "xhigh", "max"):
        raise Invalid("output_config.effort: Input should be 'low', 'medium', 'high', 'xhigh' or 'max'")
    ask.effort = effort
    omitted = bool(rules.get("thinking_omitted"))
    ask.show_thinking = ask.thinking and (display == "summarized" or (display is None and not omitted))
    fmt = output_config.get("format", body.get("output_format"))
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            raise Invalid("output_config.format: expected {\"type\": \"json_schema\", \"schema\": {...}}")
        ask.schema = fmt["schema"]


def _signature(ask: Ask, text: str) -> str:
    """A thinking block's signature: opaque to the client; here base64 of a hash of the model and the thinking."""
    return base64.b64encode(hashlib.sha256(f"{ask.model}\0{text}".encode()).digest()).decode()


def _usage(ask: Ask, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """Messages usage: ``input_tokens`` are those after the last cache breakpoint, the cached ones apart."""
    read = ask.cache.read if ask.cache else 0
    written = ask.cache.written if ask.cache else 0
    long = ask.cache.written_1h if ask.cache else 0
    usage: dict[str, Any] = {"input_tokens": prompt_tokens - read - written, "output_tokens": completion_tokens,
                             "cache_creation_input_tokens": written, "cache_read_input_tokens": read}
    if written:  # the split by lifetime (the 1-hour writes cost more)
        usage["cache_creation"] = {"ephemeral_5m_input_tokens": written - long, "ephemeral_1h_input_tokens": long}
    return usage


class AnthropicFormat(WireFormat):
    name = "anthropic"
    cache_rule = "anthropic"
    parse = staticmethod(_parse_anthropic)

    def new_headers(self) -> dict[str, str]:
        return {"request-id": "req_" + os.urandom(12).hex()}

    def key(self, request: web.Request) -> str:
        key = request.headers.get("x-api-key", "").strip()
        if key:
            return key
        auth = request.headers.get("Authorization", "")
        return auth[7:].strip() if auth.startswith("Bearer ") else ""

    def rate_headers(self, buckets: list[Bucket], headers: dict[str, str]) -> None:
        wall = time.time()
        for b in buckets:
            prefix = f"anthropic-ratelimit-{b.kind}-"
            headers[prefix + "limit"] = str(b.capacity)
            headers[prefix + "remaining"] = str(b.remaining())
            headers[prefix + "reset"] = _rfc3339(wall + b.full_in())

    @staticmethod
    def error(status: int, type_: str, message: str, headers: dict[str, str]) -> web.Response:
        body = {"type": "error", "error": {"type": type_, "message": message}, "request_id": headers["request-id"]}
        return response(status, body, headers)

    def missing_key(self, headers: dict[str, str]) -> web.Response:
        return self.error(401, "authentication_error", "x-api-key header is required", headers)

    def wrong_key(self, headers: dict[str, str]) -> web.Response:
        return self.error(401, "authentication_error", "invalid x-api-key", headers)

    def bad_request(self, message: str, param: str | None, headers: dict[str, str]) -> web.Response:
        return self.error(400, "invalid_request_error", message, headers)

    def limited(self, model: str, blocked: Blocked | None, retry: float, headers: dict[str, str]) -> web.Response:
        retry_headers(retry, headers)
        b = blocked.bucket if blocked else None
        what = f"{b.capacity} {b.kind.replace('-', ' ')} per minute" if b else "requests per minute"
        return self.error(429, "rate_limit_error",
                          f"This request would exceed the rate limit for your organization of {what} "
                          f"(model {model}). Please retry after {seconds_text(retry)} seconds.", headers)

    def quota(self, model: str, retry: float, headers: dict[str, str]) -> web.Response:
        # 402 billing_error is in Anthropic's documented error types; older accounts saw this text as a 400.
        return self.error(402, "billing_error", "Your credit balance is too low to access the Anthropic API. "
                          "Please go to Plans & Billing to upgrade or purchase credits.", headers)

    def server_error(self, headers: dict[str, str]) -> web.Response:
        return self.error(500, "api_error", "Internal server error", headers)

    def overloaded(self, headers: dict[str, str]) -> web.Response:
        return self.error(529, "overloaded_error", "Overloaded", headers)

    def answer(self, ask: Ask, text: str | None, finish: str, stop_hit: str | None, prompt_tokens: int,
               completion_tokens: int, thought: Thought | None = None, refusal: str | None = None) -> dict[str, Any]:
        if text is None:
            reason = "refusal"
        elif finish == "length":
            reason = "max_tokens"
        else:
            reason = "stop_sequence" if stop_hit is not None else "end_turn"
        content: list[dict[str, Any]] = []
        if thought is not None and (text is not None or refusal is not None):
            shown = thought.text if ask.show_thinking else ""  # display "omitted": an empty thinking, signed
            content.append({"type": "thinking", "thinking": shown, "signature": _signature(ask, thought.text)})
        if text is not None and (text or thought is None):  # thinking that filled the cap leaves no text block
            content.append({"type": "text", "text": text})
        body: dict[str, Any] = {
            "id": "msg_" + os.urandom(12).hex(),
            "type": "message",
            "role": "assistant",
            "model": ask.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": stop_hit,
            "usage": _usage(ask, prompt_tokens, completion_tokens),
        }
        if refusal is not None:
            body["stop_details"] = {"type": "refusal", "category": None, "explanation": None}
        if thought is not None:  # output_tokens includes them; the breakdown says how many were thinking
            body["usage"]["output_tokens_details"] = {"thinking_tokens": thought.tokens}
        return body


ANTHROPIC = AnthropicFormat()
