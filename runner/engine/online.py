"""One online request, attempt by attempt (ARCHITECTURE.md invariants 4 and 5): each attempt waits for its endpoint's
limiters (runner/engine/limits.py), checks that the task's lease is still this worker's, calls the provider and
tells the endpoint how it went; the retry policy (runner/engine/retry.py) decides whether to try again.

A request whose stage asks for a service tier (runner/engine/tiers.py) is sent with it as its ``service_tier``
parameter. One asked at flex that the provider sheds (``FlexUnavailable``) is sent again at flex, after a backoff
(the provider's Retry-After, else ``retry.backoff_*``), for at most ``retry.flex_wait`` seconds from its first
attempt; then it fails, or, where its stage says ``fallback: standard``, it is sent at standard, which the run's
notes say once."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from runner.engine.endpoints import Endpoints
from runner.engine.leases import ChunkLeases
from runner.engine.limits import Endpoint
from runner.engine.pools import Member
from runner.engine.reserver import input_tokens
from runner.engine.retry import Tally, retrying
from runner.engine.stats import RunStats
from runner.engine.tiers import TierPlan, Tiers
from runner.errors import AuthError, FlexUnavailable, ProviderError, RateLimited, Refused, TransientError
from runner.plan.request import Task
from runner.providers.base import Completion, Provider, stamp
from runner.providers.tiers import FLEX, STANDARD
from runner.providers.tokens import first_answer
from runner.spec.settings import RetrySettings

if TYPE_CHECKING:  # the prompt-cache plan: imported by a run that plans one (runner/engine/assembly.py)
    from runner.engine.prompt_cache import NoPromptCache, PromptCachePlan

#: transient errors that say the server is loaded (the adaptive concurrency backs off on these)
LOAD_ERRORS = frozenset({"server_error", "timeout", "connection"})


class LeaseLost(Exception):
    """The task's chunk lease was taken over (its worker stalled past it): the request is not sent."""


class NotReserved(Exception):
    """A retry found no room in its budget (or lost its lease at the ledger's write): it is not sent again."""


