"""The Python API: run a job and read its results as a DataFrame, from a script or a notebook.

::

    from runner import run_job

    run = run_job("jobs/quickstart.yaml", limit=5)       # or a dict: the job file's content
    print(run.status, run.paths)                         # completed {'coma': PosixPath('results/...')}
    df = run.results()                                   # one row per task: model, item, answer, score, cost ...
    df.groupby(["model", "seed"]).score.mean()

:func:`run_job` blocks until the run ends, like ``runner submit`` without the live view; it works where an
event loop is already running in the calling thread (Jupyter), by running the job on its own loop in a worker
thread. :func:`arun_job` is the same for callers that can ``await``. Errors a user can cause raise the CLI's
:class:`~runner.errors.RunnerError` subclasses (a job that does not validate: :class:`~runner.errors.JobFileError`);
a run that ends without completing (failed, interrupted, budget spent) is returned, not raised:
:meth:`RunResult.raise_for_status` raises :class:`RunFailed` for it. The warnings ``runner submit`` prints before
a run are in :attr:`RunResult.warnings`, each also raised as a :class:`RuntimeWarning` when the run starts.

The CLI and this API start runs through one run service (runner/service.py): this module only adapts its arguments
to it (a dict or a loaded Job, ``vars=`` as a mapping) and returns what it gives.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import warnings
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from runner.errors import RunnerError, StoreError

if TYPE_CHECKING:
    import pandas

    from runner.spec.schema import Job
    from runner.store import Store

    #: a job: the job file's content as a mapping, a path to a job file, or a loaded Job
    JobSource: TypeAlias = Mapping[str, Any] | str | os.PathLike[str] | Job

__all__ = ["RunFailed", "RunResult", "arun_job", "load_results", "run_job"]

T = TypeVar("T")


class RunFailed(RunnerError):
    """A run ended without completing (failed, interrupted or stopped by its budget); raised by
    :meth:`RunResult.raise_for_status`. ``result`` is the run."""

    def __init__(self, result: RunResult) -> None:
        super().__init__(f"run {result.run_id} {result.status}" + (f": {result.message}" if result.message else ""))
        self.result = result
        self.exit_code = {"interrupted": 130, "budget_exhausted": 3}.get(result.status, 1)


@dataclass(frozen=True)
class RunResult:
    """How a run ended, and where its results are."""

    #: the run's id (``runner report RUN_ID``, ``run_job(resume=RUN_ID)``)
    run_id: str
    #: ``completed``, ``failed``, ``interrupted`` or ``budget_exhausted``
    status: str
    #: why the run did not complete (and how to continue it), or None
    message: str | None
    #: each stage's results file (JSONL, one line per task)
    paths: dict[str, Path] = field(default_factory=dict)
    #: the store the run is in, as :func:`runner.store.open_store` takes it (None: ``RUNNER_DB`` or cache.sqlite)
    db: str | Path | None = None
    #: what ``runner submit`` prints as ``warning: ...`` lines before the run (a dataset with no rows, a gold the
    #: stage does not name, a model without a price, no budget), without the prefix; each was also given to
    #: :func:`warnings.warn` as a :class:`RuntimeWarning` when the run started. Empty for a resumed run.
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "completed"

    def raise_for_status(self) -> RunResult:
        """Return the run when it completed, else raise :class:`RunFailed`."""
        if not self.ok:
            raise RunFailed(self)
        return self

    def results(self, stage: str | None = None) -> pandas.DataFrame:
        """The run's tasks as a DataFrame (see :func:`load_results`)."""
        return load_results(self.run_id, db=self.db, stage=stage)

    def summary(self) -> str:
        """The accuracy and cost lines ``runner submit`` prints at the end."""
        from runner import service
        from runner.store import open_store

        store = open_store(self.db)
        try:
            return "\n".join(service.summary_lines(store, self.run_id))
        finally:
            store.close()

    def __repr__(self) -> str:
        stages = ", ".join(self.paths) or "no results"
        return f"<RunResult {self.run_id} {self.status} ({stages})>"


