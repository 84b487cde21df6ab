"""A run's workers as Ray actors: ``runner submit JOB --ray [ADDRESS] --workers N`` and ``runner work RUN_ID --ray
[ADDRESS] --workers N``.

The command makes (or finds) the run in the store, then starts N actors, each a process that joins the run exactly
as ``runner work`` does (:meth:`RunWorker.work`: ``service.join``). Ray places them across the cluster and, when
one's process dies, starts it again (``max_restarts``) and calls ``work`` on it again (``max_task_retries``): the
new process joins as a new worker, and the chunks the dead one leased are taken over once its lease expires
(runner/engine/workers.py). All state is in the store, so nothing is lost, sent twice or charged twice, and the
budget holds across the actors. The command meanwhile shows the run's progress from the store
(runner/cluster/watch.py) and ends with the usual lines.

What each actor needs comes from the store and its own environment: the job as the run stored it (its datasets at
the same paths on every machine: a shared file system), the providers' keys from the environment of the Ray node
it runs on (a Ray started here inherits this process's), and the store: a SQLite file only when every actor runs
on this machine, else a ``postgresql://`` URL, passed to the actors without a password (give them RUNNER_DB, or
a ~/.pgpass file, on each node).

Ray is imported here only, and only when ``--ray`` is given (``pip install 'llm-job-runner[ray]'``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from runner import service
from runner.cluster.watch import refresh
from runner.engine.opening import plan_stages
from runner.engine.workers import lease_ttl
from runner.errors import RunnerError
from runner.processes import pid_alive
from runner.store import SQLiteStore, open_store

if TYPE_CHECKING:
    from runner.engine.run import View
    from runner.spec.schema import Job
    from runner.store import Store

#: how to install the extra, as the error says it
EXTRA = "pip install 'llm-job-runner[ray]'"
#: ``--ray`` without an address: RAY_ADDRESS's cluster when it is set, else a Ray started on this machine for the run
HERE = "local"
#: how many times Ray starts an actor's process again after it died (and calls ``work`` on it again)
RESTARTS = 3
#: seconds between two looks at the actors and the store while they run
POLL = 0.5
#: the Ray namespace of the actors, each named ``runner-RUN_ID-I-PID`` (I: its index, PID: the command's process)
NAMESPACE = "runner"


def import_ray() -> ModuleType:
    """Ray, or the one sentence that names the extra."""
    try:
        import ray
    except ImportError:
        raise RunnerError(f"--ray needs Ray, which is not installed here: {EXTRA}") from None
    return ray


class RunWorker:
    """One Ray actor: a process that works on a run beside the others, as ``runner work RUN_ID`` does."""

    def __init__(self, run_id: str, db: str | None) -> None:
        self.run_id = run_id
        #: the store; None: RUNNER_DB of the node's environment (a URL whose password was not sent)
        self.db = db

    def work(self) -> dict[str, Any]:
        """Join the run until its stages are done; what this process did, or the one sentence that stopped it."""
        try:
            store = open_store(self.db)
        except RunnerError as exc:
            return {"error": str(exc), "exit_code": exc.exit_code, "pid": os.getpid()}
        try:
            if store.get_run(self.run_id)["status"] == "completed":  # called again after a restart, too late
                return {"status": "completed", "message": None, "pid": os.getpid()}
            _, job = service.prepare_join(store, self.run_id)
            outcome = asyncio.run(service.join(job, store, self.run_id))
        except RunnerError as exc:
            return {"error": str(exc), "exit_code": exc.exit_code, "pid": os.getpid()}
        finally:
            store.close()
        totals = outcome.stats.totals()
        return {"status": outcome.status, "message": outcome.message, "pid": os.getpid(), "sent": totals.sent,
                "cache_hits": totals.cache_hits, "errors": totals.errors, "elsewhere": totals.elsewhere,
                "spend": totals.spend}


@dataclass
class RayOutcome:
    """How a run on Ray workers ended, as ``runner submit`` prints it (the fields of an engine ``Outcome`` it
    uses, and what each actor reported)."""

    run_id: str
    status: str
    message: str | None
    results: dict[str, Path] | None = None
    #: each actor's last report (:meth:`RunWorker.work`)
    reports: list[dict[str, Any]] = field(default_factory=list)
    #: the workers the store saw on the run: a restarted actor is a new one, its dead process another
    joined: int = 0


def check_workers(workers: int) -> int:
    if workers < 1:
        raise RunnerError(f"--workers must be 1 or more (got {workers})")
    return workers


def connect(ray: ModuleType, address: str, workers: int) -> bool:
    """Join the Ray cluster ``--ray`` names; True when this process started it (and so stops it)."""
    if ray.is_initialized():
        return False
    quiet: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR,
                             "namespace": NAMESPACE}
    try:
        if address == HERE and not os.environ.get("RAY_ADDRESS"):
            # a Ray of this machine with room for every worker (each asks for one CPU)
            ray.init(address="local", num_cpus=max(os.cpu_count() or 1, workers), **quiet)
            return True
        ray.init(address=None if address == HERE else address, **quiet)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = os.environ.get("RAY_ADDRESS") if address == HERE else address
        raise RunnerError(f"--ray: no Ray cluster answers at {where} ({' '.join(str(exc).split())[:200]}); start one "
                          "(`ray start --head`) or give its address (--ray HOST:6379, or ray://HOST:10001)") from None
    return False


def check_reach(ray: ModuleType, store: Store, address: str) -> None:
    """A SQLite file is seen by actors on this machine only: with a Ray cluster of several machines (or a Ray
    client connection, whose actors run on the cluster), one sentence asking for a shared store."""
    if not isinstance(store, SQLiteStore):
        return
    others = sorted({node["NodeManagerAddress"] for node in ray.nodes() if node.get("Alive")
                     and not _is_here(node["NodeManagerAddress"])})
    if address.startswith("ray://") or others:
        where = ", ".join(others) if others else address
        raise RunnerError(f"--ray: the store is a SQLite file ({store.path}), which Ray workers on other machines "
                          f"({where}) cannot open; give --db (or RUNNER_DB) a postgresql:// URL, or use a Ray of "
                          "this machine only (--ray without an address)")


def _is_here(address: str) -> bool:
    """Whether ``address`` is one of this machine's (a socket can be bound to it)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as probe:
            probe.bind((address, 0))
    except OSError:
        return False
    return True


