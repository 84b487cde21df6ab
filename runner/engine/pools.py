"""Pooled endpoints at run time (the job's ``pools:``, runner/spec/pools.py): which of a model's endpoints each
request goes to, and which are taken out.

Each endpoint of a pool is an endpoint as any other (its own limiter: runner/engine/limits.py, its own provider
object and settings, its own prompt cache at the provider), so the pool's limits add up. A request of a
prompt-cache group (runner/engine/prompt_cache.py) goes where its group went first, so the prefix its first request
wrote is read by the others: a new group goes to the endpoint a stable hash of its digest names, unless that one has
a line while another sits idle; the group stays there (its prefix is cached there) until that endpoint is taken
out. A request of no group goes to the endpoint with the most room (free slots less its line), in turn on a tie.

An endpoint that fails is taken out: at once on a refused key or an exhausted quota, after :data:`STREAK` failures in
a row that say it is down or broken (5xx, a refused or dropped connection, a timeout). Nothing more is routed to it,
and a request whose attempt it failed goes on at another (its reservation, its attempts and the retry policy's
bounds unchanged: ARCHITECTURE.md invariants 3 and 4); the run's notes say so in one line. When every endpoint of a
pool is out, the last keeps serving, so the errors end the requests as they would without a pool.

A pooled model's Batch API lines are not spread: they all go through one endpoint, the first of its pool that has a
Batch API (:class:`BatchRoutes`), said once in the run's notes; its batches are priced, and charged in ledger rows
naming it, as that endpoint's.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from runner.engine.limits import Endpoint
from runner.errors import AuthError, ProviderError, QuotaExceeded, TransientError
from runner.plan.request import Task
from runner.providers.pricing import Pricing
from runner.spec.pools import Pool, PoolEndpoint, batch_endpoint, provider_of
from runner.spec.schema import Job

__all__ = ["STREAK", "BatchRoutes", "Member", "PoolRoute", "endpoint_prices"]

#: failures in a row that say an endpoint is down (5xx, refused or dropped connections, timeouts): it is taken out
STREAK = 5
#: error classes that count towards the streak
DOWN = frozenset({"server_error", "connection", "timeout"})
#: groups whose endpoint is remembered at most (beyond, the oldest are forgotten: invariant 6)
KEPT = 4096


@dataclass(slots=True, eq=False)
class Member:
    """One endpoint of a pool."""

    #: as the job names it (``sim:b``)
    label: str
    #: the key of its provider object among the run's providers (the label itself for ``provider:label``)
    provider: str
    #: the model as this endpoint is asked for it
    model_name: str
    endpoint: Endpoint
    #: why it was taken out; None while it serves
    out: str | None = None
    #: failures in a row that say it is down
    streak: int = 0


class PoolRoute:
    """One pooled model's endpoints, and where each request goes."""

    def __init__(self, model: str, members: list[Member], notes: list[str]) -> None:
        self.model = model
        self.members = members
        self._notes = notes
        #: per prompt-cache group: the endpoint its requests go to
        self._groups: OrderedDict[str, Member] = OrderedDict()
        self._turn = 0

    def live(self) -> list[Member]:
        return [m for m in self.members if m.out is None]

    def choose(self, group: str | None) -> Member:
        """The endpoint a request of ``group`` (None: of no prompt-cache group) goes to now."""
        live = self.live() or self.members[-1:]
        if group is None:
            return self._roomiest(live)
        held = self._groups.get(group)
        if held is not None and held.out is None:  # placed: its prefix is cached there
            self._groups.move_to_end(group)
            return held
        held = live[int(hashlib.sha256(group.encode()).hexdigest()[:8], 16) % len(live)]
        if _crowded(held) and self._idle(live):
            held = self._roomiest(live)
        self._groups[group] = held
        self._groups.move_to_end(group)
        if len(self._groups) > KEPT:
            self._groups.popitem(last=False)
        return held

    def _roomiest(self, live: list[Member]) -> Member:
        self._turn = (self._turn + 1) % len(live)
        turned = live[self._turn:] + live[:self._turn]
        return max(turned, key=_room)

    @staticmethod
    def _idle(live: list[Member]) -> bool:
        return any(_room(m) > 0 and not m.endpoint.slots.waiters for m in live)

    def succeeded(self, member: Member) -> None:
        member.streak = 0

    def failed(self, member: Member, exc: ProviderError) -> None:
        """An attempt at ``member`` failed with ``exc``: a refused key, an exhausted quota, or the last of a streak
        of failures saying it is down takes it out."""
        if isinstance(exc, (AuthError, QuotaExceeded)):
            self._take_out(member, f"it refused its key or quota ({exc.error_class}: {exc})")
        elif isinstance(exc, TransientError) and exc.error_class in DOWN:
            member.streak += 1
            if member.streak >= STREAK:
                self._take_out(member, f"{member.streak} failures in a row ({exc.error_class}: {exc})")
        else:
            member.streak = 0

    def _take_out(self, member: Member, why: str) -> None:
        if member.out is not None or len(self.live()) <= 1:
            return  # the last endpoint keeps serving: its errors end the requests as they would without a pool
        member.out = why
        # its line goes on at once, each request re-routed by its first attempt (runner/engine/online.py), however
        # few requests its slots had come to let go
        member.endpoint.ramp = None
        member.endpoint.slots.resize(member.endpoint.ceiling)
        others = ", ".join(m.label for m in self.live())
        self._notes.append(f"endpoint {member.label} of {self.model} is taken out after {why}: its work goes to "
                           f"{others}")


