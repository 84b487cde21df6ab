"""Group commit of the ledger's reservations: the reservations the run asks at about the same moment written in one
transaction of the store's thread, instead of one transaction (and one trip to the thread and back) each.

A priced request's worst case is written to the ledger and committed before the request is sent (ARCHITECTURE.md
invariant 3), and that stays so: each asker waits until the transaction holding its reservation has committed. What
changes is how many share it. Reservations asked while no group is being written start one at the loop's next turn
(so those asked in the same turn share it); those asked while a group is being written wait for the next, which
takes them all. Each one is answered as :meth:`Store.reserve_within <runner.store.base.Store.reserve_within>`
answers it: later ones in a group see the earlier ones' reservations, and a lease that no longer holds fences that
one request only.

Before this, each reservation of a zero-latency priced run was a round trip to the store's thread of its own: the
event loop woke some 20 times more often than a free run's, and a priced request cost about twice the CPU of a free
one (bench/RESULTS.md, "Reservations in groups").
"""

from __future__ import annotations

import asyncio

from runner.store import ReserveAsk
from runner.store.fencing import Fenced
from runner.store.offloop import LoopStore

__all__ = ["LedgerWrites"]

Answer = tuple[int | None, str | None, int]


class LedgerWrites:
    """Reservations written in groups, one transaction each, through a run's store thread."""

    def __init__(self, store: LoopStore) -> None:
        self.store = store
        self._asked: list[tuple[ReserveAsk, asyncio.Future[Answer | Fenced]]] = []
        self._writer: asyncio.Task[None] | None = None
        #: transactions written, and the reservations they held (tests, bench/throughput.py)
        self.groups = 0
        self.written = 0

    async def reserve(self, ask: ReserveAsk) -> Answer:
        """``ask`` reserved once its group has committed: (ledger id, None, 0), or (None, the scope without room,
        reservations in flight in it); :class:`Fenced` when its lease does not hold."""
        future: asyncio.Future[Answer | Fenced] = asyncio.get_running_loop().create_future()
        self._asked.append((ask, future))
        if self._writer is None:
            self._writer = asyncio.create_task(self._write(), name="ledger-writes")
        answer = await future
        if isinstance(answer, Fenced):
            raise answer
        return answer

    async def _write(self) -> None:
        group: list[tuple[ReserveAsk, asyncio.Future[Answer | Fenced]]] = []
        try:
            while self._asked:
                group, self._asked = self._asked, []
                try:
                    answers = await self.store.reserve_all([ask for ask, _ in group])
                except Exception as exc:  # the store's error, each asker's to handle as before
                    for _, future in group:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                self.groups += 1
                self.written += len(group)
                for (_, future), answer in zip(group, answers, strict=True):
                    if not future.done():
                        future.set_result(answer)
                    elif not isinstance(answer, Fenced) and answer[0] is not None:
                        # its asker was cancelled meanwhile (the run is stopping): the request is never sent
                        self.store.post("release", answer[0])
                group = []
        finally:
            self._writer = None
            for _, future in [*group, *self._asked]:  # cancelled with the run: no asker is left waiting
                future.cancel()
            self._asked = []
