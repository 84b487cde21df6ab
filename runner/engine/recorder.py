"""A finished task, counted and recorded: its result line parsed and scored (runner/evaluate/results.py), its
reservation settled or given back (runner/engine/reserver.py), its rows (runner/store/rows.py) handed to the store's
writer with the lease fence it was dispatched under. An answer's memo row goes with the task row it finishes, in
one transaction (ARCHITECTURE.md invariant 2)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from runner.engine.budget import Reservation
from runner.engine.leases import ChunkLeases
from runner.engine.reserver import Reserver
from runner.engine.stats import Counters, RunStats
from runner.engine.triage import Triage
from runner.errors import ProviderError, Refused
from runner.plan.request import Task
from runner.providers.base import Completion
from runner.spec.schema import Job
from runner.store import CachedResponse, Finished, LedgerRow, ResponseRow, TaskRow, Writer, dumps, now


def memo_of(c: Completion, cost: float = 0.0) -> CachedResponse:
    """A fresh answer as the memo gives it back (its thinking with it, and what produced it)."""
    return CachedResponse(c.text, c.finish_reason, c.input_tokens, c.output_tokens, c.cached_tokens, cost,
                          c.thinking, c.reasoning_tokens, c.reported_model, c.sent_with)


def billed_of(exc: ProviderError) -> Completion | None:
    """The usage a failed request was billed for (a refusal's answer), or None when it cost nothing."""
    billed = getattr(exc, "billed", None)
    if isinstance(billed, Completion) and (billed.input_tokens or billed.output_tokens):
        return billed
    return None


def served_provenance(provenance: dict[str, Any], tier: str | None) -> dict[str, Any]:
    """A result line's provenance with the tier that served its answer, where its stage asked one (the stage and
    model's own object, shared by its lines, otherwise)."""
    asked = provenance.get("tier")
    if tier is None or asked is None:
        return provenance
    return {**provenance, "tier": {**asked, "served": tier}}


class Origins:
    """Each result line's provenance with what produced its answer: the model the provider said answered
    (``reported_model``) and what sent the request (``sent_with``: the SDK and its version, or ``lean wire``); a
    cache hit's are those of the memo's answer. Lines of a stage and model mostly share both, so each combination's
    object is built once and shared."""

    def __init__(self) -> None:
        self.built: dict[tuple[int, str | None, str | None, str | None], dict[str, Any]] = {}

    def of(self, provenance: dict[str, Any], tier: str | None, reported_model: str | None,
           sent_with: str | None) -> dict[str, Any]:
        key = (id(provenance), tier, reported_model, sent_with)
        found = self.built.get(key)
        if found is None:
            found = self.built[key] = {**served_provenance(provenance, tier), "reported_model": reported_model,
                                       "sent_with": sent_with}
        return found


class Recorder:
    def __init__(self, *, run_id: str, job: Job, stats: RunStats, writer: Writer, reserver: Reserver,
                 triage: Triage, leases: ChunkLeases, provenance: Callable[[Task], dict[str, Any]]) -> None:
        """``provenance(task)``: the provenance of the task's result line (the same object for its stage and
        model)."""
        self.run_id = run_id
        self.stages = {stage.name: stage for stage in job.stages}
        self.stats = stats
        self.writer = writer
        self.reserver = reserver
        self.triage = triage
        self.leases = leases
        self.provenance = provenance
        self.origins = Origins()
        #: told of each task as it is recorded, before it is committed (a stage's early-stopping rule)
        self.observers: list[Callable[[TaskRow], None]] = []

    @functools.cached_property
    def _result_line(self) -> Callable[..., dict[str, Any]]:
        """runner/evaluate/results.py's ``result_line``: the parsers and scorers are imported when the first task is
        recorded, not when the run starts."""
        from runner.evaluate.results import result_line

        return result_line

    def cached(self, req: Task, cached: CachedResponse) -> None:
        """A task the memo answered (or an identical request's answer, shared): free, and what it saved counted."""
        counters = self.stats.counters(req.stage, req.model)
        counters.cache_hits += 1
        saved = self.reserver.saved(req.model, cached.input_tokens, cached.output_tokens, cached.cached_tokens)
        counters.saved += saved
        self._record(req, counters, cached.text, cached.finish_reason, cached.input_tokens, cached.output_tokens,
                     cost=0.0, latency=None, cache_hit=True, attempts=0, cached_tokens=cached.cached_tokens,
                     saved=saved, thinking=cached.thinking, reasoning_tokens=cached.reasoning_tokens,
                     origin=(cached.reported_model, cached.sent_with))

    def fresh(self, req: Task, c: Completion, attempts: int, latency: float | None, reservation: Reservation, *,
              batch: bool = False) -> None:
        """An answer that came back: priced (at the Batch API's price for a batch line), settled, recorded."""
        cost, batch_saved = self.reserver.cost(req, c, batch=batch)
        cache_saved = self.reserver.cache_saved(req, c, cost, batch=batch)
        self.reserver.settle(reservation, cost, c.input_tokens + c.output_tokens)
        counters = self.stats.counters(req.stage, req.model)
        counters.sent += 1
        counters.spend += cost
        if c.cached_tokens:
            counters.cached_in += c.cached_tokens
        counters.cache_saved += cache_saved
        self.triage.remember(req.key, memo_of(c, cost))
        response = ResponseRow(req.key, req.provider, req.call.model_id, req.call.canonical, c.text, dumps(c.raw),
                               c.finish_reason, c.input_tokens, c.output_tokens, c.cached_tokens, cost, latency, now(),
                               c.thinking, c.reasoning_tokens, c.reported_model, c.sent_with)  # positional, as below
        ledger = self._charge(req, cost, c.input_tokens + c.output_tokens, c.tier, c.endpoint)
        self._record(req, counters, c.text, c.finish_reason, c.input_tokens, c.output_tokens, cost=cost,
                     latency=latency, cache_hit=False, attempts=attempts, response=response, ledger=ledger,
                     cached_tokens=c.cached_tokens, release_id=reservation.ledger_id, batch_saved=batch_saved,
                     thinking=c.thinking, reasoning_tokens=c.reasoning_tokens, cache_saved=cache_saved, tier=c.tier,
                     origin=(c.reported_model, c.sent_with))
        if batch_saved:
            counters.batch_saved += batch_saved

    def failed(self, req: Task, exc: ProviderError, attempts: int, release_id: int | None = None, *,
               reservation: Reservation | None = None, batch: bool = False) -> None:
        """A task that got no answer. ``reservation``: its budget reservation, still held (given back, or settled
        to what a refusal was billed; callers that pass none have given theirs back). A refusal the provider
        billed (``exc.billed``) is charged once, priced as an answer (at the Batch API's price for a batch line):
        in the ledger, the budgets and the task's cost and tokens; it is never scored."""
        crew = self.leases.crew
        if crew is not None:
            crew.release(req.key)
        counters = self.stats.counters(req.stage, req.model)
        counters.errors += 1
        if exc.error_class == Refused.error_class:
            counters.refused += 1
        counters.done += 1
        self.stats.errors_by_class[exc.error_class] = self.stats.errors_by_class.get(exc.error_class, 0) + 1
        self.stats.last_error[req.model] = f"{exc.error_class}: {exc}"
        billed = billed_of(exc)
        cost, tokens, ledger = 0.0, 0, None
        if billed is not None:
            exc.billed = None  # type: ignore[attr-defined]  # one bill: tasks sharing this error are not charged
            cost = self.reserver.cost(req, billed, batch=batch)[0]
            tokens = billed.input_tokens + billed.output_tokens
            counters.spend += cost
            counters.tokens_in += billed.input_tokens
            counters.tokens_out += billed.output_tokens
            counters.reasoning_tokens += billed.reasoning_tokens
            ledger = self._charge(req, cost, tokens, billed.tier, billed.endpoint)
        self.reserver.settle_failure(req, reservation, billed is not None, cost, tokens)
        origin = (billed.tier, billed.reported_model, billed.sent_with) if billed is not None else (None, None, None)
        result = self._result_line(self.stages[req.stage], req, None, status="failed", cache_hit=False,
                             notes=self.stats.notes,
                             reasoning_tokens=billed.reasoning_tokens if billed is not None else 0,
                             provenance=self.origins.of(self.provenance(req), *origin))
        result.update(error_class=exc.error_class, error=str(exc))
        line = dumps(result)
        task = TaskRow(
            run_id=self.run_id, stage=req.stage, item=req.item, model=req.model, row_id=req.row_id,
            variant_json=req.variant_json, key=req.key, status="failed", cache_hit=0, attempts=attempts,
            error_class=exc.error_class, error=str(exc), input_tokens=billed.input_tokens if billed else 0,
            output_tokens=billed.output_tokens if billed else 0, cost=cost, latency=None, score=None, valid=0,
            result_json=line, cached_tokens=billed.cached_tokens if billed else 0, saved=0.0, batch_saved=None,
        )
        self.writer.put(Finished(task=task, ledger=ledger, result_line=line, stage=req.stage, release_id=release_id,
                                 fence=self.leases.take_fence(req)))
        for observer in self.observers:
            observer(task)

    def _charge(self, req: Task, cost: float, tokens: int, tier: str | None = None,
                endpoint: str | None = None) -> LedgerRow | None:
        """The ledger row of what ``req`` cost, in USD and tokens, the service tier it was charged at and the pooled
        endpoint that charged it (None when it cost nothing, or only tokens that no token budget counts)."""
        if cost <= 0 and not (tokens > 0 and self.reserver.counts_tokens(req.stage, req.model)):
            return None
        return LedgerRow(run_id=self.run_id, stage=req.stage, model=req.model, key=req.key, kind="charge",
                         amount=cost, created=now(), tokens=tokens, tier=tier, endpoint=endpoint)

    def _record(
        self, req: Task, counters: Counters, text: str, finish_reason: str | None, input_tokens: int,
        output_tokens: int, *, cost: float, latency: float | None, cache_hit: bool, attempts: int,
        response: ResponseRow | None = None, ledger: LedgerRow | None = None, cached_tokens: int = 0,
        saved: float = 0.0,
        release_id: int | None = None, batch_saved: float | None = None, thinking: str | None = None,
        reasoning_tokens: int = 0, cache_saved: float = 0.0, tier: str | None = None,
        origin: tuple[str | None, str | None] = (None, None),
    ) -> None:
        result = self._result_line(self.stages[req.stage], req, text, status="done", cache_hit=cache_hit,
                             notes=self.stats.notes, thinking=thinking, reasoning_tokens=reasoning_tokens,
                             provenance=self.origins.of(self.provenance(req), tier, *origin))
        result["finish_reason"] = finish_reason
        counters.done += 1
        if not cache_hit:
            counters.tokens_in += input_tokens
            counters.tokens_out += output_tokens
            counters.reasoning_tokens += reasoning_tokens
        score = result.get("score")
        if score is not None:
            counters.scored += 1
            counters.correct += int(score)
        line = dumps(result)
        # Positional, in the fields' order: built by keyword, this row cost a few per cent of a cache hit planned one
        # by one (bench/RESULTS.md, issue 22). tests/engine/test_recorder.py reads every column back by name.
        task = TaskRow(self.run_id, req.stage, req.item, req.model, req.row_id, req.variant_json, req.key, "done",
                       int(cache_hit), attempts, None, None, input_tokens, output_tokens, cost, latency, score,
                       int(result.get("valid", True)), line, cached_tokens, saved, batch_saved, cache_saved)
        self.writer.put(Finished(task=task, response=response, ledger=ledger, result_line=line, stage=req.stage,
                                 release_id=release_id, fence=self.leases.take_fence(req)))
        for observer in self.observers:
            observer(task)
