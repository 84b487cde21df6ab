"""The deadline planner in the estimate and at the front doors: a job's stages with a deadline turned into the
planner's states (one per distinct deadline) from the estimate's counts and tokens, each mode's cost and time, the
planned mix, and the refusal of a deadline no mode can meet, said before anything is sent."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runner.errors import RunnerError
from runner.providers.pricing import Pricing
from runner.spec.schema import Job
from runner.store import Store

# The planner (runner/plan/deadline.py, deadline_inputs.py) is imported by the functions that plan, for a job with a
# deadline: the estimate of every job imports this module.
if TYPE_CHECKING:
    from runner.plan.deadline import Plan, State

__all__ = ["DeadlineMissed", "Planned", "check_deadlines", "deadline_lines", "planned", "states"]


class DeadlineMissed(RunnerError):
    """A deadline that has passed, or that no mode can meet: said before anything is sent."""

    exit_code = 2


@dataclass(frozen=True, slots=True)
class Planned:
    """One deadline's state and the plan for it."""

    deadline: str
    state: State
    plan: Plan


def states(job: Job, groups: list[Any], store: Store | None, *, now: float | None = None) -> list[tuple[str, State]]:
    """(the deadline as written, the planner's state at the run's start) for each distinct deadline of the job's
    stages; ``groups``: the estimate's (runner/report/estimate.py ``Group``), whose requests to send are planned."""
    from runner.plan.deadline import Group, State
    from runner.plan.deadline_inputs import batch_api, endpoint_inputs, mode_refusals, read_history, request_prices

    pricing = Pricing(job)
    history = read_history(store)
    stages = {stage.name: stage for stage in job.llm_stages()}
    by_deadline: dict[str, list[Group]] = {}
    for g in groups:
        stage = stages.get(g.stage)
        text = job.stage_deadline(stage) if stage is not None else None
        if text is None or not g.to_send or g.free:
            continue
        n = g.to_send
        output = (g.output_tokens_expected if g.history else g.output_tokens_max) or 0
        cached = (g.cache_read_tokens or 0) / g.input_tokens if g.input_tokens else 0.0
        prices = request_prices(pricing, g.model, (g.input_tokens or 0) / n, output / n, cached)
        if not prices:
            continue
        refused = mode_refusals(job, stage, g.model, batch_api(job, g.model))
        by_deadline.setdefault(text, []).append(Group(g.stage, g.model, g.model, n, prices, refused=refused))
    found = []
    for text, planned in by_deadline.items():
        stage_name = planned[0].stage
        seconds = job.stage_deadline_seconds(stages[stage_name], now)
        assert seconds is not None
        online, turnaround = endpoint_inputs(job, (g.endpoint for g in planned), history)
        found.append((text, State(
            now=0.0, deadline=seconds, groups=tuple(planned), online=online, turnaround=turnaround,
            margin=job.batch.poll_interval, confidence=job.planner.confidence)))
    return found


def planned(job: Job, groups: list[Any], store: Store | None, *, now: float | None = None) -> list[Planned]:
    from runner.plan.deadline import plan

    return [Planned(text, state, plan(state)) for text, state in states(job, groups, store, now=now)]


def check_deadlines(job: Job, groups: list[Any] | None = None, store: Store | None = None,
                    now: float | None = None) -> None:
    """A deadline in the past, or (with the estimate's ``groups``) one no mode can meet: one sentence, before
    anything is sent."""
    now = time.time() if now is None else now
    for stage in job.llm_stages():
        text = job.stage_deadline(stage)
        if text is None:
            continue
        seconds = job.stage_deadline_seconds(stage, now)
        if seconds is not None and seconds <= 0:
            raise DeadlineMissed(f"{job.path or 'the job file'}: stage {stage.name}: deadline {text} has passed "
                                 f"({-seconds / 60:,.0f} min ago): give a later one, or --deadline")
    if groups is None:
        return
    for found in planned(job, groups, store, now=now):
        if found.plan.problem is not None:
            raise DeadlineMissed(f"{job.path or 'the job file'}: deadline {found.deadline}: {found.plan.problem}")


def _duration(seconds: float) -> str:
    if seconds == float("inf"):
        return "never"
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min"


def deadline_lines(job: Job, groups: list[Any], store: Store | None) -> list[str]:
    """The estimate's lines: per stage and model with a deadline, each mode's cost and time for all its requests,
    the planned mix and its expected cost against all-standard; where each assumption comes from."""
    from runner.plan.deadline import BATCH, MODES

    lines: list[str] = []
    for found in planned(job, groups, store):
        state, chosen = found.state, found.plan
        lines.append(f"deadline {found.deadline}: planned with {state.confidence:.0%} confidence of finishing; "
                     f"expected ${chosen.expected:,.4f} against ${chosen.standard:,.4f} all at standard")
        for g in state.groups:
            online, turnaround = state.online[g.endpoint], state.turnaround[g.endpoint]
            modes = []
            for mode in MODES:
                if not g.takes(mode):
                    continue
                if mode == BATCH:
                    takes = turnaround.within(0.0, state.confidence)
                else:
                    shed = online.flex_shed_p95 if mode == "flex" else 0.0
                    latency = {"flex": online.flex_latency, "standard": online.latency,
                               "priority": online.priority_latency}[mode]
                    takes = g.remaining / (1 - shed) / online.per_second + latency
                modes.append(f"{mode} ${g.remaining * g.price[mode]:,.4f} in {_duration(takes)}")
            mix = chosen.of(g.stage, g.model)
            counts = ", ".join(f"{mode} {n:,}" for mode, n in (mix.counts.items() if mix else ()))
            lines.append(f"  {g.stage} {g.model}: " + "; ".join(modes) + f" -> planned mix: {counts or 'nothing'}"
                         + (f" (expected ${mix.expected:,.4f})" if mix else ""))
            lines += [f"    not {mode}: {why}" for mode, why in g.refused.items()]
            lines += [f"    not {mode}: no price" for mode in MODES if mode not in g.price and mode not in g.refused]
        for endpoint in sorted(state.online):
            cut = chosen.cutover.get(endpoint)
            if cut is not None and any(mix.counts.get(BATCH) for mix in chosen.mixes):
                lines.append(f"  {endpoint}: batches still running {_duration(cut)} after the start are cancelled "
                             "and their requests sent online")
            lines.append(f"  {endpoint} assumes: {state.online[endpoint].source}; batch: "
                         f"{state.turnaround[endpoint].source}")
        if chosen.problem:
            lines.append(f"  {chosen.problem}")
    return lines
