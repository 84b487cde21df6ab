"""The async engine: for each request of a stage, serve it from the memo or send it through its endpoint's
limits, with bounded retries, and hand the finished task to the store's writer.

About 490 lines since admission per endpoint (issue 23) and prompt caching (issue 24): the line a busy endpoint's
requests wait in (`_wait_in_line`) and a prompt-cache group's wait for its first answer (`_after_first`) belong
with the in-flight bookkeeping they share with `_dispatch`; moving them out together is the next cut.

The dispatcher coordinates the parts that do each job: :class:`~runner.engine.triage.Triage` (what a chunk of
tasks needs), :class:`~runner.engine.leases.ChunkLeases` (chunks leased with the other workers of the run),
:class:`~runner.engine.reserver.Reserver` (budget reservations), :class:`~runner.engine.online.Sender` (an online
request's attempts), :class:`~runner.engine.recorder.Recorder` (finished tasks into the store) and
:class:`~runner.engine.batch.Batcher` (stages that use a Batch API). What it keeps itself: identical requests sent
once (the others follow the one on its way), request claims, and the tasks in flight.

The per-request path for a fresh request is: take an endpoint slot, wait for its limiters, call the
provider, queue the result. A cache hit never leaves the dispatch loop (no task is created for it).

Admission is per endpoint: a request whose endpoint has no free slot waits in that endpoint's own line (a task of
its own, which reserves its budget once it has the slot) while the dispatch loop goes on handing the chunk's other
requests to their endpoints, so a slow endpoint (the embedded model, one request at a time) does not set the pace
of the others in the same stage (a run that has used one endpoint so far waits in the loop: nothing else could go
on, and a line costs a few per cent of throughput). A line is bounded (``ENDPOINT_LINE``; ``LEASE`` while other
workers share the run, so one worker does not lease far ahead of what it sends); past it the loop waits for the
slot itself.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

from runner.engine.batch import Batcher
from runner.engine.budget import Budgets, Reservation, Scope, budgets_of
from runner.engine.control import RunControl
from runner.engine.endpoints import Endpoints
from runner.engine.leases import CHUNK, LEASE, ChunkLeases, chunks
from runner.engine.limits import Endpoint
from runner.engine.online import LeaseLost, Sender
from runner.engine.prompt_cache import PromptCachePlan
from runner.engine.recorder import Recorder, memo_of
from runner.engine.reserver import FREE, Reserver
from runner.engine.retry import Tally
from runner.engine.stats import RunStats
from runner.engine.stored_prompts import StoredPrompts
from runner.engine.triage import Triage
from runner.engine.workers import POLL, Crew
from runner.errors import ModelSetupError, ProviderError, QuotaExceeded, Refused, RunnerError
from runner.evaluate.results import line_provenance
from runner.plan.prompts import Prompt, load_prompt
from runner.plan.request import Task
from runner.plan.stage import StagePlan
from runner.providers.base import Provider
from runner.spec.schema import Job
from runner.store import CachedResponse, Finished, Store, Writer

__all__ = ["Dispatcher", "budgets_of"]

#: results queued for the writer before the dispatch loop waits for it to catch up
WRITER_BACKLOG = 4096
#: what tasks following an identical request get when it was not sent after all
NOT_SENT: Any = object()
#: requests that may wait in one endpoint's line for a slot while the dispatch loop goes on (see the docstring)
ENDPOINT_LINE = 4096


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
        self.stages = {stage.name: stage for stage in job.stages}
        self.control = RunControl()
        self.leases = ChunkLeases(stats)
        self.endpoints = Endpoints(providers, max_in_flight=job.max_in_flight)
        self.triage = Triage(store, run_id, stats)
        self.reserver = Reserver(run_id=run_id, job=job, store=store, stats=stats, control=self.control,
                                 leases=self.leases, resume=resume)
        self.sender = Sender(endpoints=self.endpoints, leases=self.leases, stats=stats, retry=job.retry, sleep=sleep)
        #: provider prompt caching planned (prompt_cache: auto) where a stage may use it
        self.prompt_cache: PromptCachePlan | None = None
        if any(getattr(p, "prompt_cache_style", None) for p in providers.values()) and any(
                job.stage_prompt_cache(stage) == "auto" for stage in job.llm_stages()):
            self.prompt_cache = PromptCachePlan(job, providers)
            self.sender.marks, self.sender.ready = self.prompt_cache.marks, self.prompt_cache.ready
            if any(p.stores_prompts for p in providers.values()):
                self.prompt_cache.stored = StoredPrompts(run_id=run_id, providers=providers, reserver=self.reserver)
        self.recorder = Recorder(run_id=run_id, job=job, stats=stats, writer=writer, reserver=self.reserver,
                                 triage=self.triage, leases=self.leases, provenance=self.provenance_of)
        #: each (stage, model)'s result-line provenance, built for its first finished task, and each stage's
        #: prompt as its plan rendered it
        self.provenance: dict[tuple[str, str], dict[str, Any]] = {}
        self.prompts: dict[str, Prompt] = {}
        #: the Batch API side of the engine, when a stage may use it
        self.batcher: Batcher | None = None
        if any(job.stage_mode(stage) != "online" for stage in job.llm_stages()):
            self.batcher = Batcher(job=job, run_id=run_id, store=store, stats=stats, control=self.control,
                                   endpoints=self.endpoints, reserver=self.reserver, recorder=self.recorder,
                                   writer=writer, send_online=self.send_online, sleep=sleep, deadline=deadline,
                                   spawn=self._spawn)
        if self.batcher is not None:
            self.batcher.prompt_cache = self.prompt_cache
        #: requests on their way, by key: the answer, the error that ended it, NOT_SENT, or None (not sent)
        self.inflight: dict[str, asyncio.Future[Any]] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        #: joined a run another process started (``runner work``): every chunk is checked for done tasks
        self.joined = False

    # -- what run.py reads and sets ------------------------------------------------------------------
    @property
    def crew(self) -> Crew | None:
        """This process's membership of the run (leases, claims, shared budgets), set by the engine."""
        return self.leases.crew

    @crew.setter
    def crew(self, crew: Crew | None) -> None:
        self.leases.crew = self.endpoints.crew = crew

    @property
    def stopping(self) -> bool:
        """Set by the first Ctrl-C, or by an error or a budget that ends the run: nothing new is dispatched."""
        return self.control.stopping

    @property
    def fatal(self) -> RunnerError | None:
        return self.control.fatal

    @property
    def budgets(self) -> Budgets | None:
        return self.reserver.budgets

    @property
    def exhausted(self) -> Scope | None:
        """The budget that ran out, when one did (the run ends ``budget_exhausted``)."""
        return self.reserver.exhausted

    def committed(self, batch: list[Finished]) -> None:
        """Writer callback: these answers are in the store (the next chunk's memo query sees them), and the leases
        whose tasks are all committed are done."""
        self.triage.committed(batch)
        self.leases.committed(batch)

    def share_limits(self, live: int) -> None:
        """Split every endpoint's rate limits with the ``live`` processes working on the run now."""
        self.endpoints.share(live)

    def request_stop(self) -> None:
        """First Ctrl-C: dispatch nothing new; in-flight requests finish and are recorded."""
        self.control.stop()

    def abandon(self) -> None:
        """Second Ctrl-C: cancel in-flight requests. They are not recorded; a resume sends them again."""
        self.control.stop()
        for task in list(self.tasks):
            task.cancel()

    def provenance_of(self, req: Task) -> dict[str, Any]:
        """The provenance of ``req``'s result line: the same for every task of its stage and model (the run, the
        job's fingerprint, the prompt, the model id and parameters of its call), built once per pair."""
        found = self.provenance.get((req.stage, req.model))
        if found is None:
            prompt = self.prompts.get(req.stage) or load_prompt(self.job, self.stages[req.stage].prompt)
            found = self.provenance[req.stage, req.model] = line_provenance(
                run_id=self.run_id, job_hash=self.job.fingerprint(), prompt=prompt, model_id=req.call.model_id,
                params=req.call.params)
        return found

    # -- a stage ------------------------------------------------------------------------------------
    async def run_stage(self, plan: StagePlan, *, wait_for_batches: bool = True) -> None:
        """Dispatch every task of the stage; ``wait_for_batches`` off leaves its Batch API batches running (the
        caller waits for several stages' batches together with :meth:`finish_batches`)."""
        loop = asyncio.get_running_loop()
        stage = plan.stage.name
        self.prompts[stage] = plan.prompt  # the template its lines' provenance names
        control = self.control
        crew = self.crew
        # A pipeline runs in one process (a stage may run again for a retry round): its chunks are not leased.
        leasing = crew is not None and not self.job.is_pipeline
        for number, chunk in enumerate(chunks(plan, CHUNK)):
            if control.stopping:
                break
            if not leasing:
                await self._breathe()
                await self._dispatch_chunk(chunk, loop, check_done=self.resume)
                continue
            assert crew is not None
            first = number * (CHUNK // LEASE)
            parts = [chunk[start:start + LEASE] for start in range(0, len(chunk), LEASE)]
            # Alone, the chunk's leases are taken in one transaction; with other workers live, one at a time, so
            # each worker holds only what it is about to send.
            step = len(parts) if crew.live == 1 else 1
            for start in range(0, len(parts), step):
                if control.stopping:
                    break
                indices = [first + n for n in range(start, min(start + step, len(parts)))]
                mine, lease_of, taken = self.leases.claim(stage, first, parts, indices)
                if mine:
                    await self._breathe()
                    await self._dispatch_chunk(mine, loop, check_done=self.resume or self.joined or taken,
                                               lease_of=lease_of)
        await self.drain()
        if leasing:
            await self._finish_leases(plan, loop)
        if self.batcher is not None and not control.stopping:
            await self.batcher.submit_pending(plan.stage.name)  # its batches start while later stages are planned
        if wait_for_batches:
            await self.finish_batches({plan.stage.name})

    async def _finish_leases(self, plan: StagePlan, loop: asyncio.AbstractEventLoop) -> None:
        """The end of a stage for one of several workers: mark this worker's chunks done once their tasks are
        committed, take over the chunks of workers that died, and wait for those live workers still hold."""
        crew = self.crew
        assert crew is not None
        stage = plan.stage.name
        while not self.control.stopping:
            await self.writer.flush()
            crew.finish(stage)
            taken = self.leases.take_over(stage)
            if taken:
                wanted, last = set(taken), max(taken)
                # the plan is walked once for all of them, up to the last one
                for index, part in enumerate(chunks(itertools.islice(plan, (last + 1) * LEASE), LEASE)):
                    if index in wanted and not self.control.stopping:
                        await self._dispatch_chunk(part, loop, check_done=True,
                                                   lease_of=dict.fromkeys((req.item for req in part), index))
                await self.drain()
                continue
            if crew.open_chunks(stage) == 0:
                return
            await asyncio.sleep(POLL)

    async def finish_batches(self, stages: set[str]) -> None:
        """Wait for the Batch API batches of these stages (and send online what a deadline leaves)."""
        if self.batcher is not None:
            await self.batcher.finish(stages)
            await self.drain()  # what a deadline sent online

    async def drain(self) -> None:
        """Wait for every request in flight (and, with other workers, for the answers they fetch)."""
        crew = self.crew
        while self.tasks or (crew is not None and crew.busy()):
            if self.control.stopping and crew is not None:
                crew.waiting.clear()  # answers another process is fetching are not waited for
            if self.tasks:
                await asyncio.wait(set(self.tasks))
            elif crew is not None and crew.busy():
                await asyncio.sleep(POLL / 2)

    async def release_stored_prompts(self) -> None:
        """Delete the prompt prefixes this run stored at the providers (the run is done with them)."""
        if self.prompt_cache is not None and self.prompt_cache.stored is not None:
            await self.prompt_cache.stored.close()

    async def _breathe(self) -> None:
        # Let the writer and the view run between chunks, and keep the writer's queue short.
        await asyncio.sleep(0)
        while self.writer.queue.qsize() > WRITER_BACKLOG:
            await asyncio.sleep(0.005)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # -- a chunk ------------------------------------------------------------------------------------
    async def _dispatch_chunk(self, chunk: list[Task], loop: asyncio.AbstractEventLoop, *, check_done: bool,
                              lease_of: dict[str, int] | None = None) -> None:
        """Serve a chunk's tasks from the memo, and send the others (those no other process is sending).
        ``lease_of``: each task's lease, marked done once all its tasks are committed (:meth:`committed`)."""
        done = self.triage.done(chunk) if check_done else ()
        if lease_of is not None:
            self.leases.hold(chunk, lease_of, done)
        hits, to_send = self.triage.sort(chunk, done)
        if self.prompt_cache is not None and to_send:
            self.prompt_cache.plan(to_send)
        recorder = self.recorder
        for req, cached in hits:
            recorder.cached(req, cached)
        crew = self.crew
        mine: set[str] = set()
        answered: dict[str, CachedResponse] = {}
        # Batch API lines are not claimed: a claim held until a batch ends would keep other processes waiting on it.
        batching = self.batcher is not None and any(self.batcher.wants(req) for req in to_send)
        if crew is not None and to_send and not batching:
            mine, answered = crew.claim(sorted({req.key for req in to_send} - set(self.inflight)))
        for req in to_send:
            if self.control.stopping:
                break
            # answered while this chunk was being dispatched, or by another process before the claim
            cached = self.triage.answered(req.key) or answered.get(req.key)
            if cached is not None:
                recorder.cached(req, cached)
                if self.prompt_cache is not None:
                    self.prompt_cache.forget(req.key)
            elif crew is not None and not batching and req.key not in mine and req.key not in self.inflight:
                # another process is sending the identical request: wait for its answer
                crew.wait_for(req.key, lambda answer, req=req: self._answered_elsewhere(req, answer, loop))
            elif not await self._dispatch(req, loop):
                break

    def _answered_elsewhere(self, req: Task, answer: CachedResponse | None, loop: asyncio.AbstractEventLoop) -> None:
        if answer is not None:
            self.recorder.cached(req, answer)
            if self.prompt_cache is not None:
                self.prompt_cache.forget(req.key)
        elif not self.control.stopping:  # the other process gave the claim up: this one sends it
            self._spawn(self._dispatch(req, loop))

    # -- one task -----------------------------------------------------------------------------------
    async def send_online(self, req: Task) -> bool:
        """Dispatch one task the memo cannot answer (the Batch API side sends online what a deadline leaves); False
        when the run is stopping and nothing more should be dispatched."""
        return await self._dispatch(req, asyncio.get_running_loop())

    async def _dispatch(self, req: Task, loop: asyncio.AbstractEventLoop) -> bool:
        """Send one task that is not in the memo (or join the identical request on its way, or hand it to the
        Batch API); False when the run is stopping and nothing more should be dispatched."""
        leader = self.inflight.get(req.key)
        if leader is not None:  # the same request is on its way already: pay once, share the answer
            self._spawn(self._follow(req, leader))
            return True
        reserver = self.reserver
        if reserver.closed(req):
            self.stats.counters(req.stage, req.model).over_budget += 1
            self.leases.take_fence(req)
            self._unclaim(req.key)
            return True
        if self.batcher is not None and self.batcher.wants(req):
            # a Batch API stage runs in the process that started it; its lines are recorded whenever they come back
            self.leases.take_fence(req)
            await self.batcher.add(req)
            return not self.control.stopping
        if self.leases.lost_lease_of(req):  # its lease was taken over: another worker does it
            self.leases.take_fence(req)
            self.stats.counters(req.stage, req.model).elsewhere += 1
            self._unclaim(req.key)
            return True
        # On its way from here: an identical task dispatched meanwhile follows this one instead of sending it too.
        self.inflight[req.key] = loop.create_future()
        endpoint = self.endpoints.of(req)
        if self.prompt_cache is not None and (
                first := self.prompt_cache.gate(req, self.inflight[req.key])) is not None:
            self._spawn(self._after_first(first, req, endpoint))  # its prompt-cache group's first is on its way
            return True
        slots = endpoint.slots
        # busy endpoint: the loop goes on with the others (with one endpoint so far, nothing could go on meanwhile)
        if len(self.endpoints.by_name) > 1 and (slots.held >= slots.limit or slots.waiters) \
                and len(slots.waiters) < self._line_limit():
            self._spawn(self._wait_in_line(req, endpoint))
            return True
        if reserver.free(req.model):
            reservation = FREE  # nothing to reserve or record: no coroutine on the common free path
        else:
            reservation = await reserver.reserve(req)
        if reservation is None:  # a budget ran out: this request stays for a resume
            self._not_sent(req.key)
            return not self.control.stopping
        assert isinstance(reservation, Reservation)
        await endpoint.slots.acquire()
        if self.control.stopping:
            endpoint.slots.release()
            reserver.release(reservation)
            self._not_sent(req.key)
            return False
        self._spawn(self._send(req, endpoint, reservation))
        return True

    def _line_limit(self) -> int:
        crew = self.crew
        return ENDPOINT_LINE if crew is None or crew.live <= 1 else LEASE

    async def _wait_in_line(self, req: Task, endpoint: Endpoint) -> None:
        """Send ``req`` once its endpoint has a slot for it; its budget is reserved then, before it is sent, so a
        request waiting in line holds no reservation."""
        held = False
        try:
            await endpoint.slots.acquire()
            held = True
            if self.control.stopping:
                reservation = None
            elif self.reserver.free(req.model):
                reservation = FREE
            else:
                reservation = await self.reserver.reserve(req)
        except asyncio.CancelledError:  # abandoned (second Ctrl-C) before it was sent: a resume sends it
            if held:
                endpoint.slots.release()
            future = self.inflight.pop(req.key, None)
            if future is not None:
                future.cancel()
            raise
        except RunnerError as exc:  # the store refused the reservation (a full disk): the run ends on it, as the
            if held:                # dispatch loop's own reservation would end it, instead of a lost task's error
                endpoint.slots.release()
            self._not_sent(req.key)
            self.control.fail(exc)
            return
        if reservation is None:  # a stop, or a budget that ran out: this request stays for a resume
            endpoint.slots.release()
            self._not_sent(req.key)
            return
        assert isinstance(reservation, Reservation)
        await self._send(req, endpoint, reservation)

    async def _after_first(self, first: asyncio.Future[Any], req: Task, endpoint: Endpoint) -> None:
        """Send ``req`` once the first request of its prompt-cache group has its answer (or failed)."""
        try:
            await asyncio.shield(first)
        except asyncio.CancelledError:
            if not first.cancelled():  # this task itself was abandoned: a resume sends it
                future = self.inflight.pop(req.key, None)
                if future is not None:
                    future.cancel()
                raise
        await self._wait_in_line(req, endpoint)

    def _not_sent(self, key: str) -> None:
        """A request that was on its way is not sent after all: tasks following it dispatch themselves again."""
        future = self.inflight.pop(key, None)
        if future is not None and not future.done():
            future.set_result(NOT_SENT)
        if self.prompt_cache is not None:
            self.prompt_cache.forget(key)
        self._unclaim(key)

    def _unclaim(self, key: str) -> None:
        """Give up this process's claim of a request it will not send (another process may send it)."""
        crew = self.crew
        if crew is not None and key not in self.inflight:
            crew.release(key)

    async def _send(self, req: Task, endpoint: Endpoint, reservation: Reservation) -> None:
        future = self.inflight[req.key]
        tries = Tally()
        try:
            completion, latency = await self.sender.send(req, endpoint, tries)
        except LeaseLost:  # taken over before it was sent (again): another worker does it
            self.reserver.release(reservation)
            self.leases.take_fence(req)
            self.stats.counters(req.stage, req.model).elsewhere += 1
            future.set_result(NOT_SENT)
            if self.crew is not None:
                self.crew.release(req.key)
        except ModelSetupError as exc:  # nothing was sent; the run cannot go on without this provider
            self.reserver.release(reservation)
            future.set_result(None)
            self.control.fail(exc)
        except ProviderError as exc:
            # An error answer is not billed (its reservation goes back), but a refusal's answer may be.
            self.recorder.failed(req, exc, tries.sent, reservation.ledger_id, reservation=reservation)
            future.set_result(exc)
            if isinstance(exc, QuotaExceeded):
                self.control.fail(exc)
        except asyncio.CancelledError:
            # Abandoned in flight: it may have been billed. Its reservation stays in the ledger, and the
            # report shows it as possibly billed until a resume settles it.
            future.cancel()
            raise
        else:
            try:
                self.recorder.fresh(req, completion, tries.sent, latency, reservation)
            finally:  # whatever happens, requests waiting for this answer get it
                future.set_result(completion)
        finally:
            self.inflight.pop(req.key, None)
            endpoint.slots.release()
            if self.prompt_cache is not None:
                self.prompt_cache.forget(req.key)

    async def _follow(self, req: Task, leader: asyncio.Future[Any]) -> None:
        try:
            completion = await asyncio.shield(leader)
        except asyncio.CancelledError:
            return
        if completion is NOT_SENT:  # the request it followed was not sent (a budget, a stop): try on its own
            if not self.control.stopping:
                await self._dispatch(req, asyncio.get_running_loop())
            return
        if isinstance(completion, Refused):  # refused for this task too, and billed once (to the request sent)
            self.recorder.failed(req, Refused(str(completion)), 0)
            return
        if completion is None or isinstance(completion, ProviderError):
            self.recorder.failed(req, ProviderError("the identical request sent for another task failed"), 0)
            return
        self.recorder.cached(req, memo_of(completion))
