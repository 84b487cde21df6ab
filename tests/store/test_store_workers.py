"""The store's operations for several processes on one run, on SQLite and on PostgreSQL: leases taken a chunk of
leases at a time and finished one by one, a leaving worker's open reservations, budget sums (USD and tokens) kept by
the ledger's triggers, and a reservation refused by the store while another process's reservations are in flight."""

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
    charge = (run_id, "mc", "sim:m", "k1", "charge", 0.1, "2026-01-01T00:00:00", 40, None, None)
    store.write_batch([], [], [charge], [(first,)])
    second, blocked, _ = store.reserve_within(run_id, "mc", "sim:m", "k2", 0.3, limits, "w2")
    assert second is not None and blocked is None
    # the run's budget counts the other stage too; nothing in flight there, so the answer says 0 in flight
    got = store.reserve_within(run_id, "other", "sim:m", "k3", 0.7, {"run": 1.0}, "w2")
    assert got == (None, "run", 1)
    store.release(second)
    assert store.reserve_within(run_id, "other", "sim:m", "k3", 0.95, {"run": 1.0}, "w2") == (None, "run", 0)
    assert store.reserve_within(run_id, "other", "sim:m", "k3", 0.9, {"run": 1.0}, "w2")[0] is not None


def _tokens(store: Any, run_id: str) -> dict[str, tuple[int, int]]:
    """Per budget scope, (tokens, reservations in flight) that the ledger's triggers keep in budget_use."""
    return {scope: (int(tokens), int(inflight)) for scope, tokens, inflight in store.rows(
        "SELECT scope, tokens, inflight FROM budget_use WHERE run_id = ?", (run_id,))}


def test_token_sums_follow_the_ledger_and_bound_every_process(store):
    """A token budget as the store keeps it for every process: a reservation's worst-case tokens, then the charge's
    actual tokens, then a possibly billed reservation's worst case, each counted against the limits in one
    transaction, as USD are."""
    run_id = _run(store)
    limits = {"run": 1000, "model:sim:m": 600}
    first, blocked, _ = store.reserve_within(run_id, "mc", "sim:m", "k1", 0.0, {}, "w1", tokens=500,
                                             token_limits=limits)
    assert first is not None and blocked is None
    assert _tokens(store, run_id) == {"run": (500, 1), "stage:mc": (500, 1), "model:sim:m": (500, 1)}
    # another process: the model's 600 tokens have 100 left while the first reservation is in flight
    assert store.reserve_within(run_id, "mc", "sim:m", "k2", 0.0, {}, "w2", tokens=200,
                                token_limits=limits) == (None, "model:sim:m", 1)
    # a USD limit and a token limit together: either one refuses
    assert store.reserve_within(run_id, "mc", "sim:m", "k2", 0.5, {"run": 0.4}, "w2", tokens=1,
                                token_limits=limits)[1] == "run"
    # settled to what the answer used (a charge that cost nothing still carries its tokens), room comes back
    task = (run_id, "mc", "i1", "sim:m", "r1", "{}", "k1", "done", 0, 1, None, None, 100, 20, 0.0, 0.1, None, 1, "{}",
            0, 0.0, None, 0.0)
    charge = (run_id, "mc", "sim:m", "k1", "charge", 0.0, "2026-01-01T00:00:00", 120, None, None)
    store.write_batch([task], [], [charge], [(first,)])
    assert _tokens(store, run_id)["run"] == (120, 0)
    second, blocked, _ = store.reserve_within(run_id, "mc", "sim:m", "k2", 0.0, {}, "w2", tokens=480,
                                              token_limits=limits)
    assert second is not None and blocked is None
    assert store.reserve_within(run_id, "mc", "sim:m", "k3", 0.0, {}, "w1", tokens=1,
                                token_limits=limits) == (None, "model:sim:m", 1)
    # w2 leaves with its reservation open: possibly billed, still counted at its worst case, nothing in flight
    store.leave_run("w2")
    assert _tokens(store, run_id)["model:sim:m"] == (600, 0)
    assert store.reserve_within(run_id, "mc", "sim:m", "k3", 0.0, {}, "w1", tokens=1,
                                token_limits=limits) == (None, "model:sim:m", 0)
    # a resume's budgets count the same: the tasks' tokens and the possibly billed worst case
    assert [(stage, model, n) for stage, model, _, n in store.spent(run_id)] == [("mc", "sim:m", 600)]
    # a plain reservation (no limits to check) records its worst-case tokens too
    other = store.reserve(run_id, "other", "sim:n", "k4", 0.1, "w1", tokens=70)
    assert {row["id"]: row["tokens"] for row in store.ledger(run_id)}[other] == 70
    assert _tokens(store, run_id)["run"] == (670, 1)


