"""Which of a chunk's tasks need a request: those an earlier attempt of the run finished are skipped (a resume),
those the memo or an answer received since can serve are cache hits, the rest are sent."""

from __future__ import annotations

from collections.abc import Collection

from runner.engine.stats import RunStats
from runner.plan.request import Task
from runner.store import CachedResponse, Finished, Store
from runner.store.offloop import LoopStore, off_loop


class Triage:
    def __init__(self, store: Store | LoopStore, run_id: str, stats: RunStats) -> None:
        self.store = off_loop(store)
        self.run_id = run_id
        self.stats = stats
        #: answers received since the current chunk's memo query, so a repeat of the request is not sent again
        self.recent: dict[str, CachedResponse] = {}
        #: keys of answers committed since then (the next memo query sees them: they leave ``recent``)
        self.committed_keys: list[str] = []

    async def done(self, chunk: list[Task]) -> Collection[str]:
        """The items of ``chunk`` an earlier attempt of the run (or another worker) finished."""
        return await self.store.done_items(self.run_id, chunk[0].stage, [r.item for r in chunk])

    async def sort(self, chunk: list[Task], done: Collection[str]
                   ) -> tuple[list[tuple[Task, CachedResponse]], list[Task]]:
        """(the cache hits with their answers, the tasks to send); the tasks in ``done`` are counted as resumed."""
        # What was committed before the query (the store's calls run in order) is in ``memo`` or will be in the next
        # chunk's: forgotten. What is committed while the query is on its way stays in ``recent`` until the next.
        forget, self.committed_keys = self.committed_keys, []
        memo = await self.store.lookup_many([r.key for r in chunk])
        for key in forget:
            self.recent.pop(key, None)
        hits: list[tuple[Task, CachedResponse]] = []
        to_send: list[Task] = []
        for req in chunk:
            if req.item in done:
                counters = self.stats.counters(req.stage, req.model)
                counters.done += 1
                counters.resumed += 1
                continue
            cached = memo.get(req.key) or self.recent.get(req.key)
            if cached is not None:
                hits.append((req, cached))
            else:
                to_send.append(req)
        return hits, to_send

    def answered(self, key: str) -> CachedResponse | None:
        """The answer to ``key`` received since the chunk's memo query, if any."""
        return self.recent.get(key)

    def remember(self, key: str, answer: CachedResponse) -> None:
        self.recent[key] = answer

    def committed(self, batch: list[Finished]) -> None:
        """Writer callback: these answers are in the store; the next chunk's memo query will see them."""
        self.committed_keys.extend(item.response.key for item in batch if item.response is not None)
