"""``runner --help``, ``runner COMMAND --help``, ``runner`` alone and ``runner --version`` answered without importing
typer (runner/cli/quick.py), from the help the app prints (runner/cli/help.json, written by
scripts/gen_reference.py), and by the app itself wherever the kept text would not be what it prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from runner.cli import quick
from runner.cli.typer_app import COMMANDS, rendered_help
from tests.helpers import ROOT

#: asks runner/cli/quick.py as the ``runner`` script would, then says what it printed and whether typer was loaded
PROBE = """
import contextlib, io, json, sys
sys.argv = ["runner", *json.loads(sys.argv[1])]
out, err, code = io.StringIO(), io.StringIO(), None
from runner.cli import quick
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
        quick.answer()
    except SystemExit as exc:
        code = exc.code
print(json.dumps({"out": out.getvalue(), "err": err.getvalue(), "code": code, "typer": "typer" in sys.modules}))
"""


def _ask(*argv: str, columns: int | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | ({"COLUMNS": str(columns)} if columns else {})
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env=env, check=True)
    return json.loads(done.stdout)


def test_the_kept_help_is_what_the_app_prints_now() -> None:
    kept = json.loads(quick.HELP_FILE.read_text(encoding="utf-8"))
    assert set(kept) == {"", *COMMANDS}
    assert kept == rendered_help(), "runner/cli/help.json is stale: run python scripts/gen_reference.py"


def test_help_and_version_are_answered_without_typer_and_as_the_app_answers() -> None:
    kept = json.loads(quick.HELP_FILE.read_text(encoding="utf-8"))
    root = _ask("--help", columns=120)
    assert root == {"out": kept[""] + "\n", "err": "", "code": 0, "typer": False}
    assert root["out"].startswith("Usage: runner [OPTIONS] COMMAND [ARGS]...") and "submit" in root["out"]
    submit = _ask("submit", "--help")
    assert submit == {"out": kept["submit"] + "\n", "err": "", "code": 0, "typer": False}
    alone = _ask()  # click's no_args_is_help: the help on stderr, exit 2
    assert alone == {"out": "", "err": kept[""] + "\n", "code": quick.EXIT_NO_ARGS, "typer": False}
    version = _ask("--version")
    assert version["code"] == 0 and version["out"].startswith("runner ") and not version["typer"]


@pytest.mark.parametrize("argv, columns", [(("--help",), 60), (("nosuch", "--help"), None),
                                           (("submit", "job.yaml", "--help"), None), (("runs",), None)])
def test_what_the_kept_help_would_not_print_right_is_left_to_the_app(argv, columns) -> None:
    """A narrower terminal (click wraps to it), a command that does not exist, more arguments, no --help."""
    assert _ask(*argv, columns=columns) == {"out": "", "err": "", "code": None, "typer": False}


def test_the_app_itself_prints_the_kept_help_under_runner_and_its_own_name_under_python_m() -> None:
    kept = json.loads(quick.HELP_FILE.read_text(encoding="utf-8"))
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    done = subprocess.run([sys.executable, "-c", "import sys; sys.argv[0] = 'runner'; "
                           "from runner.cli import typer_app; typer_app.main()", "view", "--help"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert done.returncode == 0 and done.stdout == kept["view"] + "\n"
    module = subprocess.run([sys.executable, "-m", "runner.cli", "--help"], capture_output=True, text=True,
                            timeout=60, cwd=ROOT, env=env)
    assert module.returncode == 0 and module.stdout.startswith("Usage: python -m runner.cli [OPTIONS] COMMAND")
