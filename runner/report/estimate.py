"""What a job will cost before it runs: ``runner estimate JOB.yaml`` and the first screen of ``runner submit``.

Per stage and model the plan is streamed (never held whole) and looked up in the store's memo a chunk at a time:

- **requests**, those already **in the cache** (free: a cache hit costs nothing), and **repeats** (a request
  identical to an earlier one of the job: the runner sends it once and shares the answer); the rest are **to send**;
- **input tokens** of the requests to send, counted by ``runner.providers.tokens``: exact where the provider's
  tokenizer is here (OpenAI models tiktoken knows, the simulated server) or the provider's count endpoint counted
  the prompt in a run before (runner/report/stored_counts.py); elsewhere two figures, labelled: the expected count
  (a heuristic, not a bound) and the upper bound a budget reserves (UTF-8 bytes plus framing);
- **output tokens**: at most ``max_tokens`` per request to send, and an expected figure from history: the mean
  output tokens of this stage and model's requests already in the cache (the most similar requests there are), or
  else of stored responses of the same provider and model (up to ``HISTORY_SAMPLE`` of them), each capped at
  ``max_tokens``; "no history" when neither exists;
- **cost** of the requests to send, as a range: *low* is the expected input at the input price plus the
  expected output (none without history), *high* the worst case a budget reserves (the exact or upper-bound input
  tokens at the dearest input price, ``max_tokens`` output tokens), summed request by request since
  context-length tiers price each request by its own size; and the same range at the Batch API's prices where
  genai-prices has them.

A model without a price shows "unknown price" and the ``prices:`` key to add; without ``max_tokens`` the high end
is unbounded. Nothing here needs an API key or touches the network.

Memory: the keys of the requests to send are remembered (as 64-bit integers) to find repeats, about 60 bytes per
request; everything else is per chunk.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from runner.engine.replay import replayable_tasks, stage_address
from runner.engine.tiers import Tiers
from runner.errors import RunnerError
from runner.plan.request import Task
from runner.plan.stage import StagePlan, model_key
from runner.providers.pricing import PER, Pricing, Rates
from runner.providers.tokens import bound_call_tokens, byte_bound, count_call_tokens, counts_now, exact
from runner.report.cache_estimate import CacheSums, caching_rule, storage_price
from runner.report.deadline import deadline_lines
from runner.report.pool_estimate import PoolPrices, pool_prices
from runner.report.stored_counts import StoredCounts
from runner.report.tiers import group_prices
from runner.spec.schema import Job
from runner.store import Reads, Store

__all__ = ["Estimate", "Group", "OverBudget", "estimate", "over_budget", "usd"]

#: requests looked up in the memo per query batch
CHUNK = 1000
#: stored responses read at most to find a model's mean output tokens when the job's own cache has none
HISTORY_SAMPLE = 10_000


class OverBudget(RunnerError):
    """``runner submit`` refuses a job whose worst case exceeds the run's budget (without ``--allow-partial``)."""

    exit_code = 2


@dataclass(slots=True)
class _Sums:
    """Sums over the requests to send at one price list (standard or batch), each request at its own tier."""

    input_usd: float = 0.0
    #: Σ over requests of the output price that applies to it (tiers), per token, in USD
    output_rate: float = 0.0
    high: float = 0.0

    def add(self, rates: Rates, input_tokens: int, bound: int, max_tokens: int, worst: list[Rates]) -> None:
        """``input_tokens``: the expected (or exact) count; ``bound``: what a budget reserves for them, at the
        dearest of ``worst`` (the service tiers an answer may be served at)."""
        tier = rates.at(input_tokens)
        self.input_usd += input_tokens * tier.input / PER
        self.output_rate += tier.output / PER
        self.add_bound(bound, max_tokens, worst)

    def add_bound(self, bound: int, max_tokens: int, worst: list[Rates]) -> None:
        """A request whose input tokens are known only by their bound: its worst case, no expected cost."""
        self.high += max(r.worst_case(bound, max_tokens) for r in worst)


