"""The live view's counters of a run, read from the store: what a process that sends nothing itself (the driver of
Ray workers) shows while its workers run elsewhere. The view (runner/report/progress.py) reads them as it reads a
worker's own."""

from __future__ import annotations

from runner.engine.stats import RunStats
from runner.store import Store


def refresh(stats: RunStats, store: Store, run_id: str) -> None:
    """Set each stage and model's finished tasks and spend from the store (the totals come from the plan)."""
    stages = {stage for stage, _ in stats.by_key}
    for stage in stages:
        for model, (done, _) in store.done_by_model(run_id, stage).items():
            if (stage, model) in stats.by_key:
                stats.counters(stage, model).done = done
    for stage, model, usd, _ in store.spent(run_id):
        if (stage, model) in stats.by_key:
            stats.counters(stage, model).spend = usd
