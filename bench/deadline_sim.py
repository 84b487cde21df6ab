"""The discrete-event simulation ``bench/deadline.py`` replays the deadline planner in: a job's groups sent on a
virtual clock, in steps of ``deadline / STEPS_PER_DEADLINE``, under one draw of the world (each batch's turnaround,
each endpoint's flex shed rate, each answer's latency). The planner is ``runner.plan.deadline.plan`` itself,
called again every ``REPLANS`` of the deadline and after each cancel, on the state as the simulation has it.

The world, per draw (``World``, drawn by :func:`draw` from ``random.Random(seed)``):

- a batch's turnaround is lognormal (median ``BATCH_MEDIAN``, 95th percentile ``BATCH_P95``), cut at 24 h, when a
  batch expires; its line i of n is answered at turnaround x (i + 1) / n (as the simulated server does), so a
  cancel keeps the lines answered by then;
- an endpoint's flex shed rate is Beta(``SHED_A``, ``SHED_B``), the same for every flex attempt of the draw; a shed
  attempt takes a slot of the rate limit and is not billed; a request shed for ``FLEX_WAIT`` goes at standard;
- an answer takes uniform(``LATENCY[tier]``) seconds after its attempt;
- online attempts take the endpoint's rate limit, ``rpm`` a minute, every tier alike.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from runner.plan.deadline import BATCH, FLEX, PRIORITY, STANDARD, Group, Online, Plan, State, Turnaround, plan

BATCH_MEDIAN, BATCH_P95 = 2 * 3600.0, 8 * 3600.0
BATCH_WINDOW = 24 * 3600.0
SHED_A, SHED_B = 2.0, 6.0
LATENCY = {STANDARD: (2.0, 20.0), PRIORITY: (1.0, 5.0), FLEX: (60.0, 900.0)}
FLEX_WAIT = 600.0
STEPS_PER_DEADLINE = 1000
REPLANS = 50


def beta_quantile(a: float, b: float, p: float, draws: int = 200_000) -> float:
    """The ``p`` quantile of Beta(a, b), by sampling with a fixed seed (stated, not fitted)."""
    rng = random.Random(12345)
    values = sorted(rng.betavariate(a, b) for _ in range(draws))
    return values[int(p * draws)]


SHED_MEAN = SHED_A / (SHED_A + SHED_B)
SHED_P95 = beta_quantile(SHED_A, SHED_B, 0.95)


@dataclass(frozen=True)
class World:
    """One draw: per endpoint its flex shed rate, and a source of batch turnarounds and latencies."""

    shed: dict[str, float]
    seed: int
    #: the n-th batch's turnaround (seconds) where the draws are given (the simulated server's own, for the
    #: end-to-end runs of bench/deadline_e2e.py); None: drawn here from BATCH_MEDIAN and BATCH_P95
    turnarounds: Callable[[int], float] | None = None


def draw(seed: int, endpoints: list[str]) -> World:
    rng = random.Random(seed)
    return World({e: rng.betavariate(SHED_A, SHED_B) for e in endpoints}, seed)


def turnaround_figures() -> Turnaround:
    return Turnaround(BATCH_MEDIAN, BATCH_P95, "the bench's stated lognormal")


def online_figures(rpm: float) -> Online:
    return Online(rpm, LATENCY[STANDARD][1], LATENCY[PRIORITY][1], LATENCY[FLEX][1], SHED_MEAN, SHED_P95,
                  "the bench's stated figures")


@dataclass
class _Batch:
    group: int
    start: float
    lines: int
    turnaround: float
    answered: int = 0


@dataclass
class _Flex:
    since: float
    count: int


@dataclass
class Outcome:
    cost: float = 0.0
    finished: float = 0.0
    done: int = 0
    by_mode: dict[str, int] = field(default_factory=dict)
    cancelled: int = 0

    def add(self, mode: str, n: int, price: float, at: float) -> None:
        if n <= 0:
            return
        self.cost += n * price
        self.done += n
        self.by_mode[mode] = self.by_mode.get(mode, 0) + n
        self.finished = max(self.finished, at)


Policy = Callable[[State], Plan]


def simulate(state: State, world: World, policy: Policy = plan, *, cancel: bool = True) -> Outcome:
    """Run the groups of ``state`` to the end under ``world``, the modes chosen by ``policy`` (the planner, or a
    single mode), on a virtual clock; stops once every request is answered, or at ten times the deadline."""
    rng = random.Random(world.seed * 7919 + 1)
    groups = list(state.groups)
    unsent = [g.remaining for g in groups]
    flex_retry: list[list[_Flex]] = [[] for _ in groups]
    fallback = [0 for _ in groups]
    batches: list[_Batch] = []
    out = Outcome()
    step = state.deadline / STEPS_PER_DEADLINE
    replan_every = state.deadline / REPLANS
    credit = {e: 0.0 for e in state.online}
    now, next_plan = 0.0, 0.0
    made = 0  # batches created
    current: Plan | None = None
    total = sum(unsent)
    while out.done < total and now < 10 * state.deadline:
        if now >= next_plan or current is None:
            current = policy(_state(state, groups, [u + f for u, f in zip(unsent, fallback, strict=True)],
                                    flex_retry, batches, now))
            next_plan = now + replan_every
            for i, g in enumerate(groups):
                mix = current.of(g.stage, g.model)
                n = mix.counts.get(BATCH, 0) if mix else 0
                n = min(n, unsent[i])
                if n:
                    took = world.turnarounds(made) if world.turnarounds is not None else _turnaround(rng)
                    made += 1
                    batches.append(_Batch(i, now, n, took))
                    unsent[i] -= n
        # batches: lines answered by now; a cancel at the cutover sends the rest back to be planned
        for b in list(batches):
            g = groups[b.group]
            elapsed = now - b.start
            due = b.lines if elapsed >= b.turnaround else int(b.lines * elapsed / b.turnaround)
            if b.turnaround > BATCH_WINDOW and elapsed >= BATCH_WINDOW:  # expired: its rest goes back
                due = int(b.lines * BATCH_WINDOW / b.turnaround)
            if due > b.answered:
                out.add(BATCH, due - b.answered, g.price[BATCH], b.start + b.turnaround * due / b.lines)
                b.answered = due
            mix = current.of(g.stage, g.model)
            cut = current.cutover.get(g.endpoint)
            expired = elapsed >= BATCH_WINDOW
            late = cancel and ((mix is not None and mix.cancel_now) or (cut is not None and now >= cut))
            if b.answered >= b.lines or late or expired:
                back = b.lines - b.answered
                unsent[b.group] += back
                out.cancelled += back
                batches.remove(b)
                if back and late:
                    next_plan = now  # planned again at once: the lines go online
        # online: each endpoint's attempts this step: shed flex requests past FLEX_WAIT at standard, flex retries,
        # then the not yet sent at the plan's online shares
        for endpoint, figures in state.online.items():
            credit[endpoint] = min(credit[endpoint] + figures.per_second * step, figures.per_second * max(60.0, step))
            mine = [i for i, g in enumerate(groups) if g.endpoint == endpoint]
            for i in mine:
                g = groups[i]
                while flex_retry[i] and now - flex_retry[i][0].since >= FLEX_WAIT:
                    fallback[i] += flex_retry[i].pop(0).count
                k = min(fallback[i], int(credit[endpoint]))
                if k:
                    credit[endpoint] -= k
                    fallback[i] -= k
                    out.add(STANDARD, k, g.price[STANDARD], now + _latest(rng, STANDARD, k))
                credit[endpoint] = _flex_attempts(flex_retry[i], credit[endpoint], world.shed[endpoint], g, now,
                                                  rng, out)
            shares = []
            for i in mine:
                mix = current.of(groups[i].stage, groups[i].model)
                online = {m: n for m, n in (mix.counts.items() if mix else ()) if m != BATCH and n}
                if unsent[i] and online:
                    shares.append((i, online))
            for i, online in shares:
                n = min(unsent[i], int(credit[endpoint] / len(shares)))
                if n <= 0:
                    continue
                credit[endpoint] -= n
                unsent[i] -= n
                g = groups[i]
                planned = sum(online.values())
                modes = list(online)
                for mode in modes:
                    k = n if mode == modes[-1] else round(n * online[mode] / planned)
                    n -= k
                    if mode == FLEX:  # its first attempt now, the shed ones wait their turn
                        answered = _binomial(rng, k, 1.0 - world.shed[endpoint])
                        out.add(FLEX, answered, g.price[FLEX], now + _latest(rng, FLEX, answered))
                        if k > answered:
                            flex_retry[i].append(_Flex(now, k - answered))
                    else:
                        out.add(mode, k, g.price[mode], now + _latest(rng, mode, k))
        now += step
    if out.done < total:
        out.finished = math.inf
    return out


def _flex_attempts(waiting: list[_Flex], credit: float, shed: float, g: Group, now: float, rng: random.Random,
                   out: Outcome) -> float:
    """Attempts at flex for the requests waiting (oldest first) as far as ``credit`` goes; returns what is left."""
    for head in list(waiting):
        tries = min(head.count, int(credit))
        if tries <= 0:
            break
        credit -= tries
        answered = _binomial(rng, tries, 1.0 - shed)
        out.add(FLEX, answered, g.price[FLEX], now + _latest(rng, FLEX, answered))
        head.count -= answered
        if head.count <= 0:
            waiting.remove(head)
    return credit


def _binomial(rng: random.Random, n: int, p: float) -> int:
    if n <= 0:
        return 0
    if n < 50:
        return sum(rng.random() < p for _ in range(n))
    return max(0, min(n, round(rng.gauss(n * p, math.sqrt(n * p * (1 - p))))))


def _latest(rng: random.Random, mode: str, n: int) -> float:
    """The latest of ``n`` answers' latencies at ``mode`` (the max of n uniforms, drawn at once)."""
    if n <= 0:
        return 0.0
    low, high = LATENCY[mode]
    return low + (high - low) * rng.random() ** (1.0 / n)


