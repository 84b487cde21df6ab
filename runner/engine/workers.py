"""Several processes on one run, and several runs sending the same requests.

Every process that works on a run (``runner submit``, ``runner resume``, ``runner work RUN_ID`` on any machine
sharing the store) joins it as a worker and sends heartbeats. A stage's planned tasks are cut into chunks of
:data:`runner.engine.leases.CHUNK`; a worker leases a chunk before dispatching it and skips chunks another
live worker holds, so the workers split a stage between them. A lease lives while its worker's heartbeats
come; when a worker dies (kill -9, a lost machine) its leases expire and another worker takes the chunk over,
skipping the tasks already committed. A worker that reaches the end of a stage waits for the chunks others
hold before the next stage starts.

Before a request that is not in the memo is sent, its cache key is claimed in the store. An identical request
claimed by another live process (another worker of the run, or another run of the same job started at the
same time) is not sent again: the task waits for the answer to appear in the memo and records it as a cache
hit. A claim ends when the answer is committed, when the request fails, or when its worker's heartbeats stop.

Fencing. A worker can stall longer than its lease (a stopped process, a machine too loaded to run its event loop)
and wake up to find its chunks taken over. Every lease carries a token that grows whenever it is taken over
(:class:`runner.store.fencing.Fence`), and every write a worker makes on behalf of a lease carries the token it got:
its finished tasks (their rows, their ledger charges and the removal of their reservations, in the writer's
transaction), its reservations, and the completion of the lease. The store refuses them once the lease changed
hands or the worker was declared dead. What a refused task brings is handled so that nothing is counted twice:
its answer still goes to the memo (content-addressed: keeping it is never wrong, and it may spare the new holder a
request), its task row and charge are not written, and its reservation becomes possibly billed (it was sent).
Request claims are fenced by their holder's id: a claim that expired is taken under the new holder's id, and
a release or an answer of the old holder no longer matches it.

The worker learns it at its next heartbeat (which returns the leases it still holds) or write. It then stops the
chunks it lost at once: nothing more is sent for them (a request waiting for its endpoint, its budget or a retry is
dropped, its reservation given back). Before sending, a worker whose last heartbeat is older than half its lease
beats first, so one that just woke from a stall does not send for a chunk it lost. A worker whose heartbeat finds
it declared dead (its heartbeats stopped for longer than its lease and another worker noticed) has lost all its
leases: it leaves under its old id (its reservations still open become possibly billed, as a dead worker's are,
and its claims go) and joins the run again under a new one, so the process finishes its work like any other
worker. Heartbeats that come late widen the lease (up to :data:`MAX_WIDEN` times the configured one), so a
loaded machine keeps its leases instead of losing them over and over.

A stall of the store itself. The crew reaches the store off the event loop (runner/store/offloop.py), its heartbeats
through a connection and a thread of their own, so a slow store delays them without stopping anything else. A store
that stalled every worker (a stopped server, a lock held elsewhere) leaves every lease expired when it answers again;
so a worker takes leases over and declares others dead only while its own heartbeats have come steadily (no gap over
half a lease) for a whole lease, and its last one within half a lease, which the store checks as the statement runs
(``steady``, runner/store/base.py): the others' heartbeats come back within that lease, and none of them is taken for
dead. A worker stopped on its own (its store answering the others) is still taken over once its lease expires.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import time
from collections.abc import Callable
from typing import Any

from runner.errors import RunnerError
from runner.store import CachedResponse, Store
from runner.store.fencing import Fence
from runner.store.offloop import LoopStore, off_loop

#: seconds a lease or claim outlives its worker's last heartbeat (RUNNER_LEASE_TTL overrides)
DEFAULT_TTL = 30.0
#: the shortest lease RUNNER_LEASE_TTL may ask for: a worker beats every quarter of its lease, and an event loop busy
#: for a second (a provider's first import, planning a chunk) would make shorter leases expire under load alone
MIN_TTL = 4.0
#: how far late heartbeats widen a worker's lease, as a multiple of the configured one
MAX_WIDEN = 4.0
#: seconds between polls of the memo for answers another process is fetching, and of chunks others hold
POLL = 0.2


def lease_ttl() -> float:
    """RUNNER_LEASE_TTL's seconds, or :data:`DEFAULT_TTL`; a value that is no number or too short is refused."""
    value = os.environ.get("RUNNER_LEASE_TTL")
    if not value:
        return DEFAULT_TTL
    try:
        ttl = float(value)
    except ValueError:
        raise RunnerError(f"RUNNER_LEASE_TTL={value!r} is not a number of seconds (the default is "
                          f"{DEFAULT_TTL:g})") from None
    if not ttl >= MIN_TTL:
        raise RunnerError(f"RUNNER_LEASE_TTL={value} is too short: a worker whose heartbeat is that late is declared "
                          f"dead, and a busy machine is that late; use at least {MIN_TTL:g} seconds (the default is "
                          f"{DEFAULT_TTL:g})")
    return ttl