def test_a_resume_settles_a_reservation_to_its_answers_tokens(store):
    """After a crash, a reservation whose answer is in the memo becomes a charge of the memo's cost and tokens; one
    whose answer is lost stays at its worst case, as possibly billed."""
    run_id = _run(store)
    answered = store.reserve(run_id, "mc", "sim:m", "k1", 0.5, "w1", tokens=900)
    lost = store.reserve(run_id, "mc", "sim:m", "k2", 0.5, "w1", tokens=800)
    store.write_batch([], [("k1", "sim", "m", "{}", "A", "{}", "stop", 30, 4, 0, 0.125, 0.1, "x", None, 0, None,
                            None)], [])
    assert store.resolve_reservations(run_id) == (1, 1)
    rows = {row["id"]: (row["kind"], row["amount"], row["tokens"]) for row in store.ledger(run_id)}
    assert rows == {answered: ("charge", 0.125, 34), lost: ("possibly_billed", 0.5, 800)}
    assert _tokens(store, run_id)["run"] == (834, 0)


def test_writes_of_a_worker_that_lost_its_lease_are_refused(store):
    """Fencing: a lease taken over gets a new token; the old holder's task rows, charges, reservations and lease
    completion are refused, its answer still goes to the memo, and its reservation becomes possibly billed."""
    from runner.store.base import Finished
    from runner.store.fencing import Fence, Fenced

    run_id = _run(store)
    store.join_run(run_id, "w1", "host", 1, 30)
    store.join_run(run_id, "w2", "host", 2, 30)
    assert store.lease_chunks(run_id, "mc", [0], "w1", -1) == {0: ("new", 1)}  # expired at once: w1 stalled
    old = Fence("w1", run_id, "mc", 0, 1)
    reserved = store.reserve_within(run_id, "mc", "sim:m", "k1", 0.5, {"run": 10.0}, "w1", fence=old)[0]
    assert store.take_expired_lease(run_id, "mc", "w2", 30) == (0, 2)
    assert store.heartbeat("w1", 30) == []  # still live, but the lease is w2's now
    task = (run_id, "mc", "i1", "sim:m", "r1", "{}", "k1", "done", 0, 1, None, None, 1, 1, 0.25, 0.1, None, 1, "{}",
            0, 0.0, None, 0.0)
    response = ("k1", "sim", "m", "{}", "A", "{}", "stop", 1, 1, 0, 0.25, 0.1, "x", None, 0, None, None)
    charge = (run_id, "mc", "sim:m", "k1", "charge", 0.25, "2026-01-01T00:00:00", 2, None, None)
    late = Finished(task=task, response=response, ledger=charge, stage="mc", release_id=reserved, fence=old)
    assert store.write_finished([late]) == []
    assert store.tasks(run_id) == [] and store.lookup("k1") is not None
    assert [(row["kind"], row["amount"]) for row in store.ledger(run_id)] == [("possibly_billed", 0.5)]
    with pytest.raises(Fenced):
        store.reserve_within(run_id, "mc", "sim:m", "k2", 0.5, {"run": 10.0}, "w1", fence=old)
    store.finish_chunks(run_id, "mc", "w1", [0], [1])
    assert store.open_chunks(run_id, "mc") == 1
    # the new holder's writes go through, and its lease completes
    new = Fence("w2", run_id, "mc", 0, 2)
    assert store.write_finished([Finished(task=task, stage="mc", fence=new)]) != []
    assert [t["status"] for t in store.tasks(run_id)] == ["done"]
    store.finish_chunks(run_id, "mc", "w2", [0], [2])
    assert store.open_chunks(run_id, "mc") == 0
    # a worker declared dead hears it at its next heartbeat and can write nothing
    store.resolve_worker(run_id, "w2")
    assert store.heartbeat("w2", 30) is None
    assert store.write_finished([Finished(task=task, stage="mc", fence=new)]) == []


