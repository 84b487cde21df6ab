"""An attempt that timed out after it was sent may have been billed (the provider made the answer; this process did
not read it in time): its reservation is kept as possibly billed, budget or not, and its retry is reserved anew
within the budget or not sent (ARCHITECTURE.md invariant 3). Found by the seeded fault simulation (issue 35, seed 3
under load: a request billed twice, no possibly billed row)."""

from __future__ import annotations

import pytest

from runner.engine.control import RunControl
from runner.engine.leases import ChunkLeases
from runner.engine.reserver import Reserver
from runner.engine.run import execute
from runner.engine.stats import RunStats
from runner.errors import TransientError
from runner.plan.stage import StagePlan
from runner.report import summary as report
from runner.spec.job import load_job
from runner.store import open_store
from tests.helpers import write_job, write_rows

MODEL = "fake:m1"
PRICES = f"prices: {{{MODEL}: {{input: 1000.0, output: 3000.0}}}}"


def _job(tmp_path, rows: int, extra: str = ""):
    dataset = write_rows(tmp_path / "rows.jsonl", rows)
    return load_job(write_job(tmp_path / "job.yaml", dataset, models=[MODEL], extra=extra))


def _worst(job, tmp_path) -> tuple[float, int]:
    """(USD, tokens) of one task's worst case (every task of these jobs has the same)."""
    stats = RunStats()
    reserver = Reserver(run_id="r", job=job, store=open_store(tmp_path / "probe.sqlite"), stats=stats,
                        control=RunControl(), leases=ChunkLeases(stats))
    cases = {reserver.worst_case(task) for task in StagePlan(job, job.stages[0])}
    assert len(cases) == 1
    return cases.pop()


def _timeout_on(*calls: int):
    """A fake provider's behaviour: the given calls (1-based) time out, the others answer."""
    def behaviour(model, messages, params, n):
        return TransientError("fake: timed out after 0.1 s", error_class="timeout") if n in calls else None
    return behaviour


async def test_a_timed_out_attempt_stays_possibly_billed_and_its_retry_is_charged(tmp_path, fake_provider):
    job = _job(tmp_path, 3, PRICES)
    usd, tokens = _worst(job, tmp_path)
    fake_provider.behaviour = _timeout_on(1)
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    assert outcome.status == "completed", outcome.message
    assert len(fake_provider.history) == 4  # three tasks, one of them sent twice
    (kept,) = store.ledger(outcome.run_id, kind="possibly_billed")
    assert kept["amount"] == pytest.approx(usd) and kept["tokens"] == tokens
    charges = store.ledger(outcome.run_id, kind="charge")
    assert len(charges) == 3 and kept["key"] in {row["key"] for row in charges}
    assert store.ledger(outcome.run_id, kind="reserved") == []
    totals = report.build(store, outcome.run_id)["totals"]
    assert totals["possibly_billed"] == pytest.approx(usd) and totals["possibly_billed_requests"] == 1


async def test_a_free_models_timed_out_attempt_gets_a_possibly_billed_row_of_its_tokens(tmp_path, fake_provider):
    job = _job(tmp_path, 2)
    fake_provider.behaviour = _timeout_on(1, 2)
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    assert outcome.status == "completed", outcome.message
    kept = store.ledger(outcome.run_id, kind="possibly_billed")
    assert len(kept) == 2 and all(row["amount"] == 0 and row["tokens"] > 5 for row in kept)


async def test_a_retry_with_no_room_left_in_the_budget_is_not_sent(tmp_path, fake_provider):
    """Room for one worst case and a half: the first attempt's worst case stays spent, so its retry does not fit and
    is not sent; the run ends on its budget, resumable, and nothing is left reserved."""
    job = _job(tmp_path, 1, PRICES)
    usd, _ = _worst(job, tmp_path)
    job = _job(tmp_path, 1, f"{PRICES}\nbudget: {{usd: {usd * 1.5}}}")
    fake_provider.behaviour = _timeout_on(1)
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    assert outcome.status == "budget_exhausted", outcome.message
    assert len(fake_provider.history) == 1
    (kept,) = store.ledger(outcome.run_id, kind="possibly_billed")
    assert kept["amount"] == pytest.approx(usd)
    assert store.ledger(outcome.run_id, kind="charge") == [] and store.ledger(outcome.run_id, kind="reserved") == []
    assert [t["status"] for t in store.tasks(outcome.run_id)] == []  # not sent again, not failed: a resume sends it


async def test_a_last_attempt_that_timed_out_fails_the_task_and_keeps_its_reservation(tmp_path, fake_provider):
    job = _job(tmp_path, 1, PRICES)
    job.retry.max_attempts = 1
    usd, _ = _worst(job, tmp_path)
    fake_provider.behaviour = _timeout_on(1)
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    (task,) = store.tasks(outcome.run_id)
    assert task["status"] == "failed" and task["error_class"] == "timeout"
    (kept,) = store.ledger(outcome.run_id, kind="possibly_billed")
    assert kept["amount"] == pytest.approx(usd)
    assert store.ledger(outcome.run_id, kind="reserved") == []


async def test_an_error_answer_is_not_kept_as_possibly_billed(tmp_path, fake_provider):
    job = _job(tmp_path, 2, PRICES)
    fake_provider.behaviour = lambda model, messages, params, n: (
        TransientError("fake: server error 500", status=500) if n == 1 else None)
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    assert outcome.status == "completed", outcome.message
    assert len(fake_provider.history) == 3
    assert store.ledger(outcome.run_id, kind="possibly_billed") == []
