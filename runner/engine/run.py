"""Run a job (or resume a run): set up providers, the writer and the results files, dispatch each stage,
handle Ctrl-C, and leave the run's status in the store."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import errno
import gc
import os
import signal
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from runner.engine.batch import check_batch_modes
from runner.engine.dispatch import Dispatcher
from runner.engine.pipeline import Pipeline
from runner.engine.replay import record_if_complete, replay, stage_address
from runner.engine.stats import RunStats
from runner.engine.workers import Crew
from runner.errors import OutputError, RunnerError, StoreError, StoreFailed
from runner.plan.stage import StagePlan
from runner.providers.base import Provider, ProviderSettings, provider_class, split_model
from runner.spec.job import Job
from runner.store import Finished, Store, Writer, now
from runner.store.writer import save_unstored, store_unstored


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


class Results:
    """Per-stage JSONL files, appended as batches are committed. After a crash the file may lack lines the
    store has (killed between commit and write), so a resume rewrites it from the store at both ends: each
    finished task appears exactly once.

    A file that cannot be written (a full disk) ends the writing of every file, not the run's storing: the first
    error is kept in :attr:`failure` and ``on_failure`` stops the dispatching; the store keeps every answer, and the
    resume rewrites the files from it."""

    def __init__(self, job: Job, run_id: str, store: Store) -> None:
        self.run_id = run_id
        self.store = store
        self.paths = {stage.name: job.results_path(stage, run_id) for stage in job.llm_stages()}
        self.handles: dict[str, IO[str]] = {}
        self.opened = False
        #: the error that stopped the writing of the files, when one did
        self.failure: OutputError | None = None
        self.on_failure: Callable[[BaseException], None] | None = None

    def failed(self, exc: OSError, path: Path | str) -> OutputError:
        """The sentence for a results file that cannot be written (kept as :attr:`failure` when it is the first)."""
        error = output_error(exc, path, self.run_id)
        if self.failure is None:
            self.failure = error
        return error

    def open(self, rewrite: bool) -> None:
        """Start each file: from the store's finished tasks when resuming, empty otherwise."""
        for stage, path in self.paths.items():
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                if rewrite:
                    self._rewrite(stage, path)
                else:
                    path.write_text("", encoding="utf-8")
                self.handles[stage] = open(path, "a", encoding="utf-8")
            except OSError as exc:
                raise self.failed(exc, path) from None
        self.opened = True

    def on_commit(self, batch: list[Finished]) -> None:
        if not self.handles or self.failure is not None:  # a joining worker writes no live file
            return
        touched: set[str] = set()
        stage = batch[0].stage if batch else ""
        try:
            for item in batch:
                stage = item.stage
                self.handles[stage].write(item.result_line + "\n")
                touched.add(stage)
            for stage in touched:
                self.handles[stage].flush()
        except OSError as exc:
            error = self.failed(exc, self.paths.get(stage, stage))
            self._drop()
            if self.on_failure is not None:
                self.on_failure(error)

    def _drop(self) -> None:
        """Close the files after a write failed: what they still buffer cannot be written either."""
        for handle in self.handles.values():
            try:
                handle.close()
            except OSError:
                pass
        self.handles.clear()

    def close(self, rewrite: bool) -> None:
        """Close the files. A resumed run rewrites them from the store: a task that failed before and was
        sent again has two lines in the live file, and the store has the last one."""
        try:
            for handle in self.handles.values():
                handle.close()
        except OSError as exc:
            self.failed(exc, next(iter(self.paths.values())))
        self._drop()
        if rewrite and self.failure is None:
            for stage, path in self.paths.items():
                try:
                    self._rewrite(stage, path)
                except OSError as exc:
                    self.failed(exc, path)
                    break

    def _rewrite(self, stage: str, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.part")  # several workers may rewrite at once
        try:
            with open(partial, "w", encoding="utf-8") as out:
                out.writelines(line + "\n" for line in self.store.iter_results(self.run_id, stage))
            partial.replace(path)
        except BaseException:
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)  # a full disk gets its space back
            raise


