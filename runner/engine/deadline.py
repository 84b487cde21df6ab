"""The deadline planner at run time: each request of a stage in ``mode: auto`` with a deadline goes the way the
planner (runner/plan/deadline.py) says, planned again as the run goes, and a stage's batches are cancelled at its
endpoint's cutover so that their lines go online in time.

:class:`DeadlineSteer` keeps, per stage and model, what it decided (requests given to each mode), what waits in
batches (lines given to a batch, less those answered or sent back), and the last plan. A request's mode is chosen
once (:meth:`mode_of`, remembered by its key for its reservation and its send): the batch while the plan's batch
lines are not all given (so the batch is submitted as soon as the group's first request goes online, not at the end
of a stage dispatched at the online pace), then the online tier whose planned count is furthest ahead of what was
given to it since that plan. The state is planned again every ``REPLAN`` requests
decided or ``REPLAN_SECONDS``, whichever comes first, and when a batch's lines come back. A model that costs
nothing (the simulated server's and the user's own, unless the job prices them) has nothing to save: its auto stage
batches while ``batch.min_window`` allows, as without a planner. A relative deadline counts from the run's start as
the store keeps it (``runs.created``), the job's and a stage's alike: a resume, or a worker joining, does not start
it again.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from runner.engine.stats import RunStats
from runner.plan.deadline import BATCH, FLEX, PRIORITY, STANDARD, Group, Plan, State, plan
from runner.plan.deadline_inputs import (
    batch_api,
    endpoint_inputs,
    mode_refusals,
    read_history,
    request_prices,
)
from runner.plan.request import Task
from runner.providers.pricing import Pricing
from runner.providers.tokens import count_call_tokens
from runner.spec.schema import Job
from runner.store import Store

__all__ = ["DeadlineSteer", "steer_of"]

#: requests decided between two plans at most, and seconds
REPLAN = 256
REPLAN_SECONDS = 5.0
#: request keys whose mode is remembered (a request is asked for it when reserved and when sent)
REMEMBERED = 65_536


@dataclass
class _Group:
    stage: str
    model: str
    deadline: float
    prices: dict[str, float] | None = None
    refused: dict[str, str] = field(default_factory=dict)
    given: dict[str, int] = field(default_factory=dict)
    since_plan: dict[str, int] = field(default_factory=dict)
    in_batch: int = 0
    batch_since: float | None = None
    #: its batches were cut over: nothing more is batched
    cut: bool = False


class DeadlineSteer:
    """Which way each request of the planned stages goes, and when their batches are cut over."""

    def __init__(self, job: Job, stats: RunStats, *, deadline: float | None, store: Store | None = None,
                 clock: type[time.time] | None = None, run_started: float | None = None) -> None:
        """``deadline``: the job's (epoch seconds); ``run_started``: when the run started (epoch seconds, the
        store's), which a stage's relative deadline counts from (this process's start when None)."""
        self.job = job
        self.stats = stats
        self.clock = clock or time.time
        self.started = self.clock()
        origin = self.started if run_started is None else run_started
        self.pricing = Pricing(job)
        self.history = read_history(store)
        self.groups: dict[tuple[str, str], _Group] = {}
        for stage in job.llm_stages():
            if job.stage_mode(stage) != "auto" or job.stage_deadline(stage) is None:
                continue
            at = deadline if stage.deadline is None and deadline is not None else \
                origin + (job.stage_deadline_seconds(stage, origin) or 0.0)
            for model in job.stage_models(stage):
                rates = self.pricing.rates(model)
                if rates is None or rates.is_free:  # nothing to save: auto as without a planner (batch.min_window)
                    continue
                self.groups[(stage.name, model)] = _Group(
                    stage.name, model, at, refused=mode_refusals(job, stage, model, batch_api(job, model)))
        self.modes: OrderedDict[str, str] = OrderedDict()
        self.plans: dict[float, Plan] = {}
        #: requests decided since the last plan
        self.since_plan = REPLAN
        self.planned_at = 0.0

    def planned(self, stage: str, model: str) -> bool:
        return (stage, model) in self.groups

    # -- a request's way ---------------------------------------------------------------------------------
    def mode_of(self, task: Task) -> str:
        """``task``'s mode (batch, flex, standard or priority), chosen once."""
        found = self.modes.get(task.key)
        if found is not None:
            return found
        g = self.groups[(task.stage, task.model)]
        if g.prices is None:
            tokens = count_call_tokens(task.provider, task.model_name, task.messages, task.call.pairs)
            out = task.call.params.get("max_tokens") or 0
            g.prices = request_prices(self.pricing, task.model, tokens, out) or {STANDARD: 0.0}
            self.since_plan = REPLAN  # a group the plan did not know: planned again now
        mix = self._plan(g).of(g.stage, g.model)
        counts = dict(mix.counts) if mix is not None else {}
        if g.cut:
            counts.pop(BATCH, None)
        if counts.get(BATCH, 0) > g.since_plan.get(BATCH, 0):  # batch lines first: their batch starts sooner
            mode = BATCH
        else:
            mode = max((m for m in counts if m != BATCH), key=lambda m: counts[m] - g.since_plan.get(m, 0),
                       default=STANDARD)
        g.given[mode] = g.given.get(mode, 0) + 1
        g.since_plan[mode] = g.since_plan.get(mode, 0) + 1
        self.since_plan += 1
        if mode == BATCH:
            g.in_batch += 1
            g.batch_since = g.batch_since or self.clock()
        self.modes[task.key] = mode
        if len(self.modes) > REMEMBERED:
            self.modes.popitem(last=False)
        return mode

    def tier_of(self, task: Task) -> str:
        mode = self.mode_of(task)
        return STANDARD if mode == BATCH else mode  # a batch line sent online goes at standard

    def serves(self, stage: str, model: str) -> tuple[str, ...]:
        """The tiers a planned group's online answers may be served at: those it may be sent at, and standard
        (a flex request's fallback, a priority one's downgrade)."""
        g = self.groups[(stage, model)]
        return tuple(t for t in (FLEX, STANDARD, PRIORITY) if t not in g.refused) or (STANDARD,)

    # -- batches -----------------------------------------------------------------------------------------
    def batch_ended(self, stage: str, model: str, answered: int, back: list[Task]) -> None:
        """A batch's lines: ``answered`` answered, ``back`` sent online (each then chosen again, online)."""
        g = self.groups.get((stage, model))
        if g is None:
            return
        g.in_batch = max(0, g.in_batch - answered - len(back))
        if not g.in_batch:
            g.batch_since = None
        if back:  # cut over: the group's requests go online from now on
            g.cut = True
        for task in back:
            self.modes[task.key] = STANDARD
        self.since_plan = REPLAN  # planned again at the next request

    def cut_over(self, stage: str, model: str) -> bool:
        """Whether the stage's batches are to be cancelled now and their lines sent online."""
        g = self.groups.get((stage, model))
        if g is None:
            return False
        current = self._plan(g, fresh=True)
        mix = current.of(stage, model)
        cut = current.cutover.get(model)
        now = self.clock() - self.started
        return (mix is not None and mix.cancel_now) or (cut is not None and now >= cut) or self.clock() >= g.deadline

    # -- planning ----------------------------------------------------------------------------------------
    def _plan(self, g: _Group, *, fresh: bool = False) -> Plan:
        now = self.clock()
        found = self.plans.get(g.deadline)
        if found is None or fresh or self.since_plan >= REPLAN or now - self.planned_at >= REPLAN_SECONDS:
            found = self.plans[g.deadline] = plan(self._state(g.deadline, now))
            self.planned_at, self.since_plan = now, 0
            for other in self.groups.values():
                if other.deadline == g.deadline:
                    other.since_plan = {}
        return found

    def _state(self, deadline: float, now: float) -> State:
        groups = []
        for g in self.groups.values():
            if g.deadline != deadline or g.prices is None:
                continue
            counters = self.stats.counters(g.stage, g.model)
            remaining = max(0, counters.total - counters.cache_hits - counters.resumed - sum(g.given.values()))
            groups.append(Group(g.stage, g.model, g.model, remaining, g.prices, g.in_batch,
                                now - g.batch_since if g.batch_since else 0.0, g.refused))
        online, turnaround = endpoint_inputs(self.job, (g.endpoint for g in groups), self.history)
        return State(now - self.started, deadline - self.started, tuple(groups), online, turnaround,
                     margin=self.job.batch.poll_interval, confidence=self.job.planner.confidence)


def steer_of(job: Job, stats: RunStats, deadline: float | None, store: Store | None,
             run_id: str | None = None) -> DeadlineSteer | None:
    """The run's steer where a stage is planned (``mode: auto`` and a deadline), else None; ``run_id``: the run
    whose stored start a stage's relative deadline counts from."""
    if not any(job.stage_mode(s) == "auto" and job.stage_deadline(s) is not None for s in job.llm_stages()):
        return None
    created = store.get_run(run_id).get("created") if store is not None and run_id is not None else None
    started = dt.datetime.fromisoformat(str(created)).timestamp() if created else None
    return DeadlineSteer(job, stats, deadline=deadline, store=store, run_started=started)
