"""The ``runner`` command.

:func:`main` is its entry point. ``runner --version``, ``runner --help``, ``runner`` alone and ``runner COMMAND
--help`` are answered by runner/cli/quick.py without importing typer (typer and the commands cost some 0.1 s of a
0.2 s start: issue 39 asks 0.15 s of ``runner --help``); everything else goes to the typer app,
runner/cli/typer_app.py, which this package also lends its ``app``, ``build_app`` and ``COMMANDS`` (imported on
first use).
"""

from __future__ import annotations

import gc
import os
from typing import Any

__all__ = ["COMMANDS", "EXIT_INTERRUPTED", "RAISE_UNEXPECTED", "app", "build_app", "main"]

#: raise an unexpected error (a bug) instead of printing it in one line: what RUNNER_RAISE_ERRORS=1 does, for a
#: program that calls main() in its own process and wants the traceback (the test suite sets it)
RAISE_UNEXPECTED = False

#: the exit code of a command interrupted (Ctrl-C)
EXIT_INTERRUPTED = 130

#: the commands that record the runner's version before their first request: git is asked first thing
RECORD_VERSION = ("submit", "resume", "work")

#: whether main() holds cyclic garbage collection off while the command imports (common.open_db lets it go)
GC_HELD = False


def main() -> None:
    import sys

    global GC_HELD

    # pydantic looks for plug-ins (every installed package's entry points) when it builds its first model: some
    # 20 ms of a submit's start, for plug-ins the runner does not use. Set for the command's process (and the
    # runner processes it starts), before it imports the job's models; PYDANTIC_DISABLE_PLUGINS set to anything
    # else (even empty) keeps pydantic's own choice.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    from runner.cli import quick

    quick.answer()  # exits when it could answer
    runs = bool(sys.argv[1:2]) and sys.argv[1] in RECORD_VERSION
    quiet = runs and gc.isenabled()  # (a program that turned collection off itself keeps it off)
    if runs:
        from runner.version import ask_git_early

        ask_git_early()
        # No cyclic garbage collection while the command imports (hundreds of modules: a collection every 700 new
        # objects, each later one longer): some 15-20 ms of a start. The store's opening (common.open_db) turns it
        # back on with what was loaded frozen (gc.freeze: never traversed again), and this undoes both however the
        # command ends, for a program that calls main() again (the test suite).
        if quiet:
            gc.disable()
            GC_HELD = True
    from runner.cli import typer_app

    try:
        typer_app.main()
    finally:
        if quiet:
            GC_HELD = False
            gc.unfreeze()
            gc.enable()


def __getattr__(name: str) -> Any:
    """The typer app's ``app``, ``build_app`` and ``COMMANDS``, importing it on first use."""
    if name in ("app", "build_app", "COMMANDS"):
        from runner.cli import typer_app

        return getattr(typer_app, name)
    raise AttributeError(f"module 'runner.cli' has no attribute {name!r}")
