"""The Batch API side of the engine: stages in ``mode: batch`` (or ``auto``) send their requests as provider
batches, at the Batch API's price, into the same memo and ledger as online requests.

The state every step reads and changes is held in two parts of its own: each line's (its waiting tasks, group,
reservation and resubmissions: :class:`~runner.engine.batch_lines.BatchLines`) and what the store and the live view
know of each batch (:class:`~runner.engine.batch_records.BatchRecords`); this module moves the lines through the
batches, and what becomes of a batch's lines once it ends is decided by runner/engine/batch_outcomes.py. A run
whose stages are all online has a :class:`NoBatcher`, which wants no task.

For each stage and model, the requests the memo cannot answer are grouped (identical requests once: a line's
custom id is the request's cache key) into batches of at most ``batch.max_requests``. Before a batch is submitted,
every line's worst case is reserved against the budgets and in the ledger, as online; a line that does not fit is
not submitted. Before the provider is asked, the batch's intent (its lines' keys and reservations, state
``submitting``) is written to the store, and its label names it exactly (:func:`batch_label`: the run, stage, model,
round and a digest of its custom ids); the provider's batch id is written the moment the provider accepts it. So a
process killed at any point leaves a record that ``runner resume`` reads: it polls the batches an earlier process
submitted instead of submitting them again, and an intent with no id (killed between the provider's answer and the
store's write) is looked up at the provider by its label (``Batches.find``) and adopted, its lines polled and
collected as if this process had submitted them; only a batch the provider does not have is submitted again. A
submit that failed with an error that may hide an accepted batch (a timeout, a server error) is looked up the same
way before its lines go again (at most ``batch.max_resubmits`` times). Lines the provider expired, cancelled
or failed with a server error are submitted again (only those, at most ``batch.max_resubmits`` times); the others
fail with their error class, as online. A batch the provider refused for some of its lines (OpenAI's input file
validation) fails those lines; its other lines (``batch_refused``) are submitted again once, whatever
``max_resubmits`` says, and fail if refused again. A provider may cut a group into several batches (its client's
``chunks``: Gemini keeps each inline batch under 20 MB).

``mode: auto`` batches while the run's deadline allows: a batch is submitted only while ``batch.min_window``
seconds are left, and at the deadline the batches still running are cancelled, their finished lines kept, and
everything else is sent online.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from runner.engine.batch_lines import BatchLines
from runner.engine.batch_outcomes import settle_results, settle_unsent
from runner.engine.batch_records import BatchRecords, OpenBatch
from runner.engine.budget import LATER, Reservation
from runner.engine.control import RunControl
from runner.engine.deadline import DeadlineSteer
from runner.engine.endpoints import Endpoints
from runner.engine.null_parts import NoBatcher, NoPromptCache
from runner.engine.pools import BatchRoutes
from runner.engine.prompt_cache import PromptCachePlan
from runner.engine.recorder import Recorder
from runner.engine.reserver import Reserver
from runner.engine.stats import RunStats
from runner.errors import AuthError, ProviderError, QuotaExceeded, TransientError
from runner.plan.request import Task
from runner.providers.batching import ENDED, Batches, BatchLine, batch_label
from runner.spec.schema import Job
from runner.store import Store, Writer
from runner.store.offloop import LoopStore, off_loop

__all__ = ["CANCEL_POLL", "Batcher", "NoBatcher"]

#: seconds between looks at batches being cancelled at a deadline
CANCEL_POLL = 1.0


class Batcher:
    """The Batch API side of one run. It reaches the engine only through the parts it is given: the reserver and
    the recorder every line goes through, the endpoints (providers started once), the run's control flag, the
    prompt-cache plan that marks a batch's lines, and ``send_online(task)`` for the lines a deadline leaves to be
    sent online. What the store and the live view know of its batches is kept by :class:`BatchRecords`."""

    def __init__(self, *, job: Job, run_id: str, store: Store | LoopStore, stats: RunStats, control: RunControl,
                 endpoints: Endpoints, reserver: Reserver, recorder: Recorder, writer: Writer,
                 prompt_cache: PromptCachePlan | NoPromptCache, send_online: Callable[[Task], Awaitable[bool]],
                 sleep: Callable[[float], Any], deadline: float | None,
                 spawn: Callable[[Awaitable[Any]], None], steer: DeadlineSteer | None = None) -> None:
        self.job = job
        self.run_id = run_id
        self.store = off_loop(store)
        self.stats = stats
        # the batches' records are written from the loop, between the store thread's calls (ARCHITECTURE.md, "Known
        # debts"): a few per batch, minutes apart
        self.records = BatchRecords(run_id=run_id, store=self.store.sync, stats=stats)
        self.control = control
        self.endpoints = endpoints
        self.reserver = reserver
        self.recorder = recorder
        self.writer = writer
        self.send_online = send_online
        #: runs a coroutine as one of the dispatcher's tasks (waited for before a stage ends)
        self.spawn = spawn
        self.sleep = sleep
        self.stages = {stage.name: stage for stage in job.stages}
        self.settings = job.batch
        #: batch id -> time.monotonic() of the first of the failed looks in a row at it (:meth:`_look_failed`)
        self.failing: dict[str, float] = {}
        #: when the run's answers are needed (epoch seconds), for ``mode: auto``
        self.deadline = deadline
        #: where each request stands: its waiting tasks, group, reservation, resubmissions
        self.lines = BatchLines(store=store, reserver=reserver, recorder=recorder)
        #: the batches this process waits for, by id, and the stages whose earlier batches were read back
        self.open: dict[str, OpenBatch] = {}
        self.loaded: set[str] = set()
        #: request keys sent online because their group was smaller than the provider's Batch API takes, and the
        #: stages they are of (waited for as a stage's batches are: :meth:`busy`)
        self.too_few: set[str] = set()
        self.online_stages: set[str] = set()
        #: provider prompt caching planned (the run's plan, or the null one), to mark the lines of a batch
        self.prompt_cache = prompt_cache
        #: the deadline planner, for the auto stages with a deadline (runner/engine/deadline.py)
        self.steer = steer
        #: the provider each model's lines go through (a pooled model's: one endpoint of its pool)
        self.routes = BatchRoutes(job, stats.notes)

    # -- which tasks go through a batch ------------------------------------------------------------------
    def wants(self, task: Task) -> bool:
        if task.key in self.lines.waiting:
            return True
        if task.key in self.too_few:
            return False
        stage = self.stages[task.stage]
        self._load(stage.name)
        if task.key in self.lines.resumed:
            return True
        mode = self.job.stage_mode(stage)
        if mode == "online" or task.call.kind != "chat":
            return False
        if not getattr(self.endpoints.providers[self.routes.provider(task)], "supports_batch", False):
            return False  # ``mode: batch`` was refused at the start for such a model; ``auto`` sends it online
        if mode == "auto" and self.steer is not None and self.steer.planned(task.stage, task.model):
            if self.steer.mode_of(task) == "batch":
                return True
            # the planner gives a group's batch lines first: once it sends one online, their batch starts
            if held := self.lines.pending.pop((task.stage, task.model), None):
                self.spawn(self.submit(task.stage, task.model, held))
            return False
        return mode == "batch" or not self.past_window()

    def _late(self, stage: str, model: str) -> bool:
        """Whether an auto stage's batches are past their time: its cutover where the deadline planner plans it,
        else the run's deadline."""
        if not self._auto(stage):
            return False
        if self.steer is not None and self.steer.planned(stage, model):
            return self.steer.cut_over(stage, model)
        return self.past_deadline()

    def wants_any(self, tasks: Iterable[Task]) -> bool:
        return any(self.wants(task) for task in tasks)

    def past_window(self) -> bool:
        """Whether too little time is left before the deadline to wait for a batch."""
        return self.deadline is not None and self.deadline - time.time() < self.settings.min_window

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.time() >= self.deadline

    def _load(self, stage: str) -> None:
        """The batches an earlier process of this run submitted for ``stage`` and did not collect."""
        if stage in self.loaded:
            return
        self.loaded.add(stage)
        for batch in self.records.left(stage):  # an intent among them is looked up first (``finish``)
            self.open[batch.id] = batch
            for key in batch.keys:
                self.lines.resumed[key] = batch

    # -- collecting and submitting -------------------------------------------------------------------------
    async def add(self, task: Task) -> None:
        group = self.lines.hold(task)
        if group is not None and len(group) >= self.settings.max_requests:
            await self.submit(task.stage, task.model)

    async def submit(self, stage: str, model: str, tasks: list[Task] | None = None) -> None:
        """Submit the group's lines not yet in a batch (``tasks``: those, already taken from the pending ones)."""
        tasks = self.lines.pending.pop((stage, model), []) if tasks is None else tasks
        if not tasks:  # nothing pending: no batch, and no note that none went online
            return
        via = self.routes.provider(tasks[0])
        floor = getattr(self.endpoints.providers[via], "batch_min_lines", 1)
        if len(tasks) < floor:
            self._too_few(stage, model, tasks, floor)
            return
        lines: list[BatchLine] = []
        sent: list[Task] = []
        keys: dict[str, int | None] = {}
        later: list[Task] = []
        self.prompt_cache.plan(tasks)  # before the reservations, which are priced for the cache writes it marks
        for task in tasks:
            reservation = await self.reserver.reserve(task, batch=True)
            if reservation is LATER:  # no room until a batch in flight settles below its worst case
                later.append(task)
                continue
            if reservation is None:  # a budget ran out: this request and its twins stay for a resume
                for twin in self.lines.waiting.pop(task.key, [])[1:]:
                    self.stats.counters(twin.stage, twin.model).over_budget += 1
                continue
            assert isinstance(reservation, Reservation)
            self.lines.reservations[task.key] = reservation
            lines.append(BatchLine(task.key, task.call.messages, task.call.params))
            sent.append(task)
            keys[task.key] = reservation.ledger_id
        if later:
            self.lines.pending[(stage, model)] = later
        if not lines:
            return
        if len(lines) < floor:  # a budget let fewer through than the Batch API takes: given back, decided again
            for task in sent:
                self.reserver.release(self.lines.reservations.pop(task.key))
            self.lines.pending.pop((stage, model), None)
            self._too_few(stage, model, [*sent, *later], floor, budget=True)
            return
        first = tasks[0]
        try:
            await self.endpoints.start(via)
            client = self._client(via)
        except ProviderError as exc:
            self._refuse(keys, exc)
            return
        self.routes.say(stage, model)
        lines = self.prompt_cache.mark_lines(self.endpoints.providers[via], sent, lines)
        for task in later:  # planned again with the batch they go in
            self.prompt_cache.forget(task.key)
        # a provider may need several batches where the count alone allows one (Gemini: inline requests under 20 MB)
        chunks = getattr(client, "chunks", None)
        for part in chunks(self.routes.model_name(first), lines) if chunks is not None else [lines]:
            if self.control.stopping:  # a fatal error in an earlier part: these lines stay for a resume
                self._refuse({line.custom_id: keys[line.custom_id] for line in part}, None)
                continue
            await self._send(client, stage, model, first, part, {line.custom_id: keys[line.custom_id] for line in part})

    async def _send(self, client: Batches, stage: str, model: str, first: Task, lines: list[BatchLine],
                    keys: dict[str, int | None]) -> None:
        """Record the intent to submit one batch of reserved lines, submit it and record its id; a refusal fails
        its lines, an error that may hide an accepted batch leaves it to be looked up (:meth:`_resolve`)."""
        round_ = max((self.lines.resubmits.get(line.custom_id, 0) for line in lines), default=0)
        # the run's id, the stage and a random part: a resumed process must not reuse an earlier process's ids
        batch = OpenBatch(f"{self.run_id}:{stage}:{secrets.token_hex(4)}", stage, model,
                          self.routes.provider(first), "", round_, keys,
                          label=batch_label(self.run_id, stage, model, round_, keys), since=time.time())
        self.records.intend(batch)
        try:
            provider_id = await client.submit(self.routes.model_name(first), lines, label=batch.label)
        except ProviderError as exc:
            if not exc.retryable:  # refused: the provider has no such batch
                self.records.drop(batch)
                self._refuse(keys, exc)
                return
            batch.error = exc  # a timeout or a server error: the batch may have been accepted all the same
            self._track(batch)
            return
        self._track(batch)
        self.records.adopt(batch, provider_id)

    def _track(self, batch: OpenBatch) -> None:
        self.open[batch.id] = batch
        self.records.track(batch)

    async def _resolve(self, batch: OpenBatch) -> None:
        """A batch whose provider id is not known: ask the provider for it by its label (and lines). Found, it is
        adopted and polled; not there, its lines go back to be submitted; undecided, it is asked again next poll."""
        try:
            await self.endpoints.start(batch.provider)
            found = await self._client(batch.provider).find(batch.label, list(batch.keys), since=batch.since,
                                                            known=self.records.known_ids())
        except ProviderError as exc:
            if not exc.retryable:
                raise
            self._look_failed(batch, exc)  # a passing failure of a look: look again at the next poll
            return
        self.failing.pop(batch.id, None)
        if found.batch_id is not None:
            self.records.adopt(batch, found.batch_id)
            self.stats.notes.append(f"batch {found.batch_id} ({batch.stage} {batch.model}, {len(batch.keys)} "
                                      "requests) was accepted but not recorded before: found by its label, adopted")
        elif not found.undecided:
            await self._unsent(batch)

    async def _unsent(self, batch: OpenBatch) -> None:
        """The provider never accepted the batch: its lines' reservations are released and the lines submitted
        again (a submit that failed counts as a resubmission, bounded by ``max_resubmits``), or sent online past an
        auto stage's deadline."""
        online = settle_unsent(self.lines, batch, late=self._late(batch.stage, batch.model),
                               max_resubmits=self.settings.max_resubmits)
        self.records.drop(batch)
        self.open.pop(batch.id, None)
        if self.steer is not None:
            self.steer.batch_ended(batch.stage, batch.model, 0, online)
        if online:
            self.spawn(self._online(online))

    def _too_few(self, stage: str, model: str, tasks: list[Task], floor: int, *, budget: bool = False) -> None:
        """A group smaller than the provider's Batch API takes (Bedrock's 100 records a job). While a batch is in
        flight that may free budget room (one of this group, or any when a budget held some back) it waits for
        it: sent online now, it would wait for that room while the batch that holds it waits to be collected.
        Otherwise it goes online, at the online price (left waiting, it could never be answered), each request
        a task of the dispatcher's own, so the batches of other stages are polled meanwhile."""
        if any((b.stage, b.model) == (stage, model) or budget for b in self.open.values()):
            self.lines.pending.setdefault((stage, model), []).extend(tasks)
            return
        self.stats.notes.append(f"stage {stage}: {len(tasks)} requests of {model} sent online: its Batch API takes "
                                f"at least {floor} requests a batch")
        self.online_stages.add(stage)
        for task in tasks:
            self.too_few.add(task.key)
            for waiting in self.lines.waiting.pop(task.key, [task]):
                self.spawn(self.send_online(waiting))

    def _refuse(self, keys: dict[str, int | None], exc: ProviderError | None) -> None:
        """Lines not submitted: failed with ``exc`` (a fatal one stops the run), or with none, given back (their
        reservations released) for a resume."""
        if exc is None:
            for key, ledger_id in keys.items():
                self.lines.give_back(key, ledger_id)
                self.lines.waiting.pop(key, None)
            return
        self.lines.refuse(keys, exc)
        if isinstance(exc, AuthError | QuotaExceeded):
            self.control.fail(exc)

    def _client(self, provider: str) -> Batches:
        return self.endpoints.providers[provider].batches()  # type: ignore[attr-defined]

    # -- waiting for a stage's batches ---------------------------------------------------------------------
    async def finish(self, stages: set[str]) -> None:
        """Submit what is pending for ``stages``, then poll their batches until every one has been collected (and
        what they expired resubmitted and collected too), or the run stops (the batches are left for a resume).
        Several stages wait together: an evaluation job submits every stage's batches before waiting for any."""
        for stage in stages:
            self._load(stage)
        while True:
            # batches whose id is not known are looked up before anything of theirs is submitted again
            for batch in [b for b in self.open.values() if b.stage in stages and b.unknown]:
                if self.control.stopping:
                    return
                await self._resolve(batch)
            for stage in stages:
                await self.submit_pending(stage)
            mine = [b for b in self.open.values() if b.stage in stages]
            if not mine or self.control.stopping:
                return
            for batch in mine:
                if self._late(batch.stage, batch.model) and not batch.unknown:
                    await self._cancel(batch)
            for batch in mine:
                if self.control.stopping:
                    return
                if not batch.unknown and await self._ended(batch):
                    await self._collect(batch)
            if any(b.stage in stages for b in self.open.values()):
                await self._nap(CANCEL_POLL if any(b.cancelled for b in mine) else self.settings.poll_interval)

    async def submit_pending(self, stage: str) -> None:
        """Submit the stage's lines not yet in a batch."""
        for group in [g for g in self.lines.pending if g[0] == stage]:
            if self.control.stopping:
                return
            await self.submit(*group)

    def busy(self, stage: str) -> bool:
        """Whether the stage has lines not yet submitted or batches not yet collected (an earlier process's too)."""
        self._load(stage)
        return any(g[0] == stage for g in self.lines.pending) or any(b.stage == stage for b in self.open.values()) \
            or stage in self.online_stages

    def _auto(self, stage: str) -> bool:
        return self.job.stage_mode(self.stages[stage]) == "auto"

    async def _nap(self, seconds: float) -> None:
        """Sleep between polls, waking early (within a second) when the run is asked to stop."""
        end = time.monotonic() + seconds
        while not self.control.stopping and (left := end - time.monotonic()) > 0:
            await self.sleep(min(left, 1.0))

    async def _cancel(self, batch: OpenBatch) -> None:
        if batch.cancelled:
            return
        batch.cancelled = True
        try:
            await self._client(batch.provider).cancel(batch.provider_batch_id)
        except ProviderError as exc:  # it may have ended meanwhile: its results are read all the same
            self.stats.notes.append(f"batch {batch.provider_batch_id} could not be cancelled: {exc}")

    async def _ended(self, batch: OpenBatch) -> bool:
        await self.endpoints.start(batch.provider)
        try:
            status = await self._client(batch.provider).status(batch.provider_batch_id)
        except ProviderError as exc:
            if not exc.retryable:
                raise
            self._look_failed(batch, exc)  # a passing failure of a look: look again at the next poll
            return False
        self.failing.pop(batch.id, None)
        self.records.polled(batch, status)
        return status.state == ENDED

    def _look_failed(self, batch: OpenBatch, exc: ProviderError) -> None:
        """A look at ``batch`` failed with an error that passes: the first of a run of such failures is said in the
        run's notes, and once they have gone on for ``batch.poll_timeout`` seconds the run stops, the batch kept
        for ``runner resume`` (a status that can never be read, e.g. an SDK that fails every call, would otherwise
        be asked for every ``poll_interval`` for ever)."""
        now = time.monotonic()
        name = f"batch {batch.provider_batch_id or batch.label} ({batch.stage} {batch.model})"
        since = self.failing.get(batch.id)
        if since is None:
            self.failing[batch.id] = now
            self.stats.notes.append(f"{name}: a look at it failed ({exc}); looking again every "
                                    f"{self.settings.poll_interval:g} s for up to {self.settings.poll_timeout:g} s "
                                    "(batch.poll_timeout)")
        elif now - since >= self.settings.poll_timeout:
            self.control.fail(TransientError(
                f"{name} could not be looked at for {now - since:.0f} s (batch.poll_timeout): {exc}; the batch is "
                "kept", error_class=exc.error_class))

    async def _collect(self, batch: OpenBatch) -> None:
        """Take an ended batch's results: answers recorded (at the batch price), lines to retry submitted again
        (or, past an auto stage's deadline, sent online), the rest failed."""
        results = {r.custom_id: r for r in await self._client(batch.provider).results(batch.provider_batch_id)}
        sent_with = self.endpoints.providers[batch.provider].sent_with(batch.model, batch=True)
        label = self.routes.label(batch.model)
        if label is not None:  # a pool's: charged at its endpoint's price
            sent_with = f"{sent_with or batch.provider} at {label}"
        statuses, online = settle_results(self.lines, batch, results, sent_with, endpoint=label,
                                          late=self._late(batch.stage, batch.model),
                                          max_resubmits=self.settings.max_resubmits, store=self.store)
        # The answers are committed before the batch is marked collected: a crash in between leaves the batch open,
        # and a resume reads its results again (answered lines are then cache hits) instead of paying for them twice.
        await self.writer.flush()
        self.records.collected(batch, statuses)
        self.open.pop(batch.id, None)
        if self.steer is not None:
            self.steer.batch_ended(batch.stage, batch.model, sum(s == "done" for s in statuses.values()), online)
        if online:
            self.spawn(self._online(online))

    async def _online(self, tasks: list[Task]) -> None:
        """Send a batch's lines online (a deadline passed), in a task of their own: awaited by the loop that polls
        the batches, a budget with reservations of another batch in flight kept the first of them waiting for room
        that batch frees only once that same loop collects it (a run that never ended)."""
        for task in tasks:
            if not await self.send_online(task):
                break
