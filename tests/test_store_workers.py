"""The store's operations for several processes on one run, on SQLite and on PostgreSQL: leases taken a chunk of
leases at a time and finished one by one, a leaving worker's open reservations, budget sums kept by the ledger's
triggers, and a reservation refused by the store while another process's reservations are in flight."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runner.store import open_store


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path: Path) -> Any:
    url = str(tmp_path / "store.sqlite") if request.param == "sqlite" else request.getfixturevalue("pg_url")
    s = open_store(url)
    yield s
    s.close()


def _run(store: Any) -> str:
    return store.create_run("job", "job.yaml", "{}", "fp", 10)


def test_a_chunk_of_leases_is_taken_at_once_and_finished_lease_by_lease(store):
    run_id = _run(store)
    assert store.claim_chunks(run_id, "mc", [0, 1, 2, 3], "w1", 30) == dict.fromkeys([0, 1, 2, 3], "new")
    assert store.claim_chunks(run_id, "mc", [2, 3, 4], "w2", 30) == {2: None, 3: None, 4: "new"}
    store.finish_chunks(run_id, "mc", "w1", [1, 3])
    assert store.open_chunks(run_id, "mc") == 3  # 0 and 2 of w1, 4 of w2
    # a done lease is never taken again, even once its worker's lease time is over
    store.claim_chunks(run_id, "mc", [0], "w1", -1)
    assert store.take_expired_chunk(run_id, "mc", "w2", 30) == 0
    assert store.take_expired_chunk(run_id, "mc", "w2", 30) is None
    store.finish_chunks(run_id, "mc", "w2")
    assert store.open_chunks(run_id, "mc") == 1  # w1's lease 2


def test_a_leaving_worker_keeps_its_open_reservations_as_possibly_billed(store):
    run_id = _run(store)
    store.join_run(run_id, "w1", "host", 1, 30)
    abandoned = store.reserve(run_id, "mc", "sim:m", "k1", 0.5, worker="w1")
    other = store.reserve(run_id, "mc", "sim:m", "k2", 0.25, worker="w2")
    store.leave_run("w1")
    kinds = {row["id"]: row["kind"] for row in store.ledger(run_id)}
    assert kinds == {abandoned: "possibly_billed", other: "reserved"}
    assert [w["state"] for w in store.workers(run_id)] == ["left"]


def test_budget_sums_follow_the_ledger_and_bound_every_process(store):
    run_id = _run(store)
    limits = {"run": 1.0, "stage:mc": 0.7}
    first, blocked, _ = store.reserve_within(run_id, "mc", "sim:m", "k1", 0.5, limits, "w1")
    assert first is not None and blocked is None
    # another process: the stage's 0.7 has 0.2 left while the first reservation is in flight
    assert store.reserve_within(run_id, "mc", "sim:m", "k2", 0.3, limits, "w2") == (None, "stage:mc", 1)
    # settled at its actual cost (the writer's commit: a charge and the reservation removed), room comes back
    charge = (run_id, "mc", "sim:m", "k1", "charge", 0.1, "2026-01-01T00:00:00")
    store.write_batch([], [], [charge], [(first,)])
    second, blocked, _ = store.reserve_within(run_id, "mc", "sim:m", "k2", 0.3, limits, "w2")
    assert second is not None and blocked is None
    # the run's budget counts the other stage too; nothing in flight there, so the answer says 0 in flight
    got = store.reserve_within(run_id, "other", "sim:m", "k3", 0.7, {"run": 1.0}, "w2")
    assert got == (None, "run", 1)
    store.release(second)
    assert store.reserve_within(run_id, "other", "sim:m", "k3", 0.95, {"run": 1.0}, "w2") == (None, "run", 0)
    assert store.reserve_within(run_id, "other", "sim:m", "k3", 0.9, {"run": 1.0}, "w2")[0] is not None