class Sender:
    def __init__(self, *, endpoints: Endpoints, leases: ChunkLeases, stats: RunStats, retry: RetrySettings,
                 sleep: Callable[[float], Any], prompt_cache: PromptCachePlan | NoPromptCache,
                 tiers: Tiers) -> None:
        """``prompt_cache``: the run's prompt-cache plan (runner/engine/prompt_cache.py), which gives a request's
        marks and makes them ready to send (a stored prefix stored first); :class:`NoPromptCache` marks nothing.
        ``tiers``: each stage and model's service tier (a stage that asks none is sent as it always was)."""
        self.endpoints = endpoints
        self.leases = leases
        self.stats = stats
        self.retry = retry
        self.sleep = sleep
        self._retrying = retrying(retry, on_retry=self._count_retry, sleep=sleep)
        self.prompt_cache = prompt_cache
        self.tiers = tiers
        #: whether the run's notes said that shed flex requests went at standard (said once a run)
        self.fell_back = False

    async def send(self, req: Task, endpoint: Endpoint, tries: Tally,
                   reserve_again: Callable[[], Awaitable[bool]]) -> tuple[Completion, float]:
        """(the answer, the seconds its last attempt took), the provider started first; raises the error that ended
        the last attempt (:class:`LeaseLost` when the lease went before it was sent). ``tries`` counts the attempts
        sent. An attempt that may have been billed with no answer (it timed out) is not sent again before
        ``reserve_again()`` has kept its reservation as possibly billed and reserved the retry anew (False: no room,
        :class:`NotReserved`)."""
        pool = self.endpoints.pools.get(req.model) if self.endpoints.pools else None
        if pool is None:
            return await self._tiered(req, endpoint, tries, reserve_again)
        for _ in range(len(pool.endpoints)):
            try:
                return await self._tiered(req, endpoint, tries, reserve_again)
            except ProviderError:
                if not self.endpoints.moved(tries.via):  # its endpoint serves on, or no other does: the error stands
                    raise
                self._count_retry(req)  # its endpoint was taken out: the request goes on at another of its pool
        return await self._tiered(req, endpoint, tries, reserve_again)

    async def _tiered(self, req: Task, endpoint: Endpoint, tries: Tally,
                      reserve_again: Callable[[], Awaitable[bool]]) -> tuple[Completion, float]:
        plan = self.tiers.of(req)
        if plan is None or plan.asked != FLEX:
            return await self._retrying(self._attempt, req, endpoint, tries, reserve_again,
                                        plan.asked if plan is not None else None)
        return await self._flex(plan, req, endpoint, tries, reserve_again)

    async def _flex(self, plan: TierPlan, req: Task, endpoint: Endpoint, tries: Tally,
                    reserve_again: Callable[[], Awaitable[bool]]) -> tuple[Completion, float]:
        """A flex request through its sheds: sent again at flex within ``retry.flex_wait`` seconds of its first
        attempt, then at standard where the stage falls back, else the last shed is its error."""
        loop = asyncio.get_running_loop()
        wait = self.tiers.flex_wait
        deadline = loop.time() + wait
        while True:
            try:
                return await self._retrying(self._attempt, req, endpoint, tries, reserve_again, FLEX)
            except FlexUnavailable as exc:
                tries.shed += 1
                cap = min(self.retry.backoff_max, self.retry.backoff_initial * 2 ** min(tries.shed - 1, 30))
                pause = exc.retry_after if exc.retry_after is not None else cap / 2 + random.uniform(0, cap / 2)
                if loop.time() + pause < deadline:
                    self._count_retry(req)
                    await self.sleep(pause)
                    continue
                if plan.fallback != STANDARD:
                    raise FlexUnavailable(f"{exc}; still shed after {wait:g} s of retries at flex (retry.flex_wait), "
                                          "and the stage has no fallback: standard", status=exc.status) from exc
            break
        if not self.fell_back:
            self.fell_back = True
            self.stats.notes.append(f"stage {req.stage}: {req.model}'s flex requests still shed after {wait:g} s "
                                    "(retry.flex_wait) are sent at the standard tier (fallback: standard) and charged "
                                    "at its price; each result line's provenance.tier.served says which")
        self._count_retry(req)
        return await self._retrying(self._attempt, req, endpoint, tries, reserve_again, STANDARD)

    def _count_retry(self, task: Task) -> None:
        self.stats.counters(task.stage, task.model).retries += 1

    async def _attempt(self, req: Task, endpoint: Endpoint, tries: Tally, reserve_again: Callable[[], Awaitable[bool]],
                       tier: str | None = None) -> tuple[Completion, float]:
        if tries.last_possibly_billed:
            tries.last_possibly_billed = False
            if not await reserve_again():
                raise NotReserved(req.item)
        call = req.call
        provider_key, model_name, admitted, member = call.provider, call.model_name, endpoint, None
        if self.endpoints.pools and (member := self.endpoints.current(endpoint, self.prompt_cache.group(req))):
            endpoint, provider_key, model_name = member.endpoint, member.provider, member.model_name
            tries.via = endpoint
        await self.endpoints.start(provider_key)
        if endpoint.dead is not None:
            raise AuthError(f"not sent: {endpoint.dead}")
        if endpoint.counts_tokens:
            taken = await endpoint.ready(input_tokens(req), req.call.params.get("max_tokens") or 0)
        else:
            taken = await endpoint.ready()
        try:  # until the attempt ends, what it took may not be at the server's count yet (buckets.Bucket)
            return await self._send_once(req, endpoint, tries, provider_key, model_name, admitted, member, tier)
        finally:
            endpoint.arrived(taken)

    async def _send_once(self, req: Task, endpoint: Endpoint, tries: Tally, provider_key: str, model_name: str,
                         admitted: Endpoint, member: Member | None, tier: str | None) -> tuple[Completion, float]:
        """One request sent once at ``endpoint`` (its pool's ``member`` when pooled), its answer stamped with what
        served it; a provider's error is recorded on the endpoint and raised."""
        if await self.leases.lost_lease_of(req):  # checked last before each attempt: after a stall, it may be another's
            raise LeaseLost(req.item)
        call = req.call
        marks = self.prompt_cache.marks(req) if call.pairs is None else None
        if marks is not None and marks.store_key is not None:
            marks = await self.prompt_cache.ready(req, marks)
        tries.sent += 1
        loop = asyncio.get_running_loop()
        started = loop.time()
        provider = self.endpoints.providers[provider_key]
        try:
            # the tier goes beside what the cache key holds: it changes the price, not the answer
            params = call.params if tier is None else {**call.params, "service_tier": tier}
            if call.pairs is not None:
                completion = await provider.loglikelihood(model_name, call.pairs)
            elif marks is not None:
                completion = await provider.execute(
                    model_name, *provider.mark_prompt_cache(model_name, call.messages, params, marks))
            else:
                completion = await provider.execute(model_name, call.messages, params)
        except ProviderError as exc:
            self._failed(exc, endpoint, tries, provider, model_name, admitted, member, tier)
            raise
        endpoint.answered()
        first_answer()  # a tokenizer waiting for it may be built now (runner/providers/tokens.py)
        if member is not None:
            self.endpoints.outcome(endpoint, None)
        stamp(completion, _sent_with(provider, model_name, member))  # for the result line's provenance
        if member is not None:
            completion.endpoint = member.label  # charged at its price, in a ledger row of its own
        latency = loop.time() - started
        endpoint.observe(completion.rate, latency)
        if tier is not None and completion.tier is None:  # the API did not say: served as sent
            completion.tier = tier
        return completion, latency

    def _failed(self, exc: ProviderError, endpoint: Endpoint, tries: Tally, provider: Provider, model_name: str,
                admitted: Endpoint, member: Member | None, tier: str | None) -> None:
        """What a provider's error says about the endpoint (paused, failing, its key refused) and about the request
        (possibly billed; a billed refusal's provenance and tier)."""
        if member is not None:
            self.endpoints.outcome(endpoint, exc)
            if isinstance(exc, RateLimited) and endpoint is not admitted:  # the policy pauses the admitting one
                endpoint.pause(exc.retry_after if exc.retry_after is not None else self.retry.backoff_initial)
        if isinstance(exc, Refused) and isinstance(exc.billed, Completion):
            stamp(exc.billed, _sent_with(provider, model_name, member))
            exc.billed.endpoint = member.label if member is not None else None
            exc.billed.tier = exc.billed.tier or tier  # a billed refusal is charged at the tier that served it
        tries.last_possibly_billed = exc.possibly_billed
        if isinstance(exc, AuthError) and endpoint.dead is None:
            endpoint.dead = exc  # before the endpoint opens: nothing else is sent with a refused key
        endpoint.answered()
        if isinstance(exc, RateLimited):
            tries.rate_limited += 1
            endpoint.failed()
        elif isinstance(exc, TransientError) and exc.error_class in LOAD_ERRORS:
            endpoint.failed()


def _sent_with(provider: Provider, model_name: str, member: Member | None) -> str | None:
    """What sent a request, for its result line's provenance: with the endpoint of its pool that served it."""
    sent = provider.sent_with(model_name)
    return sent if member is None else f"{sent or provider.name} at {member.label}"
