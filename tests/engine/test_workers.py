"""Several processes on one run (`runner work`), and two runs of one job at once, as a user runs them: real
`runner` processes, the simulated server in its own process counting what it was sent, one shared store.

Each test runs on the embedded SQLite store and on a PostgreSQL server (devservers/postgres.py), as `--db` names them.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from devservers.faults import stop, stop_between_writes
from runner.engine.workers import MAX_WIDEN
from runner.store import open_store
from runner.store.sqlite_lock import ATTEMPT_S, Holder, write_lock_holder
from tests.helpers import done_tasks, printed_run_id, runner_cmd, sim_stats, start_runner, write_job, write_rows

#: short leases, so a killed worker's chunks are taken over within seconds (long enough that a process busy
#: importing a provider's SDK under a loaded machine still beats in time)
ENV_TTL = "8"
PRICES = "prices: {sim:gpt-sim: {input: 1000, output: 2000}}"


def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNNER_LEASE_TTL", ENV_TTL)


def _job(tmp_path: Path, url: str, rows: int, *, concurrency: int = 4, extra: str = "", name: str = "testjob"
         ) -> Path:
    dataset = write_rows(tmp_path / "rows.jsonl", rows)
    providers = f"providers: {{sim: {{base_url: {json.dumps(url)}, concurrency: {concurrency}}}}}"
    return write_job(tmp_path / f"{name}.yaml", dataset, models=["sim:gpt-sim"], extra=f"{providers}\n{extra}",
                     name=name)


def _wait(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.slow  # several worker processes at once: 7 s
@pytest.mark.parametrize("sim_server", [0.03], indirect=True)
def test_workers_split_a_run_and_send_each_request_once(tmp_path, sim_server, db, monkeypatch):
    _env(monkeypatch)
    # the first process leases 256 tasks while alone: the others join while it sends them, 2 at a time
    job = _job(tmp_path, sim_server, rows=600, concurrency=2)
    owner = start_runner(["submit", str(job), "--db", db], tmp_path)
    run_id = printed_run_id(owner)
    workers = [start_runner(["work", run_id, "--db", db], tmp_path) for _ in range(2)]
    outcomes = [_wait(proc) for proc in [owner, *workers]]
    for code, out, err in outcomes:
        assert code == 0, err
        assert f"run {run_id}: completed" in out

    completed = sim_stats(sim_server)["completed_by_digest"]
    assert len(completed) == 600 and set(completed.values()) == {1}, "a request was sent twice"
    store = open_store(db)
    tasks = store.tasks(run_id)
    assert len(tasks) == 600 and {t["status"] for t in tasks} == {"done"}
    assert sum(1 for t in tasks if not t["cache_hit"]) == 600
    joined = store.workers(run_id)
    assert len(joined) == 3 and {w["state"] for w in joined} == {"left"}
    assert store.get_run(run_id)["status"] == "completed"
    store.close()
    # the work was shared: each joining worker sent part of it and left the rest to the others
    for _, out, _ in outcomes[1:]:
        sent = int(out.split("this worker: ", 1)[1].split(" sent", 1)[0])
        assert 0 < sent < 600, out
    results = tmp_path / "results" / "testjob" / run_id / "mc.jsonl"
    ids = [json.loads(line)["id"] for line in results.read_text().splitlines()]
    assert sorted(ids, key=int) == [str(i) for i in range(1, 601)], "every result exactly once in the file"


@pytest.mark.slow  # several worker processes at once: 3 to 4 s
@pytest.mark.parametrize("sim_server", [0.03], indirect=True)
def test_two_submits_of_one_job_at_once_send_it_once(tmp_path, sim_server, db, monkeypatch):
    _env(monkeypatch)
    job = _job(tmp_path, sim_server, rows=200, extra=PRICES)
    first, second = (start_runner(["submit", str(job), "--db", db], tmp_path) for _ in range(2))
    for code, out, err in (_wait(first), _wait(second)):
        assert code == 0, err
        assert "completed" in out

    completed = sim_stats(sim_server)["completed_by_digest"]
    assert len(completed) == 200 and set(completed.values()) == {1}, "the second run sent requests again"
    store = open_store(db)
    runs = store.list_runs()
    assert len(runs) == 2
    for run in runs:
        assert len(store.tasks(run["id"], status="done")) == 200
    # each request was charged once, to whichever run sent it; the other run's task is a cache hit
    charges = Counter(row["key"] for row in store.ledger(kind="charge"))
    assert len(charges) == 200 and set(charges.values()) == {1}
    hits = sum(t["cache_hit"] for t in store.tasks())
    assert hits == 200
    store.close()


@pytest.mark.slow
@pytest.mark.parametrize("sim_server", [0.05], indirect=True)
def test_a_killed_worker_loses_nothing_and_is_billed_once(tmp_path, sim_server, db, monkeypatch):
    _env(monkeypatch)
    # about 7 s for the owner alone: time for the victim to join and lease its part
    job = _job(tmp_path, sim_server, rows=300, concurrency=2, extra=f"{PRICES}\nbudget: {{usd: 1000000}}")
    owner = start_runner(["submit", str(job), "--db", db], tmp_path)
    run_id = printed_run_id(owner)
    victim = start_runner(["work", run_id, "--db", db], tmp_path)
    # killed once it works on the run (a loaded machine may start it after the owner finished 60 tasks)
    _wait_for(lambda: done_tasks(db) >= 60 and _victim_leases(db, victim.pid) > 0, 60,
              "60 finished tasks and the victim holding a lease")
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=10)
    code, out, err = _wait(owner)
    assert code == 0, err
    assert f"run {run_id}: completed" in out

    store = open_store(db)
    tasks = store.tasks(run_id)
    assert len(tasks) == 300 and {t["status"] for t in tasks} == {"done"}, "a task was lost"
    states = {w["id"]: w["state"] for w in store.workers(run_id)}
    assert sorted(states.values()) == ["dead", "left"]
    charges = Counter(row["key"] for row in store.ledger(run_id, kind="charge"))
    assert len(charges) == 300 and set(charges.values()) == {1}, "a request was charged twice"
    # what the killed worker had in flight is kept as possibly billed (its answers were lost), and only that
    dead = next(worker for worker, state in states.items() if state == "dead")
    possibly = store.ledger(run_id, kind="possibly_billed")
    assert {row["worker"] for row in possibly} <= {dead}
    assert not store.ledger(run_id, kind="reserved")
    # Sent twice: only what the killed worker had in flight, each kept as possibly billed (its answer is lost).
    completed = sim_stats(sim_server)["completed_by_digest"]
    assert len(completed) == 300
    twice = sum(n - 1 for n in completed.values())
    assert twice <= len(possibly)
    store.close()
    results = tmp_path / "results" / "testjob" / run_id / "mc.jsonl"
    ids = [json.loads(line)["id"] for line in results.read_text().splitlines()]
    assert sorted(ids, key=int) == [str(i) for i in range(1, 301)]


@pytest.mark.slow  # several worker processes at once: 3 s
@pytest.mark.parametrize("sim_server", [0.03], indirect=True)
def test_one_budget_holds_across_workers(tmp_path, sim_server, db, monkeypatch):
    _env(monkeypatch)
    # each request's worst case is about $0.08 (~60 input tokens at $1000/M, 5 output at $2000/M): $3 pays ~40
    job = _job(tmp_path, sim_server, rows=300, extra=f"{PRICES}\nbudget: {{usd: 3}}", concurrency=8)
    owner = start_runner(["submit", str(job), "--db", db, "--allow-partial"], tmp_path)
    run_id = printed_run_id(owner)
    workers = [start_runner(["work", run_id, "--db", db], tmp_path) for _ in range(2)]
    codes = [_wait(proc)[0] for proc in [owner, *workers]]
    assert codes[0] == 3 and set(codes) <= {0, 3}

    store = open_store(db)
    spent = sum(row["amount"] for row in store.ledger(run_id) if row["kind"] in ("charge", "possibly_billed"))
    assert 0 < spent <= 3.0 + 1e-9
    assert not store.ledger(run_id, kind="reserved")
    done = len(store.tasks(run_id, status="done"))
    assert 10 < done < 300
    store.close()
    assert sum(sim_stats(sim_server)["completed_by_digest"].values()) == done


def test_work_refuses_a_pipeline_job(tmp_path, db):
    dataset = write_rows(tmp_path / "rows.jsonl", 3)
    job = tmp_path / "pipe.yaml"
    job.write_text(
        "name: pipe\nmodels: [sim:gpt-sim]\nparams: {temperature: 0, max_tokens: 5}\nstages:\n"
        f"  - name: ask\n    dataset: {{path: {json.dumps(str(dataset))}}}\n    prompt: {{user: hi}}\n"
        "  - name: keep\n    from: ask\n    filter: {keep: 'True'}\n",
        encoding="utf-8")
    store = open_store(db)
    from runner.spec.job import load_job

    loaded = load_job(job)
    run_id = store.create_run(loaded.name, str(job), loaded.model_dump_json(), loaded.fingerprint(), 3)
    store.close()
    proc = subprocess.run(runner_cmd("work", run_id, "--db", db), cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and proc.stderr.startswith("Error: job pipe is a pipeline")


def _victim_leases(db: str, pid: int) -> int:
    """Chunk leases not done that the process ``pid`` holds (its worker ids are host:pid:hex)."""
    store = open_store(db)
    try:
        rows = store.conn.execute("SELECT worker FROM leases WHERE done = 0").fetchall()
        return sum(1 for (worker,) in rows if worker.split(":")[-2] == str(pid))
    finally:
        store.close()


def _dead(db: str, run_id: str, pid: int) -> bool:
    """Whether the process ``pid``'s worker of the run is dead (its heartbeats stopped past its lease)."""
    store = open_store(db)
    try:
        return any(w["state"] == "dead" for w in store.workers(run_id) if w["pid"] == pid)
    finally:
        store.close()


