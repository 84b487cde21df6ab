"""Files that ship inside the package: the ready jobs (``jobs/``), the papers' prompt templates (``prompts/``)
and the released benchmark data the jobs read (``data/``, each folder with a SOURCES.md naming its origin and
licence).

In a clone the repository's ``jobs``, ``prompts`` and ``data`` are relative symlinks to these folders, so every
path a README or test names keeps working; an installed wheel has only these. Lookups try the user's files
first (the working directory, the job file's folder and its parent) and the bundled ones last: a local file
always wins.
"""

from __future__ import annotations

from pathlib import Path

#: the folder holding ``jobs/``, ``prompts/`` and ``data/``
ROOT = Path(__file__).resolve().parent

__all__ = ["ROOT", "bundled_file", "locate_job"]


def bundled_file(relative: str | Path) -> Path | None:
    """The bundled file at ``relative`` (``jobs/quickstart.yaml``, ``data/knowno/Bank77_1000.jsonl``), or None.
    An absolute path, or one that climbs out of the bundle (``..``), is never bundled."""
    candidate = Path(relative)
    if candidate.is_absolute() or ".." in candidate.parts:
        return None
    path = ROOT / candidate
    return path if path.is_file() else None


def locate_job(path: str | Path) -> tuple[Path, bool]:
    """The job file ``path`` names: the file itself when it exists (a local file always wins), else the bundled
    job of that name (``jobs/quickstart.yaml``, or ``quickstart.yaml`` for short). Returns (path, bundled)."""
    path = Path(path)
    if path.exists():
        return path, False
    found = bundled_file(path)
    if found is None and len(path.parts) == 1:
        found = bundled_file(Path("jobs") / path)
    return (found, True) if found is not None else (path, False)
