"""The deadline planner end to end (issue 38): one run per deadline of a 2,000-request job through the runner and
the simulated server, the server's clock scaled down, beside what bench/deadline_sim.py predicts for the same draws.

    python bench/deadline.py --e2e [--scale 0.01] [--seed 38]

The job: one stage asking 1,000 rows of two models, as bench/deadline.py's job at a tenth of its size: ``sim:reasoner``
sold at every mode (USD 0.001 / 0.001 / 0.002 / 0.0035 a request at batch / flex / standard / priority) and
``sim:labeller`` without flex (0.0003 / 0.0006 / 0.00105), each its own endpoint of 25 requests a world minute (so
that all at standard takes 40 min, as there). A request is one output token (``max_tokens: 1``) priced per token
at those figures, its input free, so the runner's price of a request is the simulation's.

The world of a seed, the same on both sides: the server's batch turnarounds are its own seeded lognormal draws
(simserver/clock.py: median 2 h, p95 8 h, the n-th batch's draw fixed by the seed and n), which the simulation is
given in the same order; the flex shed rate is the reasoner's Beta(2, 6) draw of ``deadline_sim.draw(seed)``, the
server's ``flex_shed``. Latencies differ: the server's are fixed at the simulation's means (standard 11 s, flex
480 s), the simulation draws them uniform.

Time. The server runs at ``time_scale`` = ``--scale`` (0.01: an hour in 36 s). The runner reads the wall clock; its
job is written in scaled seconds, every duration of it multiplied by the scale (the deadline, the planner's
figures, ``retry.flex_wait``, ``batch.poll_interval``) and its rate limit divided by it (25 a world minute is 2,500 a
real one at 0.01), which is what a runner clock running 1 / scale times as fast would read. So the planner plans
the same world in real seconds.

Printed per deadline: whether the run met it (every request answered within the deadline, in world time), its cost
and mix, the simulation's for the same draws, and whether they agree: both meet the deadline or both miss it, and
the costs are within 10 % of each other.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.deadline_sim import (
    BATCH_MEDIAN,
    BATCH_P95,
    FLEX_WAIT,
    LATENCY,
    SHED_MEAN,
    SHED_P95,
    STEPS_PER_DEADLINE,
    World,
    draw,
    online_figures,
    simulate,
    turnaround_figures,
)
from runner.plan.deadline import BATCH, FLEX, PRIORITY, STANDARD, Group, State
from simserver.clock import turnaround

STAGE = "ask"
REASONER, LABELLER = "sim:reasoner", "sim:labeller"
ROWS = 1000
WORLD_RPM = 25.0
#: USD a request at each mode
PRICES = {REASONER: {BATCH: 0.001, FLEX: 0.001, STANDARD: 0.002, PRIORITY: 0.0035},
          LABELLER: {BATCH: 0.0003, STANDARD: 0.0006, PRIORITY: 0.00105}}
#: the server's latencies (world seconds): the simulation's means
SERVER_LATENCY = sum(LATENCY[STANDARD]) / 2
SERVER_FLEX_EXTRA = sum(LATENCY[FLEX]) / 2 - SERVER_LATENCY
#: costs within this share of each other agree
AGREE_COST = 0.10


def margin(deadline: float) -> float:
    """World seconds the planner keeps back before the deadline, as bench/deadline.py's simulation does."""
    return max(60.0, 2 * deadline / STEPS_PER_DEADLINE)


def job_prices() -> dict[str, Any]:
    """The job's ``prices:`` (USD per million tokens) that make one output token cost a request's USD."""
    found = {}
    for model, usd in PRICES.items():
        entry: dict[str, Any] = {"input": 0.0, "output": usd[STANDARD] * 1e6, "batch_input": 0.0,
                                 "batch_output": usd[BATCH] * 1e6}
        for tier in (FLEX, PRIORITY):
            if tier in usd:
                entry[tier] = {"input": 0.0, "output": usd[tier] * 1e6}
        found[model] = entry
    return found


def write_job(folder: Path, root: str, deadline: float, scale: float, rows: int = ROWS,
              shed: float = SHED_MEAN, shed_p95: float = SHED_P95) -> Path:
    """The job in scaled seconds (module docstring): ``deadline`` and every figure in world seconds."""
    dataset = folder / "rows.jsonl"
    dataset.write_text("".join(json.dumps({"question": f"World question {i}?"}) + "\n" for i in range(rows)),
                       encoding="utf-8")
    real = lambda seconds: f"{seconds * scale:.6g}"  # noqa: E731
    body = {
        "name": "deadline-e2e", "output_dir": str(folder / "results"), "models": [REASONER, LABELLER],
        "deadline": real(deadline),
        "providers": {"sim": {"base_url": root + "/v1", "rpm": round(WORLD_RPM / scale), "concurrency": 1000,
                              "timeout": 60}},
        "params": {"temperature": 0, "max_tokens": 1},
        "retry": {"max_attempts": 6, "backoff_initial": 0.01, "backoff_max": 0.05, "max_elapsed": 120,
                  "flex_wait": float(real(FLEX_WAIT))},
        "batch": {"poll_interval": float(real(margin(deadline)))},
        "planner": {"batch_median": real(BATCH_MEDIAN), "batch_p95": real(BATCH_P95), "flex_shed": shed,
                    "flex_shed_p95": max(shed, shed_p95), "latency": real(LATENCY[STANDARD][1]),
                    "priority_latency": real(LATENCY[PRIORITY][1]), "flex_latency": real(LATENCY[FLEX][1])},
        "prices": job_prices(),
        "stages": [{"name": STAGE, "dataset": {"path": str(dataset)}, "prompt": {"user": "{{ question }}"}}],
    }
    path = folder / "deadline-e2e.yaml"
    path.write_text(json.dumps(body), encoding="utf-8")
    return path


