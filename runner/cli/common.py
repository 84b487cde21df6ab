"""What the ``runner`` command's modules share: the options several commands take (``--db``, ``--var``,
``--limit``, ``--budget``), printing (:func:`say`, :func:`emit`), the store ``--db`` names (:func:`open_db`) and a
job file loaded (:func:`load_job`).

Every line printed goes through :func:`say`, which drops terminal control sequences (:mod:`runner.report.terminal`):
an error or a run's message can quote a provider's error body, and a job's names and dataset fields reach warnings.
Reports printed whole in text or md are cleaned the same way (:func:`emit`).

The command modules import the run service, the store and the reports :func:`later`, when a command first uses
them: ``runner --help``, ``runner --version`` and a command's own usage errors then start in about a tenth of a
second, where importing the engine costs half a second more (issue 39).
"""

from __future__ import annotations

import gc
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated

import typer

from runner.errors import RunnerError
from runner.report.terminal import clean

if TYPE_CHECKING:
    from runner.spec.schema import Job
    from runner.store import Store

__all__ = ["BudgetOption", "DbOption", "LimitOption", "VarOption", "check_format", "emit", "has_password",
           "import_now", "later", "load_job", "open_db", "opened", "say", "var_values"]


#: the modules :func:`later` gave out, for :func:`import_now`
_LATER: list[str] = []


def later(name: str) -> ModuleType:
    """Module ``name``, imported when one of its attributes is first read (the standard library's
    ``importlib.util.LazyLoader``); the module itself where it is imported already."""
    _LATER.append(name)
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.loader is not None, name
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def import_now() -> None:
    """Import what the command modules left for later, now: for a process that runs commands from several threads
    or forks (the test suite), where a first use from two threads at once would load a module twice."""
    for name in _LATER:
        getattr(sys.modules[name], "__doc__", None)  # an attribute read runs a lazily loaded module


service = later("runner.service")

DbOption = Annotated[
    str | None,
    typer.Option("--db", help="The store: a SQLite file, or a postgresql://user@host/db URL shared by several "
                 "processes and machines (default: RUNNER_DB or ./cache.sqlite).", show_default=False),
]

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

DeadlineOption = Annotated[
    str | None,
    # parsed by service.set_deadline, which says a bad one in one line
    typer.Option("--deadline", help="When the answers are needed: a duration from the start (6h, 90m) or an ISO "
                 "8601 time with its zone (over the job file's deadline:); each stage's requests then go the "
                 "cheapest way (batch, flex, standard, priority) that finishes by it with 95 % confidence.",
                 show_default=False),
]

VarOption = Annotated[
    list[str] | None,
    typer.Option("--var", help="NAME=VALUE: a value for ${NAME} in the job file, over its vars: (repeatable).",
                 show_default=False),
]


def say(message: object, *, err: bool = False) -> None:
    """Print one message (to stderr with ``err``) without the control sequences text from outside may carry."""
    typer.echo(clean(message, newlines=True), err=err)


def emit(text: str, output: Path | None, fmt: str = "text") -> None:
    """A rendered report to ``output``, or to stdout: text and md without control sequences (JSON and CSV keep
    their own escaping)."""
    if output:
        output.write_text(text, encoding="utf-8")
        say(f"wrote {output}")
    else:
        typer.echo(clean(text, newlines=True) if fmt in ("text", "md") else text, nl=False)


def check_format(fmt: str, formats: Sequence[str]) -> None:
    """``--format`` one of ``formats``, or one sentence."""
    if fmt not in formats:
        raise RunnerError(f"--format must be one of {', '.join(formats)}, not {fmt!r}")


#: the stores this command opened, so that an error of one outside a run is said as the store says it (main)
opened: list[Store] = []


def open_db(db: str | None) -> Store:
    """The store ``--db`` names (or RUNNER_DB, or cache.sqlite). A password in ``--db`` can be read by anyone on
    the machine (in `ps`, and in the shell's history): said once, without the password."""
    if db and has_password(db) and not opened:
        say("warning: --db carries a password, which other users of this machine can see in `ps`: put the URL in "
            "RUNNER_DB instead (export RUNNER_DB=postgresql://...), or use a ~/.pgpass file", err=True)
    import runner.cli
    from runner.store import open_store

    if runner.cli.GC_HELD:  # turned off by main() while the command imported: on again, what it loaded frozen
        runner.cli.GC_HELD = False
        gc.freeze()
        gc.enable()
    store = open_store(db)
    opened.append(store)
    return store


def has_password(db: str) -> bool:
    """Whether a store URL carries a password (``user:password@`` or a ``password=`` parameter)."""
    from urllib.parse import parse_qsl, urlsplit

    if "://" not in db:
        return False
    try:
        parts = urlsplit(db)
        return bool(parts.password) or any(k == "password" and v for k, v in parse_qsl(parts.query))
    except ValueError:
        return "@" in db and ":" in db.split("://", 1)[1].split("@", 1)[0]


def load_job(job_file: Path, var: list[str] | None) -> Job:
    """Load a job file; a path that does not exist here but names a bundled job (``jobs/quickstart.yaml``) loads
    that one, and says so."""
    job, bundled = service.load_job_file(job_file, var_values(var))
    if bundled is not None:
        say(f"using the bundled {job_file} ({bundled})", err=True)
    return job


def var_values(values: list[str] | None) -> dict[str, str]:
    """``--var NAME=VALUE`` options as a mapping."""
    out: dict[str, str] = {}
    for value in values or []:
        name, sep, text = value.partition("=")
        if not sep or not name.strip():
            raise RunnerError(f"--var {value!r}: write it as NAME=VALUE")
        out[name.strip()] = text
    return out
