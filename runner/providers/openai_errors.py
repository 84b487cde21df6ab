"""An OpenAI-format error answer as the runner's error: one mapping from (status, error body, headers) shared by
the SDK path (``OpenAIChatProvider.map_errors``, from the SDK's ``APIStatusError``) and the lean wire
(``runner/providers/lean_http.py``, from the HTTP answer itself), so both raise the same class with the same
message for the same answer. Messages are our own: a 401's text may quote part of the key."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runner.errors import (
    AuthError,
    BadRequest,
    FlexUnavailable,
    ProviderError,
    QuotaExceeded,
    RateLimited,
    TransientError,
)

from .wire import retry_after_seconds, words


def sdk_body(parsed: Any) -> Any:
    """What the OpenAI SDK keeps as an error's ``body``: the answer's ``error`` object when it has one, else the
    answer as parsed (a string when it was not JSON)."""
    return parsed.get("error", parsed) if isinstance(parsed, Mapping) else parsed


def error_object(body: Any) -> dict[str, Any]:
    """The error object of an error's ``body`` (``{"error": {...}}`` or the object itself), empty when none."""
    body = body if isinstance(body, dict) else {}
    inner = body.get("error", body)
    return inner if isinstance(inner, dict) else {}


def error_code(body: Any) -> str:
    inner = error_object(body)
    return str(inner.get("code") or inner.get("type") or "")


def said(body: Any, status: int) -> str:
    """A refused request's error in the provider's words (status, type, code, parameter, message): what to fix is
    in the message ("Unsupported parameter: 'top_p' ..."). Only for 4xx answers other than 401/403, whose text
    may quote part of the key."""
    inner = error_object(body)
    return words(status, inner.get("type"), inner.get("code"), inner.get("param"), inner.get("message"))


#: Groq's own status for a flex request it sheds (console.groq.com/docs/flex-processing: "If flex capacity is
#: unavailable, requests will fail quickly with status 498 and error capacity_exceeded")
GROQ_FLEX_SHED = 498


def flex_shed(status: int, body: Any) -> bool:
    """Whether an error answer is a flex request shed for want of capacity: Groq's 498, or a 429 whose error says
    "resource unavailable" (OpenAI's flex guide, platform.openai.com/docs/guides/flex-processing, and Azure's
    flex page name the error "429 Resource Unavailable"; neither publishes its code, so the code
    ``resource_unavailable`` or those words in the message are read; a 429 without them is a rate limit)."""
    if status == GROQ_FLEX_SHED:
        return True
    if status != 429:
        return False
    inner = error_object(body)
    said_words = " ".join(str(inner.get(key) or "") for key in ("code", "type", "message")).lower()
    return "resource_unavailable" in said_words or "resource unavailable" in said_words


def status_error(where: str, key_variable: str, status: int, body: Any,
                 headers: Mapping[str, str] | None) -> ProviderError:
    """The runner's error for a non-2xx answer; ``body`` as the SDK keeps it (:func:`sdk_body`)."""
    if flex_shed(status, body):
        return FlexUnavailable(f"{where}: the flex tier had no capacity for the request ({status}; not billed)",
                               status=status, retry_after=retry_after_seconds(headers))
    if status == 429:
        if error_code(body) == "insufficient_quota":
            return QuotaExceeded(f"{where}: insufficient quota (429); add credit or change the key")
        return RateLimited(f"{where}: rate limited (429)", retry_after=retry_after_seconds(headers))
    if status in (401, 403):
        return AuthError(f"{where}: the key was refused ({status}); check the variable {key_variable}", status=status)
    if status >= 500 or status in (408, 409):
        return TransientError(f"{where}: server error {status}", status=status)
    code = error_code(body)
    if code == "content_filter" or code == "content_policy_violation":
        return BadRequest(f"{where}: the request was blocked by the content filter ({status})", status=status,
                          error_class="content_filtered")
    return BadRequest(f"{where}: request rejected ({said(body, status)})", status=status)
