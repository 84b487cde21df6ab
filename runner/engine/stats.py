"""Live counters per stage and model, written by the engine and read by the progress view and the CLI.
Plain data: the engine never imports the view."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields


@dataclass(slots=True)
class Counters:
    stage: str
    model: str
    total: int = 0
    done: int = 0
    #: tasks finished by an earlier attempt of this run (resume): counted in done, not re-processed
    resumed: int = 0
    cache_hits: int = 0
    sent: int = 0
    retries: int = 0
    #: tasks failed (refusals included)
    errors: int = 0
    #: of those, tasks the model declined to answer (error class ``refused``): never scored as wrong
    refused: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    #: output tokens spent thinking, counted in ``tokens_out`` too
    reasoning_tokens: int = 0
    spend: float = 0.0
    #: what the cache hits would have cost
    saved: float = 0.0
    #: what the Batch API's price saved against the standard one
    batch_saved: float = 0.0
    #: input tokens of the requests sent that the provider's prompt cache served, and what that saved (net of
    #: the premium of cache writes)
    cached_in: int = 0
    cache_saved: float = 0.0
    #: requests not sent because a budget covering them ran out (left for a resume)
    over_budget: int = 0
    #: tasks in chunks another worker of the run leased (``runner work``): finished by that process
    elsewhere: int = 0
    correct: int = 0
    scored: int = 0
    #: tasks an earlier attempt of this run finished, counted from the store when a resume starts (the dispatcher
    #: counts them in ``resumed`` only as it reaches them)
    prior: int = 0
    started: float = field(default_factory=time.monotonic)

    def rate(self, now: float | None = None) -> float:
        """Requests finished per second in this process (resumed ones excluded)."""
        elapsed = (now or time.monotonic()) - self.started
        return (self.done - self.resumed) / elapsed if elapsed > 0 else 0.0

    @property
    def finished(self) -> int:
        """Tasks finished, by this process or (on a resume) an earlier one, whether reached again yet or not."""
        return self.done - self.resumed + max(self.resumed, self.prior)

    @property
    def remaining(self) -> int:
        return max(0, self.total - self.finished)

    @property
    def fresh(self) -> int:
        """Tasks this process finished by a request (answered or failed): neither resumed nor cache hits."""
        return max(0, self.done - self.resumed - self.cache_hits)


@dataclass(slots=True)
class BatchView:
    """One batch as the live view shows it."""

    stage: str
    model: str
    provider_batch_id: str
    lines: int
    state: str = "running"
    provider_state: str = "submitted"
    succeeded: int = 0
    failed: int = 0
    round: int = 0


class RunStats:
    def __init__(self) -> None:
        self.by_key: dict[tuple[str, str], Counters] = {}
        self.errors_by_class: dict[str, int] = {}
        #: things the view should say once (a budget ran out)
        self.notes: list[str] = []
        #: the run's budgets, when it has any (runner/engine/budget.py), for the live view
        self.budgets: object | None = None
        #: Batch API batches of this run by id: stage, model, state, the provider's state, lines and results
        self.batches: dict[str, BatchView] = {}
        #: the last error per model ("error class: message"), for the live view
        self.last_error: dict[str, str] = {}
        #: what earlier attempts of this run spent (a resume), counted in the projection when it has no budgets
        self.prior_spend = 0.0
        self.started = time.monotonic()

    def counters(self, stage: str, model: str) -> Counters:
        key = (stage, model)
        found = self.by_key.get(key)
        if found is None:
            found = self.by_key[key] = Counters(stage, model)
        return found

    def totals(self) -> Counters:
        """Every counter summed over stages and models; ``started`` is the earliest."""
        out = Counters("all", "all")
        for c in self.by_key.values():
            for name in _SUMMED:
                setattr(out, name, getattr(out, name) + getattr(c, name))
            out.started = min(out.started, c.started)
        # so that out.finished is the sum of each one's finished
        out.prior = sum(max(c.resumed, c.prior) for c in self.by_key.values())
        return out

    def elapsed(self, now: float | None = None) -> float:
        return max(0.0, (now or time.monotonic()) - self.started)

    def eta(self, now: float | None = None) -> float | None:
        """Seconds until every task is finished, at the pace of the requests this process sent (resumed tasks and
        cache hits take no time, so they do not count in the pace); None before the first such request."""
        totals = self.totals()
        if totals.remaining == 0:
            return 0.0
        if totals.fresh == 0:
            return None
        return self.elapsed(now) / totals.fresh * totals.remaining


_SUMMED = [f.name for f in fields(Counters) if f.name not in ("stage", "model", "started")]
