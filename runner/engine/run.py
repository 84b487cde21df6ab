"""Run a job (or resume a run, or join one as a worker): :func:`execute` in named phases. Before the run row exists
the stages are planned (runner/engine/opening.py) and the job is checked (runner/engine/checks.py); then the run is
opened and a resume's leftovers recovered (runner/engine/opening.py); then one :class:`_Session` starts the results
files (runner/engine/results_files.py), the writer and the dispatcher, dispatches each stage (replayed whole where
unchanged), takes Ctrl-C, and finishes: the run's status in the store, or the one error a failed store or results
file ends it with (runner/engine/failures.py).

From the session's start to its end, every store call is made off the event loop (runner/store/offloop.py): by the
store's thread, and the heartbeats' by a second connection's; a store that stops answering is said in one line and,
past RUNNER_STORE_WAIT, stops the sending."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import gc
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from runner.engine.assembly import assemble
from runner.engine.checks import check_before_sending, check_joinable
from runner.engine.dispatch import Dispatcher
from runner.engine.failures import is_output_errno, stop_error, store_failure
from runner.engine.opening import open_run, plan_stages, recover
from runner.engine.replay import record_if_complete, replay, stage_address
from runner.engine.results_files import Results
from runner.engine.stats import RunStats
from runner.engine.workers import Crew
from runner.errors import RunnerError, StoreError
from runner.plan.stage import StagePlan
from runner.providers.base import Provider
from runner.spec.schema import Job
from runner.store import Finished, Store, Writer, now
from runner.store.offloop import SWITCH_INTERVAL_S, LoopStore, StoreThread, StoreWatch
from runner.store.sqlite_lock import store_wait


class View(Protocol):
    def start(self, stats: RunStats, title: str) -> None: ...
    def note(self, message: str) -> None: ...
    def stop(self) -> None: ...


class NoView:
    def start(self, stats: RunStats, title: str) -> None:
        pass

    def note(self, message: str) -> None:
        pass

    def stop(self) -> None:
        pass


@dataclass
class Outcome:
    run_id: str
    status: str
    stats: RunStats
    message: str | None = None
    results: dict[str, Path] | None = None


async def execute(
    job: Job,
    store: Store,
    *,
    run_id: str | None = None,
    view: View | None = None,
    on_run_id: Callable[[str], None] | None = None,
    reuse: bool = True,
    join: bool = False,
) -> Outcome:
    """Run ``job`` as a new run, or resume ``run_id``. Returns when the run ends or is interrupted.
    ``reuse``: replay an evaluation stage unchanged since a run that finished it (runner/engine/replay.py) instead of
    planning its requests again; off, every request is planned and looked up in the memo one by one.
    ``join``: work on ``run_id`` beside the processes already on it (``runner work``, runner/engine/workers.py);
    the run's status stays theirs unless this process is the last one on it.

    The phases, in order: plan the stages and check the job (nothing is stored before they pass), open the run
    row, recover what a resumed run left, then one :class:`_Session` starts the writer and the dispatcher,
    dispatches the stages and finishes (status, files, providers)."""
    view = view or NoView()
    if join:
        check_joinable(job)
        reuse = False
    plans, stats, total = plan_stages(job)
    providers = check_before_sending(job)
    resume = run_id is not None and not join
    run_id = open_run(job, store, run_id, total, join=join)
    deadline_text = store.get_run(run_id).get("deadline")
    deadline = dt.datetime.fromisoformat(deadline_text).timestamp() if deadline_text else None
    if on_run_id:
        on_run_id(run_id)
    if resume:
        recover(job, store, run_id, plans, stats, view.note)
    session = _Session(job, store, run_id, view, plans, stats, providers, deadline,
                       resume=resume, join=join, reuse=reuse)
    return await session.run()


class _Session:
    """One run in this process once its row exists: the results files, the writer, the dispatcher and the crew,
    and the status the run ends with. :meth:`run` is start, dispatch, verdict, and finish whatever happened."""

    def __init__(self, job: Job, store: Store, run_id: str, view: View, plans: list[StagePlan], stats: RunStats,
                 providers: dict[str, Provider], deadline: float | None, *, resume: bool, join: bool,
                 reuse: bool) -> None:
        self.job, self.store, self.run_id, self.view = job, store, run_id, view
        self.plans, self.stats, self.providers, self.deadline = plans, stats, providers, deadline
        self.resume, self.join, self.reuse = resume, join, reuse
        self.results = Results(job, run_id, store)
        self.results.on_failure = self.halt
        self.committed: list[Callable[[list[Finished]], None]] = [self.results.on_commit]
        #: the store as the run calls it: by its thread, off the event loop (the interpreter's switch interval
        #: shortened meanwhile, SWITCH_INTERVAL_S; restored when the run ends)
        self.calls = LoopStore(store, StoreThread("store"), on_error=self.store_failed)
        self._switch = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch, SWITCH_INTERVAL_S))
        #: the heartbeats' own connection and thread (made when the session starts)
        self.beats: LoopStore | None = None
        self.watch: StoreWatch | None = None
        self.writer = Writer(self.calls, self.on_commit, on_failure=self.halt)
        self.dispatcher: Dispatcher | None = None
        self.crew: Crew | None = None
        self.loop = asyncio.get_running_loop()
        self.interrupts = 0
        self.status: str = "failed"
        self.message: str | None = None
        #: the run failed because tasks left to other workers were not answered (:meth:`left_unanswered`): a
        #: joining worker that is the run's last records that too
        self.incomplete = False
        #: an error of the store or of the files that ended the run (said once everything queued is committed)
        self.cause: BaseException | None = None

    def on_commit(self, batch: list[Finished]) -> None:
        for callback in self.committed:
            callback(batch)

    def halt(self, _: BaseException) -> None:
        """The store or a results file failed: nothing more is sent; the answers on their way still come in."""
        if self.dispatcher is not None:
            self.dispatcher.request_stop()

    def store_failed(self, exc: BaseException) -> None:
        """A store call asked without waiting (a reservation or a claim given back, a lease finished) failed: the
        store's failure ends the run as a commit's would; another error ends it in its own words."""
        if store_failure(self.store, exc, self.run_id) is not None:
            self.cause = self.cause or exc
            self.halt(exc)
        elif self.dispatcher is not None:
            self.dispatcher.control.fail(StoreError(f"the store {self.store.path} failed: {exc}"))

    def store_stuck(self, waited: float) -> None:
        """A store call has waited RUNNER_STORE_WAIT: nothing more is sent (what is answered is committed once the
        store answers again)."""
        if self.dispatcher is not None:
            self.dispatcher.control.fail(StoreError(
                f"the store {self.store.path} did not answer for {waited:.0f} s (RUNNER_STORE_WAIT): nothing more was"
                f" sent; once it answers, `runner resume {self.run_id}` continues the run"))

    async def _open_beats(self) -> LoopStore:
        """The heartbeats' own connection, opened by a thread of its own (the main one where the store has no
        second connection)."""
        thread = StoreThread("store-beats")
        try:
            store = await thread.call(self.store.reopen)
        except NotImplementedError:
            thread.close()
            return self.calls
        return LoopStore(store, thread, on_error=self.store_failed)

    async def run(self) -> Outcome:
        stopped: RunnerError | None = None
        try:
            dispatcher = await self.start()
            await self.dispatch_stages(dispatcher)
            self.status, self.message = self.verdict(dispatcher)
            if self.status == "completed" and (missing := await self.left_unanswered()) is not None:
                self.status, self.message, self.incomplete = "failed", missing, True
            if self.status == "completed" and dispatcher.stoppers:
                said = [line for stopper in dispatcher.stoppers.values() if (line := stopper.summary())]
                self.message = "; ".join(said)
                for line in said:
                    self.view.note(line)
                for name, stopper in dispatcher.stoppers.items():  # for the reports and the viewer
                    if not stopper.adopted:  # another worker's decision: its record stays
                        await self.calls.record_stop(self.run_id, name, stopper.record())
        except RunnerError as exc:
            self.status, self.message = "failed", str(exc)
            raise
        except asyncio.CancelledError:
            self.status = "interrupted"
            raise
        except Exception as exc:
            if not await self.stopped_by(exc):
                raise
        finally:
            stopped = await self.finish()
        if stopped is not None:
            raise stopped
        return Outcome(run_id=self.run_id, status=self.status, stats=self.stats, message=self.message,
                       results=self.results.paths)

    async def start(self) -> Dispatcher:
        """Open the results files, start the writer, make the dispatcher, join the crew, take Ctrl-C, show the
        view. Providers are started by the dispatcher on their first cache miss: a fully cached run opens no
        client and loads no model."""
        self.watch = StoreWatch([t for t in (self.calls.thread,) if t is not None], self.store.path, self.view.note,
                                bound=None if getattr(self.store, "lock_wait", None) else store_wait(),
                                on_bound=self.store_stuck)
        self.watch.start()
        if not self.join:  # a joining worker leaves the live files to the run's first process
            await self.calls.run(self.results.open, rewrite=self.resume)
        self.writer.start()
        self.beats = await self._open_beats()
        if self.beats.thread is not None and self.beats.thread is not self.calls.thread:
            self.watch.threads.append(self.beats.thread)
        self.crew = Crew(self.calls, self.run_id, note=self.view.note, beats=self.beats)
        # a joining worker, like a resume, counts what the run spent so far and skips the tasks that are done
        dispatcher = self.dispatcher = assemble(
            run_id=self.run_id, job=self.job, store=self.calls, writer=self.writer, providers=self.providers,
            stats=self.stats, crew=self.crew, resume=self.resume or self.join, joined=self.join,
            deadline=self.deadline)
        await self.crew.join()
        self.committed.append(dispatcher.committed)
        self.stats.budgets = dispatcher.budgets
        _install(self.loop, self.on_interrupt)
        gc.freeze()  # the long-lived setup objects need no more garbage-collection passes (undone in finish)
        self.view.start(self.stats, f"run {self.run_id} · job {self.job.name}")
        return dispatcher

    def on_interrupt(self) -> None:
        """Ctrl-C (or SIGTERM): the first stops sending and waits for the requests in flight; the second abandons
        them."""
        self.interrupts += 1
        dispatcher = self.dispatcher
        assert dispatcher is not None
        if self.interrupts == 1:
            dispatcher.request_stop()
            self.view.note(f"Stopping: waiting for {len(dispatcher.tasks)} requests in flight "
                           "(Ctrl-C again to abandon them).")
        else:
            dispatcher.abandon()
            self.view.note("Abandoning the requests in flight.")

    async def dispatch_stages(self, dispatcher: Dispatcher) -> None:
        """A pipeline's stages in order, or each evaluation stage: replayed whole when unchanged since a run that
        finished it, else dispatched (its Batch API batches waited for once every stage is submitted), and
        recorded for replay once complete."""
        job, store, run_id = self.job, self.calls, self.run_id
        if job.is_pipeline:
            from runner.engine.pipeline import Pipeline  # with the recipes and data steps: for a pipeline job

            rows_dir = Path(job.output_dir) / job.name / run_id / "rows"
            await Pipeline(job, store, run_id, dispatcher, self.writer, self.stats, self.view.note, rows_dir,
                           self.results.handles).run()
        #: stages whose Batch API batches are still running, waited for together once every stage is submitted
        waiting: list[tuple[StagePlan, str | None]] = []
        for plan in self.plans:
            address = stage_address(job, plan.stage, plan) if self.reuse else None
            # a stage this run has begun (a resume) is finished request by request
            if address is not None and not (self.resume and await store.has_tasks(run_id, plan.stage.name)):
                if await self.replayed(plan, address):
                    continue
            # an evaluation stage's batches keep running while the next stages are planned and submitted
            await dispatcher.run_stage(plan, wait_for_batches=False)
            if dispatcher.stopping:
                break
            if dispatcher.batcher.busy(plan.stage.name):
                waiting.append((plan, address))
            elif address is not None:
                await self.writer.flush()
                await store.run(record_if_complete, self.store, run_id, plan, address)
        if waiting and not dispatcher.stopping:
            await dispatcher.finish_batches({plan.stage.name for plan, _ in waiting})
        for plan, address in waiting:
            if address is not None and not dispatcher.stopping:
                await self.writer.flush()
                await store.run(record_if_complete, self.store, run_id, plan, address)

    async def replayed(self, plan: StagePlan, address: str) -> bool:
        """Whether the stage was copied whole from the run recorded under ``address`` (runner/engine/replay.py)."""
        name = plan.stage.name
        try:
            source = await self.calls.run(replay, self.store, self.run_id, plan, address, self.stats,
                                          self.results.handles.get(name))
        except OSError as exc:  # its results file
            raise self.results.failed(exc, self.results.paths[name]) from None
        if source is None:
            return False
        self.view.note(f"stage {name}: unchanged since run {source}; its answers are reused from the store without "
                       "planning each request (--replan plans them)")
        return True

    async def left_unanswered(self) -> str | None:
        """A run is completed only when the store has every one of its tasks done or failed (ARCHITECTURE.md's
        invariants): a task this process lost (an answer that could not be held, issue 41), or left to other
        workers whose lease was marked done with the task not written, would otherwise end the run "completed" with
        that task missing. Then the run fails, resumable: why, or None. A stage stopped early, or on a budget,
        leaves its unasked items on purpose."""
        stats = self.stats
        for plan in self.plans:
            name = plan.stage.name
            if self.dispatcher is not None and self.dispatcher.stopped_early(name):
                continue
            counters = [c for (stage, _), c in stats.by_key.items() if stage == name]
            if any(c.over_budget for c in counters):
                continue
            done, failed = await self.calls.stage_progress(self.run_id, name)
            missing = plan.total() - done - failed
            if missing > 0:
                whose = ("were left to other workers and none of them answered them"
                         if any(c.elsewhere for c in counters) else "were neither answered nor failed")
                return (f"stage {name}: {missing} of its {plan.total()} tasks {whose}; "
                        f"`runner resume {self.run_id}` sends them")
        return None

    def verdict(self, dispatcher: Dispatcher) -> tuple[str, str | None]:
        """The status and message of a run whose stages were all dispatched (or stopped)."""
        run_id, stats = self.run_id, self.stats
        if dispatcher.fatal is not None:
            return "failed", str(dispatcher.fatal)
        if dispatcher.exhausted is not None:
            scope = dispatcher.exhausted
            return "budget_exhausted", (f"{scope.describe()} is spent (${scope.spent_usd:,.4f}, "
                                        f"{scope.spent_tokens:,} tokens); `runner resume {run_id} --budget USD` "
                                        "continues with a larger one")
        if self.interrupts:
            return "interrupted", f"interrupted; `runner resume {run_id}` finishes it"
        if every_request_failed(stats):
            totals = stats.totals()
            classes = ", ".join(f"{n} {name}" for name, n in sorted(stats.errors_by_class.items()))
            return "failed", (f"every one of its {totals.errors} requests failed ({classes}); "
                              f"`runner report {run_id}` shows the errors")
        return "completed", None

    async def stopped_by(self, exc: Exception) -> bool:
        """Whether ``exc`` is the store failing (a full disk, a corrupt page, the server gone) or a file that cannot
        be written: then the answers on their way are let in, and :meth:`finish` says the cause in one sentence."""
        if store_failure(self.store, exc, self.run_id) is None and not is_output_errno(exc):
            return False
        self.cause = exc
        if self.dispatcher is not None:
            self.dispatcher.request_stop()
            with contextlib.suppress(Exception):
                await self.dispatcher.drain()
        return True

    async def finish(self) -> RunnerError | None:
        """Whatever ended the run: commit what is queued, leave the crew, close (or rewrite) the results files and
        the providers, and leave the run's status in the store. Returns the error the run ends with when the
        store or a results file stopped it."""
        try:
            return await self._finish()
        finally:
            if self.watch is not None:
                self.watch.stop()
            if self.beats is not None and self.beats is not self.calls:
                self.beats.post("close")
                await self.beats.close()
            await self.calls.close()
            sys.setswitchinterval(self._switch)

    async def _finish(self) -> RunnerError | None:
        store, run_id = self.store, self.run_id
        gc.unfreeze()  # a process that runs several jobs (tests, notebooks) must get its garbage back
        _uninstall(self.loop)
        self.view.stop()
        await self.writer.close()
        shared, last = False, True
        try:
            if self.crew is not None:
                await self.crew.leave()
                shared = await self.crew.others() > 0
            last = not any(w["state"] == "live" for w in await self.calls.workers(run_id))
        except Exception as exc:
            if store_failure(store, exc, run_id) is None:
                raise
            self.cause = self.cause or exc
        cause = self.cause
        if last and cause is None and self.dispatcher is not None:  # no other worker of the run still reads them
            await self.dispatcher.release_stored_prompts()
        broken = self.writer.failure is not None or (cause is not None and store_failure(store, cause, run_id))
        # with several workers the live file has this process's lines only: it is rewritten from the store
        await self.calls.run(self.results.close, rewrite=not broken and (
            self.resume or (shared and (not self.join or self.status == "completed"))))
        for provider in self.providers.values():
            await provider.aclose()
        stopped = stop_error(self.job, store, run_id, self.writer, self.results, cause)
        if stopped is not None:
            self.status, self.message = "failed", str(stopped)
        if not self.join or (last and (self.status == "completed" or self.incomplete)):
            try:
                await self.calls.set_run(run_id, status=self.status, message=self.message, finished=now(), pid=None)
            except Exception as exc:  # the run shows as crashed in `runner runs`, and resumes as such
                if store_failure(store, exc, run_id) is None:
                    raise
                if stopped is None:
                    stopped = stop_error(self.job, store, run_id, self.writer, self.results, exc)
        return stopped


def every_request_failed(stats: RunStats) -> bool:
    """Whether this process answered nothing: it finished tasks, and every one of them failed."""
    totals = stats.totals()
    return totals.errors > 0 and totals.done - totals.resumed == totals.errors


def _install(loop: asyncio.AbstractEventLoop, handler: Callable[[], None]) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, handler)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
            pass


def _uninstall(loop: asyncio.AbstractEventLoop) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.remove_signal_handler(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
