"""Several processes on one run, and several runs sending the same requests.

Every process that works on a run (``runner submit``, ``runner resume``, ``runner work RUN_ID`` on any machine
sharing the store) joins it as a worker and sends heartbeats. A stage's planned tasks are cut into chunks of
:data:`runner.engine.dispatch.CHUNK`; a worker leases a chunk before dispatching it and skips chunks another
live worker holds, so the workers split a stage between them. A lease lives while its worker's heartbeats
come; when a worker dies (kill -9, a lost machine) its leases expire and another worker takes the chunk over,
skipping the tasks already committed. A worker that reaches the end of a stage waits for the chunks others
hold before the next stage starts.

Before a request that is not in the memo is sent, its cache key is claimed in the store. An identical request
claimed by another live process (another worker of the run, or another run of the same job started at the
same time) is not sent again: the task waits for the answer to appear in the memo and records it as a cache
hit. A claim ends when the answer is committed, when the request fails, or when its worker's heartbeats stop.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import time
from collections.abc import Callable
from typing import Any

from runner.store import CachedResponse, Store

#: seconds a lease or claim outlives its worker's last heartbeat (RUNNER_LEASE_TTL overrides)
DEFAULT_TTL = 30.0
#: seconds between polls of the memo for answers another process is fetching, and of chunks others hold
POLL = 0.2


def lease_ttl() -> float:
    value = os.environ.get("RUNNER_LEASE_TTL")
    try:
        return max(0.5, float(value)) if value else DEFAULT_TTL
    except ValueError:
        return DEFAULT_TTL


class Crew:
    """This process's membership of a run: its worker id, heartbeats, chunk leases and request claims."""

    def __init__(self, store: Store, run_id: str, *, ttl: float | None = None, note: Callable[[str], None] | None
                 = None) -> None:
        self.store = store
        self.run_id = run_id
        self.ttl = ttl or lease_ttl()
        self.worker = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.note = note or (lambda message: None)
        self._beat: asyncio.Task[None] | None = None
        #: live processes working on the run (this one included), counted by the heartbeat thread: each takes
        #: this share of the endpoints' rate limits
        self.live = 1
        #: called with the new count when processes join or leave the run (the dispatcher splits its rate limits)
        self.on_live: Callable[[int], Any] | None = None
        #: requests another process is sending: key -> callbacks waiting for the answer or for the claim
        self.waiting: dict[str, list[Callable[[CachedResponse | None], Any]]] = {}
        self._poller: asyncio.Task[None] | None = None

    # -- membership ---------------------------------------------------------------------------------
    def join(self) -> None:
        self.store.join_run(self.run_id, self.worker, socket.gethostname(), os.getpid(), self.ttl)
        self.live = self._count_live()
        self._beat = asyncio.ensure_future(self._heartbeats())

    async def leave(self) -> None:
        for task in (self._beat, self._poller):
            if task is not None:
                task.cancel()
        self.resolve_dead()  # a worker that died since the last heartbeat is not left holding reservations
        self.store.leave_run(self.worker)

    def resolve_dead(self) -> None:
        """A dead worker's reservations become possibly billed, as after a crash: counted as spent, no longer
        holding budget room as if in flight."""
        for worker in self.store.dead_workers(self.run_id):
            possibly = self.store.resolve_worker(self.run_id, worker)
            self.note(f"worker {worker} stopped sending heartbeats: its chunks are taken over and its {possibly} "
                      "requests in flight are kept as possibly billed at their worst case")

    def _count_live(self) -> int:
        return max(1, sum(1 for row in self.store.workers(self.run_id) if row["state"] == "live"))

    async def _heartbeats(self) -> None:
        # A heartbeat every quarter of the lease, so three can be late (an event loop busy with a provider's first
        # import or a long planning step) before the lease expires; the live count is read every second.
        beat = self.ttl / 4
        last = time.monotonic()
        while True:
            await asyncio.sleep(min(1.0, beat))
            try:
                live = self._count_live()
                if live != self.live:
                    self.live = live
                    if self.on_live is not None:
                        self.on_live(live)
                if time.monotonic() - last < beat:
                    continue
                last = time.monotonic()
                self.store.heartbeat(self.worker, self.ttl)
                self.resolve_dead()
            except Exception as exc:  # a store that does not answer for a moment: beat again next time
                self.note(f"heartbeat failed ({type(exc).__name__}: {exc}); trying again")

    def others(self) -> int:
        """Other workers that joined this run (live or not)."""
        return sum(1 for row in self.store.workers(self.run_id) if row["id"] != self.worker)

    # -- chunk leases -------------------------------------------------------------------------------
    def claim_chunks(self, stage: str, chunks: list[int]) -> dict[int, str | None]:
        return self.store.claim_chunks(self.run_id, stage, chunks, self.worker, self.ttl)

    def take_expired(self, stage: str) -> int | None:
        return self.store.take_expired_chunk(self.run_id, stage, self.worker, self.ttl)

    def finish(self, stage: str, chunks: list[int] | None = None) -> None:
        """These leases of the stage (all this worker holds, by default) are done: their tasks are committed."""
        self.store.finish_chunks(self.run_id, stage, self.worker, chunks)

    def open_chunks(self, stage: str) -> int:
        return self.store.open_chunks(self.run_id, stage)

    # -- request claims -----------------------------------------------------------------------------
    def claim(self, keys: list[str]) -> tuple[set[str], dict[str, CachedResponse]]:
        """Claim requests to send: (the keys now this worker's, answers committed meanwhile). An answer is
        committed in the transaction that ends its claim, so a key claimed after its memo lookup is looked up
        again: another process may have answered it between the two."""
        if not keys:
            return set(), {}
        mine = self.store.claim_keys(keys, self.worker, self.ttl)
        answered = self.store.lookup_many(list(mine)) if mine else {}
        if answered:
            self.store.release_keys(list(answered), self.worker)
        return mine - set(answered), answered

    def release(self, key: str) -> None:
        self.store.release_keys([key], self.worker)

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
                found = self.store.lookup_many(keys)
                mine, answered = self.claim([key for key in keys if key not in found])
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