def _victim_expiries(db: str, pid: int) -> list[float]:
    """When the leases the process ``pid`` holds expire (seconds since the epoch, the store's clock)."""
    store = open_store(db)
    try:
        rows = store.rows("SELECT worker, expires FROM leases WHERE done = 0")
        return [float(expires) for worker, expires in rows if worker.split(":")[-2] == str(pid)]
    finally:
        store.close()


def _takeover_bound() -> float:
    """ARCHITECTURE.md invariant 8 for the tests' lease: a stopped worker's leases expire within its widest lease
    after its last heartbeat, and a transaction it left open ends a quarter of a lease after it stopped."""
    ttl = float(ENV_TTL)
    return MAX_WIDEN * ttl + ttl / 4


def _check_fenced_run(db: str, run_id: str, sim_server: str, outcomes: list, budget: str, usd: float) -> None:
    """What a run with a stopped worker must end with: every task done once, nothing charged twice, no reservation
    open, the budget kept, and sent twice only what the stopped worker had in flight (kept as possibly billed)."""
    code, out, err = outcomes[0]
    if budget == "ample":
        assert code == 0, err
        assert f"run {run_id}: completed" in out
    else:
        assert code == 3, err
    assert outcomes[1][0] in (0, 3), outcomes[1][2]

    store = open_store(db)
    tasks = store.tasks(run_id)
    assert {t["status"] for t in tasks} == {"done"}, "a finished task was rewritten"
    if budget == "ample":
        assert len(tasks) == 600
        assert store.get_run(run_id)["status"] == "completed"
    charges = Counter(row["key"] for row in store.ledger(run_id, kind="charge"))
    assert set(charges.values()) == {1}, "a request was charged twice"
    assert len(charges) == sum(1 for t in tasks if not t["cache_hit"])
    assert not store.ledger(run_id, kind="reserved"), "a reservation stays open"
    possibly = store.ledger(run_id, kind="possibly_billed")
    if budget == "tight":
        spent = sum(row["amount"] for row in store.ledger(run_id) if row["kind"] in ("charge", "possibly_billed"))
        assert spent <= usd + 1e-9
    completed = sim_stats(sim_server)["completed_by_digest"]
    twice = sum(n - 1 for n in completed.values())
    assert twice <= len(possibly), (twice, len(possibly))
    store.close()


