"""How a run on Ray actors ends when one of them went without leaving (issue 41: an actor killed near the end left
the run "running", listed as crashed, though every task was answered): the command lets go of the gone workers
(runner/cluster/ray_workers.py ``let_go``) and ``service.conclude`` records the completion the last actor's engine
could not. Ray itself is not needed: the store's rows are what decide."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from runner import service
from runner.cluster.ray_workers import let_go
from runner.spec.job import load_job
from runner.store import open_store
from tests.helpers import write_job, write_rows


def _gone_pid() -> int:
    """The pid of a process of this machine that has ended."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _run(tmp_path: Path):
    store = open_store(tmp_path / "store.sqlite")
    return store, store.create_run("job", "job.yaml", "{}", "fp", 10)


def test_a_gone_actor_of_this_machine_lets_go_at_once_and_a_live_process_is_left_at_work(tmp_path):
    store, run_id = _run(tmp_path)
    here = socket.gethostname()
    store.join_run(run_id, "killed", here, _gone_pid(), 30)  # its heartbeat has 30 s to run
    in_flight = store.reserve(run_id, "mc", "sim:m", "k1", 0.5, worker="killed")
    store.join_run(run_id, "working", here, 1, 30)  # pid 1 lives: a `runner work` beside the actors
    started = time.monotonic()
    let_go(store, run_id, ttl=30)
    assert time.monotonic() - started < 5, "waited for a process of this machine"
    states = {w["id"]: w["state"] for w in store.workers(run_id)}
    assert states == {"killed": "left", "working": "live"}
    assert {row["id"]: row["kind"] for row in store.ledger(run_id)} == {in_flight: "possibly_billed"}


def test_another_machines_gone_actor_is_waited_for_until_its_heartbeat_expires_then_resolved(tmp_path):
    store, run_id = _run(tmp_path)
    store.join_run(run_id, "elsewhere", "node-2.invalid", 4242, 1.0)  # beats no more: expires in a second
    in_flight = store.reserve(run_id, "mc", "sim:m", "k1", 0.5, worker="elsewhere")
    started = time.monotonic()
    let_go(store, run_id, ttl=1.0, poll=0.05)
    waited = time.monotonic() - started
    assert 0.5 < waited < 3, f"waited {waited:.2f} s for a heartbeat of 1 s"
    assert [w["state"] for w in store.workers(run_id)] == ["dead"]
    assert {row["id"]: row["kind"] for row in store.ledger(run_id)} == {in_flight: "possibly_billed"}


def test_the_wait_for_another_machine_is_bounded_by_the_lease(tmp_path):
    store, run_id = _run(tmp_path)
    store.join_run(run_id, "busy", "node-2.invalid", 4242, 3600)  # still beating, as far as the store says
    started = time.monotonic()
    let_go(store, run_id, ttl=0.5, poll=0.05)
    assert time.monotonic() - started < 2.5
    assert [w["state"] for w in store.workers(run_id)] == ["live"]  # not ours to end


def test_a_completed_worker_records_the_completion_once_no_peer_is_live(tmp_path):
    job = load_job(write_job(tmp_path / "job.yaml", write_rows(tmp_path / "rows.jsonl", 3), models=["sim:m"]))
    store, run_id = _run(tmp_path)
    here = socket.gethostname()
    store.join_run(run_id, "last", here, _gone_pid(), 30)
    store.leave_run("last")
    store.join_run(run_id, "killed", here, _gone_pid(), 30)
    service.conclude(job, store, run_id, "completed", None)
    assert store.get_run(run_id)["status"] == "running", "a live peer: not this worker's to end"
    let_go(store, run_id, ttl=30)
    service.conclude(job, store, run_id, "completed", None)
    run = store.get_run(run_id)
    assert run["status"] == "completed" and run["finished"], run
