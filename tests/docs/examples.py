"""The examples of a documentation page, read and run: what tests/docs/test_examples.py uses, and what
docs/about-docs.md describes to a writer.

A page's fenced blocks are taken in order:

- a block with ``title="FILE"`` in its info string (```` ```yaml title="first.yaml" ````) is a file: it is written to
  the page's folder before anything runs (a FILE that is in the repository already must equal it);
- ``bash``: each command is run and must exit 0 (a ``#`` starts a comment; ``export NAME=VALUE`` sets a variable for
  the page's later commands);
- ``console``: ``$ COMMAND`` lines, each followed by what it prints (stdout and stderr together), compared line by
  line with the placeholders :data:`PLACEHOLDERS`, and ``...`` alone on a line for any lines;
- ``python``: run in one namespace per page (as cells of a notebook), in the page's folder; a ``text`` block titled
  ``output`` right after it is what it prints;
- ``yaml``: must parse.

A shell or Python block that cannot run here (it needs a cloud key, a cluster, a server that runs until Ctrl-C, or
installs packages) has ``<!-- not run: REASON -->`` on the line before it; nothing else is left out.

Commands run as the reader would type them, in a folder of their own per page that holds the repository's ``jobs/``
(a copy), ``data/`` and ``prompts/``: ``runner ...`` and ``python -m ...`` as subprocesses of this interpreter
(forked cheaply by tests/prefork.py), with the simulated server's URL in ``RUNNER_SIM_URL``, the store
``./cache.sqlite``, and no provider's key in the environment.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent.parent

#: the placeholders a shown output may use for what changes from run to run
PLACEHOLDERS = {
    "<RUN>": r"\d{8}-\d{6}-[0-9a-f]{4}",  # a run id the runner made (a --run-id name is written as it is)
    "<N>": r"-?[\d.,]+",  # a number: a rate, a duration, a count
    "<PATH>": r"\S+",  # a path under a temporary folder
    "<TEXT>": r".*?",  # any text on the line
}
#: a line of its own in a shown output: any lines, none included
ANY_LINES = "..."
#: the environment variables a reader's keys may be in: none reaches the examples
KEY_VARIABLES = re.compile(r"^(OPENAI|ANTHROPIC|GEMINI|GOOGLE|AWS|AZURE|OPENROUTER|TOGETHER|GROQ|DEEPSEEK|MISTRAL|"
                           r"FIREWORKS|RUNNER_SIM_KEY|RUNNER_DB$)")
MARKER = re.compile(r"^<!--\s*not run:\s*(.*?)\s*-->$")
FENCE = re.compile(r"^```(\S*)\s*(.*)$")
#: the languages whose blocks are run (or marked as not run)
RUN = ("bash", "console", "python")


@dataclass
class Block:
    page: str
    line: int
    lang: str
    body: str
    title: str | None = None
    #: why the block is not run (the marker's reason), or None
    not_run: str | None = None
    #: a python block's shown output (the ``text`` block titled ``output`` after it)
    output: str | None = None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(text: str, page: str) -> list[Block]:
    """The fenced blocks of a page (top-level fences only), with their markers."""
    lines = text.splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        title = re.search(r'title="([^"]+)"', match.group(2))
        above = lines[i - 1].strip() if i else ""
        marker = MARKER.match(above)
        block = Block(page, i + 1, match.group(1), "\n".join(lines[i + 1:end]) + "\n",
                      title.group(1) if title else None, marker.group(1) if marker else None)
        if block.lang == "text" and block.title == "output" and found and found[-1].lang == "python":
            found[-1].output = block.body
        else:
            found.append(block)
        i = end + 1
    return found


def expected_pattern(shown: str) -> re.Pattern[str]:
    """A shown output as a pattern of the whole output: placeholders, and ``...`` lines for any lines."""
    parts = []
    for line in shown.rstrip("\n").splitlines():
        if line.strip() == ANY_LINES:
            parts.append(r"(?:[^\n]*\n)*?")
            continue
        escaped = re.escape(line.rstrip())
        for name, pattern in PLACEHOLDERS.items():
            escaped = escaped.replace(re.escape(name), pattern)
        parts.append(escaped + r"[ \t]*\n")
    return re.compile("".join(parts))


@dataclass
class Page:
    """One page's folder, environment and Python namespace, its examples run in order."""

    name: str
    folder: Path
    sim_url: str
    env: dict[str, str] = field(default_factory=dict)
    namespace: dict[str, Any] = field(default_factory=dict)
    #: what ran: (block, command or "python") in order, for the tests' own checks
    ran: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def make(cls, name: str, root: Path, sim_url: str) -> Page:
        folder = root / re.sub(r"\W", "-", name)
        folder.mkdir(parents=True)
        shutil.copytree(ROOT / "jobs", folder / "jobs", symlinks=False)
        for linked in ("data", "prompts"):
            (folder / linked).symlink_to((ROOT / linked).resolve())
        env = {key: value for key, value in os.environ.items() if not KEY_VARIABLES.match(key)}
        env.update(RUNNER_SIM_URL=sim_url, RUNNER_PROGRESS_INTERVAL="3600", NO_COLOR="1", COLUMNS="200")
        return cls(name, folder, sim_url, env)

    # -- one command ---------------------------------------------------------------------------------------------
    def argv(self, command: str, where: str) -> tuple[list[str], dict[str, str]] | None:
        """The process a command line starts (None for ``export``, done here), or an AssertionError naming what
        the examples cannot run."""
        words = shlex.split(command, comments=True)
        if not words:
            return None
        env = dict(self.env)
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        if words[0] == "export":
            for assignment in words[1:]:
                key, _, value = assignment.partition("=")
                self.env[key] = value
            return None
        assert not any(word in ("|", "&&", ";", ">", "&") for word in words), \
            f"{where}: {command!r}: pipes and lists are not run here; write one command a line"
        if words[0] == "runner":
            return [sys.executable, "-m", "runner.cli", *words[1:]], env
        if words[0] in ("python", "python3"):
            return [sys.executable, *words[1:]], env
        raise AssertionError(f"{where}: {command!r}: only runner and python commands are run; mark the block "
                             "<!-- not run: REASON --> if it cannot be")

    def run(self, command: str, where: str) -> tuple[int, str] | None:
        made = self.argv(command, where)
        if made is None:
            return None
        argv, env = made
        self.ran.append((where, command))
        done = subprocess.run(argv, cwd=self.folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=120)
        return done.returncode, done.stdout

    # -- a block ---------------------------------------------------------------------------------------------------
    def write_file(self, block: Block) -> None:
        target = self.folder / block.title
        repository = ROOT / block.title
        if repository.is_file():
            assert repository.read_text(encoding="utf-8") == block.body, \
                f"{block.where}: {block.title} differs from the repository's file of that name"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.body, encoding="utf-8")

    def bash(self, block: Block) -> None:
        for command in _commands(block.body):
            result = self.run(command, block.where)
            if result is not None:
                code, out = result
                assert code == 0, f"{block.where}: {command!r} exited {code}:\n{out}"

    def console(self, block: Block) -> None:
        steps = re.split(r"^\$ ", block.body, flags=re.M)
        assert not steps[0].strip(), f"{block.where}: a console block starts with a $ COMMAND line"
        for step in steps[1:]:
            command, _, shown = step.partition("\n")
            result = self.run(command, block.where)
            assert result is not None, f"{block.where}: {command!r} prints nothing to compare"
            code, out = result
            out = "\n".join(line.rstrip() for line in out.splitlines()) + "\n"
            if not expected_pattern(shown).fullmatch(out):
                raise AssertionError(f"{block.where}: {command!r} (exit {code}) printed:\n{out}\nnot as shown:\n"
                                     f"{shown}")

    def python(self, block: Block) -> None:
        printed = io.StringIO()
        saved = {key: os.environ.get(key) for key in (*self.env, *os.environ)}
        cwd = os.getcwd()
        try:
            os.environ.clear()
            os.environ.update(self.env)
            os.chdir(self.folder)
            with contextlib.redirect_stdout(printed):
                exec(compile(block.body, block.where, "exec"), self.namespace)  # noqa: S102 - the page's own example
        finally:
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update({key: value for key, value in saved.items() if value is not None})
        self.ran.append((block.where, "python"))
        if block.output is not None:
            out = "\n".join(line.rstrip() for line in printed.getvalue().splitlines()) + "\n"
            if not expected_pattern(block.output).fullmatch(out):
                raise AssertionError(f"{block.where}: printed:\n{out}\nnot as shown:\n{block.output}")

    def run_page(self, text: str) -> list[Block]:
        """Every block of the page, in order; an AssertionError at the first that does not do what it shows."""
        found = blocks(text, self.name)
        for block in found:
            if block.lang in RUN and block.not_run is not None:
                assert block.not_run, f"{block.where}: a not-run marker needs its reason"
                continue
            if block.title is not None:
                self.write_file(block)
            elif block.lang == "yaml":
                yaml.safe_load(block.body)
            if block.lang == "bash":
                self.bash(block)
            elif block.lang == "console":
                self.console(block)
            elif block.lang == "python":
                self.python(block)
        return found


def _commands(body: str) -> list[str]:
    """A bash block's commands, a line each (a line ending in a backslash goes on)."""
    commands, current = [], ""
    for line in body.splitlines():
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        current += line
        if current.strip() and not current.strip().startswith("#"):
            commands.append(current.strip())
        current = ""
    return commands


def unlabelled_shell(text: str, page: str) -> list[str]:
    """Blocks that look like a shell transcript or commands but do not say so (no ``console`` or ``bash``): they
    would escape the examples' run."""
    return [block.where for block in blocks(text, page)
            if block.lang in ("", "text", "sh", "shell") and block.title is None
            and re.match(r"^\$ |^runner ", block.body)]
