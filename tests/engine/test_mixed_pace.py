"""A slow endpoint (one request at a time, like the embedded model) and a fast ``sim:`` model in one stage: the fast
model's requests do not wait behind the slow one's (admission per endpoint, runner/engine/dispatch.py), and a stop
or an abandon while requests wait in the slow endpoint's line loses nothing and sends nothing twice."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from runner.engine.run import execute
from runner.providers import base
from runner.providers.base import Completion, Provider
from runner.spec.job import load_job
from runner.store import open_store
from simserver import SimConfig, start_server
from tests.helpers import write_job, write_rows

SIM = "sim:gpt-sim"
SLOW = "slow:s1"


class SlowProvider(Provider):
    """One request at a time, each taking ``latency`` seconds (the embedded model's shape, without the model)."""

    name: ClassVar[str] = "slow"
    key_env_var: ClassVar[str | None] = None
    default_concurrency: ClassVar[int] = 1
    latency: ClassVar[float] = 0.5
    started: ClassVar[list[str]] = []

    async def execute(self, model: str, messages: list[dict[str, str]], params: dict[str, Any]) -> Completion:
        SlowProvider.started.append(messages[-1]["content"])
        await asyncio.sleep(SlowProvider.latency)
        return Completion(text="A", finish_reason="stop", input_tokens=10, output_tokens=1, raw={"slow": True})


@pytest.fixture
def slow() -> Iterator[type[SlowProvider]]:
    SlowProvider.started = []
    SlowProvider.latency = 0.5
    base.register(SlowProvider)
    try:
        yield SlowProvider
    finally:
        base.unregister("slow")


def _job(tmp_path: Path, url: str, rows: int) -> Any:
    dataset = write_rows(tmp_path / "rows.jsonl", rows)
    extra = f"providers: {{sim: {{base_url: {json.dumps(url)}, concurrency: 4, timeout: 5}}}}"
    return load_job(write_job(tmp_path / "job.yaml", dataset, models=[SLOW, SIM], extra=extra))


async def _interrupt_when(server: Any, slow: type[SlowProvider], sim_answers: int, times: int) -> None:
    """Ctrl-C (``times`` of them, 0.3 s apart) once the server answered ``sim_answers`` and the slow model's first
    request is on its way: requests are then waiting in the slow endpoint's line."""
    while server.stats()["by_status"].get("200", 0) < sim_answers or not slow.started:
        await asyncio.sleep(0.01)
    for _ in range(times):
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.sleep(0.3)


def _order(store: Any, run_id: str) -> list[str]:
    """The run's tasks' models in the order they were recorded."""
    return [task["model"] for task in store.tasks(run_id)]


async def test_the_fast_model_is_all_recorded_before_the_slow_models_second_answer(tmp_path, slow):
    async with await start_server(SimConfig(latency=0.02)) as server:
        job = _job(tmp_path, server.url, rows=4)
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(job, store)
    assert outcome.status == "completed"
    order = _order(store, outcome.run_id)
    assert sorted(order) == sorted([SIM] * 4 + [SLOW] * 4)
    # rows x models: the plan alternates slow, sim; before, each sim request waited for the slow one before it
    second_slow = [n for n, model in enumerate(order) if model == SLOW][1]
    assert order[:second_slow].count(SIM) == 4, order
    assert len(slow.started) == 4


async def test_a_stop_while_requests_wait_in_line_sends_them_on_resume_once(tmp_path, slow):
    async with await start_server(SimConfig(latency=0.02)) as server:
        job = _job(tmp_path, server.url, rows=5)
        store = open_store(tmp_path / "s.sqlite")
        interrupt = asyncio.ensure_future(_interrupt_when(server, slow, 5, 1))
        outcome = await execute(job, store)
        await interrupt
        assert outcome.status == "interrupted"
        # the slow request in flight finished and was recorded; the four waiting in its line were not sent
        assert len(slow.started) == 1
        assert sorted(_order(store, outcome.run_id)) == sorted([SIM] * 5 + [SLOW])
        resumed = await execute(job, store, run_id=outcome.run_id)
    assert resumed.status == "completed"
    assert len(slow.started) == 5 and len(set(slow.started)) == 5, "a request was sent twice"
    lines = [json.loads(x) for x in resumed.results["mc"].read_text().splitlines()]
    assert len(lines) == 10 and all(line["status"] == "done" for line in lines)


async def test_an_abandon_while_requests_wait_in_line_records_nothing_of_the_slow_model(tmp_path, slow):
    slow.latency = 30
    async with await start_server(SimConfig(latency=0.02)) as server:
        job = _job(tmp_path, server.url, rows=4)
        store = open_store(tmp_path / "s.sqlite")
        interrupt = asyncio.ensure_future(_interrupt_when(server, slow, 4, 2))
        outcome = await asyncio.wait_for(execute(job, store), timeout=10)
        await interrupt
    assert outcome.status == "interrupted"
    assert len(slow.started) == 1
    assert sorted(_order(store, outcome.run_id)) == [SIM] * 4


async def test_requests_waiting_in_line_are_each_reserved_and_charged_once_within_the_budget(tmp_path, slow,
                                                                                             fake_provider):
    # Six requests one at a time, five of them waiting in line (a second, free model keeps the loop going), each
    # reserving its worst case (100 output tokens: $0.10) and costing $0.001 against a $0.25 budget: all are sent,
    # each charged once, the budget never passed.
    slow.latency = 0.05
    dataset = write_rows(tmp_path / "rows.jsonl", 6)
    extra = "prices: {'slow:s1': {input: 0.0, output: 1000.0}}\nbudget: {usd: 0.25}"
    job = load_job(write_job(tmp_path / "job.yaml", dataset, models=[SLOW, "fake:m1"], extra=extra))
    job.params.max_tokens = 100
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    assert outcome.status == "completed"
    assert len(slow.started) == 6 and len(fake_provider.history) == 6
    charges = store.ledger(outcome.run_id, kind="charge")
    assert len(charges) == 6 and len({row["key"] for row in charges}) == 6
    assert sum(row["amount"] for row in charges) == pytest.approx(0.006)


async def test_a_store_that_refuses_a_reservation_in_line_ends_the_run_with_its_error(tmp_path, slow, fake_provider,
                                                                                       monkeypatch):
    # The ledger write of a request waiting in the slow endpoint's line fails (a full disk): the run ends with the
    # store's error, as the dispatch loop's own reservation would end it; nothing is left unretrieved in a task.
    from runner.errors import StoreError

    slow.latency = 0.05
    dataset = write_rows(tmp_path / "rows.jsonl", 6)
    extra = "prices: {'slow:s1': {input: 0.0, output: 1000.0}}\nbudget: {usd: 0.25}"
    job = load_job(write_job(tmp_path / "job.yaml", dataset, models=[SLOW, "fake:m1"], extra=extra))
    job.params.max_tokens = 100
    store = open_store(tmp_path / "s.sqlite")
    real, calls = store.reserve_all, []

    def failing_after_the_first(asks: list[Any]) -> Any:
        calls.append(asks)  # a group commit's transaction: the first holds the first reservation
        if len(calls) > 1:
            raise StoreError("the store cannot write: database or disk is full")
        return real(asks)

    monkeypatch.setattr(store, "reserve_all", failing_after_the_first)
    loop = asyncio.get_running_loop()
    lost: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: lost.append(context))
    try:
        outcome = await execute(job, store)
    finally:
        loop.set_exception_handler(None)
    assert outcome.status != "completed"
    assert "disk is full" in (outcome.message or "")
    assert len(slow.started) == 1, "no request in line was sent without its reservation"
    assert lost == []
