"""The single writer task: every write of a run's finished tasks goes through it, in batches."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

from runner.store.base import Finished, Store
from runner.store.offloop import LoopStore, off_loop
from runner.store.rows import LedgerRow, ResponseRow, TaskRow


class Writer:
    """The single writer task: takes :class:`Finished` items from a queue and commits them in batches.

    ``on_commit`` is called with each committed batch (to append result lines to the JSONL files), so
    nothing is written to a results file before it is in the store.

    While results keep coming, commits are at least ``min_interval`` seconds apart (what arrives meanwhile joins
    the next batch): against a fast server a commit per handful of results cost a tenth of the CPU of a request
    (issue 25). A result that arrives after a quiet spell is committed at once.

    A write that fails does not end the task: the first error is kept in :attr:`failure` and ``on_failure`` is
    called with it (the engine stops dispatching at once), and the queue is still taken. Once the store has failed,
    the items it could not take are kept in :attr:`unstored` (answers that may have been paid for, saved aside by
    :func:`save_unstored` for the resume); an error of ``on_commit`` (a results file on a full disk) leaves the
    store working, so everything answered is still committed.

    The commits are the store's (a :class:`~runner.store.offloop.LoopStore`: its thread's, during a run), awaited: a
    commit that waits for a slow store holds up the next one, never the event loop.
    """

    def __init__(
        self,
        store: Store | LoopStore,
        on_commit: Callable[[list[Finished]], None],
        batch_size: int = 512,
        on_failure: Callable[[BaseException], None] | None = None,
        min_interval: float = 0.01,
    ) -> None:
        self.store = off_loop(store)
        self.min_interval = min_interval
        self._last_commit = float("-inf")
        self.on_commit = on_commit
        self.batch_size = batch_size
        self.on_failure = on_failure
        self.queue: asyncio.Queue[Finished | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        #: the store's error that stopped committing, when one did
        self.failure: BaseException | None = None
        #: what was queued after the store failed (or in the batch that failed), in order
        self.unstored: list[Finished] = []
        #: set by the next commit (then replaced by a new one): see :meth:`next_commit`
        self._committed = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="store-writer")

    def put(self, item: Finished) -> None:
        self.queue.put_nowait(item)

    async def close(self) -> None:
        """Commit everything queued, then stop."""
        self.queue.put_nowait(None)
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        # Take what is queued (up to batch_size) and commit it at once; while a commit runs, the next
        # batch accumulates, so batches grow with the load and a lone result is never kept waiting.
        stopping = False
        loop = asyncio.get_running_loop()
        while not stopping:
            first = await self.queue.get()
            if first is None:
                self.queue.task_done()
                break
            wait = self._last_commit + self.min_interval - loop.time()
            if wait > 0 and self.queue.qsize() + 1 < self.batch_size:  # a full batch goes at once
                await asyncio.sleep(wait)
            batch = [first]
            taken = 1
            while len(batch) < self.batch_size and not self.queue.empty():
                item = self.queue.get_nowait()
                taken += 1
                if item is None:
                    stopping = True
                    break
                batch.append(item)
            try:
                await self._commit(batch)
            finally:
                self._last_commit = loop.time()
                self._committed.set()
                self._committed = asyncio.Event()
                for _ in range(taken):
                    self.queue.task_done()
            await asyncio.sleep(0)

    async def next_commit(self, timeout: float) -> None:
        """Return once the next batch is committed, or after ``timeout`` seconds. A reservation the store refused
        while this process's own settled requests were still queued here fits once they are committed: waiting
        for that instead of a fixed pause took 95 requests under a tight budget from 16 s to a fraction of it."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._committed.wait(), timeout)

    async def flush(self) -> None:
        """Wait until everything queued so far is committed (a pipeline stage reads its results next)."""
        if self._task is not None and not self._task.done():
            await self.queue.join()

    async def _commit(self, batch: list[Finished]) -> None:
        if self.failure is not None:  # the store failed: nothing more goes to it
            self.unstored.extend(batch)
            return
        try:
            # a task whose worker lost its lease is not written (its answer goes to the memo only): not passed on
            batch = await self.store.write_finished(batch)
        except Exception as exc:
            self.failure = exc
            self.unstored.extend(batch)
            if self.on_failure is not None:
                self.on_failure(exc)
            return
        self.on_commit(batch)  # the results files keep their own errors (runner.engine.run.Results)


def save_unstored(items: list[Finished], paths: list[Path]) -> Path | None:
    """Write what the store could not take to the first of ``paths`` that takes it (a resume stores it:
    :func:`load_unstored`); None when none does (a full disk everywhere)."""
    for path in paths:
        partial = path.with_name(path.name + ".part")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(partial, "w", encoding="utf-8") as out:
                for item in items:
                    out.write(json.dumps({"stage": item.stage, "task": item.task, "response": item.response,
                                          "ledger": item.ledger, "release_id": item.release_id},
                                         separators=(",", ":")) + "\n")
            partial.replace(path)
            return path
        except OSError:
            try:
                partial.unlink(missing_ok=True)
            except OSError:
                pass
    return None


def load_unstored(path: Path) -> Iterator[list[Finished]]:
    """The items :func:`save_unstored` kept, in batches of 512, as the writer would have committed them."""
    batch: list[Finished] = []
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            if not line.strip():
                continue
            row = json.loads(line)
            task = TaskRow(*row["task"])
            batch.append(Finished(task=task, response=ResponseRow(*row["response"]) if row["response"] else None,
                                  ledger=LedgerRow(*row["ledger"]) if row["ledger"] else None,
                                  result_line=task.result_json, stage=row["stage"], release_id=row["release_id"]))
            if len(batch) == 512:
                yield batch
                batch = []
    if batch:
        yield batch


def store_unstored(store: Store, path: Path) -> int:
    """Commit what a run kept at ``path`` when its store failed, then remove the file; returns how many tasks.

    A batch kept aside may have been committed after all: a PostgreSQL server that restarted while the batch's
    COMMIT was on its way cannot say whether it took it (runner/store/postgres.py), so the run ended keeping it.
    Writing it again is harmless for the memo, the task rows and the reservations it removes, but not for its
    charges: one the ledger already has (the same run, key and time) is not written twice."""
    count = 0
    stored: dict[str, set[tuple[str, str]]] = {}  # per run, (key, created) of the charges the ledger holds
    for batch in load_unstored(path):
        charges = [f.ledger for f in batch if f.ledger is not None]
        for run_id in {row.run_id for row in charges} - set(stored):
            stored[run_id] = {(row["key"], row["created"]) for row in store.ledger(run_id, kind="charge")}
        store.write_batch([f.task for f in batch], [f.response for f in batch if f.response is not None],
                          [row for row in charges if (row.key, row.created) not in stored[row.run_id]],
                          [(f.release_id,) for f in batch if f.release_id is not None])
        count += len(batch)
    path.unlink()
    return count