@dataclass(slots=True)
class Group:
    """The estimate of one stage and model."""

    stage: str
    model: str
    #: ``params.max_tokens`` of the stage (None: the output, hence the high end, is unbounded)
    max_tokens: int | None
    #: whether ``input_tokens`` is the provider's own count (else the expected count, and ``input_tokens_bound``
    #: the upper bound a budget reserves)
    input_exact: bool
    #: where the price comes from, ``"unknown price"`` when there is none
    price: str
    #: the service tier asked (None: none), and the tiers its answers may be served at, whose dearest the worst
    #: case takes (runner/engine/tiers.py)
    tier: str | None = None
    tier_serves: list[str] = field(default_factory=list)
    batch_price: str | None = None
    #: how the stage sends (online, batch or auto): a batch stage's worst case is at the Batch API's price
    mode: str = "online"
    #: whether the model costs nothing (local, simulated and user servers unless the job prices them)
    free: bool = False
    requests: int = 0
    cached: int = 0
    repeats: int = 0
    to_send: int = 0
    #: input tokens of the requests to send, exact or expected (None: not counted, for a free model in ``runner
    #: submit``)
    input_tokens: int | None = 0
    #: input tokens a budget reserves for them: ``input_tokens`` when exact, else a true upper bound
    input_tokens_bound: int | None = 0
    #: requests to send whose input tokens the provider's count endpoint counted in a run before (exact)
    input_counted: int = 0
    #: whether the input tokens were only bounded, not counted (``runner submit`` does not build a tokenizer before
    #: the run: ``input_tokens``, ``cost_low`` and ``batch_low`` are then None, the worst case is the bound's)
    input_bound_only: bool = False
    output_tokens_max: int | None = None
    output_tokens_expected: float | None = None
    #: how many responses ``output_tokens_expected`` is the mean of (0: no history)
    history: int = 0
    history_source: str | None = None
    cost_low: float | None = None
    cost_high: float | None = None
    batch_low: float | None = None
    batch_high: float | None = None
    #: the prices: key to add when the price is unknown
    add_price: str | None = None
    #: with provider prompt caching planned (prompt_cache: auto, a provider that caches): the input tokens expected
    #: to be read from its cache, and the expected cost with them (None: no caching for this stage and model)
    cache_read_tokens: int | None = None
    cost_low_cached: float | None = None


@dataclass(slots=True)
class Estimate:
    job: str
    path: str
    groups: list[Group]
    elapsed: float = 0.0
    totals: dict[str, Any] = field(default_factory=dict)

    @property
    def high(self) -> float | None:
        """The worst case of the whole job as it will be sent (batch stages at the Batch API's price), or None when
        a model has no price or a stage no ``max_tokens``."""
        if self.totals.get("cost_high") is None:
            return None
        return self.totals.get("high_as_sent", self.totals.get("cost_high"))

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job, "path": self.path, "groups": [asdict(g) for g in self.groups],
                "totals": self.totals, "elapsed_s": round(self.elapsed, 3)}


