"""Where a file a job names (a dataset, a prompt, an options or schema file, a local model) is found."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from runner.bundled import bundled_file

if TYPE_CHECKING:
    from runner.spec.schema import Job


def resolve_file(job: Job, relative: str, *, folder: bool = False) -> Path | None:
    """Find a file named in a job: relative to the working directory, then to the job file's folder
    and its parent (so a job in ``jobs/`` may name ``data/...``), then among the files bundled with the package
    (runner/bundled: the papers' ``data/...``). ``folder``: a folder is found too (a Hugging Face dataset)."""

    def found(path: Path) -> bool:
        return path.is_file() or (folder and path.is_dir())

    candidate = Path(os.path.expanduser(relative))
    if candidate.is_absolute():
        return candidate if found(candidate) else None
    job_dir = Path(job.base_dir)
    for base in (Path.cwd(), job_dir, job_dir.parent):
        if found(base / candidate):
            return (base / candidate).resolve()
    return bundled_file(candidate)
