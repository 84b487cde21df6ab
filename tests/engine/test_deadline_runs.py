"""The deadline planner in whole runs against the simulated server (runner/engine/deadline.py over
runner/plan/deadline.py): a batch that meets the deadline is waited for; one that does not is cancelled at the
cutover and its requests answered online before the deadline; every answer charged once, in one ledger."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from runner.engine.run import execute
from runner.spec.job import load_job
from runner.store import open_store
from simserver import SimConfig, start_server

MODEL = "sim:gpt-sim"
#: USD per million tokens: batch half of standard, flex dearer than batch, priority double
PRICES = {"input": 2000.0, "output": 8000.0, "batch_input": 1000.0, "batch_output": 4000.0,
          "flex": {"input": 1500.0, "output": 6000.0}, "priority": {"input": 4000.0, "output": 16000.0}}


def write_job(folder: Path, root: str, rows: int, deadline: str, **job: Any) -> Path:
    dataset = folder / "rows.jsonl"
    dataset.write_text("".join(json.dumps({"question": f"Deadline question {i}?"}) + "\n" for i in range(rows)),
                       encoding="utf-8")
    body = {
        "name": "deadline", "output_dir": str(folder / "results"), "models": [MODEL], "deadline": deadline,
        "providers": {"sim": {"base_url": root + "/v1", "rpm": 6000, "timeout": 10}},
        "params": {"temperature": 0, "max_tokens": 8},
        "retry": {"max_attempts": 4, "backoff_initial": 0.01, "backoff_max": 0.02, "max_elapsed": 30},
        "batch": {"poll_interval": 0.05},
        # what the planner assumes of this server: batches within 1-2 s, answers within half a second
        "planner": {"batch_median": "1s", "batch_p95": "2s", "latency": "0.5s", "priority_latency": "0.2s",
                    "flex_latency": "1s"},
        "prices": {MODEL: PRICES},
        "stages": [{"name": "ask", "dataset": {"path": str(dataset)}, "prompt": {"user": "{{ question }}"}}],
        **job,
    }
    path = folder / "deadline.yaml"
    path.write_text(json.dumps(body), encoding="utf-8")
    return path


@pytest.fixture
async def server():
    async with await start_server(SimConfig(seed=5)) as srv:
        yield srv


async def test_a_batch_that_meets_the_deadline_is_waited_for(tmp_path, server):
    server.configure(batch_delay=0.3)
    job = load_job(write_job(tmp_path, server.root_url, 30, "60s"))
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    assert outcome.status == "completed"
    stats = server.stats()
    assert stats["batch_results"]["succeeded"] == 30 and stats.get("tiers") is None
    charged = store.ledger(outcome.run_id, kind="charge")
    assert len(charged) == 30 and len({c["key"] for c in charged}) == 30


async def test_at_the_cutover_a_slow_batch_is_cancelled_and_answered_online_by_the_deadline(tmp_path, server):
    # the server's batch takes a minute; the planner expects 2 s at most, so it batches, then cuts over: 30
    # requests online at 100 a second and their half second leave the cutover about 2.1 s after the start
    server.configure(batch_delay=60.0)
    job = load_job(write_job(tmp_path, server.root_url, 30, "3s"))
    store = open_store(tmp_path / "s.sqlite")
    started = time.monotonic()
    outcome = await execute(job, store)
    took = time.monotonic() - started
    assert outcome.status == "completed" and took < 3.0
    stats = server.stats()
    answered_in_batch = stats["batch_results"]["succeeded"]
    assert stats["batch_results"]["canceled"] == 30 - answered_in_batch
    served = stats["tiers"]["served"]["openai"]
    assert sum(served.values()) == 30 - answered_in_batch and set(served) <= {"standard", "priority"}
    charged = store.ledger(outcome.run_id, kind="charge")
    assert len(charged) == 30 and len({c["key"] for c in charged}) == 30  # each answer paid once


async def test_a_budgeted_run_mixing_batch_flex_and_standard_never_overshoots(tmp_path, server):
    """It hung in about half its runs until a batch's lines sent online past the cutover got a task of their own:
    awaited by the loop that polls the batches, the first of them waited for budget room that another batch's
    reservations held, and that batch is collected by the same loop (runner/engine/batch.py, ``_online``)."""
    # sim:gpt-sim is batched and cut over to standard; sim:gpt-flex, whose flex is the cheapest way, is sent at
    # flex, half of it shed and tried again, some falling back to standard: one ledger, one budget over them all
    server.configure(batch_delay=60.0, flex_shed=0.5)
    flexy = "sim:gpt-flex"
    prices = {MODEL: PRICES, flexy: {**PRICES, "flex": {"input": 500.0, "output": 2000.0}}}
    job = load_job(write_job(tmp_path, server.root_url, 40, "3s", models=[MODEL, flexy], prices=prices,
                             budget={"usd": 2.5}))
    job.retry.flex_wait = 0.2
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    spent = sum(row["amount"] for row in store.ledger(outcome.run_id) if row["kind"] in ("charge", "possibly_billed"))
    assert 0 < spent <= 2.5
    tiers = {row["tier"] for row in store.ledger(outcome.run_id, kind="charge")}
    assert "flex" in tiers and "standard" in tiers
    assert server.stats()["batches"] >= 1
    assert outcome.stats.totals().over_budget > 0  # the budget, not the deadline, stopped it


async def test_a_scaled_end_to_end_run_meets_its_deadline_at_the_planners_mix():
    """``bench/deadline.py --e2e`` in small: 2 x 60 requests, a 24 h deadline at a ten-thousandth of the time
    (8.6 s), the server's batch turnaround its seeded draw (2.8 h) and no flex shed: the run meets the deadline and
    sends each request the way the planner planned at the start (the labeller's through a batch, the reasoner's at
    flex), at the planned price."""
    from bench.deadline_e2e import PRICES, run_once, state
    from runner.plan.deadline import plan

    planned: dict[str, int] = {}
    for mix in plan(state(86400.0, rows=60)).mixes:
        for mode, n in mix.counts.items():
            planned[mode] = planned.get(mode, 0) + n
    assert planned == {"batch": 60, "flex": 60}
    result = await run_once(86400.0, 0.0001, 38, rows=60, shed=0.0)
    assert result.met and result.mix == planned
    assert result.cost == pytest.approx(60 * PRICES["sim:labeller"]["batch"] + 60 * PRICES["sim:reasoner"]["flex"])


def test_a_stages_relative_deadline_counts_from_the_runs_stored_start(tmp_path):
    """A resume (or a worker joining) 50 minutes into a run whose stage has ``deadline: 1h`` plans for the 10
    minutes left, not for an hour from its own start."""
    import datetime as dt

    from runner.engine.deadline import steer_of
    from runner.engine.stats import RunStats

    job = load_job(write_job(tmp_path, "http://127.0.0.1:9", 4, "6h"))
    job.deadline = None
    job.stages[0].deadline = "1h"
    store = open_store(tmp_path / "s.sqlite")
    run_id = store.create_run("deadline", "deadline.yaml", job.model_dump_json(), "f", 4)
    started = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=50)
    store.set_run(run_id, created=started.isoformat(timespec="milliseconds"))
    steer = steer_of(job, RunStats(), None, store, run_id)
    assert steer is not None
    [group] = steer.groups.values()
    assert group.deadline == pytest.approx(started.timestamp() + 3600, abs=0.01)
