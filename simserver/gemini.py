"""Gemini generateContent as the simulated server speaks it: ``POST /v1beta/models/{model}:generateContent``
(also under ``/v1/``), key in ``x-goog-api-key`` or ``?key=``, no rate-limit headers, errors as
``{"error": {"code", "status", ...}}`` with ``QuotaFailure`` and ``RetryInfo`` details on a 429."""

from __future__ import annotations

import os
from typing import Any

from aiohttp import web

from .buckets import Blocked
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

__all__ = ["GEMINI", "PERMISSION_DENIED", "GeminiFormat", "gemini_messages"]

#: the ``param`` of an :class:`~simserver.wire.Invalid` that is answered 403 PERMISSION_DENIED, not 400
PERMISSION_DENIED = "PERMISSION_DENIED"
_GOOGLE_QUOTA = "type.googleapis.com/google.rpc.QuotaFailure"
_QUOTA_IDS = {  # bucket kind -> (quotaMetric suffix, quotaId)
    "requests": ("generate_content_requests", "GenerateRequestsPerMinutePerProjectPerModel"),
    "tokens": ("generate_content_input_token_count", "GenerateContentInputTokensPerModelPerMinute"),
    "input-tokens": ("generate_content_input_token_count", "GenerateContentInputTokensPerModelPerMinute"),
    "output-tokens": ("generate_content_output_token_count", "GenerateContentOutputTokensPerModelPerMinute"),
}


def gemini_messages(body: dict[str, Any], message: str = "GenerateContentRequest") -> list[dict[str, str]]:
    """The system instruction and contents of a body (a request, or a cached content: ``message`` names it in the
    errors) as the server's OpenAI-style messages."""
    messages = []
    system = body.get("systemInstruction", body.get("system_instruction"))
    if system is not None:
        text = joined(system.get("parts"), "text", None) if isinstance(system, dict) else None
        if text is None:
            raise Invalid(f"* {message}.system_instruction: only text parts are supported\n")
        messages.append({"role": "system", "content": text})
    contents = body.get("contents") or []
    if not isinstance(contents, list):
        raise Invalid(f"Invalid JSON payload received. Expected an array at '{message}.contents'.")
    for i, content in enumerate(contents):
        role = content.get("role") or "user" if isinstance(content, dict) else None
        if role not in ("user", "model"):
            raise Invalid(f"* {message}.contents[{i}].role: Please use a valid role: user, model.\n")
        text = joined(content.get("parts"), "text", None)
        if text is None:
            raise Invalid(f"* {message}.contents[{i}].parts: only text parts are supported\n")
        messages.append({"role": "assistant" if role == "model" else "user", "content": text})
    return messages


def _parse_gemini(body: Any, request: web.Request) -> Ask:
    if not isinstance(body, dict):
        raise Invalid("Invalid JSON payload received. Expected an object.")
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise Invalid("* GenerateContentRequest.contents: contents is not specified\n")
    messages = gemini_messages(body)
    config = body.get("generationConfig", body.get("generation_config")) or {}
    if not isinstance(config, dict):
        raise Invalid("Invalid JSON payload received. 'generationConfig' must be an object.")

    def option(camel: str, snake: str) -> Any:
        return config.get(camel, config.get(snake))

    max_tokens = option("maxOutputTokens", "max_output_tokens")
    if max_tokens is not None and not positive_int(max_tokens):
        raise Invalid("* GenerateContentRequest.generation_config.max_output_tokens: must be a positive integer\n")
    if option("candidateCount", "candidate_count") not in (None, 1):
        raise Invalid("* GenerateContentRequest.generation_config.candidate_count: the simulated server "
                      "supports only 1\n")
    stop = option("stopSequences", "stop_sequences")
    if stop is not None and not strings(stop):
        raise Invalid("* GenerateContentRequest.generation_config.stop_sequences: must be a list of strings\n")
    ask = Ask(request.match_info["model"], messages, config.get("temperature"), max_tokens,
              option("topP", "top_p"), stop or None, config.get("seed"))
    _read_thinking(option("thinkingConfig", "thinking_config"), ask)
    mime = option("responseMimeType", "response_mime_type")
    schema = option("responseJsonSchema", "response_json_schema")
    if schema is None:
        schema = option("responseSchema", "response_schema")
    if schema is not None:
        if not isinstance(schema, dict):
            raise Invalid("* GenerateContentRequest.generation_config.response_schema: must be an object\n")
        if mime not in ("application/json", "text/x.enum"):
            raise Invalid("* GenerateContentRequest.generation_config.response_mime_type: "
                          "response_mime_type must be application/json or text/x.enum when a response schema is "
                          "set\n")
        ask.schema = schema
        ask.enum_text = mime == "text/x.enum"
    elif mime == "application/json":
        ask.json_object = True
    if body.get("cachedContent", body.get("cached_content")) is not None:
        from .cached_contents import read_cache  # (imported here: that module builds on this one)

        read_cache(body, request, ask)
    return ask