def _victim_running(tmp_path: Path, sim_server: str, db: str, budget: str) -> tuple:
    """A run of 600 requests, its owner (`runner submit`) and a second worker (`runner work`, the victim) holding a
    lease with 40 tasks done: (owner, victim, run id, budget in USD)."""
    # each request's worst case is about $0.08: $20 pays ~250 of the 600
    usd = 1000000 if budget == "ample" else 20
    job = _job(tmp_path, sim_server, rows=600, concurrency=2, extra=f"{PRICES}\nbudget: {{usd: {usd}}}")
    args = ["--allow-partial"] if budget == "tight" else []
    owner = start_runner(["submit", str(job), "--db", db, *args], tmp_path)
    run_id = printed_run_id(owner)
    victim = start_runner(["work", run_id, "--db", db], tmp_path)
    _wait_for(lambda: done_tasks(db) >= 40 and _victim_leases(db, victim.pid) > 0, 60, "the victim holding a lease")
    return owner, victim, run_id, usd


@pytest.mark.slow
@pytest.mark.parametrize("budget", ["ample", "tight"])
@pytest.mark.parametrize("sim_server", [0.05], indirect=True)
def test_a_stopped_worker_declared_dead_is_fenced_out(tmp_path, sim_server, db, monkeypatch, budget):
    """A worker stopped (SIGSTOP) past its lease while another takes its chunks over, then continued (SIGCONT): the
    store refuses its writes for the chunks it lost, so nothing is charged twice, no finished task is rewritten, no
    reservation stays open, and a budget that runs out ends the run (exit 3) instead of waiting for ever. Its leases
    expire within the bound of ARCHITECTURE.md invariant 8."""
    _env(monkeypatch)
    owner, victim, run_id, usd = _victim_running(tmp_path, sim_server, db, budget)
    stop_between_writes(db, victim)
    stopped_at = time.time()
    try:
        assert max(_victim_expiries(db, victim.pid), default=stopped_at) <= stopped_at + _takeover_bound() + 1
        # the owner takes its chunks over once it reaches the end of the stage (its own 400-odd requests first), or
        # runs out of budget first and leaves, declaring the victim dead on its way out
        _wait_for(lambda: _victim_leases(db, victim.pid) == 0 or owner.poll() is not None, 120,
                  "the victim's chunks taken over")
        _wait_for(lambda: _dead(db, run_id, victim.pid), 30, "the victim declared dead")
    finally:
        victim.send_signal(signal.SIGCONT)
    outcomes = [_wait(proc, timeout=90) for proc in (owner, victim)]
    _check_fenced_run(db, run_id, sim_server, outcomes, budget, usd)


