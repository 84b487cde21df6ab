"""The retry policy (ARCHITECTURE.md invariant 4): the runner's alone, bounded in attempts and in wall time.

Exponential backoff with full jitter for server errors, timeouts, dropped connections and malformed answers,
up to ``retry.max_attempts``; a 429 pauses the whole endpoint for its Retry-After instead of backing one request
off, up to ``retry.rate_limit_attempts``; everything within ``retry.max_elapsed`` seconds. Errors that say the
request itself is wrong (auth, quota, bad request, filtered content) are not retryable and end at once.

The policy is a tenacity :class:`AsyncRetrying` whose attempt function is called as
``fn(task, endpoint, tally)``: the policy reads the :class:`Tally` to count 429s apart from other failures and
pauses the endpoint it was given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_any,
    stop_before_delay,
    wait_random_exponential,
)

from runner.errors import ProviderError, RateLimited
from runner.spec.settings import RetrySettings


class Tally:
    """One request's attempts: all sent, how many of them were answered 429, how many were flex requests the provider
    shed (retried by the sender's own loop within ``retry.flex_wait``, runner/engine/online.py), and whether the last
    one may have been billed with no answer (it timed out)."""

    __slots__ = ("last_possibly_billed", "rate_limited", "sent", "shed", "via")

    def __init__(self) -> None:
        self.sent = 0
        self.rate_limited = 0
        self.shed = 0
        self.last_possibly_billed = False
        #: a pooled model's request: the endpoint its last attempt went to (runner/engine/pools.py)
        self.via: Any = None


def retryable(exc: BaseException) -> bool:
    return isinstance(exc, ProviderError) and exc.retryable


def retrying(settings: RetrySettings, *, on_retry: Callable[[Any], None],
             sleep: Callable[[float], Any]) -> AsyncRetrying:
    """The policy for a job's ``retry:`` settings. ``on_retry(task)`` is told of every retry (the live counters);
    ``sleep`` is injected so tests can step time."""
    # exponential backoff with full jitter: a random wait in [0, min(max, initial * 2^n)]
    backoff = wait_random_exponential(multiplier=settings.backoff_initial, max=settings.backoff_max)

    def out_of_attempts(state: RetryCallState) -> bool:
        """Stop after ``max_attempts`` failures of other kinds, or ``rate_limit_attempts`` 429s: a 429 storm
        is ridden out by pausing, a broken server is not tried for long (shed flex attempts count in neither)."""
        tally: Tally = state.args[2]
        return (tally.sent - tally.rate_limited - tally.shed >= settings.max_attempts
                or tally.rate_limited >= settings.rate_limit_attempts)

    def wait(state: RetryCallState) -> float:
        # After a 429 the endpoint itself is paused (every request waits in Endpoint.ready), so this
        # request adds no wait of its own; other errors back off exponentially with jitter.
        if isinstance(state.outcome.exception(), RateLimited):
            return 0.0
        return backoff(state)

    def before_sleep(state: RetryCallState) -> None:
        task, endpoint = state.args[0], state.args[1]
        exc = state.outcome.exception()
        if isinstance(exc, RateLimited):
            endpoint.pause(exc.retry_after if exc.retry_after is not None else backoff(state))
        on_retry(task)

    return AsyncRetrying(
        stop=stop_any(out_of_attempts, stop_before_delay(settings.max_elapsed)),
        wait=wait,
        retry=retry_if_exception(retryable),
        before_sleep=before_sleep,
        sleep=sleep,
        reraise=True,
    )
