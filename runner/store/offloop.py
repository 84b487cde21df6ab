"""The store off the event loop: a run's store calls made by a thread of their own, awaited by the loop.

Every :class:`~runner.store.base.Store` method is a blocking call (for PostgreSQL a network round trip). Made from the
event loop, a slow disk, a lock another process holds or a stopped server would stall everything the loop runs with
it: heartbeats, the rate limiters, the live view. So once a run is under way the engine reaches its store through a
:class:`LoopStore`: each method a coroutine that hands the call to the store's :class:`StoreThread` (one thread, which
owns the connection: its calls run one after the other, in the order they were asked, and never two threads' statements
inside one transaction) and awaits it. The run's heartbeats have a second connection and thread of their own
(:meth:`Store.reopen <runner.store.base.Store.reopen>`), so they never wait behind the writer's commits.

:class:`StoreWatch` says, in one line, when a call has waited :data:`SLOW_S` seconds (and when the store answers
again), and past ``RUNNER_STORE_WAIT`` tells the run to stop sending (a SQLite store bounds its lock waits itself:
runner/store/sqlite_lock.py). Why a thread and not psycopg's async connection, with the figures: ARCHITECTURE.md,
"Decisions of the store off the event loop".
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from runner.store.base import Store

__all__ = ["SLOW_S", "LoopStore", "StoreThread", "StoreWatch", "off_loop"]

T = TypeVar("T")
log = logging.getLogger(__name__)

#: seconds a store call may wait before the run says the store is slow
SLOW_S = 5.0
#: the interpreter's switch interval while a run's store thread works (Python's default is 5 ms): the thread gives
#: the GIL up at each SQLite step or network wait and must get it back from a busy event loop, which lets go of it
#: only every switch interval; at 5 ms a zero-latency run's commits fell behind and its requests/s halved
#: (bench/RESULTS.md, "The store off the event loop")
SWITCH_INTERVAL_S = 0.0005


class StoreThread:
    """One thread making a store connection's calls, one after the other, in the order they were asked."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        #: time.monotonic() when the call running now started, None while the thread waits for one
        self.running_since: float | None = None

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        """``fn(*args, **kwargs)`` after the calls asked before it; its future."""
        def run() -> T:
            self.running_since = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                self.running_since = None
        return self._pool.submit(run)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in the thread, awaited. A caller cancelled meanwhile does not stop the call: it
        runs to its end (a transaction is never cut), and its result is dropped."""
        return await asyncio.wrap_future(self.submit(fn, *args, **kwargs))

    def close(self) -> None:
        """No more calls; the thread ends once the last one asked has (it is not waited for)."""
        self._pool.shutdown(wait=False)


class LoopStore:
    """A store as the event loop calls it: ``await loop_store.lookup_many(keys)`` runs ``store.lookup_many(keys)`` in
    the store's thread. Without a thread (the engine's parts built alone, in tests) the call is made at once, on the
    loop, as before. ``post`` asks for a call without waiting for it (giving back a reservation or a claim): it runs
    after every call asked before it, and its error goes to ``on_error``. Attributes that are not methods (``path``)
    are the store's."""

    def __init__(self, store: Store, thread: StoreThread | None = None, *,
                 on_error: Callable[[BaseException], None] | None = None) -> None:
        #: the store itself, for what is not a call (its path, its sentence for an error) and for the opening phases
        self.sync = store
        self.thread = thread
        self.on_error = on_error

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.sync, name)
        if not callable(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await self.run(attr, *args, **kwargs)
        call.__name__ = name
        self.__dict__[name] = call  # made once per method
        return call

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``, a function of the store's (or one that uses it), in the store's thread."""
        if self.thread is None:
            return fn(*args, **kwargs)
        return await self.thread.call(fn, *args, **kwargs)

    def post(self, name: str, *args: Any) -> None:
        """Call the store's method ``name`` after the calls asked so far, without waiting for it."""
        method = getattr(self.sync, name)
        if self.thread is None:
            method(*args)
            return
        future = self.thread.submit(method, *args)
        loop = asyncio.get_running_loop()
        future.add_done_callback(lambda done: loop.call_soon_threadsafe(self._posted, name, done))

    def _posted(self, name: str, done: concurrent.futures.Future[Any]) -> None:
        exc = done.exception()
        if exc is None:
            return
        if self.on_error is not None:
            self.on_error(exc)
        else:
            log.error("the store's %s failed: %s", name, exc)

    async def close(self) -> None:
        """Wait for the calls asked so far, then let the thread go (the store itself stays open)."""
        if self.thread is not None:
            await self.thread.call(lambda: None)
            self.thread.close()


def off_loop(store: Store | LoopStore) -> LoopStore:
    """``store`` as the engine calls it: a :class:`LoopStore` as given, or a store wrapped into one without a thread
    (its calls made on the loop: the engine's parts built alone, in tests)."""
    return store if isinstance(store, LoopStore) else LoopStore(store)


class StoreWatch:
    """Says when a store call has waited :data:`SLOW_S` seconds (one line, then one when the store answers again),
    and calls ``on_bound`` once when one has waited ``bound`` seconds (None: no bound here)."""

    def __init__(self, threads: list[StoreThread], path: str, say: Callable[[str], None], *,
                 slow_after: float = SLOW_S, bound: float | None = None,
                 on_bound: Callable[[float], None] | None = None, period: float = 1.0) -> None:
        self.threads = threads
        self.path = path
        self.say = say
        self.slow_after = slow_after
        self.bound = bound
        self.on_bound = on_bound
        self.period = period
        #: when the call the run said was slow started (None: none said)
        self._said: float | None = None
        self._bounded = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch(), name="store-watch")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def check(self, now: float) -> None:
        """One look at the store's calls."""
        started = [since for since in (t.running_since for t in self.threads) if since is not None]
        oldest = min(started, default=None)
        if self._said is not None and (oldest is None or oldest > self._said):
            self.say(f"the store {self.path} answers again, after {now - self._said:.0f} s")
            self._said = None
        if oldest is None:
            return
        waited = now - oldest
        if self._said is None and waited >= self.slow_after:
            self._said = oldest
            bound = f"; past {self.bound:g} s (RUNNER_STORE_WAIT) the run stops sending" if self.bound else ""
            self.say(f"the store {self.path} has not answered for {waited:.0f} s: heartbeats, rate limits and this "
                     f"view go on, and what is to be stored waits for it{bound}")
        if self.bound is not None and waited >= self.bound and not self._bounded:
            self._bounded = True
            if self.on_bound is not None:
                self.on_bound(waited)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            self.check(time.monotonic())
