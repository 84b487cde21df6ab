"""Group commit of the ledger's reservations (runner/engine/ledger_writes.py): the reservations asked at about the
same moment share one transaction, and every request is still sent only once its reservation has committed
(ARCHITECTURE.md invariant 3): a second connection to the store, which sees only committed rows, finds a ledger row
for every request sent so far at the moment each is sent."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from runner.engine.ledger_writes import LedgerWrites
from runner.engine.run import execute
from runner.spec.job import load_job
from runner.store import ReserveAsk, open_store
from runner.store.fencing import Fence, Fenced
from runner.store.offloop import LoopStore, StoreThread
from tests.helpers import write_job, write_rows

PRICED = "prices: {'fake:m1': {input: 1.0, output: 2.0}}"


async def test_a_priced_run_reserves_in_groups_and_sends_nothing_before_its_reservation_committed(
        tmp_path: Path, fake_provider: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = 40
    job = load_job(write_job(tmp_path / "job.yaml", write_rows(tmp_path / "rows.jsonl", rows), models=["fake:m1"],
                             extra=PRICED))
    store = open_store(tmp_path / "s.sqlite")
    other = open_store(tmp_path / "s.sqlite")  # another connection: committed rows only
    real, groups = store.reserve_all, []

    def recorded(asks: list[ReserveAsk]) -> Any:
        groups.append(len(asks))
        return real(asks)

    monkeypatch.setattr(store, "reserve_all", recorded)
    short: list[tuple[int, int]] = []

    def behaviour(model: str, messages: Any, params: Any, calls: int) -> None:
        committed = other.row("SELECT count(*) FROM ledger")[0]
        if committed < calls:
            short.append((calls, committed))

    fake_provider.behaviour = behaviour
    try:
        outcome = await execute(job, store)
    finally:
        other.close()
    assert outcome.status == "completed"
    assert len(fake_provider.history) == rows
    assert short == [], f"requests sent before their reservation committed (call, committed rows): {short}"
    assert sum(groups) == rows, groups
    assert max(groups) > 1 and len(groups) < rows, f"no reservations shared a transaction: {groups}"


async def test_an_asker_cancelled_while_its_group_is_written_has_its_reservation_given_back(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s.sqlite")
    run_id = store.create_run("job", "job.yaml", "{}", "fp", 10)
    thread = StoreThread("test-store")
    try:
        ledger = LedgerWrites(LoopStore(store, thread))
        kept = asyncio.ensure_future(ledger.reserve(ReserveAsk(run_id, "mc", "m", "k1", 0.5)))
        dropped = asyncio.ensure_future(ledger.reserve(ReserveAsk(run_id, "mc", "m", "k2", 0.5)))
        await asyncio.sleep(0)  # both asked: the group's transaction is under way in the store's thread
        dropped.cancel()
        ledger_id, blocked, _ = await kept
        assert blocked is None and ledger.groups == 1 and ledger.written == 2
        await asyncio.wrap_future(thread.submit(lambda: None))  # after the posted release
        assert [(row["id"], row["key"]) for row in store.ledger(run_id)] == [(ledger_id, "k1")]
    finally:
        thread.close()
        store.close()


async def test_a_fenced_ask_raises_for_its_asker_only(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s.sqlite")
    run_id = store.create_run("job", "job.yaml", "{}", "fp", 10)
    store.join_run(run_id, "w1", "host", 1, 30)
    store.lease_chunks(run_id, "mc", [0], "w1", 30)
    ledger = LedgerWrites(LoopStore(store))
    fenced, fine = await asyncio.gather(
        ledger.reserve(ReserveAsk(run_id, "mc", "m", "k1", 0.5, fence=Fence("w1", run_id, "mc", 0, 9))),
        ledger.reserve(ReserveAsk(run_id, "mc", "m", "k2", 0.5, fence=Fence("w1", run_id, "mc", 0, 1))),
        return_exceptions=True)
    assert isinstance(fenced, Fenced) and isinstance(fine, tuple) and fine[0] is not None
    assert ledger.groups == 1
    store.close()
