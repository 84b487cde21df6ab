"""The store off the event loop (runner/store/offloop.py): while a store call waits for a store that does not answer
(SQLite's write lock held by another connection, a PostgreSQL server stopped), the event loop goes on at its pace;
the calls keep their order; a call asked without waiting reports its failure; and the run is told, in one line, that
the store is slow, and past the bound."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from runner.store import open_store
from runner.store.offloop import LoopStore, StoreThread, StoreWatch, off_loop
from tests.helpers import pg_server_processes, signal_all

STALL_S = 1.5
TICK_S = 0.05


async def _ticking_while(call: Any, release: Any, stall: float) -> tuple[list[float], float]:
    """Run ``call()`` (a coroutine function) while a ticker ticks every TICK_S on the loop, and ``release()`` after
    ``stall`` seconds: (the ticks' times, when the call returned), both from the start."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    ticks: list[float] = []

    async def ticker() -> None:
        while True:
            await asyncio.sleep(TICK_S)
            ticks.append(loop.time() - started)

    ticking = asyncio.ensure_future(ticker())
    loop.call_later(stall, release)
    try:
        await call()
        returned = loop.time() - started
    finally:
        ticking.cancel()
    return ticks, returned


def _assert_kept_pace(ticks: list[float], returned: float, stall: float) -> None:
    assert returned >= stall - 0.05, "the call came back before the store answered"
    during = [t for t in ticks if t <= stall]
    gaps = [b - a for a, b in zip([0.0, *during], during, strict=False)]
    assert len(during) >= 0.7 * stall / TICK_S, (len(during), ticks)
    assert max(gaps) < 10 * TICK_S, f"the loop stalled {max(gaps):.2f} s while the store call waited"


async def test_the_loop_keeps_its_pace_while_a_call_waits_for_a_sqlite_lock_held_elsewhere(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    store = open_store(path)
    run_id = store.create_run("job", "job.yaml", "{}", "fp", 1)
    calls = LoopStore(store, StoreThread("store"))
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # another connection holds the write lock
    try:
        ticks, returned = await _ticking_while(
            lambda: calls.join_run(run_id, "w1", "host", 1, 30.0), lambda: other.execute("COMMIT"), STALL_S)
    finally:
        await calls.close()
        other.close()
    _assert_kept_pace(ticks, returned, STALL_S)
    assert [w["state"] for w in store.workers(run_id)] == ["live"]
    store.close()


async def test_the_loop_keeps_its_pace_while_a_call_waits_for_a_stopped_postgresql_server(pg_server: Any) -> None:
    url = pg_server.new_schema()
    store = open_store(url)
    run_id = store.create_run("job", "job.yaml", "{}", "fp", 1)
    calls = LoopStore(store, StoreThread("store"))
    pids = pg_server_processes(pg_server)
    signal_all(pids, signal.SIGSTOP)
    try:
        ticks, returned = await _ticking_while(
            lambda: calls.join_run(run_id, "w1", "host", 1, 30.0), lambda: signal_all(pids, signal.SIGCONT), STALL_S)
    finally:
        signal_all(pids, signal.SIGCONT)
        await calls.close()
    _assert_kept_pace(ticks, returned, STALL_S)
    assert [w["state"] for w in store.workers(run_id)] == ["live"]
    store.close()


async def test_calls_run_in_the_order_asked_and_a_posted_failure_is_reported(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store.sqlite")
    errors: list[BaseException] = []
    calls = LoopStore(store, StoreThread("store"), on_error=errors.append)
    run_id = await calls.create_run("job", "job.yaml", "{}", "fp", 1)
    ledger_id = await calls.reserve(run_id, "mc", "m", "k", 0.5)
    calls.post("release", ledger_id)  # not waited for, but done before any later call
    assert await calls.ledger(run_id) == []
    calls.post("get_run", "no-such-run")  # fails in the thread: reported to on_error
    await calls.run(lambda: None)
    await asyncio.sleep(0.05)  # the failure comes back to the loop
    assert len(errors) == 1
    assert calls.path == store.path and off_loop(calls) is calls
    await calls.close()
    store.close()


class _Thread:
    def __init__(self) -> None:
        self.running_since: float | None = None


def test_a_slow_store_is_said_once_and_again_when_it_answers_and_the_bound_is_called_once() -> None:
    thread = _Thread()
    said: list[str] = []
    bounded: list[float] = []
    watch = StoreWatch([thread], "store.sqlite", said.append, slow_after=5, bound=20,  # type: ignore[list-item]
                       on_bound=bounded.append)
    watch.check(100.0)
    thread.running_since = 100.0
    for now in (101.0, 104.0):
        watch.check(now)
    assert said == []
    for now in (105.0, 110.0, 119.0):
        watch.check(now)
    assert said == ["the store store.sqlite has not answered for 5 s: heartbeats, rate limits and this view go on, "
                    "and what is to be stored waits for it; past 20 s (RUNNER_STORE_WAIT) the run stops sending"]
    for now in (120.0, 125.0):
        watch.check(now)
    assert bounded == [20.0]
    thread.running_since = 126.0  # the stalled call ended; another one started
    watch.check(126.5)
    assert said[1:] == ["the store store.sqlite answers again, after 26 s"]
    thread.running_since = None
    watch.check(200.0)
    assert len(said) == 2


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_second_connection_is_the_same_store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    where = str(tmp_path / "store.sqlite") if kind == "sqlite" else request.getfixturevalue("pg_url")
    store = open_store(where)
    other = store.reopen()
    try:
        run_id = store.create_run("job", "job.yaml", "{}", "fp", 1)
        started = time.monotonic()
        assert other.get_run(run_id)["id"] == run_id
        assert time.monotonic() - started < 5
    finally:
        other.close()
        store.close()
