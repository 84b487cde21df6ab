"""What becomes of a batch's lines once it ends (runner/engine/batch.py polls and collects the batches): each line
answered at the Batch API's price, submitted again (a line the provider expired, cancelled or failed with a server
error, within ``batch.max_resubmits``; a line refused with its batch for other lines, once), sent online (past an
auto stage's deadline) or failed with its error; and when the provider never accepted the batch, each line given
back and submitted again, sent online or failed. The lines' own state is runner/engine/batch_lines.py's."""

from __future__ import annotations

from runner.engine.batch_lines import BatchLines
from runner.engine.batch_records import OpenBatch
from runner.engine.budget import Reservation
from runner.errors import ProviderError
from runner.plan.request import Task
from runner.providers.batching import REFUSED, BatchResult
from runner.providers.records import Completion, stamp
from runner.store.offloop import LoopStore

__all__ = ["settle_results", "settle_unsent"]


def settle_results(lines: BatchLines, batch: OpenBatch, results: dict[str, BatchResult], sent_with: str | None, *,
                   endpoint: str | None, late: bool, max_resubmits: int,
                   store: LoopStore) -> tuple[dict[str, str], list[Task]]:
    """An ended batch's ``results`` (by custom id) given to its lines: each line's status (``done``, ``retry``,
    ``online`` or ``failed``) for the store, and the tasks to send online (``late``: past an auto stage's
    deadline). ``endpoint``: the pool's endpoint that took the batch, whose price charges what it answered or billed.
    An answer for a task this process did not plan releases its ledger row through ``store``."""
    statuses: dict[str, str] = {}
    online: list[Task] = []
    for key in batch.keys:
        result = results.get(key)
        tasks = lines.waiting.pop(key, [])
        lines.resumed.pop(key, None)
        reservation = lines.reservations.pop(key, None)
        if result is not None and result.completion is not None:
            statuses[key] = "done"
            if tasks:
                result.completion.endpoint = endpoint
                lines.answer(tasks, stamp(result.completion, sent_with),
                             reservation or Reservation([], 0.0, 0, batch.keys[key]))
            elif batch.keys[key] is not None:  # answered for a task this process did not plan
                store.post("release", batch.keys[key])
            continue
        lines.release(reservation, batch.keys[key])
        retry = result is None or result.retry
        # a line refused with its batch for other lines is submitted again once, whatever max_resubmits says
        refused = result is not None and result.error is not None and result.error.error_class == REFUSED
        if refused and key in lines.refiled:
            retry = False
        if tasks and retry and late:
            statuses[key] = "online"
            online.extend(tasks)
        elif tasks and retry and (refused or lines.resubmits.get(key, 0) < max_resubmits):
            statuses[key] = "retry"
            if refused:
                lines.refiled.add(key)
            lines.resubmit(batch.stage, batch.model, key, tasks)
        else:
            statuses[key] = "failed"
            error = (result.error if result is not None and result.error is not None
                     else ProviderError("the batch ended without answering this request"))
            if endpoint is not None and isinstance(billed := getattr(error, "billed", None), Completion):
                billed.endpoint = endpoint  # a refusal billed by the pool's endpoint, charged at its price
            lines.fail(key, tasks, error)
    return statuses, online


def settle_unsent(lines: BatchLines, batch: OpenBatch, *, late: bool, max_resubmits: int) -> list[Task]:
    """The lines of a batch the provider never accepted: their reservations released and the lines submitted
    again (a submit that failed counts as a resubmission, bounded by ``max_resubmits``), or, ``late``, the tasks
    returned to be sent online."""
    online: list[Task] = []
    for key, ledger_id in batch.keys.items():
        lines.resumed.pop(key, None)
        lines.give_back(key, ledger_id)
        tasks = lines.waiting.get(key)
        if not tasks:
            lines.waiting.pop(key, None)
            continue
        if late:
            del lines.waiting[key]
            online.extend(tasks)
        elif batch.error is not None and lines.resubmits.get(key, 0) >= max_resubmits:
            del lines.waiting[key]
            lines.fail(key, tasks, batch.error)
        elif batch.error is not None:
            lines.resubmit(batch.stage, batch.model, key, tasks)
        else:
            lines.pending.setdefault((batch.stage, batch.model), []).append(tasks[0])
    return online
