"""The runner as a user runs it, in its own process: SIGKILL part-way, Ctrl-C, then `runner resume`.

The simulated server runs in another process; its request counts prove what was or was not sent again.
"""

from __future__ import annotations

import hashlib
import json
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from runner.store import open_store
from tests.helpers import runner_cmd, sim_stats, write_job, write_rows


def _digest(messages: list) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True, separators=(",", ":"),
                                     ensure_ascii=False).encode()).hexdigest()


def _create_store(db: Path) -> None:
    """Create the store before the runner starts, so that opening it from the test while the runner writes only
    reads (opening a new file would apply the migrations, racing the runner's own)."""
    open_store(db).close()


def _tasks(db: Path, **where: str) -> list[dict]:
    """The task rows of the store at ``db`` (a runner process may be writing it)."""
    store = open_store(db)
    try:
        return store.tasks(**where)
    finally:
        store.close()


def _ledger(db: Path, kind: str) -> list[dict]:
    """The ledger rows of one kind of the store at ``db``."""
    store = open_store(db)
    try:
        return store.ledger(kind=kind)
    finally:
        store.close()


def _job(tmp_path: Path, url: str, rows: int, concurrency: int) -> Path:
    dataset = write_rows(tmp_path / "rows.jsonl", rows)
    extra = f"providers: {{sim: {{base_url: {json.dumps(url)}, concurrency: {concurrency}}}}}"
    return write_job(tmp_path / "job.yaml", dataset, models=["sim:gpt-sim"], extra=extra)


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.parametrize("sim_server", [0.02], indirect=True)
def test_sigkill_then_resume_sends_nothing_twice(tmp_path, sim_server):
    db = tmp_path / "store.sqlite"
    job = _job(tmp_path, sim_server, rows=200, concurrency=2)
    _create_store(db)
    proc = subprocess.Popen(runner_cmd("submit", str(job), "--db", str(db)), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for(lambda: len(_tasks(db)) >= 40, 60, "40 finished tasks")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL

    conn = sqlite3.connect(db)  # the file itself, as SQLite sees it after the kill
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    store = open_store(db)
    stored = [json.loads(r["request_json"])["messages"] for r in store.responses()]
    done = len(store.tasks(status="done"))
    run_id = store.list_runs()[0]["id"]
    store.close()
    assert 40 <= len(stored) < 200 and done == len(stored)
    runs = subprocess.run(runner_cmd("runs", "--db", str(db)), cwd=tmp_path, capture_output=True, text=True)
    assert "crashed" in runs.stdout

    resumed = subprocess.run(runner_cmd("resume", run_id, "--db", str(db)), cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert f"run {run_id}: completed" in resumed.stdout

    completed = sim_stats(sim_server)["completed_by_digest"]
    for messages in stored:
        assert completed[_digest(messages)] == 1, "a request with a stored response was sent again"
    assert len(completed) == 200
    results = tmp_path / "results" / "testjob" / run_id / "mc.jsonl"
    ids = [json.loads(line)["id"] for line in results.read_text().splitlines()]
    assert sorted(ids, key=int) == [str(i) for i in range(1, 201)], "every result exactly once"
    assert len(_tasks(db, status="done")) == 200


@pytest.mark.parametrize("sim_server", [0.3], indirect=True)
def test_ctrl_c_finishes_in_flight_requests_and_marks_the_run_interrupted(tmp_path, sim_server):
    db = tmp_path / "store.sqlite"
    job = _job(tmp_path, sim_server, rows=40, concurrency=4)
    _create_store(db)
    proc = subprocess.Popen(runner_cmd("submit", str(job), "--db", str(db)), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: len(_tasks(db)) >= 4, 60, "4 finished tasks")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "Stopping" in err
    assert "interrupted" in out
    received = sim_stats(sim_server)["received"]
    # Each request the server answered was recorded: in-flight work finished before the runner exited.
    assert len(_tasks(db, status="done")) == received < 40
    run_id = out.split("run ", 1)[1].split(":", 1)[0]
    resumed = subprocess.run(runner_cmd("resume", run_id, "--db", str(db)), cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert sim_stats(sim_server)["received"] == 40


@pytest.mark.parametrize("sim_server", [0.3], indirect=True)
def test_sigkill_leaves_possibly_billed_reservations_that_resume_settles(tmp_path, sim_server):
    """Requests in flight at a SIGKILL may have been billed: the report counts their reserved worst case as
    spent ("possibly billed") until a resume settles them, after which none is left merely reserved."""
    db = tmp_path / "store.sqlite"
    dataset = write_rows(tmp_path / "rows.jsonl", 30)
    extra = (f"providers: {{sim: {{base_url: {json.dumps(sim_server)}, concurrency: 4}}}}\n"
             "prices: {sim:gpt-sim: {input: 1000, output: 4000}}\nbudget: {usd: 100}")
    job = write_job(tmp_path / "job.yaml", dataset, models=["sim:gpt-sim"], extra=extra)
    _create_store(db)
    proc = subprocess.Popen(runner_cmd("submit", str(job), "--db", str(db)), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for(lambda: len(_tasks(db)) >= 4 and len(_ledger(db, "reserved")) >= 2, 60,
                  "4 finished tasks and requests in flight")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    store = open_store(db)
    in_flight = len(store.ledger(kind="reserved"))
    reserved = sum(row["amount"] for row in store.ledger(kind="reserved"))
    assert in_flight >= 1
    run_id = store.list_runs()[0]["id"]
    store.close()

    shown = subprocess.run(runner_cmd("report", run_id, "--db", str(db), "--format", "json"), cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
    totals = json.loads(shown.stdout)["totals"]
    assert totals["possibly_billed_requests"] == in_flight
    assert totals["possibly_billed"] == pytest.approx(reserved)
    text = subprocess.run(runner_cmd("report", run_id, "--db", str(db)), cwd=tmp_path, capture_output=True,
                          text=True, timeout=60).stdout
    assert "possibly billed" in text

    resumed = subprocess.run(runner_cmd("resume", run_id, "--db", str(db)), cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert len(_ledger(db, "reserved")) == 0
    # Not in the cache, so the server may have billed them: they stay charged at their worst case, labelled.
    assert len(_ledger(db, "possibly_billed")) == in_flight
    after = json.loads(subprocess.run(runner_cmd("report", run_id, "--db", str(db), "--format", "json"),
                                      cwd=tmp_path, capture_output=True, text=True, timeout=60).stdout)["totals"]
    assert after["done"] == 30 and after["possibly_billed"] == pytest.approx(reserved)
    assert after["ledger_charged"] == pytest.approx(after["cost"])
