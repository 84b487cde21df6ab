#!/usr/bin/env python
"""The deadline planner (issue 38) on a 20,000-request job, deadlines 1 h, 6 h and 24 h:

    python bench/deadline.py [--draws 50] [--seed 38]
    python bench/deadline.py --e2e [--scale 0.01] [--seed 38]

The job: stage ``reason`` (10,000 requests) of a model sold at every mode (batch, flex, standard, priority: USD
0.001 / 0.001 / 0.002 / 0.0035 a request) and stage ``label`` (10,000) of a model without flex (batch, standard,
priority: USD 0.0003 / 0.0006 / 0.00105), each model its own endpoint of 250 requests a minute (so that all at
standard takes 40 min). The world is drawn per draw as bench/deadline_sim.py states it: batch turnaround lognormal
(median 2 h, p95 8 h, cut at the 24 h window), flex shed rate Beta(2, 6) per endpoint (mean 25 %, p95 53 %),
latencies uniform (standard 2-20 s, priority 1-5 s, flex 1-15 min). The planner is told those figures (median, p95,
shed mean and p95, the latencies' upper ends), and ``runner.plan.deadline.plan`` is replayed, itself, in the
simulation, over ``--draws`` draws (seeds ``--seed`` + i), beside each single mode (batch: one batch waited for).

Printed per deadline: the share of draws that meet it and the mean cost for the planner and each single mode, the
planner's cost against the cheapest single mode that meets the deadline in at least 95 % of the draws, and against
all-standard. The planner keeps back two steps of the simulation before the deadline (``margin``: what a poll of
the batches is to a run).

``--e2e``: instead, one run per deadline of a 2,000-request job through the runner and the simulated server with
its clock scaled (``--scale``, 0.01 by default: an hour in 36 s), beside the simulation's prediction for the same
draws, and whether they agree (bench/deadline_e2e.py says how).

A script, not a test: pytest does not collect ``bench/``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.deadline_sim import (  # noqa: E402
    SHED_P95,
    STEPS_PER_DEADLINE,
    draw,
    online_figures,
    simulate,
    single_mode,
    turnaround_figures,
)
from runner.plan.deadline import BATCH, FLEX, PRIORITY, STANDARD, Group, State, plan  # noqa: E402

DEADLINES = {"1 h": 3600.0, "6 h": 6 * 3600.0, "24 h": 24 * 3600.0}
RPM = 250.0
PRICES = {
    "reason": {BATCH: 0.001, FLEX: 0.001, STANDARD: 0.002, PRIORITY: 0.0035},
    "label": {BATCH: 0.0003, STANDARD: 0.0006, PRIORITY: 0.00105},
}
MODELS = {"reason": "sim:reasoner", "label": "sim:labeller"}


def job_state(deadline: float, per_stage: int = 10_000) -> State:
    groups = tuple(Group(stage, MODELS[stage], MODELS[stage], per_stage, PRICES[stage],
                         refused={} if FLEX in PRICES[stage] else {FLEX: "not sold at flex"})
                   for stage in ("reason", "label"))
    endpoints = [g.endpoint for g in groups]
    return State(0.0, deadline, groups, {e: online_figures(RPM) for e in endpoints},
                 {e: turnaround_figures() for e in endpoints}, margin=max(60.0, 2 * deadline / STEPS_PER_DEADLINE))


def run(draws: int, seed: int) -> list[str]:
    lines = [f"seed {seed}, {draws} draws; flex shed p95 {SHED_P95:.2f}; planner: runner.plan.deadline.plan"]
    strategies = {"planner": plan, "all batch": single_mode(BATCH), "all flex": None,
                  "all standard": single_mode(STANDARD), "all priority": single_mode(PRIORITY)}
    for name, deadline in DEADLINES.items():
        state = job_state(deadline)
        results: dict[str, list] = {}
        started = time.process_time()
        for label, policy in strategies.items():
            if policy is None:  # the label stage's model is not sold at flex: no single flex mode for the job
                continue
            outcomes = []
            for i in range(draws):
                world = draw(seed + i, list(state.online))
                outcomes.append(simulate(state, world, policy, cancel=label == "planner"))
            results[label] = outcomes
        lines.append(f"deadline {name} (simulated in {time.process_time() - started:.1f} s of CPU):")
        singles = {}
        for label, outcomes in results.items():
            met = sum(o.finished <= deadline for o in outcomes) / len(outcomes)
            cost = statistics.fmean(o.cost for o in outcomes)
            finish = statistics.median(o.finished for o in outcomes)
            mix = {}
            for o in outcomes:
                for mode, n in o.by_mode.items():
                    mix[mode] = mix.get(mode, 0) + n / len(outcomes)
            shown = ", ".join(f"{m} {n:,.0f}" for m, n in sorted(mix.items()))
            lines.append(f"  {label:13s} met {met:6.1%}  mean cost ${cost:8.3f}  median finish "
                         f"{finish / 3600:6.2f} h  mix: {shown}")
            if label != "planner":
                singles[label] = (met, cost)
        planner_cost = statistics.fmean(o.cost for o in results["planner"])
        meeting = {k: v for k, v in singles.items() if v[0] >= 0.95}
        cheapest = min(meeting.items(), key=lambda kv: kv[1][1]) if meeting else None
        if cheapest:
            lines.append(f"  planner / cheapest single mode that meets it ({cheapest[0]}): "
                         f"{planner_cost / cheapest[1][1]:.3f}x; all standard / planner: "
                         f"{singles['all standard'][1] / planner_cost:.2f}x")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=50)
    parser.add_argument("--seed", type=int, default=38)
    parser.add_argument("--e2e", action="store_true", help="one run per deadline through the simulated server")
    parser.add_argument("--scale", type=float, default=0.01, help="--e2e: real seconds per world second")
    args = parser.parse_args()
    if args.e2e:
        import asyncio

        from bench.deadline_e2e import run_all

        if not 0 < args.scale <= 1:
            parser.error("--scale: give a number above 0 and at most 1 (0.01: an hour in 36 s)")
        for line in asyncio.run(run_all(DEADLINES, args.scale, args.seed)):
            print(line, flush=True)
        return
    for line in run(args.draws, args.seed):
        print(line, flush=True)


if __name__ == "__main__":
    main()