def _read_thinking(config: Any, ask: Ask) -> None:
    """``thinkingConfig`` (``thinkingBudget``: 0 off, -1 dynamic; ``thinkingLevel``; ``includeThoughts``): a
    request with one thinks, unless its budget is 0; without one, a model that thinks by default (the runner's
    model rules: 2.5 Pro and Flash, 3) thinks. The thought summary comes back only with includeThoughts."""
    ask.thinking = facts("gemini", ask.model).get("reasoning") in ("default", "always")
    if config is None:
        return
    if not isinstance(config, dict):
        raise Invalid("* GenerateContentRequest.generation_config.thinking_config: must be an object\n")

    def option(camel: str, snake: str) -> Any:
        return config.get(camel, config.get(snake))

    budget, level = option("thinkingBudget", "thinking_budget"), option("thinkingLevel", "thinking_level")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < -1):
        raise Invalid("* GenerateContentRequest.generation_config.thinking_config.thinking_budget: must be an "
                      "integer of at least -1\n")
    if level is not None and str(level).lower() not in ("minimal", "low", "medium", "high"):
        raise Invalid("* GenerateContentRequest.generation_config.thinking_config.thinking_level: "
                      f"Invalid value {level!r}\n")
    ask.thinking = budget != 0 and (ask.thinking or budget is not None or level is not None
                                    or option("includeThoughts", "include_thoughts") is not None)
    ask.budget = budget if budget is not None and budget > 0 else None
    ask.effort = str(level).lower() if level is not None else None
    ask.show_thinking = ask.thinking and option("includeThoughts", "include_thoughts") is True


