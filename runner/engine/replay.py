"""Whole-stage reuse for evaluation stages: a stage that has not changed since a run that finished it is
replayed from that run's task rows instead of being planned again request by request.

An unchanged re-submit would otherwise re-read every row, shuffle its options, render its prompt, hash it,
look it up and parse the answer, only to arrive at the answers it already has. A stage's *address* is the
SHA-256 of everything its results depend on: its definition, the prompt's text, the models' cache-key ids,
the parameters and prices, the row limit, the bytes of its dataset (and options file), and the source of the
runner's own code (a new parser or shuffle changes every address). When a run finishes a stage with every
task done, the address is recorded; a later run of a stage with the same address copies the earlier run's
task rows in one store transaction, as cache hits that cost nothing, and writes its results file from them.

Every copied answer is still in the memo (answers are never deleted), so a replayed run reports exactly what a
request-by-request re-run would: the same result lines, each a cache hit. ``--replan`` turns this off.
"""

from __future__ import annotations

from typing import IO, Any

from runner.engine.address import code_digest, content_address, file_digest
from runner.engine.stats import RunStats
from runner.plan.datasets import dataset_digest
from runner.plan.request import canonical_params
from runner.plan.stage import StagePlan, model_key
from runner.providers.pricing import Pricing
from runner.spec.schema import Job
from runner.spec.stage import Stage
from runner.store import Store

#: bump when what a task row or result line holds changes in a way the code digest would not show
REPLAY_VERSION = 1


def stage_address(job: Job, stage: Stage, plan: StagePlan) -> str:
    """The content address of an evaluation stage's results (see the module's docstring)."""
    assert stage.dataset is not None
    pricing = Pricing(job)
    body: dict[str, Any] = {
        "version": REPLAY_VERSION,
        "code": code_digest(),
        "stage": stage.model_dump(mode="json", by_alias=True, exclude={"budget", "output", "models"}),
        "models": [[model, *model_key(model, job.endpoints, job), repr(pricing.rates(model))] for model in plan.models],
        "params": {model: canonical_params(params) for model, params in plan.model_params.items()},
        "limit": job.stage_limit(stage),
        "prompt": plan.prompt.text,
        "dataset": dataset_digest(stage.dataset.path),
    }
    if stage.choices is not None and stage.choices.options_file:
        body["options"] = file_digest(stage.choices.options_file)
    return content_address(body)


def copy_tasks(store: Store, source: str, source_stage: str, run_id: str, stage: str, stats: RunStats,
               results: IO[str] | None, *, add_total: bool = False) -> None:
    """Copy a stage's done tasks from run ``source`` into ``run_id`` as cache hits (one transaction), count
    them in the live counters (``add_total``: in the totals too, for a stage not planned), and append their
    result lines to the stage's results file."""
    for model, n, scored, correct, saved in store.copy_tasks(source, source_stage, run_id, stage):
        counters = stats.counters(stage, model)
        if add_total:
            counters.total += n
        counters.done += n
        counters.cache_hits += n
        counters.scored += scored
        counters.correct += int(correct)
        counters.saved += saved
    if results is not None:
        results.writelines(line + "\n" for line in store.iter_results(run_id, stage))
        results.flush()


def replayable_tasks(store: Store, address: str, stage: str) -> dict[str, tuple[int, int]] | None:
    """Per model, (tasks, output tokens) of the run a stage at ``address`` would be replayed from (what
    ``runner estimate`` reports as cache hits without planning), or None when it would not be replayed."""
    found = store.replayable(address)
    if found is None:
        return None
    source, tasks = found
    per_model = store.done_by_model(source, stage)
    return per_model if sum(n for n, _ in per_model.values()) == tasks else None


def replay(store: Store, run_id: str, plan: StagePlan, address: str, stats: RunStats,
           results: IO[str] | None) -> str | None:
    """Copy the stage's tasks from the run recorded under ``address``; returns that run's id, or None when
    there is nothing to replay (no such run, or its tasks are no longer all there and done)."""
    stage = plan.stage.name
    if replayable_tasks(store, address, stage) is None:  # none, or its tasks are no longer all there and done
        return None
    source, _ = store.replayable(address)  # type: ignore[misc]
    copy_tasks(store, source, stage, run_id, stage, stats, results)
    return source


def record_if_complete(store: Store, run_id: str, plan: StagePlan, address: str) -> bool:
    """Record the stage under ``address`` when this run has every one of its tasks done (none failed, none
    left by a budget or a stop), so a later unchanged run can replay it."""
    stage = plan.stage.name
    total = plan.total()
    done, failed = store.stage_progress(run_id, stage)
    if failed or done != total or total == 0:
        return False
    store.record_replayable(address, run_id, stage, total)
    return True
