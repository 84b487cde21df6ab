"""The run service: what ``runner submit``, ``runner resume``, ``runner work`` and the Python API (runner/api.py) do
to start a run, written once so the front doors cannot drift. Each front door only turns its arguments into these
calls and says or returns what they give back:

1. :func:`load_job_file` (or the API's own dict and Job) gives the job;
2. :func:`apply_settings` puts ``--budget`` and ``--limit`` over the job's own; :func:`prepare_submit` estimates
   the job, refuses a worst case over the budget (unless allowed) and gathers the warnings;
   :func:`prepare_resume` and :func:`prepare_join` give the stored job of a run to finish or to join;
3. :func:`run` executes it (runner/engine/run.py);
4. :func:`summary_lines`, :func:`exit_code` and :func:`failure_line` say how it ended.

A run that processes share from the start (``--run-id``: a Slurm array's or a Kubernetes Indexed Job's tasks all
run the same command; ``--ray``: Ray actors) is opened by :func:`open_shared_run` (a named run's first process
creates it, the others find it by :func:`named_run`, the same job or one sentence) and worked on by :func:`join`,
each process as a worker of it; the last one to leave says how it ended (:func:`conclude`).

It sits beside the front doors, not in ``runner/engine/``, because it uses the estimate and the summary of
``runner/report/``, which read what the engine wrote.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner.engine import run as engine
from runner.engine.checks import (
    budget_warnings,
    check_before_sending,
    check_joinable,
    dataset_warnings,
    load_run_job,
)
from runner.engine.opening import plan_stages
from runner.errors import RunnerError, StoreError
from runner.processes import pid_alive
from runner.spec.overrides import set_budget
from runner.store import now
from runner.store.base import RunExists

if TYPE_CHECKING:
    from runner.engine.run import Outcome, View
    from runner.report.estimate import Estimate
    from runner.spec.schema import Job
    from runner.store import Store

#: a run's exit code by its status (any other status than these and ``completed``: 1)
EXIT_CODES = {"completed": 0, "interrupted": 130, "budget_exhausted": 3}


@dataclass(frozen=True)
class Wording:
    """How a front door names its settings in the sentences the service says."""

    #: the setting that starts a run whose worst case exceeds its budget anyway
    allow_partial: str
    #: how the refusal says to use it ("add --allow-partial", "pass allow_partial=True")
    give: str
    #: the setting that gives a run's budget, as the refusal names it
    budget: str
    #: the setting that keeps the first N items
    limit: str
    #: the setting that skips the pre-flight check of the endpoints
    no_check: str = "--no-check"


CLI = Wording(allow_partial="--allow-partial", give="add", budget="--budget", limit="--limit")
API = Wording(allow_partial="allow_partial=True", give="pass", budget="budget=", limit="limit=", no_check="check=False")


@dataclass
class Submission:
    """A new run's job, checked and estimated: what its front door shows before the run starts."""

    job: Job
    estimate: Estimate
    #: plan every request again instead of replaying an unchanged stage (``--replan``)
    replan: bool = False
    #: said before the run when it starts over its budget (``--allow-partial``)
    partial: str | None = None
    #: ``warning: ...`` lines: a dataset with no rows or an unnamed gold, a model without a price, no budget
    warnings: list[str] = field(default_factory=list)
    #: why the run may not start: its worst case exceeds its budget, and starting over it was not allowed
    refusal: RunnerError | None = None
    #: the models the pre-flight check probes: those with requests to send, and every model of a pipeline stage
    #: whose rows do not exist yet (a job answered wholly from the memo needs no endpoint)
    probe: list[str] = field(default_factory=list)

    def raise_if_refused(self) -> Submission:
        """Raise the refusal (:class:`~runner.report.estimate.OverBudget`, exit 2) when there is one; the CLI
        shows the estimate first."""
        if self.refusal is not None:
            raise self.refusal
        return self


def load_job_file(path: str | os.PathLike[str], vars: Mapping[str, str] | None = None) -> tuple[Job, Path | None]:
    """The job in a job file, with ``vars`` for its ``${name}``; and, when the path does not exist here but names a
    bundled job (``jobs/quickstart.yaml``), the bundled file that was loaded instead."""
    from runner.bundled import locate_job
    from runner.spec.job import load_job

    located, bundled = locate_job(path)
    return load_job(located, dict(vars or {})), located if bundled else None


