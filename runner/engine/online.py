"""One online request, attempt by attempt (ARCHITECTURE.md invariants 4 and 5): each attempt waits for its endpoint's
limiters (runner/engine/limits.py), checks that the task's lease is still this worker's, calls the provider and
tells the endpoint how it went; the retry policy (runner/engine/retry.py) decides whether to try again."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from runner.engine.endpoints import Endpoints
from runner.engine.leases import ChunkLeases
from runner.engine.limits import Endpoint
from runner.engine.prompt_cache import NoPromptCache, PromptCachePlan
from runner.engine.reserver import input_tokens
from runner.engine.retry import Tally, retrying
from runner.engine.stats import RunStats
from runner.errors import AuthError, ProviderError, RateLimited, TransientError
from runner.plan.request import Task
from runner.providers.base import Completion
from runner.spec.settings import RetrySettings

#: transient errors that say the server is loaded (the adaptive concurrency backs off on these)
LOAD_ERRORS = frozenset({"server_error", "timeout", "connection"})


class LeaseLost(Exception):
    """The task's chunk lease was taken over (its worker stalled past it): the request is not sent."""


class NotReserved(Exception):
    """A retry found no room in its budget (or lost its lease at the ledger's write): it is not sent again."""


class Sender:
    def __init__(self, *, endpoints: Endpoints, leases: ChunkLeases, stats: RunStats, retry: RetrySettings,
                 sleep: Callable[[float], Any], prompt_cache: PromptCachePlan | NoPromptCache) -> None:
        """``prompt_cache``: the run's prompt-cache plan (runner/engine/prompt_cache.py), which gives a request's
        marks and makes them ready to send (a stored prefix stored first); :class:`NoPromptCache` marks nothing."""
        self.endpoints = endpoints
        self.leases = leases
        self.stats = stats
        self._retrying = retrying(retry, on_retry=self._count_retry, sleep=sleep)
        self.prompt_cache = prompt_cache

    async def send(self, req: Task, endpoint: Endpoint, tries: Tally,
                   reserve_again: Callable[[], Awaitable[bool]]) -> tuple[Completion, float]:
        """(the answer, the seconds its last attempt took), the provider started first; raises the error that ended
        the last attempt (:class:`LeaseLost` when the lease went before it was sent). ``tries`` counts the attempts
        sent. An attempt that may have been billed with no answer (it timed out) is not sent again before
        ``reserve_again()`` has kept its reservation as possibly billed and reserved the retry anew (False: no room,
        :class:`NotReserved`)."""
        await self.endpoints.start(req.provider)
        return await self._retrying(self._attempt, req, endpoint, tries, reserve_again)

    def _count_retry(self, task: Task) -> None:
        self.stats.counters(task.stage, task.model).retries += 1

    async def _attempt(self, req: Task, endpoint: Endpoint, tries: Tally,
                       reserve_again: Callable[[], Awaitable[bool]]) -> tuple[Completion, float]:
        if tries.last_possibly_billed:
            tries.last_possibly_billed = False
            if not await reserve_again():
                raise NotReserved(req.item)
        if endpoint.dead is not None:
            raise AuthError(f"not sent: {endpoint.dead}")
        if endpoint.counts_tokens:
            await endpoint.ready(input_tokens(req), req.call.params.get("max_tokens") or 0)
        else:
            await endpoint.ready()
        if await self.leases.lost_lease_of(req):  # checked last before each attempt: after a stall, it may be another's
            raise LeaseLost(req.item)
        marks = self.prompt_cache.marks(req) if req.call.pairs is None else None
        if marks is not None and marks.store_key is not None:
            marks = await self.prompt_cache.ready(req, marks)
        tries.sent += 1
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            call = req.call
            provider = self.endpoints.providers[call.provider]
            if call.pairs is not None:
                completion = await provider.loglikelihood(call.model_name, call.pairs)
            elif marks is not None:
                completion = await provider.execute(
                    call.model_name, *provider.mark_prompt_cache(call.model_name, call.messages, call.params, marks))
            else:
                completion = await provider.execute(call.model_name, call.messages, call.params)
        except ProviderError as exc:
            tries.last_possibly_billed = exc.possibly_billed
            if isinstance(exc, AuthError) and endpoint.dead is None:
                endpoint.dead = exc  # before the endpoint opens: nothing else is sent with a refused key
            endpoint.answered()
            if isinstance(exc, RateLimited):
                tries.rate_limited += 1
                endpoint.failed()
            elif isinstance(exc, TransientError) and exc.error_class in LOAD_ERRORS:
                endpoint.failed()
            raise
        endpoint.answered()
        latency = loop.time() - started
        endpoint.observe(completion.rate, latency)
        return completion, latency
