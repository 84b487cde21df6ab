"""The deadline planner: which of the four ways a provider sells a request (its Batch API, flex, standard,
priority) each remaining request of a stage and model goes, so that the expected cost is least while the work is
done by the deadline with probability at least ``State.confidence`` (0.95).

A pure function of the state (:func:`plan`): the run calls it again as it goes (runner/engine/deadline.py), with
what is left, the time and the batches waiting, and ``bench/deadline.py`` replays the same function over drawn
turnarounds and shed rates on a virtual clock.

What it assumes (ARCHITECTURE.md, "The deadline planner"):

- online, one endpoint's tiers share its rate limit (``Online.rpm``: the runner's limiter is per endpoint, whatever
  the tier), every attempt counting, a shed flex attempt too; an answer comes within its tier's 95th-percentile
  latency of its attempt;
- a flex request is shed at each attempt with the 95th percentile of the provider's shed rate, so it takes
  ``1 / (1 - shed)`` attempts; shed attempts are not billed;
- a batch's turnaround is lognormal (``Turnaround``, from its median and 95th percentile); a batch is covered
  either by its own 95th percentile or, when the online capacity allows, by sending all its lines online after a
  cutover (their batch cancelled), the later of which it is given: lines a batch answered by then are paid at the
  batch price, the others at the online one;
- priority serves what standard's latency cannot; a priority request downgraded to standard costs less, not more.

The grid over the batch and flex shares (``STEPS``) is applied alike to the stages on one endpoint.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["BATCH", "FLEX", "MODES", "ONLINE", "PRIORITY", "STANDARD", "Group", "GroupMix", "Online", "Plan",
           "State", "Turnaround", "plan"]

BATCH, FLEX, STANDARD, PRIORITY = "batch", "flex", "standard", "priority"
MODES = (BATCH, FLEX, STANDARD, PRIORITY)
ONLINE = (FLEX, STANDARD, PRIORITY)
#: shares of a group's requests tried for the batch and for flex
STEPS = 20
#: the least probability a new batch ends before its cutover for the planner to send one
MIN_BATCH_CHANCE = 0.01


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _z(p: float) -> float:
    """The standard normal quantile (bisection on :func:`_phi`; p within (0, 1))."""
    low, high = -10.0, 10.0
    for _ in range(80):
        mid = (low + high) / 2
        low, high = (mid, high) if _phi(mid) < p else (low, mid)
    return (low + high) / 2


Z95 = _z(0.95)


@dataclass(frozen=True, slots=True)
class Turnaround:
    """A Batch API's turnaround, lognormal from its median and 95th percentile (seconds), and where they come from."""

    median: float
    p95: float
    source: str

    @property
    def sigma(self) -> float:
        return max(math.log(max(self.p95, self.median) / self.median) / Z95, 1e-6)

    def cdf(self, seconds: float) -> float:
        if seconds <= 0:
            return 0.0
        return _phi(math.log(seconds / self.median) / self.sigma)

    def done_by(self, age: float, seconds: float) -> float:
        """P(a batch ``age`` seconds old and not ended has ended ``seconds`` from now)."""
        if seconds <= 0:
            return 0.0
        before = self.cdf(age)
        return max(0.0, (self.cdf(age + seconds) - before) / (1.0 - before)) if before < 1.0 else 1.0

    def within(self, age: float, confidence: float) -> float:
        """Seconds from now by which a batch ``age`` seconds old has ended with probability ``confidence``."""
        before = self.cdf(age)
        target = before + confidence * (1.0 - before)
        if target >= 1.0:
            return math.inf
        return max(0.0, self.median * math.exp(self.sigma * _z(target)) - age)


@dataclass(frozen=True, slots=True)
class Online:
    """What one endpoint's online tiers do: its rate limit (requests a minute, every tier and attempt counted), the
    95th-percentile seconds of an answer at each tier, the flex shed rate (mean and 95th percentile of a run's) and
    where each figure comes from."""

    rpm: float
    latency: float
    priority_latency: float
    flex_latency: float
    flex_shed: float
    flex_shed_p95: float
    source: str = ""

    @property
    def per_second(self) -> float:
        return self.rpm / 60.0


@dataclass(frozen=True, slots=True)
class Group:
    """One stage and model's work left: ``remaining`` requests not yet sent anywhere, ``in_batch`` waiting in
    batches sent ``batch_age`` seconds ago, the expected USD of one request at each mode it may take (``price``),
    and why it may not take the others (``refused``: mode -> one sentence)."""

    stage: str
    model: str
    endpoint: str
    remaining: int
    price: Mapping[str, float]
    in_batch: int = 0
    batch_age: float = 0.0
    refused: Mapping[str, str] = field(default_factory=dict)

    def takes(self, mode: str) -> bool:
        return mode in self.price and mode not in self.refused


