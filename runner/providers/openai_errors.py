"""An OpenAI-format error answer as the runner's error: one mapping from (status, error body, headers) shared by
the SDK path (``OpenAIChatProvider.map_errors``, from the SDK's ``APIStatusError``) and the lean wire
(``runner/providers/lean_http.py``, from the HTTP answer itself), so both raise the same class with the same
message for the same answer. Messages are our own: a 401's text may quote part of the key."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runner.errors import AuthError, BadRequest, ProviderError, QuotaExceeded, RateLimited, TransientError

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


def status_error(where: str, key_variable: str, status: int, body: Any,
                 headers: Mapping[str, str] | None) -> ProviderError:
    """The runner's error for a non-2xx answer; ``body`` as the SDK keeps it (:func:`sdk_body`)."""
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
