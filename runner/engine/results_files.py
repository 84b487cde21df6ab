"""The run's results files: one JSONL file per stage, a line appended for each finished task once the store has
committed it (ARCHITECTURE.md invariant 2), rewritten from the store when a resumed or shared run ends; and the one
sentence for a results file or folder that cannot be written (:func:`output_error`)."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO

from runner.errors import OutputError
from runner.spec.schema import Job
from runner.store import Finished, Store


def output_error(exc: OSError, path: Path | str, run_id: str | None) -> OutputError:
    """One sentence for a results file or folder that cannot be written, with how to go on."""
    then = f", then `runner resume {run_id}`" if run_id else ", then run it again"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return OutputError(f"the disk holding {path} is full: free space{then}", path)
    return OutputError(f"{path} cannot be written ({exc.strerror or exc}): fix that{then}", path)


class Results:
    """Per-stage JSONL files, appended as batches are committed. After a crash the file may lack lines the
    store has (killed between commit and write), so a resume rewrites it from the store at both ends: each
    finished task appears exactly once.

    A file that cannot be written (a full disk) ends the writing of every file, not the run's storing: the first
    error is kept in :attr:`failure` and ``on_failure`` stops the dispatching; the store keeps every answer, and the
    resume rewrites the files from it."""

    def __init__(self, job: Job, run_id: str, store: Store) -> None:
        self.run_id = run_id
        self.store = store
        self.paths = {stage.name: job.results_path(stage, run_id) for stage in job.llm_stages()}
        self.handles: dict[str, IO[str]] = {}
        self.opened = False
        #: the error that stopped the writing of the files, when one did
        self.failure: OutputError | None = None
        self.on_failure: Callable[[BaseException], None] | None = None

    def failed(self, exc: OSError, path: Path | str) -> OutputError:
        """The sentence for a results file that cannot be written (kept as :attr:`failure` when it is the first)."""
        error = output_error(exc, path, self.run_id)
        if self.failure is None:
            self.failure = error
        return error

    def open(self, rewrite: bool) -> None:
        """Start each file: from the store's finished tasks when resuming, empty otherwise."""
        for stage, path in self.paths.items():
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                if rewrite:
                    self._rewrite(stage, path)
                else:
                    path.write_text("", encoding="utf-8")
                self.handles[stage] = open(path, "a", encoding="utf-8")
            except OSError as exc:
                raise self.failed(exc, path) from None
        self.opened = True

    def on_commit(self, batch: list[Finished]) -> None:
        if not self.handles or self.failure is not None:  # a joining worker writes no live file
            return
        touched: set[str] = set()
        stage = batch[0].stage if batch else ""
        try:
            for item in batch:
                stage = item.stage
                self.handles[stage].write(item.result_line + "\n")
                touched.add(stage)
            for stage in touched:
                self.handles[stage].flush()
        except OSError as exc:
            error = self.failed(exc, self.paths.get(stage, stage))
            self._drop()
            if self.on_failure is not None:
                self.on_failure(error)

    def _drop(self) -> None:
        """Close the files after a write failed: what they still buffer cannot be written either."""
        for handle in self.handles.values():
            try:
                handle.close()
            except OSError:
                pass
        self.handles.clear()

    def close(self, rewrite: bool) -> None:
        """Close the files. A resumed run rewrites them from the store: a task that failed before and was
        sent again has two lines in the live file, and the store has the last one."""
        try:
            for handle in self.handles.values():
                handle.close()
        except OSError as exc:
            self.failed(exc, next(iter(self.paths.values())))
        self._drop()
        if rewrite and self.failure is None:
            for stage, path in self.paths.items():
                try:
                    self._rewrite(stage, path)
                except OSError as exc:
                    self.failed(exc, path)
                    break

    def _rewrite(self, stage: str, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.part")  # several workers may rewrite at once
        try:
            with open(partial, "w", encoding="utf-8") as out:
                out.writelines(line + "\n" for line in self.store.iter_results(self.run_id, stage))
            partial.replace(path)
        except BaseException:
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)  # a full disk gets its space back
            raise