#: errors of a file or folder that a user fixes (space, permissions, a read-only or missing folder)
_OUTPUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EIO,
                  errno.EEXIST, errno.ENOENT, errno.EISDIR, errno.EFBIG}


def output_error(exc: OSError, path: Path | str, run_id: str | None) -> OutputError:
    """One sentence for a results file or folder that cannot be written, with how to go on."""
    then = f", then `runner resume {run_id}`" if run_id else ", then run it again"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return OutputError(f"the disk holding {path} is full: free space{then}", path)
    return OutputError(f"{path} cannot be written ({exc.strerror or exc}): fix that{then}", path)


def check_output(job: Job) -> None:
    """Before a run is made: each folder its results go to can be created and written, or one sentence names it."""
    folders = {Path(job.output_dir) / job.name}
    folders.update(Path(stage.output).parent for stage in job.llm_stages() if stage.output)
    for folder in sorted(folders):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"the output folder {folder} cannot be created ({exc.strerror or exc}): set output_dir"
                              f" (or the stage's output:) in {job.path or 'the job file'} to a folder that can be",
                              folder) from None
        try:
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as exc:
            raise OutputError(f"the output folder {folder} cannot be written ({exc.strerror or exc}): make it "
                              f"writable, or set output_dir (or the stage's output:) in {job.path or 'the job file'}"
                              " to another folder", folder) from None


def job_models(job: Job) -> list[str]:
    return sorted({model for stage in job.stages for model in job.stage_models(stage)})