class Crew:
    """This process's membership of a run: its worker id, heartbeats, chunk leases and request claims."""

    def __init__(self, store: Store | LoopStore, run_id: str, *, ttl: float | None = None,
                 note: Callable[[str], None] | None = None, beats: Store | LoopStore | None = None) -> None:
        """``beats``: the store as the heartbeats reach it (a connection and a thread of their own), else ``store``."""
        self.store = off_loop(store)
        self.beats = off_loop(beats) if beats is not None else self.store
        self.run_id = run_id
        #: the lease asked for, and the one in force (widened when heartbeats come late)
        self.configured_ttl = self.ttl = ttl or lease_ttl()
        self.worker = self._new_id()
        #: the chunk leases this worker holds, (stage, chunk) -> token, as of its last heartbeat or claim
        self.leases: dict[tuple[str, int], int] = {}
        #: called with the leases this worker lost (taken over, or all of them when it was declared dead)
        self.on_lost: Callable[[list[tuple[str, int]]], Any] | None = None
        #: time.monotonic() of the last heartbeat the store took
        self.last_beat = time.monotonic()
        #: times this process joined the run again after it was declared dead
        self.rejoined = 0
        self.note = note or (lambda message: None)
        self._beat: asyncio.Task[None] | None = None
        #: the heartbeat on its way, which a second asker waits for instead of sending another
        self._beating: asyncio.Future[None] | None = None
        #: set when this worker leaves the run: a heartbeat that finds it gone does not join it again
        self._leaving = False
        #: live processes working on the run (this one included), counted by the heartbeat thread: each takes
        #: this share of the endpoints' rate limits
        self.live = 1
        #: called with the new count when processes join or leave the run (the dispatcher splits its rate limits)
        self.on_live: Callable[[int], Any] | None = None
        #: requests another process is sending: key -> callbacks waiting for the answer or for the claim
        self.waiting: dict[str, list[Callable[[CachedResponse | None], Any]]] = {}
        self._poller: asyncio.Task[None] | None = None

    # -- membership ---------------------------------------------------------------------------------
    @staticmethod
    def _new_id() -> str:
        return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"

    async def join(self) -> None:
        await self.store.join_run(self.run_id, self.worker, socket.gethostname(), os.getpid(), self.ttl)
        self.last_beat = time.monotonic()
        self.live = await self._count_live()
        self._beat = asyncio.ensure_future(self._heartbeats())

    async def leave(self) -> None:
        self._leaving = True
        for task in (self._beat, self._poller):
            if task is not None:
                task.cancel()
        # A heartbeat on its way (shielded: cancelling its asker does not stop it) is let end first: landing after
        # the leave below, it found this worker gone and joined the run again under a new id, a live worker that
        # never left, so no process was the last and nobody marked the run completed.
        if self._beating is not None and not self._beating.done():
            await asyncio.wait([self._beating])
        await self.resolve_dead()  # a worker that died since the last heartbeat is not left holding reservations
        await self.store.leave_run(self.worker)

    async def resolve_dead(self, store: LoopStore | None = None) -> None:
        """A dead worker's reservations become possibly billed, as after a crash: counted as spent, no longer
        holding budget room as if in flight. Only while this worker is steady (the module's docstring)."""
        store = store or self.store
        for worker in await store.dead_workers(self.run_id, self.worker, self.ttl):
            possibly = await store.resolve_worker(self.run_id, worker)
            self.note(f"worker {worker} stopped sending heartbeats: its chunks are taken over and its {possibly} "
                      "requests in flight are kept as possibly billed at their worst case")

    async def _count_live(self) -> int:
        return max(1, sum(1 for row in await self.beats.workers(self.run_id) if row["state"] == "live"))

    async def _heartbeats(self) -> None:
        # A heartbeat every quarter of the lease, so three can be late (an event loop busy with a provider's first
        # import or a long planning step) before the lease expires; the live count is read every second.
        while True:
            await asyncio.sleep(min(1.0, self.ttl / 4))
            try:
                live = await self._count_live()
                if live != self.live:
                    self.live = live
                    if self.on_live is not None:
                        self.on_live(live)
                if time.monotonic() - self.last_beat < self.ttl / 4:
                    continue
                await self.beat()
                await self.resolve_dead(self.beats)
            except Exception as exc:  # a store that does not answer for a moment: beat again next time
                self.note(f"heartbeat failed ({type(exc).__name__}: {exc}); trying again")

    async def beat(self) -> None:
        """One heartbeat: extend this worker's leases and claims, and learn which leases it lost (or that it was
        declared dead: then it joins the run again under a new id). One at a time: a second asker waits for the
        heartbeat on its way."""
        if self._beating is None or self._beating.done():
            self._beating = asyncio.ensure_future(self._beat_once())
            # its askers get its error; when none is left to (the run ended while it waited on the store), it is
            # taken here, not printed by asyncio as a task exception never retrieved
            self._beating.add_done_callback(lambda done: done.cancelled() or done.exception())
        await asyncio.shield(self._beating)

    async def _beat_once(self) -> None:
        started = time.monotonic()
        gap = started - self.last_beat
        if gap > self.ttl / 2 and self.ttl < self.configured_ttl * MAX_WIDEN:
            # two beats were missed: the machine (or the store) is slower than the lease allows for
            widened = min(self.configured_ttl * MAX_WIDEN, max(self.ttl * 1.5, 2 * gap))
            self.note(f"a heartbeat came {gap:.1f} s after the previous one, for a lease of {self.ttl:g} s: this "
                      f"worker's leases now last {widened:g} s")
            self.ttl = widened
        # The heartbeat answers with the leases the store had for this worker as it ran, on its own thread: a lease
        # taken (or finished) meanwhile is not in that answer, and is not judged by it.
        asked = dict(self.leases)
        held = await self.beats.heartbeat(self.worker, self.ttl)
        if held is None:
            if self._leaving:
                return
            await self._declared_dead(gap)
            return
        self.last_beat = started
        mine = {(stage, chunk): token for stage, chunk, token in held}
        lost = [lease for lease, token in asked.items() if mine.get(lease) != token and self.leases.get(lease) == token]
        if lost:
            for lease in lost:
                del self.leases[lease]
            self.note(f"this worker lost {len(lost)} leases to other workers while its heartbeats were late: it "
                      "stops them (nothing more is sent or recorded for them)")
            if self.on_lost is not None:
                self.on_lost(lost)

    def stale(self) -> bool:
        """Whether this worker's last heartbeat is older than half its lease (it may have stalled, and lost leases)."""
        return time.monotonic() - self.last_beat > self.ttl / 2

    async def _declared_dead(self, gap: float) -> None:
        """The store says this worker is dead: another worker noticed its heartbeats stop and takes its leases over.
        Its work under the old id stops; its reservations still open become possibly billed (as any dead worker's),
        its leases and claims go at once, and it joins the run again under a new id."""
        old, lost = self.worker, list(self.leases)
        self.leases.clear()
        await self.store.leave_run(old)
        self.worker = self._new_id()
        await self.store.join_run(self.run_id, self.worker, socket.gethostname(), os.getpid(), self.ttl)
        self.last_beat = time.monotonic()
        self.rejoined += 1
        self.note(f"worker {old} was declared dead (its heartbeat came {gap:.1f} s after the previous one, past its "
                  f"lease): its {len(lost)} leases are others' now and nothing more is recorded for them; it joins the "
                  f"run again as {self.worker}")
        if self.on_lost is not None:
            self.on_lost(lost)

    async def others(self) -> int:
        """Other workers that joined this run (live or not)."""
        return sum(1 for row in await self.store.workers(self.run_id) if row["id"] != self.worker)

    # -- chunk leases -------------------------------------------------------------------------------
    async def claim_chunks(self, stage: str, chunks: list[int]) -> dict[int, str | None]:
        got = await self.store.lease_chunks(self.run_id, stage, chunks, self.worker, self.ttl, steady=self.ttl)
        for chunk, lease in got.items():
            if lease is not None:
                self.leases[(stage, chunk)] = lease[1]
        return {chunk: lease and lease[0] for chunk, lease in got.items()}

    async def take_expired(self, stage: str) -> int | None:
        got = await self.store.take_expired_lease(self.run_id, stage, self.worker, self.ttl, steady=self.ttl)
        if got is None:
            return None
        self.leases[(stage, got[0])] = got[1]
        return got[0]

    def fence(self, stage: str, chunk: int) -> Fence | None:
        """The fence of a lease this worker holds (None when it does not hold it)."""
        token = self.leases.get((stage, chunk))
        return None if token is None else Fence(self.worker, self.run_id, stage, chunk, token)

    def holds(self, fence: Fence) -> bool:
        """Whether this worker still holds the lease as the fence has it (as of its last heartbeat)."""
        return fence.worker == self.worker and self.leases.get((fence.stage, fence.chunk)) == fence.token

    def finish(self, stage: str, chunks: list[int] | None = None) -> None:
        """These leases of the stage (all this worker holds, by default) are done: their tasks are committed. Asked of
        the store without waiting: the store's calls after it see them done."""
        if chunks is None:
            self.store.post("finish_chunks", self.run_id, stage, self.worker)
            for lease in [lease for lease in self.leases if lease[0] == stage]:
                del self.leases[lease]
            return
        held = [chunk for chunk in chunks if (stage, chunk) in self.leases]
        if held:
            self.store.post("finish_chunks", self.run_id, stage, self.worker, held,
                            [self.leases.pop((stage, chunk)) for chunk in held])

    async def open_chunks(self, stage: str) -> int:
        return await self.store.open_chunks(self.run_id, stage)

    # -- request claims -----------------------------------------------------------------------------
    async def claim(self, keys: list[str]) -> tuple[set[str], dict[str, CachedResponse]]:
        """Claim requests to send: (the keys now this worker's, answers committed meanwhile). An answer is
        committed in the transaction that ends its claim, so a key claimed after its memo lookup is looked up
        again: another process may have answered it between the two."""
        if not keys:
            return set(), {}
        mine = await self.store.claim_keys(keys, self.worker, self.ttl)
        answered = await self.store.lookup_many(list(mine)) if mine else {}
        if answered:
            self.store.post("release_keys", list(answered), self.worker)
        return mine - set(answered), answered

    def release(self, key: str) -> None:
        """Give up this worker's claim of ``key`` (asked of the store without waiting)."""
        self.store.post("release_keys", [key], self.worker)

    def wait_for(self, key: str, callback: Callable[[CachedResponse | None], Any]) -> None:
        """Call ``callback`` with the answer once another process committed it, or with None once the claim is
        this process's (the other one died or gave up): then the caller sends the request itself."""
        self.waiting.setdefault(key, []).append(callback)
        self._ensure_polling()

    def _ensure_polling(self) -> None:
        if self.waiting and (self._poller is None or self._poller.done()):
            self._poller = asyncio.ensure_future(self._poll())

    def busy(self) -> bool:
        self._ensure_polling()  # a poller that stopped on an error starts again
        return bool(self.waiting)

    async def _poll(self) -> None:
        while self.waiting:
            await asyncio.sleep(POLL)
            keys = list(self.waiting)
            try:
                found = await self.store.lookup_many(keys)
                mine, answered = await self.claim([key for key in keys if key not in found])
            except Exception as exc:  # a store that does not answer for a moment: ask again next time
                self.note(f"looking for answers other processes fetch failed ({type(exc).__name__}: {exc})")
                continue
            found.update(answered)
            for key in keys:
                answer = found.get(key)
                if answer is None and key not in mine:
                    continue
                for callback in self.waiting.pop(key, []):
                    callback(answer)
