"""The commands that read a job file before a run: ``runner check`` (each endpoint probed), ``runner estimate``
(the cost, runner/report/estimate.py, and with --detect or --halfwidth the items a comparison needs,
runner/report/sizing.py) and ``runner validate`` (the file and its datasets' rows)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from runner.cli.common import (
    DbOption,
    DeadlineOption,
    LimitOption,
    VarOption,
    check_format,
    emit,
    later,
    load_job,
    open_db,
    say,
    service,
    var_values,
)
from runner.errors import RunnerError

checks = later("runner.engine.checks")
asyncio = later("asyncio")
estimates = later("runner.report.estimate")
estimate_views = later("runner.report.estimate_render")
sizes = later("runner.report.sizing")
tables = later("runner.report.tables")
problems = later("runner.spec.problems")

__all__ = ["check", "estimate", "register", "validate"]


def register(app: typer.Typer) -> None:
    app.command()(check)
    app.command()(estimate)
    app.command()(validate)


def check(
    job_file: Annotated[Path, typer.Argument(metavar="JOB_FILE", help="The job YAML file.")],
    var: VarOption = None,
    timeout: Annotated[float | None, typer.Option(
        "--timeout", help="Seconds each endpoint may take to answer (default: RUNNER_CHECK_TIMEOUT or 3).",
        show_default=False)] = None,
) -> None:
    """Ask each model's endpoint once (a pooled model's: each endpoint of its pool), with its cheapest call (a model
    lookup or models list, never a paid request), and print one line per model or endpoint: ok, or what is wrong
    (unreachable, key refused, unknown model, missing key or SDK). Exit 1 when any failed."""
    from runner import preflight

    job = load_job(job_file, var)
    results = asyncio.run(preflight.probe_models(job, timeout=timeout))
    for line in preflight.lines(results):
        say(line)
    if not all(probe.ok for probe in results):
        raise typer.Exit(1)


def estimate(
    job_file: Annotated[Path, typer.Argument(metavar="JOB_FILE", help="The job YAML file.")],
    db: DbOption = None,
    fmt: Annotated[str, typer.Option("--format", help="text, json, csv or md.")] = "text",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file.")] = None,
    limit: LimitOption = None,
    var: VarOption = None,
    deadline: DeadlineOption = None,
    detect: Annotated[float | None, typer.Option(
        help="Also say how many items it takes to detect this difference of accuracy between each pair of a "
             "stage's models (0.02: two points), and their cost.")] = None,
    halfwidth: Annotated[float | None, typer.Option(
        help="Also say how many items it takes to know each model's accuracy to within this (0.02: two points).")
    ] = None,
    power: Annotated[float, typer.Option(help="The power --detect asks for.")] = 0.8,
    alpha: Annotated[float, typer.Option(help="The two-sided level of --detect and --halfwidth.")] = 0.05,
    pilot: Annotated[str | None, typer.Option(
        help="A run of this job whose scores give the spread --detect and --halfwidth assume (else stated "
             "defaults).")] = None,
) -> None:
    """Before a run, per stage and model: requests, cache hits, input tokens, output tokens (max and expected from
    history), and the cost range of what is left to send (and at Batch API prices). Needs no API key. With
    --detect or --halfwidth, also how many items the comparison or the accuracy needs, and what they cost."""
    check_format(fmt, estimate_views.FORMATS)
    sizing_asked = detect is not None or halfwidth is not None
    if sizing_asked:
        sizes.check_settings(detect=detect, halfwidth=halfwidth, alpha=alpha, power_=power)
        if fmt == "csv":
            raise RunnerError("--detect and --halfwidth print text, json or md, not csv")
    job = service.apply_settings(load_job(job_file, var), limit=limit, deadline=deadline)
    checks.check_loglikelihood(job)  # as submit refuses it: no estimate of what would not be sent
    store = open_db(db)
    found = estimates.estimate(job, store)
    text = estimate_views.render(found, fmt)
    if sizing_asked:
        sized = sizes.sizing(job, found, store, detect=detect, halfwidth=halfwidth, alpha=alpha, power_=power,
                             pilot=pilot)
        if fmt == "json":
            text = tables.json_text({"estimate": found.as_dict(), "sizing": sized.as_dict()})
        else:
            text += "\n" + sizes.render(sized, fmt)
    emit(text, output, fmt)


def validate(job_file: Annotated[Path, typer.Argument(metavar="JOB_FILE", help="The job YAML file.")],
             var: VarOption = None) -> None:
    """Only validate a job file and the rows of its datasets, saying every problem found in one go (the file's
    file:line and key; a dataset's file:line: a repeated id, a gold answer that is not one of the options). Exit 2
    when there is any."""
    found = service.validate_job_file(job_file, var_values(var))
    if found.bundled is not None:
        say(f"using the bundled {job_file} ({found.bundled})", err=True)
    if found.problems:
        raise problems.JobFileProblems(job_file, found.problems)
    job = found.job
    assert job is not None  # a job without problems is built
    stages = ", ".join(f"{s.name} ({len(job.stage_models(s))} model(s))" if s.is_llm else f"{s.name} "
                       f"({s.data_ops()[0]})" for s in job.stages)
    say(f"{job_file}: valid job {job.name!r}: {stages}")
    for line in found.warnings:
        say(line, err=True)
