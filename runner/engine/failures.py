"""What a run that the store or a results file stopped says: the store's own sentence for its failure, where the
answers the store could not take are kept, and the one error the run ends with (runner/engine/run.py raises it
once everything queued is committed). A results file's own sentence is ``output_error``, beside the files in
runner/engine/results_files.py."""

from __future__ import annotations

import errno
import tempfile
from pathlib import Path

from runner.engine.results_files import Results
from runner.errors import OutputError, RunnerError, StoreFailed
from runner.spec.schema import Job
from runner.store import Store, Writer
from runner.store.writer import save_unstored

#: errors of a file or folder that a user fixes (space, permissions, a read-only or missing folder)
_OUTPUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EIO,
                  errno.EEXIST, errno.ENOENT, errno.EISDIR, errno.EFBIG}


def store_failure(store: Store, exc: BaseException, run_id: str | None = None) -> str | None:
    """The store's sentence for ``exc`` when it is about the store itself (runner/store/sqlite.py, postgres.py)."""
    explain = getattr(store, "failure", None)
    return explain(exc, run_id) if explain is not None else None


def is_output_errno(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _OUTPUT_ERRNOS


def unstored_paths(job: Job, store: Store, run_id: str) -> list[Path]:
    """Where a run keeps the answers its store could not take, first choice first: its results folder, beside the
    store's file, the temporary folder (the first that is not on the full disk)."""
    name = f"unstored-{run_id}.jsonl"
    paths = [Path(job.output_dir) / job.name / run_id / name]
    if "://" not in store.path:
        paths.append(Path(store.path).resolve().parent / name)
    paths.append(Path(tempfile.gettempdir()) / f"runner-{name}")
    return list(dict.fromkeys(paths))


def stop_error(job: Job, store: Store, run_id: str, writer: Writer, results: Results,
               cause: BaseException | None) -> RunnerError | None:
    """The one sentence a run that the store or a results file stopped ends with: the cause, what was kept of the
    answers received, and how to go on; None when neither failed."""
    failed = writer.failure or cause
    said = store_failure(store, failed, run_id) if failed is not None else None
    if said is not None:
        answers = sum(1 for item in writer.unstored if item.response is not None)
        if not writer.unstored:
            kept = "every answer received is in the store"
        elif (path := save_unstored(writer.unstored, unstored_paths(job, store, run_id))) is not None:
            kept = (f"the {answers} answers received and not stored are kept in {path}, and the resume stores them, "
                    "so none is paid again")
        else:
            kept = (f"{answers} answers received could not be stored or kept (no disk took them): they count as "
                    "possibly billed, and the resume sends them again")
        return StoreFailed(f"{said}; {kept}")
    if results.failure is None and isinstance(cause, OSError):
        results.failed(cause, getattr(cause, "filename", None) or Path(job.output_dir) / job.name / run_id)
    if results.failure is not None:
        return OutputError(f"{results.failure}; every answer received is in the store {store.path}, so none is sent "
                           "again", results.failure.path)
    return None
