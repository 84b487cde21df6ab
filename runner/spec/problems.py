"""Problems in a job file, each said as ``file:line: key: what``, and collected so that validation reports every
problem of a file at once rather than only the first."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

from runner.errors import JobFileError
from runner.spec.yamlfile import Loc, dotted, line_of


def fail(path: Path, lines: dict[Loc, int], loc: Loc, message: str) -> NoReturn:
    """Raise the problem ``message`` at the key ``loc`` of the job file ``path`` (``lines``: each key's line)."""
    raise JobFileError(f"{position(path, lines, loc)}: {dotted(loc)}: {message}")


def position(path: Path, lines: dict[Loc, int], loc: Loc) -> str:
    """``file:line``; a job given as a mapping has no lines, only its label."""
    return f"{path}:{line_of(lines, loc)}" if lines else str(path)


class JobFileProblems(JobFileError):
    """A job file with one or more problems, each ``file:line: key: what`` (``problems``, in file order). With
    one, the message is that problem; with more, every problem on its own line, then ``summary``."""

    def __init__(self, path: Path, problems: list[str]) -> None:
        self.problems = problems
        self.summary = f"{len(problems)} problem{'s' if len(problems) != 1 else ''} in {path}"
        super().__init__(problems[0] if len(problems) == 1 else "\n".join([*problems, self.summary]))


class Problems:
    """``with problems:`` around one check records its JobFileError and goes on, so validation reports every
    problem of a file, not only the first; :meth:`raise_any` raises them together."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.messages: list[str] = []

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> bool:
        if isinstance(exc, JobFileProblems):
            self.messages.extend(exc.problems)
        elif isinstance(exc, JobFileError):
            self.messages.append(str(exc))
        return isinstance(exc, JobFileError)

    def raise_any(self) -> None:
        if self.messages:
            raise JobFileProblems(self.path, self.messages)
