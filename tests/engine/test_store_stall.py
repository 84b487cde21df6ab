"""A store that stops answering for a while during a run of two workers (issue 35): SQLite's write lock held by
another process, or the PostgreSQL server stopped (SIGSTOP). Each worker's event loop goes on meanwhile (its live
view keeps printing at its interval), each says the store is slow and when it answers again, no live worker is
declared dead or loses a lease (every lease keeps its first token), and the run ends with every task answered once.

Real `runner` processes, the simulated server in its own process, one shared store, as tests/engine/test_workers.py.
"""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from runner.store import open_store
from tests.helpers import done_tasks, pg_server_processes, runner_cmd, signal_all, sim_stats, write_job, write_rows

#: the shortest lease: a stall of twice of it, or more, would have every lease expire
TTL = 4.0
ROWS = 600
PRICES = "prices: {sim:gpt-sim: {input: 1000, output: 2000}}\nbudget: {usd: 1000000}"


class _Process:
    """A `runner` process whose standard error is read as it comes, each line with the time it arrived."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        self.proc = subprocess.Popen(runner_cmd(*args), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.err: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.err.append((time.monotonic(), line.rstrip("\n")))

    def run_id(self) -> str:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("run ") and "started job" in line:
                return line.split()[1].rstrip(":")
        raise AssertionError(f"no run id printed: {self.stderr()[-3000:]}")

    def wait(self, timeout: float = 180) -> tuple[int, str]:
        out, _ = self.proc.communicate(timeout=timeout)
        self._reader.join(10)
        return self.proc.returncode, out

    def stderr(self) -> str:
        return "\n".join(line for _, line in self.err)

    def longest_silence(self, start: float, end: float) -> float:
        """The longest time between two lines of its log (the live view prints every RUNNER_PROGRESS_INTERVAL)
        from ``start`` to ``end``."""
        times = [start, *(t for t, line in self.err if start < t < end and line.startswith("[runner]")), end]
        return max(b - a for a, b in zip(times, times[1:], strict=False))


def _workers(db: str, run_id: str) -> list[dict]:
    store = open_store(db)
    try:
        return store.workers(run_id)
    finally:
        store.close()


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _stall(db: str, request: pytest.FixtureRequest, seconds: float) -> float:
    """Make the store not answer for ``seconds``; returns when the stall began (time.monotonic())."""
    if "://" not in db:
        holder = sqlite3.connect(db, timeout=30, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock: no worker can write
        began = time.monotonic()
        try:
            time.sleep(seconds)
        finally:
            holder.execute("COMMIT")
            holder.close()
        return began
    pids = pg_server_processes(request.getfixturevalue("pg_server"))
    signal_all(pids, signal.SIGSTOP)
    began = time.monotonic()
    try:
        time.sleep(seconds)
    finally:
        signal_all(pids, signal.SIGCONT)
    return began


@pytest.mark.slow  # two worker processes and a stall: 25 s (8 s stall) to 50 s (30 s)
@pytest.mark.parametrize("stall", [8.0, pytest.param(30.0, marks=pytest.mark.slow)], ids=["8s", "30s"])
@pytest.mark.parametrize("sim_server", [0.05], indirect=True)
def test_a_stalled_store_stops_no_live_worker_and_every_task_is_answered_once(tmp_path, sim_server, db, monkeypatch,
                                                                             request, stall):
    monkeypatch.setenv("RUNNER_LEASE_TTL", f"{TTL:g}")
    dataset = write_rows(tmp_path / "rows.jsonl", ROWS)
    providers = f"providers: {{sim: {{base_url: {json.dumps(sim_server)}, concurrency: 2}}}}"
    job = write_job(tmp_path / "testjob.yaml", dataset, models=["sim:gpt-sim"], extra=f"{providers}\n{PRICES}")
    owner = _Process(["submit", str(job), "--db", db], tmp_path)
    run_id = owner.run_id()
    worker = _Process(["work", run_id, "--db", db], tmp_path)
    _wait_for(lambda: done_tasks(db) >= 60 and sum(w["state"] == "live" for w in _workers(db, run_id)) == 2, 60,
              "both workers at work")
    began = _stall(db, request, stall)
    ended = time.monotonic()
    outcomes = [process.wait() for process in (owner, worker)]

    for process, (code, out) in zip((owner, worker), outcomes, strict=True):
        err = process.stderr()
        assert code == 0, err[-3000:]
        assert f"run {run_id}: completed" in out, out
        assert "Traceback" not in err and "declared dead" not in err and "lost" not in err, err[-3000:]
        # its event loop went on: the live view printed all through the stall
        assert process.longest_silence(began + 1, ended - 0.5) < 2.5, err[-3000:]
    said = owner.stderr() + worker.stderr()
    # said once a call has waited 5 s, when the watch looks (each second; later on a loaded machine)
    assert re.search(r"has not answered for \d+ s: heartbeats, rate limits and this view go on", said), said[-3000:]
    assert "answers again, after" in said

    store = open_store(db)
    try:
        tasks = store.tasks(run_id)
        assert len(tasks) == ROWS and {t["status"] for t in tasks} == {"done"}
        workers = store.workers(run_id)
        assert len(workers) == 2 and {w["state"] for w in workers} == {"left"}, workers  # nobody declared dead
        tokens = {token for (token,) in store.rows("SELECT token FROM leases WHERE run_id = ?", (run_id,))}
        assert tokens == {1}, "a lease was taken over from a live worker"
        charges = Counter(row["key"] for row in store.ledger(run_id, kind="charge"))
        assert len(charges) == ROWS and set(charges.values()) == {1}
        assert not store.ledger(run_id, kind="reserved") and not store.ledger(run_id, kind="possibly_billed")
    finally:
        store.close()
    completed = sim_stats(sim_server)["completed_by_digest"]
    assert len(completed) == ROWS and set(completed.values()) == {1}, "a request was sent twice"
