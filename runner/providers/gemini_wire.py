"""Gemini's generateContent as JSON, for the lean wire (``runner/providers/lean_http.py``): the request body as the
google-genai SDK writes it from ``GeminiProvider.request_of``'s contents and config (:func:`request_body`; the
REST reference, ai.google.dev/api/generate-content#method:-models.generatecontent, and
``simserver/published/gemini_fields.json``), the answer's fields read from its JSON (:func:`read_answer`), and an
error answer as the runner's error (:func:`status_error`), the same class and words as ``GeminiProvider.map_errors``
gives the SDK's ``ClientError`` / ``ServerError`` for that answer. Nothing here imports the SDK.

Request: ``contents`` (``role`` user or model, one text part each), ``systemInstruction`` (the system messages
joined, as a user content: the SDK's ``t_content`` of a string), ``generationConfig`` (the sampling fields under
their REST names, ``candidateCount`` 1, ``thinkingConfig``), ``cachedContent`` and ``serviceTier`` at the top level.
tests/providers/test_lean_gemini.py checks each body against the one the SDK sends for the same request, and
against the SDK's own pydantic types (which forbid unknown fields).
"""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from runner.errors import AuthError, BadRequest, ProviderError, QuotaExceeded, RateLimited, TransientError

from . import capabilities
from .tiers import GEMINI_WIRE
from .wire import retry_after_seconds, words

__all__ = ["error_details", "model_path", "read_answer", "request_body", "retry_delay", "sdk_fields", "sdk_header",
           "status_error", "thinking_config"]

