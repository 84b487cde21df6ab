"""What the three Batch API clients (``openai_batch``, ``anthropic_batch``, ``gemini_batch``) share.

* Errors go through the provider's own online mapping (its ``map_errors``): SDK exceptions raised while
  submitting, polling or reading results, and the per-line errors of a batch, which are rebuilt as the
  SDK's own exception for their status (:func:`status_error` for openai and anthropic) and translated
  the same way (:func:`mapped`), so a batch line that failed with a 429 is the same ``RateLimited`` an online
  request would have raised.
* A line is worth submitting again (``retry``) when its error is one the runner retries online (server
  errors, 429s, malformed answers) or when the provider never ran it (expired, cancelled: error classes
  ``batch_expired`` and ``batch_cancelled``). A bad request, an auth or a quota error is not.
* A failed line keeps the provider's own words (:func:`described`): its status, error type and code, the
  parameter it names and its message in full, as in ``400 invalid_request_error (param stop): 'stop' must have
  at most 4 items``; the online mapping's message is the runner's own and says only the status.
* A batch refused as a whole for some of its lines (OpenAI's input file validation) fails those lines with their
  own error; its other lines come back with error class ``batch_refused`` to be submitted again, once.
* Labels are names, never secrets: :func:`safe_label` masks the provider's key should a label hold it.
* A batch is found again by its label (OpenAI's ``metadata``, Gemini's ``display_name``) or, where the provider
  keeps none (Anthropic), by its lines' custom ids: each client's ``find`` pages through the provider's list for
  batches made since the batch's intent (less :data:`~runner.providers.batching.CLOCK_SKEW`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any, Protocol

from runner.errors import AuthError, BadRequest, ProviderError, QuotaExceeded, TransientError

from .base import Completion
from .batching import (
    ENDED,
    EXPIRED,
    Batches,
    BatchLine,
    BatchResult,
)
from .wire import words


class MappingProvider(Protocol):
    """What a batch client needs of its provider: where it is, its key, and its online error mapping."""

    client: Any

    def api_key(self) -> str: ...

    def map_errors(self) -> contextlib.AbstractContextManager[None]: ...


def mapped(provider: MappingProvider, exc: BaseException) -> ProviderError:
    """The runner error the provider's online mapping makes of the SDK exception ``exc``."""
    try:
        with provider.map_errors():
            raise exc
    except ProviderError as error:
        return error
    return TransientError(f"unexpected {type(exc).__name__}")  # pragma: no cover - map_errors always raises


#: the exception class both Stainless-generated SDKs (openai, anthropic) export for an HTTP status; another 4xx is
#: their ``APIStatusError``, a 5xx their ``InternalServerError``
STATUS_ERRORS = {400: "BadRequestError", 401: "AuthenticationError", 403: "PermissionDeniedError", 404: "NotFoundError",
                 409: "ConflictError", 422: "UnprocessableEntityError", 429: "RateLimitError"}


def status_error(sdk: ModuleType, client: Any, status: int, body: Any, path: str, *,
                 error_object: bool = False) -> Exception:
    """An exception of the class the SDK module ``sdk`` (openai or anthropic) raises online for an HTTP ``status``
    answer with JSON ``body`` to ``path`` (under the client's base URL), made with its public constructor, so
    the provider's mapping sees what it sees online. ``error_object``: the exception carries the body's ``error``
    object, as the openai client hands it over (the anthropic client hands over the whole body)."""
    from .bounded_httpx import http_library

    http = http_library(sdk.DefaultAsyncHttpxClient)  # the HTTP library the SDK is built on: httpx2, or httpx
    url = str(client.base_url).rstrip("/") + path
    response = http.Response(status, json=body, request=http.Request("POST", url))
    name = STATUS_ERRORS.get(status) or ("InternalServerError" if status >= 500 else "APIStatusError")
    carried = body.get("error", body) if error_object and isinstance(body, Mapping) else body
    return getattr(sdk, name)(f"Error code: {status}", response=response, body=carried)  # type: ignore[no-any-return]


