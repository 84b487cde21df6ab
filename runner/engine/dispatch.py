"""The async engine: for each request of a stage, serve it from the memo or send it through its endpoint's
limits, with bounded retries, and hand the finished task to the store's writer.

The per-request path for a fresh request is: take an endpoint slot, wait for its limiters, call the
provider, queue the result. A cache hit never leaves the dispatch loop (no task is created for it).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from runner.engine.batch import Batcher
from runner.engine.budget import LATER, Budgets, Exhausted, Reservation, Scope
from runner.engine.limits import Endpoint
from runner.engine.retry import Tally, retrying
from runner.engine.stats import RunStats
from runner.engine.workers import POLL, Crew
from runner.errors import (
    AuthError,
    ModelSetupError,
    ProviderError,
    QuotaExceeded,
    RateLimited,
    Refused,
    RunnerError,
    TransientError,
)
from runner.evaluate.results import line_provenance, result_line
from runner.plan.prompts import Prompt, load_prompt
from runner.plan.request import Task
from runner.plan.stage import StagePlan
from runner.providers.base import Completion, Provider
from runner.providers.pricing import Pricing
from runner.providers.tokens import bound_call_tokens, count_call_tokens
from runner.spec.job import Job
from runner.store import CachedResponse, Finished, Store, Writer, dumps, now
from runner.store.base import Fence, Fenced

#: results queued for the writer before the dispatch loop waits for it to catch up
WRITER_BACKLOG = 4096
#: requests planned, checked against the memo and dispatched together
CHUNK = 256
#: tasks per lease when several processes may share a run (runner/engine/workers.py): small enough that a worker
#: joining a short run still finds work; a chunk's leases are taken in one transaction (CHUNK is a multiple)
LEASE = 64
#: leases of dead workers taken over at once (the plan is walked once for them)
TAKEOVER = 64


def _chunks(items: Iterable[Task], size: int) -> Iterator[list[Task]]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


#: transient errors that say the server is loaded (the adaptive concurrency backs off on these)
_LOAD_ERRORS = frozenset({"server_error", "timeout", "connection"})


#: the reservation of a free request outside any budget: no scope, no ledger row (never mutated)
FREE = Reservation([], 0.0, 0)
#: what tasks following an identical request get when it was not sent after all
NOT_SENT: Any = object()


class LeaseLost(Exception):
    """The task's chunk lease was taken over (its worker stalled past it): the request is not sent."""


def memo_of(c: Completion, cost: float = 0.0) -> CachedResponse:
    """A fresh answer as the memo gives it back (its thinking with it)."""
    return CachedResponse(c.text, c.finish_reason, c.input_tokens, c.output_tokens, c.cached_tokens, cost,
                          c.thinking, c.reasoning_tokens)


def billed_of(exc: ProviderError) -> Completion | None:
    """The usage a failed request was billed for (a refusal's answer), or None when it cost nothing."""
    billed = getattr(exc, "billed", None)
    if isinstance(billed, Completion) and (billed.input_tokens or billed.output_tokens):
        return billed
    return None


def budgets_of(job: Job) -> Budgets | None:
    """The job's budgets (run, per stage, per model), or None when it sets none."""
    stages = {stage.name: Scope("stage", stage.name, stage.budget.usd, stage.budget.tokens)
              for stage in job.stages if stage.budget is not None}
    if job.budget is None and not stages:
        return None
    run = Scope("run", job.name, job.budget.usd if job.budget else None, job.budget.tokens if job.budget else None)
    models = {model: Scope("model", model, limit.usd, limit.tokens)
              for model, limit in (job.budget.models.items() if job.budget else ())}
    budgets = Budgets(run, stages, models)
    return budgets if budgets.limited else None


