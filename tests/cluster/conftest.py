"""What the cluster tests share: the store every process of a test opens (a SQLite file or a fresh PostgreSQL
schema), a job against the simulated server, the check that a run several processes shared completed with nothing
lost or paid twice, and a local Ray cluster (one per test process, started by the first test that asks for it:
starting one takes 20 s of a loaded machine)."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import sim_stats, write_job, write_rows

#: short leases, so a killed worker's chunks are taken over within seconds (as tests/engine/test_workers.py)
LEASE_TTL = "8"
#: prices for the simulated model, so every request is charged in the ledger
PRICES = "prices: {sim:gpt-sim: {input: 1000, output: 2000}}\nbudget: {usd: 1000000}"


def sim_job(folder: Path, url: str, rows: int, *, concurrency: int = 2, name: str = "testjob") -> Path:
    """A job of ``rows`` distinct requests to the simulated server at ``url``, every request priced."""
    dataset = write_rows(folder / "rows.jsonl", rows)
    providers = f"providers: {{sim: {{base_url: {json.dumps(url)}, concurrency: {concurrency}}}}}"
    return write_job(folder / f"{name}.yaml", dataset, models=["sim:gpt-sim"], extra=f"{providers}\n{PRICES}",
                     name=name)


def check_shared_run(db: str, run_id: str, url: str, rows: int) -> None:
    """One run, completed, every item answered once and charged once, every worker gone."""
    from runner.store import open_store

    completed = sim_stats(url)["completed_by_digest"]
    assert len(completed) == rows and set(completed.values()) == {1}, "a request was sent twice"
    store = open_store(db)
    try:
        assert [run["id"] for run in store.list_runs()] == [run_id]
        assert store.get_run(run_id)["status"] == "completed"
        tasks = store.tasks(run_id)
        assert len(tasks) == rows and {t["status"] for t in tasks} == {"done"}
        charges = Counter(row["key"] for row in store.ledger(run_id, kind="charge"))
        assert len(charges) == rows and set(charges.values()) == {1}
        assert {w["state"] for w in store.workers(run_id)} == {"left"}
    finally:
        store.close()


def python_env() -> dict[str, str]:
    """What this Python needs to find the runner in a process of its own (a virtualenv, PYTHONPATH)."""
    return {name: os.environ[name] for name in ("PYTHONPATH", "VIRTUAL_ENV") if name in os.environ}


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """A Ray cluster on 127.0.0.1 with 2 CPUs (each worker asks for one), started in this process: yields the
    ``ray`` module; the address of its control store is ``ray_cluster.get_runtime_context().gcs_address``. Its
    processes inherit RUNNER_LEASE_TTL.

    Ray of one machine, on the loopback address, for the whole session (set before Ray is imported, which reads it
    then; the commands the tests start inherit it): RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 is Ray's own switch for
    that (its ``get_node_ip_address`` then says 127.0.0.1). Without it the cluster's address is the machine's
    network address (newer Ray), or a process joining at 127.0.0.1:PORT is sent there (``resolve_ip_for_localhost``)
    while Ray 2.10's control store, bound to 127.0.0.1, does not answer there."""
    session = pytest.MonkeyPatch()
    session.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RUNNER_LEASE_TTL", LEASE_TTL)
        patch.setenv("RAY_AUTH_MODE", "disabled")  # no token file written for a throwaway cluster
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1",
                 namespace="runner-tests")
    try:
        yield ray
    finally:
        ray.shutdown()
        session.undo()
        os.environ.pop("RAY_ADDRESS", None)