def build_providers(job: Job) -> dict[str, Provider]:
    """One provider object per provider the job names (not started: that waits for a cache miss), after
    checking that each has the key it needs, so a missing variable stops the job before any request."""
    providers: dict[str, Provider] = {}
    for model in job_models(job):
        name, model_name = split_model(model)
        provider = providers.get(name)
        if provider is None:
            settings = job.providers.get(name) or ProviderSettings()
            provider = providers[name] = provider_class(name)(settings, job.endpoints)
        provider.check_key(model_name)
    return providers


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
    the run's status stays theirs unless this process is the last one on it."""
    view = view or NoView()
    if join:
        check_joinable(job)
        reuse = False
    # A pipeline's stages are planned as they come: their rows are known only once the earlier ones ran.
    plans = [] if job.is_pipeline else [StagePlan(job, stage) for stage in job.stages]
    for plan in plans:
        plan.first_request()  # a template that cannot render fails here, before anything is sent
    stats = RunStats()
    total = 0
    for plan in plans:
        per_model = plan.total() // max(1, len(plan.models))
        for model in plan.models:
            stats.counters(plan.stage.name, model).total = per_model
            total += per_model

    providers = build_providers(job)
    check_prices(job)
    check_batch_modes(job, providers)
    check_loglikelihood(job, providers)
    check_output(job)  # before the run is made: a folder that cannot take the results is said now
    resume = run_id is not None and not join
    if join:
        assert run_id is not None
    elif run_id is None:
        run_id = store.create_run(job.name, job.path, job.model_dump_json(), job.fingerprint(), total)
        seconds = job.deadline_seconds()
        if seconds is not None:  # kept with the run, so a resume keeps the same deadline
            store.set_run(run_id, deadline=(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)).isoformat())
    else:
        store.set_run(run_id, status="running", pid=os.getpid(), message=None, finished=None, total=total)
        store.reset_chunks(run_id)  # a resume plans every chunk again and skips the tasks that are done
    deadline_text = store.get_run(run_id).get("deadline")
    deadline = dt.datetime.fromisoformat(deadline_text).timestamp() if deadline_text else None
    if on_run_id:
        on_run_id(run_id)
    if resume:
        for path in unstored_paths(job, store, run_id):  # what the run kept aside when its store failed
            if path.exists():
                view.note(f"stored {store_unstored(store, path)} answers kept in {path} when the store failed")
        settled, possibly = store.resolve_reservations(run_id)
        # the crashed processes of this run on this machine: their request claims go now, not when they expire
        for worker in store.workers(run_id):
            if worker["state"] != "left" and worker["host"] == socket.gethostname() and not pid_alive(worker["pid"]):
                store.leave_run(worker["id"])
        if settled or possibly:
            view.note(f"{settled + possibly} requests were in flight when the run stopped: {settled} settled from "
                      f"the cache, {possibly} kept as possibly billed at their worst case")
        # the live view counts what earlier attempts finished and spent from the start, not as it reaches them
        for plan in plans:
            for model, (n, _) in store.done_by_model(run_id, plan.stage.name).items():
                if (plan.stage.name, model) in stats.by_key:
                    stats.counters(plan.stage.name, model).prior = n
        stats.prior_spend = sum(usd for _, _, usd, _ in store.spent(run_id))

    results = Results(job, run_id, store)
    committed: list[Callable[[list[Finished]], None]] = [results.on_commit]
    dispatcher: Dispatcher | None = None

    def halt(_: BaseException) -> None:
        """The store or a results file failed: nothing more is sent; the answers on their way still come in."""
        if dispatcher is not None:
            dispatcher.request_stop()

    results.on_failure = halt
    writer = Writer(store, lambda batch: [callback(batch) for callback in committed], on_failure=halt)
    status, message = "failed", None
    #: an error of the store or of the files that ended the run (said once everything queued is committed)
    cause: BaseException | None = None
    stopped: RunnerError | None = None
    crew = Crew(store, run_id, note=view.note)
    loop = asyncio.get_running_loop()
    interrupts = [0]
    try:
        # Providers are started by the dispatcher on their first cache miss: a fully cached run opens no
        # client and loads no model.
        if not join:  # a joining worker leaves the live files to the run's first process
            results.open(rewrite=resume)
        writer.start()
        # a joining worker, like a resume, counts what the run spent so far and skips the tasks that are done
        dispatcher = Dispatcher(run_id=run_id, job=job, store=store, writer=writer, providers=providers,
                                stats=stats, resume=resume or join, deadline=deadline)
        dispatcher.crew, dispatcher.joined = crew, join
        crew.on_live = dispatcher.share_limits
        crew.join()
        committed.append(dispatcher.committed)
        stats.budgets = dispatcher.budgets

        def on_interrupt() -> None:
            interrupts[0] += 1
            assert dispatcher is not None
            if interrupts[0] == 1:
                dispatcher.request_stop()
                view.note(f"Stopping: waiting for {len(dispatcher.tasks)} requests in flight "
                          "(Ctrl-C again to abandon them).")
            else:
                dispatcher.abandon()
                view.note("Abandoning the requests in flight.")

        _install(loop, on_interrupt)
        gc.freeze()  # the long-lived setup objects need no more garbage-collection passes (undone below)
        view.start(stats, f"run {run_id} · job {job.name}")
        if job.is_pipeline:
            rows_dir = Path(job.output_dir) / job.name / run_id / "rows"
            await Pipeline(job, store, run_id, dispatcher, writer, stats, view.note, rows_dir, results.handles).run()
        #: stages whose Batch API batches are still running, waited for together once every stage is submitted
        waiting: list[tuple[StagePlan, str | None]] = []
        for plan in plans:
            address = stage_address(job, plan.stage, plan) if reuse else None
            # a stage this run has begun (a resume) is finished request by request
            if address is not None and not (resume and store.has_tasks(run_id, plan.stage.name)):
                try:
                    source = replay(store, run_id, plan, address, stats, results.handles.get(plan.stage.name))
                except OSError as exc:  # its results file
                    raise results.failed(exc, results.paths[plan.stage.name]) from None
                if source is not None:
                    view.note(f"stage {plan.stage.name}: unchanged since run {source}; its answers are reused "
                              "from the store without planning each request (--replan plans them)")
                    continue
            # an evaluation stage's batches keep running while the next stages are planned and submitted
            await dispatcher.run_stage(plan, wait_for_batches=False)
            if dispatcher.stopping:
                break
            if dispatcher.batcher is not None and dispatcher.batcher.busy(plan.stage.name):
                waiting.append((plan, address))
            elif address is not None:
                await writer.flush()
                record_if_complete(store, run_id, plan, address)
        if waiting and not dispatcher.stopping:
            await dispatcher.finish_batches({plan.stage.name for plan, _ in waiting})
        for plan, address in waiting:
            if address is not None and not dispatcher.stopping:
                await writer.flush()
                record_if_complete(store, run_id, plan, address)
        if dispatcher.fatal is not None:
            status, message = "failed", str(dispatcher.fatal)
        elif dispatcher.exhausted is not None:
            scope = dispatcher.exhausted
            status = "budget_exhausted"
            message = (f"{scope.describe()} is spent (${scope.spent_usd:,.4f}, {scope.spent_tokens:,} tokens); "
                       f"`runner resume {run_id} --budget USD` continues with a larger one")
        elif interrupts[0]:
            status, message = "interrupted", f"interrupted; `runner resume {run_id}` finishes it"
        elif every_request_failed(stats):
            totals = stats.totals()
            classes = ", ".join(f"{n} {name}" for name, n in sorted(stats.errors_by_class.items()))
            status, message = "failed", (f"every one of its {totals.errors} requests failed ({classes}); "
                                         f"`runner report {run_id}` shows the errors")
        else:
            status = "completed"
    except RunnerError as exc:
        status, message = "failed", str(exc)
        raise
    except asyncio.CancelledError:
        status = "interrupted"
        raise
    except Exception as exc:
        # the store failed (a full disk, a corrupt page, the server gone) or a file could not be written: the
        # answers on their way are let in, then the cause is said in one sentence
        if store_failure(store, exc, run_id) is None and not _output_errno(exc):
            raise
        cause = exc
        if dispatcher is not None:
            dispatcher.request_stop()
            with contextlib.suppress(Exception):
                await dispatcher.drain()
    finally:
        gc.unfreeze()  # a process that runs several jobs (tests, notebooks) must get its garbage back
        _uninstall(loop)
        view.stop()
        await writer.close()
        shared, last = False, True
        try:
            await crew.leave()
            shared = crew.others() > 0
            last = not any(w["state"] == "live" for w in store.workers(run_id))
        except Exception as exc:
            if store_failure(store, exc, run_id) is None:
                raise
            cause = cause or exc
        broken = writer.failure is not None or (cause is not None and store_failure(store, cause, run_id))
        # with several workers the live file has this process's lines only: it is rewritten from the store
        results.close(rewrite=not broken and (resume or (shared and (not join or status == "completed"))))
        for provider in providers.values():
            await provider.aclose()
        stopped = stop_error(job, store, run_id, writer, results, cause)
        if stopped is not None:
            status, message = "failed", str(stopped)
        if not join or (last and status == "completed"):
            try:
                store.set_run(run_id, status=status, message=message, finished=now(), pid=None)
            except Exception as exc:  # the run shows as crashed in `runner runs`, and resumes as such
                if store_failure(store, exc, run_id) is None:
                    raise
                if stopped is None:
                    stopped = stop_error(job, store, run_id, writer, results, exc)
    if stopped is not None:
        raise stopped
    return Outcome(run_id=run_id, status=status, stats=stats, message=message, results=results.paths)


