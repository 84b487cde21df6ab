"""The single writer task: every write of a run's finished tasks goes through it, in batches."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from runner.store.base import Finished, Store


class Writer:
    """The single writer task: takes :class:`Finished` items from a queue and commits them in batches.

    ``on_commit`` is called with each committed batch (to append result lines to the JSONL files), so
    nothing is written to a results file before it is in the store.
    """

    def __init__(
        self,
        store: Store,
        on_commit: Callable[[list[Finished]], None],
        batch_size: int = 512,
    ) -> None:
        self.store = store
        self.on_commit = on_commit
        self.batch_size = batch_size
        self.queue: asyncio.Queue[Finished | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

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
        while not stopping:
            first = await self.queue.get()
            if first is None:
                self.queue.task_done()
                break
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
                self._commit(batch)
            finally:
                for _ in range(taken):
                    self.queue.task_done()
            await asyncio.sleep(0)

    async def flush(self) -> None:
        """Wait until everything queued so far is committed (a pipeline stage reads its results next)."""
        if self._task is not None and not self._task.done():
            await self.queue.join()

    def _commit(self, batch: list[Finished]) -> None:
        self.store.write_batch(
            [f.task for f in batch],
            [f.response for f in batch if f.response is not None],
            [f.ledger for f in batch if f.ledger is not None],
            [(f.release_id,) for f in batch if f.release_id is not None],
        )
        self.on_commit(batch)