def _turnaround(rng: random.Random) -> float:
    sigma = math.log(BATCH_P95 / BATCH_MEDIAN) / 1.6448536
    return BATCH_MEDIAN * math.exp(rng.gauss(0.0, sigma))


def _state(base: State, groups: list[Group], unsent: list[int], flex_retry: list[list[_Flex]],
           batches: list[_Batch], now: float) -> State:
    """The planner's state at ``now``: what is not yet sent (flex requests waiting to be tried again count as not
    sent), the lines in batches and the age of the oldest."""
    found = []
    for i, g in enumerate(groups):
        mine = [b for b in batches if b.group == i]
        waiting = sum(f.count for f in flex_retry[i])
        found.append(replace(g, remaining=unsent[i] + waiting,
                             in_batch=sum(b.lines - b.answered for b in mine),
                             batch_age=now - min((b.start for b in mine), default=now)))
    return replace(base, now=now, groups=tuple(found))


def single_mode(mode: str) -> Policy:
    """A policy sending every request at ``mode`` (batch: one batch, waited for to its end: no cutover)."""
    def policy(state: State) -> Plan:
        mixes = []
        for g in state.groups:
            counts = {mode: g.remaining} if g.remaining else {}
            mixes.append(_mix(g, counts))
        return Plan(tuple(mixes), {e: None for e in state.online}, {})
    return policy


def _mix(g: Group, counts: dict[str, int]):  # noqa: ANN202 - the planner's GroupMix
    from runner.plan.deadline import GroupMix

    return GroupMix(g.stage, g.model, counts, False, 0.0, 0.0)