class _Builder:
    """One (stage, model) group being summed."""

    def __init__(self, group: Group, rates: Rates | None, batch: Rates | None, count: bool,
                 cache: CacheSums | None = None, stored: bool = False, worst: list[Rates] | None = None,
                 pool: PoolPrices | None = None, bounded: bool = False) -> None:
        self.group = group
        #: sum the requests' byte bounds instead of counting them (see :attr:`Group.input_bound_only`)
        self.bounded = bounded
        self.stored = stored and count  # its requests may have counts stored (runner/report/stored_counts.py)
        self.rates = rates
        self.worst = worst or ([rates] if rates is not None else [])
        self.batch = batch
        self.count = count
        self.cache = cache
        self.sums = _Sums() if rates is not None else None
        self.batch_sums = _Sums() if batch is not None else None
        self.cached_out = 0
        self.cached_n = 0
        #: a pooled model's endpoints, summed each at its own price, and what a budget reserves (runner/report/
        #: pool_estimate.py)
        self.pool = pool
        self.pool_sums = [_Sums() for _ in pool.labels] if pool is not None else []
        self.reserved = _Sums()

    def add(self, req: Task, counted: int | None = None) -> None:
        """One request to send; ``counted``: its input tokens as the provider's count endpoint counted them."""
        g = self.group
        g.to_send += 1
        if not self.count:
            return
        if counted is not None:
            tokens = bound = counted
            g.input_counted += 1
        elif self.bounded:
            self._add_bound(byte_bound(req.messages, req.call.pairs))
            return
        else:
            tokens = count_call_tokens(req.provider, req.model_name, req.messages, req.call.pairs)
            bound = bound_call_tokens(req.provider, req.model_name, req.messages, req.call.pairs, counted=tokens)
        g.input_tokens = (g.input_tokens or 0) + tokens
        g.input_tokens_bound = (g.input_tokens_bound or 0) + bound
        max_tokens = g.max_tokens or 0
        if self.sums is not None and self.rates is not None:
            self.sums.add(self.rates, tokens, bound, max_tokens, self.worst)
        if self.batch_sums is not None and self.batch is not None:
            self.batch_sums.add(self.batch, tokens, bound, max_tokens, [self.batch])
        if self.pool is not None:
            for sums, rates, worst in zip(self.pool_sums, self.pool.rates, self.pool.worst, strict=True):
                sums.add(rates, tokens, bound, max_tokens, worst)
            self.reserved.add(self.pool.rates[0], tokens, bound, max_tokens, self.pool.every_worst)
        if self.cache is not None:
            self.cache.add(req.messages)

    def _add_bound(self, bound: int) -> None:
        g = self.group
        g.input_tokens_bound = (g.input_tokens_bound or 0) + bound
        max_tokens = g.max_tokens or 0
        if self.sums is not None:
            self.sums.add_bound(bound, max_tokens, self.worst)
        if self.batch_sums is not None and self.batch is not None:
            self.batch_sums.add_bound(bound, max_tokens, [self.batch])

    def finish(self, store: Store, provider: str, model_id: str) -> Group:
        g = self.group
        if g.to_send and g.input_counted == g.to_send:
            g.input_exact = True
        if g.input_bound_only and g.input_counted == g.to_send:  # every request counted after all, or none to send
            g.input_bound_only = False
        if g.input_bound_only:
            g.input_tokens = None
        if g.max_tokens is not None:
            g.output_tokens_max = g.max_tokens * g.to_send
        if self.cached_n:
            mean = self.cached_out / self.cached_n
            g.history, g.history_source = self.cached_n, "this stage's cached requests"
        else:
            n, mean = _history(store, provider, model_id, g.max_tokens)
            if n:
                g.history, g.history_source = n, f"stored responses of {provider}:{model_id}"
        expected = None
        if g.history:
            expected = min(mean, g.max_tokens) if g.max_tokens is not None else mean
            g.output_tokens_expected = expected * g.to_send
        for sums, low_attr, high_attr in ((self.sums, "cost_low", "cost_high"),
                                          (self.batch_sums, "batch_low", "batch_high")):
            if sums is None:
                continue
            setattr(g, low_attr, None if g.input_bound_only else sums.input_usd + (expected or 0.0) * sums.output_rate)
            setattr(g, high_attr, sums.high if g.max_tokens is not None else None)
        if self.pool is not None:
            bounded = g.max_tokens is not None
            self.pool.finish(g, [(s.input_usd + (expected or 0.0) * s.output_rate, s.high if bounded else None)
                                 for s in self.pool_sums], self.reserved.high if bounded else None)
        if self.cache is not None and self.rates is not None and g.cost_low is not None:
            g.cost_low_cached = g.cost_low - self.cache.saving(self.rates)
            g.cache_read_tokens = self.cache.read
        return g


def _history(store: Store, provider: str, model_id: str, max_tokens: int | None) -> tuple[int, float]:
    """(count, mean output tokens, each capped at ``max_tokens``) of stored responses of a provider's model."""
    cap = max_tokens if max_tokens is not None else 2**62
    return Reads(store).output_history(provider, model_id, cap, HISTORY_SAMPLE)