@dataclass
class Validation:
    """What ``runner validate`` found in a job file: ``problems``, each one sentence (the job file's, then its
    datasets' rows'), and when there are none the job and the ``warnings`` a run of it would show about its data."""

    problems: list[str]
    job: Job | None
    warnings: list[str]
    #: the bundled job file read instead, when the path named one (``jobs/quickstart.yaml``)
    bundled: Path | None


def validate_job_file(path: str | os.PathLike[str], vars: Mapping[str, str] | None = None) -> Validation:
    """Every problem of a job file in one go: the file's own (every key, every ``${name}``) and, for each stage
    whose dataset can be read despite them, its rows' (a repeated id, a gold answer that is not one of the
    options, a row that cannot be read), each named with the dataset's file:line."""
    from runner.bundled import locate_job
    from runner.plan.stage import dataset_problems
    from runner.spec.job import examine_job

    located, bundled = locate_job(path)
    examined = examine_job(located, dict(vars or {}))
    problems = list(examined.problems)
    for dataset, choices, limit, cluster in examined.readable_datasets():
        found = dataset_problems(dataset, choices, limit, cluster=cluster)
        problems += [p for p in found if p not in problems]  # a file read twice
    job = examined.job if not problems else None
    if job is not None:  # what only the whole job can tell
        from runner.engine.checks import loglikelihood_problem

        if (problem := loglikelihood_problem(job)) is not None:
            problems.append(problem)
            job = None
        elif (problem := deadline_problem(job)) is not None:
            problems.append(problem)
            job = None
    return Validation(problems, job, dataset_warnings(job) if job is not None else [],
                      located if bundled else None)


def deadline_problem(job: Job, store: Store | None = None) -> str | None:
    """A deadline of the job that has passed or that no mode can meet (the estimate against ``store``, else an empty
    store: nothing cached), in one sentence; None without one."""
    if all(job.stage_deadline(stage) is None for stage in job.llm_stages()):
        return None
    from runner.report import estimate as estimates
    from runner.report.deadline import DeadlineMissed, check_deadlines
    from runner.store import open_store

    try:
        check_deadlines(job)
        own = store is None
        store = open_store(":memory:") if store is None else store
        try:
            check_deadlines(job, estimates.estimate(job, store).groups, store)
        finally:
            if own:
                store.close()
    except DeadlineMissed as exc:
        return str(exc)
    return None


def set_deadline(job: Job, text: str) -> None:
    """``--deadline``: the job's deadline over the file's (a stage's own still wins for that stage)."""
    from runner.spec.fields import deadline_seconds

    try:
        deadline_seconds(text, 0.0)
    except ValueError as exc:
        raise RunnerError(f"--deadline: {exc}") from None
    job.deadline = text


def check_limit(limit: int, option: str = "--limit") -> int:
    """A count setting (``--limit N``) must be at least 1."""
    if limit < 1:
        raise RunnerError(f"{option} must be 1 or more (got {limit})")
    return limit


def apply_settings(job: Job, *, budget: float | None = None, limit: int | None = None,
                   wording: Wording = CLI, deadline: str | None = None) -> Job:
    """``--budget``, ``--limit`` and ``--deadline`` over what the job file says (the job is changed in place, and
    returned)."""
    if deadline is not None:
        set_deadline(job, deadline)
    if budget is not None:
        set_budget(job, budget)
    if limit is not None:
        job.limit = check_limit(limit, wording.limit)
    return job


def prepare_submit(job: Job, store: Store, *, allow_partial: bool = False, replan: bool = False,
                   wording: Wording = CLI) -> Submission:
    """Estimate a new run of ``job`` and gather its warnings; when the worst case exceeds the budget, the refusal
    (unless ``allow_partial``) that :meth:`Submission.raise_if_refused` raises. Nothing is stored before the run
    starts."""
    from runner.report import estimate as estimates

    deadlines = any(job.stage_deadline(stage) is not None for stage in job.llm_stages())
    # Requests whose count needs a tokenizer not built yet are bounded, not counted (building o200k_base costs
    # more than the rest of the start): the worst case holds. A deadline's plan needs the counts, and a budget the
    # bound does not fit is decided by them.
    est = estimates.estimate(job, store, count_free=False, bound_only=not deadlines)
    cap = job.budget.usd if job.budget is not None else None
    if est.totals.get("input_bound_only") and cap is not None and est.high is not None and est.high > cap:
        est = estimates.estimate(job, store, count_free=False)
    if deadlines:
        from runner.report.deadline import check_deadlines

        check_deadlines(job, est.groups, store)  # passed, or no mode meets it: before anything is sent
    refusal = estimates.over_budget(est, cap, allow_partial=f"{wording.give} {wording.allow_partial}",
                                    budget=wording.budget)
    partial: str | None = None
    refused: RunnerError | None = None
    if refusal is not None and not allow_partial:
        refused = estimates.OverBudget(refusal)
    elif refusal is not None:
        partial = (f"{wording.allow_partial}: the budget ${cap:,.4f} covers part of the worst case; the "
                   "run stops when it is spent")
    warnings = [] if refused is not None else [*dataset_warnings(job), *budget_warnings(job)]
    return Submission(job=job, estimate=est, replan=replan, partial=partial, warnings=warnings, refusal=refused,
                      probe=models_to_send(job, est))