def _stop_inside_a_transaction(pg_url: str, victim: subprocess.Popen) -> str:
    """SIGSTOP the victim at a moment its PostgreSQL session is inside a transaction (its session is named after its
    worker, ``runner HOST:PID:HEX``); returns the session's state then."""
    store = open_store(pg_url)
    try:
        for _ in range(2000):
            stop(victim)
            found = store.rows("SELECT state FROM pg_stat_activity WHERE application_name LIKE ? AND xact_start IS"
                               " NOT NULL", (f"runner %:{victim.pid}:%",))
            if found:
                return found[0][0]
            victim.send_signal(signal.SIGCONT)
            time.sleep(0.003)
    finally:
        store.close()
    raise AssertionError("the victim was never caught inside a transaction in 2,000 tries")


@pytest.mark.slow
@pytest.mark.parametrize("sim_server", [0.05], indirect=True)
def test_a_worker_stopped_inside_a_postgresql_transaction_is_taken_over(tmp_path, sim_server, pg_url, monkeypatch):
    """Stopped in the middle of a transaction (its row locks held), the victim keeps them no longer than a quarter of
    its lease: the server ends its transaction, so the owner's writes and its takeover go through while the victim is
    still stopped, and the victim, continued, is fenced out."""
    _env(monkeypatch)
    owner, victim, run_id, usd = _victim_running(tmp_path, sim_server, pg_url, "ample")
    state = _stop_inside_a_transaction(pg_url, victim)
    stopped_at = time.monotonic()
    try:
        _wait_for(lambda: _victim_leases(pg_url, victim.pid) == 0 or owner.poll() is not None, 120,
                  f"the victim's chunks taken over (it was stopped in a transaction, {state})")
        took = time.monotonic() - stopped_at
        _wait_for(lambda: _dead(pg_url, run_id, victim.pid), 30, "the victim declared dead")
    finally:
        victim.send_signal(signal.SIGCONT)
    outcomes = [_wait(proc, timeout=90) for proc in (owner, victim)]
    _check_fenced_run(pg_url, run_id, sim_server, outcomes, "ample", usd)
    assert took < 120, took