def _chunks(requests: Iterable[Task], size: int) -> Iterator[list[Task]]:
    chunk: list[Task] = []
    for req in requests:
        chunk.append(req)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def estimate(job: Job, store: Store, *, count_free: bool = True, bound_only: bool = False) -> Estimate:
    """Estimate ``job`` against ``store``'s memo. ``count_free=False`` skips counting the input tokens of free
    models (their cost is 0 whatever the count), and ``bound_only`` takes the byte bound of a request whose count
    would need a tokenizer not built yet (the worst case holds; the expected cost is left unknown): both for
    ``runner submit``, to get to the run sooner."""
    started = time.perf_counter()
    pricing = Pricing(job)
    tiers = Tiers(job)
    groups: list[Group] = []
    seen: set[int] = set()
    unplanned: list[str] = []
    warnings: list[str] = []
    pools: list[dict[str, Any]] = []
    stored = StoredCounts(job, store)
    for stage in job.stages:
        if not stage.is_llm:
            continue
        if stage.from_ is not None:  # a pipeline stage's rows exist only once the stages before it ran
            unplanned.append(stage.name)
            continue
        plan = StagePlan(job, stage)
        builders: dict[str, _Builder] = {}
        ids: dict[str, tuple[str, str]] = {}
        for model in plan.models:
            tier = tiers.plans.get((stage.name, model))
            rates, worst = group_prices(pricing, tier, model)
            pool = pool_prices(job, pricing, tier, model, stage)
            batch = pricing.batch_rates(pool.batch_as if pool else model) if rates is not None else None
            provider, name, model_id = model_key(model, job.endpoints, job)
            ids[model] = (provider, model_id)
            # the cap as sent: the answer's max_tokens and the thinking allowance of a reasoning model
            max_tokens = plan.model_params[model].get("max_tokens")
            group = Group(stage=stage.name, model=model, max_tokens=max_tokens, input_exact=False,
                          price=rates.source if rates is not None else "unknown price",
                          batch_price=batch.source if batch is not None else None,
                          free=rates is not None and rates.is_free, mode=job.stage_mode(stage),
                          tier=tier.asked if tier else None, tier_serves=list(tier.may_serve) if tier else [])
            if rates is None:
                group.add_price = model
            count = count_free or rates is None or not rates.is_free
            if not count:
                group.input_tokens = group.input_tokens_bound = None
            # a pool's endpoints are priced by the expected count: counted; the expected saving of prompt caching
            # is left unknown with the expected cost
            group.input_bound_only = bounded = bound_only and count and pool is None and not counts_now(provider, name)
            group.input_exact = not bounded and exact(provider, name)  # (tiktoken's import, for an OpenAI model)
            rule = caching_rule(model) if job.stage_prompt_cache(stage) == "auto" and count and not bounded else None
            builders[model] = _Builder(group, rates, batch, count, CacheSums(
                stage.name, model, rule, storage_price(job, model)) if rule is not None else None,
                not group.input_exact and stored.counter(provider) is not None, worst, pool, bounded)
        replayed = replayable_tasks(store, stage_address(job, stage, plan), stage.name)
        if replayed is not None:  # unchanged since a run that finished it: all cache hits, nothing to plan
            for model, (n, output_tokens) in replayed.items():
                builder = builders[model]
                builder.group.requests = builder.group.cached = builder.cached_n = n
                builder.cached_out = output_tokens
        else:
            _plan_groups(plan, builders, store, seen, stored)
        groups += [builders[m].finish(store, *ids[m]) for m in plan.models]
        warnings += [w for m in plan.models if (c := builders[m].cache) is not None and (w := c.reorder_warning())]
        pools += [p.as_dict() for m in plan.models if (p := builders[m].pool) is not None]
    result = Estimate(job=job.name, path=job.path, groups=groups)
    result.totals = _totals(groups)
    result.totals["warnings"] = warnings
    result.totals["unplanned_stages"] = unplanned
    if pools:  # the totals of a job with no pool say what they said before
        result.totals["pools"] = pools
    # each mode's cost and time and the planned mix, per deadline (runner/report/deadline.py)
    result.totals["deadline"] = deadline_lines(job, groups, store) if any(
        job.stage_deadline(s) is not None for s in job.llm_stages()) else []
    if unplanned:  # what the listed stages cost is not known, so neither is the worst case
        result.totals["cost_high"] = result.totals["batch_high"] = result.totals["high_as_sent"] = None
    result.elapsed = time.perf_counter() - started
    result.totals["elapsed_s"] = round(result.elapsed, 3)
    return result