class GeminiFormat(WireFormat):
    name = "gemini"
    cache_rule = "gemini"
    parse = staticmethod(_parse_gemini)

    def key(self, request: web.Request) -> str:
        return (request.headers.get("x-goog-api-key") or request.query.get("key") or "").strip()

    @staticmethod
    def error(code: int, status: str, message: str, headers: dict[str, str],
              details: list[dict[str, Any]] | None = None) -> web.Response:
        body = {"error": {"code": code, "message": message, "status": status, "details": details or []}}
        return response(code, body, headers)

    def missing_key(self, headers: dict[str, str]) -> web.Response:
        return self.error(403, "PERMISSION_DENIED", "Method doesn't allow unregistered callers (callers without "
                          "established identity). Please use API Key or other form of API consumer identity to "
                          "call this API.", headers)

    def wrong_key(self, headers: dict[str, str]) -> web.Response:
        info = {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID",
                "domain": "googleapis.com", "metadata": {"service": "generativelanguage.googleapis.com"}}
        return self.error(400, "INVALID_ARGUMENT", "API key not valid. Please pass a valid API key.", headers,
                          [info])

    def bad_request(self, message: str, param: str | None, headers: dict[str, str]) -> web.Response:
        """A 400 INVALID_ARGUMENT; a 403 PERMISSION_DENIED when ``param`` is :data:`PERMISSION_DENIED` (Gemini's
        errors name no parameter, so the format's refusals carry their status there: a cached content not found)."""
        if param == PERMISSION_DENIED:
            return self.error(403, PERMISSION_DENIED, message, headers)
        return self.error(400, "INVALID_ARGUMENT", message, headers)

    @staticmethod
    def exhausted(model: str, metric_name: str, quota_id: str, limit: int | None, retry: float,
                  headers: dict[str, str]) -> web.Response:
        retry_headers(retry, headers)
        metric = f"generativelanguage.googleapis.com/{metric_name}"
        violation: dict[str, Any] = {"quotaMetric": metric, "quotaId": quota_id,
                                     "quotaDimensions": {"location": "global", "model": model}}
        if limit is not None:
            violation["quotaValue"] = str(limit)
        message = ("You exceeded your current quota, please check your plan and billing details. For more "
                   "information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.\n"
                   f"* Quota exceeded for metric: {metric}, {f'limit: {limit}, ' if limit else ''}model: {model}\n"
                   f"Please retry in {seconds_text(retry)}s.")
        details = [{"@type": _GOOGLE_QUOTA, "violations": [violation]},
                   {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{seconds_text(retry)}s"}]
        return GeminiFormat.error(429, "RESOURCE_EXHAUSTED", message, headers, details)

    def limited(self, model: str, blocked: Blocked | None, retry: float, headers: dict[str, str]) -> web.Response:
        kind = blocked.bucket.kind if blocked else "requests"
        metric, quota_id = _QUOTA_IDS[kind]
        return self.exhausted(model, metric, quota_id, blocked.bucket.capacity if blocked else None, retry, headers)

    def quota(self, model: str, retry: float, headers: dict[str, str]) -> web.Response:
        return self.exhausted(model, "generate_content_free_tier_requests",
                              "GenerateRequestsPerDayPerProjectPerModel-FreeTier", None, retry, headers)

    def server_error(self, headers: dict[str, str]) -> web.Response:
        return self.error(500, "INTERNAL", "An internal error has occurred. Please retry or report in "
                          "https://developers.generativeai.google/guide/troubleshooting", headers)

    def overloaded(self, headers: dict[str, str]) -> web.Response:
        return self.error(503, "UNAVAILABLE", "The model is overloaded. Please try again later.", headers)

    def answer(self, ask: Ask, text: str | None, finish: str, stop_hit: str | None, prompt_tokens: int,
               completion_tokens: int, thought: Thought | None = None, refusal: str | None = None) -> dict[str, Any]:
        usage: dict[str, Any] = {"promptTokenCount": prompt_tokens}
        if refusal is not None:  # the prompt is blocked: no candidate, nothing generated, the input billed
            return {
                "promptFeedback": {"blockReason": "SAFETY", "safetyRatings": [
                    {"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH", "blocked": True}]},
                "usageMetadata": {**usage, "totalTokenCount": prompt_tokens,
                                  "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt_tokens}]},
                "modelVersion": ask.model,
                "responseId": os.urandom(12).hex(),
            }
        thoughts = thought.tokens if thought is not None else 0
        if text is None:
            candidate: dict[str, Any] = {"finishReason": "SAFETY", "index": 0, "safetyRatings": [
                {"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH", "blocked": True}]}
        else:
            parts: list[dict[str, Any]] = []
            if thought is not None and ask.show_thinking:
                parts.append({"text": thought.text, "thought": True})
            if text or thought is None:  # thinking that filled the cap leaves no answer part
                parts.append({"text": text})
            content: dict[str, Any] = {"role": "model", "parts": parts} if parts else {"role": "model"}
            candidate = {"content": content, "finishReason": "MAX_TOKENS" if finish == "length" else "STOP",
                         "index": 0}
        # candidatesTokenCount is the answer's, thoughtsTokenCount the thinking's (both billed as output)
        usage["candidatesTokenCount"] = completion_tokens - thoughts
        if thoughts:
            usage["thoughtsTokenCount"] = thoughts
        usage["totalTokenCount"] = prompt_tokens + completion_tokens
        usage["promptTokensDetails"] = [{"modality": "TEXT", "tokenCount": prompt_tokens}]
        if ask.cache is not None and ask.cache.read:
            usage["cachedContentTokenCount"] = ask.cache.read
            usage["cacheTokensDetails"] = [{"modality": "TEXT", "tokenCount": ask.cache.read}]
        return {
            "candidates": [candidate],
            "usageMetadata": usage,
            "modelVersion": ask.model,
            "responseId": os.urandom(12).hex(),
        }


GEMINI = GeminiFormat()
