"""The async engine's loop: for each chunk of a stage's tasks, serve what the memo answers and hand the others to
their way (runner/engine/inflight.py), with chunks leased from the other workers of the run; then wait for the
stage's requests (and Batch API batches) to end. A cache hit never leaves the dispatch loop (no task is created
for it).

The dispatcher is assembled with its parts by :func:`runner.engine.assembly.assemble`, and coordinates them:
``Triage`` (what a chunk of tasks needs), ``ChunkLeases`` (chunks leased with the other workers of the run),
``InFlight`` (one task's way: an identical request joined, the budget reserved, the endpoint's slot, the send),
``Recorder`` (finished tasks into the store), the Batch API side (``Batcher``, or ``NoBatcher`` when every stage is
online) and the prompt-cache plan (``PromptCachePlan``, or ``NoPromptCache``). What it keeps itself: the loop over
chunks, request claims with other processes (through the ``Crew``), the waits for a stage's end (``drain``), the
stop and the abandon, and each (stage, model)'s result-line provenance (:class:`Provenance`).
"""

from __future__ import annotations

import asyncio
import itertools
from typing import TYPE_CHECKING, Any

from runner.engine.budget import Budgets, Scope, budgets_of
from runner.engine.control import RunControl, Spawned
from runner.engine.inflight import InFlight
from runner.engine.leases import CHUNK, LEASE, ChunkLeases, chunks
from runner.engine.recorder import Recorder
from runner.engine.reserver import Reserver
from runner.engine.tiers import Tiers
from runner.engine.triage import Triage
from runner.engine.workers import POLL, Crew
from runner.errors import RunnerError
from runner.evaluate.provenance import line_provenance
from runner.plan.prompts import Prompt, load_prompt
from runner.plan.request import Task
from runner.plan.stage import StagePlan
from runner.providers.tiers import STANDARD
from runner.spec.schema import Job
from runner.store import CachedResponse, Finished, Writer

if TYPE_CHECKING:  # the Batch API side and the prompt-cache plan: imported by a run that uses them (assembly.py)
    from runner.engine.batch import Batcher
    from runner.engine.early_stop import StageStopper
    from runner.engine.null_parts import NoBatcher, NoPromptCache
    from runner.engine.prompt_cache import PromptCachePlan

__all__ = ["Dispatcher", "Provenance", "budgets_of"]

#: results queued for the writer before the dispatch loop waits for it to catch up
WRITER_BACKLOG = 4096


#: the first wave's tasks when a stage that stops early goes through a Batch API; each next wave is twice the last
FIRST_WAVE = CHUNK

#: how far past the last item its rule has read a worker of a stage with ``stop:`` may lease: a chunk (what a lone
#: worker leases at once) and this many leases per live worker. The workers keep sending while the rule reads
#: answers in order, but none runs on past a gap (a lease a stopped worker holds) paying for answers the rule cannot
#: read until the gap is filled.
AHEAD_LEASES = 2


class Provenance:
    """Each (stage, model)'s result-line provenance: the same for every task of its stage and model (the run, the
    job's fingerprint, the prompt, the model id and parameters of its call), built once per pair, for the first of
    its tasks the recorder records. The dispatcher tells it each stage's prompt as the stage's plan rendered it."""

    def __init__(self, job: Job, run_id: str, tiers: Tiers | None = None) -> None:
        self.job = job
        self.run_id = run_id
        self.tiers = tiers if tiers is not None else Tiers(job)
        self.stages = {stage.name: stage for stage in job.stages}
        self.built: dict[tuple[str, str], dict[str, Any]] = {}
        #: each stage's prompt as its plan rendered it (the template its lines' provenance names)
        self.prompts: dict[str, Prompt] = {}

    def of(self, req: Task) -> dict[str, Any]:
        """The provenance of ``req``'s result line."""
        found = self.built.get((req.stage, req.model))
        if found is None:
            prompt = self.prompts.get(req.stage) or load_prompt(self.job, self.stages[req.stage].prompt)
            found = self.built[req.stage, req.model] = line_provenance(
                run_id=self.run_id, job_hash=self.job.fingerprint(), prompt=prompt, model_id=req.call.model_id,
                params=req.call.params)
            plan = self.tiers.of(req)
            if plan is not None and plan.steered:  # the deadline planner chose each request's tier
                found["tier"] = {"asked": "deadline planner", "fallback": STANDARD}
            elif plan is not None:  # the tier asked; each line adds the one that served it (runner/engine/recorder.py)
                found["tier"] = {"asked": plan.asked, "fallback": plan.fallback}
        return found