def _stop_inside_a_write(db: str, victim: subprocess.Popen) -> None:
    """SIGSTOP the victim at a moment it holds the SQLite store's write lock."""
    for _ in range(5000):
        holder = write_lock_holder(db)
        if holder is not None and holder.pid == victim.pid:
            stop(victim)
            holder = write_lock_holder(db)
            if holder is not None and holder.pid == victim.pid:
                return
            victim.send_signal(signal.SIGCONT)
        time.sleep(0.001)
    raise AssertionError("the victim was never caught holding the write lock in 5,000 tries")


@pytest.mark.slow
@pytest.mark.parametrize("sim_server", [0.05], indirect=True)
def test_a_worker_stopped_inside_a_sqlite_write_makes_the_others_wait_and_say_who(tmp_path, sim_server,
                                                                                  monkeypatch):
    """SQLite's write lock belongs to the process that took it: stopped inside a write, the victim keeps it and no
    other process can write. The owner waits (no "unexpected" error), says which process holds the lock and that it
    is stopped, and goes on once the victim continues; nothing is charged twice."""
    _env(monkeypatch)
    db = str(tmp_path / "store.sqlite")
    open_store(db).close()
    owner, victim, run_id, usd = _victim_running(tmp_path, sim_server, db, "ample")
    _stop_inside_a_write(db, victim)
    try:
        time.sleep(ATTEMPT_S + 3)  # one attempt of the owner's busy handler, and its line
        assert write_lock_holder(db) == Holder(victim.pid, True)
        assert owner.poll() is None, owner.communicate()[1][-2000:]
    finally:
        victim.send_signal(signal.SIGCONT)
    outcomes = [_wait(proc, timeout=120) for proc in (owner, victim)]
    err = outcomes[0][2]
    assert f"process {victim.pid} (stopped) has held its write lock" in err, err[-3000:]
    assert f"`kill -CONT {victim.pid}` continues it" in err and "is free again after" in err
    assert "unexpected" not in err and "Traceback" not in err
    _check_fenced_run(db, run_id, sim_server, outcomes, "ample", usd)


