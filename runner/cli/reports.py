"""The commands that read the store: ``runner runs``, ``runner report``, ``runner compare``, ``runner costs`` and
``runner explain`` (why a request was not a cache hit). Each only parses its arguments and prints what its module of
runner/report/ renders; a report's module is imported by the command that uses it, for a leaner start."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from runner.cli.common import DbOption, VarOption, check_format, emit, later, load_job, open_db, say, service
from runner.errors import RunnerError

explanations = later("runner.report.explain")

__all__ = ["compare", "costs", "explain", "register", "report", "runs"]


def register(app: typer.Typer) -> None:
    app.command()(costs)
    app.command()(runs)
    app.command()(report)
    app.command()(compare)
    app.command()(explain)


def costs(
    run: Annotated[str | None, typer.Argument(
        metavar="RUN", help="A finished run to re-price (see `runner runs`); without it, spend across runs.",
        show_default=False)] = None,
    as_models: Annotated[list[str] | None, typer.Option("--as", help="Re-price RUN's requests on this model "
                                                        "(repeatable).", show_default=False)] = None,
    batch: Annotated[bool, typer.Option("--batch", help="Re-price RUN at Batch API prices.")] = False,
    cached: Annotated[bool, typer.Option("--cached", help="Re-price RUN with provider prompt caching.")] = False,
    db: DbOption = None,
    since: Annotated[str | None, typer.Option(help="Only spend from this day on (YYYY-MM-DD, UTC).",
                                              show_default=False)] = None,
    by: Annotated[str, typer.Option(help="Group by model, job, day (UTC) or endpoint (a pooled model's charges per "
                                         "endpoint that answered them).")] = "model",
    fmt: Annotated[str, typer.Option("--format", help="text, json, csv or md.")] = "text",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file.")] = None,
) -> None:
    """Spend across runs, from the ledger: per model, job or day, the runs, requests charged, USD charged, USD
    possibly billed (requests in flight when a run was killed) and the money saved by cache hits. With RUN: that
    run's requests re-priced (--as another model, --batch, --cached) beside what was paid."""
    from runner.report import costs as cost_sums  # imported by the command that uses it: a leaner start

    check_format(fmt, cost_sums.FORMATS)
    if run is not None or as_models or batch or cached:
        from runner.report import whatif

        text = whatif.render(whatif.build(open_db(db), cost_sums.whatif_run(run, since, by), as_models=as_models,
                                          batch=batch, cached=cached), fmt)
        return emit(text, output, fmt)
    data = cost_sums.build(open_db(db), by=by, since=since)
    emit(cost_sums.render(data, fmt), output, fmt)


def runs(
    db: DbOption = None,
    limit: Annotated[int, typer.Option(help="How many runs, newest first.")] = 50,
    fmt: Annotated[str, typer.Option("--format", help="text, json, csv or md.")] = "text",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file.")] = None,
) -> None:
    """List runs: id, job, status (crashed: killed while running), progress, spend, started."""
    from runner.report import runs as run_list

    check_format(fmt, run_list.FORMATS)
    emit(run_list.render(run_list.build(open_db(db), service.check_limit(limit)), fmt), output, fmt)


def report(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="The run (see `runner runs`).")],
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

        html_report.write(open_db(db), run_id, output, judged=judged, by=by)
        say(f"wrote {output}")
        return
    from runner.report import summary as reports

    check_format(fmt, reports.FORMATS)
    store = open_db(db)
    emit(reports.render(reports.build(store, run_id, judged=judged, by=by), fmt), output, fmt)


def compare(
    runs: Annotated[list[str], typer.Argument(
        help="A run (see `runner runs`): its models pair by pair; two runs: model by model; three or more: every "
        "pair of them, model by model.", metavar="RUN...", show_default=False)],
    db: DbOption = None,
    stage: Annotated[str | None, typer.Option("--stage", help="Only this stage.", show_default=False)] = None,
    models: Annotated[tuple[str, str] | None, typer.Option(
        "--models", help="MODEL_A MODEL_B: model A of the first run against model B of the second (or of the "
        "first itself; of every later run, with three or more). Without it: runs are compared model by model, one "
        "run's models pair by pair.",
        show_default=False)] = None,
    fmt: Annotated[str, typer.Option("--format", help="text, json, csv, md or html.")] = "text",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file.")] = None,
) -> None:
    """Per stage and model, on the items both sides answered: accuracy of each, the difference B - A with its
    95% paired interval, and a paired test (McNemar's exact test for 0/1 item scores, else a sign-flip
    permutation test); items only in A or only in B. Every p value is adjusted by Holm's method across the rows."""
    from runner.report import compare as comparison

    check_format(fmt, comparison.FORMATS)
    if len(runs) > 2:
        data = comparison.build_runs(open_db(db), runs, stage=stage, models=models)
    else:
        data = comparison.build(open_db(db), runs[0], runs[1] if len(runs) == 2 else None, stage=stage,
                                models=models)
    emit(comparison.render(data, fmt), output, fmt)


def _is_job_file(target: str) -> bool:
    """A job file: a YAML name or a file that exists; anything else is a run id."""
    return target.endswith((".yaml", ".yml")) or Path(target).is_file()


def explain(
    target: Annotated[str, typer.Argument(metavar="TARGET",
                                          help="A run (see `runner runs`), or a job file before a run.")],
    item: Annotated[str, typer.Option("--item", help="The item: a dataset row's id (its dataset.id field, else its "
                                      "row number).")],
    stage: Annotated[str | None, typer.Option("--stage", help="Only this stage (default: every stage with the "
                                              "item).", show_default=False)] = None,
    db: DbOption = None,
    fmt: Annotated[str, typer.Option("--format", help="text or json.")] = "text",
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file.")] = None,
    var: VarOption = None,
) -> None:
    """For each request of one item (each model, seed or variant, sample): whether the memo answers it and from
    which run; if not, the nearest stored request of the same stage and model and what differs (model id, each
    parameter, the messages as a diff, the sample index, the request kind), or "never asked"."""
    check_format(fmt, explanations.FORMATS)
    if _is_job_file(target):
        job = load_job(Path(target), var)
        data = explanations.build(open_db(db), item, job=job, stage=stage)
    else:
        data = explanations.build(open_db(db), item, run_id=target, stage=stage)
    emit(explanations.render(data, fmt), output, fmt)
