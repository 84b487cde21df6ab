"""A request's budget reservation (ARCHITECTURE.md invariant 3): its worst case (USD and tokens) reserved against the
budgets that cover it (runner/engine/budget.py) and in the store's ledger before it is sent, settled to what its
answer cost or given back; a budget that has no room left closes its stage, its model or the run. Also what an answer
costs at the run's prices (the Batch API's for a batch line)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from runner.engine.budget import LATER, Budgets, Exhausted, Reservation, Scope, budgets_of
from runner.engine.control import RunControl
from runner.engine.exact_counts import CountsAhead, ExactCounts
from runner.engine.leases import ChunkLeases
from runner.engine.ledger_writes import LedgerWrites
from runner.engine.pools import endpoint_prices
from runner.engine.stats import RunStats
from runner.engine.tiers import Tiers, tier_rates
from runner.engine.workers import POLL
from runner.errors import StoreError
from runner.plan.request import Task
from runner.providers.base import Completion
from runner.providers.pricing import Pricing, Rates
from runner.providers.tokens import (
    bound_call_tokens,
    build_soon,
    byte_bound,
    count_call_tokens,
    counts_now,
    exact,
)
from runner.spec.pools import batch_endpoint
from runner.spec.schema import Job
from runner.store import ReserveAsk, Store
from runner.store.fencing import Fenced
from runner.store.offloop import LoopStore, off_loop

#: the reservation of a free request outside any budget: no scope, no ledger row (never mutated)
FREE = Reservation([], 0.0, 0)


def input_tokens(req: Task) -> int:
    """The request's input tokens (exact or expected), counted once: the endpoint's token buckets take them, and the
    budget reservation starts from them (:meth:`Reserver.worst_case`). Until the tokenizer the count needs is
    built (off the path to the first request: ``tokens.build_soon``), its byte bound, which is not kept."""
    call = req.call
    if call.input_tokens is None:
        if not counts_now(call.provider, call.model_name, call.pairs):
            build_soon(call.provider, call.model_name, call.pairs)
            return byte_bound(call.messages, call.pairs)
        call.input_tokens = count_call_tokens(call.provider, call.model_name, call.messages, call.pairs)
    return call.input_tokens


def count_now(req: Task) -> bool:
    """Count ``req``'s input tokens now, building the tokenizer if need be, when its worst case was taken from the
    byte bound (:func:`input_tokens`) and the count can lower it (the provider's count is exact); True when it
    did: a budget the bound does not fit may still hold the request."""
    call = req.call
    if call.input_tokens is not None or not exact(call.provider, call.model_name) or call.pairs is not None:
        return False
    call.input_tokens = count_call_tokens(call.provider, call.model_name, call.messages, call.pairs)
    return True


class Reserver:
    def __init__(self, *, run_id: str, job: Job, store: Store | LoopStore, stats: RunStats, control: RunControl,
                 leases: ChunkLeases, resume: bool = False,
                 settled: Callable[[float], Awaitable[None]] | None = None, counts: ExactCounts | None = None,
                 tiers: Tiers | None = None) -> None:
        """``counts``: the run's exact input-token counts (runner/engine/exact_counts.py), asked before a request a
        budget covers is reserved; without them the byte bound is reserved where the tokenizer is not here.
        ``tiers``: each stage and model's service tier (the job's, when not given)."""
        self.run_id = run_id
        self.counts = counts
        #: waits (at most the given seconds) until this process's settled requests are written to the store
        #: (the writer's next commit); without one, the given seconds
        self.settled = settled if settled is not None else asyncio.sleep
        self.store = off_loop(store)
        #: the ledger's reservations, written in groups
        self.ledger = LedgerWrites(self.store)
        self.stats = stats
        self.control = control
        self.leases = leases
        self.stage_names = [stage.name for stage in job.stages]
        self.pricing = Pricing(job)
        #: a pooled model's endpoints, each by its label, priced as ``provider:model`` at that endpoint where that
        #: has a price, else as the pooled model
        self.pool_prices: dict[str, dict[str, str]] = {model: endpoint_prices(self.pricing, model, pool)
                                                       for model, pool in job.pools.items()}
        #: a pooled model's batch lines are priced as the endpoint that takes its batches (runner/engine/pools.py)
        self.batch_prices = {model: self.pool_prices[model].get(via.endpoint, model)
                             for model in job.pools if (via := batch_endpoint(job, model)) is not None}
        self.tiers = tiers if tiers is not None else Tiers(job)
        self.budgets: Budgets | None = budgets_of(job)
        if self.budgets is not None and resume:  # what earlier attempts of this run spent still counts
            for stage, model, usd, tokens in self.store.sync.spent(run_id):
                self.budgets.spend(stage, model, usd, tokens)
        #: the budget that ran out, when one did (the run ends ``budget_exhausted``)
        self.exhausted: Scope | None = None
        self.closed_stages: set[str] = set()
        self.closed_models: set[tuple[str, str]] = set()
        self._free: dict[str, bool] = {}
        self._counts_tokens: dict[tuple[str, str], bool] = {}
        #: (at most how many input tokens the request may write to the prompt cache, None: any; whether for an
        #: hour) of a request, a batch line when told: the run's prompt-cache plan says (``PromptCachePlan.writes``,
        #: set by runner/engine/assembly.py); until then every token, for an hour
        self.cache_writes: Callable[[Task, bool], tuple[int | None, bool]] = lambda req, batch: (None, True)

    # -- before a request is sent ------------------------------------------------------------------------
    def closed(self, req: Task) -> bool:
        """Whether a budget covering ``req`` ran out (its stage's or its model's: the run's stops the run)."""
        return req.stage in self.closed_stages or (req.stage, req.model) in self.closed_models

    def free(self, model: str) -> bool:
        """Whether a request of ``model`` needs no reservation at all (no budget, and the model costs nothing)."""
        return self.budgets is None and not self.priced(model)

    def count_ahead(self, reqs: list[Task], spawn: Callable[[Any], None]) -> CountsAhead | None:
        """The input-token counts of those of ``reqs`` a budget covers, started ahead of their reservations as the
        dispatch goes (:class:`CountsAhead`); None when the run counts nothing."""
        if self.counts is None or self.budgets is None:
            return None
        return CountsAhead(self.counts, reqs,
                           lambda req: not self.closed(req) and any(self._limits(req.stage, req.model)), spawn)

    async def reserve(self, req: Task, *, batch: bool = False) -> Reservation | str | None:
        """Reserve the request's worst case against its budgets and in the ledger; None when a budget ran out (or
        the request's lease was lost at the ledger's write: it is not sent). A batch line is priced at the Batch
        API's price and never waits: it gets ``LATER`` while the budget has reservations in flight (a batch's
        settle only when the whole batch has ended)."""
        if self.counts is not None and self.budgets is not None and any(self._limits(req.stage, req.model)):
            await self.counts.count(req)  # the provider's own count, where it has one: reserved as it is
        usd, tokens = self.worst_case(req, batch=batch)
        fence = None if batch else self.leases.fence(req)
        while True:
            crew = self.leases.crew
            worker = crew.worker if crew is not None else None
            if self.budgets is None:
                reservation = Reservation([], usd, tokens)
            else:
                got = self.budgets.try_reserve(req.stage, req.model, usd, tokens)
                if isinstance(got, Exhausted) and count_now(req):  # the byte bound did not fit: the count may
                    usd, tokens = self.worst_case(req, batch=batch)
                    continue
                if isinstance(got, Exhausted) and not batch:  # wait for reservations in flight to settle
                    got = await self.budgets.reserve(req.stage, req.model, usd, tokens)
                if isinstance(got, Exhausted):
                    if batch and got.scope.inflight:
                        return LATER
                    self.out_of_budget(req, got.scope)
                    return None
                reservation = got
            limits, token_limits = self._limits(req.stage, req.model)
            if usd <= 0 and not token_limits:
                return reservation
            try:
                # The store has the last word: it counts what every process working on the run spent and reserved,
                # in USD and in tokens (with no limits, the reservation is only written). One transaction writes
                # the reservations asked at about the same moment (runner/engine/ledger_writes.py).
                ledger_id, blocked, inflight = await self.ledger.reserve(ReserveAsk(
                    self.run_id, req.stage, req.model, req.key, usd, tokens, worker, fence, limits, token_limits))
            except Fenced:  # its lease was taken over: not sent (the caller drops it)
                self.release_budgets(reservation)
                self.leases.fenced(req, fence)
                return None
            if ledger_id is not None:
                reservation.ledger_id = ledger_id
                return reservation
            assert self.budgets is not None and blocked is not None
            self.budgets.release(reservation)
            if count_now(req):  # the byte bound did not fit: the count may
                usd, tokens = self.worst_case(req, batch=batch)
                continue
            if not inflight:
                self.out_of_budget(req, self.budgets.scope_named(blocked))
                return None
            if batch:
                return LATER
            if self.control.stopping:
                return None
            # this process's answers, settled here but still on their way to the store, or another process's
            # reservations, may settle below their worst case
            await self.settled(POLL)

    def store_failed(self, exc: Exception) -> None:
        """A reservation the store could not write, asked by a task of its own: the run ends on the store's
        failure as on a posted call's (the run's handler says it in one sentence), or, without one, with it."""
        if self.store.on_error is not None:
            self.store.on_error(exc)
        else:
            self.control.fail(StoreError(f"the store failed: {exc}"))

    async def reserve_extra(self, stage: str, model: str, key: str, usd: float) -> Reservation | None:
        """Reserve ``usd`` that is no request's (a prompt prefix stored at the provider, runner/engine/
        stored_prompts.py) under ``key``, when every budget covering ``stage`` and ``model`` has room for it now;
        None when one has not: the caller does without. Never waits, never closes a budget."""
        crew = self.leases.crew
        worker = crew.worker if crew is not None else None
        if self.budgets is None:
            reservation = Reservation([], usd, 0)
        else:
            got = self.budgets.try_reserve(stage, model, usd, 0)
            if isinstance(got, Exhausted):
                return None
            reservation = got
        limits = self.budgets.usd_limits(stage, model) if self.budgets is not None else {}
        if not limits:
            reservation.ledger_id = await self.store.reserve(self.run_id, stage, model, key, usd, worker)
            return reservation
        ledger_id, _, _ = await self.store.reserve_within(self.run_id, stage, model, key, usd, limits, worker)
        if ledger_id is None:
            assert self.budgets is not None
            self.budgets.release(reservation)
            return None
        reservation.ledger_id = ledger_id
        return reservation

    def hold_again(self, req: Task, ledger_id: int | None) -> Reservation:
        """The reservation of a line an earlier process of the run submitted in a batch, back in this process's
        budgets whether it fits or not (it will be billed); its ledger row is still there."""
        # its marks were another process's plan: priced as though every input token could be written, for an hour
        usd, tokens = self.worst_case(req, batch=True, writes=(None, True))
        if self.budgets is None:
            return Reservation([], usd, tokens, ledger_id)
        reservation = self.budgets.hold(req.stage, req.model, usd, tokens)
        reservation.ledger_id = ledger_id
        return reservation

    def _limits(self, stage: str, model: str) -> tuple[dict[str, float], dict[str, int]]:
        """The USD and the token limits covering a request, by the store's scope names (none without budgets)."""
        if self.budgets is None:
            return {}, {}
        return self.budgets.usd_limits(stage, model), self.budgets.token_limits(stage, model)

    def counts_tokens(self, stage: str, model: str) -> bool:
        """Whether a token budget covers requests of ``stage`` and ``model``: then even an answer that cost nothing
        is charged in the ledger, with its tokens, so every process on the run counts them."""
        found = self._counts_tokens.get((stage, model))
        if found is None:
            found = self._counts_tokens[stage, model] = bool(self._limits(stage, model)[1])
        return found

    def worst_case(self, req: Task, *, batch: bool = False,
                   writes: tuple[int | None, bool] | None = None) -> tuple[float, int]:
        """(USD, tokens) the request can cost at most: its input tokens (exact: tiktoken's, the simulated server's
        rule, or the provider's count endpoint's; else a true upper bound: ``bound_call_tokens``) and
        ``max_tokens``, in USD at the model's
        prices (the Batch API's for a batch line, where the model has them; online, the dearest tier the answer may
        be served at: runner/engine/tiers.py), with the cache-write price only for the tokens its prompt-cache marks
        let the provider write (``writes``, else :attr:`cache_writes`)."""
        total, tokens, max_tokens = self._bound(req)
        writable, hour = writes if writes is not None else self.cache_writes(req, batch)
        pooled = self.pool_prices.get(req.model) if self.pool_prices and not batch else None
        if pooled is None:
            model = self.batch_prices.get(req.model, req.model) if batch else req.model
            return self._worst_usd(req, model, tokens, max_tokens, writable, hour, batch), total
        # a pool: its dearest endpoint's price
        return max(self._worst_usd(req, model, tokens, max_tokens, writable, hour, batch)
                   for model in set(pooled.values())), total

    def _worst_usd(self, req: Task, model: str, tokens: int, max_tokens: int, writable: int | None, hour: bool,
                   batch: bool) -> float:
        rates = self.pricing.batch_rates(model) if batch else None
        plan = None if batch else self.tiers.of(req)
        if plan is not None:  # a tier without a price is refused before the run (check_tier_prices): standard's
            return max((tier_rates(self.pricing, model, tier) or self.pricing.require(model))
                       .worst_case(tokens, max_tokens, writable, hour) for tier in plan.may_serve)
        return rates.worst_case(tokens, max_tokens, writable, hour) if rates is not None else \
            self.pricing.worst_case(model, tokens, max_tokens, writable=writable, hour=hour)

    def priced_as(self, req: Task, c: Completion) -> str:
        """The model an answer is priced as: a pooled model's at the endpoint that answered (``c.endpoint``)."""
        if c.endpoint is None or not self.pool_prices:
            return req.model
        return self.pool_prices.get(req.model, {}).get(c.endpoint, req.model)

    @staticmethod
    def _bound(req: Task) -> tuple[int, int, int]:
        """(all, input, output) tokens the request can use at most."""
        max_tokens = req.call.params.get("max_tokens") or 0
        call = req.call
        if call.tokens_exact and call.input_tokens is not None:  # counted by the provider (exact_counts.py)
            return call.input_tokens + max_tokens, call.input_tokens, max_tokens
        counted = input_tokens(req)
        if call.input_tokens is None:  # not counted yet: its byte bound, which bounds every count
            return counted + max_tokens, counted, max_tokens
        tokens = bound_call_tokens(call.provider, call.model_name, call.messages, call.pairs, counted=counted)
        return tokens + max_tokens, tokens, max_tokens

    def out_of_budget(self, req: Task, scope: Scope) -> None:
        """``scope`` has no room for ``req``: the run stops, or the stage or the model does."""
        self.stats.counters(req.stage, req.model).over_budget += 1
        if scope.kind == "run":
            self.exhausted = scope
            self.control.stop()
        elif scope.kind == "stage":
            self.closed_stages.add(req.stage)
        else:
            self.closed_models.update((stage, scope.name) for stage in self.stage_names)
        self.stats.notes.append(f"{scope.describe()} is spent: "
                                + ("the run stops" if scope.kind == "run" else f"{scope.kind} {scope.name} stops"))

    # -- after it ------------------------------------------------------------------------------------------
    def release(self, reservation: Reservation) -> None:
        """The request was not sent, or ended unbilled: its reservation goes back, in the budgets and the ledger."""
        self.release_budgets(reservation)
        if reservation.ledger_id is not None:
            self.store.post("release", reservation.ledger_id)

    def keep_possibly_billed(self, req: Task, reservation: Reservation) -> None:
        """An attempt that may have been billed got no answer (it timed out): its worst case stays spent, in the
        budgets and in the ledger as 'possibly_billed', as a request in flight at a kill does (ARCHITECTURE.md
        invariant 3); a request that held no ledger row (a free model) gets one, at its worst case in tokens."""
        if self.budgets is not None and reservation.scopes:
            self.budgets.settle(reservation, reservation.usd, reservation.tokens)
        usd, tokens = (reservation.usd, reservation.tokens) if reservation.tokens else (0.0, self._bound(req)[0])
        crew = self.leases.crew
        self.store.post("keep_possibly_billed", self.run_id, req.stage, req.model, req.key, usd, tokens,
                        reservation.ledger_id, crew.worker if crew is not None else None)

    def release_budgets(self, reservation: Reservation) -> None:
        """The same in the budgets only (the writer removes its ledger row with the task it finishes)."""
        if self.budgets is not None and reservation.scopes:
            self.budgets.release(reservation)

    def settle(self, reservation: Reservation, usd: float, tokens: int) -> None:
        """The answer came: the reservation becomes what it cost (its ledger row becomes the charge in the writer's
        transaction)."""
        if self.budgets is not None and reservation.scopes:
            self.budgets.settle(reservation, usd, tokens)

    def settle_failure(self, req: Task, reservation: Reservation | None, billed: bool, usd: float,
                       tokens: int) -> None:
        """A request that got no answer: its reservation (if this process holds one) is settled to what the provider
        billed, or given back when it billed nothing; a bill with no reservation held is counted as spent."""
        if self.budgets is None:
            return
        if reservation is not None and reservation.scopes:
            if billed:
                self.budgets.settle(reservation, usd, tokens)
            else:
                self.budgets.release(reservation)
        elif billed:
            self.budgets.spend(req.stage, req.model, usd, tokens)

    # -- prices ---------------------------------------------------------------------------------------------
    def served_rates(self, req: Task, c: Completion) -> Rates:
        """The rates an online answer is charged at: those of the tier that served it (``c.tier``, as the answer said
        or as it was sent), the model's standard ones where it names none or that tier has no price."""
        model = self.priced_as(req, c)
        rates = tier_rates(self.pricing, model, c.tier) if c.tier is not None else None
        return rates if rates is not None else self.pricing.require(model)

    def cost(self, req: Task, c: Completion, *, batch: bool = False) -> tuple[float, float | None]:
        """(USD, what the Batch API's price saved or None) of an answer's usage at the run's prices (online, at the
        tier that served it)."""
        if not self.priced(req.model):
            return 0.0, (0.0 if batch else None)
        cost = self.served_rates(req, c).cost(c.input_tokens, c.output_tokens, c.cached_tokens,
                                              c.cache_write_tokens, c.cache_write_1h_tokens)
        if not batch:
            return cost, None
        rates = self.pricing.batch_rates(self.priced_as(req, c))
        batch_cost = rates.cost(c.input_tokens, c.output_tokens, c.cached_tokens, c.cache_write_tokens,
                                c.cache_write_1h_tokens) \
            if rates is not None else cost
        return batch_cost, cost - batch_cost

    def cache_saved(self, req: Task, c: Completion, cost: float, *, batch: bool = False) -> float:
        """What the provider's prompt cache saved on an answer that cost ``cost``: its price with every input token
        uncached, less ``cost`` (negative when it only wrote, at a premium)."""
        if not (c.cached_tokens or c.cache_write_tokens) or not self.priced(req.model):
            return 0.0
        rates = self.pricing.batch_rates(self.priced_as(req, c)) if batch else None
        rates = rates or self.served_rates(req, c)
        return rates.cost(c.input_tokens, c.output_tokens) - cost

    def saved(self, model: str, input_tokens: int, output_tokens: int, cached_tokens: int) -> float:
        """What a cache hit of this usage would have cost."""
        return self.pricing.cost(model, input_tokens, output_tokens, cached_tokens) if self.priced(model) else 0.0

    def priced(self, model: str) -> bool:
        """Whether the model costs anything (a free model needs no reservation unless a budget counts tokens)."""
        found = self._free.get(model)
        if found is None:  # an unknown price counts as free: without a budget the run goes on (and warns)
            rates = self.pricing.rates(model)
            found = self._free[model] = rates is None or rates.is_free
        return not found
