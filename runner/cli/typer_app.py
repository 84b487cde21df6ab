"""The ``runner`` command as typer builds it: the app from its command modules, and :func:`main`, the one place an
error becomes a line (``runner``'s entry point, :func:`runner.cli.main`, calls it for whatever it does not answer
from the help it keeps: runner/cli/quick.py).

Each command module registers its commands with ``register(app)``: runner/cli/run.py (submit, resume, work),
runner/cli/jobs.py (check, estimate, validate), runner/cli/reports.py (runs, report, compare, costs, explain),
runner/cli/sim.py (sim) and runner/cli/view.py (view); :data:`MODULES` says which, so that the app of one command
imports its module alone (the whole app, :data:`app`, is built when first asked for). A command only parses its
arguments, calls the run service (runner/service.py) or a report (runner/report/) and prints; the options and
helpers they share are runner/cli/common.py, the cluster options of submit and work runner/cli/cluster.py. No
command module imports another, or this one.

Every error a user can cause ends in ``Error: <one sentence>`` on stderr and a non-zero exit (2 for a job
file that does not validate, a problem ``runner validate`` finds in a dataset's rows, or a submit whose worst case
exceeds its budget, 1 otherwise), never a traceback.
``RUNNER_RAISE_ERRORS=1`` shows tracebacks of unexpected errors, for bug reports.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from typing import Annotated, Any

import typer
from typer.models import CommandInfo

try:  # typer ≥ 0.22 carries its own copy of click
    from typer._click import exceptions as click_errors
    from typer.exceptions import Abort
except ImportError:  # an older typer runs on click itself
    from click import exceptions as click_errors  # type: ignore[no-redef]
    from click.exceptions import Abort  # type: ignore[assignment]

import runner.cli
from runner.cli import EXIT_INTERRUPTED
from runner.cli.common import opened, say
from runner.errors import RunnerError

__all__ = ["COMMANDS", "app", "build_app", "main"]

#: the commands in the order ``runner --help`` lists them
COMMANDS = ("submit", "check", "estimate", "costs", "validate", "resume", "work", "runs", "report", "compare", "sim",
            "explain", "view")
#: the module of runner/cli/ that registers each command: a command's app imports its own module alone
MODULES = {"submit": "run", "resume": "run", "work": "run", "check": "jobs", "estimate": "jobs", "validate": "jobs",
           "costs": "reports", "runs": "reports", "report": "reports", "compare": "reports", "explain": "reports",
           "sim": "sim", "view": "view"}


def build_app(only: str | None = None) -> typer.Typer:
    """The ``runner`` app: every command module's commands, listed in the order of :data:`COMMANDS`; with
    ``only``, that command alone (what :func:`main` runs: typer reads every registered command's signature when
    it is called, some 30 ms of CPU for the thirteen)."""
    app = typer.Typer(
        add_completion=False,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        # click's own help layout: typer's boxed one imports rich and markdown-it-py, 0.2 s of a 0.1 s --help
        rich_markup_mode=None,
        help="Run LLM API jobs from YAML files: cached, resumable, with live progress and cost reports.",
    )
    app.callback()(_options)
    for module in dict.fromkeys(MODULES[name] for name in (COMMANDS if only is None else (only,)) if name in MODULES):
        importlib.import_module(f"runner.cli.{module}").register(app)
    app.registered_commands.sort(key=lambda command: COMMANDS.index(_name(command)))
    if only is not None:
        app.registered_commands = [command for command in app.registered_commands if _name(command) == only]
    return app


def _name(command: CommandInfo) -> str:
    return command.name or command.callback.__name__  # type: ignore[union-attr]


def _print_version(asked: bool) -> None:
    """``runner --version``: the version naming the commit that runs (runner/version.py), then exit."""
    if asked:
        from runner.version import version

        typer.echo(f"runner {version()}")
        raise typer.Exit()


def _options(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print the runner's version (the git commit it runs), exit.")] = False,
) -> None:
    pass


#: the whole app, every command (``runner --help`` and usage errors); built when first asked for (module
#: ``__getattr__``): a command runs an app of its own
app: typer.Typer


def _whole_app() -> typer.Typer:
    found = globals().get("app")
    if found is None:
        found = globals()["app"] = build_app()
    return found


def __getattr__(name: str) -> Any:
    if name == "app":
        return _whole_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Run the command ``sys.argv`` names, and exit with its code; the stores it opened are closed first."""
    opened.clear()
    try:
        _main()
    finally:
        _close_opened()


def _close_opened() -> None:
    """Close the stores the command opened, before the interpreter ends: a PostgreSQL connection left to be
    collected at its end is collected after psycopg's own modules are torn down, and psycopg before 3.2 then prints
    an AttributeError from its ``__del__`` (``.ci/run --oldest``, scripts/chaos.py's clean-exit check)."""
    while opened:
        store = opened.pop()
        with contextlib.suppress(Exception):  # a server already gone: nothing left to close
            store.close()


def _main() -> None:
    named = sys.argv[1] if len(sys.argv) > 1 else None
    # `runner COMMAND ...`: an app of that command alone; anything else (an unknown command, an option first) goes
    # to the whole app, whose usage error names the commands
    target = build_app(only=named) if named in COMMANDS else _whole_app()
    try:
        # not standalone: click's usage errors come here, to be said in one line instead of a box
        code = target(standalone_mode=False)
    except click_errors.NoArgsIsHelpError as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click_errors.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx is not None else "runner"
        say(f"Error: {exc.format_message()} (`{command} --help` lists the options)", err=True)
        sys.exit(exc.exit_code)
    except click_errors.ClickException as exc:
        say(f"Error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except Abort:
        say("Error: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except RunnerError as exc:
        problems = getattr(exc, "problems", None)
        if problems and len(problems) > 1:  # a job file with several problems: each on its own line first
            for problem in problems:
                say(problem, err=True)
            say(f"Error: {exc.summary}", err=True)  # type: ignore[attr-defined]
        else:
            say(f"Error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        say("Error: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:  # a bug: still one line, unless asked for the traceback
        said = opened[-1].failure(exc) if opened and hasattr(opened[-1], "failure") else None
        if said is not None:  # the store failed outside a run (a full disk, a corrupt page, the server gone)
            say(f"Error: {said}", err=True)
            sys.exit(1)
        if os.environ.get("RUNNER_RAISE_ERRORS") or runner.cli.RAISE_UNEXPECTED:
            raise
        say(f"Error: unexpected {type(exc).__name__}: {exc} (set RUNNER_RAISE_ERRORS=1 for the "
            "traceback, and please report it)", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


def rendered_help() -> dict[str, str]:
    """Each command's help as the app prints it for ``runner [COMMAND] --help`` on an 80-column terminal (the
    root's as ""): what runner/cli/quick.py keeps in help.json (scripts/gen_reference.py writes it)."""
    import io

    from runner.cli.quick import COLUMNS, PROG

    texts = {}
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(COLUMNS)  # what shutil.get_terminal_size(), and so click's help, reads first
    try:
        for name in ("", *COMMANDS):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                code = _whole_app()([name, "--help"] if name else ["--help"], prog_name=PROG,
                                    standalone_mode=False)
            if code:
                raise RuntimeError(f"`runner {name} --help` exited {code}")
            texts[name] = out.getvalue().removesuffix("\n")
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    return texts
