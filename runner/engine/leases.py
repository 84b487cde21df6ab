"""The dispatcher's side of chunk leasing (runner/engine/workers.py has the store's side): which lease each task was
dispatched under, the fence its writes carry, when a lease's tasks are all committed, and what to stop when a
lease is lost to another worker.

A stage's tasks are planned :data:`CHUNK` at a time and leased :data:`LEASE` at a time; a chunk's leases are taken
in one transaction when this worker is alone, one lease at a time when others are live.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

from runner.engine.stats import RunStats
from runner.engine.workers import Crew
from runner.plan.request import Task
from runner.store import Finished
from runner.store.fencing import Fence

#: requests planned, checked against the memo and dispatched together
CHUNK = 256
#: tasks per lease when several processes may share a run: small enough that a worker joining a short run still
#: finds work; a chunk's leases are taken in one transaction (CHUNK is a multiple)
LEASE = 64
#: leases of dead workers taken over at once (the plan is walked once for them)
TAKEOVER = 64


def chunks(items: Iterable[Task], size: int) -> Iterator[list[Task]]:
    """``items`` in lists of ``size`` (the last one shorter)."""
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


class ChunkLeases:
    def __init__(self, stats: RunStats) -> None:
        self.stats = stats
        self._crew: Crew | None = None
        #: the lease each task dispatched under one was dispatched under, by id() of the task (its writes carry it)
        self.fence_of: dict[int, Fence] = {}
        #: (stage, item) of tasks dispatched under a lease -> (stage, lease), and per lease the tasks not committed
        self.lease_of: dict[tuple[str, str], tuple[str, int]] = {}
        self.lease_left: dict[tuple[str, int], int] = {}

    @property
    def crew(self) -> Crew | None:
        """This process's membership of the run (leases, claims, shared budgets), when several processes may work
        on it."""
        return self._crew

    @crew.setter
    def crew(self, crew: Crew | None) -> None:
        self._crew = crew
        if crew is not None:
            crew.on_lost = self.lost

    # -- taking leases -----------------------------------------------------------------------------
    async def claim(self, stage: str, first: int, parts: list[list[Task]], indices: list[int]
                    ) -> tuple[list[Task], dict[str, int], bool]:
        """Lease the chunks ``indices`` (``parts[index - first]`` are their tasks): (the tasks of the leases this
        worker got, each one's lease, whether one was taken from a worker that stopped). Tasks of leases another
        live worker holds are counted as done elsewhere."""
        assert self._crew is not None
        leases = await self._crew.claim_chunks(stage, indices)
        mine: list[Task] = []
        lease_of: dict[str, int] = {}
        for index in indices:
            if leases[index]:
                mine.extend(parts[index - first])
                lease_of.update((req.item, index) for req in parts[index - first])
            else:  # another live worker holds it
                for req in parts[index - first]:
                    self.stats.counters(stage, req.model).elsewhere += 1
        return mine, lease_of, "taken" in leases.values()

    def hold(self, chunk: list[Task], lease_of: dict[str, int], done: Iterable[str]) -> None:
        """The tasks of ``chunk`` not ``done`` are dispatched under their lease (``lease_of``): counted until
        committed, and their fences kept for their writes."""
        assert self._crew is not None
        stage = chunk[0].stage
        for req in chunk:
            if req.item not in done:
                lease = self.lease_of[(stage, req.item)] = (stage, lease_of[req.item])
                self.lease_left[lease] = self.lease_left.get(lease, 0) + 1
                fence = self._crew.fence(stage, lease_of[req.item])
                if fence is not None:
                    self.fence_of[id(req)] = fence

    async def take_over(self, stage: str) -> list[int]:
        """Up to :data:`TAKEOVER` expired leases of the stage, now this worker's (their dead workers' reservations
        settled first, before their requests are sent again)."""
        assert self._crew is not None
        taken: list[int] = []
        while len(taken) < TAKEOVER and (index := await self._crew.take_expired(stage)) is not None:
            taken.append(index)
        if taken:
            await self._crew.resolve_dead()
            self.stats.notes.append(f"stage {stage}: took over {len(taken)} leases of a worker that stopped")
        return taken

    # -- fences --------------------------------------------------------------------------------------
    def fence(self, req: Task) -> Fence | None:
        """The fence of the lease ``req`` was dispatched under, if any."""
        return self.fence_of.get(id(req))

    def take_fence(self, req: Task) -> Fence | None:
        """The same, and ``req`` is off the books (it is recorded, or not sent)."""
        return self.fence_of.pop(id(req), None)

    async def lost_lease_of(self, req: Task) -> bool:
        """Whether ``req`` was dispatched under a lease this worker no longer holds. A worker whose last heartbeat is
        older than half its lease (it may have stalled) beats first, so it learns what it lost before sending."""
        fence = self.fence_of.get(id(req))
        if fence is None or self._crew is None:
            return False
        if self._crew.stale():
            try:
                await self._crew.beat()
            except Exception as exc:  # the store does not answer: the write will be fenced if the lease is gone
                self.stats.notes.append(f"heartbeat failed ({type(exc).__name__}: {exc})")
        return not self._crew.holds(fence)

    def fenced(self, req: Task, fence: Fence | None) -> None:
        """The store refused a write of ``req`` under ``fence``: the lease is another worker's, stopped now."""
        if self._crew is not None and fence is not None:
            self._crew.leases.pop((fence.stage, fence.chunk), None)
            self.lease_left.pop((fence.stage, fence.chunk), None)
        self.fence_of.pop(id(req), None)
        self.stats.counters(req.stage, req.model).elsewhere += 1

    def lost(self, leases: list[tuple[str, int]]) -> None:
        """Crew callback: these leases were taken over; their tasks still to send are not sent, and their writes are
        refused by the store."""
        for lease in leases:
            self.lease_left.pop(lease, None)
        self.stats.notes.append(f"{len(leases)} leases of this worker were taken over by others after its "
                                "heartbeats came late: it stopped them")

    # -- finishing leases -----------------------------------------------------------------------------
    def committed(self, batch: list[Finished]) -> None:
        """Writer callback: a lease whose tasks are all committed is done (a worker taking over from this one would
        find nothing to do)."""
        if not self.lease_of:
            return
        finished: dict[str, list[int]] = {}
        for item in batch:
            lease = self.lease_of.pop((item.stage, item.task.item), None)
            if lease is not None and lease in self.lease_left:  # (not one this worker lost)
                self.lease_left[lease] -= 1
                if not self.lease_left[lease]:
                    del self.lease_left[lease]
                    finished.setdefault(lease[0], []).append(lease[1])
        for stage, done in finished.items():
            assert self._crew is not None
            self._crew.finish(stage, done)