def server_config(seed: int, scale: float, shed: float) -> dict[str, Any]:
    """The simulated server's settings for one world (``SimConfig`` fields)."""
    return {"seed": seed, "time_scale": scale, "latency": SERVER_LATENCY, "flex_latency": SERVER_FLEX_EXTRA,
            "flex_shed": shed, "batch_median": BATCH_MEDIAN, "batch_p95": BATCH_P95}


@dataclass
class Result:
    met: bool
    finished: float  #: world seconds from the start to the last answer (inf: not every request answered)
    cost: float
    mix: dict[str, int]


async def run_once(deadline: float, scale: float, seed: int, *, rows: int = ROWS, shed: float | None = None,
                   folder: Path | None = None) -> Result:
    """One run of the job through a fresh simulated server and store, in the world of ``seed``."""
    from runner.engine.run import execute
    from runner.report import modes
    from runner.spec.job import load_job
    from runner.store import open_store
    from simserver import SimConfig, start_server

    shed = world_shed(seed) if shed is None else shed
    with tempfile.TemporaryDirectory(prefix="deadline-e2e-") as scratch:
        where = folder or Path(scratch)
        async with await start_server(SimConfig(**server_config(seed, scale, shed))) as server:
            job = load_job(write_job(where, server.root_url, deadline, scale, rows))
            store = open_store(where / "s.sqlite")
            started = time.monotonic()
            outcome = await execute(job, store)
            took = (time.monotonic() - started) / scale
            run = store.get_run(outcome.run_id)
            done = sum(1 for t in store.tasks(outcome.run_id) if t["status"] == "done")
            mixed = modes.build(store, run)
        mix: dict[str, int] = {}
        for row in mixed:
            for mode, n in row["requests"].items():
                if n:
                    mix[mode] = mix.get(mode, 0) + n
        cost = sum(row["cost"] for row in mixed)
        finished = took if done == 2 * rows else float("inf")
        return Result(finished <= deadline, finished, cost, mix)


def world_shed(seed: int) -> float:
    return draw(seed, [REASONER, LABELLER]).shed[REASONER]


def state(deadline: float, rows: int = ROWS) -> State:
    groups = tuple(Group(STAGE, model, model, rows, PRICES[model],
                         refused={} if FLEX in PRICES[model] else {FLEX: "no flex price"}) for model in PRICES)
    return State(0.0, deadline, groups, {m: online_figures(WORLD_RPM) for m in PRICES},
                 {m: turnaround_figures() for m in PRICES}, margin=margin(deadline))


def predicted(deadline: float, seed: int, rows: int = ROWS) -> Result:
    """The simulation of the same job in the same world (the server's turnaround draws, its shed rate)."""
    base = draw(seed, [REASONER, LABELLER])
    world = World({m: base.shed[REASONER] for m in PRICES}, seed,
                  lambda n: turnaround(BATCH_MEDIAN, BATCH_P95, seed, n))
    out = simulate(state(deadline, rows), world)
    return Result(out.finished <= deadline, out.finished, out.cost, dict(out.by_mode))


def agree(run: Result, sim: Result) -> bool:
    return run.met == sim.met and abs(run.cost - sim.cost) <= AGREE_COST * max(sim.cost, 1e-12)


def _mix(mix: dict[str, int]) -> str:
    return ", ".join(f"{m} {mix[m]:,}" for m in (BATCH, FLEX, STANDARD, PRIORITY) if mix.get(m)) or "nothing"


async def run_all(deadlines: dict[str, float], scale: float, seed: int) -> list[str]:
    lines = [f"end to end: 2 x {ROWS:,} requests, {WORLD_RPM:g} requests a world minute per model, server and job "
             f"at time scale {scale:g}, seed {seed} (flex shed rate {world_shed(seed):.1%}; batch turnarounds "
             + ", ".join(f"{turnaround(BATCH_MEDIAN, BATCH_P95, seed, n) / 3600:.2f} h" for n in range(3))
             + ", ...)"]
    agreed = 0
    for name, deadline in deadlines.items():
        wall, cpu = time.monotonic(), time.process_time()
        run = await run_once(deadline, scale, seed)
        wall, cpu = time.monotonic() - wall, time.process_time() - cpu
        sim = predicted(deadline, seed)
        ok = agree(run, sim)
        agreed += ok
        lines.append(f"deadline {name} ({wall:.0f} s wall, {cpu:.0f} s CPU):")
        for label, r in (("run", run), ("simulation", sim)):
            lines.append(f"  {label:10s} {'met' if r.met else 'MISSED'}, finished {r.finished / 3600:5.2f} h, cost "
                         f"${r.cost:.4f}, mix: {_mix(r.mix)}")
        lines.append(f"  agree: {'yes' if ok else 'NO'} (both {'meet' if run.met else 'miss'} it: "
                     f"{run.met == sim.met}; cost run / simulation {run.cost / max(sim.cost, 1e-12):.3f})")
    lines.append(f"agreed at {agreed} of {len(deadlines)} deadlines (agree: both meet or both miss, costs within "
                 f"{AGREE_COST:.0%})")
    return lines