class Dispatcher:
    """One run's dispatch loop over its parts (each given, never built here: :mod:`runner.engine.assembly`)."""

    def __init__(self, *, job: Job, writer: Writer, control: RunControl, leases: ChunkLeases, triage: Triage,
                 reserver: Reserver, recorder: Recorder, flight: InFlight, batcher: Batcher | NoBatcher,
                 prompt_cache: PromptCachePlan | NoPromptCache, provenance: Provenance, spawned: Spawned,
                 resume: bool = False, joined: bool = False) -> None:
        """``resume``: every chunk is checked for tasks an earlier attempt finished; ``joined``: the run was joined
        (``runner work``): the chunks of other processes are checked too."""
        self.job = job
        self.writer = writer
        self.control = control
        self.leases = leases
        self.triage = triage
        self.reserver = reserver
        self.recorder = recorder
        self.flight = flight
        self.endpoints = flight.endpoints
        self.batcher = batcher
        self.prompt_cache = prompt_cache
        self.provenance = provenance
        self.spawned = spawned
        self.resume = resume
        self.joined = joined
        #: the stages that stop early (``stop:``), by name: their rules read as answers are committed
        self.stoppers: dict[str, StageStopper] = {}
        #: with other workers, each stopping stage's watch of the store (runner/engine/early_stop.py)
        self.watches: dict[str, asyncio.Task[None]] = {}

    # -- what run.py reads ----------------------------------------------------------------------------
    @property
    def crew(self) -> Crew | None:
        """This process's membership of the run (leases, claims, shared budgets), given by the engine."""
        return self.leases.crew

    @property
    def tasks(self) -> set[asyncio.Task[Any]]:
        """The asyncio tasks in flight (requests sent or waiting, tasks following an identical request)."""
        return self.spawned.tasks

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

    def request_stop(self) -> None:
        """First Ctrl-C: dispatch nothing new; in-flight requests finish and are recorded."""
        self.control.stop()

    def abandon(self) -> None:
        """Second Ctrl-C: cancel in-flight requests. They are not recorded; a resume sends them again."""
        self.control.stop()
        for task in list(self.spawned.tasks):
            task.cancel()

    # -- a stage ------------------------------------------------------------------------------------
    async def run_stage(self, plan: StagePlan, *, wait_for_batches: bool = True) -> None:
        """Dispatch every task of the stage; ``wait_for_batches`` off leaves its Batch API batches running (the
        caller waits for several stages' batches together with :meth:`finish_batches`)."""
        loop = asyncio.get_running_loop()
        stage = plan.stage.name
        self.provenance.prompts[stage] = plan.prompt  # the template its lines' provenance names
        control = self.control
        crew = self.crew
        # A pipeline runs in one process (a stage may run again for a retry round): its chunks are not leased.
        leasing = crew is not None and not self.job.is_pipeline
        stopper = await self._stopper(plan, leasing)
        try:
            await self._dispatch_stage(plan, loop, leasing, stopper)
        finally:
            watching = self.watches.pop(stage, None)
            if watching is not None:
                watching.cancel()
        if not control.stopping:
            await self.batcher.submit_pending(plan.stage.name)  # its batches start while later stages are planned
        if wait_for_batches:
            await self.finish_batches({plan.stage.name})

    async def _dispatch_stage(self, plan: StagePlan, loop: asyncio.AbstractEventLoop, leasing: bool,
                              stopper: StageStopper | None) -> None:
        control, crew, stage = self.control, self.crew, plan.stage.name
        # a stage that stops early through a Batch API sends its tasks in waves of growing size, each waited for
        # (its answers read by the rule) before the next is sent
        waves = stopper is not None and self.job.stage_mode(plan.stage) != "online"
        wave, wave_size = 0, FIRST_WAVE
        for number, chunk in enumerate(chunks(plan, CHUNK)):
            if control.stopping or self.stopped_early(stage):
                break
            if waves:
                wave += len(chunk)
                if wave > wave_size:  # this chunk begins the next wave: the last one is sent and read first
                    await self.finish_batches({stage})
                    wave, wave_size = len(chunk), wave_size * 2
                    if self.stopped_early(stage):
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
                if control.stopping or self.stopped_early(stage):
                    break
                if stopper is not None and not waves:  # (a wave is read whole, when it is all sent)
                    await self._near_the_rule(plan, loop, stopper, (first + start) * LEASE)
                    if control.stopping or stopper.stopped:
                        break
                indices = [first + n for n in range(start, min(start + step, len(parts)))]
                mine, lease_of, taken = await self.leases.claim(stage, first, parts, indices)
                if mine:
                    await self._breathe()
                    await self._dispatch_chunk(mine, loop, check_done=self.resume or self.joined or taken,
                                               lease_of=lease_of)
        await self.drain()
        if leasing:
            await self._finish_leases(plan, loop, stopper)

    async def _stopper(self, plan: StagePlan, leasing: bool) -> StageStopper | None:
        """The stage's early-stopping rule, given what an earlier attempt of the run committed (a resume); with
        other workers, watching what they write (:func:`runner.engine.early_stop.watch`)."""
        if plan.stage.stop is None:
            return None
        # imported here: its sequences need numpy, which a run without stop: (and the CLI's start) never loads
        from runner.engine.early_stop import StageStopper, watch

        stage = plan.stage.name
        stopper = self.stoppers[stage] = StageStopper(plan)
        self.recorder.observers.append(stopper.recorded)
        self.flight.skip = lambda req: self.stopped_early(req.stage)
        self.flight.short_lines.add(stage)
        store, run_id, position = self.triage.store, self.triage.run_id, 0
        if self.resume or self.joined:  # what is in the store already, before anything is sent
            position, done = await store.stage_scores(run_id, stage, 0)
            stopper.feed(done)
        crew = self.crew
        if leasing and crew is not None:
            self.watches[stage] = asyncio.create_task(watch(stopper, store, run_id, position,
                                                            lambda: crew.live <= 1))
        return stopper

    def stopped_early(self, stage: str) -> bool:
        stopper = self.stoppers.get(stage)
        return stopper is not None and stopper.stopped

    async def _finish_leases(self, plan: StagePlan, loop: asyncio.AbstractEventLoop,
                             stopper: StageStopper | None) -> None:
        """The end of a stage for one of several workers: mark this worker's chunks done once their tasks are
        committed, take over the chunks of workers that died, and wait for those live workers still hold. A stage
        stopped early leaves the chunks nobody took: each worker ends it once its own are done."""
        crew = self.crew
        assert crew is not None
        stage = plan.stage.name
        while not self.control.stopping:
            await self.writer.flush()
            crew.finish(stage)
            if stopper is not None and stopper.stopped:
                return
            if await self._take_over(plan, loop):
                await self.drain()
                continue
            if await crew.open_chunks(stage) == 0:
                return
            await asyncio.sleep(POLL)

    async def _take_over(self, plan: StagePlan, loop: asyncio.AbstractEventLoop) -> bool:
        """Send the tasks of the stage's leases whose workers died (now this worker's); whether there were any."""
        taken = await self.leases.take_over(plan.stage.name)
        if not taken:
            return False
        wanted, last = set(taken), max(taken)
        # the plan is walked once for all of them, up to the last one
        for index, part in enumerate(chunks(itertools.islice(plan, (last + 1) * LEASE), LEASE)):
            if index in wanted and not self.control.stopping:
                await self._dispatch_chunk(part, loop, check_done=True,
                                           lease_of=dict.fromkeys((req.item for req in part), index))
        return True

    async def _near_the_rule(self, plan: StagePlan, loop: asyncio.AbstractEventLoop, stopper: StageStopper,
                             task: int) -> None:
        """Wait, before leasing the stage's tasks from number ``task`` on, until they are near the last item the
        stage's rule has read (:data:`AHEAD_LEASES`); meanwhile take over the leases of workers that died, which
        are what keeps a rule from reading on. So a worker that stops holding a lease costs the others time (its
        lease's length at most), not answers bought that the rule could not use."""
        crew = self.crew
        assert crew is not None
        per_item = len(plan.models) * len(plan.variants)  # the plan yields each item's tasks together
        while not (self.control.stopping or stopper.stopped or stopper.off is not None):
            if task - stopper.fed * per_item < CHUNK + AHEAD_LEASES * max(1, crew.live) * LEASE:
                return
            if not await self._take_over(plan, loop):
                await asyncio.sleep(POLL)

    async def finish_batches(self, stages: set[str]) -> None:
        """Wait for the Batch API batches of these stages (and send online what a deadline leaves)."""
        await self.batcher.finish(stages)
        await self.drain()  # what a deadline sent online

    async def drain(self) -> None:
        """Wait for every request in flight (and, with other workers, for the answers they fetch)."""
        crew = self.crew
        tasks = self.spawned.tasks
        while tasks or (crew is not None and crew.busy()):
            if self.control.stopping and crew is not None:
                crew.waiting.clear()  # answers another process is fetching are not waited for
            if tasks:
                await asyncio.wait(set(tasks))
            elif crew is not None and crew.busy():
                await asyncio.sleep(POLL / 2)

    async def release_stored_prompts(self) -> None:
        """Delete the prompt prefixes this run stored at the providers (the run is done with them)."""
        await self.prompt_cache.stored.close()

    async def _breathe(self) -> None:
        # Let the writer and the view run between chunks, and keep the writer's queue short.
        await asyncio.sleep(0)
        while self.writer.queue.qsize() > WRITER_BACKLOG:
            await asyncio.sleep(0.005)

    # -- a chunk ------------------------------------------------------------------------------------
    async def _dispatch_chunk(self, chunk: list[Task], loop: asyncio.AbstractEventLoop, *, check_done: bool,
                              lease_of: dict[str, int] | None = None) -> None:
        """Serve a chunk's tasks from the memo, and send the others (those no other process is sending).
        ``lease_of``: each task's lease, marked done once all its tasks are committed (:meth:`committed`)."""
        done = await self.triage.done(chunk) if check_done else ()
        if lease_of is not None:
            self.leases.hold(chunk, lease_of, done)
        hits, to_send = await self.triage.sort(chunk, done)
        if to_send:
            self.prompt_cache.plan(to_send)
        counting = self.reserver.count_ahead(to_send, self.spawned.spawn) if to_send else None
        recorder = self.recorder
        for req, cached in hits:
            recorder.cached(req, cached)
        crew = self.crew
        mine: set[str] = set()
        answered: dict[str, CachedResponse] = {}
        # Batch API lines are not claimed: a claim held until a batch ends would keep other processes waiting on it.
        batching = self.batcher.wants_any(to_send)
        if crew is not None and to_send and not batching:
            mine, answered = await crew.claim(sorted({req.key for req in to_send} - set(self.flight.on_way)))
        stage = chunk[0].stage
        for index, req in enumerate(to_send):
            if self.control.stopping or self.stopped_early(stage):
                break
            if counting is not None:
                counting.reach(index)
            # answered while this chunk was being dispatched, or by another process before the claim
            cached = self.triage.answered(req.key) or answered.get(req.key)
            if cached is not None:
                recorder.cached(req, cached)
                self.prompt_cache.forget(req.key)
            elif crew is not None and not batching and req.key not in mine and req.key not in self.flight.on_way:
                # another process is sending the identical request: wait for its answer
                crew.wait_for(req.key, lambda answer, req=req: self._answered_elsewhere(req, answer, loop))
            elif not await self.flight.dispatch(req, loop):
                break

    def _answered_elsewhere(self, req: Task, answer: CachedResponse | None, loop: asyncio.AbstractEventLoop) -> None:
        if answer is not None:
            self.recorder.cached(req, answer)
            self.prompt_cache.forget(req.key)
        elif not self.control.stopping:  # the other process gave the claim up: this one sends it
            self.spawned.spawn(self.flight.dispatch(req, loop))