def models_to_send(job: Job, est: Estimate) -> list[str]:
    """The models an estimate says the run will send to: those with requests left, and those of the stages it could
    not plan (a pipeline's later stages)."""
    sending = {group.model for group in est.groups if group.to_send}
    planned = {group.stage for group in est.groups}
    for stage in job.llm_stages():
        if stage.name not in planned:
            sending.update(job.stage_models(stage))
    return sorted(sending)


def prepare_resume(store: Store, run_id: str, *, budget: float | None = None) -> tuple[dict[str, Any], Job]:
    """The run to finish and its job as it started (``budget`` over its own); refused while another process on
    this machine still runs it."""
    run, job = load_run_job(store, run_id)
    if budget is not None:
        set_budget(job, budget)
    if run["status"] == "running" and pid_alive(run["pid"]) and run["pid"] != os.getpid():
        raise RunnerError(f"run {run['id']} is still running (process {run['pid']}); stop it first")
    return run, job


def prepare_join(store: Store, run_id: str) -> tuple[dict[str, Any], Job]:
    """The run a worker joins, and its job (``runner work``)."""
    return load_run_job(store, run_id)


#: a run id a user gives (``--run-id``): it names the run's results folder, so no path separators
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_run_id(run_id: str, option: str = "--run-id") -> str:
    """A run id a user gives must be 1 to 64 letters, digits, dots, dashes or underscores."""
    if not RUN_ID.fullmatch(run_id):
        raise RunnerError(f"{option} {run_id!r} is not a run id: use 1 to 64 letters, digits, '.', '-' or '_', "
                          "starting with a letter or digit (e.g. --run-id \"eval-$SLURM_ARRAY_JOB_ID\")")
    return run_id


def named_run(store: Store, run_id: str, job: Job) -> dict[str, Any] | None:
    """The run whose id is exactly ``run_id`` (not a part of another's), or None; one sentence when it was started
    with another job than ``job`` (the job's content hash, after --budget, --limit and --var, differs)."""
    check_run_id(run_id)
    try:
        run = store.get_run(run_id)
    except StoreError:
        return None
    if run["id"] != run_id:  # get_run also finds a run by a part of its id
        return None
    if run["fingerprint"] != job.fingerprint():
        raise RunnerError(f"run {run_id} was started with another job ({run['job_name']}, content hash "
                          f"{run['fingerprint']}; this one: {job.name}, {job.fingerprint()}): give this job another "
                          "--run-id, or the same job file with the same --budget, --limit and --var")
    return run


def open_shared_run(job: Job, store: Store, run_id: str | None = None) -> tuple[dict[str, Any], bool]:
    """A new run of ``job`` for processes to join (``run_id`` when given, else a new id), and True; or, when
    another process created run ``run_id`` at the same moment with the same job, that run and False. Each process
    then works on it with :func:`join`, so the job must be one workers can share (``check_joinable``)."""
    check_joinable(job)
    _, _, total = plan_stages(job)
    row = (job.name, job.path, job.model_dump_json(), job.fingerprint(), total)
    if run_id is None:
        created = store.create_run(*row)
    else:
        try:
            created = store.create_run(*row, run_id=run_id)
        except RunExists:
            found = named_run(store, run_id, job)
            assert found is not None
            return found, False
    seconds = job.deadline_seconds()
    if seconds is not None:  # as a run one process starts (runner/engine/opening.py)
        store.set_run(created, deadline=(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)).isoformat())
    return store.get_run(created), True


