"""Errors the runner raises, and what each means for the user.

::

    RunnerError                  an error a user can cause; printed as one sentence, never a traceback
    ├── JobFileError             the job file does not validate (exit code 2); names file:line and the key
    ├── StoreError               the SQLite store cannot be opened or a run id is unknown
    │   └── StoreFailed          the store failed during a run: full disk, corrupt file, server gone
    ├── OutputError              a results file or the output folder cannot be written (full disk, read-only)
    ├── ModelSetupError          a provider cannot be set up (missing key variable, model file not found)
    └── ProviderError            one request failed; carries the error class recorded for the task
        ├── RateLimited          429: pause the whole endpoint for ``retry_after`` seconds, then retry
        ├── TransientError       5xx, timeout, connection reset: retry with backoff, bounded
        ├── FlexUnavailable      a flex-tier request the provider shed (OpenAI 429 "resource unavailable", Groq
        │                        498, Gemini 503): tried again at flex within ``retry.flex_wait``, then sent at
        │                        standard where the stage says ``fallback: standard``, else the item fails
        ├── BadRequest           the request itself is wrong or was filtered: the item fails, no retry
        │                        (error class ``bad_request`` or ``content_filtered``)
        │   └── Refused          the model declined to answer (OpenAI ``message.refusal``, Anthropic
        │                        ``stop_reason: refusal``, a Gemini safety block): error class ``refused``,
        │                        counted apart in reports, never scored as a wrong answer
        ├── AuthError            key missing, invalid or not permitted: the endpoint stops, no retry
        └── QuotaExceeded        insufficient quota or billing: the whole run stops, no retry

Providers translate their SDK's exceptions into these at one place (a mapping context manager), raising
``from exc``; the engine never sees vendor types.
"""

from __future__ import annotations

__all__ = [
    "AuthError",
    "BadRequest",
    "FlexUnavailable",
    "JobFileError",
    "ModelSetupError",
    "OutputError",
    "ProviderError",
    "QuotaExceeded",
    "RateLimited",
    "Refused",
    "RunnerError",
    "StoreError",
    "StoreFailed",
    "TransientError",
]


class RunnerError(Exception):
    """An error the user can act on. Its message is shown as it is, after ``Error: ``."""

    exit_code = 1


class JobFileError(RunnerError):
    """The job file is malformed: the message starts with ``file:line`` and names the key."""

    exit_code = 2


class StoreError(RunnerError):
    """The store cannot be opened, or it does not hold what was asked for (an unknown run id)."""


class StoreFailed(StoreError):
    """The store stopped working during a run: the disk holding it is full, its file is corrupt, its database
    server went away. The message names the file (or URL), says what was kept of the answers received, and how
    to go on (free space, recover the file, or wait for the server, then ``runner resume RUN_ID``)."""


class OutputError(RunnerError):
    """A results file, or the folder it goes in, cannot be written: a full disk, a read-only or missing folder.
    ``path`` is the file or folder."""

    def __init__(self, message: str, path: object = None) -> None:
        super().__init__(message)
        self.path = path


class ModelSetupError(RunnerError):
    """A provider cannot start: a key variable is unset, a model file cannot be found or fetched."""


class ProviderError(RunnerError):
    """One request failed. ``error_class`` is what the task records and the report groups by."""

    error_class = "provider_error"
    #: whether the dispatcher may try the same request again
    retryable = False

    def __init__(self, message: str, *, status: int | None = None, error_class: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        if error_class:
            self.error_class = error_class

    @property
    def possibly_billed(self) -> bool:
        """Whether the provider may have made (and billed) an answer that never came back: a request that timed out
        after it was sent. An error answer, a refused or dropped connection and an unreadable body are taken as not
        billed (no provider we know of bills a body its client could not read). An answer cut off after its total
        time (``answer_too_slow``) was coming, so it counts as a timeout."""
        return self.error_class in ("timeout", "answer_too_slow")


class RateLimited(ProviderError):
    """The endpoint said 429. ``retry_after`` is its Retry-After in seconds when it sent one."""

    error_class = "rate_limited"
    retryable = True

    def __init__(self, message: str, *, retry_after: float | None = None, status: int | None = 429) -> None:
        super().__init__(message, status=status)
        self.retry_after = retry_after


class TransientError(ProviderError):
    """A server error, a timeout or a dropped connection: worth another try after a backoff."""

    error_class = "server_error"
    retryable = True


class FlexUnavailable(ProviderError):
    """The provider shed a request sent at the flex tier: it has no spare capacity now (not a rate limit of the key,
    and not billed). The engine's own loop tries it again at flex with a backoff, within ``retry.flex_wait``
    seconds, then at standard when the stage allows it (runner/engine/online.py); the retry policy leaves it alone.
    ``retry_after``: the provider's Retry-After in seconds, when it sent one."""

    error_class = "flex_unavailable"

    def __init__(self, message: str, *, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message, status=status)
        self.retry_after = retry_after


class BadRequest(ProviderError):
    """The request was rejected as malformed or filtered. Sending it again would fail again."""

    error_class = "bad_request"


class AuthError(ProviderError):
    """The key is missing, invalid or lacks permission. The endpoint stops at once."""

    error_class = "auth"


class QuotaExceeded(ProviderError):
    """The account has no quota or credit left. The whole run stops."""

    error_class = "quota"


class Refused(BadRequest):
    """The model declined to answer. ``billed`` is the answer's :class:`~runner.providers.base.Completion` (its
    usage), when the provider charged for it, so the run can count what the refusal cost."""

    error_class = "refused"

    def __init__(self, message: str, *, billed: object = None, status: int | None = None) -> None:
        super().__init__(message, status=status)
        self.billed = billed