class Dispatcher:
    def __init__(
        self,
        *,
        run_id: str,
        job: Job,
        store: Store,
        writer: Writer,
        providers: dict[str, Provider],
        stats: RunStats,
        resume: bool = False,
        sleep: Callable[[float], Any] = asyncio.sleep,
        deadline: float | None = None,
    ) -> None:
        """``deadline``: when the run's answers are needed (epoch seconds), for stages in ``mode: auto``."""
        self.run_id = run_id
        self.job = job
        self.store = store
        self.writer = writer
        self.providers = providers
        self.stats = stats
        self.resume = resume
        self.sleep = sleep
        self.pricing = Pricing(job)
        self.budgets = budgets_of(job)
        if self.budgets is not None and resume:  # what earlier attempts of this run spent still counts
            for stage, model, usd, tokens in store.spent(run_id):
                self.budgets.spend(stage, model, usd, tokens)
        #: the budget that ran out, when one did (the run ends ``budget_exhausted``)
        self.exhausted: Scope | None = None
        self.closed_stages: set[str] = set()
        self.closed_models: set[tuple[str, str]] = set()
        self._free: dict[str, bool] = {}
        self.stages = {stage.name: stage for stage in job.stages}
        #: each (stage, model)'s result-line provenance, built for its first finished task, and each stage's
        #: prompt as its plan rendered it
        self.provenance: dict[tuple[str, str], dict[str, Any]] = {}
        self.prompts: dict[str, Prompt] = {}
        #: the Batch API side of the engine, when a stage may use it
        self.batcher: Batcher | None = None
        if any(job.stage_mode(stage) != "online" for stage in job.llm_stages()):
            self.batcher = Batcher(self, deadline)
        self.endpoints: dict[str, Endpoint] = {}
        #: requests on their way, by key: the answer, the error that ended it, NOT_SENT, or None (not sent)
        self.inflight: dict[str, asyncio.Future[Any]] = {}
        #: answers received since the current chunk's memo query, so a repeat of the request is not re-sent
        self.recent: dict[str, CachedResponse] = {}
        self.committed_keys: list[str] = []
        self.tasks: set[asyncio.Task[None]] = set()
        #: set by the first Ctrl-C, or by an error that ends the run: nothing new is dispatched
        self.stopping = False
        self.fatal: RunnerError | None = None
        #: providers start (open clients, load weights) on their first cache miss, once
        self._starting: dict[str, asyncio.Future[None]] = {}
        self._retrying = retrying(job.retry, on_retry=self._count_retry, sleep=sleep)
        #: this process's membership of the run (leases, claims, shared budgets), set by the engine
        self._crew: Crew | None = None
        #: the lease each task dispatched under one was dispatched under, by id() of the task (its writes carry it)
        self.fence_of: dict[int, Fence] = {}
        #: joined a run another process started (``runner work``): every chunk is checked for done tasks
        self.joined = False
        #: (stage, item) of tasks dispatched under a lease -> (stage, lease), and per lease the tasks not committed
        self.lease_of: dict[tuple[str, str], tuple[str, int]] = {}
        self.lease_left: dict[tuple[str, int], int] = {}

    @property
    def crew(self) -> Crew | None:
        return self._crew

    @crew.setter
    def crew(self, crew: Crew | None) -> None:
        self._crew = crew
        if crew is not None:
            crew.on_lost = self.lost_leases

    def lost_leases(self, leases: list[tuple[str, int]]) -> None:
        """Crew callback: these leases were taken over; their tasks still to send are not sent (:meth:`_lost`), and
        their writes are refused by the store."""
        for lease in leases:
            self.lease_left.pop(lease, None)
        self.stats.notes.append(f"{len(leases)} leases of this worker were taken over by others after its "
                                "heartbeats came late: it stopped them")

    def _lost(self, req: Task) -> bool:
        """Whether the task was dispatched under a lease this worker no longer holds. A worker whose last heartbeat
        is older than half its lease (it may have stalled) beats first, so it learns what it lost before sending."""
        fence = self.fence_of.get(id(req))
        if fence is None or self.crew is None:
            return False
        if self.crew.stale():
            try:
                self.crew.beat()
            except Exception as exc:  # the store does not answer: the write will be fenced if the lease is gone
                self.stats.notes.append(f"heartbeat failed ({type(exc).__name__}: {exc})")
        return not self.crew.holds(fence)

    # -- endpoints -------------------------------------------------------------------------------------
    def endpoint(self, req: Task) -> Endpoint:
        provider = self.providers[req.provider]
        name = provider.endpoint_key(req.model_name)
        found = self.endpoints.get(name)
        if found is None:
            s = provider.settings_for(req.model_name)
            limited = any((s.rpm, s.tpm, s.itpm, s.otpm, s.concurrency))
            found = self.endpoints[name] = Endpoint(
                name, concurrency=s.concurrency or provider.default_concurrency, rpm=s.rpm, tpm=s.tpm,
                itpm=s.itpm, otpm=s.otpm,
                # a job that configures nothing lets the endpoint find its own concurrency until the
                # server's headers state the limits
                adaptive=not limited and provider.adaptive,
            )
            if self.crew is not None:
                found.set_share(1 / self.crew.live)
        return found

    def _count_retry(self, task: Task) -> None:
        self.stats.counters(task.stage, task.model).retries += 1

    # -- the dispatch loop -------------------------------------------------------------------------
    async def run_stage(self, plan: StagePlan, *, wait_for_batches: bool = True) -> None:
        """Dispatch every task of the stage; ``wait_for_batches`` off leaves its Batch API batches running (the
        caller waits for several stages' batches together with :meth:`finish_batches`)."""
        loop = asyncio.get_running_loop()
        stage = plan.stage.name
        self.prompts[stage] = plan.prompt  # the template its lines' provenance names
        # A pipeline runs in one process (a stage may run again for a retry round): its chunks are not leased.
        leasing = self.crew is not None and not self.job.is_pipeline
        for number, chunk in enumerate(_chunks(plan, CHUNK)):
            if self.stopping:
                break
            if not leasing:
                await self._breathe()
                await self._dispatch_chunk(chunk, loop, check_done=self.resume)
                continue
            assert self.crew is not None
            first = number * (CHUNK // LEASE)
            parts = [chunk[start:start + LEASE] for start in range(0, len(chunk), LEASE)]
            # Alone, the chunk's leases are taken in one transaction; with other workers live, one at a time, so
            # each worker holds only what it is about to send.
            step = len(parts) if self.crew.live == 1 else 1
            for start in range(0, len(parts), step):
                if self.stopping:
                    break
                indices = [first + n for n in range(start, min(start + step, len(parts)))]
                leases = self.crew.claim_chunks(stage, indices)
                mine: list[Task] = []
                lease_of: dict[str, int] = {}
                for index in indices:
                    if leases[index]:
                        mine.extend(parts[index - first])
                        lease_of.update((req.item, index) for req in parts[index - first])
                    else:  # another live worker holds it
                        for req in parts[index - first]:
                            self.stats.counters(stage, req.model).elsewhere += 1
                if mine:
                    await self._breathe()
                    await self._dispatch_chunk(mine, loop, check_done=self.resume or self.joined
                                               or "taken" in leases.values(), lease_of=lease_of)
        await self.drain()
        if leasing:
            await self._finish_chunks(plan, loop)
        if self.batcher is not None and not self.stopping:
            await self.batcher.submit_pending(plan.stage.name)  # its batches start while later stages are planned
        if wait_for_batches:
            await self.finish_batches({plan.stage.name})

    async def _dispatch_chunk(self, chunk: list[Task], loop: asyncio.AbstractEventLoop, *, check_done: bool,
                              lease_of: dict[str, int] | None = None) -> None:
        """Serve a chunk's tasks from the memo, and send the others (those no other process is sending).
        ``lease_of``: each task's lease, marked done once all its tasks are committed (:meth:`committed`)."""
        stage = chunk[0].stage
        done = self.store.done_items(self.run_id, stage, [r.item for r in chunk]) if check_done else ()
        if lease_of is not None:
            assert self.crew is not None
            for req in chunk:
                if req.item not in done:
                    lease = self.lease_of[(stage, req.item)] = (stage, lease_of[req.item])
                    self.lease_left[lease] = self.lease_left.get(lease, 0) + 1
                    fence = self.crew.fence(stage, lease_of[req.item])
                    if fence is not None:
                        self.fence_of[id(req)] = fence
        memo = self.store.lookup_many([r.key for r in chunk])
        # What was committed before that query is in ``memo`` or will be in the next chunk's: forget it.
        for key in self.committed_keys:
            self.recent.pop(key, None)
        self.committed_keys.clear()
        to_send: list[Task] = []
        for req in chunk:
            if req.item in done:
                counters = self.stats.counters(req.stage, req.model)
                counters.done += 1
                counters.resumed += 1
                continue
            cached = memo.get(req.key) or self.recent.get(req.key)
            if cached is not None:
                self._finish_cached(req, cached)
                continue
            to_send.append(req)
        mine: set[str] = set()
        answered: dict[str, CachedResponse] = {}
        # Batch API lines are not claimed: a claim held until a batch ends would keep other processes waiting on it.
        batching = self.batcher is not None and any(self.batcher.wants(req) for req in to_send)
        if self.crew is not None and to_send and not batching:
            mine, answered = self.crew.claim(sorted({req.key for req in to_send} - set(self.inflight)))
        for req in to_send:
            if self.stopping:
                break
            # answered while this chunk was being dispatched, or by another process before the claim
            cached = self.recent.get(req.key) or answered.get(req.key)
            if cached is not None:
                self._finish_cached(req, cached)
            elif self.crew is not None and not batching and req.key not in mine and req.key not in self.inflight:
                # another process is sending the identical request: wait for its answer
                self.crew.wait_for(req.key, lambda answer, req=req: self._answered_elsewhere(req, answer, loop))
            elif not await self._dispatch(req, loop):
                break

    def _answered_elsewhere(self, req: Task, answer: CachedResponse | None, loop: asyncio.AbstractEventLoop) -> None:
        if answer is not None:
            self._finish_cached(req, answer)
        elif not self.stopping:  # the other process gave the claim up: this one sends it
            self._spawn(self._dispatch(req, loop))

    async def _finish_chunks(self, plan: StagePlan, loop: asyncio.AbstractEventLoop) -> None:
        """The end of a stage for one of several workers: mark this worker's chunks done once their tasks are
        committed, take over the chunks of workers that died, and wait for those live workers still hold."""
        assert self.crew is not None
        stage = plan.stage.name
        while not self.stopping:
            await self.writer.flush()
            self.crew.finish(stage)
            taken: list[int] = []
            while len(taken) < TAKEOVER and (index := self.crew.take_expired(stage)) is not None:
                taken.append(index)
            if taken:
                self.crew.resolve_dead()  # its reservations are settled before its requests are sent again
                self.stats.notes.append(f"stage {stage}: took over {len(taken)} leases of a worker that stopped")
                wanted, last = set(taken), max(taken)
                # the plan is walked once for all of them, up to the last one
                for index, part in enumerate(_chunks(itertools.islice(plan, (last + 1) * LEASE), LEASE)):
                    if index in wanted and not self.stopping:
                        await self._dispatch_chunk(part, loop, check_done=True,
                                                   lease_of=dict.fromkeys((req.item for req in part), index))
                await self.drain()
                continue
            if self.crew.open_chunks(stage) == 0:
                return
            await asyncio.sleep(POLL)

    async def finish_batches(self, stages: set[str]) -> None:
        """Wait for the Batch API batches of these stages (and send online what a deadline leaves)."""
        if self.batcher is not None:
            await self.batcher.finish(stages)
            await self.drain()  # what a deadline sent online

    async def _dispatch(self, req: Task, loop: asyncio.AbstractEventLoop) -> bool:
        """Send one task that is not in the memo (or join the identical request on its way, or hand it to the
        Batch API); False when the run is stopping and nothing more should be dispatched."""
        leader = self.inflight.get(req.key)
        if leader is not None:  # the same request is on its way already: pay once, share the answer
            self._spawn(self._follow(req, leader))
            return True
        if req.stage in self.closed_stages or (req.stage, req.model) in self.closed_models:
            self.stats.counters(req.stage, req.model).over_budget += 1
            self.fence_of.pop(id(req), None)
            self._unclaim(req.key)
            return True
        if self.batcher is not None and self.batcher.wants(req):
            # a Batch API stage runs in the process that started it; its lines are recorded whenever they come back
            self.fence_of.pop(id(req), None)
            await self.batcher.add(req)
            return not self.stopping
        if self._lost(req):  # its lease was taken over: another worker does it
            self.fence_of.pop(id(req), None)
            self.stats.counters(req.stage, req.model).elsewhere += 1
            self._unclaim(req.key)
            return True
        # On its way from here: an identical task dispatched meanwhile follows this one instead of sending it too.
        self.inflight[req.key] = loop.create_future()
        if self.budgets is None and not self._priced(req.model):
            reservation = FREE  # nothing to reserve or record: no coroutine on the common free path
        else:
            reservation = await self._reserve(req)
        if reservation is None:  # a budget ran out: this request stays for a resume
            self._not_sent(req.key)
            return not self.stopping
        endpoint = self.endpoint(req)
        await endpoint.slots.acquire()
        if self.stopping:
            endpoint.slots.release()
            self._release(reservation)
            self._not_sent(req.key)
            return False
        self._spawn(self._send(req, endpoint, reservation))
        return True

    def _not_sent(self, key: str) -> None:
        """A request that was on its way is not sent after all: tasks following it dispatch themselves again."""
        future = self.inflight.pop(key, None)
        if future is not None and not future.done():
            future.set_result(NOT_SENT)
        self._unclaim(key)

    def _unclaim(self, key: str) -> None:
        """Give up this process's claim of a request it will not send (another process may send it)."""
        if self.crew is not None and key not in self.inflight:
            self.crew.release(key)

    # -- budgets -----------------------------------------------------------------------------------------
    async def _reserve(self, req: Task, *, batch: bool = False) -> Reservation | str | None:
        """Reserve the request's worst case against its budgets and in the ledger; None when a budget ran out.
        A batch line is priced at the Batch API's price and never waits: it gets ``LATER`` while the budget has
        reservations in flight (a batch's settle only when the whole batch has ended)."""
        usd, tokens = self.worst_case(req, batch=batch)
        fence = None if batch else self.fence_of.get(id(req))
        while True:
            worker = self.crew.worker if self.crew is not None else None
            if self.budgets is None:
                reservation = Reservation([], usd, tokens)
            else:
                if batch:
                    got = self.budgets.try_reserve(req.stage, req.model, usd, tokens)
                else:
                    got = await self.budgets.reserve(req.stage, req.model, usd, tokens)
                if isinstance(got, Exhausted):
                    if batch and got.scope.inflight:
                        return LATER
                    self._out_of_budget(req, got.scope)
                    return None
                reservation = got
            limits = self.budgets.usd_limits(req.stage, req.model) if self.budgets is not None else {}
            if usd <= 0:
                return reservation
            try:
                if not limits:
                    reservation.ledger_id = self.store.reserve(self.run_id, req.stage, req.model, req.key, usd, worker,
                                                               fence=fence)
                    return reservation
                # The store has the last word: it counts what every process working on the run spent and reserved.
                ledger_id, blocked, inflight = self.store.reserve_within(self.run_id, req.stage, req.model, req.key,
                                                                         usd, limits, worker, fence=fence)
            except Fenced:  # its lease was taken over: not sent (the caller drops it)
                if self.budgets is not None and reservation.scopes:
                    self.budgets.release(reservation)
                if self.crew is not None and fence is not None:  # learnt at this write: stop the lease now
                    self.crew.leases.pop((fence.stage, fence.chunk), None)
                    self.lease_left.pop((fence.stage, fence.chunk), None)
                self.fence_of.pop(id(req), None)
                self.stats.counters(req.stage, req.model).elsewhere += 1
                return None
            if ledger_id is not None:
                reservation.ledger_id = ledger_id
                return reservation
            assert self.budgets is not None and blocked is not None
            self.budgets.release(reservation)
            if not inflight:
                self._out_of_budget(req, self.budgets.scope_named(blocked))
                return None
            if batch:
                return LATER
            if self.stopping:
                return None
            await asyncio.sleep(POLL)  # another process's reservations may settle below their worst case

    def worst_case(self, req: Task, *, batch: bool = False) -> tuple[float, int]:
        """(USD, tokens) the request can cost at most: its input tokens (exact, or a true upper bound where the
        provider's tokenizer is not available: ``bound_call_tokens``) and ``max_tokens``, in USD at the model's
        prices (the Batch API's for a batch line, where the model has them)."""
        max_tokens = req.call.params.get("max_tokens") or 0
        call = req.call
        input_tokens = bound_call_tokens(call.provider, call.model_name, call.messages, call.pairs,
                                         counted=self._input_tokens(req))
        rates = self.pricing.batch_rates(req.model) if batch else None
        usd = rates.worst_case(input_tokens, max_tokens) if rates is not None else \
            self.pricing.worst_case(req.model, input_tokens, max_tokens)
        return usd, input_tokens + max_tokens

    @staticmethod
    def _input_tokens(req: Task) -> int:
        """The request's input tokens (exact or expected), counted once: the token buckets take them, and the budget
        reservation starts from them (``worst_case``)."""
        call = req.call
        if call.input_tokens is None:
            call.input_tokens = count_call_tokens(call.provider, call.model_name, call.messages, call.pairs)
        return call.input_tokens

    def _priced(self, model: str) -> bool:
        """Whether the model costs anything (a free model needs no reservation unless a budget counts tokens)."""
        found = self._free.get(model)
        if found is None:  # an unknown price counts as free: without a budget the run goes on (and warns)
            rates = self.pricing.rates(model)
            found = self._free[model] = rates is None or rates.is_free
        return not found

    def _out_of_budget(self, req: Task, scope: Scope) -> None:
        self.stats.counters(req.stage, req.model).over_budget += 1
        if scope.kind == "run":
            self.exhausted = scope
            self.stopping = True
        elif scope.kind == "stage":
            self.closed_stages.add(req.stage)
        else:
            self.closed_models.update((stage, scope.name) for stage in self.stages)
        self.stats.notes.append(f"{scope.describe()} is spent: "
                                + ("the run stops" if scope.kind == "run" else f"{scope.kind} {scope.name} stops"))

    def _release(self, reservation: Reservation) -> None:
        if self.budgets is not None and reservation.scopes:
            self.budgets.release(reservation)
        if reservation.ledger_id is not None:
            self.store.release(reservation.ledger_id)

    def committed(self, batch: list[Finished]) -> None:
        """Writer callback: these answers are in the store; the next chunk's memo query will see them. A lease
        whose tasks are all committed is done: a worker taking over from this one would find nothing to do."""
        self.committed_keys.extend(item.response[0] for item in batch if item.response is not None)
        if self.lease_of:
            finished: dict[str, list[int]] = {}
            for item in batch:
                lease = self.lease_of.pop((item.stage, item.task[2]), None)
                if lease is not None and lease in self.lease_left:  # (not one this worker lost)
                    self.lease_left[lease] -= 1
                    if not self.lease_left[lease]:
                        del self.lease_left[lease]
                        finished.setdefault(lease[0], []).append(lease[1])
            for stage, chunks in finished.items():
                assert self.crew is not None
                self.crew.finish(stage, chunks)

    def share_limits(self, live: int) -> None:
        """Split every endpoint's rate limits with the ``live`` processes working on the run now."""
        for endpoint in self.endpoints.values():
            endpoint.set_share(1 / live)

    async def _breathe(self) -> None:
        # Let the writer and the view run between chunks, and keep the writer's queue short.
        await asyncio.sleep(0)
        while self.writer.queue.qsize() > WRITER_BACKLOG:
            await asyncio.sleep(0.005)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def drain(self) -> None:
        while self.tasks or (self.crew is not None and self.crew.busy()):
            if self.stopping and self.crew is not None:
                self.crew.waiting.clear()  # answers another process is fetching are not waited for
            if self.tasks:
                await asyncio.wait(set(self.tasks))
            elif self.crew is not None and self.crew.busy():
                await asyncio.sleep(POLL / 2)

    def request_stop(self) -> None:
        """First Ctrl-C: dispatch nothing new; in-flight requests finish and are recorded."""
        self.stopping = True

    def abandon(self) -> None:
        """Second Ctrl-C: cancel in-flight requests. They are not recorded; a resume sends them again."""
        self.stopping = True
        for task in list(self.tasks):
            task.cancel()

    # -- one request -------------------------------------------------------------------------------
    async def _start_provider(self, name: str) -> None:
        starting = self._starting.get(name)
        if starting is None:
            starting = self._starting[name] = asyncio.ensure_future(self.providers[name].start())
        await asyncio.shield(starting)

    async def _send(self, req: Task, endpoint: Endpoint, reservation: Reservation) -> None:
        future = self.inflight[req.key]
        tries = Tally()
        try:
            await self._start_provider(req.provider)
            completion, latency = await self._retrying(self._attempt, req, endpoint, tries)
        except LeaseLost:  # taken over before it was sent (again): another worker does it
            self._release(reservation)
            self.fence_of.pop(id(req), None)
            self.stats.counters(req.stage, req.model).elsewhere += 1
            future.set_result(NOT_SENT)
            if self.crew is not None:
                self.crew.release(req.key)
        except ModelSetupError as exc:  # nothing was sent; the run cannot go on without this provider
            self._release(reservation)
            future.set_result(None)
            if self.fatal is None:
                self.fatal = exc
            self.stopping = True
        except ProviderError as exc:
            # An error answer is not billed (its reservation goes back), but a refusal's answer may be.
            self._finish_failed(req, exc, tries.sent, reservation.ledger_id, reservation=reservation)
            future.set_result(exc)
            if isinstance(exc, QuotaExceeded) and self.fatal is None:
                self.fatal = exc
                self.stopping = True
        except asyncio.CancelledError:
            # Abandoned in flight: it may have been billed. Its reservation stays in the ledger, and the
            # report shows it as possibly billed until a resume settles it.
            future.cancel()
            raise
        else:
            try:
                self._finish_fresh(req, completion, tries.sent, latency, reservation)
            finally:  # whatever happens, requests waiting for this answer get it
                future.set_result(completion)
        finally:
            self.inflight.pop(req.key, None)
            endpoint.slots.release()

    async def _attempt(self, req: Task, endpoint: Endpoint, tries: Tally) -> tuple[Completion, float]:
        if endpoint.dead is not None:
            raise AuthError(f"not sent: {endpoint.dead}")
        if endpoint.counts_tokens:
            await endpoint.ready(self._input_tokens(req), req.call.params.get("max_tokens") or 0)
        else:
            await endpoint.ready()
        if self._lost(req):  # checked last before each attempt: after a stall, the lease may be another's
            raise LeaseLost(req.item)
        tries.sent += 1
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            call = req.call
            provider = self.providers[call.provider]
            if call.pairs is not None:
                completion = await provider.loglikelihood(call.model_name, call.pairs)
            else:
                completion = await provider.execute(call.model_name, call.messages, call.params)
        except ProviderError as exc:
            if isinstance(exc, AuthError) and endpoint.dead is None:
                endpoint.dead = exc  # before the endpoint opens: nothing else is sent with a refused key
            endpoint.answered()
            if isinstance(exc, RateLimited):
                tries.rate_limited += 1
                endpoint.failed()
            elif isinstance(exc, TransientError) and exc.error_class in _LOAD_ERRORS:
                endpoint.failed()
            raise
        endpoint.answered()
        latency = loop.time() - started
        endpoint.observe(completion.rate, latency)
        return completion, latency

    async def _follow(self, req: Task, leader: asyncio.Future[Any]) -> None:
        try:
            completion = await asyncio.shield(leader)
        except asyncio.CancelledError:
            return
        if completion is NOT_SENT:  # the request it followed was not sent (a budget, a stop): try on its own
            if not self.stopping:
                await self._dispatch(req, asyncio.get_running_loop())
            return
        if isinstance(completion, Refused):  # refused for this task too, and billed once (to the request sent)
            self._finish_failed(req, Refused(str(completion)), 0)
            return
        if completion is None or isinstance(completion, ProviderError):
            self._finish_failed(req, ProviderError("the identical request sent for another task failed"), 0)
            return
        self._finish_cached(req, memo_of(completion))

    # -- recording ---------------------------------------------------------------------------------
    def _finish_cached(self, req: Task, cached: CachedResponse) -> None:
        counters = self.stats.counters(req.stage, req.model)
        counters.cache_hits += 1
        saved = self.pricing.cost(req.model, cached.input_tokens, cached.output_tokens, cached.cached_tokens) \
            if self._priced(req.model) else 0.0
        counters.saved += saved
        self._record(req, cached.text, cached.finish_reason, cached.input_tokens, cached.output_tokens,
                     cost=0.0, latency=None, cache_hit=True, attempts=0, cached_tokens=cached.cached_tokens,
                     saved=saved, thinking=cached.thinking, reasoning_tokens=cached.reasoning_tokens)

    def _finish_fresh(self, req: Task, c: Completion, attempts: int, latency: float | None,
                      reservation: Reservation, *, batch: bool = False) -> None:
        """An answer that came back: priced (at the Batch API's price for a batch line), settled, recorded."""
        cost, batch_saved = self._cost(req, c, batch=batch)
        if self.budgets is not None and reservation.scopes:
            self.budgets.settle(reservation, cost, c.input_tokens + c.output_tokens)
        counters = self.stats.counters(req.stage, req.model)
        counters.sent += 1
        counters.spend += cost
        self.recent[req.key] = memo_of(c, cost)
        response = (
            req.key, req.provider, req.call.model_id, req.call.canonical, c.text, dumps(c.raw),
            c.finish_reason, c.input_tokens, c.output_tokens, c.cached_tokens, cost, latency, now(), c.thinking,
            c.reasoning_tokens,
        )
        ledger = (self.run_id, req.stage, req.model, req.key, "charge", cost, now()) if cost > 0 else None
        self._record(req, c.text, c.finish_reason, c.input_tokens, c.output_tokens, cost=cost, latency=latency,
                     cache_hit=False, attempts=attempts, response=response, ledger=ledger,
                     cached_tokens=c.cached_tokens, release_id=reservation.ledger_id, batch_saved=batch_saved,
                     thinking=c.thinking, reasoning_tokens=c.reasoning_tokens)
        if batch_saved:
            counters.batch_saved += batch_saved

    def _cost(self, req: Task, c: Completion, *, batch: bool = False) -> tuple[float, float | None]:
        """(USD, what the Batch API's price saved or None) of an answer's usage at the run's prices."""
        if not self._priced(req.model):
            return 0.0, (0.0 if batch else None)
        cost = self.pricing.cost(req.model, c.input_tokens, c.output_tokens, c.cached_tokens,
                                 cache_write_tokens=c.cache_write_tokens)
        if not batch:
            return cost, None
        rates = self.pricing.batch_rates(req.model)
        batch_cost = rates.cost(c.input_tokens, c.output_tokens, c.cached_tokens, c.cache_write_tokens) \
            if rates is not None else cost
        return batch_cost, cost - batch_cost

    def _finish_failed(self, req: Task, exc: ProviderError, attempts: int, release_id: int | None = None, *,
                       reservation: Reservation | None = None, batch: bool = False) -> None:
        """A task that got no answer. ``reservation``: its budget reservation, still held (given back, or settled
        to what a refusal was billed; callers that pass none have given theirs back). A refusal the provider
        billed (``exc.billed``) is charged once, priced as an answer (at the Batch API's price for a batch line):
        in the ledger, the budgets and the task's cost and tokens; it is never scored."""
        if self.crew is not None:
            self.crew.release(req.key)
        counters = self.stats.counters(req.stage, req.model)
        counters.errors += 1
        if exc.error_class == Refused.error_class:
            counters.refused += 1
        counters.done += 1
        self.stats.errors_by_class[exc.error_class] = self.stats.errors_by_class.get(exc.error_class, 0) + 1
        self.stats.last_error[req.model] = f"{exc.error_class}: {exc}"
        billed = billed_of(exc)
        cost, tokens, ledger = 0.0, 0, None
        if billed is not None:
            exc.billed = None  # type: ignore[attr-defined]  # one bill: tasks sharing this error are not charged
            cost = self._cost(req, billed, batch=batch)[0]
            tokens = billed.input_tokens + billed.output_tokens
            counters.spend += cost
            counters.tokens_in += billed.input_tokens
            counters.tokens_out += billed.output_tokens
            counters.reasoning_tokens += billed.reasoning_tokens
            if cost > 0:
                ledger = (self.run_id, req.stage, req.model, req.key, "charge", cost, now())
        if self.budgets is not None:
            if reservation is not None and reservation.scopes:
                if billed is not None:
                    self.budgets.settle(reservation, cost, tokens)
                else:
                    self.budgets.release(reservation)
            elif billed is not None:
                self.budgets.spend(req.stage, req.model, cost, tokens)
        result = result_line(self.stages[req.stage], req, None, status="failed", cache_hit=False,
                             notes=self.stats.notes,
                             reasoning_tokens=billed.reasoning_tokens if billed is not None else 0,
                             provenance=self._provenance(req))
        result.update(error_class=exc.error_class, error=str(exc))
        line = dumps(result)
        task = (
            self.run_id, req.stage, req.item, req.model, req.row_id, req.variant_json, req.key, "failed", 0,
            attempts, exc.error_class, str(exc), billed.input_tokens if billed else 0,
            billed.output_tokens if billed else 0, cost, None, None, 0, line, billed.cached_tokens if billed else 0,
            0.0, None,
        )
        self.writer.put(Finished(task=task, ledger=ledger, result_line=line, stage=req.stage, release_id=release_id,
                                 fence=self.fence_of.pop(id(req), None)))

    def _provenance(self, req: Task) -> dict[str, Any]:
        """The provenance of ``req``'s result line: the same for every task of its stage and model (the run, the
        job's fingerprint, the prompt, the model id and parameters of its call), built once per pair."""
        found = self.provenance.get((req.stage, req.model))
        if found is None:
            prompt = self.prompts.get(req.stage) or load_prompt(self.job, self.stages[req.stage].prompt)
            found = self.provenance[req.stage, req.model] = line_provenance(
                run_id=self.run_id, job_hash=self.job.fingerprint(), prompt=prompt, model_id=req.call.model_id,
                params=req.call.params)
        return found

    def _record(
        self, req: Task, text: str, finish_reason: str | None, input_tokens: int, output_tokens: int, *,
        cost: float, latency: float | None, cache_hit: bool, attempts: int,
        response: tuple | None = None, ledger: tuple | None = None, cached_tokens: int = 0, saved: float = 0.0,
        release_id: int | None = None, batch_saved: float | None = None, thinking: str | None = None,
        reasoning_tokens: int = 0,
    ) -> None:
        result = result_line(self.stages[req.stage], req, text, status="done", cache_hit=cache_hit,
                             notes=self.stats.notes, thinking=thinking, reasoning_tokens=reasoning_tokens,
                             provenance=self._provenance(req))
        result["finish_reason"] = finish_reason
        counters = self.stats.counters(req.stage, req.model)
        counters.done += 1
        if not cache_hit:
            counters.tokens_in += input_tokens
            counters.tokens_out += output_tokens
            counters.reasoning_tokens += reasoning_tokens
        score = result.get("score")
        if score is not None:
            counters.scored += 1
            counters.correct += int(score)
        line = dumps(result)
        task = (
            self.run_id, req.stage, req.item, req.model, req.row_id, req.variant_json, req.key, "done",
            int(cache_hit), attempts, None, None, input_tokens, output_tokens, cost, latency, score,
            int(result.get("valid", True)), line, cached_tokens, saved, batch_saved,
        )
        self.writer.put(Finished(task=task, response=response, ledger=ledger, result_line=line, stage=req.stage,
                                 release_id=release_id, fence=self.fence_of.pop(id(req), None)))