def actor_store(store: Store, db: str | None) -> str | None:
    """The store as the actors open it: a SQLite file by its absolute path (an actor's working folder is Ray's),
    else ``db`` (None: their RUNNER_DB)."""
    if isinstance(store, SQLiteStore):
        return str(Path(store.path).resolve())
    return db


@contextmanager
def cluster(store: Store, address: str, workers: int) -> Iterator[ModuleType]:
    """The Ray cluster ``--ray`` names, joined (or started here, and stopped on the way out) and checked before the
    run is made: Ray installed, ``workers`` valid, the store within the actors' reach."""
    ray = import_ray()
    check_workers(workers)
    started = connect(ray, address, workers)
    try:
        check_reach(ray, store, address)
        yield ray
    finally:
        if started:
            ray.shutdown()


def run_on_ray(ray: ModuleType, job: Job, store: Store, run_id: str, *, db: str | None, workers: int,
               view: View) -> RayOutcome:
    """Start ``workers`` actors on run ``run_id`` of ``job`` (in :func:`cluster`) and wait for them, showing the
    run's progress; when none is left, the run's end is recorded (``service.conclude``) and its results files
    written here."""
    actor = ray.remote(max_restarts=RESTARTS, max_task_retries=RESTARTS)(RunWorker)
    actors = [actor.options(num_cpus=1, scheduling_strategy="SPREAD", namespace=NAMESPACE,
                            name=f"runner-{run_id}-{index}-{os.getpid()}").remote(run_id, actor_store(store, db))
              for index in range(workers)]
    _, stats, _ = plan_stages(job)

    async def watch() -> list[dict[str, Any]]:
        calls = {each.work.remote(): index for index, each in enumerate(actors)}
        reports: list[dict[str, Any]] = [{} for _ in actors]
        pending = list(calls)
        view.start(stats, f"run {run_id} · job {job.name} · {workers} Ray workers")
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=len(pending), timeout=0)
                for ref in ready:
                    reports[calls[ref]] = _report(ray, ref)
                refresh(stats, store, run_id)
                if pending:
                    await asyncio.sleep(POLL)
        finally:
            view.stop()
        return reports

    try:
        reports = asyncio.run(watch())
    except KeyboardInterrupt:
        for each in actors:
            ray.kill(each, no_restart=True)
        service.conclude(job, store, run_id, "interrupted", f"interrupted; `runner resume {run_id}` finishes it")
        raise
    let_go(store, run_id, lease_ttl())
    status, message = _verdict(reports)
    service.conclude(job, store, run_id, status, message, results=True)
    stored = store.get_run(run_id)
    if stored["status"] != "running":
        status, message = stored["status"], stored["message"]
    paths = {stage.name: job.results_path(stage, run_id) for stage in job.llm_stages()}
    return RayOutcome(run_id=run_id, status=status, message=message, results=paths, reports=reports,
                      joined=len(store.workers(run_id)))


