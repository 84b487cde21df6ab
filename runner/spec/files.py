"""Where a file a job names (a dataset, a prompt, an options or schema file, a local model) is found."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from runner.bundled import bundled_file

if TYPE_CHECKING:
    from runner.spec.schema import Job


def resolve_file(job: Job, relative: str, *, folder: bool = False) -> Path | None:
    """Find a file named in a job: relative to the working directory, then to the job file's folder
    and its parent (so a job in ``jobs/`` may name ``data/...``), then among the files bundled with the package
    (runner/bundled: the papers' ``data/...``). ``folder``: a folder is found too (a Hugging Face dataset)."""
    return find_file(job.base_dir, relative, folder=folder)


def find_file(base_dir: str | Path, relative: str, *, folder: bool = False) -> Path | None:
    """:func:`resolve_file` for a job file in the folder ``base_dir``."""

    def found(path: Path) -> bool:
        return path.is_file() or (folder and path.is_dir())

    named = Path(os.path.expanduser(relative))
    for candidate in _candidates(base_dir, relative):
        if found(candidate):
            return candidate if named.is_absolute() else candidate.resolve()
    return bundled_file(named)  # None for an absolute path


def not_a_file(job: Job, relative: str, *, folder: bool = False) -> str | None:
    """What stands where :func:`resolve_file` found no file: "a named pipe (FIFO)", "a device", "a socket", "a
    directory" (unless ``folder``); None when nothing is there. Said in place of "does not exist", which it is not
    (a pipe is never opened: it would wait for a writer)."""
    for candidate in _candidates(job.base_dir, relative):
        kind = file_kind(candidate)
        if kind is not None and not (folder and kind == "a directory"):
            return kind
    return None


def file_kind(path: Path) -> str | None:
    """What ``path`` is when it exists but is not a regular file (the link followed); None for a regular file or
    nothing at all."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a socket" if stat.S_ISSOCK(mode) else "a special file"


def _candidates(base_dir: str | Path, relative: str) -> Iterator[Path]:
    """The paths ``relative`` may name, in the order :func:`find_file` tries them (the bundled files aside)."""
    candidate = Path(os.path.expanduser(relative))
    if candidate.is_absolute():
        yield candidate
        return
    job_dir = Path(base_dir)
    for base in (Path.cwd(), job_dir, job_dir.parent):
        yield base / candidate
