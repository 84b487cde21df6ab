"""OpenAI Chat Completions as the simulated server speaks it: ``POST /v1/chat/completions``, key in
``Authorization: Bearer``, ``x-ratelimit-*`` headers for rpm and tpm, errors as ``{"error": {...}}``."""

from __future__ import annotations

import os
import time
from typing import Any

from aiohttp import web

from .buckets import PER_MINUTE, Blocked, Bucket
from .model_rules import facts
from .wire import Ask, Invalid, Thought, WireFormat, positive_int, response, retry_headers, seconds_text, strings

__all__ = ["OPENAI", "OpenAIFormat"]

_FINGERPRINT = "fp_simserver"


def _duration_text(seconds: float) -> str:
    """OpenAI's reset format: "20ms", "1s", "8.64s", "6m0s"."""
    if seconds < 1.0:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60.0)
    text = f"{seconds_text(rest)}s"
    return f"{int(minutes)}m{text}" if minutes else text


def _parse_openai(body: Any, request: web.Request) -> Ask:
    if not isinstance(body, dict):
        raise Invalid("The request body must be a JSON object.")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise Invalid("You must provide a model parameter.", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Invalid("Missing required parameter: 'messages'.", "messages")
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise Invalid("Each message must be an object with a 'role'.", "messages")
    if body.get("n") not in (None, 1):
        raise Invalid("The simulated server supports only n=1.", "n")
    if body.get("stream"):
        raise Invalid("The simulated server does not support streaming.", "stream")
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and not positive_int(value):
            raise Invalid(f"Invalid '{name}': expected an integer of at least 1.", name)
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str) and not strings(stop):
        raise Invalid("Invalid 'stop': expected a string or a list of strings.", "stop")
    ask = Ask(body["model"], messages, body.get("temperature"),
              body.get("max_completion_tokens", body.get("max_tokens")), body.get("top_p"), stop, body.get("seed"))
    _read_reasoning(body, ask)
    _read_response_format(body.get("response_format"), ask)
    return ask


_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def _read_reasoning(body: dict[str, Any], ask: Ask) -> None:
    """A reasoning model (this server's model rules: reasoning "default" or "always") thinks unless
    ``reasoning_effort`` is "none"; any model thinks when given another effort. The Chat Completions API returns
    no thinking text, only the reasoning tokens."""
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in _EFFORTS:
        raise Invalid(f"Invalid value: '{effort}'. Supported values are: "
                      + ", ".join(f"'{e}'" for e in _EFFORTS) + ".", "reasoning_effort")
    ask.effort = effort
    ask.thinking = effort != "none" and (effort is not None
                                         or facts("openai", ask.model).get("reasoning") in ("default", "always"))


def _read_response_format(value: Any, ask: Ask) -> None:
    """``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`` or ``{"type": "json_object"}``."""
    if value is None:
        return
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise Invalid("Invalid value for 'response_format.type': expected one of 'text', 'json_object' or "
                      "'json_schema'.", "response_format.type")
    if kind == "json_object":
        ask.json_object = True
    elif kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
            raise Invalid("Missing required parameter: 'response_format.json_schema.name'.",
                          "response_format.json_schema.name")
        schema = spec.get("schema", {})
        if not isinstance(schema, dict):
            raise Invalid("Invalid type for 'response_format.json_schema.schema': expected an object.",
                          "response_format.json_schema.schema")
        ask.schema = schema


class OpenAIFormat(WireFormat):
    name = "openai"
    cache_rule = "openai"
    parse = staticmethod(_parse_openai)

    def new_headers(self) -> dict[str, str]:
        return {"x-request-id": "req_" + os.urandom(12).hex()}

    def key(self, request: web.Request) -> str:
        auth = request.headers.get("Authorization", "")
        return auth[7:].strip() if auth.startswith("Bearer ") else ""

    def rate_headers(self, buckets: list[Bucket], headers: dict[str, str]) -> None:
        for b in buckets:
            if b.kind in ("requests", "tokens"):
                headers[f"x-ratelimit-limit-{b.kind}"] = str(b.capacity)
                headers[f"x-ratelimit-remaining-{b.kind}"] = str(b.remaining())
                headers[f"x-ratelimit-reset-{b.kind}"] = _duration_text(b.full_in())

    @staticmethod
    def error(status: int, message: str, type_: str, code: str | None, headers: dict[str, str],
              param: str | None = None) -> web.Response:
        return response(status, {"error": {"message": message, "type": type_, "param": param, "code": code}},
                        headers)

    def missing_key(self, headers: dict[str, str]) -> web.Response:
        return self.error(401, "You didn't provide an API key. You need to provide your API key in an "
                          "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                          "invalid_request_error", "invalid_api_key", headers)

    def wrong_key(self, headers: dict[str, str]) -> web.Response:
        # The real message shows a masked key; the simulation shows none at all.
        return self.error(401, "Incorrect API key provided. You can find your API key at "
                          "https://platform.openai.com/account/api-keys.", "invalid_request_error",
                          "invalid_api_key", headers)

    def bad_request(self, message: str, param: str | None, headers: dict[str, str]) -> web.Response:
        return self.error(400, message, "invalid_request_error", None, headers, param)

    def limited(self, model: str, blocked: Blocked | None, retry: float, headers: dict[str, str]) -> web.Response:
        retry_headers(retry, headers)
        headers["retry-after-ms"] = str(round(retry * 1000))
        if blocked is None:
            what, kind, used = PER_MINUTE["requests"], "requests", ""
        else:
            b = blocked.bucket
            what, kind = PER_MINUTE[b.kind], "requests" if b.kind == "requests" else "tokens"
            used = f" Limit {b.capacity}, Used {b.capacity - b.remaining()}, Requested {blocked.cost}."
        message = (f"Rate limit reached for {model} in organization org-simserver on {what}:{used} "
                   f"Please try again in {_duration_text(retry)}.")
        return self.error(429, message, kind, "rate_limit_exceeded", headers)

    def quota(self, model: str, retry: float, headers: dict[str, str]) -> web.Response:
        retry_headers(retry, headers)
        return self.error(429, "You exceeded your current quota, please check your plan and billing details. "
                          "For more information on this error, read the docs: "
                          "https://platform.openai.com/docs/guides/error-codes/api-errors.",
                          "insufficient_quota", "insufficient_quota", headers)

    def server_error(self, headers: dict[str, str]) -> web.Response:
        return self.error(500, "The server had an error while processing your request.", "server_error", None,
                          headers)

    def overloaded(self, headers: dict[str, str]) -> web.Response:
        return self.error(503, "The server is overloaded or not ready yet.", "server_error", None, headers)

    def answer(self, ask: Ask, text: str | None, finish: str, stop_hit: str | None, prompt_tokens: int,
               completion_tokens: int, thought: Thought | None = None, refusal: str | None = None) -> dict[str, Any]:
        # The thinking text never comes back (the Chat Completions API has none); a refusal is a message with no
        # content and a finish reason "stop".
        if refusal is not None:
            finish = "stop"
        elif text is None:
            finish = "content_filter"
        return {
            "id": "chatcmpl-" + os.urandom(12).hex(),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": ask.model,
            "system_fingerprint": _FINGERPRINT,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": refusal},
                         "logprobs": None, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": ask.cache.read if ask.cache else 0, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": thought.tokens if thought else 0, "audio_tokens": 0,
                                              "accepted_prediction_tokens": 0,
                                              "rejected_prediction_tokens": 0},
            },
        }


OPENAI = OpenAIFormat()