@dataclass(frozen=True, slots=True)
class State:
    """Everything the planner reads: seconds since the run's start (``now``) and of the deadline, the groups, and
    per endpoint its online figures and its Batch API's turnaround. ``margin``: seconds kept back before the
    deadline (a poll of the batches, a cancel)."""

    now: float
    deadline: float
    groups: tuple[Group, ...]
    online: Mapping[str, Online]
    turnaround: Mapping[str, Turnaround]
    margin: float = 0.0
    confidence: float = 0.95


@dataclass(frozen=True, slots=True)
class GroupMix:
    """One group's plan: how many of its remaining requests go each way, whether its waiting batch lines are to be
    cancelled now and sent online, and its expected and all-standard USD (remaining and waiting lines alike)."""

    stage: str
    model: str
    counts: Mapping[str, int]
    cancel_now: bool
    expected: float
    standard: float


@dataclass(frozen=True, slots=True)
class Plan:
    """The groups' mixes; per endpoint the cutover (seconds since the start: its batches are cancelled then and their
    lines sent online; None: waited for) and the time by which it is done with the confidence asked; ``problem``:
    why no mix meets the deadline (one sentence, with the fastest mode's estimate), None when one does."""

    mixes: tuple[GroupMix, ...]
    cutover: Mapping[str, float | None]
    finish: Mapping[str, float]
    problem: str | None = None

    def of(self, stage: str, model: str) -> GroupMix | None:
        return next((m for m in self.mixes if m.stage == stage and m.model == model), None)

    @property
    def expected(self) -> float:
        return sum(m.expected for m in self.mixes)

    @property
    def standard(self) -> float:
        return sum(m.standard for m in self.mixes)


@dataclass(slots=True)
class _Candidate:
    cost: float
    needs: float
    counts: list[dict[str, int]]
    cutover: float | None
    costs: list[float]


def plan(state: State) -> Plan:
    """The least expected cost mix that finishes by the deadline with ``state.confidence``, per endpoint; where
    none does, the fastest (every request online at its fastest tier, batches cancelled) and the sentence why."""
    mixes: list[GroupMix] = []
    cutover: dict[str, float | None] = {}
    finish: dict[str, float] = {}
    problems: list[str] = []
    for endpoint in sorted({g.endpoint for g in state.groups}):
        groups = [g for g in state.groups if g.endpoint == endpoint]
        best, fastest = _best(state, endpoint, groups)
        chosen = best or fastest
        cutover[endpoint] = None if chosen.cutover is None else state.now + chosen.cutover
        finish[endpoint] = state.now + chosen.needs
        if best is None:
            problems.append(_problem(state, endpoint, groups, fastest))
        for g, counts, cost in zip(groups, chosen.counts, chosen.costs, strict=True):
            cancel = g.in_batch > 0 and (best is None or (chosen.cutover is not None and chosen.cutover <= 0))
            mixes.append(GroupMix(g.stage, g.model, counts, cancel, cost, _all_standard(g)))
    return Plan(tuple(mixes), cutover, finish, " ".join(problems) or None)


def _all_standard(g: Group) -> float:
    online = _online_tier(g)
    return (g.remaining + g.in_batch) * g.price.get(STANDARD, g.price.get(online, 0.0) if online else 0.0)


def _online_tier(g: Group, latency_ok: Mapping[str, bool] | None = None) -> str | None:
    """The tier a group's non-batch, non-flex requests (and its batch's fallback) go at: standard, else priority
    (standard refused, or its latency too long)."""
    for tier in (STANDARD, PRIORITY):
        if g.takes(tier) and (latency_ok is None or latency_ok[tier]):
            return tier
    return None


def _best(state: State, endpoint: str, groups: list[Group]) -> tuple[_Candidate | None, _Candidate]:
    online = state.online[endpoint]
    turnaround = state.turnaround.get(endpoint)
    left = state.deadline - state.now - state.margin
    rate = max(online.per_second, 1e-9)
    latency = {FLEX: online.flex_latency, STANDARD: online.latency, PRIORITY: online.priority_latency}
    latency_ok = {tier: latency[tier] <= left for tier in ONLINE}
    best: _Candidate | None = None
    batchable = any(g.takes(BATCH) for g in groups) and turnaround is not None
    flexible = any(g.takes(FLEX) for g in groups) and latency_ok[FLEX]
    for b_step in range(STEPS + 1) if batchable else (0,):
        for f_step in range(STEPS + 1) if flexible else (0,):
            found = _candidate(groups, b_step / STEPS, f_step / STEPS, left, rate, online, turnaround, latency,
                               latency_ok, state.confidence)
            if found is not None and (best is None or (found.cost, found.needs) < (best.cost, best.needs)):
                best = found
    return best, _fastest(groups, left, rate, online, latency)


