"""An Anthropic error as the runner's error: one mapping of an error answer (status, body, headers) shared by the
lean wire and the SDK path (``AnthropicProvider.map_errors``), and what the anthropic SDK's clients (direct,
on Bedrock, on Vertex) raise when no answer came back, each a retryable ``TransientError``. Messages are our own: a
401's text may quote part of the key."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from runner.errors import AuthError, BadRequest, ProviderError, QuotaExceeded, RateLimited, TransientError

from .answer_bounds import surfaced
from .wire import retry_after_seconds, words


def error_words(body: Any) -> tuple[str, str]:
    """(type, message) of an error answer's body, ``{"type": "error", "error": {"type", "message"}}`` (as the SDK
    keeps it: the JSON parsed, else the text); empty strings where it has none."""
    body = body if isinstance(body, dict) else {}
    inner = body.get("error") if isinstance(body.get("error"), dict) else {}
    return str(inner.get("type") or ""), str(inner.get("message") or "")


def status_error(where: str, key_variable: str, status: int, body: Any,
                 headers: Mapping[str, str] | None) -> ProviderError:
    """The runner's error for a non-2xx answer, the same on the SDK path (its ``APIStatusError``: the SDK picks
    its class by the status alone for 401, 403 and 429) and the lean wire's. Messages are our own: a 401's text
    may quote part of the key."""
    if status == 429:
        return RateLimited(f"{where}: rate limited (429)", retry_after=retry_after_seconds(headers))
    if status in (401, 403):
        return AuthError(f"{where}: the key was refused ({status}); check the variable {key_variable}", status=status)
    kind, message = error_words(body)
    if status == 402 or kind == "billing_error" or "credit balance" in message.lower():
        return QuotaExceeded(f"{where}: the account's credit is exhausted ({status}); add credit or change the key")
    if status >= 500 or status in (408, 409):  # 529 is overloaded_error
        return TransientError(f"{where}: server error {status} {kind}".rstrip(), status=status)
    # the provider's words: what to fix is in the message ("temperature: ... not supported ...")
    return BadRequest(f"{where}: request rejected ({words(status, kind, None, None, message)})", status=status)


@contextlib.contextmanager
def transport_errors(where: str, timeout: float) -> Iterator[None]:
    """What the anthropic SDK's clients (direct, on Bedrock, on Vertex) raise when no answer came back: a timeout, a
    dropped connection, a body that is not JSON; each a retryable ``TransientError``. Status errors are each
    caller's: the APIs word them differently."""
    import aiohttp
    import anthropic

    with surfaced(where):
        try:
            yield
        except anthropic.APITimeoutError as exc:
            # anthropic before 2.10: its aiohttp transport reported every failed connection (a refused one too) as
            # a connect timeout; 2.10 on, as a connection error
            if (failed := _connection_failure(exc)) is not None:
                raise TransientError(f"{where}: connection failed ({type(failed).__name__})",
                                     error_class="connection") from exc
            raise TransientError(f"{where}: timed out after {timeout:g} s", error_class="timeout") from exc
        except anthropic.APIConnectionError as exc:
            raise TransientError(f"{where}: connection failed ({type(exc.__cause__ or exc).__name__})",
                                 error_class="connection") from exc
        except anthropic.APIResponseValidationError as exc:
            raise TransientError(f"{where}: the response was not valid JSON",
                                 error_class="malformed_response") from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise TransientError(f"{where}: connection failed ({type(exc).__name__})",
                                 error_class="connection") from exc


def _connection_failure(exc: BaseException) -> BaseException | None:
    """The aiohttp error under ``exc`` (its chain of causes) that is a failed connection, not a timeout; or None."""
    import aiohttp

    cause = exc.__cause__
    while cause is not None:
        if isinstance(cause, aiohttp.ClientConnectionError) and not isinstance(cause, TimeoutError):
            return cause
        cause = cause.__cause__
    return None