def run_job(
    job: JobSource | None = None,
    *,
    db: str | Path | None = None,
    budget: float | None = None,
    limit: int | None = None,
    vars: Mapping[str, Any] | None = None,
    resume: str | None = None,
    allow_partial: bool = False,
    replan: bool = False,
    check: bool = True,
) -> RunResult:
    """Validate ``job`` and run it to the end, as ``runner submit`` does (without the live view); return the run.

    ``job``: the job file's content as a dict (relative dataset paths and prompt files are looked up from the
    working directory), a path to a job file (a path that does not exist but names a bundled job, such as
    ``jobs/quickstart.yaml``, is that job), or a loaded :class:`~runner.spec.job.Job`. ``db``: the store (default:
    ``RUNNER_DB`` or ./cache.sqlite). ``budget``: the run's USD limit, over the job's. ``limit``: only the first N
    items of every stage. ``vars``: values for the job's ``${name}``. ``resume``: the id of an unfinished run to
    finish instead (then give no job). ``allow_partial``: start even when the worst case exceeds the budget.
    ``replan``: plan every request again instead of reusing an unchanged stage whole. ``check``: first probe each
    endpoint the run sends to, as ``runner check`` does (an unreachable server, a refused key or an unknown model
    stops the run before any paid request); False skips it.

    Raises :class:`~runner.errors.RunnerError` (:class:`~runner.errors.JobFileError` for a job that does not
    validate) before anything is sent; a run that starts is returned whatever its status.
    """
    return _blocking(lambda: arun_job(job, db=db, budget=budget, limit=limit, vars=vars, resume=resume,
                                      allow_partial=allow_partial, replan=replan, check=check))


async def arun_job(
    job: JobSource | None = None,
    *,
    db: str | Path | None = None,
    budget: float | None = None,
    limit: int | None = None,
    vars: Mapping[str, Any] | None = None,
    resume: str | None = None,
    allow_partial: bool = False,
    replan: bool = False,
    check: bool = True,
) -> RunResult:
    """:func:`run_job` for callers that can await (it runs on the caller's loop)."""
    from runner import service
    from runner.store import open_store

    if (job is None) == (resume is None):
        raise RunnerError("run_job: give a job to run, or resume=RUN_ID to finish a run (not both)")
    if resume is not None and (limit is not None or vars):
        raise RunnerError("run_job: a resumed run keeps its job as it started; limit= and vars= apply to new runs")
    store = open_store(db)
    said: list[str] = []
    try:
        if resume is not None:
            run, loaded = service.prepare_resume(store, resume, budget=budget)
            outcome = await service.run(loaded, store, run_id=run["id"])
        else:
            assert job is not None
            loaded = service.apply_settings(_load(job, vars), budget=budget, limit=limit, wording=service.API)
            submission = service.prepare_submit(loaded, store, allow_partial=allow_partial, replan=replan,
                                                wording=service.API).raise_if_refused()
            said = [line.removeprefix("warning: ") for line in submission.warnings]
            for line in said:
                warnings.warn(line, RuntimeWarning, stacklevel=2)
            outcome = await service.run(loaded, store, replan=replan, check=check, probe=submission.probe,
                                        wording=service.API)
    finally:
        store.close()
    return RunResult(run_id=outcome.run_id, status=outcome.status, message=outcome.message,
                     paths=dict(outcome.results or {}), db=db, warnings=tuple(said))


def _load(job: JobSource, vars: Mapping[str, Any] | None) -> Job:
    from runner import service
    from runner.spec.job import job_from_dict
    from runner.spec.schema import Job

    overrides = {str(name): str(value) for name, value in (vars or {}).items()}
    if isinstance(job, Job):
        if overrides:
            raise RunnerError("run_job: vars= applies to a job file or dict, not to a loaded Job")
        return job.model_copy(deep=True)  # the run may change it (budget, limit, resolved paths)
    if isinstance(job, Mapping):
        return job_from_dict(dict(job), overrides)
    if isinstance(job, str | os.PathLike):
        return service.load_job_file(job, overrides)[0]
    raise RunnerError(f"run_job: a job is a dict, a job file's path or a Job, not {type(job).__name__}")


