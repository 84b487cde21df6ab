"""``--ray`` on a Ray cluster of three nodes (issue 39 item 3): the head and two more, each a raylet of its own with
one CPU, its own resources and its own session folder, all on 127.0.0.1. The workers are placed one per node; one
node is stopped mid-run (its raylet and every process it started killed, as a machine lost), and the run completes
on the others with nothing lost and nothing paid twice, and the command ends although Ray has nowhere to start the
lost worker again.

The nodes are started by Ray's own multi-node launcher (``ray.cluster_utils.Cluster``, which starts each node's
processes as ``ray start --head`` and ``ray start --address`` do) in a process of its own: ``ray start`` itself
turns 127.0.0.1 into the machine's network address for a cluster of several nodes (``resolve_ip_for_localhost``),
and the tests talk to 127.0.0.1 only."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from devservers.processes import kill_tree, parent
from runner.store import open_store
from tests.cluster.conftest import LEASE_TTL, python_env, sim_job
from tests.helpers import done_tasks, sim_stats, start_runner

#: Ray's processes are many: the cluster's tests stay in one test process, beside the other Ray tests
pytestmark = pytest.mark.xdist_group("ray")

#: starts a cluster of NODES nodes of one CPU each, prints its address and each node's raylet pid, and stops it when
#: its standard input closes
LAUNCHER = """
import json, sys
from ray.cluster_utils import Cluster
nodes = int(sys.argv[1])
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"node0": 1},
                                                        "include_dashboard": False})
added = [cluster.head_node] + [cluster.add_node(num_cpus=1, resources={f"node{i}": 1}) for i in range(1, nodes)]
cluster.wait_for_nodes()
print(json.dumps({"address": cluster.address,
                  "raylets": [node.all_processes["raylet"][0].process.pid for node in added]}), flush=True)
sys.stdin.read()
cluster.shutdown()
"""

#: seconds a loaded machine may take to start three nodes (about 20 s under load)
START_TIMEOUT = 120


@pytest.fixture
def ray_nodes(tmp_path: Path) -> Iterator[dict]:
    """Three Ray nodes on 127.0.0.1: ``{"address": GCS address, "raylets": [pid of each node's raylet]}``, the
    head's first."""
    # the nodes' session folders: a short path (a Unix socket's may not exceed 107 bytes)
    sessions = tempfile.mkdtemp(prefix="ray-")
    env = {**os.environ, **python_env(), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled",
           "RAY_USAGE_STATS_ENABLED": "0", "RUNNER_LEASE_TTL": LEASE_TTL, "RAY_TMPDIR": sessions}
    env.pop("RAY_ADDRESS", None)
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, "3"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=(tmp_path / "ray-launcher.log").open("w"), text=True,
                                env=env, start_new_session=True)
    try:
        line = _read_line(launcher, START_TIMEOUT)
        assert line, f"the Ray nodes did not start: {(tmp_path / 'ray-launcher.log').read_text()[-3000:]}"
        yield json.loads(line)
    finally:
        launcher.stdin.close()
        try:
            launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
        shutil.rmtree(sessions, ignore_errors=True)


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    import selectors

    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            return ""
    return proc.stdout.readline()


def _node_of(pid: int, raylets: list[int]) -> int | None:
    """The raylet among ``raylets`` whose node runs process ``pid`` (a worker process is its raylet's child)."""
    while pid > 1:
        if pid in raylets:
            return pid
        try:
            pid = parent(pid)
        except (OSError, IndexError, ValueError):
            return None
    return None


@pytest.mark.slow
@pytest.mark.parametrize("sim_server", [0.05], indirect=True)
@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_workers_on_three_nodes_one_node_lost_mid_run_the_run_completes_paying_nothing_twice(tmp_path, sim_server,
                                                                                            db, ray_nodes, monkeypatch):
    # the command joins at 127.0.0.1 (without this Ray turns the address into the machine's network one)
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    rows = 300
    job = sim_job(tmp_path, sim_server, rows=rows)
    proc = start_runner(["submit", str(job), "--db", db, "--ray", ray_nodes["address"], "--workers", "3"], tmp_path)
    raylets = ray_nodes["raylets"]
    deadline = time.monotonic() + 120
    placed: dict[int, int | None] = {}
    while True:  # until the three workers run, and some requests are answered
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"the Ray workers did not start on three nodes: {placed}"
        store = open_store(db)
        try:
            runs = store.list_runs()
            live = [w for w in store.workers(runs[0]["id"]) if w["state"] == "live"] if runs else []
        finally:
            store.close()
        placed = {w["pid"]: _node_of(w["pid"], raylets) for w in live}
        if len(placed) == 3 and done_tasks(db) >= 30:
            break
        time.sleep(0.2)
    assert sorted(placed.values()) == sorted(raylets), f"not one worker per node: {placed}"
    lost = raylets[1]  # not the head's: the command's own driver is attached to the head node
    kill_tree(lost)  # the node's raylet and every process it started: a machine lost
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    run_id = out.split("run ", 1)[1].split(":", 1)[0]
    assert f"run {run_id}: completed" in out, out
    store = open_store(db)
    try:
        tasks = store.tasks(run_id)
        assert len(tasks) == rows and {t["status"] for t in tasks} == {"done"}, "a task was lost"
        charges = Counter(row["key"] for row in store.ledger(run_id, kind="charge"))
        assert len(charges) == rows and set(charges.values()) == {1}, "a request was charged twice"
        assert not store.ledger(run_id, kind="reserved"), "a reservation stays open"
        workers = store.workers(run_id)
        assert not [w for w in workers if w["state"] == "live"], workers
        # the lost node's worker died without leaving: declared dead by a peer whose lease check came first, or let
        # go of by the command once the others were done (ray_workers.let_go)
        gone = [pid for pid, node in placed.items() if node == lost]
        assert gone and not Path(f"/proc/{gone[0]}").exists() and gone[0] in {w["pid"] for w in workers}
        possibly = store.ledger(run_id, kind="possibly_billed")
    finally:
        store.close()
    # sent twice: only what the lost worker had in flight, each kept as possibly billed (its answer was lost)
    completed = sim_stats(sim_server)["completed_by_digest"]
    assert len(completed) == rows and sum(n - 1 for n in completed.values()) <= len(possibly)
