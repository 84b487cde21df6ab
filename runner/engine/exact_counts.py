"""Exact input tokens for budget reservations: a request covered by a budget whose provider has a token-counting
endpoint for its model (Claude and Gemini, directly, on Vertex and on Bedrock: ``Provider.count_request``,
runner/providers/token_counts.py) has its input tokens counted by that endpoint before it is reserved, so the
reservation (``Reserver.worst_case``) takes the count as it is instead of the byte bound, which is 4 times the
real count at least and about 10 times at the median, and which left a budgeted run stopping with much of its
budget unspent.

- Once per distinct prompt: a count is kept under ``count_key`` (a hash of what is counted, the provider, its
  server and the model), looked for in this process's recent counts, then in the store's ``token_counts``, and only
  then asked of the provider; the same prompt asked by several requests at once is asked once. A new count goes to
  the store (those that finish together in one write, posted without waiting), so a resume or a later run of the
  same prompts asks nothing again.
- Rate-limited as an endpoint of its own (``Provider.count_endpoint``: one per provider and key), apart from the
  model's buckets: ``count_rpm`` where the job sets it, the provider's concurrency, a 429's Retry-After pausing
  every count request of that endpoint.
- Before the reservation: ``Reserver.reserve`` awaits :meth:`ExactCounts.count`, which sets the call's
  ``input_tokens`` to the count and its ``tokens_exact``; the endpoint's token buckets then take the count too.
  A chunk's prompts are counted ahead of its dispatch (:class:`CountsAhead`), so the reservations do not wait for
  one count round trip after another.
- A count that fails leaves the request to the byte bound, as before: a 429 is waited out (up to
  ``RATE_LIMIT_ATTEMPTS`` times), another transient failure tried again (up to ``ATTEMPTS`` times); a refusal (a
  model the endpoint does not count, a refused key) or ``FAILURES_IN_A_ROW`` failed counts in a row (or as many
  failed tries in a row as they make, whichever comes first: counts asked ahead fail together) turn counting off
  for that endpoint for the rest of the run. A provider's first failure is said once, in one line of the run's
  notes; ``providers: {NAME: {count_tokens: false}}`` turns counting off from the start.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from runner.engine.endpoints import Endpoints
from runner.engine.limits import Endpoint
from runner.engine.stats import RunStats
from runner.errors import ProviderError, RateLimited, TransientError
from runner.plan.request import Task
from runner.providers.base import Provider
from runner.providers.token_counts import count_key
from runner.store import Store
from runner.store.offloop import LoopStore, off_loop

__all__ = ["AHEAD", "ATTEMPTS", "CountsAhead", "FAILURES_IN_A_ROW", "RATE_LIMIT_ATTEMPTS", "ExactCounts"]

#: tries of one count that fails with a transient error (a 5xx, a timeout, a dropped connection)
ATTEMPTS = 3
#: tries of one count answered 429, each after the endpoint's pause
RATE_LIMIT_ATTEMPTS = 5
#: counts in a row that failed after their tries, after which the endpoint is not asked again this run
FAILURES_IN_A_ROW = 3
#: counts this process remembers (the store keeps them all)
RECENT = 16_384
#: seconds before the first try again of a transient failure (doubled each time), and a 429's pause without one
BACKOFF_S = 0.2
#: how far ahead of the dispatch a chunk's requests are counted (the count endpoint's own limits bound what reaches
#: the provider at once)
AHEAD = 64


class _Gate:
    """One count endpoint's limiter and its state in this run."""

    __slots__ = ("endpoint", "failed_tries", "failures", "off")

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        #: counts in a row that failed, and tries in a row that failed
        self.failures = 0
        self.failed_tries = 0
        #: why counting is off for this endpoint (None: on)
        self.off: str | None = None


