"""The ``runner`` command: submit, check, estimate, validate, resume, work, runs, report, compare, costs, sim
(and explain, from runner/cli_costs.py).

About 560 lines, over the ~450 aimed at: eleven commands, each only its arguments and its printing, with the
printing of named runs and Ray workers (the work is in runner/service.py and runner/cluster/; the --ray and
--workers options in runner/cli_cluster.py).

Every error a user can cause ends in ``Error: <one sentence>`` on stderr and a non-zero exit (2 for a job
file that does not validate or a submit whose worst case exceeds its budget, 1 otherwise), never a traceback.
``RUNNER_RAISE_ERRORS=1`` shows tracebacks of unexpected errors, for bug reports.

Every line printed here goes through :func:`_say`, which drops terminal control sequences
(:mod:`runner.report.terminal`): an error or a run's message can quote a provider's error body, and a job's names
and dataset fields reach warnings. Reports printed whole in text or md are cleaned the same way (``_emit``).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

try:  # typer ≥ 0.22 carries its own copy of click
    from typer._click import exceptions as click_errors
    from typer.exceptions import Abort
except ImportError:  # an older typer runs on click itself
    from click import exceptions as click_errors  # type: ignore[no-redef]
    from click.exceptions import Abort  # type: ignore[assignment]

from runner import service
from runner.cli_cluster import RayCommand, RayOption, WorkersOption, check_ray, ray_cluster
from runner.errors import RunnerError
from runner.report import estimate as estimates
from runner.report.progress import make_view
from runner.report.terminal import clean
from runner.spec.schema import Job
from runner.store import Store, open_store

if TYPE_CHECKING:
    from types import ModuleType

    from runner.engine.run import Outcome

#: raise an unexpected error (a bug) instead of printing it in one line: what RUNNER_RAISE_ERRORS=1 does, for a
#: program that calls main() in its own process and wants the traceback (the test suite sets it)
RAISE_UNEXPECTED = False

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Run LLM API jobs from YAML files: cached, resumable, with live progress and cost reports.",
)

def _print_version(asked: bool) -> None:
    """``runner --version``: the version naming the commit that runs (runner/version.py), then exit."""
    if asked:
        from runner.version import version

        typer.echo(f"runner {version()}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print the runner's version (the git commit it runs), exit.")] = False,
) -> None:
    pass


DbOption = Annotated[
    str | None,
    typer.Option("--db", help="The store: a SQLite file, or a postgresql://user@host/db URL shared by several "
                 "processes and machines (default: RUNNER_DB or ./cache.sqlite).", show_default=False),
]

EXIT_INTERRUPTED = 130


def _say(message: object, *, err: bool = False) -> None:
    """Print one message (to stderr with ``err``) without the control sequences text from outside may carry."""
    typer.echo(clean(message, newlines=True), err=err)


#: the store this command opened, so that an error of it outside a run is said as the store says it (main)
_opened: list[Store] = []


def _store(db: str | None) -> Store:
    """The store ``--db`` names (or RUNNER_DB, or cache.sqlite). A password in ``--db`` can be read by anyone on
    the machine (in `ps`, and in the shell's history): said once, without the password."""
    if db and _has_password(db) and not _opened:
        _say("warning: --db carries a password, which other users of this machine can see in `ps`: put the URL in "
             "RUNNER_DB instead (export RUNNER_DB=postgresql://...), or use a ~/.pgpass file", err=True)
    store = open_store(db)
    _opened.append(store)
    return store


def _has_password(db: str) -> bool:
    """Whether a store URL carries a password (``user:password@`` or a ``password=`` parameter)."""
    from urllib.parse import parse_qsl, urlsplit

    if "://" not in db:
        return False
    try:
        parts = urlsplit(db)
        return bool(parts.password) or any(k == "password" and v for k, v in parse_qsl(parts.query))
    except ValueError:
        return "@" in db and ":" in db.split("://", 1)[1].split("@", 1)[0]


def _run(job: Job, store: Store, run_id: str | None = None, replan: bool = False,
         probe: list[str] | None = None) -> None:
    """Run (or resume) with the live view, then print the summary and exit with the run's status; a new run first
    probes the endpoints of ``probe`` (none when empty)."""
    started = (lambda rid: _say(f"run {rid}: started job {job.name}")) if run_id is None else None
    outcome = asyncio.run(service.run(job, store, run_id=run_id, replan=replan, view=make_view(), on_run_id=started,
                                      probe=probe or []))
    for line in service.summary_lines(store, outcome.run_id):
        _say(line)
    for stage, path in (outcome.results or {}).items():
        _say(f"results: {stage} -> {path}")
    _end(outcome)


def _end(outcome: Outcome, *, resumable: bool = True) -> None:
    """The run's last line, its ``Error:`` line when it did not complete, and its exit code."""
    _say(f"run {outcome.run_id}: {outcome.status}" + (f" ({outcome.message})" if outcome.message else ""))
    error = service.failure_line(outcome.run_id, outcome.status, outcome.message, resumable=resumable)
    if error is not None:
        _say(error, err=True)
    if code := service.exit_code(outcome.status):
        raise typer.Exit(code)


LimitOption = Annotated[
    int | None,
    # no min=: click would print a boxed usage error; service.check_limit says it in one line
    typer.Option("--limit", help="Only the first N items of every stage's dataset (a slice to try a job).",
                 show_default=False),
]

BudgetOption = Annotated[
    float | None,
    # no min=: set_budget refuses a budget of 0 or less in one line
    typer.Option("--budget", help="The run's budget in USD (over the job file's budget.usd).",
                 show_default=False),
]


VarOption = Annotated[
    list[str] | None,
    typer.Option("--var", help="NAME=VALUE: a value for ${NAME} in the job file, over its vars: (repeatable).",
                 show_default=False),
]


def _load(job_file: Path, var: list[str] | None) -> Job:
    """Load a job file; a path that does not exist here but names a bundled job (``jobs/quickstart.yaml``) loads
    that one, and says so."""
    job, bundled = service.load_job_file(job_file, _vars(var))
    if bundled is not None:
        _say(f"using the bundled {job_file} ({bundled})", err=True)
    return job


def _vars(values: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values or []:
        name, sep, text = value.partition("=")
        if not sep or not name.strip():
            raise RunnerError(f"--var {value!r}: write it as NAME=VALUE")
        out[name.strip()] = text
    return out


def _work_on(job: Job, store: Store, run_id: str, *, summary: bool = False) -> None:
    """This process as a worker of ``run_id`` (``runner work``, a task of a named run): its share, then the run's
    end lines (with ``summary``: the accuracy and cost lines and the results files once the run completed)."""
    outcome = asyncio.run(service.join(job, store, run_id, view=make_view()))
    totals = outcome.stats.totals()
    _say(f"this worker: {totals.sent} sent, {totals.cache_hits} cache hits, {totals.errors} failed, "
         f"{totals.elsewhere} done by other workers; ${totals.spend:,.4f}")
    if summary and outcome.status == "completed":
        _summary(store, outcome.run_id, outcome.results)
    _end(outcome, resumable=False)


def _summary(store: Store, run_id: str, results: dict[str, Path] | None) -> None:
    for line in service.summary_lines(store, run_id):
        _say(line)
    for stage, path in (results or {}).items():
        _say(f"results: {stage} -> {path}")


def _on_ray(cluster: ModuleType, job: Job, store: Store, db: str | None, run_id: str, workers: int | None) -> None:
    """The run's workers as Ray actors (runner/cluster/ray_workers.py); the run's end lines once they are done."""
    from runner.cluster import ray_workers

    # a password is not sent to the actors: they read RUNNER_DB (or ~/.pgpass) where they run
    outcome = ray_workers.run_on_ray(cluster, job, store, run_id, db=None if db and _has_password(db) else db,
                                     workers=2 if workers is None else workers, view=make_view())
    done = [report for report in outcome.reports if "sent" in report]
    _say(f"ray: {len(outcome.reports)} workers ({outcome.joined} processes joined the run): "
         f"{sum(r['sent'] for r in done)} sent, {sum(r['cache_hits'] for r in done)} cache hits, "
         f"{sum(r['errors'] for r in done)} failed; ${sum(r['spend'] for r in done):,.4f}")
    if outcome.status == "completed":
        _summary(store, run_id, outcome.results)
    _end(outcome, resumable=True)  # type: ignore[arg-type]


def _shared(job: Job, store: Store, db: str | None, run_id: str | None, ray: str | None, workers: int | None, *,
            allow_partial: bool, no_check: bool) -> None:
    """``submit --run-id`` and ``submit --ray``: the first process of a named run estimates, checks and creates it,
    the others find it (the same job, or one sentence) and join it; with --ray, Ray actors do the work."""
    run = service.named_run(store, run_id, job) if run_id is not None else None
    if run is not None and run["status"] == "completed":
        _say(f"run {run_id}: already completed (job {run['job_name']}); `runner report {run_id}` shows it")
        return
    if run is None:
        submission = _announce(service.prepare_submit(job, store, allow_partial=allow_partial))
        asyncio.run(service.preflight(job, [] if no_check else submission.probe))
    with ray_cluster(store, ray, workers) as cluster:
        created = False
        if run is None:
            run, created = service.open_shared_run(job, store, run_id)
        if created:
            _say(f"run {run['id']}: started job {job.name}")
        if cluster is not None:
            return _on_ray(cluster, job, store, db, run["id"], workers)
    if not created:
        _say(f"run {run['id']}: joining job {job.name} as a worker")
    _work_on(job, store, run["id"], summary=True)


def _announce(submission: service.Submission) -> service.Submission:
    """A new run's estimate, then its refusal (exit 2), its --allow-partial line and its warnings."""
    for line in estimates.summary_lines(submission.estimate):
        _say(line)
    submission.raise_if_refused()
    if submission.partial is not None:
        _say(submission.partial, err=True)
    for line in submission.warnings:
        _say(line, err=True)
    return submission


@app.command(cls=RayCommand)
def submit(
    job_file: Annotated[Path, typer.Argument(help="The job YAML file.")],
    db: DbOption = None,
    budget: BudgetOption = None,
    limit: LimitOption = None,
    var: VarOption = None,
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
    job = service.apply_settings(_load(job_file, var), budget=budget, limit=limit)
    check_ray(ray, workers, "start more processes with the same --run-id")
    if run_id is not None:
        service.check_run_id(run_id)
    store = _store(db)
    if run_id is not None or ray is not None:
        return _shared(job, store, db, run_id, ray, workers, allow_partial=allow_partial, no_check=no_check)
    submission = _announce(service.prepare_submit(job, store, allow_partial=allow_partial, replan=replan))
    _run(submission.job, store, replan=submission.replan, probe=[] if no_check else submission.probe)


@app.command()
def check(
    job_file: Annotated[Path, typer.Argument(help="The job YAML file.")],
    var: VarOption = None,
    timeout: Annotated[float | None, typer.Option(
        "--timeout", help="Seconds each endpoint may take to answer (default: RUNNER_CHECK_TIMEOUT or 3).",
        show_default=False)] = None,
) -> None:
    """Ask each model's endpoint once, with its cheapest call (a model lookup or models list, never a paid
    request), and print one line per model: ok, or what is wrong (unreachable, key refused, unknown model, missing
    key or SDK). Exit 1 when any failed."""
    from runner import preflight

    job = _load(job_file, var)
    results = asyncio.run(preflight.probe_models(job, timeout=timeout))
    for line in preflight.lines(results):
        _say(line)
    if not all(probe.ok for probe in results):
        raise typer.Exit(1)


@app.command()
def estimate(
    job_file: Annotated[Path, typer.Argument(help="The job YAML file.")],
    db: DbOption = None,
    fmt: Annotated[str, typer.Option("--format", help="text, json, csv or md.")] = "text",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file.")] = None,
    limit: LimitOption = None,
    var: VarOption = None,
) -> None:
    """Before a run, per stage and model: requests, cache hits, input tokens, output tokens (max and expected from
    history), and the cost range of what is left to send (and at Batch API prices). Needs no API key."""
    if fmt not in estimates.FORMATS:
        raise RunnerError(f"--format must be one of {', '.join(estimates.FORMATS)}, not {fmt!r}")
    job = _load(job_file, var)
    if limit is not None:
        job.limit = service.check_limit(limit)
    text = estimates.render(estimates.estimate(job, _store(db)), fmt)
    _emit(text, output, fmt)


@app.command()
def costs(
    run: Annotated[str | None, typer.Argument(help="A finished run to re-price (see `runner runs`); without it, spend "
                                              "across runs.", show_default=False)] = None,
    as_models: Annotated[list[str] | None, typer.Option("--as", help="Re-price RUN's requests on this model "
                                                        "(repeatable).", show_default=False)] = None,
    batch: Annotated[bool, typer.Option("--batch", help="Re-price RUN at Batch API prices.")] = False,
    cached: Annotated[bool, typer.Option("--cached", help="Re-price RUN with provider prompt caching.")] = False,
    db: DbOption = None,
    since: Annotated[str | None, typer.Option(help="Only spend from this day on (YYYY-MM-DD, UTC).",
                                              show_default=False)] = None,
    by: Annotated[str, typer.Option(help="Group by model, job or day (UTC).")] = "model",
    fmt: Annotated[str, typer.Option("--format", help="text, json, csv or md.")] = "text",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file.")] = None,
) -> None:
    """Spend across runs, from the ledger: per model, job or day, the runs, requests charged, USD charged, USD
    possibly billed (requests in flight when a run was killed) and the money saved by cache hits. With RUN: that
    run's requests re-priced (--as another model, --batch, --cached) beside what was paid."""
    from runner.report import costs as cost_sums  # imported by the command that uses it: a leaner start

    if fmt not in cost_sums.FORMATS:
        raise RunnerError(f"--format must be one of {', '.join(cost_sums.FORMATS)}, not {fmt!r}")
    if run is not None or as_models or batch or cached:
        from runner.report import whatif

        text = whatif.render(whatif.build(_store(db), cost_sums.whatif_run(run, since, by), as_models=as_models,
                                          batch=batch, cached=cached), fmt)
        return _emit(text, output, fmt)
    data = cost_sums.build(_store(db), by=by, since=since)
    _emit(cost_sums.render(data, fmt), output, fmt)


def _emit(text: str, output: Path | None, fmt: str = "text") -> None:
    """A rendered report to ``output``, or to stdout: text and md without control sequences (JSON and CSV keep
    their own escaping)."""
    if output:
        output.write_text(text, encoding="utf-8")
        _say(f"wrote {output}")
    else:
        typer.echo(clean(text, newlines=True) if fmt in ("text", "md") else text, nl=False)


@app.command()
def validate(job_file: Annotated[Path, typer.Argument(help="The job YAML file.")], var: VarOption = None) -> None:
    """Only validate a job file (exit 2 with file:line and the key when it is wrong) and the rows of its datasets
    (exit 1 with the dataset's file:line: a repeated id, a gold answer that is not one of the options)."""
    job = _load(job_file, var)
    warnings = service.validate_datasets(job)
    stages = ", ".join(f"{s.name} ({len(job.stage_models(s))} model(s))" if s.is_llm else f"{s.name} "
                       f"({s.data_ops()[0]})" for s in job.stages)
    _say(f"{job_file}: valid job {job.name!r}: {stages}")
    for line in warnings:
        _say(line, err=True)


@app.command()
def resume(
    run_id: Annotated[str, typer.Argument(help="The run to finish (see `runner runs`).")],
    db: DbOption = None,
    budget: BudgetOption = None,
) -> None:
    """Finish an interrupted, crashed or budget-exhausted run: completed requests come from the store, the rest
    are sent."""
    store = _store(db)
    run, job = service.prepare_resume(store, run_id, budget=budget)
    _say(f"run {run['id']}: resuming job {job.name}")
    _run(job, store, run_id=run["id"])


@app.command(cls=RayCommand)
def work(
    run_id: Annotated[str, typer.Argument(help="The run to join (see `runner runs`; a --run-id name too).")],
    db: DbOption = None,
    ray: RayOption = None,
    workers: WorkersOption = None,
) -> None:
    """Join a run from another process or machine that shares its store (a postgresql:// URL, or the same SQLite
    file): take the chunks of its stages no live worker holds, send them, and take over those of workers that
    stopped. Requests are never sent twice across workers, and the run's budget holds across all of them. With
    --ray, Ray actors join it instead of this process."""
    check_ray(ray, workers, "start more `runner work` processes")
    store = _store(db)
    run, job = service.prepare_join(store, run_id)
    with ray_cluster(store, ray, workers) as cluster:
        if cluster is not None:
            return _on_ray(cluster, job, store, db, run["id"], workers)
    _say(f"run {run['id']}: joining job {job.name} as a worker")
    _work_on(job, store, run["id"])


@app.command()
def runs(
    db: DbOption = None,
    limit: Annotated[int, typer.Option(help="How many runs, newest first.")] = 50,
    fmt: Annotated[str, typer.Option("--format", help="text, json, csv or md.")] = "text",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file.")] = None,
) -> None:
    """List runs: id, job, status (crashed: killed while running), progress, spend, started."""
    from runner.report import runs as run_list

    if fmt not in run_list.FORMATS:
        raise RunnerError(f"--format must be one of {', '.join(run_list.FORMATS)}, not {fmt!r}")
    _emit(run_list.render(run_list.build(_store(db), service.check_limit(limit)), fmt), output, fmt)


@app.command()
def report(
    run_id: Annotated[str, typer.Argument(help="The run (see `runner runs`).")],
    db: DbOption = None,
    fmt: Annotated[str, typer.Option("--format", help="text, json, csv, md or html (html needs -o).")] = "text",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file.")] = None,
    judged: Annotated[str | None, typer.Option(
        "--judged", help="A run of jobs/knowno-judge.yaml over this Know-No run's no-hint.jsonl: its verdicts fill "
        "the no-hint column (labelled with the judge model), counted in E[A w/o] and OmniAccuracy.",
        show_default=False)] = None,
    by: Annotated[str | None, typer.Option(
        "--by", help="Break the scores down by this field a stage records (record: [FIELD]) only, however many "
        "values it has (by default: every recorded field with at most 50 values).", show_default=False)] = None,
) -> None:
    """Per stage and model: requests, cache hits, tokens, cost, errors by class, latency, score (mean ± std over
    seeds, SE and 95% interval over items, and per value of the recorded fields). ``--format html -o FILE``
    writes one self-contained page with plots and every answer."""
    if fmt == "html":
        if output is None:
            raise RunnerError("--format html writes a file: name it with -o/--output (e.g. -o report.html)")
        from runner.report import html as html_report  # only the html format needs it

        html_report.write(_store(db), run_id, output, judged=judged, by=by)
        _say(f"wrote {output}")
        return
    from runner.report import summary as reports

    if fmt not in reports.FORMATS:
        raise RunnerError(f"--format must be one of {', '.join(reports.FORMATS)}, not {fmt!r}")
    store = _store(db)
    _emit(reports.render(reports.build(store, run_id, judged=judged, by=by), fmt), output, fmt)


@app.command()
def compare(
    run_a: Annotated[str, typer.Argument(help="A run (see `runner runs`).")],
    run_b: Annotated[str | None, typer.Argument(help="Another run; without it, models of RUN_A are compared.",
                                                show_default=False)] = None,
    db: DbOption = None,
    stage: Annotated[str | None, typer.Option("--stage", help="Only this stage.", show_default=False)] = None,
    models: Annotated[tuple[str, str] | None, typer.Option(
        "--models", help="MODEL_A MODEL_B: model A of RUN_A against model B of RUN_B (or of RUN_A itself). "
        "Without it: two runs are compared model by model, one run's models pair by pair.",
        show_default=False)] = None,
    fmt: Annotated[str, typer.Option("--format", help="text, json, csv, md or html.")] = "text",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file.")] = None,
) -> None:
    """Per stage and model, on the items both sides answered: accuracy of each, the difference B - A with its
    95% paired interval, and a paired test (McNemar's exact test for 0/1 item scores, else a sign-flip
    permutation test); items only in A or only in B."""
    from runner.report import compare as comparison

    if fmt not in comparison.FORMATS:
        raise RunnerError(f"--format must be one of {', '.join(comparison.FORMATS)}, not {fmt!r}")
    data = comparison.build(_store(db), run_a, run_b, stage=stage, models=models)
    _emit(comparison.render(data, fmt), output, fmt)


@app.command()
def sim(
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1 (0 picks a free one).")] = 8765,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    latency: Annotated[float, typer.Option(help="Seconds added to each answer.")] = 0.0,
    rpm: Annotated[int | None, typer.Option(help="Requests per minute before 429s.")] = None,
    fault_429: Annotated[float, typer.Option("--fault-429", help="Fraction of requests answered 429.")] = 0.0,
    retry_after: Annotated[float, typer.Option(help="Seconds of Retry-After sent with each 429.")] = 0.2,
    fault_500: Annotated[float, typer.Option("--fault-500", help="Fraction of requests answered 500.")] = 0.0,
    fault_timeout: Annotated[float, typer.Option("--fault-timeout", help="Fraction that hang.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed of the fault dice (answers never depend on it).")] = 0,
    script: Annotated[Path | None, typer.Option(help="A response script: the answers' text by prompt template and "
                                                     "term (format in simserver/script.py).")] = None,
    models: Annotated[str | None, typer.Option(help="The only models the model lookups know (runner check), "
                                                    "comma-separated; default: every model.")] = None,
) -> None:
    """Start the simulated provider server, to dry-run a job with the `sim:` provider without spending."""
    from simserver import SimConfig, serve

    try:
        config = SimConfig(latency=latency, rpm=rpm, fault_429=fault_429, retry_after=retry_after,
                           fault_500=fault_500, fault_timeout=fault_timeout, seed=seed,
                           script=str(script) if script is not None else None, models=models)
    except (ValueError, TypeError) as exc:
        raise RunnerError(f"runner sim: {exc}") from None
    try:
        serve(host=host, port=port, config=config)
    except ValueError as exc:  # a response script that does not load
        raise RunnerError(f"runner sim: {exc}") from None
    except OSError as exc:
        raise RunnerError(f"runner sim cannot listen on {host}:{port} ({exc.strerror or exc}); "
                          "choose another --port") from None


def main() -> None:
    _opened.clear()
    try:
        # not standalone: click's usage errors come here, to be said in one line instead of a box
        code = app(standalone_mode=False)
    except click_errors.NoArgsIsHelpError as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click_errors.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx is not None else "runner"
        _say(f"Error: {exc.format_message()} (`{command} --help` lists the options)", err=True)
        sys.exit(exc.exit_code)
    except click_errors.ClickException as exc:
        _say(f"Error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except Abort:
        _say("Error: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except RunnerError as exc:
        problems = getattr(exc, "problems", None)
        if problems and len(problems) > 1:  # a job file with several problems: each on its own line first
            for problem in problems:
                _say(problem, err=True)
            _say(f"Error: {exc.summary}", err=True)  # type: ignore[attr-defined]
        else:
            _say(f"Error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        _say("Error: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:  # a bug: still one line, unless asked for the traceback
        said = _opened[-1].failure(exc) if _opened and hasattr(_opened[-1], "failure") else None
        if said is not None:  # the store failed outside a run (a full disk, a corrupt page, the server gone)
            _say(f"Error: {said}", err=True)
            sys.exit(1)
        if os.environ.get("RUNNER_RAISE_ERRORS") or RAISE_UNEXPECTED:
            raise
        _say(f"Error: unexpected {type(exc).__name__}: {exc} (set RUNNER_RAISE_ERRORS=1 for the "
                   "traceback, and please report it)", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


from runner import cli_costs, cli_view  # noqa: E402, F401, I001  register `runner explain` and `runner view`

# python -m runner.cli runs this file as __main__: the commands registered above are on runner.cli's app
if __name__ == "__main__":
    from runner.cli import main as registered

    registered()