@pytest.mark.slow
@pytest.mark.parametrize("sim_server", [0.05], indirect=True)
def test_a_sqlite_store_locked_past_the_wait_ends_the_run_in_one_sentence_and_resumes(tmp_path, sim_server,
                                                                                      monkeypatch):
    """Past RUNNER_STORE_WAIT, a process that cannot write leaves: one sentence naming the process that holds the
    store and how to go on, its answers kept aside; the run then finishes with every task answered once."""
    _env(monkeypatch)
    monkeypatch.setenv("RUNNER_STORE_WAIT", "15")
    db = str(tmp_path / "store.sqlite")
    open_store(db).close()
    owner, victim, run_id, _ = _victim_running(tmp_path, sim_server, db, "ample")
    _stop_inside_a_write(db, victim)
    stopped_at = time.monotonic()
    try:
        code, out, err = _wait(owner, timeout=90)
        left_after = time.monotonic() - stopped_at
    finally:
        victim.send_signal(signal.SIGCONT)
    # it waited RUNNER_STORE_WAIT (in attempts of ATTEMPT_S), then left in moments: its last writes fail at once
    assert left_after < 15 + ATTEMPT_S + 15, (left_after, err[-3000:])
    assert code == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"Error: the store {db} stayed locked by process {victim.pid} (stopped) for "), last
    assert f"continue it (`kill -CONT {victim.pid}`) or end it, then `runner resume {run_id}`" in last, last
    assert "Traceback" not in err and "unexpected" not in err
    _wait(victim, timeout=120)
    store = open_store(db)
    if store.get_run(run_id)["status"] != "completed":  # the victim, continued, may have finished it
        resumed = subprocess.run(runner_cmd("resume", run_id, "--db", db), cwd=tmp_path, capture_output=True,
                                 text=True, timeout=120)
        assert resumed.returncode == 0, resumed.stderr
    tasks = store.tasks(run_id)
    not_done = [(t["item"], t["error_class"], t["error"], t["attempts"]) for t in tasks if t["status"] != "done"]
    assert len(tasks) == 600 and not not_done, not_done[:3]
    charges = Counter(row["key"] for row in store.ledger(run_id, kind="charge"))
    assert set(charges.values()) == {1}, "a request was charged twice"
    assert not store.ledger(run_id, kind="reserved")
    possibly = store.ledger(run_id, kind="possibly_billed")
    store.close()
    completed = sim_stats(sim_server)["completed_by_digest"]
    assert len(completed) == 600
    twice = sum(n - 1 for n in completed.values())
    assert twice <= len(possibly), (twice, len(possibly))


@pytest.mark.parametrize("sim_server", [0.0], indirect=True)
def test_a_lease_marked_done_with_its_tasks_missing_does_not_end_the_run_completed(tmp_path, sim_server, db):
    """The last check of a shared run: a lease another worker marked done though its tasks were never written (the
    lease race fixed in runner/engine/workers.py; tests/engine/test_crew_heartbeat.py) ends the run failed and
    resumable, never "completed" with 64 tasks missing."""
    job = _job(tmp_path, sim_server, rows=100)
    from runner.spec.job import load_job

    loaded = load_job(job)
    store = open_store(db)
    run_id = store.create_run(loaded.name, str(job), loaded.model_dump_json(), loaded.fingerprint(), 100)
    store.join_run(run_id, "ghost", "elsewhere", 1, 30)
    store.lease_chunks(run_id, "mc", [0], "ghost", 30)
    store.finish_chunks(run_id, "mc", "ghost")  # done, and not one of its 64 tasks written
    store.leave_run("ghost")
    store.close()
    proc = subprocess.run(runner_cmd("work", run_id, "--db", db), cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert f"stage mc: 64 of its 100 tasks were left to other workers and none of them answered them; `runner " \
           f"resume {run_id}` sends them" in proc.stderr + proc.stdout
    store = open_store(db)
    try:
        assert len(store.tasks(run_id, status="done")) == 36
        assert store.get_run(run_id)["status"] == "failed"
    finally:
        store.close()
