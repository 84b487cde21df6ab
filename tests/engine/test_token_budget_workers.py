"""Token budgets shared by the processes on one run (ARCHITECTURE.md invariant 3), as a user runs them: real `runner`
processes, the simulated server in its own process counting what it answered, one shared store (SQLite file or
PostgreSQL, as `--db` names them). Each request's worst-case tokens are reserved in the store's ledger, which checks
them against what every process spent and reserved, so a token budget holds across workers as a USD budget does:
what is spent (charged, and possibly billed at its worst case) never exceeds the budget.

The model is free (`sim:` unpriced): only the token budget limits the run, and every charge is one of tokens alone."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from runner.engine.reserver import input_tokens
from runner.plan.stage import StagePlan
from runner.providers.tokens import bound_call_tokens
from runner.spec.job import load_job
from runner.store import open_store
from tests.engine.test_workers import _env, _job, _wait, _wait_for
from tests.helpers import done_tasks, printed_run_id, runner_cmd, sim_stats, start_runner


def _worst_tokens(job: Path) -> int:
    """The largest worst case in tokens of the job's requests (input tokens bound, plus max_tokens), as the reserver
    computes it."""
    loaded = load_job(job)
    most = 0
    for task in StagePlan(loaded, loaded.stages[0]):
        call = task.call
        bound = bound_call_tokens(call.provider, call.model_name, call.messages, call.pairs, counted=input_tokens(task))
        most = max(most, bound + int(call.params["max_tokens"]))
    return most


def _spent(store: Any, run_id: str) -> tuple[int, int, int]:
    """(tokens the ledger holds as spent: charges and possibly billed; tokens the run's sent tasks used; the store's
    budget sum for the run, which its reservations are checked against)."""
    ledger = sum(row["tokens"] for row in store.ledger(run_id) if row["kind"] in ("charge", "possibly_billed"))
    tasks = sum(t["input_tokens"] + t["output_tokens"] for t in store.tasks(run_id) if not t["cache_hit"])
    (summed,) = store.row("SELECT tokens FROM budget_use WHERE run_id = ? AND scope = 'run'", (run_id,))
    return ledger, tasks, int(summed)


@pytest.mark.slow  # three worker processes at once: 4 to 5 s
@pytest.mark.parametrize("sim_server", [0.03], indirect=True)
def test_one_token_budget_holds_across_three_workers(tmp_path, sim_server, db, monkeypatch):
    _env(monkeypatch)
    # each request's worst case is about 65 tokens (about 60 input, 5 output): 3,000 tokens pay for about 46
    budget = 3000
    job = _job(tmp_path, sim_server, rows=300, extra=f"budget: {{tokens: {budget}}}", concurrency=8)
    worst = _worst_tokens(job)
    owner = start_runner(["submit", str(job), "--db", db, "--allow-partial"], tmp_path)
    run_id = printed_run_id(owner)
    workers = [start_runner(["work", run_id, "--db", db], tmp_path) for _ in range(2)]
    outcomes = [_wait(proc) for proc in [owner, *workers]]
    codes = [code for code, _, _ in outcomes]
    assert codes[0] == 3 and set(codes) <= {0, 3}, [err[-2000:] for _, _, err in outcomes]

    store = open_store(db)
    ledger, tasks, summed = _spent(store, run_id)
    assert not store.ledger(run_id, kind="reserved")
    assert ledger == tasks == summed, "the ledger's tokens are the tokens the sent tasks used"
    # never over the budget, and stopped only when the next request's worst case no longer fitted
    assert budget - worst < ledger <= budget, (ledger, budget, worst)
    assert {row["amount"] for row in store.ledger(run_id)} == {0.0}
    done = len(store.tasks(run_id, status="done"))
    assert budget // worst <= done < 300
    store.close()
    assert sum(sim_stats(sim_server)["completed_by_digest"].values()) == done


@pytest.mark.slow  # three processes of one named run at once: 4 to 5 s
@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
@pytest.mark.parametrize("sim_server", [0.03], indirect=True)
def test_a_named_run_with_a_token_budget_is_shared_by_its_processes(tmp_path, sim_server, db, monkeypatch):
    """`submit --run-id` started three times: the first creates the run, the others join it (a token budget was
    refused for a named run when each process counted tokens on its own); the budget holds across them."""
    _env(monkeypatch)
    budget = 2000
    job = _job(tmp_path, sim_server, rows=200, extra=f"budget: {{tokens: {budget}}}", concurrency=8)
    worst = _worst_tokens(job)
    procs = [start_runner(["submit", str(job), "--db", db, "--run-id", "tokens-1", "--allow-partial", "--no-check"],
                    tmp_path) for _ in range(3)]
    outcomes = [_wait(proc) for proc in procs]
    for code, _, err in outcomes:
        assert code in (0, 3), err[-2000:]
        assert "Traceback" not in err and "token budget" not in err
    assert 3 in {code for code, _, _ in outcomes}
    joined = sum("joining job testjob as a worker" in out for _, out, _ in outcomes)
    assert joined == 2, [out for _, out, _ in outcomes]

    store = open_store(db)
    assert [run["id"] for run in store.list_runs()] == ["tokens-1"]
    assert len(store.workers("tokens-1")) == 3
    ledger, tasks, summed = _spent(store, "tokens-1")
    assert ledger == tasks == summed
    assert budget - worst < ledger <= budget, (ledger, budget, worst)
    assert store.get_run("tokens-1")["status"] == "budget_exhausted"
    store.close()


def _reserved_by(db: str, pid: int) -> dict[int, int]:
    """The open reservations the process ``pid`` holds in the ledger: {ledger id: tokens}."""
    store = open_store(db)
    try:
        return {row["id"]: row["tokens"] for row in store.ledger(kind="reserved")
                if (row["worker"] or "").split(":")[-2:-1] == [str(pid)]}
    finally:
        store.close()


@pytest.mark.slow  # two worker processes killed, then a resume: 15 to 17 s
@pytest.mark.parametrize("sim_server", [0.05], indirect=True)
def test_a_killed_workers_token_reservations_stay_possibly_billed_and_count(tmp_path, sim_server, db, monkeypatch):
    """kill -9 of a worker holding token reservations (then of the run's other process, so nothing is left running):
    each reservation keeps its worst-case tokens in the ledger. `runner resume` settles each one whose answer is in
    the memo and keeps the others as possibly billed at their worst case; they count against the token budget as
    spent, so what the resumed run spends, with them, stays within it."""
    _env(monkeypatch)
    # about 250 of the 600 requests fit: the kill comes after 40, and the resume spends the rest of the budget
    budget = 16000
    job = _job(tmp_path, sim_server, rows=600, concurrency=2, extra=f"budget: {{tokens: {budget}}}")
    worst = _worst_tokens(job)
    owner = start_runner(["submit", str(job), "--db", db, "--allow-partial"], tmp_path)
    run_id = printed_run_id(owner)
    victim = start_runner(["work", run_id, "--db", db], tmp_path)
    _wait_for(lambda: done_tasks(db) >= 40 and len(_reserved_by(db, victim.pid)) > 0, 60,
              "40 finished tasks and the worker holding reservations")
    victim.send_signal(signal.SIGKILL)
    owner.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    owner.wait(timeout=10)

    store = open_store(db)
    open_reservations = {row["id"]: row["tokens"] for row in store.ledger(run_id, kind="reserved")}
    held = _reserved_by(db, victim.pid)
    assert held and set(held) <= set(open_reservations)
    assert all(0 < tokens <= worst for tokens in open_reservations.values())
    store.close()

    resumed = subprocess.run(runner_cmd("resume", run_id, "--db", db), cwd=tmp_path, capture_output=True, text=True,
                             timeout=180)
    assert resumed.returncode == 3, resumed.stderr[-2000:]  # the token budget ends the resumed run
    assert "possibly billed at their worst case" in resumed.stdout + resumed.stderr

    store = open_store(db)
    assert not store.ledger(run_id, kind="reserved")
    after = {row["id"]: (row["kind"], row["tokens"]) for row in store.ledger(run_id) if row["id"] in open_reservations}
    memo = store.lookup_many([row["key"] for row in store.ledger(run_id) if row["id"] in open_reservations])
    for ledger_id, tokens in open_reservations.items():
        kind, kept = after[ledger_id]
        assert kind in ("charge", "possibly_billed")
        if kind == "possibly_billed":
            assert kept == tokens, "a possibly billed reservation keeps its worst case"
    settled = [ledger_id for ledger_id, (kind, _) in after.items() if kind == "charge"]
    for ledger_id in settled:  # settled from the memo: the answer's own tokens
        key = next(row["key"] for row in store.ledger(run_id) if row["id"] == ledger_id)
        assert after[ledger_id][1] == memo[key].input_tokens + memo[key].output_tokens
    possibly = sum(row["tokens"] for row in store.ledger(run_id, kind="possibly_billed"))
    assert possibly > 0
    ledger, tasks, summed = _spent(store, run_id)
    assert ledger == summed
    assert [n for _, _, _, n in store.spent(run_id)] == [tasks + possibly]
    assert budget - worst < ledger <= budget, (ledger, budget, worst)
    store.close()
