"""What the store and the live view know of a run's Batch API batches (runner/engine/batch.py decides what goes in
them): each batch's intent, written before the provider is asked, with its lines' keys and reservations; the
provider's batch id once it accepted the batch; the state each poll found; the lines' statuses once the batch is
collected; and the batches an earlier process of the run submitted and did not collect, read back for a resume.
The live view shows every batch this process waits for (``RunStats.batches``)."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field

from runner.engine.stats import BatchView, RunStats
from runner.errors import ProviderError
from runner.providers.batching import BatchStatus, batch_label
from runner.store import Store

#: a batch's state in the store from the intent to submit it until the provider's id is written
SUBMITTING = "submitting"
#: what the live view shows for a batch's provider id while it is being looked up
LOOKING_UP = "(looking it up)"


@dataclass
class OpenBatch:
    """A submitted batch this process waits for (submitted by it, or by an earlier one of the same run)."""

    id: str
    stage: str
    model: str
    provider: str
    provider_batch_id: str
    round: int
    #: request key -> ledger reservation id
    keys: dict[str, int | None] = field(default_factory=dict)
    cancelled: bool = False
    #: what it was submitted under (:func:`batch_label`), and when its intent was recorded (epoch seconds)
    label: str = ""
    since: float = 0.0
    #: why the submit failed, when it failed in a way that may hide an accepted batch
    error: ProviderError | None = None

    @property
    def unknown(self) -> bool:
        """Whether the provider's id is not known yet (an intent, or a submit whose answer was lost)."""
        return not self.provider_batch_id


class BatchRecords:
    """One run's batches in the store and in the live view."""

    def __init__(self, *, run_id: str, store: Store, stats: RunStats) -> None:
        self.run_id = run_id
        self.store = store
        self.stats = stats

    def left(self, stage: str) -> list[OpenBatch]:
        """The batches an earlier process of this run submitted for ``stage`` and did not collect, each shown in the
        live view. An intent (no provider id) gets its label back: the provider may have accepted it, and is asked
        by that label before anything of it is submitted again."""
        found = []
        for row in self.store.open_batches(self.run_id, stage):
            batch = OpenBatch(row["id"], stage, row["model"], row["model"].partition(":")[0],
                              row["provider_batch_id"] or "", row["round"],
                              {key: ledger for key, (ledger, status) in row["lines"].items() if status == "pending"})
            if batch.unknown:
                batch.label = batch_label(self.run_id, stage, batch.model, batch.round, batch.keys)
                batch.since = _epoch(row["created"])
            self.stats.batches[batch.id] = BatchView(stage, batch.model, batch.provider_batch_id or LOOKING_UP,
                                                       len(batch.keys), provider_state=row["provider_state"] or "",
                                                       round=batch.round)
            found.append(batch)
        return found

    def intend(self, batch: OpenBatch) -> None:
        """The intent to submit ``batch``, written before the provider is asked (a crash then leaves it to be looked
        up by its label)."""
        self.store.record_batch(batch.id, self.run_id, batch.stage, batch.model, None, batch.round,
                                list(batch.keys.items()), state=SUBMITTING)

    def track(self, batch: OpenBatch) -> None:
        """Show a batch whose submit was answered (or may have been) in the live view."""
        self.stats.batches[batch.id] = BatchView(batch.stage, batch.model, batch.provider_batch_id or LOOKING_UP,
                                                   len(batch.keys), provider_state=SUBMITTING, round=batch.round)

    def adopt(self, batch: OpenBatch, provider_id: str) -> None:
        """The provider has the batch: its id goes into the store (the intent becomes a running batch)."""
        batch.provider_batch_id, batch.error = provider_id, None
        self.store.update_batch(batch.id, provider_batch_id=provider_id, state="running", provider_state="submitted")
        view = self.stats.batches.get(batch.id)
        if view is not None:
            view.provider_batch_id, view.provider_state = provider_id, "submitted"

    def known_ids(self) -> set[str]:
        """The provider ids of every batch of the run the store knows (a lookup by label must not adopt one twice)."""
        return {b["provider_batch_id"] for b in self.store.batches(self.run_id) if b["provider_batch_id"]}

    def drop(self, batch: OpenBatch) -> None:
        """The provider has no such batch: its record goes, from the store and from the view."""
        self.store.drop_batch(batch.id)
        self.stats.batches.pop(batch.id, None)

    def polled(self, batch: OpenBatch, status: BatchStatus) -> None:
        """What a poll found, in the view and in the store."""
        view = self.stats.batches.get(batch.id)
        if view is not None:
            view.provider_state, view.succeeded, view.failed = status.provider_state, status.succeeded, status.failed
            view.state = status.state
        self.store.update_batch(batch.id, state=status.state, provider_state=status.provider_state)

    def collected(self, batch: OpenBatch, statuses: dict[str, str]) -> None:
        """The batch's results are taken (its answers committed first): each line's status, and the batch closed."""
        self.store.finish_batch(batch.id, statuses)
        view = self.stats.batches.get(batch.id)
        if view is not None:
            view.state = "collected"


def _epoch(stamp: str | None) -> float:
    """A store timestamp (ISO 8601, UTC) in epoch seconds; now when there is none."""
    if not stamp:
        return time.time()
    when = dt.datetime.fromisoformat(stamp)
    return (when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)).timestamp()