def test_a_worker_judges_others_heartbeats_only_once_its_own_are_steady(store):
    """After a stall of the store itself every lease looks expired: a worker whose own heartbeats just came back (or
    whose own last heartbeat is old, as for a statement sent before the stall and run after it) takes no lease over
    and declares nobody dead; once its heartbeats have come steadily for a lease, it does."""
    import time

    run_id = _run(store)
    store.join_run(run_id, "w1", "host", 1, 30)
    store.join_run(run_id, "w2", "host", 2, 30)
    assert store.lease_chunks(run_id, "mc", [0, 1], "w1", 30) == {0: ("new", 1), 1: ("new", 1)}
    # a stall of 40 s: everyone's heartbeats and leases ran out meanwhile
    now = time.time()
    store.execute("UPDATE workers SET seen = ?", (now - 10,))
    store.execute("UPDATE leases SET expires = ?", (now - 10,))
    assert store.heartbeat("w2", 30) == []  # back first, after a gap: steady from now
    assert store.take_expired_lease(run_id, "mc", "w2", 30, steady=30) is None
    assert store.lease_chunks(run_id, "mc", [0, 2], "w2", 30, steady=30) == {0: None, 2: ("new", 1)}
    assert store.dead_workers(run_id, "w2", 30) == []
    assert store.dead_workers(run_id) == ["w1"]  # without an observer, the expiry alone
    # the other worker beats too: never declared dead, it keeps its leases with their tokens
    assert store.heartbeat("w1", 30) == [("mc", 0, 1), ("mc", 1, 1)]
    # a lease later, w1 is really gone: w2, steady, declares it and takes its leases over
    store.execute("UPDATE workers SET steady = ? WHERE id = 'w2'", (now - 31,))
    store.execute("UPDATE workers SET seen = ? WHERE id = 'w1'", (now - 1,))
    store.execute("UPDATE leases SET expires = ? WHERE worker = 'w1'", (now - 1,))
    assert store.dead_workers(run_id, "w2", 30) == ["w1"]
    assert store.take_expired_lease(run_id, "mc", "w2", 30, steady=30) == (0, 2)
    # w2's own last heartbeat 20 s old on a 30 s lease (a statement that waited out a stall): it judges nobody
    store.execute("UPDATE workers SET seen = ? WHERE id = 'w2'", (time.time() + 10,))
    assert store.take_expired_lease(run_id, "mc", "w2", 30, steady=30) is None
    assert store.lease_chunks(run_id, "mc", [1], "w2", 30, steady=30) == {1: None}
    assert store.dead_workers(run_id, "w2", 30) == []
    # a heartbeat that comes within half a lease keeps the steadiness it had
    store.execute("UPDATE workers SET seen = ?, steady = ? WHERE id = 'w2'", (time.time() + 25, now - 31))
    store.heartbeat("w2", 30)
    assert store.take_expired_lease(run_id, "mc", "w2", 30, steady=30) == (1, 2)


def test_reservations_in_one_transaction_answer_as_one_by_one_and_a_fenced_one_alone_is_refused(store):
    """``reserve_all`` (the engine's group commit): each ask answered in order as ``reserve_within`` would answer
    it, later ones seeing the earlier ones' reservations; a lease that no longer holds refuses its own ask only."""
    from runner.store import ReserveAsk
    from runner.store.fencing import Fence, Fenced

    run_id = _run(store)
    store.join_run(run_id, "w1", "host", 1, 30)
    assert store.lease_chunks(run_id, "mc", [0, 1], "w1", 30) == {0: ("new", 1), 1: ("new", 1)}
    held = Fence("w1", run_id, "mc", 0, 1)
    lost = Fence("w1", run_id, "mc", 1, 7)  # a token the lease does not have: taken over
    limits = {"run": 1.0}
    answers = store.reserve_all([
        ReserveAsk(run_id, "mc", "sim:m", "k1", 0.4, 10, "w1", held, limits),
        ReserveAsk(run_id, "mc", "sim:m", "k2", 0.4, 10, "w1", lost, limits),
        ReserveAsk(run_id, "mc", "sim:m", "k3", 0.4, 10, "w1", held, limits),
        ReserveAsk(run_id, "mc", "sim:m", "k4", 0.4, 10, "w1", held, limits),  # 1.2 > 1.0 with k1 and k3
        ReserveAsk(run_id, "mc", "sim:m", "k5", 0.1, 10, "w1"),  # no limits: written
    ])
    assert isinstance(answers[1], Fenced)
    assert answers[3] == (None, "run", 2)
    ids = [answers[i][0] for i in (0, 2, 4)]
    assert all(isinstance(i, int) for i in ids) and len(set(ids)) == 3
    assert sorted((row["key"], row["kind"], row["amount"]) for row in store.ledger(run_id)) == [
        ("k1", "reserved", 0.4), ("k3", "reserved", 0.4), ("k5", "reserved", 0.1)]
    assert store.reserve_all([]) == []