def _blocking(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run the coroutine ``make()`` returns to its end and return its result. Where an event loop is already
    running in this thread (a notebook), it runs on a new loop in a worker thread while this one waits; an
    interrupt (Ctrl-C, the notebook's stop button) cancels it there, so the run is recorded as interrupted."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    started = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> T:
        box["loop"], box["task"] = asyncio.get_running_loop(), asyncio.current_task()
        started.set()
        return await make()

    def work() -> None:
        try:
            box["result"] = asyncio.run(main())
        except BaseException as exc:  # handed to the waiting thread
            box["error"] = exc
        finally:
            started.set()

    thread = threading.Thread(target=work, name="runner.run_job", daemon=True)
    thread.start()
    try:
        thread.join()
    except KeyboardInterrupt:
        started.wait()
        if "task" in box:
            box["loop"].call_soon_threadsafe(box["task"].cancel)
        thread.join()
        raise
    if "error" in box:
        raise box["error"]
    return box["result"]


def load_results(run_id: str, *, db: str | Path | None = None, stage: str | None = None) -> pandas.DataFrame:
    """A run's finished tasks as a DataFrame, one row per task, its stages in the job's order.

    Columns: ``stage``, ``model``, ``item`` (the task's identity in the stage), ``row_id`` (the dataset row), one
    column per variant axis (``seed``, ``sample``, or an axis of ``variants:``; ``variant.NAME`` where the name
    is taken), then ``status``, ``response`` (the answer text), ``answer_letter``, ``parsed``, ``gold``,
    ``score``, ``valid``, ``invalid_reason``, ``cache_hit``, ``cost`` (USD), ``input_tokens``, ``output_tokens``,
    ``cached_tokens``, ``latency`` (s), ``attempts``, ``error_class``, ``error``, ``cache_key``, ``permutation``,
    and whatever else the stage's result lines hold (``fields``, ``options_shown``, ``logprobs``, ...).

    ``run_id``: the run (a unique part of it is enough); ``db``: the store (default ``RUNNER_DB`` or
    ./cache.sqlite); ``stage``: one stage only. Raises :class:`~runner.errors.StoreError` for an unknown run or
    stage.
    """
    import pandas

    from runner.store import open_store

    store = open_store(db)
    try:
        run = store.get_run(run_id)
        stages = _stages(store, run, stage)
        rows = [_row(task) for name in stages for task in store.tasks(run["id"], stage=name)]
    finally:
        store.close()
    if not rows:  # a run with no finished task yet still has the documented columns
        return pandas.DataFrame(columns=[column for column in _LEADING if column != "variant"])
    return pandas.DataFrame(rows)


def _stages(store: Store, run: dict[str, Any], stage: str | None) -> list[str]:
    """The run's stage names in the job's order (those with tasks, should the stored job be unreadable)."""
    try:
        names = [str(s["name"]) for s in json.loads(run["job_json"])["stages"]]
    except (TypeError, ValueError, KeyError):
        names = list(dict.fromkeys(task["stage"] for task in store.tasks(run["id"])))
    if stage is None:
        return names
    if stage not in names:
        raise StoreError(f"run {run['id']} has no stage {stage!r} (its stages: {', '.join(names)})")
    return [stage]


#: the columns that come first, in this order; the variant axes go where ``variant`` is
_LEADING = ("stage", "model", "item", "row_id", "variant", "status", "response", "answer_letter", "parsed", "gold",
            "score", "valid", "invalid_reason", "cache_hit", "cost", "input_tokens", "output_tokens",
            "cached_tokens", "latency", "attempts", "error_class", "error", "cache_key", "permutation")
#: task columns taken from the store's row rather than the result line (a replayed task is a cache hit there)
_FROM_TASK = ("stage", "model", "item", "row_id", "status", "score", "cache_hit", "cost", "input_tokens",
              "output_tokens", "cached_tokens", "latency", "attempts", "error_class", "error")
#: result line keys that other columns already carry
_SKIP = {"id", "stage", "model", "variant", "seed", "status", "score", "cache_hit"}


def _row(task: dict[str, Any]) -> dict[str, Any]:
    line: dict[str, Any] = json.loads(task["result_json"]) if task.get("result_json") else {}
    variant = line.get("variant")
    if variant is None:
        variant = json.loads(task["variant_json"]) if task.get("variant_json") else {}
    row: dict[str, Any] = {}
    for column in _LEADING:
        if column == "variant":
            for axis, value in variant.items():
                row[f"variant.{axis}" if axis in _LEADING else axis] = value
        elif column in _FROM_TASK:
            row[column] = task.get(column)
        elif column == "valid":
            valid = line.get("valid", task.get("valid"))
            row[column] = None if valid is None else bool(valid)
        else:
            row[column] = line.get(column)
    row["cache_hit"] = bool(row["cache_hit"])
    for key, value in line.items():
        if key not in row and key not in _SKIP:
            row[key] = value
    return row