def described(error: ProviderError, where: str, status: Any = None, kind: Any = None, code: Any = None,
              param: Any = None, message: Any = None) -> ProviderError:
    """``error`` (the online mapping of a failed line's error, whose message is the runner's own) with the
    provider's words (:func:`words`) as its message: ``{where}: {words}``. Its class, status and error class stay
    the mapping's. An auth error keeps the runner's words alone (a provider's 401 text may quote part of the key);
    a quota error keeps its advice and adds the provider's words."""
    if isinstance(error, AuthError) or not str(message or "").strip():
        return error
    said = words(status, kind, code, param, message)
    error.args = (f"{error}: {said}" if isinstance(error, QuotaExceeded) else f"{where}: {said}",)
    return error


def check_lines(where: str, lines: list[BatchLine]) -> None:
    """A batch needs lines, and custom ids unique within it (every Batch API refuses duplicates)."""
    if not lines:
        raise BadRequest(f"{where}: a batch needs at least one line")
    seen: set[str] = set()
    for line in lines:
        if not line.custom_id or line.custom_id in seen:
            raise BadRequest(f"{where}: custom id {line.custom_id!r} is empty or appears twice in one batch")
        seen.add(line.custom_id)


def safe_label(label: str, provider: MappingProvider, limit: int, default: str = "runner batch") -> str:
    """``label`` as it may be sent: the provider's key masked if it ever appears in it, cut to ``limit``. A label
    ending in `` #digest`` (:func:`~runner.providers.batching.batch_label`) keeps its digest whole, its readable
    part cut instead: the digest is what finds the batch again."""
    key = provider.api_key()
    if len(key) >= 8:
        label = label.replace(key, "***")
    head, mark, digest = label.rpartition(" #")
    if mark and len(mark + digest) <= limit:
        return head[:limit - len(mark + digest)] + mark + digest
    return label[:limit] or default


def answered(custom_id: str, build: Callable[[], Completion], raw: dict[str, Any]) -> BatchResult:
    """A line with an answer, built as the online path builds it (which may still refuse it: a content
    filter is a bad request, a malformed answer a transient error)."""
    try:
        return BatchResult(custom_id, completion=build(), raw=raw)
    except ProviderError as error:
        return failed(custom_id, error, raw)


def failed(custom_id: str, error: ProviderError, raw: dict[str, Any]) -> BatchResult:
    """A line that failed: retried when the runner would retry the same error online."""
    return BatchResult(custom_id, error=error, retry=error.retryable, raw=raw)


def unfinished(custom_id: str, where: str, kind: str, raw: dict[str, Any] | None = None) -> BatchResult:
    """A line the provider never ran (``kind`` EXPIRED or CANCELLED): submit it again."""
    why = "expired before it ran" if kind == EXPIRED else "was cancelled before it ran"
    return BatchResult(custom_id, error=TransientError(f"{where}: the batch line {why}", error_class=kind),
                       retry=True, raw=raw or {})


def not_ended(where: str, batch_id: str, state: str) -> BadRequest:
    return BadRequest(f"{where}: batch {batch_id} has not ended ({state}); poll its status until it has")


class SDKBatches(Batches):
    """A Batch API client over a started provider's SDK client; ``cancel`` is idempotent."""

    def __init__(self, provider: Any) -> None:
        self.provider = provider

    @property
    def client(self) -> Any:
        if self.provider.client is None:
            raise RuntimeError("the provider's start() was not awaited")
        return self.provider.client

    @property
    def where(self) -> str:
        return str(self.provider.where)

    def errors(self) -> contextlib.AbstractContextManager[None]:
        """SDK exceptions as the runner's, exactly as online."""
        return self.provider.map_errors()  # type: ignore[no-any-return]

    async def cancel(self, batch_id: str) -> None:
        try:
            await self._cancel(batch_id)
        except ProviderError:
            if (await self.status(batch_id)).state == ENDED:  # already over: nothing left to stop
                return
            raise

    async def _cancel(self, batch_id: str) -> None:
        raise NotImplementedError


@contextlib.contextmanager
def malformed(where: str) -> Iterator[None]:
    """A results document that cannot be read is the provider's fault: a transient error, as online."""
    try:
        yield
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise TransientError(f"{where}: the batch results were not valid JSON ({type(exc).__name__})",
                             error_class="malformed_response") from exc