async def join(job: Job, store: Store, run_id: str, *, view: View | None = None) -> Outcome:
    """Work on ``run_id`` beside the other processes on it (``runner work``, each task of a named run, each Ray
    actor), then :func:`conclude`."""
    outcome = await run(job, store, run_id=run_id, join=True, view=view)
    conclude(job, store, run_id, outcome.status, outcome.message)
    return outcome


def conclude(job: Job, store: Store, run_id: str, status: str, message: str | None, *,
             results: bool = False) -> None:
    """After a worker left ``run_id``, when no process is left on it: a run still running gets this worker's status
    (the engine marks a joined run only completed, and only when no peer is live then), and a completed run
    that one process did alone, or whose workers ran elsewhere (``results``), or a run its budget stopped, gets its
    results files written here from the store (no process of a named run, nor a worker, keeps a live file; the first
    process's, if it died, lacks what the others did). A results file that cannot be written fails the run, which
    a resume then finishes, as when the engine's own files fail (:class:`runner.errors.OutputError`)."""
    workers = store.workers(run_id)
    if any(worker["state"] == "live" for worker in workers):
        return
    stored = store.get_run(run_id)
    if stored["status"] == "running" and status == "completed":
        # this worker completed, but a peer was still live when its engine ended (a process gone without
        # leaving, let go of since: runner/cluster/ray_workers.py): the run is completed, not left running
        store.set_run(run_id, status=status, message=message, finished=now(), pid=None)
        stored = {**stored, "status": status}
    write = (stored["status"] == "completed" and (results or len(workers) <= 1)
             or stored["status"] in ("running", "budget_exhausted") and status == "budget_exhausted")
    if stored["status"] == "running" and status != "completed":
        store.set_run(run_id, status=status, message=message, finished=now(), pid=None)
    if write:
        files = engine.Results(job, run_id, store)
        files.close(rewrite=True)
        if files.failure is not None:
            store.set_run(run_id, status="failed", message=str(files.failure), finished=now(), pid=None)
            raise files.failure


async def run(job: Job, store: Store, *, run_id: str | None = None, join: bool = False, replan: bool = False,
              view: View | None = None, on_run_id: Callable[[str], None] | None = None, check: bool = True,
              probe: Sequence[str] | None = None, wording: Wording = CLI) -> Outcome:
    """Execute a new run of ``job``, resume ``run_id``, or (``join``) work on it beside other processes. A new run
    first passes the checks that need no request, then (``check``) the pre-flight probe of the endpoints of
    ``probe`` (:attr:`Submission.probe`; None: every model of the job), see :func:`preflight`."""
    if check and run_id is None and not join:
        await preflight(job, probe, wording)
    return await engine.execute(job, store, run_id=run_id, view=view, on_run_id=on_run_id, reuse=not replan,
                                join=join)


async def preflight(job: Job, models: Sequence[str] | None = None, wording: Wording = CLI) -> None:
    """Before a new run: the checks that need no request (keys, SDKs, prices, folders: raised as the run raises
    them), then one probe of each of ``models``' endpoints (every model of the job when None; runner/preflight.py),
    concurrently and within seconds; ``PreflightFailed`` with every failure, before the run row exists and before
    any paid request."""
    from runner import preflight as probes

    check_before_sending(job)
    if models is None or models:
        await probes.require(job, models, skip=wording.no_check)


def summary_lines(store: Store, run_id: str) -> list[str]:
    """The accuracy and cost lines a run ends with (``runner submit``, ``RunResult.summary``)."""
    from runner.report import summary as reports

    return list(reports.summary_lines(reports.build(store, run_id)))


def exit_code(status: str) -> int:
    """The exit code of a run that ended with ``status``: 0 completed, 3 stopped by its budget, 130 interrupted,
    1 otherwise."""
    return EXIT_CODES.get(status, 1)


def failure_line(run_id: str, status: str, message: str | None, *, resumable: bool = True) -> str | None:
    """The ``Error:`` line of a run that did not complete (None when it completed or was interrupted: Ctrl-C says
    so itself); ``resumable``: say that ``runner resume`` continues a failed run once the cause is fixed."""
    if status in ("completed", "interrupted"):
        return None
    if status == "budget_exhausted":
        return f"Error: run {run_id} stopped: {message}"
    if resumable:
        return f"Error: run {run_id} {status}: {message}; `runner resume {run_id}` continues it once that is fixed"
    return f"Error: run {run_id} {status}: {message}"
