"""The commands that run a job: ``runner submit``, ``runner resume`` and ``runner work``, with the printing of named
runs and Ray workers. The work is in runner/service.py and runner/cluster/; the ``--ray`` and ``--workers``
options in runner/cli/cluster.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from runner.cli.cluster import RayCommand, RayOption, WorkersOption, check_ray, ray_cluster
from runner.cli.common import (
    BudgetOption,
    DbOption,
    DeadlineOption,
    LimitOption,
    VarOption,
    has_password,
    later,
    load_job,
    open_db,
    say,
    service,
)

if TYPE_CHECKING:
    from types import ModuleType

    from runner.engine.run import Outcome
    from runner.spec.schema import Job
    from runner.store import Store

asyncio = later("asyncio")
estimate_views = later("runner.report.estimate_render")
progress = later("runner.report.progress")

__all__ = ["register", "resume", "submit", "work"]


def register(app: typer.Typer) -> None:
    app.command(cls=RayCommand)(submit)
    app.command()(resume)
    app.command(cls=RayCommand)(work)


def _run(job: Job, store: Store, run_id: str | None = None, replan: bool = False,
         probe: list[str] | None = None) -> None:
    """Run (or resume) with the live view, then print the summary and exit with the run's status; a new run first
    probes the endpoints of ``probe`` (none when empty)."""
    started = (lambda rid: say(f"run {rid}: started job {job.name}")) if run_id is None else None
    outcome = asyncio.run(service.run(job, store, run_id=run_id, replan=replan, view=progress.make_view(),
                                      on_run_id=started, probe=probe or []))
    for line in service.summary_lines(store, outcome.run_id):
        say(line)
    for stage, path in (outcome.results or {}).items():
        say(f"results: {stage} -> {path}")
    _end(outcome)


def _end(outcome: Outcome, *, resumable: bool = True) -> None:
    """The run's last line, its ``Error:`` line when it did not complete, and its exit code."""
    say(f"run {outcome.run_id}: {outcome.status}" + (f" ({outcome.message})" if outcome.message else ""))
    error = service.failure_line(outcome.run_id, outcome.status, outcome.message, resumable=resumable)
    if error is not None:
        say(error, err=True)
    if code := service.exit_code(outcome.status):
        raise typer.Exit(code)


def _work_on(job: Job, store: Store, run_id: str, *, summary: bool = False) -> None:
    """This process as a worker of ``run_id`` (``runner work``, a task of a named run): its share, then the run's
    end lines (with ``summary``: the accuracy and cost lines and the results files once the run completed)."""
    outcome = asyncio.run(service.join(job, store, run_id, view=progress.make_view()))
    totals = outcome.stats.totals()
    say(f"this worker: {totals.sent} sent, {totals.cache_hits} cache hits, {totals.errors} failed, "
        f"{totals.elsewhere} done by other workers; ${totals.spend:,.4f}")
    if summary and outcome.status == "completed":
        _summary(store, outcome.run_id, outcome.results)
    _end(outcome, resumable=False)


def _summary(store: Store, run_id: str, results: dict[str, Path] | None) -> None:
    for line in service.summary_lines(store, run_id):
        say(line)
    for stage, path in (results or {}).items():
        say(f"results: {stage} -> {path}")


def _on_ray(cluster: ModuleType, job: Job, store: Store, db: str | None, run_id: str, workers: int | None) -> None:
    """The run's workers as Ray actors (runner/cluster/ray_workers.py); the run's end lines once they are done."""
    from runner.cluster import ray_workers

    # a password is not sent to the actors: they read RUNNER_DB (or ~/.pgpass) where they run
    outcome = ray_workers.run_on_ray(cluster, job, store, run_id, db=None if db and has_password(db) else db,
                                     workers=2 if workers is None else workers, view=progress.make_view())
    done = [report for report in outcome.reports if "sent" in report]
    say(f"ray: {len(outcome.reports)} workers ({outcome.joined} processes joined the run): "
        f"{sum(r['sent'] for r in done)} sent, {sum(r['cache_hits'] for r in done)} cache hits, "
        f"{sum(r['errors'] for r in done)} failed; ${sum(r['spend'] for r in done):,.4f}")
    lost = [report for report in outcome.reports if report.get("lost")]
    if lost and outcome.status == "completed":
        say(f"ray: {len(lost)} worker{'s' if len(lost) > 1 else ''} lost ({lost[0]['error']}); the others took "
            "over its work")
    if outcome.status == "completed":
        _summary(store, run_id, outcome.results)
    _end(outcome, resumable=True)  # type: ignore[arg-type]


