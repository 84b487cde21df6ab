"""One task the memo could not answer, from the dispatch loop to its answer: joined to the identical request already
on its way (sent once, the answer shared), handed to the Batch API side, or reserved against its budgets, admitted
to its endpoint and sent, with its answer or failure recorded.

The per-request path for a fresh request is: take an endpoint slot, wait for its limiters, call the provider,
queue the result (runner/engine/online.py does the attempts).

Admission is per endpoint: a request whose endpoint has no free slot waits in that endpoint's own line (a task of
its own, which reserves its budget once it has the slot) while the dispatch loop goes on handing the chunk's other
requests to their endpoints, so a slow endpoint (the embedded model, one request at a time) does not set the pace
of the others in the same stage (a run that has used one endpoint so far waits in the loop: nothing else could go
on, and a line costs a few per cent of throughput). A line is bounded (``ENDPOINT_LINE``; ``LEASE`` while other
workers share the run, so one worker does not lease far ahead of what it sends, and in a stage with ``stop:``);
past it the loop waits for the slot itself. A request of a prompt-cache group whose first request is on its way
waits for that answer (``_after_first``), holding neither a slot nor a reservation.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runner.engine.budget import Reservation
from runner.engine.control import RunControl, Spawned
from runner.engine.endpoints import Endpoints
from runner.engine.leases import LEASE, ChunkLeases
from runner.engine.limits import Endpoint
from runner.engine.online import LeaseLost, NotReserved, Sender
from runner.engine.recorder import Recorder, memo_of
from runner.engine.reserver import FREE, Reserver
from runner.engine.retry import Tally
from runner.engine.stats import RunStats
from runner.errors import ModelSetupError, ProviderError, QuotaExceeded, Refused, RunnerError
from runner.plan.request import Task

if TYPE_CHECKING:  # the Batch API side and the prompt-cache plan: imported by a run that uses them (assembly.py)
    from runner.engine.batch import Batcher
    from runner.engine.null_parts import NoBatcher, NoPromptCache
    from runner.engine.prompt_cache import PromptCachePlan

__all__ = ["ENDPOINT_LINE", "NOT_SENT", "InFlight"]

#: what tasks following an identical request get when it was not sent after all
NOT_SENT: Any = object()
#: requests that may wait in one endpoint's line for a slot while the dispatch loop goes on (see the docstring)
ENDPOINT_LINE = 4096


class InFlight:
    """The requests on their way, and each task's way to its answer. It reaches the rest of the engine only through
    the parts it is given: the reserver, the sender and the recorder each request goes through, the endpoints, the
    chunk leases (and the crew they hold), the Batch API side, the prompt-cache plan, the run's control flag, and
    the set of tasks it spawns."""

    def __init__(self, *, control: RunControl, stats: RunStats, endpoints: Endpoints, leases: ChunkLeases,
                 reserver: Reserver, sender: Sender, recorder: Recorder, batcher: Batcher | NoBatcher,
                 prompt_cache: PromptCachePlan | NoPromptCache, spawned: Spawned) -> None:
        self.control = control
        self.stats = stats
        self.endpoints = endpoints
        self.leases = leases
        self.reserver = reserver
        self.sender = sender
        self.recorder = recorder
        self.batcher = batcher
        self.prompt_cache = prompt_cache
        self.spawn = spawned.spawn
        #: requests on their way, by key: the answer, the error that ended it, NOT_SENT, or None (not sent)
        self.on_way: dict[str, asyncio.Future[Any]] = {}
        #: whether a task is no longer to be sent although the run goes on (its stage stopped early); None without a
        #: stage that stops early, so the common path asks nothing
        self.skip: Callable[[Task], bool] | None = None
        #: stages whose lines stay as short as a lease even when this worker is alone: a stage with ``stop:``, whose
        #: rule reads answers in the order they were asked, and whose leases a worker joining later should find
        #: untaken rather than held in this worker's lines (4,096 deep per endpoint)
        self.short_lines: set[str] = set()

    async def send_online(self, req: Task) -> bool:
        """Dispatch one task the memo cannot answer (the Batch API side sends online what a deadline leaves); False
        when the run is stopping and nothing more should be dispatched."""
        return await self.dispatch(req, asyncio.get_running_loop())

    async def dispatch(self, req: Task, loop: asyncio.AbstractEventLoop) -> bool:
        """Send one task that is not in the memo (or join the identical request on its way, or hand it to the
        Batch API); False when the run is stopping and nothing more should be dispatched."""
        if self.skip is not None and self.skip(req):  # its stage stopped early: not sent, the run goes on
            self.leases.take_fence(req)
            self._unclaim(req.key)
            return True
        leader = self.on_way.get(req.key)
        if leader is not None:  # the same request is on its way already: pay once, share the answer
            self.spawn(self._follow(req, leader))
            return True
        reserver = self.reserver
        if reserver.closed(req):
            self.stats.counters(req.stage, req.model).over_budget += 1
            self.leases.take_fence(req)
            self._unclaim(req.key)
            return True
        if self.batcher.wants(req):
            # a Batch API stage runs in the process that started it; its lines are recorded whenever they come back
            self.leases.take_fence(req)
            await self.batcher.add(req)
            return not self.control.stopping
        if await self.leases.lost_lease_of(req):  # its lease was taken over: another worker does it
            self.leases.take_fence(req)
            self.stats.counters(req.stage, req.model).elsewhere += 1
            self._unclaim(req.key)
            return True
        # On its way from here: an identical task dispatched meanwhile follows this one instead of sending it too.
        self.on_way[req.key] = loop.create_future()
        endpoint = self.endpoints.of(req, self.prompt_cache.group(req) if self.endpoints.pools else None)
        if (first := self.prompt_cache.gate(req, self.on_way[req.key])) is not None:
            self.spawn(self._after_first(first, req, endpoint))  # its prompt-cache group's first is on its way
            return True
        slots = endpoint.slots
        # busy endpoint: the loop goes on with the others (with one endpoint so far, nothing could go on meanwhile)
        if len(self.endpoints.by_name) > 1 and (slots.held >= slots.limit or slots.waiters) \
                and len(slots.waiters) < self._line_limit(req):
            self.spawn(self._wait_in_line(req, endpoint))
            return True
        if not self.reserver.free(req.model):
            # A priced request is reserved in a task of its own once its endpoint has a slot for it, so that the
            # reservations of the requests dispatched together share one ledger transaction
            # (runner/engine/ledger_writes.py) instead of the dispatch waiting for one commit after another.
            await endpoint.slots.acquire()
            if self.control.stopping:
                endpoint.slots.release()
                self._not_sent(req.key)
                return False
            self.spawn(self._wait_in_line(req, endpoint, held=True))
            return True
        reservation = await self._admit(req, endpoint)
        if reservation is None:  # a stop, or a stage stopped early: this request stays for a resume
            self._not_sent(req.key)
            return not self.control.stopping
        self.spawn(self._send(req, endpoint, reservation))
        return True

    async def _admit(self, req: Task, endpoint: Endpoint, *, held: bool = False) -> Reservation | None:
        """A slot at ``req``'s endpoint (``held``: taken already), then its budget, in this order on every path: a
        reservation held while waiting for a slot waited forever when the slots were held by requests in line, each
        waiting for the budget that reservation held (a budget waits while reservations are in flight, which may
        settle for less). None, the slot given back: the run is stopping, the request's stage stopped early, or a
        budget ran out."""
        if not held:
            await endpoint.slots.acquire()
        try:
            if self.control.stopping or (self.skip is not None and self.skip(req)):
                reservation = None
            elif self.reserver.free(req.model):
                reservation = FREE  # nothing to reserve or record: no coroutine on the common free path
            else:
                reservation = await self.reserver.reserve(req)
        except BaseException:
            endpoint.slots.release()
            raise
        if reservation is None:
            endpoint.slots.release()
            return None
        assert isinstance(reservation, Reservation)
        return reservation

    def _line_limit(self, req: Task) -> int:
        crew = self.leases.crew
        alone = crew is None or crew.live <= 1
        return ENDPOINT_LINE if alone and req.stage not in self.short_lines else LEASE

    async def _wait_in_line(self, req: Task, endpoint: Endpoint, *, held: bool = False) -> None:
        """Send ``req`` once its endpoint has a slot for it (``held``: it has one); its budget is reserved then,
        before it is sent, so a request waiting in line holds no reservation."""
        try:
            reservation = await self._admit(req, endpoint, held=held)
        except asyncio.CancelledError:  # abandoned (second Ctrl-C) before it was sent: a resume sends it
            future = self.on_way.pop(req.key, None)
            if future is not None:
                future.cancel()
            raise
        except RunnerError as exc:  # the store refused the reservation (a full disk): the run ends on it, as the
            self._not_sent(req.key)  # dispatch loop's own reservation would end it, instead of a lost task's error
            self.control.fail(exc)
            return
        except Exception as exc:  # the store could not write it (locked past RUNNER_STORE_WAIT, its server gone)
            self._not_sent(req.key)
            self.reserver.store_failed(exc)
            return
        if reservation is None:  # a stop, or a budget that ran out: this request stays for a resume
            self._not_sent(req.key)
            return
        await self._send(req, endpoint, reservation)

    async def _after_first(self, first: asyncio.Future[Any], req: Task, endpoint: Endpoint) -> None:
        """Send ``req`` once the first request of its prompt-cache group has its answer (or failed)."""
        try:
            await asyncio.shield(first)
        except asyncio.CancelledError:
            if not first.cancelled():  # this task itself was abandoned: a resume sends it
                future = self.on_way.pop(req.key, None)
                if future is not None:
                    future.cancel()
                raise
        await self._wait_in_line(req, endpoint)

    def _not_sent(self, key: str) -> None:
        """A request that was on its way is not sent after all: tasks following it dispatch themselves again."""
        future = self.on_way.pop(key, None)
        if future is not None and not future.done():
            future.set_result(NOT_SENT)
        self.prompt_cache.forget(key)
        self._unclaim(key)

    def _unclaim(self, key: str) -> None:
        """Give up this process's claim of a request it will not send (another process may send it)."""
        crew = self.leases.crew
        if crew is not None and key not in self.on_way:
            crew.release(key)

    async def _send(self, req: Task, endpoint: Endpoint, reservation: Reservation) -> None:
        future = self.on_way[req.key]
        tries = Tally()

        async def reserve_again() -> bool:
            """The attempt before timed out and may have been billed: its reservation stays spent, as possibly
            billed, and the next attempt is reserved anew (False when its budget has no room: not sent again)."""
            nonlocal reservation
            self.reserver.keep_possibly_billed(req, reservation)
            again = FREE if self.reserver.free(req.model) else await self.reserver.reserve(req)
            if again is None:
                return False
            assert isinstance(again, Reservation)
            reservation = again
            return True

        try:
            completion, latency = await self.sender.send(req, endpoint, tries, reserve_again)
        except (LeaseLost, NotReserved) as exc:
            # taken over before it was sent (again): another worker does it; or a retry's budget had no room (its
            # earlier attempt is kept as possibly billed): a resume sends it if the budget allows
            if isinstance(exc, LeaseLost):
                self.reserver.release(reservation)
                self.leases.take_fence(req)
                self.stats.counters(req.stage, req.model).elsewhere += 1
            future.set_result(NOT_SENT)
            if self.leases.crew is not None:
                self.leases.crew.release(req.key)
        except ModelSetupError as exc:  # nothing was sent; the run cannot go on without this provider
            self.reserver.release(reservation)
            future.set_result(None)
            self.control.fail(exc)
        except ProviderError as exc:
            # An error answer is not billed (its reservation goes back), but a refusal's answer may be; a last
            # attempt that timed out may have been billed too: its reservation stays, as possibly billed.
            if tries.last_possibly_billed:
                self.reserver.keep_possibly_billed(req, reservation)
                self.recorder.failed(req, exc, tries.sent)
            else:
                self.recorder.failed(req, exc, tries.sent, reservation.ledger_id, reservation=reservation)
            future.set_result(exc)
            if isinstance(exc, QuotaExceeded):
                self.control.fail(exc)
        except asyncio.CancelledError:
            # Abandoned in flight: it may have been billed. Its reservation stays in the ledger, and the
            # report shows it as possibly billed until a resume settles it.
            future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - a defect, or an SDK that cannot take the request
            # The run ends on it, resumable: the task stays unanswered (never "completed" without it), its
            # reservation stays as possibly billed, and what waits for this answer (identical requests, its
            # prompt-cache group) is let go instead of waiting for ever.
            future.set_result(NOT_SENT)
            self.control.fail(RunnerError(f"unexpected {type(exc).__name__} sending a request to {req.model}: "
                                          f"{exc}; the run is resumable (RUNNER_RAISE_ERRORS=1 shows where)"))
            if os.environ.get("RUNNER_RAISE_ERRORS"):
                raise
        else:
            try:
                self.recorder.fresh(req, completion, tries.sent, latency, reservation)
            finally:  # whatever happens, requests waiting for this answer get it
                future.set_result(completion)
        finally:
            self.on_way.pop(req.key, None)
            endpoint.slots.release()
            self.prompt_cache.forget(req.key)

    async def _follow(self, req: Task, leader: asyncio.Future[Any]) -> None:
        try:
            completion = await asyncio.shield(leader)
        except asyncio.CancelledError:
            return
        if completion is NOT_SENT:  # the request it followed was not sent (a budget, a stop): try on its own
            if not self.control.stopping:
                await self.dispatch(req, asyncio.get_running_loop())
            return
        if isinstance(completion, Refused):  # refused for this task too, and billed once (to the request sent)
            self.recorder.failed(req, Refused(str(completion)), 0)
            return
        if completion is None or isinstance(completion, ProviderError):
            self.recorder.failed(req, ProviderError("the identical request sent for another task failed"), 0)
            return
        self.recorder.cached(req, memo_of(completion))