class ExactCounts:
    """The run's exact counts (see the module's docstring): given the run's endpoints (the providers, started once,
    and the crew that shares the limits), the store and the live counters' notes."""

    def __init__(self, *, endpoints: Endpoints, store: Store | LoopStore, stats: RunStats,
                 sleep: Callable[[float], Any] = asyncio.sleep) -> None:
        self.endpoints = endpoints
        self.store = off_loop(store)
        self.stats = stats
        self._sleep = sleep
        self._recent: OrderedDict[str, int] = OrderedDict()
        self._asking: dict[str, asyncio.Future[int | None]] = {}
        self._gates: dict[str, _Gate] = {}
        self._said: set[str] = set()
        self._unsaved: list[tuple[str, str, str, int]] = []
        #: counts asked of the providers, and counts found in the store, in this process
        self.asked = 0
        self.found = 0

    def provider_of(self, req: Task) -> Provider | None:
        """The provider that counts ``req``'s input tokens, or None (a log-likelihood call, a count already there,
        a provider whose ``count_tokens`` setting is off)."""
        call = req.call
        if call.pairs is not None or call.tokens_exact:
            return None
        provider = self.endpoints.providers.get(call.provider)
        if provider is None or not provider.settings_for(call.model_name).count_tokens:
            return None
        return provider

    async def count(self, req: Task) -> None:
        """Count ``req``'s input tokens where its provider can (its call's ``input_tokens`` and ``tokens_exact``
        set); where it cannot, or the count fails, the call is left as it was (the byte bound is reserved)."""
        provider = self.provider_of(req)
        if provider is None:
            return
        call = req.call
        try:
            request = provider.count_request(call.model_name, call.messages, call.params)
        except ProviderError:  # a request the provider cannot take: its send says so
            return
        if request is None:
            return
        key = count_key(provider.name, provider.settings.base_url, call.model_name, request)
        tokens = self._recent.get(key)
        if tokens is not None:
            self._recent.move_to_end(key)
        else:
            tokens = await self._once(key, provider, call.model_name, request)
        if tokens is not None:
            call.input_tokens = provider.count_reserved(call.model_name, tokens)
            call.tokens_exact = True

    async def quietly(self, req: Task) -> None:
        """:meth:`count`, asked ahead of the reservation (:class:`CountsAhead`): a count that fails here is left to
        the reservation, which asks again and takes what it finds."""
        with contextlib.suppress(Exception):
            await self.count(req)

    async def _once(self, key: str, provider: Provider, model: str, request: dict[str, Any]) -> int | None:
        """The count under ``key``, looked up or asked once however many requests want it at the same time."""
        asking = self._asking.get(key)
        if asking is not None:
            return await asyncio.shield(asking)
        future: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self._asking[key] = future
        tokens = None
        try:
            tokens = await self._look_up(key, provider, model, request)
        finally:
            del self._asking[key]
            future.set_result(tokens)  # those waiting for it get the count, or None (the bound) if this failed
        return tokens

    async def _look_up(self, key: str, provider: Provider, model: str, request: dict[str, Any]) -> int | None:
        stored = (await self.store.token_counts([key])).get(key)
        if stored is not None:
            self.found += 1
            self._remember(key, stored)
            return stored
        gate = self._gate(provider, model)
        if gate.off is not None:
            return None
        tokens = await self._ask(gate, provider, model, request)
        if tokens is not None:
            self.asked += 1
            self._remember(key, tokens)
            self._keep((key, provider.name, model, tokens))
        return tokens

    def _gate(self, provider: Provider, model: str) -> _Gate:
        name = provider.count_endpoint(model)
        gate = self._gates.get(name)
        if gate is None:
            settings = provider.settings_for(model)
            endpoint = Endpoint(f"{name} (token counts)", concurrency=settings.concurrency or
                                provider.default_concurrency, rpm=settings.count_rpm, sleep=self._sleep)
            crew = self.endpoints.crew
            if crew is not None:
                endpoint.set_share(1 / crew.live)
            gate = self._gates[name] = _Gate(endpoint)
        return gate

    async def _ask(self, gate: _Gate, provider: Provider, model: str, request: dict[str, Any]) -> int | None:
        """The provider's count, under its endpoint's limits and the tries above; None when it failed."""
        try:
            await self.endpoints.start(provider.name)
        except Exception:  # noqa: BLE001 - the provider does not start: its first send says why, and the run ends
            return None
        endpoint, tries, limited = gate.endpoint, 0, 0
        while True:
            await endpoint.slots.acquire()
            if gate.off is not None:  # turned off while this count waited for its slot
                endpoint.slots.release()
                return None
            taken = None
            try:
                taken = await endpoint.ready()
                tokens = await provider.count_tokens(model, request)
            except RateLimited as exc:
                limited += 1
                endpoint.pause(exc.retry_after if exc.retry_after is not None else BACKOFF_S * 2 ** limited)
                failure: Exception = exc
                if limited < RATE_LIMIT_ATTEMPTS:
                    continue
            except TransientError as exc:
                tries += 1
                failure = exc
                gate.failed_tries += 1
                if gate.failed_tries >= ATTEMPTS * FAILURES_IN_A_ROW:
                    # as many tries as FAILURES_IN_A_ROW counts make, failed in a row: counts asked ahead together
                    # would otherwise each make their tries before any of them has failed them all
                    gate.off = gate.off or f"{gate.failed_tries} tries in a row failed"
                elif tries < ATTEMPTS:
                    await self._sleep(BACKOFF_S * 2 ** (tries - 1))
                    continue
            except Exception as exc:  # noqa: BLE001 - refused (or a defect): counting goes off, the run goes on
                failure = exc
                gate.off = str(exc)
            else:
                gate.failures = gate.failed_tries = 0
                return tokens
            finally:
                if taken is not None:
                    endpoint.arrived(taken)  # (runner/engine/buckets.py: Bucket)
                endpoint.answered()
                endpoint.slots.release()
            break
        gate.failures += 1
        if gate.failures >= FAILURES_IN_A_ROW and gate.off is None:
            gate.off = f"{gate.failures} counts in a row failed"
        self._say(provider, model, failure)
        return None

    def _say(self, provider: Provider, model: str, failure: Exception) -> None:
        """The provider's first failed count, in one line of the run's notes (never one per request)."""
        if provider.name in self._said:
            return
        self._said.add(provider.name)
        reason = str(failure) if isinstance(failure, ProviderError) else f"{type(failure).__name__}: {failure}"
        self.stats.notes.append(
            f"{provider.name}:{model}: its token-counting endpoint did not count a prompt ({reason}); budgets reserve "
            f"the byte bound for {provider.name}'s requests it does not count (said once)")

    def _remember(self, key: str, tokens: int) -> None:
        self._recent[key] = tokens
        if len(self._recent) > RECENT:
            self._recent.popitem(last=False)

    def _keep(self, row: tuple[str, str, str, int]) -> None:
        """Store a new count, with the others that finish before the loop's next turn (one write)."""
        if not self._unsaved:
            asyncio.get_running_loop().call_soon(self._flush)
        self._unsaved.append(row)

    def _flush(self) -> None:
        rows, self._unsaved = self._unsaved, []
        if rows:
            self.store.post("save_token_counts", rows)


class CountsAhead:
    """The counts of a chunk's requests, each started :data:`AHEAD` requests before the dispatch reaches it. The
    dispatch reserves one request after another, so a count asked only at its reservation cost one round trip per
    distinct prompt before the next request could go; asked ahead, a reservation finds its count made or joins it
    on its way. A run that stops has counted at most :data:`AHEAD` requests it does not send (counts are free, and
    kept in the store for a resume)."""

    __slots__ = ("counts", "reqs", "spawn", "started", "wanted")

    def __init__(self, counts: ExactCounts, reqs: list[Task], wanted: Callable[[Task], bool],
                 spawn: Callable[[Any], None]) -> None:
        self.counts = counts
        self.reqs = reqs
        self.wanted = wanted
        self.spawn = spawn
        self.started = 0

    def reach(self, index: int) -> None:
        """The dispatch is at ``reqs[index]``: the counts up to :data:`AHEAD` requests beyond it are on their way."""
        end = min(index + AHEAD, len(self.reqs))
        while self.started < end:
            req = self.reqs[self.started]
            self.started += 1
            if self.wanted(req):
                self.spawn(self.counts.quietly(req))
