"""The reserver at its edges (ARCHITECTURE.md invariant 3): a free model reserves nothing, a priced one holds its
worst case in the ledger, a budget with no room closes the run, the stage or the model it covers, a batch line is
told to come back later while reservations are in flight, and the store's ledger has the last word over what this
process's budgets allow."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from runner.engine.budget import LATER, Reservation
from runner.engine.control import RunControl
from runner.engine.leases import ChunkLeases
from runner.engine.reserver import Reserver
from runner.engine.stats import RunStats
from runner.engine.workers import POLL
from runner.plan.request import Task
from runner.plan.stage import StagePlan
from runner.providers.base import Completion
from runner.spec.job import load_job
from runner.store import Store, open_store
from tests.helpers import write_job, write_rows

MODEL = "fake:m1"
PRICES = f"prices: {{{MODEL}: {{input: 1000.0, output: 3000.0}}}}"


class Parts:
    """A reserver over a fresh store and run, and the tasks of the job's one stage."""

    def __init__(self, tmp_path: Path, extra: str = "", stage_extra: str = "") -> None:
        path = write_job(tmp_path / "job.yaml", write_rows(tmp_path / "rows.jsonl", 4), models=[MODEL],
                         extra=extra, stage_extra=stage_extra)
        job = load_job(path)
        self.store: Store = open_store(tmp_path / "store.sqlite")
        self.run_id = self.store.create_run(job.name, job.path, job.model_dump_json(), job.fingerprint(), 4)
        self.stats, self.control = RunStats(), RunControl()
        self.reserver = Reserver(run_id=self.run_id, job=job, store=self.store, stats=self.stats,
                                 control=self.control, leases=ChunkLeases(self.stats))
        self.tasks: list[Task] = list(StagePlan(job, job.stages[0]))

    def reserved(self) -> list[float]:
        return [row["amount"] for row in self.store.ledger(self.run_id, kind="reserved")]


def worst_case(tmp_path: Path) -> float:
    """One task's worst case in USD at :data:`PRICES` (every task of the job has the same)."""
    (tmp_path / "probe").mkdir(exist_ok=True)
    parts = Parts(tmp_path / "probe", PRICES)
    cases = {parts.reserver.worst_case(task)[0] for task in parts.tasks}
    assert len(cases) == 1 and next(iter(cases)) > 0
    return cases.pop()


async def test_a_free_model_without_budgets_reserves_nothing(tmp_path: Path, fake_provider):
    parts = Parts(tmp_path)
    assert parts.reserver.free(MODEL)
    assert parts.reserver.cost(parts.tasks[0], Completion(text="A", input_tokens=100, output_tokens=10)) == (0.0, None)


async def test_a_priced_model_holds_its_worst_case_in_the_ledger_until_released(tmp_path: Path, fake_provider):
    worst = worst_case(tmp_path)
    parts = Parts(tmp_path, PRICES)
    assert not parts.reserver.free(MODEL)
    held = await parts.reserver.reserve(parts.tasks[0])
    assert isinstance(held, Reservation) and held.scopes == [] and held.ledger_id is not None
    assert parts.reserved() == [pytest.approx(worst)]
    parts.reserver.release(held)
    assert parts.reserved() == []


async def test_no_room_with_nothing_in_flight_stops_the_run(tmp_path: Path, fake_provider):
    worst = worst_case(tmp_path)
    parts = Parts(tmp_path, f"{PRICES}\nbudget: {{usd: {worst / 2}}}")
    assert await parts.reserver.reserve(parts.tasks[0]) is None
    budgets = parts.reserver.budgets
    assert budgets is not None and parts.reserver.exhausted is budgets.run and parts.control.stopping
    assert parts.stats.counters("mc", MODEL).over_budget == 1 and parts.reserved() == []
    assert budgets.run.reserved_usd == 0.0 and budgets.run.inflight == 0
    assert any("the run stops" in note for note in parts.stats.notes)


async def test_a_stage_budget_closes_its_stage_and_the_run_goes_on(tmp_path: Path, fake_provider):
    worst = worst_case(tmp_path)
    parts = Parts(tmp_path, PRICES, stage_extra=f"    budget: {{usd: {worst * 1.5}}}")
    first = await parts.reserver.reserve(parts.tasks[0])
    assert isinstance(first, Reservation)
    parts.reserver.settle(first, worst, 10)  # it cost its worst case: half of one is left
    assert not parts.reserver.closed(parts.tasks[1])
    assert await parts.reserver.reserve(parts.tasks[1]) is None
    assert parts.reserver.closed(parts.tasks[2]) and parts.reserver.exhausted is None
    assert not parts.control.stopping


