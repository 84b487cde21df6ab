"""Budgets with in-flight reservations (ARCHITECTURE.md invariant 3).

Before a request is sent, its worst case (input tokens counted, plus max_tokens at the output price) is
reserved against every budget that covers it: the run's, its stage's and its model's. The reservation is
settled to the actual cost when the answer comes, or released when the request failed unbilled. A request
whose reservation does not fit waits while other reservations of the same budget are in flight (they
usually settle below their worst case and give room back); when nothing is in flight and it still does not
fit, that budget is exhausted. Spend therefore never exceeds a budget, whatever the concurrency, and a run
stops with less than one request's worst case left.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runner.spec.schema import Job

#: tolerance of float sums of money (USD); far below a cent
EPSILON = 1e-9
#: a reservation that does not fit now but may once reservations in flight settle (a batch line waits for that)
LATER = "later"


@dataclass(slots=True)
class Scope:
    """One budget: the run's, a stage's or a model's. ``usd`` and ``tokens`` are the limits (None: none)."""

    kind: str  # "run", "stage" or "model"
    name: str
    usd: float | None = None
    tokens: int | None = None
    spent_usd: float = 0.0
    spent_tokens: int = 0
    reserved_usd: float = 0.0
    reserved_tokens: int = 0
    inflight: int = 0

    def fits(self, usd: float, tokens: int) -> bool:
        if self.usd is not None and self.spent_usd + self.reserved_usd + usd > self.usd + EPSILON:
            return False
        return self.tokens is None or self.spent_tokens + self.reserved_tokens + tokens <= self.tokens

    def describe(self) -> str:
        limits = [f"${self.usd:,.2f}" if self.usd is not None else "", f"{self.tokens:,} tokens" if self.tokens
                  is not None else ""]
        where = "the run's budget" if self.kind == "run" else f"the budget of {self.kind} {self.name}"
        return f"{where} ({' and '.join(x for x in limits if x)})"


@dataclass(slots=True)
class Reservation:
    scopes: list[Scope]
    usd: float
    tokens: int
    #: the ledger row holding it in the store, when it was written there
    ledger_id: int | None = None


@dataclass(slots=True)
class Exhausted:
    """No room left in ``scope`` for a request, with nothing in flight that could give some back."""

    scope: Scope


@dataclass
class Budgets:
    run: Scope
    stages: dict[str, Scope] = field(default_factory=dict)
    models: dict[str, Scope] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._changed = asyncio.Event()

    @property
    def limited(self) -> bool:
        return any(s.usd is not None or s.tokens is not None for s in self.all())

    def all(self) -> list[Scope]:
        return [self.run, *self.stages.values(), *self.models.values()]

    def covering(self, stage: str, model: str) -> list[Scope]:
        scopes = [self.run]
        if stage in self.stages:
            scopes.append(self.stages[stage])
        if model in self.models:
            scopes.append(self.models[model])
        return scopes

    def usd_limits(self, stage: str, model: str) -> dict[str, float]:
        """The USD limits covering a request, by the store's scope names (``run``, ``stage:NAME``, ``model:NAME``)."""
        return {scope.kind if scope.kind == "run" else f"{scope.kind}:{scope.name}": scope.usd
                for scope in self.covering(stage, model) if scope.usd is not None}

    def token_limits(self, stage: str, model: str) -> dict[str, int]:
        """The token limits covering a request, by the store's scope names (as :meth:`usd_limits`)."""
        return {scope.kind if scope.kind == "run" else f"{scope.kind}:{scope.name}": scope.tokens
                for scope in self.covering(stage, model) if scope.tokens is not None}

    def scope_named(self, name: str) -> Scope:
        """The budget a store scope name (from :meth:`usd_limits` or :meth:`token_limits`) stands for."""
        kind, _, which = name.partition(":")
        return self.run if kind == "run" else (self.stages if kind == "stage" else self.models)[which]

    def spend(self, stage: str, model: str, usd: float, tokens: int) -> None:
        """Spend already made (earlier attempts of a resumed run), counted against every budget covering it."""
        for scope in self.covering(stage, model):
            scope.spent_usd += usd
            scope.spent_tokens += tokens

    async def reserve(self, stage: str, model: str, usd: float, tokens: int) -> Reservation | Exhausted:
        while True:
            got = self.try_reserve(stage, model, usd, tokens)
            if isinstance(got, Reservation) or got.scope.inflight == 0:
                return got
            self._changed.clear()
            await self._changed.wait()

    def try_reserve(self, stage: str, model: str, usd: float, tokens: int) -> Reservation | Exhausted:
        """Reserve now, or say which budget has no room (without waiting for reservations in flight to settle:
        a batch line's reservation settles only when its whole batch has ended)."""
        scopes = self.covering(stage, model)
        blocked = next((s for s in scopes if not s.fits(usd, tokens)), None)
        if blocked is not None:
            return Exhausted(blocked)
        for scope in scopes:
            scope.reserved_usd += usd
            scope.reserved_tokens += tokens
            scope.inflight += 1
        return Reservation(scopes, usd, tokens)

    def hold(self, stage: str, model: str, usd: float, tokens: int) -> Reservation:
        """Reserve whether or not it fits: for a request already sent by an earlier process (a submitted batch
        line), which will be billed whatever this process's budgets say."""
        scopes = self.covering(stage, model)
        for scope in scopes:
            scope.reserved_usd += usd
            scope.reserved_tokens += tokens
            scope.inflight += 1
        return Reservation(scopes, usd, tokens)

    def settle(self, reservation: Reservation, usd: float, tokens: int) -> None:
        """The answer came: the reservation becomes the actual spend."""
        for scope in reservation.scopes:
            scope.spent_usd += usd
            scope.spent_tokens += tokens
        self.release(reservation)

    def release(self, reservation: Reservation) -> None:
        """The request ended without a bill (failed, or not sent): give its reservation back."""
        for scope in reservation.scopes:
            scope.reserved_usd = max(0.0, scope.reserved_usd - reservation.usd)
            scope.reserved_tokens = max(0, scope.reserved_tokens - reservation.tokens)
            scope.inflight -= 1
            if scope.inflight == 0:  # no float residue once nothing is in flight
                scope.reserved_usd, scope.reserved_tokens = 0.0, 0
        self._changed.set()


def budgets_of(job: Job) -> Budgets | None:
    """The job's budgets (run, per stage, per model), or None when it sets none."""
    stages = {stage.name: Scope("stage", stage.name, stage.budget.usd, stage.budget.tokens)
              for stage in job.stages if stage.budget is not None}
    if job.budget is None and not stages:
        return None
    run = Scope("run", job.name, job.budget.usd if job.budget else None, job.budget.tokens if job.budget else None)
    models = {model: Scope("model", model, limit.usd, limit.tokens)
              for model, limit in (job.budget.models.items() if job.budget else ())}
    budgets = Budgets(run, stages, models)
    return budgets if budgets.limited else None
