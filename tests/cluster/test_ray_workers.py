"""``--ray``: a run's workers as Ray actors on a local Ray cluster started by the test (127.0.0.1, 2 CPUs), against
the simulated server in its own process counting what it was sent, one shared store: each request sent once, and
an actor killed mid-run is started again by Ray with nothing lost and nothing charged twice."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter

import pytest

from runner.store import open_store
from tests.cluster.conftest import sim_job
from tests.helpers import done_tasks, only_error, runner_cmd, sim_stats, start_runner

#: one local Ray cluster (a session fixture): its tests stay in one test process (pyproject's loadgroup)
pytestmark = pytest.mark.xdist_group("ray")


def _address(ray) -> str:
    return ray.get_runtime_context().gcs_address


def _actors(ray, prefix: str) -> list[str]:
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix))


@pytest.mark.slow
@pytest.mark.parametrize("sim_server", [0.02], indirect=True)
def test_two_ray_workers_share_a_run_and_send_each_request_once(tmp_path, sim_server, db, ray_cluster):
    job = sim_job(tmp_path, sim_server, rows=400)
    proc = start_runner(["submit", str(job), "--db", db, "--ray", _address(ray_cluster), "--workers", "2"], tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    run_id = out.split("run ", 1)[1].split(":", 1)[0]
    assert f"run {run_id}: completed" in out and "ray: 2 workers (2 processes joined the run)" in out, out
    # the command sends nothing itself: its live view counts what the store says the actors finished
    assert "[runner] mc sim:gpt-sim: 400/400 (100%)" in err, err

    completed = sim_stats(sim_server)["completed_by_digest"]
    assert len(completed) == 400 and set(completed.values()) == {1}, "a request was sent twice"
    store = open_store(db)
    assert store.get_run(run_id)["status"] == "completed"
    tasks = store.tasks(run_id)
    assert len(tasks) == 400 and {t["status"] for t in tasks} == {"done"}
    charges = Counter(row["key"] for row in store.ledger(run_id, kind="charge"))
    assert len(charges) == 400 and set(charges.values()) == {1}
    # both actors worked on it: two processes, other than this command's, joined and left
    workers = store.workers(run_id)
    assert len(workers) == 2 and {w["state"] for w in workers} == {"left"}
    assert proc.pid not in {w["pid"] for w in workers}
    store.close()
    # the results file is written by this command, from the store
    results = tmp_path / "results" / "testjob" / run_id / "mc.jsonl"
    ids = [json.loads(line)["id"] for line in results.read_text().splitlines()]
    assert sorted(ids, key=int) == [str(i) for i in range(1, 401)]


@pytest.mark.slow
@pytest.mark.parametrize("sim_server", [0.05], indirect=True)
def test_a_killed_ray_worker_is_started_again_and_nothing_is_lost_or_charged_twice(tmp_path, sim_server, pg_url,
                                                                                  ray_cluster):
    db = pg_url
    job = sim_job(tmp_path, sim_server, rows=400)
    proc = start_runner(["submit", str(job), "--db", db, "--ray", _address(ray_cluster), "--workers", "2"], tmp_path)
    deadline = time.monotonic() + 90
    while done_tasks(db) < 80:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the Ray workers did not start"
        time.sleep(0.1)
    names = _actors(ray_cluster, "runner-")
    assert len(names) == 2, names
    victim = ray_cluster.get_actor(names[0], namespace="runner")
    ray_cluster.kill(victim, no_restart=False)  # as a crash: Ray starts the actor again and calls work() again
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    run_id = out.split("run ", 1)[1].split(":", 1)[0]
    assert f"run {run_id}: completed" in out

    store = open_store(db)
    tasks = store.tasks(run_id)
    assert len(tasks) == 400 and {t["status"] for t in tasks} == {"done"}, "a task was lost"
    charges = Counter(row["key"] for row in store.ledger(run_id, kind="charge"))
    assert len(charges) == 400 and set(charges.values()) == {1}, "a request was charged twice"
    assert not store.ledger(run_id, kind="reserved"), "a reservation stays open"
    # the killed process is a dead worker; Ray's new process joined as a third one. Under load Ray may start the
    # actor again more than once, and a process of it that Ray stopped before it left, or the killed one when the
    # run completed before its lease ran out, is let go of by the command (ray_workers.let_go): none stays "live"
    workers = store.workers(run_id)
    states = sorted(w["state"] for w in workers)
    assert states.count("dead") + states.count("left") == len(states) >= 3, states
    assert not [w for w in workers if w["state"] == "live"], workers
    possibly = store.ledger(run_id, kind="possibly_billed")
    store.close()
    # sent twice: only what the killed process had in flight, each kept as possibly billed (its answer was lost)
    completed = sim_stats(sim_server)["completed_by_digest"]
    assert len(completed) == 400
    assert sum(n - 1 for n in completed.values()) <= len(possibly)


def test_a_sqlite_store_with_ray_on_other_machines_is_one_sentence(tmp_path, monkeypatch):
    from runner.cluster import ray_workers
    from runner.errors import RunnerError

    class FakeRay:  # a cluster of this machine and one other
        class util:
            @staticmethod
            def get_node_ip_address() -> str:
                return "127.0.0.1"

        @staticmethod
        def nodes() -> list[dict]:
            return [{"NodeManagerAddress": "127.0.0.1", "Alive": True},
                    {"NodeManagerAddress": "192.0.2.7", "Alive": True}]

    store = open_store(tmp_path / "store.sqlite")
    with pytest.raises(RunnerError, match=r"SQLite file .* other machines \(192\.0\.2\.7\).* postgresql://"):
        ray_workers.check_reach(FakeRay, store, "192.0.2.1:6379")
    with pytest.raises(RunnerError, match="postgresql://"):
        ray_workers.check_reach(type("Here", (FakeRay,), {"nodes": staticmethod(lambda: FakeRay.nodes()[:1])}),
                                store, "ray://192.0.2.1:10001")
    ray_workers.check_reach(type("Here", (FakeRay,), {"nodes": staticmethod(lambda: FakeRay.nodes()[:1])}),
                            store, ray_workers.HERE)
    store.close()


def test_without_ray_installed_ray_is_one_sentence_naming_the_extra(tmp_path):
    # a `ray` that cannot be imported, first on the path
    shadow = tmp_path / "shadow" / "ray"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named ray')\n")
    job = sim_job(tmp_path, "http://127.0.0.1:9/v1", rows=2)
    db = str(tmp_path / "store.sqlite")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(shadow.parent),
                                                                      os.environ.get("PYTHONPATH")]))}
    for args in (["submit", str(job), "--db", db, "--ray", "--no-check"], ["work", "some-run", "--db", db, "--ray"]):
        proc = subprocess.run(runner_cmd(*args), cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env)
        assert proc.returncode == 1, proc.stderr
        assert only_error(proc.stderr) == ("Error: --ray needs Ray, which is not installed here: "
                                           "pip install 'llm-job-runner[ray]'")
    # nothing was made: the run is refused before its row exists
    store = open_store(db)
    assert store.list_runs() == []
    store.close()


def test_ray_workers_must_be_one_or_more(tmp_path):
    job = sim_job(tmp_path, "http://127.0.0.1:9/v1", rows=2)
    proc = subprocess.run(runner_cmd("submit", str(job), "--ray", "--workers", "0", "--no-check"), cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert only_error(proc.stderr) == "Error: --workers must be 1 or more (got 0)"


def test_a_worker_ray_lost_fails_no_run_the_others_completed():
    """An actor completes only once every task of the run is done or failed, a lost actor's included: Ray losing
    one (its node gone) fails the run only when no other actor completed it."""
    from runner.cluster.ray_workers import _verdict

    done = {"status": "completed", "message": None, "sent": 10}
    lost = {"error": "a Ray worker died and was not started again (...)", "exit_code": 1, "lost": True}
    assert _verdict([done, lost, done]) == ("completed", None)
    assert _verdict([lost, lost]) == ("failed", lost["error"])
    broken = {"error": "the store is gone", "exit_code": 1}
    assert _verdict([done, broken, lost]) == ("failed", "the store is gone")
    stopped = {"status": "budget_exhausted", "message": "spent"}
    assert _verdict([lost, stopped, done]) == ("budget_exhausted", "spent")