def _candidate(groups: list[Group], beta: float, phi: float, left: float, rate: float, online: Online,
               turnaround: Turnaround | None, latency: Mapping[str, float], latency_ok: Mapping[str, bool],
               confidence: float) -> _Candidate | None:
    counts: list[dict[str, int]] = []
    attempts = 0.0
    slowest = 0.0
    fallback_latency = 0.0
    waiting = 0
    new_lines = 0
    for g in groups:
        tier = _online_tier(g, latency_ok)
        b = round(beta * g.remaining) if g.takes(BATCH) else 0
        f = round(phi * (g.remaining - b)) if g.takes(FLEX) and latency_ok[FLEX] else 0
        rest = g.remaining - b - f
        if (rest or b or g.in_batch) and tier is None:
            return None  # no online tier answers in time for what must go online
        counts.append({m: n for m, n in ((BATCH, b), (FLEX, f), (tier or STANDARD, rest)) if n})
        attempts += rest + f / max(1e-9, 1.0 - online.flex_shed_p95)
        if f:
            slowest = max(slowest, latency[FLEX])
        if rest:
            slowest = max(slowest, latency[tier or STANDARD])
        if b or g.in_batch:
            fallback_latency = max(fallback_latency, latency[tier or STANDARD])
        waiting += g.in_batch
        new_lines += b
    lines = waiting + new_lines
    online_needs = attempts / rate + slowest if attempts else 0.0
    cutover: float | None = None
    needs = online_needs
    if lines:
        assert turnaround is not None or new_lines == 0
        # the batch's fallback: every line sent online after the cutover, once the online work is done
        fallback_cut = left - fallback_latency - lines / rate
        if fallback_cut >= attempts / rate:
            cutover = fallback_cut
            needs = max(needs, left)
        else:  # no room to fall back: the batches must end by the deadline on their own
            covered = turnaround is not None and all(
                turnaround.within(g.batch_age if g.in_batch else 0.0, confidence) <= left for g in groups
                if g.in_batch or g.takes(BATCH))
            if not covered:
                return None
            needs = max(needs, max(turnaround.within(g.batch_age if g.in_batch else 0.0, confidence)
                                   for g in groups if g.in_batch or g.takes(BATCH)))
    if needs > left:
        return None
    costs = []
    for g, mix in zip(groups, counts, strict=True):
        tier = _online_tier(g, latency_ok) or STANDARD
        cost = sum(n * g.price[m] for m, n in mix.items() if m != BATCH)
        if turnaround is not None and (mix.get(BATCH) or g.in_batch):
            until = left if cutover is None else cutover
            fresh = turnaround.done_by(0.0, until)
            if mix.get(BATCH) and fresh < MIN_BATCH_CHANCE:
                return None  # lines that will almost surely be sent online after all: a batch gains nothing
            old = turnaround.done_by(g.batch_age, until)
            batch_price = g.price.get(BATCH, g.price[tier])
            cost += mix.get(BATCH, 0) * (fresh * batch_price + (1 - fresh) * g.price[tier])
            cost += g.in_batch * (old * batch_price + (1 - old) * g.price[tier])
        costs.append(cost)
    return _Candidate(sum(costs), needs, counts, cutover, costs)


def _fastest(groups: list[Group], left: float, rate: float, online: Online,
             latency: Mapping[str, float]) -> _Candidate:
    """Everything online now, its batches cancelled: the best effort. Each group at standard where it takes it and
    its latency fits what is left (they share the rate limit, so a dearer tier gains only its latency), else at its
    fastest tier."""
    counts, costs = [], []
    attempts = 0.0
    slowest = 0.0
    for g in groups:
        tier = STANDARD if g.takes(STANDARD) and latency[STANDARD] <= left else min(
            (t for t in ONLINE if g.takes(t) and t != FLEX), key=lambda t: latency[t], default=None)
        if tier is None:
            tier = FLEX if g.takes(FLEX) else STANDARD
        n = g.remaining + g.in_batch
        counts.append({tier: g.remaining} if g.remaining else {})
        costs.append(n * g.price.get(tier, 0.0))
        attempts += n / (1.0 - online.flex_shed_p95 if tier == FLEX else 1.0)
        slowest = max(slowest, latency[tier]) if n else slowest
    return _Candidate(sum(costs), attempts / rate + slowest, counts, 0.0, costs)


def _duration(seconds: float) -> str:
    if math.isinf(seconds):
        return "never"
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def _problem(state: State, endpoint: str, groups: list[Group], fastest: _Candidate) -> str:
    online = state.online[endpoint]
    n = sum(g.remaining + g.in_batch for g in groups)
    names = ", ".join(sorted({f"{g.stage} ({g.model})" for g in groups}))
    left = _duration(max(0.0, state.deadline - state.now))
    rate = online.source.split("; ")[0] if online.source else f"{online.rpm:,.0f} requests a minute"
    text = (f"no mode can finish the {n:,} requests of {names} by the deadline ({left} from now): the fastest, "
            f"online at {rate}, needs about {_duration(fastest.needs)}")
    turnaround = state.turnaround.get(endpoint)
    if turnaround is not None and any(g.takes(BATCH) for g in groups):
        text += (f", and a batch ends within {_duration(turnaround.within(0.0, state.confidence))} with "
                 f"{state.confidence:.0%} confidence")
    return text + "."