#: Gemini 3's thinking levels for the runner's efforts (ai.google.dev/gemini-api/docs/thinking#thinking-levels)
_LEVELS = {"minimal": "minimal", "low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}
#: the runner's parameters and generationConfig's names for them (the SDK's snake_case names, camelCased)
_FIELDS = (("temperature", "temperature"), ("max_tokens", "maxOutputTokens"), ("top_p", "topP"),
           ("stop", "stopSequences"), ("seed", "seed"), ("logprobs", "responseLogprobs"),
           ("presence_penalty", "presencePenalty"), ("frequency_penalty", "frequencyPenalty"))


def model_path(model: str) -> str:
    """``models/{model}`` as the SDK names a model in a URL (a name already under ``models/`` or ``tunedModels/``
    as it is)."""
    from .lean_http import path_segment  # h11 with it: imported once a wire is built

    if model.startswith(("models/", "tunedModels/")):
        return model
    return "models/" + path_segment(model)


def sdk_header(response: Any, name: str) -> str | None:
    """A response header of an SDK answer (google-genai keeps them in ``sdk_http_response``); None for a batch
    line's answer, which has none."""
    http = getattr(response, "sdk_http_response", None)
    headers = getattr(http, "headers", None) or {}
    return next((value for key, value in headers.items() if key.lower() == name), None)


def thinking_config(caps: capabilities.ModelCaps | None, reasoning: Mapping[str, Any]) -> dict[str, Any]:
    """generateContent's thinkingConfig for the job's ``reasoning:`` (the SDK's snake_case names): a level where the
    model takes levels and the job names an effort, else a budget (0 turns thinking off where the model allows);
    thoughts included, so that the thinking is kept apart from the answer."""
    effort, budget = reasoning.get("effort"), reasoning.get("budget_tokens")
    if effort == "none" or budget == 0:
        return {"thinking_budget": 0}
    if caps is not None and caps.efforts and effort is not None and budget is None:
        return {"thinking_level": _LEVELS.get(effort, "high"), "include_thoughts": True}
    sent = capabilities.budget_for(caps, reasoning) if caps is not None else int(budget or 1024)
    return {"thinking_budget": sent, "include_thoughts": True}


def _wire_thinking(config: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`thinking_config` as the SDK sends it: camelCase, the level as its enum's value (upper case)."""
    sent: dict[str, Any] = {}
    if "thinking_budget" in config:
        sent["thinkingBudget"] = config["thinking_budget"]
    if "thinking_level" in config:
        sent["thinkingLevel"] = str(config["thinking_level"]).upper()
    if "include_thoughts" in config:
        sent["includeThoughts"] = config["include_thoughts"]
    return sent


def request_body(messages: list[dict[str, Any]], params: Mapping[str, Any], model: str = "") -> dict[str, Any]:
    """The generateContent body of the runner's messages and parameters (shaped for ``model``), as google-genai sends
    ``GeminiProvider.request_of``'s contents and config: the leading messages a stored prefix holds left out."""
    stored = params.get("cached_content")
    if stored:
        messages = messages[params.get("cached_messages") or 0:]
    body: dict[str, Any] = {"contents": [
        {"parts": [{"text": m["content"]}], "role": "model" if m["role"] == "assistant" else "user"}
        for m in messages if m.get("role") != "system"]}
    system = "\n\n".join(m["content"] for m in messages if m.get("role") == "system")
    if system:
        body["systemInstruction"] = {"parts": [{"text": system}], "role": "user"}
    config: dict[str, Any] = {"candidateCount": 1}
    for ours, theirs in _FIELDS:
        if params.get(ours) is not None:
            config[theirs] = params[ours]
    response_format = params.get("response_format") or {}
    if response_format.get("type") in ("json_object", "json_schema"):
        config["responseMimeType"] = "application/json"
        schema = (response_format.get("json_schema") or {}).get("schema")
        if schema is not None:
            config["responseJsonSchema"] = schema
    reasoning = params.get("reasoning")
    if reasoning:
        config["thinkingConfig"] = _wire_thinking(thinking_config(capabilities.capabilities("gemini", model),
                                                                  reasoning))
    body["generationConfig"] = config
    if stored:
        body["cachedContent"] = stored
    if params.get("service_tier") is not None:
        body["serviceTier"] = GEMINI_WIRE[params["service_tier"]]
    return body


def read_answer(body: Any) -> dict[str, Any]:
    """The fields a completion needs of a generateContent answer's JSON: ``text``, ``thoughts`` (the thought parts'
    texts), ``finish`` (the first candidate's finishReason), ``blocked`` (promptFeedback.blockReason) and the
    usage counts. ``TypeError``/``KeyError``/``AttributeError`` when the answer is not shaped as one, ``ValueError``
    when it has neither candidates nor prompt feedback (which says why there are none), as when it is not an object
    (a JSON list, which google-genai reads as an answer without either)."""
    if not isinstance(body, dict):
        raise ValueError("not an object")
    candidates = body.get("candidates") or []
    feedback = body.get("promptFeedback")
    if not candidates and feedback is None:
        raise ValueError("no candidates, no prompt feedback")
    candidate = candidates[0] if candidates else {}
    parts = (candidate.get("content") or {}).get("parts") or []
    usage = body.get("usageMetadata") or {}
    texts = [(part.get("text"), part.get("thought")) for part in parts]
    return {
        "text": "".join(text for text, thought in texts if text and not thought),
        "thoughts": [text for text, thought in texts if text and thought],
        "finish": candidate.get("finishReason"),
        "blocked": (feedback or {}).get("blockReason"),
        "input": int(usage.get("promptTokenCount") or 0),
        "output": int(usage.get("candidatesTokenCount") or 0),
        "thinking": int(usage.get("thoughtsTokenCount") or 0),
        "cached": int(usage.get("cachedContentTokenCount") or 0),
    }


def error_details(body: Any) -> list[dict[str, Any]]:
    """The ``details`` of an error answer's body (``{"error": {"code", "message", "status", "details"}}``)."""
    body = body if isinstance(body, dict) else {}
    inner = body.get("error", body)
    details = inner.get("details") if isinstance(inner, dict) else None
    return [d for d in details if isinstance(d, dict)] if isinstance(details, list) else []


def retry_delay(details: list[dict[str, Any]]) -> float | None:
    """Seconds from a ``google.rpc.RetryInfo`` detail (``"retryDelay": "13s"``)."""
    for detail in details:
        delay = detail.get("retryDelay")
        if isinstance(delay, str) and delay.endswith("s"):
            try:
                return max(0.0, float(delay[:-1]))
            except ValueError:
                return None
    return None


def _is_daily_quota(details: list[dict[str, Any]]) -> bool:
    """A per-day quota (or a free tier's) will not come back after a pause: treat it as out of quota."""
    for detail in details:
        for violation in detail.get("violations") or []:
            if "PerDay" in str(violation.get("quotaId", "")):
                return True
    return False


def _key_invalid(details: list[dict[str, Any]]) -> bool:
    return any(d.get("reason") in ("API_KEY_INVALID", "API_KEY_SERVICE_BLOCKED") for d in details)


def sdk_fields(status: int, body: Any) -> tuple[Any, Any, Any]:
    """(details, status word, message) of an error answer as google-genai's ``APIError`` keeps them: the JSON body
    (its one element when a list of one), else its text with the HTTP reason phrase as the status word."""
    if isinstance(body, list) and len(body) == 1:
        body = body[0]
    if not isinstance(body, dict):
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
        body = {"message": body, "status": phrase}
    inner = body.get("error") if isinstance(body.get("error"), dict) else {}
    return body, body.get("status", inner.get("status")), body.get("message", inner.get("message"))


def status_error(where: str, key_variables: list[str], code: int, body: Any,
                 headers: Mapping[str, str] | None = None) -> ProviderError:
    """The runner's error for a non-2xx answer: ``body`` as :func:`lean_http.parsed_or_text` reads it on the lean
    wire, or the SDK's ``APIError.details`` (the same, read by the SDK); a 429's wait from its RetryInfo detail, else
    its Retry-After header."""
    details_body, status, message = sdk_fields(code, body)
    if 500 <= code < 600:
        return TransientError(f"{where}: server error {code} {status}", status=code)
    if not 400 <= code < 500:
        return TransientError(f"{where}: unexpected answer {code} {status}", status=code)
    details = error_details(details_body)
    if code == 429:
        if _is_daily_quota(details):
            return QuotaExceeded(f"{where}: a daily quota is used up (429 RESOURCE_EXHAUSTED); wait for it to reset "
                                 "or enable billing")
        wait = retry_delay(details)
        return RateLimited(f"{where}: rate limited (429)",
                           retry_after=wait if wait is not None else retry_after_seconds(headers))
    if code in (401, 403) or _key_invalid(details):
        return AuthError(f"{where}: the key was refused ({code} {status}); check the variable "
                         f"{' or '.join(key_variables)}", status=code)
    if code in (408, 409):
        return TransientError(f"{where}: {code} {status}", status=code)
    # the provider's words: what to fix is in the message ("Unknown name \"systemInstruction\" ...")
    return BadRequest(f"{where}: request rejected ({words(code, status, None, None, message)})", status=code)