def _room(member: Member) -> int:
    slots = member.endpoint.slots
    return slots.limit - slots.held - len(slots.waiters)


def _crowded(member: Member) -> bool:
    """Whether the endpoint has a line (requests waiting for its slots)."""
    return bool(member.endpoint.slots.waiters)


def members_of(model: str, pool: Pool, endpoint: Callable[[str, str, str], Endpoint]) -> list[Member]:
    """The pool's members, each with its endpoint: ``endpoint(label, provider key, model name)``."""
    name = model.partition(":")[2]
    return [Member(m.endpoint, m.endpoint, m.model or name, endpoint(m.endpoint, m.endpoint, m.model or name))
            for m in pool.members()]


def endpoint_prices(pricing: Pricing, model: str, pool: Pool) -> dict[str, str]:
    """The model each endpoint of ``model``'s pool is priced as, by its label: ``provider:model`` at that endpoint
    where that has a price, else the pooled model."""
    name = model.partition(":")[2]
    out = {}
    for member in pool.members():
        own = f"{provider_of(member.endpoint)}:{member.model or name}"
        out[member.endpoint] = own if own == model or pricing.rates(own) is not None else model
    return out


class BatchRoutes:
    """Where each model's Batch API lines go: through its own provider, or a pooled model's through the endpoint
    of its pool :func:`~runner.spec.pools.batch_endpoint` names (the first with a Batch API), said once a run."""

    def __init__(self, job: Job, notes: list[str]) -> None:
        self._via: dict[str, PoolEndpoint] = {model: via for model in job.pools
                                              if (via := batch_endpoint(job, model)) is not None}
        self._notes = notes
        self._said: set[str] = set()

    def provider(self, task: Task) -> str:
        """The key among the run's providers of the one that takes ``task``'s batch line (a pool's: its label)."""
        return self.label(task.model) or task.provider

    def model_name(self, task: Task) -> str:
        """The model as the batch's endpoint is asked for it."""
        via = self._via.get(task.model)
        return (via.model if via is not None else None) or task.model_name

    def label(self, model: str) -> str | None:
        """The pool's endpoint that takes ``model``'s batches (its answers are charged there), None for no pool."""
        via = self._via.get(model)
        return via.endpoint if via is not None else None

    def say(self, stage: str, model: str) -> None:
        """One line in the run's notes, the first time a pooled model's lines go into a batch."""
        label = self.label(model)
        if label is None or model in self._said:
            return
        self._said.add(model)
        self._notes.append(f"stage {stage}: the Batch API lines of {model} go through endpoint {label} alone, the "
                           "first of its pool with a Batch API (a pool's batches are not spread over its endpoints; "
                           "its online requests are)")
