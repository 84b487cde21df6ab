"""``runner``'s answers that run no command: ``--version``, and the help of ``runner`` and of each command as the
typer app (runner/cli/typer_app.py) prints it, kept in help.json beside this module. Printing the kept text spares
the interpreter importing typer and building the app, which is most of a ``runner --help``.

The kept help is typer's under the name ``runner`` on a terminal at least 80 columns wide (click wraps help text
to at most 78); under another name (``python -m runner.cli``) or on a narrower terminal the app prints it itself.
``python scripts/gen_reference.py`` writes help.json again; tests/cli/test_quick.py fails when it differs from
what the app prints now.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

#: each command's help (the root's as ""), as the app prints it for ``runner [COMMAND] --help``
HELP_FILE = Path(__file__).with_name("help.json")
#: the name the kept help says the command is called by
PROG = "runner"
#: the narrowest terminal the kept help is right for: click wraps to min(columns, 80) - 2
COLUMNS = 80
#: click's exit code for ``runner`` with no arguments (its help on stderr, as a usage error)
EXIT_NO_ARGS = 2


def answer(argv: list[str] | None = None) -> None:
    """Print what ``argv`` (``sys.argv[1:]``) asks and exit, when it asks for the version or a help that is kept;
    else return, leaving it to the app."""
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--version"]:
        from runner.version import version

        print(f"runner {version()}")
        sys.exit(0)
    if len(argv) > 2 or (argv and argv[-1] != "--help") or not _as_kept():
        return
    kept = _kept()
    text = kept.get(argv[0] if len(argv) == 2 else "")
    if text is None:  # not a command: the app says so
        return
    if argv:
        print(text)
        sys.exit(0)
    print(text, file=sys.stderr)
    sys.exit(EXIT_NO_ARGS)


def _as_kept() -> bool:
    """Whether the app would print its help as kept: called ``runner`` (click names a ``python -m`` run after the
    module) on a terminal of at least :data:`COLUMNS`."""
    main = sys.modules.get("__main__")
    if getattr(main, "__package__", None) or os.path.basename(sys.argv[0]) != PROG:
        return False
    return shutil.get_terminal_size().columns >= COLUMNS


def _kept() -> dict[str, str]:
    try:
        return json.loads(HELP_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # not there (a copy without it) or damaged: the app prints it
        return {}