def _plan_groups(plan: StagePlan, builders: dict[str, _Builder], store: Store, seen: set[int],
                 stored: StoredCounts) -> None:
    """Plan the stage's requests and add each to its model's group: a cache hit, a repeat, or one to send."""
    for chunk in _chunks(plan, CHUNK):
        memo = store.lookup_many(list({req.key for req in chunk}))
        counted = stored.of([req for req in chunk if req.key not in memo and builders[req.model].stored])
        for req in chunk:
            builder = builders[req.model]
            builder.group.requests += 1
            cached = memo.get(req.key)
            if cached is not None:
                builder.group.cached += 1
                builder.cached_out += cached.output_tokens or 0
                builder.cached_n += 1
                continue
            short = int(req.key[:16], 16)
            if short in seen:
                builder.group.repeats += 1
                continue
            seen.add(short)
            builder.add(req, counted.get(req.key))


def _sum(values: list[Any]) -> Any:
    """The sum, or None when any value is None (an unknown price or an unbounded output)."""
    return None if any(v is None for v in values) else sum(values)


def _totals(groups: list[Group]) -> dict[str, Any]:
    totals: dict[str, Any] = {
        key: sum(getattr(g, key) for g in groups) for key in ("requests", "cached", "repeats", "to_send")
    }
    counted = [g.input_tokens for g in groups if g.input_tokens is not None]
    totals["input_tokens"] = sum(counted)
    totals["input_tokens_bound"] = sum(g.input_tokens_bound for g in groups if g.input_tokens_bound is not None)
    totals["input_counted"] = sum(g.input_counted for g in groups)
    totals["input_exact"] = all(g.input_exact for g in groups if g.to_send)
    totals["input_bound_only"] = any(g.input_bound_only for g in groups if g.to_send)
    totals["output_tokens_max"] = _sum([g.output_tokens_max for g in groups if g.to_send])
    for key in ("cost_low", "cost_high"):
        totals[key] = _sum([getattr(g, key) for g in groups if g.to_send])
    # The batch figure covers the job only when every model that costs something has a batch price.
    batchable = [g for g in groups if g.to_send and not g.free]
    for key in ("batch_low", "batch_high"):
        totals[key] = _sum([getattr(g, key) for g in batchable]) if batchable else None
    # What a budget must cover: batch-mode stages at the Batch API's price where there is one, the rest at the
    # standard price (auto may end online, so it counts at the standard one)
    totals["high_as_sent"] = _sum([g.batch_high if g.mode == "batch" and g.batch_high is not None else g.cost_high
                                   for g in groups if g.to_send])
    if any(g.cost_low_cached is not None for g in groups):  # the expected cost with provider prompt caching
        totals["cost_low_cached"] = _sum([g.cost_low_cached if g.cost_low_cached is not None else g.cost_low
                                          for g in groups if g.to_send])
        totals["cache_read_tokens"] = sum(g.cache_read_tokens or 0 for g in groups)
    totals["unknown_prices"] = sorted({g.add_price for g in groups if g.add_price})
    totals["unbounded_stages"] = sorted({g.stage for g in groups if g.max_tokens is None and g.to_send})
    return totals


# -- display ---------------------------------------------------------------------------------------
def usd(value: float | None) -> str:
    return "?" if value is None else f"${value:,.4f}"


def over_budget(est: Estimate, budget_usd: float | None, *, allow_partial: str = "add --allow-partial",
                budget: str = "--budget") -> str | None:
    """The refusal of a new run when the worst case exceeds the run's budget, else None; ``allow_partial`` and
    ``budget`` name the settings as the front door spells them (the CLI's by default)."""
    high = est.high
    if budget_usd is None or high is None or high <= budget_usd:
        return None
    enough = math.ceil(high * 100) / 100
    return (f"the estimate's worst case {usd(high)} exceeds the run's budget {usd(budget_usd)}: {allow_partial} "
            f"to run until the budget is spent, or give a larger {budget} (at least {enough:.2f})")
