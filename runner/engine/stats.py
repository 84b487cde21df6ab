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
    errors: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    spend: float = 0.0
    #: what the cache hits would have cost
    saved: float = 0.0
    #: what the Batch API's price saved against the standard one
    batch_saved: float = 0.0
    #: requests not sent because a budget covering them ran out (left for a resume)
    over_budget: int = 0
    #: tasks in chunks another worker of the run leased (``runner work``): finished by that process
    elsewhere: int = 0
    correct: int = 0
    scored: int = 0
    started: float = field(default_factory=time.monotonic)

    def rate(self, now: float | None = None) -> float:
        """Requests finished per second in this process (resumed ones excluded)."""
        elapsed = (now or time.monotonic()) - self.started
        return (self.done - self.resumed) / elapsed if elapsed > 0 else 0.0


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
        #: the run's budgets, when it has any (runner/budget.py), for the live view
        self.budgets: object | None = None
        #: Batch API batches of this run by id: stage, model, state, the provider's state, lines and results
        self.batches: dict[str, BatchView] = {}

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
        return out


_SUMMED = [f.name for f in fields(Counters) if f.name not in ("stage", "model", "started")]
