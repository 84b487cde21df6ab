"""``runner explain``: why a request was not a cache hit. A command of the ``runner`` app (runner/cli.py, which
imports this module to register it), kept apart because runner/cli.py is at its size; the work is in
runner/report/explain.py."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from runner.cli import DbOption, VarOption, _emit, _load, _store, app
from runner.errors import RunnerError
from runner.report import explain as explanations


def _is_job_file(target: str) -> bool:
    """A job file: a YAML name or a file that exists; anything else is a run id."""
    return target.endswith((".yaml", ".yml")) or Path(target).is_file()


@app.command()
def explain(
    target: Annotated[str, typer.Argument(help="A run (see `runner runs`), or a job file before a run.")],
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
    if fmt not in explanations.FORMATS:
        raise RunnerError(f"--format must be one of {', '.join(explanations.FORMATS)}, not {fmt!r}")
    if _is_job_file(target):
        job = _load(Path(target), var)
        data = explanations.build(_store(db), item, job=job, stage=stage)
    else:
        data = explanations.build(_store(db), item, run_id=target, stage=stage)
    _emit(explanations.render(data, fmt), output, fmt)