def _shared(job: Job, store: Store, db: str | None, run_id: str | None, ray: str | None, workers: int | None, *,
            allow_partial: bool, no_check: bool) -> None:
    """``submit --run-id`` and ``submit --ray``: the first process of a named run estimates, checks and creates it,
    the others find it (the same job, or one sentence) and join it; with --ray, Ray actors do the work."""
    run = service.named_run(store, run_id, job) if run_id is not None else None
    if run is not None and run["status"] == "completed":
        say(f"run {run_id}: already completed (job {run['job_name']}); `runner report {run_id}` shows it")
        return
    if run is None:
        submission = _announce(service.prepare_submit(job, store, allow_partial=allow_partial))
        asyncio.run(service.preflight(job, [] if no_check else submission.probe))
    with ray_cluster(store, ray, workers) as cluster:
        created = False
        if run is None:
            run, created = service.open_shared_run(job, store, run_id)
        if created:
            say(f"run {run['id']}: started job {job.name}")
        if cluster is not None:
            return _on_ray(cluster, job, store, db, run["id"], workers)
    if not created:
        say(f"run {run['id']}: joining job {job.name} as a worker")
    _work_on(job, store, run["id"], summary=True)


def _announce(submission: service.Submission) -> service.Submission:
    """A new run's estimate, then its refusal (exit 2), its --allow-partial line and its warnings."""
    for line in estimate_views.summary_lines(submission.estimate):
        say(line)
    submission.raise_if_refused()
    if submission.partial is not None:
        say(submission.partial, err=True)
    for line in submission.warnings:
        say(line, err=True)
    return submission


def submit(
    job_file: Annotated[Path, typer.Argument(metavar="JOB_FILE", help="The job YAML file.")],
    db: DbOption = None,
    budget: BudgetOption = None,
    limit: LimitOption = None,
    var: VarOption = None,
    deadline: DeadlineOption = None,
    allow_partial: Annotated[bool, typer.Option(
        "--allow-partial", help="Start even when the estimate's worst case exceeds the budget; the run stops when "
        "the budget is spent (`runner resume RUN_ID --budget USD` continues it).")] = False,
    replan: Annotated[bool, typer.Option(
        "--replan", help="Plan every request again, even of a stage unchanged since a run that finished it "
        "(answers still come from the cache); by default such a stage is copied from that run whole.")] = False,
    no_check: Annotated[bool, typer.Option(
        "--no-check", help="Send without first probing each model's endpoint (`runner check`), e.g. for a server "
        "whose models list is flaky.")] = False,
    run_id: Annotated[str | None, typer.Option(
        "--run-id", help="Name the run (letters, digits, . - _): the first process given this name creates the run, "
        "every other one with the same job joins it as a worker (the same command for every task of a Slurm array "
        "or a Kubernetes Indexed Job; a different job under that name is refused), and once it has completed, "
        "says so and exits 0.", show_default=False)] = None,
    ray: RayOption = None,
    workers: WorkersOption = None,
) -> None:
    """Validate a job file, estimate its cost, probe each model's endpoint, and run it; print accuracy and cost at
    the end. Refuses (exit 2) when the estimate's worst case exceeds the run's budget, unless --allow-partial; stops
    (exit 1) before any request when an endpoint is unreachable, refuses its key or does not know the model."""
    job = service.apply_settings(load_job(job_file, var), budget=budget, limit=limit, deadline=deadline)
    check_ray(ray, workers, "start more processes with the same --run-id")
    if run_id is not None:
        service.check_run_id(run_id)
    store = open_db(db)
    if run_id is not None or ray is not None:
        return _shared(job, store, db, run_id, ray, workers, allow_partial=allow_partial, no_check=no_check)
    submission = _announce(service.prepare_submit(job, store, allow_partial=allow_partial, replan=replan))
    _run(submission.job, store, replan=submission.replan, probe=[] if no_check else submission.probe)


def resume(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="The run to finish (see `runner runs`).")],
    db: DbOption = None,
    budget: BudgetOption = None,
) -> None:
    """Finish an interrupted, crashed or budget-exhausted run: completed requests come from the store, the rest
    are sent."""
    store = open_db(db)
    run, job = service.prepare_resume(store, run_id, budget=budget)
    say(f"run {run['id']}: resuming job {job.name}")
    _run(job, store, run_id=run["id"])


def work(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID",
                                          help="The run to join (see `runner runs`; a --run-id name too).")],
    db: DbOption = None,
    ray: RayOption = None,
    workers: WorkersOption = None,
) -> None:
    """Join a run from another process or machine that shares its store (a postgresql:// URL, or the same SQLite
    file): take the chunks of its stages no live worker holds, send them, and take over those of workers that
    stopped. Requests are never sent twice across workers, and the run's budget holds across all of them. With
    --ray, Ray actors join it instead of this process."""
    check_ray(ray, workers, "start more `runner work` processes")
    store = open_db(db)
    run, job = service.prepare_join(store, run_id)
    with ray_cluster(store, ray, workers) as cluster:
        if cluster is not None:
            return _on_ray(cluster, job, store, db, run["id"], workers)
    say(f"run {run['id']}: joining job {job.name} as a worker")
    _work_on(job, store, run["id"])