async def test_a_model_budget_closes_that_model(tmp_path: Path, fake_provider):
    worst = worst_case(tmp_path)
    parts = Parts(tmp_path, f"{PRICES}\nbudget: {{usd: 100, models: {{{MODEL}: {{usd: {worst / 2}}}}}}}")
    assert await parts.reserver.reserve(parts.tasks[0]) is None
    assert parts.reserver.closed_models == {("mc", MODEL)} and parts.reserver.closed(parts.tasks[1])
    assert parts.reserver.exhausted is None and not parts.control.stopping


async def test_a_batch_line_comes_back_later_while_reservations_are_in_flight(tmp_path: Path, fake_provider):
    worst = worst_case(tmp_path)
    parts = Parts(tmp_path, f"{PRICES}\nbudget: {{usd: {worst * 1.5}}}")
    first = await parts.reserver.reserve(parts.tasks[0])
    assert isinstance(first, Reservation)
    assert await parts.reserver.reserve(parts.tasks[1], batch=True) == LATER  # never waits, never closes anything
    assert parts.reserver.exhausted is None and not parts.control.stopping
    assert parts.stats.counters("mc", MODEL).over_budget == 0
    parts.reserver.release(first)
    line = await parts.reserver.reserve(parts.tasks[1], batch=True)
    assert isinstance(line, Reservation) and parts.reserved() == [pytest.approx(worst)]


async def test_the_stores_ledger_has_the_last_word(tmp_path: Path, fake_provider):
    """Another process's reservation, which this process's budgets do not know of, holds the room it took."""
    worst = worst_case(tmp_path)
    parts = Parts(tmp_path, f"{PRICES}\nbudget: {{usd: {worst * 1.5}}}")
    other = parts.store.reserve(parts.run_id, "mc", MODEL, "another-request", worst, "another-worker")
    assert await parts.reserver.reserve(parts.tasks[0], batch=True) == LATER
    budgets = parts.reserver.budgets
    assert budgets is not None and budgets.run.reserved_usd == 0.0 and budgets.run.inflight == 0
    waiting = asyncio.ensure_future(parts.reserver.reserve(parts.tasks[0]))
    await asyncio.sleep(POLL * 3)
    assert not waiting.done()  # the other reservation may settle below its worst case: it waits
    parts.store.release(other)
    got = await asyncio.wait_for(waiting, 5)
    assert isinstance(got, Reservation) and got.ledger_id is not None
    assert parts.reserved() == [pytest.approx(worst)]


async def test_a_stopping_run_stops_waiting_for_the_store(tmp_path: Path, fake_provider):
    worst = worst_case(tmp_path)
    parts = Parts(tmp_path, f"{PRICES}\nbudget: {{usd: {worst * 1.5}}}")
    parts.store.reserve(parts.run_id, "mc", MODEL, "another-request", worst, "another-worker")
    waiting = asyncio.ensure_future(parts.reserver.reserve(parts.tasks[0]))
    await asyncio.sleep(POLL)
    parts.control.stop()
    assert await asyncio.wait_for(waiting, 5) is None
    assert parts.reserver.exhausted is None and not parts.reserver.closed(parts.tasks[0])



async def test_a_token_budget_is_reserved_in_the_store_and_has_its_last_word(tmp_path: Path, fake_provider):
    """A token budget over a model that costs nothing: each request's worst-case tokens are still a ledger
    reservation (every process on the run counts them), another process's token reservation holds the room it took,
    and one that no longer fits with nothing in flight closes the budget it covers."""
    (tmp_path / "probe").mkdir()
    probe = Parts(tmp_path / "probe")
    tokens = probe.reserver.worst_case(probe.tasks[0])[1]
    parts = Parts(tmp_path, stage_extra=f"    budget: {{tokens: {tokens * 2 + tokens // 2}}}")
    assert parts.reserver.counts_tokens("mc", MODEL) and not parts.reserver.priced(MODEL)
    first = await parts.reserver.reserve(parts.tasks[0])
    assert isinstance(first, Reservation) and first.ledger_id is not None
    assert [(row["amount"], row["tokens"]) for row in parts.store.ledger(parts.run_id)] == [(0.0, tokens)]
    other = parts.store.reserve(parts.run_id, "mc", MODEL, "another-request", 0.0, "another-worker", tokens=tokens)
    waiting = asyncio.ensure_future(parts.reserver.reserve(parts.tasks[1]))
    await asyncio.sleep(POLL * 3)
    assert not waiting.done()  # half a request's room is left while two are in flight: it waits
    parts.store.release(other)
    second = await asyncio.wait_for(waiting, 5)
    assert isinstance(second, Reservation) and second.ledger_id is not None
    parts.reserver.release(first)
    parts.reserver.release(second)
    parts.store.write_batch([], [], [(parts.run_id, "mc", MODEL, "spent", "charge", 0.0, "t", tokens * 2, None, None)])
    assert await parts.reserver.reserve(parts.tasks[2]) is None  # half a request's room, nothing in flight
    assert parts.reserver.closed(parts.tasks[3]) and parts.reserver.exhausted is None
