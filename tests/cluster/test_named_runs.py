"""``runner submit JOB --run-id NAME``: every task of an array job runs the same command; the first creates the run,
the others join it, a different job under the name is refused, a task that comes after the end exits 0. Real
`runner` processes, the simulated server in its own process counting what it was sent, one shared store."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from runner import service
from runner.errors import RunnerError
from runner.spec.job import load_job
from runner.store import open_store
from tests.cluster.conftest import LEASE_TTL, sim_job
from tests.helpers import one_error, only_error, runner_cmd, sim_stats


def _submit(job: Path, db: str, run_id: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(runner_cmd("submit", str(job), "--db", db, "--run-id", run_id), cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("sim_server", [0.03], indirect=True)
def test_three_tasks_with_one_command_make_one_run_and_send_each_request_once(tmp_path, sim_server, db,
                                                                               monkeypatch):
    monkeypatch.setenv("RUNNER_LEASE_TTL", LEASE_TTL)
    job = sim_job(tmp_path, sim_server, rows=400)
    tasks = [_submit(job, db, "array-7", tmp_path) for _ in range(3)]
    outcomes = [proc.communicate(timeout=120) + (proc.returncode,) for proc in tasks]
    for out, err, code in outcomes:
        assert code == 0, err
        assert "run array-7: completed" in out
    started = [out for out, _, _ in outcomes if "run array-7: started job testjob" in out]
    joined = [out for out, _, _ in outcomes if "run array-7: joining job testjob as a worker" in out]
    assert len(started) == 1 and len(joined) == 2, [out for out, _, _ in outcomes]

    completed = sim_stats(sim_server)["completed_by_digest"]
    assert len(completed) == 400 and set(completed.values()) == {1}, "a request was sent twice"
    store = open_store(db)
    assert [run["id"] for run in store.list_runs()] == ["array-7"]
    assert store.get_run("array-7")["status"] == "completed"
    tasks_done = store.tasks("array-7")
    assert len(tasks_done) == 400 and {t["status"] for t in tasks_done} == {"done"}
    charges = Counter(row["key"] for row in store.ledger("array-7", kind="charge"))
    assert len(charges) == 400 and set(charges.values()) == {1}
    assert {w["state"] for w in store.workers("array-7")} == {"left"}
    store.close()
    results = tmp_path / "results" / "testjob" / "array-7" / "mc.jsonl"
    ids = [json.loads(line)["id"] for line in results.read_text().splitlines()]
    assert sorted(ids, key=int) == [str(i) for i in range(1, 401)], "every result exactly once in the file"

    # a task that starts after the run finished says so, sends nothing and exits 0
    late = _submit(job, db, "array-7", tmp_path)
    out, err = late.communicate(timeout=60)
    assert late.returncode == 0, err
    assert "run array-7: already completed" in out
    assert sum(sim_stats(sim_server)["completed_by_digest"].values()) == 400


@pytest.mark.parametrize("sim_server", [0.0], indirect=True)
def test_one_task_alone_finishes_the_run_and_writes_its_results(tmp_path, sim_server):
    db = str(tmp_path / "store.sqlite")
    job = sim_job(tmp_path, sim_server, rows=30)
    proc = _submit(job, db, "solo", tmp_path)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "run solo: started job testjob" in out and "run solo: completed" in out
    assert "accuracy: mc sim:gpt-sim" in out
    results = tmp_path / "results" / "testjob" / "solo" / "mc.jsonl"
    assert len(results.read_text().splitlines()) == 30


@pytest.mark.parametrize("sim_server", [0.0], indirect=True)
def test_a_named_run_its_budget_stopped_has_every_stored_task_in_its_results_file(tmp_path, sim_server):
    """Every process of a named run is a worker, and a worker keeps no live file: the last one to leave writes the
    results from the store for a run its budget stopped too, not only for a completed one (found by the seeded fault
    simulation, `python scripts/chaos.py --seed 9`)."""
    db = str(tmp_path / "store.sqlite")
    job = sim_job(tmp_path, sim_server, rows=60)
    proc = subprocess.run(runner_cmd("submit", str(job), "--db", db, "--run-id", "tight", "--budget", "1",
                                     "--allow-partial"), cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    store = open_store(db)
    done = sorted(t["row_id"] for t in store.tasks("tight", status="done"))
    store.close()
    assert 0 < len(done) < 60
    results = tmp_path / "results" / "testjob" / "tight" / "mc.jsonl"
    assert sorted(json.loads(line)["id"] for line in results.read_text().splitlines()) == done


@pytest.mark.parametrize("sim_server", [0.0], indirect=True)
def test_another_job_under_a_taken_name_is_one_sentence(tmp_path, sim_server):
    db = str(tmp_path / "store.sqlite")
    job = sim_job(tmp_path, sim_server, rows=5)
    first = subprocess.run(runner_cmd("submit", str(job), "--db", db, "--run-id", "taken"), cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    # the same file with another --limit is another job (its content hash differs)
    other = subprocess.run(runner_cmd("submit", str(job), "--db", db, "--run-id", "taken", "--limit", "2"),
                           cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert other.returncode == 1
    line = only_error(other.stderr)
    assert line.startswith("Error: run taken was started with another job") and "--run-id" in line
    assert sum(sim_stats(sim_server)["completed_by_digest"].values()) == 5


@pytest.mark.parametrize("bad", ["a/b", "../up", "-x", "x" * 65, "two words", ""])
def test_a_run_id_that_is_no_name_is_one_sentence(tmp_path, bad):
    job = sim_job(tmp_path, "http://127.0.0.1:9/v1", rows=2)
    proc = subprocess.run(runner_cmd("submit", str(job), "--run-id", bad), cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1
    assert only_error(proc.stderr).startswith(f"Error: --run-id {bad!r} is not a run id")
    assert not (tmp_path / "cache.sqlite").exists(), "the store was opened before the id was checked"


def test_workers_without_ray_is_one_sentence(tmp_path):
    job = sim_job(tmp_path, "http://127.0.0.1:9/v1", rows=2)
    proc = subprocess.run(runner_cmd("submit", str(job), "--workers", "3"), cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1
    assert "--workers starts Ray workers: add --ray" in one_error(proc.stderr)


def test_a_name_matches_a_run_exactly_not_a_part_of_another_id(tmp_path):
    store = open_store(tmp_path / "store.sqlite")
    job = load_job(sim_job(tmp_path, "http://127.0.0.1:9/v1", rows=3))
    drawn = store.create_run(job.name, job.path, job.model_dump_json(), job.fingerprint(), 3)
    part = drawn.split("-")[-1]  # get_run alone would find the drawn run by this part of its id
    assert service.named_run(store, part, job) is None
    run, created = service.open_shared_run(job, store, part)
    assert created and run["id"] == part and run["fingerprint"] == job.fingerprint()
    # a second process opening the same name finds it: the same job, not created again
    again, created = service.open_shared_run(job, store, part)
    assert not created and again["id"] == part
    other = load_job(sim_job(tmp_path, "http://127.0.0.1:10/v1", rows=3, name="otherjob"))
    with pytest.raises(RunnerError, match=f"run {part} was started with another job"):
        service.open_shared_run(other, store, part)
    assert sorted(r["id"] for r in store.list_runs()) == sorted([drawn, part])
    store.close()
