"""A run's first phases, before anything is dispatched: its stages planned and counted, its row made (or a
resumed run marked running again), and what a resumed run left behind recovered. Called by
:func:`runner.engine.run.execute` in that order."""

from __future__ import annotations

import datetime as dt
import os
import socket
from collections.abc import Callable

from runner.engine.failures import unstored_paths
from runner.engine.stats import RunStats
from runner.plan.stage import StagePlan
from runner.processes import pid_alive
from runner.spec.schema import Job
from runner.store import Store
from runner.store.writer import store_unstored


def plan_stages(job: Job) -> tuple[list[StagePlan], RunStats, int]:
    """The stages' plans (a pipeline's are planned as they come: their rows are known only once the earlier ones
    ran), the live counters with each stage and model's total, and the run's total."""
    plans = [] if job.is_pipeline else [StagePlan(job, stage) for stage in job.stages]
    for plan in plans:
        plan.first_request()  # a template that cannot render fails here, before anything is sent
    stats = RunStats()
    total = 0
    for plan in plans:
        per_model = plan.total() // max(1, len(plan.models))
        for model in plan.models:
            stats.counters(plan.stage.name, model).total = per_model
            total += per_model
    return plans, stats, total


def open_run(job: Job, store: Store, run_id: str | None, total: int, *, join: bool) -> str:
    """The run's id: a new run row (with its deadline, kept so a resume keeps it), a resumed run marked running
    again, or the run a worker joins as it is."""
    if join:
        assert run_id is not None
    elif run_id is None:
        run_id = store.create_run(job.name, job.path, job.model_dump_json(), job.fingerprint(), total)
        seconds = job.deadline_seconds()
        if seconds is not None:
            store.set_run(run_id, deadline=(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)).isoformat())
    else:
        store.set_run(run_id, status="running", pid=os.getpid(), message=None, finished=None, total=total)
        store.reset_chunks(run_id)  # a resume plans every chunk again and skips the tasks that are done
    return run_id


def recover(job: Job, store: Store, run_id: str, plans: list[StagePlan], stats: RunStats,
            note: Callable[[str], None]) -> None:
    """A resume's first steps: store the answers kept aside when the store failed, settle the reservations of
    requests in flight when the run stopped, let go of this machine's crashed workers, and count what earlier
    attempts finished and spent."""
    for path in unstored_paths(job, store, run_id):
        if path.exists():
            note(f"stored {store_unstored(store, path)} answers kept in {path} when the store failed")
    settled, possibly = store.resolve_reservations(run_id)
    # the crashed processes of this run on this machine: their request claims go now, not when they expire
    for worker in store.workers(run_id):
        if worker["state"] != "left" and worker["host"] == socket.gethostname() and not pid_alive(worker["pid"]):
            store.leave_run(worker["id"])
    if settled or possibly:
        note(f"{settled + possibly} requests were in flight when the run stopped: {settled} settled from "
             f"the cache, {possibly} kept as possibly billed at their worst case")
    # the live view counts what earlier attempts finished and spent from the start, not as it reaches them
    for plan in plans:
        for model, (n, _) in store.done_by_model(run_id, plan.stage.name).items():
            if (plan.stage.name, model) in stats.by_key:
                stats.counters(plan.stage.name, model).prior = n
    stats.prior_spend = sum(usd for _, _, usd, _ in store.spent(run_id))