def let_go(store: Store, run_id: str, ttl: float, *, poll: float = POLL) -> None:
    """Once every actor has returned, the run's workers gone without leaving (a process Ray killed or replaced near
    the end, before a peer's lease could declare it dead) let go of it, so that its end is recorded: with one of
    them still "live" in the store, the last actor did not mark the run completed and ``service.conclude`` would
    leave it "running" (shown as crashed). This machine's let go at once, as a resume does (their open reservations
    become possibly billed); another machine's are waited for until their heartbeat expires, at most ``ttl`` (the
    lease) and a poll, then resolved the same way. A live process of this machine (a ``runner work`` beside the
    actors) is at work: not waited for."""
    here = socket.gethostname()
    deadline = time.monotonic() + ttl + poll
    while True:
        elsewhere = False
        for worker in store.workers(run_id):
            if worker["state"] != "live":
                continue
            if worker["host"] != here:
                elsewhere = True
            elif not pid_alive(worker["pid"]):
                store.leave_run(worker["id"])
        if not elsewhere or time.monotonic() > deadline:
            break
        time.sleep(poll)
    for worker in store.dead_workers(run_id):
        store.resolve_worker(run_id, worker)


def _report(ray: ModuleType, ref: Any) -> dict[str, Any]:
    """An actor's report, or, for an actor Ray lost (its node gone, or its restarts spent), the sentence saying so
    with ``lost`` set. Ray 2.10 says a node gone as a system error ("Broken pipe", `.ci/run --oldest`), later ones
    as the actor's error; either way its work was taken over through the store (``_verdict``)."""
    try:
        return ray.get(ref)
    except (ray.exceptions.RayActorError, ray.exceptions.RaySystemError) as exc:
        reason = " ".join(str(exc).split())[:200]
        return {"error": f"a Ray worker died and was not started again (after {RESTARTS} restarts, or its node is "
                         f"gone): {reason}", "exit_code": 1, "lost": True}


def _verdict(reports: list[dict[str, Any]]) -> tuple[str, str | None]:
    """The run's status from its actors' reports: completed when every actor completed, or when the only ones
    that did not are actors Ray lost: an actor completes only once the store has every task of the run done or
    failed (``left_unanswered`` in runner/engine/run.py), the lost ones' included, which it took over when their
    leases ran out. Else the first error, or the first status that is not completed (budget_exhausted, failed,
    interrupted); failed when Ray lost every actor."""
    kept = [report for report in reports if not report.get("lost")]
    for report in kept:
        if "error" in report:
            return "failed", report["error"]
    for report in kept:
        if report.get("status") != "completed":
            return report.get("status", "failed"), report.get("message")
    if not kept:
        return "failed", reports[0]["error"]
    return "completed", None