def store_failure(store: Store, exc: BaseException, run_id: str | None = None) -> str | None:
    """The store's sentence for ``exc`` when it is about the store itself (runner/store/sqlite.py, postgres.py)."""
    explain = getattr(store, "failure", None)
    return explain(exc, run_id) if explain is not None else None


def _output_errno(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _OUTPUT_ERRNOS


def unstored_paths(job: Job, store: Store, run_id: str) -> list[Path]:
    """Where a run keeps the answers its store could not take, first choice first: its results folder, beside the
    store's file, the temporary folder (the first that is not on the full disk)."""
    name = f"unstored-{run_id}.jsonl"
    paths = [Path(job.output_dir) / job.name / run_id / name]
    if "://" not in store.path:
        paths.append(Path(store.path).resolve().parent / name)
    paths.append(Path(tempfile.gettempdir()) / f"runner-{name}")
    return list(dict.fromkeys(paths))


def stop_error(job: Job, store: Store, run_id: str, writer: Writer, results: Results,
               cause: BaseException | None) -> RunnerError | None:
    """The one sentence a run that the store or a results file stopped ends with: the cause, what was kept of the
    answers received, and how to go on; None when neither failed."""
    failed = writer.failure or cause
    said = store_failure(store, failed, run_id) if failed is not None else None
    if said is not None:
        answers = sum(1 for item in writer.unstored if item.response is not None)
        if not writer.unstored:
            kept = "every answer received is in the store"
        elif (path := save_unstored(writer.unstored, unstored_paths(job, store, run_id))) is not None:
            kept = (f"the {answers} answers received and not stored are kept in {path}, and the resume stores them, "
                    "so none is paid again")
        else:
            kept = (f"{answers} answers received could not be stored or kept (no disk took them): they count as "
                    "possibly billed, and the resume sends them again")
        return StoreFailed(f"{said}; {kept}")
    if results.failure is None and isinstance(cause, OSError):
        results.failed(cause, getattr(cause, "filename", None) or Path(job.output_dir) / job.name / run_id)
    if results.failure is not None:
        return OutputError(f"{results.failure}; every answer received is in the store {store.path}, so none is sent "
                           "again", results.failure.path)
    return None


class NotJoinable(RunnerError):
    """``runner work`` on a job whose stages cannot be split between processes."""

    exit_code = 2


def check_joinable(job: Job) -> None:
    """Workers split evaluation stages sent online; a pipeline's stages depend on each other's rows and a Batch
    API stage is one process's batches."""
    if job.is_pipeline:
        raise NotJoinable(f"job {job.name} is a pipeline: its stages run in one process; `runner work` joins jobs "
                          "whose stages are all evaluations")
    tokens = job.budget is not None and (job.budget.tokens is not None or any(
        limit.tokens is not None for limit in job.budget.models.values()))
    if tokens or any(stage.budget is not None and stage.budget.tokens is not None for stage in job.stages):
        raise NotJoinable(f"job {job.name} has a token budget, which each process counts on its own: only USD budgets "
                          "are shared by the processes on a run; run it in one process, or budget it in USD")
    for stage in job.llm_stages():
        if job.stage_mode(stage) != "online":
            raise NotJoinable(f"stage {stage.name} of job {job.name} uses a Batch API (mode: {job.stage_mode(stage)})"
                              ": its batches belong to the process that submitted them; `runner work` joins online "
                              "stages")


def every_request_failed(stats: RunStats) -> bool:
    """Whether this process answered nothing: it finished tasks, and every one of them failed."""
    totals = stats.totals()
    return totals.errors > 0 and totals.done - totals.resumed == totals.errors


def check_prices(job: Job) -> None:
    """A budget needs every model's price and a bound on output tokens; refuse to start without them."""
    from runner.engine.dispatch import budgets_of
    from runner.providers.pricing import Pricing

    if budgets_of(job) is None:
        return
    pricing = Pricing(job)
    where = job.path or "the job file"
    for model in job_models(job):
        if not pricing.known(model):
            raise RunnerError(f"{where}: the price of {model} is unknown and the job has a budget: add "
                              f"prices: {{{model}: {{input: USD, output: USD}}}} (per million tokens)")
    for stage in job.llm_stages():
        if any(job.model_params(stage, model).get("max_tokens") is None for model in job.stage_models(stage)):
            raise RunnerError(f"{where}: stage {stage.name} has no params.max_tokens, and a budget needs a bound "
                              "on output tokens to reserve a request's worst case")


class CannotScore(RunnerError):
    """A ``parse: loglikelihood`` stage names a model whose provider returns no log-probabilities."""

    exit_code = 2


def check_loglikelihood(job: Job, providers: dict[str, Provider]) -> None:
    """Log-likelihood stages need providers that can score; a chat-only API is named before anything is sent."""
    for stage in job.llm_stages():
        if stage.parse != "loglikelihood":
            continue
        for model in job.stage_models(stage):
            provider = providers[split_model(model)[0]]
            if not getattr(provider, "supports_loglikelihood", False):
                raise CannotScore(
                    f"{job.path or 'the job file'}: stage {stage.name} scores log-likelihoods, and {model} cannot "
                    "score log-likelihoods (a chat-only API): use a local: model or an openai-compatible: "
                    "completions server there, and give chat models to a stage in the prompt form")


def budget_warnings(job: Job) -> list[str]:
    """Said before a run with priced models and no budget: nothing bounds what it may spend."""
    from runner.engine.dispatch import budgets_of
    from runner.providers.pricing import Pricing

    pricing = Pricing(job)
    unknown = [model for model in job_models(job) if not pricing.known(model)]
    lines = [f"warning: no price is known for {model}; its cost is counted as 0: add prices: {{{model}: "
             "{input: USD, output: USD}} (per million tokens) to count it" for model in unknown]
    if budgets_of(job) is not None:
        return lines
    priced = [model for model in job_models(job) if (rates := pricing.rates(model)) is not None and not rates.is_free]
    if priced:
        lines.append(f"warning: no budget is set for {', '.join(priced)}; add budget: {{usd: N}} to the job or "
                     "`--budget USD` to cap what this run may spend")
    return lines


def dataset_warnings(job: Job) -> list[str]:
    """Said before a run whose stage reads a dataset with no rows (the stage sends nothing; the run still ends),
    or whose rows have a ``gold`` field the stage does not name (it is not scored: a stage is scored only when the
    job says what its gold is)."""
    from runner.plan.stage import count_rows, iter_rows

    lines = []
    for stage in job.stages:
        if stage.dataset is None:
            continue
        if count_rows(stage.dataset, 1) == 0:
            lines.append(f"warning: stage {stage.name}: the dataset {stage.dataset.path} has no rows, so the stage "
                         "has nothing to send")
            continue
        if stage.is_llm and not stage.review and _unnamed_gold(stage):
            key = "choices.gold" if stage.choices is not None else "gold"
            first = next(iter_rows(stage.dataset, 1), (0, {}))[1]
            if "gold" in first:
                lines.append(f"warning: stage {stage.name} is not scored: its rows have a 'gold' field but the stage "
                             f"names no gold; add {key}: gold to score it")
    return lines


def _unnamed_gold(stage: Any) -> bool:
    return (stage.choices.gold if stage.choices is not None else stage.gold) is None


def set_budget(job: Job, usd: float) -> None:
    """``--budget USD``: the run's USD limit, over what the job file says."""
    from runner.spec.job import JobBudget

    if not usd > 0:
        raise RunnerError(f"--budget must be more than 0 USD (got {usd:g})")
    if job.budget is None:
        job.budget = JobBudget(usd=usd)
    else:
        job.budget.usd = usd


def load_run_job(store: Store, run_id: str) -> tuple[dict[str, Any], Job]:
    """The job a run was started with, as it was then (the file may have changed since)."""
    run = store.get_run(run_id)
    if run["status"] == "completed":
        raise StoreError(f"run {run['id']} is already completed; `runner report {run['id']}` shows it")
    try:
        return run, Job.model_validate_json(run["job_json"])
    except ValueError as exc:
        raise StoreError(f"run {run['id']} has a stored job this version cannot read ({exc})") from None


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


def pid_alive(pid: Any) -> bool:
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError):
        return False
    return True
